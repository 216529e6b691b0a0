"""Golden files: expected renderer output under tests/data/golden, compared byte for byte.

``MODTRACE_UPDATE_GOLDEN=1`` rewrites a file whose text changed (review the
diff before committing it) -- except under CI (``CI`` set, as ``.ci/run``
does), where a mismatch always fails, whatever else the environment says.
"""

from __future__ import annotations

import os
from pathlib import Path

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden"


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def check_golden(name: str, text: str, *, directory: Path = GOLDEN) -> None:
    path = directory / name
    if os.environ.get("MODTRACE_UPDATE_GOLDEN") and not _in_ci() and (not path.exists() or path.read_text() != text):
        path.write_text(text)
    assert text == path.read_text(), f"{path} differs (MODTRACE_UPDATE_GOLDEN=1 outside CI rewrites it)"
