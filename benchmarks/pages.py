"""What the benchmarks that write a generated section of a docs page share: the section filled in between its
markers, and the machine a run measured."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def fill(page: Path, begin: str, end: str, section: str) -> None:
    """``page`` with its text from ``begin`` to ``end`` replaced by ``section`` (which carries both markers)."""
    text = page.read_text()
    if begin not in text or end not in text:
        raise SystemExit(f"{page} has no {begin} ... {end} section to fill")
    head, rest = text.split(begin, 1)
    page.write_text(head + section + rest.split(end, 1)[1])


def machine() -> str:
    """The processor and how many CPUs, as a page names the machine a figure was measured on."""
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs"
