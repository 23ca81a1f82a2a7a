"""docs/comparison.md is regenerated a dataset at a time: a dataset with no runs here keeps its section as the page
held it, marked, so its age stays visible to the freshness check (benchmarks/freshness.py)."""

from __future__ import annotations

from pathlib import Path

from benchmarks import compare_docs, freshness


def test_a_dataset_not_re_run_keeps_its_section_and_its_commit(tmp_path: Path) -> None:
    page = tmp_path / "comparison.md"
    page.write_text("# Which method for my data?\n\nold intro\n\n"
                    "<!-- section: wine -->\n## wine\n\n`configs/compare/wine.toml`, runs of the code of commit "
                    "`abc1234`: 672 method runs\n\n| a | b |\n\n"
                    "<!-- section: credit -->\n## credit_default\n\nolder runs, no commit\n\n"
                    "<!-- section: link -->\n## Time over a real link\n\nthe code of commit `def5678`\n")
    before = compare_docs.kept(page)
    assert set(before) == {"wine", "credit", "link"}
    text = compare_docs.render({}, None, before) + "\n".join(
        [*compare_docs.link_section(tmp_path / "absent.json", before.get("link")),
         *compare_docs.overhead_section(tmp_path / "absent.json", before.get("overhead"))])
    assert freshness.sections(text)["wine"].strip() == freshness.sections(page.read_text())["wine"].strip()
    assert "the code of commit `def5678`" in freshness.sections(text)["link"]
    assert freshness.undated(text) == ["credit", "overhead"]  # kept without a commit; never run
    # Datasets neither run nor on the page are named as not run; those kept are not.
    missing = text[text.index("## Not run for this page"):]
    assert "configs/compare/breast_cancer.toml" in missing and "wine.toml" not in missing
    assert "old intro" not in text  # the header is this code's


def test_the_provenance_of_a_run_names_its_commit() -> None:
    assert compare_docs.provenance({"commit": "0123abc"}) == "runs of the code of commit `0123abc`"
    assert freshness.COMMIT.search(compare_docs.provenance({"commit": "0123abc"}))
    assert not freshness.COMMIT.search(compare_docs.provenance({"commit": None}))


def test_a_paused_run_is_timed_without_its_pause() -> None:
    assert compare_docs.paused_note(0.0) == ""
    assert compare_docs.paused_note(1704.0) == " (not counting about 28 min it was paused)"
