"""Helpers for the real-client tests (tests/test_clients_*.py): what torch's
own global module hooks see, and the checks every client's recording must pass."""

from __future__ import annotations

import json
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.utils.module_tracker import ModuleTracker as TorchModuleTracker

from tests.helpers.database import db_rows


@contextmanager
def torch_hook_log() -> Iterator[tuple[list[tuple[str, str]], dict[int, tuple[weakref.ref[nn.Module], str]]]]:
    """Plain global forward pre/post hooks beside torch's own ModuleTracker:
    yields the (kind, name) sequence they see, names as torch's tracker
    gives them, and id(module) -> (weak reference, name) of every module
    called (weak: a module built in each forward must die as it would)."""
    seen: list[tuple[str, str]] = []
    called: dict[int, tuple[weakref.ref[nn.Module], str]] = {}
    with TorchModuleTracker() as mt:
        # registered after torch's tracker, so its name is known when these run
        def pre(mod: nn.Module, args: Any) -> None:
            if not torch.compiler.is_compiling():
                name = mt._known_modules[mod]
                seen.append(("enter", name))
                if id(mod) not in called or called[id(mod)][0]() is not mod:
                    called[id(mod)] = (weakref.ref(mod), name)

        def post(mod: nn.Module, args: Any, out: Any) -> None:
            if not torch.compiler.is_compiling():
                seen.append(("exit", mt._known_modules[mod]))

        handles = [register_module_forward_pre_hook(pre), register_module_forward_hook(post)]
        try:
            yield seen, called
        finally:
            for h in handles:
                h.remove()


def forward_sequence(db: str, run_id: int = 1, rank: int = 0) -> list[tuple[str, str]]:
    return [(k, f) for k, f in db_rows(
        db, "SELECT kind, fqn FROM event_log WHERE run_id = :run_id AND rank = :rank AND phase = 'forward' ORDER BY seq",
        run_id=run_id, rank=rank)]


def backward_fqns(db: str, run_id: int = 1, rank: int = 0) -> set[str]:
    return {f for (f,) in db_rows(
        db, "SELECT DISTINCT fqn FROM spans WHERE run_id = :run_id AND rank = :rank AND phase = 'backward'",
        run_id=run_id, rank=rank)}


def spans_nest_in_time(db: str, run_id: int = 1) -> list[str]:
    """Spans whose time range is not inside their parent's (empty when all nest)."""
    rows = db_rows(db, """
        SELECT c.fqn, c.phase, c.start_ns, c.end_ns, p.fqn, p.start_ns, p.end_ns
        FROM spans c JOIN spans p ON p.run_id = c.run_id AND p.rank = c.rank AND p.span_id = c.parent_span_id
        WHERE c.run_id = :run_id AND (c.start_ns < p.start_ns OR c.end_ns > p.end_ns OR c.end_ns IS NULL)""", run_id=run_id)
    return [f"{r[0]} {r[1]} [{r[2]}, {r[3]}] outside {r[4]} [{r[5]}, {r[6]}]" for r in rows]


def check_rows(run_cli: Callable[..., Any], db: str, run: str = "@") -> list[dict[str, Any]]:
    """``modtrace check --format json`` on the run; asserts it exits 0 and has no error or warning."""
    out = run_cli("check", run, "--db", db, "--format", "json")
    rows: list[dict[str, Any]] = json.loads(out.out)
    bad = [r["message"] for r in rows if r["severity"] != "info"]
    assert out.code == 0 and not bad, bad[:10]
    return rows


def modules_with_grads(called: dict[int, tuple[weakref.ref[nn.Module], str]]) -> set[str]:
    """Names of the called modules, still alive, whose own parameters got a gradient."""
    alive = [(ref(), name) for ref, name in called.values()]
    return {
        name for mod, name in alive
        if mod is not None and any(p.grad is not None for p in mod.parameters(recurse=False))
    }
