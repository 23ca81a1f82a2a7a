"""Generated figures in docs: a benchmark's lines written between its two markers on a page."""

from __future__ import annotations

from pathlib import Path


def write_marked(page: Path, begin: str, end: str, lines: list[str]) -> None:
    """Replace what lies between ``begin`` and ``end`` on ``page`` with ``lines``."""
    text = page.read_text()
    a, b = text.index(begin) + len(begin), text.index(end)
    page.write_text(text[:a] + "\n" + "\n".join(lines) + "\n" + text[b:])
