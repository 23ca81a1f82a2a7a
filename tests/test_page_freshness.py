"""No generated page names a commit older than the code it describes, unless the page says which later change is
known and harmless (benchmarks/freshness.py); the pages not regenerated yet are listed, and must be stale."""

from __future__ import annotations

import subprocess

import pytest

from benchmarks import freshness


def _history() -> bool:
    try:
        subprocess.run(["git", "rev-parse", "HEAD"], cwd=freshness.ROOT, capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return False
    return True


pytestmark = pytest.mark.skipif(not _history(), reason="no git history here to compare the pages' commits with")


@pytest.mark.parametrize("page", sorted(freshness.PAGES))
def test_each_page_is_as_new_as_the_code_it_describes(page: str) -> None:
    missing = [c for c in freshness.recorded(page) if not freshness.known_commit(c)]
    if missing:
        pytest.skip(f"{page} records {missing}, which this checkout's history lacks (a shallow clone)")
    status = freshness.status(page)
    if page in freshness.PENDING:
        assert not status.fresh, (f"{page} is fresh now: take it off benchmarks/freshness.py's PENDING "
                                  f"({freshness.PENDING[page]!r})")
        return
    assert status.commits, f"{page} records no commit of the code that ran it"
    assert not status.unexplained, (
        f"{page} records {', '.join(c[:7] for c in status.commits)}, and {', '.join(status.unexplained)} changed "
        "the code it measures since: regenerate it, or declare the change harmless in benchmarks/freshness.py's "
        "KNOWN and say so on the page")
    assert not status.unsaid, f"{page} does not name {', '.join(status.unsaid)}, which KNOWN declares harmless"
    assert not status.undated, f"{page}'s sections {', '.join(status.undated)} record no commit: re-run them"


def test_a_page_of_sections_is_dated_section_by_section() -> None:
    page = ("# Title\n\nintro\n<!-- section: wine -->\n## wine\nruns of the code of commit 1234abc\n"
            "<!-- section: credit -->\n## credit\nfrom older runs, no commit named\n")
    assert list(freshness.sections(page)) == ["wine", "credit"]
    assert "commit 1234abc" in freshness.sections(page)["wine"]
    assert freshness.undated(page) == ["credit"]
    assert freshness.undated("# a page without sections, commit 1234abc\n") == []


def test_every_declaration_is_about_a_page_it_knows() -> None:
    assert {page for page, _ in freshness.KNOWN} <= set(freshness.PAGES)
    assert set(freshness.PENDING) <= set(freshness.PAGES)
    assert all(why for why in (*freshness.KNOWN.values(), *freshness.PENDING.values()))
