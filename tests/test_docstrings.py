"""Docstrings and comments in src/vflo say what and why, never a figure measured on one machine: a time, a speed, a
memory peak, "N times faster", "seen in 3 runs of 5". Such figures go stale with the next machine or change; they
belong in the generated docs (docs/times.md, docs/deploy.md's tables), and a docstring points to the benchmark or
page that measures them. Settings the code applies (a timeout, a library's fixed wait) may carry a unit: each is
in :data:`ALLOWED`, with why. Sizes that follow from an input (10M x 256 float32 is 10 GB) are not measurements.

Docstrings are read with :mod:`ast` (a module's, a class's or a function's first statement, and an attribute's
string right after its assignment); comments (``#:`` ones included) with :mod:`tokenize`. A run of comment lines,
and a docstring, is scanned as one text, so a figure broken across two lines is still found."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "vflo"

_NUMBER = r"(?<![\w.-])\d+(?:[.,]\d+)*"
#: A number and a unit of time ("5 µs", "0.18 s", "58 s", "3 min").
TIME = re.compile(_NUMBER + r"\s?(?:µs|μs|us|ns|ms|s|secs?|seconds?|mins?|minutes?|h|hours?)(?![\w/])")
#: A time in words where the sentence says it was measured ("costs HEU half a second here").
WORD_TIME = re.compile(r"\b(?:a|one|half a|a (?:third|quarter|tenth|fifth|fraction) of a)\s+"
                       r"(?:second|millisecond|microsecond|minute)s?\b", re.IGNORECASE)
#: A rate: "200 MB/s", "150,000 rows/s", "10 IDs per second".
SPEED = re.compile(_NUMBER + r"\s?(?:[kKMGT]i?B|[kMG]bit|rows|IDs|points|messages|calls)?\s?(?:/s\b|per second\b)")
#: A measured ratio: "3x faster", "4.8 times as fast", "1.0x against 1.9x", "20% off", "tripled its start".
RATIO = re.compile(_NUMBER + r"\s?(?:x|×|times)\s+(?:faster|slower|quicker|as fast|as slow|as long|longer|shorter"
                   r"|against)\b|" + _NUMBER + r"\s?%\s+(?:off|faster|slower|quicker|less time|more time)\b"
                   r"|\b(?:doubled|tripled|quadrupled|halved)\s+(?:its|the)\s+(?:start|time|speed|cost|memory)\b",
                   re.IGNORECASE)
#: How often a run showed something: "seen in 3 runs of 5", "in 2 of 7 runs".
RUNS = re.compile(r"\bseen in \d+\b|\b\d+ (?:runs )?of \d+ runs\b|\b\d+ runs of \d+\b", re.IGNORECASE)
#: Where a figure was measured: "on this project's 2-core machine".
MACHINE = re.compile(r"\bthis project's (?:\d+-core )?machine\b", re.IGNORECASE)
#: An amount of memory, flagged only where its sentence says it was measured, or sizes text IDs (whose bytes depend
#: on the data): a size that follows from an input's shape is no measurement.
MEMORY = re.compile(_NUMBER + r"\s?(?:[kKMGT]i?B|kB|bytes)\b")
_CUE = r"took|peak|peaked|measured|here|against|at a lab|resident|allocations|mapped"
#: Each figure flagged only beside a word that says it was measured in its sentence.
CUED = ((WORD_TIME, re.compile(rf"\b(?:{_CUE}|costs?|takes)\b", re.IGNORECASE)),
        (MEMORY, re.compile(rf"\b(?:{_CUE}|text IDs|keeps|was once|[KMG]B more)\b", re.IGNORECASE)))
ALWAYS = (TIME, SPEED, RATIO, RUNS, MACHINE)

#: Settings that carry a unit, by file (under src/vflo) and the phrase that states them, with why they stay.
ALLOWED: dict[tuple[str, str], str] = {
    ("align/link_relay.py", "waited 3 s (its health check)"):
        "the PSI library's link redials after its fixed health-check interval: a setting of the library",
    ("align/link_relay.py", "a refused link waits 3 s before it dials again"):
        "the same interval of the library, said where the relay's listening is ordered around it",
    ("align/spu.py", "at most 5 s"): "how long Prepared lets a side's child close its link before stopping it",
    ("align/spu_side.py", "sent again after 1, 3 and 5 s by default"):
        "the PSI library's default retry intervals, which the code overrides",
    ("align/spu_side.py", "Every 50 ms, then at most every 200 ms"): "the retry intervals the code sets",
    ("flower/simulation.py", "Ray gives its node 30 s to register"): "Ray's registration timeout, not vflo's",
}

_SENTENCE_END = re.compile(r"[.;!?](?=\s|$)")


class Text:
    """One docstring or one run of comment lines, its lines joined by single spaces, and where each line starts."""

    def __init__(self, lines: list[tuple[int, str]]) -> None:
        self.lines = lines
        self.starts: list[int] = []
        parts: list[str] = []
        at = 0
        for _, line in lines:
            self.starts.append(at)
            parts.append(line)
            at += len(line) + 1
        self.flat = " ".join(parts)

    def line_of(self, offset: int) -> tuple[int, str]:
        index = max(i for i, start in enumerate(self.starts) if start <= offset)
        return self.lines[index]

    def sentence(self, start: int, end: int) -> str:
        before = [m.end() for m in _SENTENCE_END.finditer(self.flat, 0, start)]
        after = _SENTENCE_END.search(self.flat, end)
        return self.flat[before[-1] if before else 0 : after.end() if after else len(self.flat)]


def _docstrings(tree: ast.Module) -> Iterator[ast.Constant]:
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        for i, statement in enumerate(body):
            if not (isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)
                    and isinstance(statement.value.value, str)):
                continue
            first = i == 0 and isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            if first or (i > 0 and isinstance(body[i - 1], ast.Assign | ast.AnnAssign)):
                yield statement.value


def texts(source: str) -> Iterator[Text]:
    """Every docstring and every run of comment lines of ``source``."""
    for constant in _docstrings(ast.parse(source)):
        assert isinstance(constant.value, str)
        yield Text([(constant.lineno + i, line.strip()) for i, line in enumerate(constant.value.splitlines())])
    run: list[tuple[int, str]] = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type != tokenize.COMMENT:
            continue
        line = (token.start[0], token.string.lstrip("#").removeprefix(":").strip())
        if run and line[0] != run[-1][0] + 1:
            yield Text(run)
            run = []
        run.append(line)
    if run:
        yield Text(run)


def figures(source: str, name: str, used: set[tuple[str, str]] | None = None) -> list[str]:
    """``name:line: text`` for each measured figure in ``source``'s docstrings and comments that :data:`ALLOWED`
    does not cover (``name`` being the file's path under src/vflo); the allowances that covered one go to
    ``used``."""
    found: list[str] = []
    for text in texts(source):
        allowed = [(key, m.span()) for key in ALLOWED if key[0] == name
                   for m in re.finditer(re.escape(key[1]), text.flat)]
        hits = [m for pattern in ALWAYS for m in pattern.finditer(text.flat)]
        hits += [m for pattern, cue in CUED for m in pattern.finditer(text.flat)
                 if cue.search(text.sentence(*m.span()))]
        by_line: dict[tuple[int, str], list[str]] = {}
        for m in sorted(hits, key=lambda m: m.start()):
            cover = [key for key, (a, b) in allowed if a <= m.start() and m.end() <= b]
            if cover:
                if used is not None:
                    used.update(cover)
                continue
            by_line.setdefault(text.line_of(m.start()), []).append(m.group(0))
        found += [f"{name}:{number}: {line}  [{'; '.join(what)}]" for (number, line), what in by_line.items()]
    return sorted(found, key=lambda e: (e.split(":")[0], int(e.split(":")[1])))


def _sources() -> Iterator[tuple[str, str]]:
    for path in sorted(SRC.rglob("*.py")):
        yield path.relative_to(SRC).as_posix(), path.read_text(encoding="utf-8")


def test_no_figure_measured_on_one_machine() -> None:
    found = [entry for name, source in _sources() for entry in figures(source, name)]
    assert not found, (
        "docstrings and comments quote figures measured on one machine; say why without the number and point to "
        "the benchmark (python -m benchmarks.NAME) or generated page (docs/...) that measures it, or, for a "
        "setting the code applies, add it to ALLOWED with the reason (paths under src/vflo):\n" + "\n".join(found))


def test_every_allowance_is_used() -> None:
    used: set[tuple[str, str]] = set()
    for name, source in _sources():
        figures(source, name, used)
    assert set(ALLOWED) <= used, f"allowed phrases no longer found, remove them: {sorted(set(ALLOWED) - used)}"


PLANTED = '''"""Blinding with the eight lanes takes 5 µs per point here."""

import os


def spin() -> None:
    """Two threads on a loaded machine."""
    # seen in 3 runs of 5 when the other core was busy: 1.5 s with one thread,
    # 58
    # s with two
    os.sched_yield()


#: Rows per block.
BLOCK = 2048
"""Scored a million rows 2.4x faster than one call (a 120 MB header took a party from 147 MB to 3.5 GB)."""
'''


def test_the_scan_finds_planted_figures() -> None:
    found = figures(PLANTED, "planted.py")
    assert found == [
        "planted.py:1: Blinding with the eight lanes takes 5 µs per point here.  [5 µs]",  # a module's docstring
        "planted.py:8: seen in 3 runs of 5 when the other core was busy: 1.5 s with one thread,  [seen in 3; 1.5 s]",
        "planted.py:9: 58  [58 s]",  # a comment's figure broken across two lines
        # an attribute's docstring: a ratio, and memory its sentence says a party took
        "planted.py:16: Scored a million rows 2.4x faster than one call (a 120 MB header took a party from 147 MB "
        "to 3.5 GB).  [2.4x faster; 120 MB; 147 MB; 3.5 GB]",
    ]


def test_settings_and_sizes_pass() -> None:
    source = '''"""A 2 x 2 matrix, a 95% t-interval, O(n) in 1M IDs; 10M x 256 float32 is 10 GB, under 64 MB each."""

# At most a second between checks; 8 bytes a frame.
WAIT = 1.0
'''
    assert figures(source, "settings.py") == []
    # A setting with a unit passes only where ALLOWED names it, in its own file.
    setting = '"""The library\'s link, refused, waited 3 s (its health check) before it dialled again."""\n'
    used: set[tuple[str, str]] = set()
    assert figures(setting, "align/link_relay.py", used) == []
    assert used == {("align/link_relay.py", "waited 3 s (its health check)")}
    assert figures(setting, "align/other.py") != []
