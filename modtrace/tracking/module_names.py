"""Module names: the rule that turns a module object into its fqn and module id.

The rule is torch's ``ModuleTracker``'s: a module first seen while no named
module owns it is a *root*, named by its class (``GPT2LMHeadModel``); every
module registered under it is named by its attribute path from the root
(``GPT2LMHeadModel.transformer.h.0.attn``).  torch.compile's wrapper
(``OptimizedModule``) is the module it wraps: no ``_orig_mod`` level.

Two roots of one class alive at the same time are told apart by a number:
the first takes ``Linear``, the next ``Linear#1``, then ``Linear#2``, in the
order they are first called.  A root's name is freed when the root module is
garbage collected, and the next root of that class takes the lowest free
name.  So a module created anew on every call (a loss module built inside a
forward) keeps one name, and each name keeps one module id for the whole
recording: the modules table gets one row per name, not one per object.

A module keeps the name it got when first seen, even if it is registered
somewhere else later.  A module reachable by two attribute paths takes the
first one ``named_modules`` gives.
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn


class ModuleInfo:
    """What the hooks need to know about a named module."""

    __slots__ = ("module_id", "fqn", "depth", "recent", "recent_parents")

    def __init__(self, module_id: int, fqn: str, depth: int) -> None:
        self.module_id = module_id
        self.fqn = fqn
        self.depth = depth  # attribute-path depth below its root (0 for a root)
        # call ids of forward calls that a checkpoint may still recompute,
        # oldest first, and their parent call ids (0 for none); pruned by the
        # tracker.  Two deques of ints, not one of pairs: no object per call.
        self.recent: deque[int] = deque()
        self.recent_parents: deque[int] = deque()


def _is_compiled_wrapper(mod: nn.Module) -> bool:
    return type(mod).__name__ == "OptimizedModule"


class ModuleNames:
    """Names modules by the rule above, and collects the new lookup rows.

    ``new_modules`` holds (module_id, fqn, module_type, parent_module_id,
    compiled) rows not yet handed to the store (a module's row again, with
    compiled = 1, once it is seen running compiled); ``fqns[module_id]`` is a
    module's name; ``wrappers`` the ids of live torch.compile wrappers.
    """

    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock
        # id(module) -> info, while the module lives (read by the tracker's hooks)
        self.by_id: dict[int, ModuleInfo] = {}
        self._mods = self.by_id
        self._refs: dict[int, weakref.ref[nn.Module]] = {}
        self._by_fqn: dict[str, ModuleInfo] = {}  # every name ever given -> its info
        self._taken: dict[str, set[int]] = {}  # class name -> root numbers held by live roots
        self.fqns: list[str] = []
        self.depths: list[int] = []
        self.new_modules: list[tuple[int, str, str, int | None, int]] = []
        self._rows: list[tuple[int, str, str, int | None, int]] = []  # module_id -> its row as last given
        self.wrappers: set[int] = set()

    def live_modules(self) -> list[nn.Module]:
        """The named modules still alive (each once)."""
        found = (ref() for ref in list(self._refs.values()))
        return [m for m in found if m is not None]

    def mark_compiled(self, module_id: int) -> None:
        """The module ran compiled: its row again, with compiled = 1 (once)."""
        with self._lock:
            row = self._rows[module_id]
            if not row[4]:
                row = self._rows[module_id] = (*row[:4], 1)
                self.new_modules.append(row)

    def get(self, mod: nn.Module) -> ModuleInfo | None:
        return self._mods.get(id(mod))

    def id_of(self, fqn: str) -> int | None:
        """The id of the module named ``fqn``, if one was ever named so."""
        info = self._by_fqn.get(fqn)
        return info.module_id if info is not None else None

    def info(self, mod: nn.Module, open_modules: Iterable[nn.Module | None]) -> ModuleInfo:
        """``mod``'s info, naming it (and its tree) when it is new.  ``open_modules``:
        the modules with a call open on this thread, innermost first."""
        with self._lock:
            info = self._mods.get(id(mod))
            if info is not None:
                return info
            target = getattr(mod, "_orig_mod", None) if _is_compiled_wrapper(mod) else None
            if target is not None and id(target) in self._mods:
                return self._alias(mod, self._mods[id(target)])
            for owner in open_modules:  # a child added after its parent was named
                if owner is not None and self._name_tree(owner, self._mods[id(owner)], find=mod):
                    return self._mods[id(mod)]
            root = target if target is not None else mod
            self._name_root(root)
            if target is not None:
                return self._alias(mod, self._mods[id(target)])
            return self._mods[id(mod)]

    def _name_root(self, root: nn.Module) -> None:
        base = type(root).__name__
        taken = self._taken.setdefault(base, set())
        n = 0
        while n in taken:
            n += 1
        taken.add(n)
        fqn = base if n == 0 else f"{base}#{n}"
        self._name_tree(root, None, root_fqn=fqn)
        weakref.finalize(root, taken.discard, n).atexit = False

    def _alias(self, wrapper: nn.Module, info: ModuleInfo) -> ModuleInfo:
        # torch.compile's OptimizedModule is the module it wraps: no extra level.
        self._remember(wrapper, info)
        self.wrappers.add(id(wrapper))
        return info

    def _remember(self, mod: nn.Module, info: ModuleInfo) -> None:
        key = id(mod)
        self._mods[key] = info

        def forget(_ref: object, key: int = key) -> None:
            self._mods.pop(key, None)
            self._refs.pop(key, None)
            self.wrappers.discard(key)

        self._refs[key] = weakref.ref(mod, forget)

    def _name_tree(self, root: nn.Module, root_info: ModuleInfo | None, *, root_fqn: str | None = None,
                   find: nn.Module | None = None) -> bool:
        """Name ``root``'s unnamed descendants (and ``root`` itself when it has no
        info yet, as ``root_fqn``); with ``find``, only if it is among them."""
        if find is not None and not any(sub is find for sub in root.modules()):
            return False
        base = root_info.fqn if root_info is not None else root_fqn
        assert base is not None
        seen: dict[str, ModuleInfo] = {}
        for name, sub in root.named_modules(remove_duplicate=True):
            parts = [p for p in name.split(".") if p and p != "_orig_mod"] if name else []
            fqn = ".".join([base, *parts])
            known = self._mods.get(id(sub))
            if known is not None:
                seen[fqn] = known
                continue
            if _is_compiled_wrapper(sub) and fqn in seen:
                continue
            parent = seen.get(fqn.rsplit(".", 1)[0]) if parts else None
            info = self._by_fqn.get(fqn)
            if info is None:
                module_id = len(self.fqns)
                info = ModuleInfo(module_id, fqn, parent.depth + 1 if parent is not None else 0)
                self.fqns.append(fqn)
                self.depths.append(info.depth)
                self._by_fqn[fqn] = info
                row = (module_id, fqn, type(sub).__name__, parent.module_id if parent is not None else None, 0)
                self._rows.append(row)
                self.new_modules.append(row)
            self._remember(sub, info)
            if _is_compiled_wrapper(sub):
                self.wrappers.add(id(sub))
            seen[fqn] = info
        return True


def _values(obj: Any) -> Iterable[Any] | None:
    """The items of a container an output or kwargs structure may hold, else None."""
    if isinstance(obj, (tuple, list, set, frozenset)):
        return obj
    if isinstance(obj, dict):
        return obj.values()
    if hasattr(obj, "__dataclass_fields__") or hasattr(obj, "_fields"):
        if hasattr(obj, "values") and callable(obj.values):
            return list(obj.values())
        if hasattr(obj, "__dict__"):
            return list(vars(obj).values())
        return list(obj)
    return None


def iter_tensors(obj: Any, tensor_type: type) -> Iterable[Any]:
    """Every tensor in a nested output or kwargs structure, however deep
    (each container visited once, so a cycle ends)."""
    todo = [obj]
    seen: set[int] = set()
    while todo:
        item = todo.pop()
        if isinstance(item, tensor_type):
            yield item
            continue
        values = _values(item)
        if values is None or id(item) in seen:
            continue
        seen.add(id(item))
        todo.extend(reversed(list(values)))


def as_list(inputs: Any) -> list[Any]:
    """``inputs`` (None, one tensor or a list of them) as a list."""
    if inputs is None:
        return []
    return list(inputs) if type(inputs) is list else [inputs]


def grad_tensors(obj: Any) -> list[Any] | None:
    """Tensors needing grad in a (possibly nested) output or kwargs structure."""
    if isinstance(obj, torch.Tensor):
        return [obj] if obj.requires_grad else None
    found = [t for t in iter_tensors(obj, torch.Tensor) if t.requires_grad]
    return found or None
