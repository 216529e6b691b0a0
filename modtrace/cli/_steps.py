"""``--step-on`` and ``--step-kind``, the options that choose a run's steps (``modtrace.api``
applies them: ``Database.steps``, ``tree``, ``diff_side`` and ``like_with_like``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from modtrace.core.contracts import STEP_RULES

F = TypeVar("F", bound=Callable[..., Any])


def step_on_option(f: F) -> F:
    return click.option(
        "--step-on", type=click.Choice(STEP_RULES), default=None,
        help="What makes a step: auto (optimizer steps when the run made any, else root calls: each outermost "
             "module call, e.g. one per generated token), optimizer, root, manual (Recorder.step() only). "
             "Default: the rule the run was recorded with.",
    )(f)


def step_kind_option(default: str) -> Callable[[F], F]:
    def wrap(f: F) -> F:
        return click.option(
            "--step-kind", metavar="KIND|all", default=None,
            help="Only steps of this kind: the input shape of the step's first root call, e.g. input_ids=1x1 "
                 f"(decode) vs input_ids=1x7 (prefill); all for every step. Default: {default}.",
        )(f)
    return wrap


def rule_label(step_on: str, rule: str) -> str:
    """``root`` or, for a rule resolved from auto, ``auto: root``."""
    return f"{step_on}: {rule}" if step_on != rule else rule
