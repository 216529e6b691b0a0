"""The kind of a step: the input shape of the root call that starts it.

A ``generate()`` loop calls the model once with the whole prompt (prefill)
and then once per new token (decode); a serving loop's requests come in a
few shapes; an eval loop's last batch may be short.  Such calls take very
different times, so a comparison should put like next to like.  The kind
of a root call is the shape of its first tensor argument, positional or
keyword, in the order of the module's ``forward`` parameters, written
``NAME=SHAPE``: ``input_ids=1x7`` for a prompt of 7 tokens, ``input_ids=1x1``
for a decode step.  One argument, not all: an attention mask grows by one
token every decode step, and those steps are still alike.

The tracker calls ``input_kind`` in the pre-hook of root calls only (a few
per step), never for the calls inside them.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch

_Tensor = torch.Tensor
# forward's parameter names (self left out), per module class: (positional, all)
_PARAMS: dict[type, tuple[tuple[str, ...], tuple[str, ...]]] = {}


def input_kind(mod: torch.nn.Module, args: tuple[Any, ...], kwargs: Mapping[str, Any] | None) -> str | None:
    """``NAME=SHAPE`` of the call's first tensor argument (looking one level
    into lists, tuples and dicts); None when it has none."""
    positional, names = _param_names(type(mod))
    for i, value in enumerate(args):
        found = _first_tensor(positional[i] if i < len(positional) else f"arg{i}", value)
        if found is not None:
            return found
    if kwargs:
        order = {name: k for k, name in enumerate(names)}
        for key in sorted(kwargs, key=lambda k: order.get(k, len(order))):  # stable: **kwargs keep call order
            found = _first_tensor(key, kwargs[key])
            if found is not None:
                return found
    return None


def _first_tensor(name: str, value: Any) -> str | None:
    if isinstance(value, _Tensor):
        return f"{name}={_shape(value)}"
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            if isinstance(item, _Tensor):
                return f"{name}[{i}]={_shape(item)}"
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if isinstance(item, _Tensor):
                return f"{name}.{key}={_shape(item)}"
    return None


def _shape(t: torch.Tensor) -> str:
    return "x".join(str(n) for n in t.shape) or "scalar"


def _param_names(cls: type) -> tuple[tuple[str, ...], tuple[str, ...]]:
    names = _PARAMS.get(cls)
    if names is None:
        try:
            params = list(inspect.signature(cls.forward).parameters.values())[1:]  # type: ignore[attr-defined]
        except (TypeError, ValueError):  # a forward inspect cannot read
            params = []
        positional = tuple(p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))
        names = (positional, positional + tuple(p.name for p in params if p.kind == p.KEYWORD_ONLY))
        _PARAMS[cls] = names
    return names
