"""Progress bars for long runs: shown on a terminal, silent otherwise (CI logs, pipes)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class _Silent:
    def add_task(self, *_args: Any, **_kwargs: Any) -> int:
        return 0

    def advance(self, *_args: Any, **_kwargs: Any) -> None:
        return None


def interactive() -> bool:
    return sys.stderr.isatty()


@contextmanager
def progress_bar(*, enabled: bool, description: str = "") -> Iterator[Any]:
    """A rich progress bar on stderr when ``enabled`` and stderr is a terminal, else a no-op."""
    if not (enabled and interactive()):
        yield _Silent()
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        transient=True,
    ) as bar:
        yield bar
