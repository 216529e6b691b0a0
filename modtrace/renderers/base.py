"""The one renderer interface: a model in, text out.

A renderer is a small class named by its ``--format`` value (``name``) and
the kind of model it renders (``kind``): ``rows`` (a ``Table``), ``tree``
(``TreeView``), ``diff`` (``DiffView``), ``report`` (the HTML report's
model) and ``trace`` (``Trace``).  ``render`` returns the text; ``write``
streams it to a file (a renderer of big outputs overrides it).  Every
renderer takes an optional ``progress`` callback, called with the number of
items done as it goes, and an optional ``Terminal``: where the text will be
shown (its width, whether it takes colour); without one the output is for a
pipe or a file, whole lines without styles.  Nothing here opens a database or
runs analysis.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Generic, TextIO, TypeVar

Progress = Callable[[int], None]
M = TypeVar("M", contravariant=True)


@dataclass(frozen=True)
class Terminal:
    """Where text output is shown.  ``width`` None: not a terminal (a pipe, a file), so lines
    are never wrapped or cut (``grep`` sees each row whole); ``color``: ANSI styles allowed."""

    width: int | None = None
    color: bool = False


def terminal_of(stream: TextIO) -> Terminal:
    """The ``Terminal`` of ``stream``: its width (``COLUMNS`` first, as ``shutil`` reads it) and
    colour unless ``NO_COLOR`` is set to anything (no-color.org); ``Terminal()`` when it is no tty."""
    try:
        if not stream.isatty():
            return Terminal()
    except (AttributeError, ValueError):
        return Terminal()
    return Terminal(width=shutil.get_terminal_size().columns, color=not os.environ.get("NO_COLOR"))


class Renderer(Generic[M]):
    kind: ClassVar[str]
    name: ClassVar[str]

    def __init__(self, *, progress: Progress | None = None, terminal: Terminal | None = None) -> None:
        self.progress = progress
        self.terminal = terminal or Terminal()

    def render(self, model: M) -> str:
        raise NotImplementedError

    def write(self, model: M, out: TextIO) -> None:
        out.write(self.render(model))
