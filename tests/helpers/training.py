"""A small training loop, in this process or recorded, for the tests that train a model.

``train`` runs training steps over a given model (under whatever Recorder or
Tracker the test has started); ``record_training`` records a small model's
training steps as a run, the analysis waited for.  What varies between tests
(the inputs, the loss, the optimizer, accumulation, a closure, manual steps)
is a parameter, so a test says only what it needs that differs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import modtrace
from tests.helpers.models import mlp

# A shape (a fresh ``torch.randn`` of it each step), one tensor (the same each
# step), or a function of the step index (0, 1, ...) giving that step's input.
Inputs = tuple[int, ...] | torch.Tensor | Callable[[int], torch.Tensor]


def _input(inputs: Inputs, step: int) -> torch.Tensor:
    if isinstance(inputs, torch.Tensor):
        return inputs
    if isinstance(inputs, tuple):
        return torch.randn(*inputs)
    return inputs(step)


def train(model: nn.Module, steps: int, *, inputs: Inputs = (4, 8),
          loss: Callable[[nn.Module], torch.Tensor] | None = None, opt: torch.optim.Optimizer | None = None,
          lr: float | None = 0.01, accumulate: int = 1, closure: bool = False,
          each_step: Callable[[], object] | None = None) -> None:
    """``steps`` training steps of ``model``.

    Each step drops the gradients (``zero_grad``; the last step's are kept for
    the test to read), runs ``accumulate`` backwards of the loss --
    ``loss(model)``, or the sum of ``model``'s output for ``inputs`` (see
    ``Inputs``) -- then the optimizer's step.  The optimizer is ``opt``, or
    plain SGD at ``lr``; ``lr=None``: no optimizer.  ``closure``: forward and
    backward run inside ``opt.step(closure)``, as Lightning runs them.
    ``each_step`` is called after each step (``rec.step`` ends it under
    ``step_on="manual"``).
    """
    if opt is None and lr is not None:
        opt = torch.optim.SGD(model.parameters(), lr=lr)

    def backward(step: int) -> torch.Tensor:
        out = loss(model) if loss is not None else model(_input(inputs, step)).sum()
        out.backward()
        return out

    def closure_step(opt: torch.optim.Optimizer, step: int) -> None:
        def run() -> torch.Tensor:
            opt.zero_grad()
            return backward(step)

        opt.step(run)

    for step in range(steps):
        if closure:
            assert opt is not None, "a closure needs an optimizer to run it"
            closure_step(opt, step)
        else:
            if opt is not None:
                opt.zero_grad()
            else:
                model.zero_grad()
            for _ in range(accumulate):
                backward(step)
            if opt is not None:
                opt.step()
        if each_step is not None:
            each_step()


def record_training(db: str, run: str, steps: int, *, model: Callable[[], nn.Module] = mlp, inputs: Inputs = (4, 8),
                    lr: float = 0.01, wait: bool = True, **recorder: Any) -> modtrace.Recorder:
    """Record ``steps`` steps of ``train`` as ``run`` in ``db`` (a SQLite path or a URL); the Recorder.

    The model is ``model()`` built after ``torch.manual_seed(0)``, its SGD
    optimizer at ``lr`` made before recording starts; ``recorder`` holds the
    Recorder's other arguments (``clock=``, ``handle_sigterm=``...).  With
    ``wait`` the run's analysis is waited for (the writer process analyses it
    after the ``with``), so no writer outlives the call.
    """
    torch.manual_seed(0)
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    with modtrace.Recorder(db=db, run=run, **recorder) as rec:
        train(net, steps, inputs=inputs, opt=opt)
    if wait:
        rec.wait_analyzed()
    return rec


def record_serving(db: str, run: str, *, threads: int = 3, requests: int = 30) -> None:
    """Record a serving loop as ``run`` in ``db``: ``threads`` threads each making ``requests``
    calls of ``mlp()`` under no_grad, no optimizer (each root call a step); the analysis waited for."""
    torch.manual_seed(0)
    model = mlp()

    def serve() -> None:
        with torch.no_grad():
            for _ in range(requests):
                model(torch.randn(2, 8))

    with modtrace.Recorder(db=db, run=run) as rec:
        workers = [threading.Thread(target=serve) for _ in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    rec.wait_analyzed()
