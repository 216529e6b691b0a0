"""The README and docs/ hold together: every relative link points at a file that exists and,
for a link into a Markdown page, at a heading that page has (GitHub's anchors); and every
command has a section in docs/ (the README is the front door, the reference lives there)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_COMMENT = re.compile(r"<!--.*?-->", re.S)
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)


def _prose(text: str) -> str:
    """The text with code blocks and HTML comments left out (a link there is not a link)."""
    return _COMMENT.sub("", _FENCE.sub("", text))


def anchors(text: str) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces to
    hyphens, a repeated one suffixed -1, -2, ..."""
    seen: dict[str, int] = {}
    out = set()
    for heading in _HEADING.findall(_prose(text)):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def links(text: str) -> list[str]:
    return _LINK.findall(_CODE_SPAN.sub("``", _prose(text)))


def test_anchors_follow_githubs_rule() -> None:
    text = "# `modtrace record`\n## Machine speed: the speed probe\n## `nesting_issues` (table)\n## Steps\n## Steps\n"
    assert anchors(text) == {"modtrace-record", "machine-speed-the-speed-probe", "nesting_issues-table", "steps", "steps-1"}


def test_links_skip_code() -> None:
    text = "see [a](a.md) and `[b](b.md)`\n```\n[c](c.md)\n```\n<!-- [d](d.md) -->\n"
    assert links(text) == ["a.md"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(page: Path) -> None:
    text = page.read_text()
    broken = []
    for target in links(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
            broken.append(f"{target}: no heading with that anchor in {dest.relative_to(REPO)}")
    assert broken == []


def test_every_command_has_a_docs_section() -> None:
    import click

    from modtrace.cli import cli

    headings = "\n".join(h for p in (REPO / "docs").glob("*.md") for h in _HEADING.findall(_prose(p.read_text())))
    missing = [n for n in cli.list_commands(click.Context(cli)) if f"`modtrace {n}`" not in headings]
    assert missing == []
