"""The one renderer interface: a model in, text out.

A renderer is a small class named by its ``--format`` value (``name``) and
the kind of model it renders (``kind``): ``rows`` (a ``Table``), ``tree``
(``TreeView``), ``diff`` (``DiffView``), ``report`` (the HTML report's
model) and ``trace`` (``Trace``).  ``render`` returns the text; ``write``
streams it to a file (a renderer of big outputs overrides it).  Every
renderer takes an optional ``progress`` callback, called with the number of
items done as it goes.  Nothing here opens a database or runs analysis.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar, Generic, TextIO, TypeVar

Progress = Callable[[int], None]
M = TypeVar("M", contravariant=True)


class Renderer(Generic[M]):
    kind: ClassVar[str]
    name: ClassVar[str]

    def __init__(self, *, progress: Progress | None = None) -> None:
        self.progress = progress

    def render(self, model: M) -> str:
        raise NotImplementedError

    def write(self, model: M, out: TextIO) -> None:
        out.write(self.render(model))
