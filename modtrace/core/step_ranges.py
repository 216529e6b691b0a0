"""Step numbers written as ranges ('1-3,7'), as ``run_ranks.dropped_steps`` and
``run_ranks.recorded_steps`` store them."""

from __future__ import annotations

from collections.abc import Iterable


def ranges(steps: Iterable[int]) -> str | None:
    """Step numbers as ranges: {1, 2, 3, 7} -> '1-3,7'; None when empty."""
    out: list[str] = []
    for step in sorted(set(steps)):
        if out and int(out[-1].rsplit("-", 1)[-1]) == step - 1:
            out[-1] = f"{out[-1].split('-')[0]}-{step}"
        else:
            out.append(str(step))
    return ",".join(out) or None


def parse_ranges(text: str) -> set[int]:
    """'1-3,7' -> {1, 2, 3, 7}; '' -> the empty set."""
    steps: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        first, _, last = part.partition("-")
        steps.update(range(int(first), int(last or first) + 1))
    return steps
