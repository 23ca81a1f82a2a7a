"""docs/times.md is the page `python -m benchmarks.newcomer_times` writes, it lists every command whose time the
README promises, and the README states those times only by pointing to it (nothing is timed here)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks.newcomer_times import BEGIN, END, GENERATED, STEPS, TIME, parse_page, render

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGE = ROOT / "docs" / "times.md"
# A measured time as the page writes it ("48 s", "3 min 10 s", "1 h 2 min"), or a failure or a stop it measured.
MEASURED = re.compile(r"^(?:\d+(?:\.\d)? s|\d+ min \d+ s|\d+ h \d+ min|failed after .+|stopped after .+)$")


def _readme_commands() -> list[str]:
    """The lines of the README's first code block: the commands whose times the paragraph after it gives."""
    block = re.search(r"```bash\n(.*?)\n```", README.read_text(), flags=re.DOTALL)
    assert block is not None, "README.md has no ```bash block of commands"
    return [line.strip() for line in block.group(1).splitlines() if line.strip()]


def _paragraph_after_commands() -> str:
    text = README.read_text()
    after = text[text.index("```bash"):]
    after = after[after.index("```", 3) + 3:].lstrip("\n")
    return after.split("\n\n", 1)[0]


def _parts(command: str) -> set[str]:
    """The commands of a shell line, the virtual environment's creation left out (every install starts with it)."""
    return {p.strip() for p in command.strip("`").split(" && ")} - {"python3 -m venv .venv"}


def test_the_page_is_the_scripts() -> None:
    text = PAGE.read_text()
    assert GENERATED in text.splitlines()[2], "the page says which command generated it, under its title"
    rows = parse_page(text)
    assert [r["command"] for r in rows] == [f"`{s.readme}`" for s in STEPS]
    for r in rows:
        if r["date"] != "-":
            assert MEASURED.match(r["time"]), r
            assert re.fullmatch(r"\d{4}-\d\d-\d\d", r["date"]), r
            assert re.fullmatch(r"`[0-9a-f]{7,}(\+changes)?`", r["commit"]), r
            assert "cores" in r["machine"], r
        else:
            assert r["time"].startswith("not measured yet"), r


def test_the_page_lists_every_command_the_readme_times() -> None:
    rows = parse_page(PAGE.read_text())
    listed = set().union(*(_parts(r["command"]) for r in rows))
    for line in _readme_commands():
        assert _parts(line) <= listed, f"docs/times.md lacks {sorted(_parts(line) - listed)}"
    # The first line (install and quickstart) is what a newcomer runs first: its times are measured, not pending.
    first = _parts(_readme_commands()[0])
    for r in rows:
        if _parts(r["command"]) & first:
            assert r["date"] != "-", f"{r['command']} is not measured: python -m benchmarks.newcomer_times"


def test_the_readme_gives_those_times_only_by_the_page() -> None:
    paragraph = _paragraph_after_commands()
    assert "docs/times.md" in paragraph, "the paragraph after the README's commands points to docs/times.md"
    assert TIME.findall(paragraph) == [], f"README.md states times of its own: {TIME.findall(paragraph)}"


@pytest.mark.parametrize("said", ["under a minute", "after a two-minute install", "took 14 min 53 s",
                                  "eleven to sixteen minutes", "hours on 2 cores", "over the 10-second target",
                                  "about 15 s", "A minute: fewer cells"])
def test_a_stated_time_is_found(said: str) -> None:
    assert TIME.search(said)


@pytest.mark.parametrize("said", ["the second sets up and runs the tests", "a second-hop party", "on 2 cores",
                                  "Python 3.11", "about 1.5 times as slow", "see docs/times.md", "25 features"])
def test_what_is_no_time_is_not_found(said: str) -> None:
    assert not TIME.search(said)


def _record(status: str, **extra: object) -> dict[str, object]:
    return {"status": status, "seconds": 190.4, "exit_code": 0 if status == "ok" else 2, "floor_s": 2.1,
            "floors_s": [2.0, 2.2], "load_before": [1.5, 1.2, 1.0], "others_cores": 0.9, "date": "2026-01-02",
            "commit": "abcdef1+changes", "pinned_cores": None, "started_run": "2026-01-02 10:00 UTC",
            "machine": {"cpu_count": 2, "cpu_model": "a CPU", "memory_gb": 8.0}, "pip_settings": [], **extra}


def test_the_page_reads_back_what_the_script_writes() -> None:
    records = {"install": _record("ok"),
               "quickstart": _record("ok", methods_seconds={"apc_vfl": 20.0, "splitnn": 13.0}),
               "compare_own_files": _record("failed", error="vflo: error: a | in a message")}
    text = render(records)
    rows = {r["command"]: r for r in parse_page(text)}
    assert len(rows) == len(STEPS)
    quickstart = rows["`.venv/bin/vflo run configs/quickstart.toml`"]
    assert (quickstart["time"], quickstart["floor ratio"], quickstart["date"]) == ("3 min 10 s", "91", "2026-01-02")
    assert quickstart["load"] == "1.50; others used 0.9 cores"
    own = rows["`.venv/bin/vflo compare configs/examples/own_files.toml --quick`"]
    assert own["time"].startswith("failed after 3 min 10 s (exit 2): vflo: error:") and own["floor ratio"] == "-"
    assert rows["`VFLO_DATA_DIR=../shared/datasets .venv/bin/python -m pytest -q`"]["time"].startswith(
        "not measured yet (run with `--tests`)")
    assert "apc_vfl 61% (20 s)" in text


def test_a_page_the_script_did_not_write_is_refused() -> None:
    with pytest.raises(ValueError, match="not a page written by"):
        parse_page("# Times\n\n| command | time |\n|---|---|\n| x | 1 min |\n")
    table = f"{GENERATED}\n{BEGIN}\n| command | time |\n|---|---|\n{END}\n"
    with pytest.raises(ValueError, match="header"):
        parse_page(table)
