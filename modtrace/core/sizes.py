"""Byte sizes as people write them (``2GiB``, ``500MB``, ``1.5 G``, ``123456``) and as modtrace
shows them; pure Python, for the API, the CLI and the renderers alike."""

from __future__ import annotations

import re

from modtrace.core.errors import UsageError

# Decimal units are powers of 1000, binary ones (KiB...) of 1024; a bare letter (K, M, G, T) is
# read as binary, as most tools that print memory mean it.
_UNITS = {
    "": 1, "b": 1,
    "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
    "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: str | int) -> int:
    """A byte count from ``text``: a number with an optional unit (B, KB/MB/GB/TB in powers of
    1000, KiB/MiB/GiB/TiB or K/M/G/T in powers of 1024; case does not matter).  A usage error,
    one line, for anything else, zero or a negative size."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text <= 0:
            raise UsageError(f"{text}: a size in bytes above 0")
        return text
    found = _SIZE.match(str(text))
    unit = found.group(2).lower() if found else None
    if found is None or unit not in _UNITS:
        raise UsageError(f"{text!r} is not a size: a number of bytes, or with a unit such as 500MB, 2GiB or 1.5G")
    value = int(float(found.group(1)) * _UNITS[unit])
    if value <= 0:
        raise UsageError(f"{text!r}: a size in bytes above 0")
    return value


def format_bytes(n: int | float | None) -> str:
    """Bytes in the largest binary unit that keeps it >= 1, three significant digits: ``1.5 GiB``."""
    if n is None:
        return ""
    value = float(n)
    for unit, scale in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.0f} B"
