"""Byte sizes as people write them."""

from __future__ import annotations

import pytest

from modtrace.core.errors import UsageError
from modtrace.core.sizes import format_bytes, parse_bytes


@pytest.mark.parametrize(("text", "value"), [
    ("123456", 123456), ("500MB", 500 * 1000**2), ("2GiB", 2 * 1024**3), ("1.5G", int(1.5 * 1024**3)),
    ("64 KiB", 65536), ("3kb", 3000), ("7b", 7), (4096, 4096),
])
def test_sizes_parse(text: str | int, value: int) -> None:
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text", ["", "2XB", "-1GB", "0", "GB", "1e9", "two"])
def test_bad_sizes_are_one_line_usage_errors(text: str) -> None:
    with pytest.raises(UsageError) as raised:
        parse_bytes(text)
    assert "\n" not in str(raised.value)


def test_sizes_format() -> None:
    assert [format_bytes(n) for n in (0, 1023, 1024, 1536 * 1024, 2 * 1024**3)] == [
        "0 B", "1023 B", "1 KiB", "1.5 MiB", "2 GiB"]


def test_a_bad_budget_on_the_command_line(run_cli) -> None:  # type: ignore[no-untyped-def]
    out = run_cli("memory", "@", "--budget", "2XB")
    assert out.code == 2 and len(out.err.strip().splitlines()) == 1
    assert "'2XB' is not a size" in out.err
