"""Is each generated page as new as the code it describes? (not a test; tests/test_page_freshness.py holds it)

    python -m benchmarks.freshness          every page: the commits it records, and what changed its code since

A generated page records the commit of the code that ran it ("the code of commit X", "at commit X"). For each
page, :data:`PAGES` names the code it measures; a commit after the recorded one that touched that code makes the
page stale, unless :data:`KNOWN` declares it harmless for that page, with why, and the page itself says so (its
text names the commit). :data:`PENDING` lists pages not regenerated yet, with why: the test requires them to be
stale (a page regenerated leaves the list) and every other page to be fresh.

A page made of sections regenerated one at a time (``<!-- section: NAME -->`` before each, as docs/comparison.md's
datasets: a session re-runs some and keeps the others) is fresh only when every section records its commit: a
section kept from runs that recorded none is as stale as a page that records none.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: What every simulated number depends on: seeds, the data and how it is cut, the runner.
BASE = ("src/vflo/seeding.py", "src/vflo/data", "src/vflo/experiments/runner.py", "src/vflo/metrics.py")
#: What every neural method trains with.
NETS = ("src/vflo/nn/train.py", "src/vflo/nn/models.py", "src/vflo/nn/estimators.py",
        "src/vflo/methods/split_learning.py", "src/vflo/methods/splitnn.py")


@dataclass(frozen=True)
class Page:
    code: tuple[str, ...]


PAGES: dict[str, Page] = {
    "docs/reproductions/secureboost.md": Page(code=(*BASE, "src/vflo/trees", "src/vflo/methods/secureboost.py")),
    "docs/reproductions/laser-vfl.md": Page(code=(*BASE, *NETS, "src/vflo/methods/laser_vfl.py")),
    "docs/reproductions/apc-vfl.md": Page(code=(*BASE, *NETS, "src/vflo/methods/apc_vfl.py")),
    "docs/reproductions/entity-augmentation.md": Page(code=(*BASE, *NETS,
                                                            "src/vflo/methods/entity_augmentation.py")),
    "docs/reproductions/rap.md": Page(code=(*BASE, *NETS, "src/vflo/methods/rap.py")),
    "docs/reproductions/vfl-asp.md": Page(code=(*BASE, *NETS, "src/vflo/methods/vfl_asp.py")),
    "docs/privacy.md": Page(code=(*BASE, *NETS, "src/vflo/dp.py", "src/vflo/privacy", "src/vflo/nn/private.py",
                                  "src/vflo/methods")),
    "docs/comparison.md": Page(code=(*BASE, *NETS, "src/vflo/methods", "src/vflo/trees")),
}

#: (page, commit) -> why a later change to the page's code leaves its figures as they are.
KNOWN: dict[tuple[str, str], str] = {
    **{("docs/reproductions/secureboost.md", c): why for c, why in (
        ("f287ed1", "a partner sums a small derived node afresh instead of subtracting: the same sums, tested "
                    "bit-identical both ways"),
        ("069800c", "a partner's subtractions shared out among its workers: the same sums, tested bit-identical"),
        ("84ffe31", "the encrypted statistics passed on as they arrived: the same ciphertexts"),
        ("a57d16f", "GOSS row sampling added, off by default: with every person in every tree the same messages, "
                    "sums and trees (the lossless and equality tests unchanged)"),
        ("2441eaa", "GOSS's sample drawn once a round and skipping partners with too little of it: off by default, "
                    "the same messages, sums and trees"),
        ("532ab8a", "the sampled rows' places computed once per node, and counted rows once a round: the same sums"))},
    ("docs/reproductions/laser-vfl.md", "83fef32"): "class-balanced draw chances computed once per training, not "
                                                    "once an epoch (the same generator calls); one shared set_lr",
}

#: Pages not regenerated from today's code yet, and why.
PENDING: dict[str, str] = {
    "docs/reproductions/apc-vfl.md": "not re-run since the seed change (hours on 2 cores; issue 50)",
    "docs/reproductions/entity-augmentation.md": "not re-run since the seed change (hours on 2 cores; issue 50)",
    "docs/reproductions/vfl-asp.md": "not re-run since the seed change (hours on 2 cores; issue 50)",
    "docs/comparison.md": "the eight datasets re-run a few at a time (hours in all), each section stamped as it is; "
                          "those not re-run yet record no commit (issue 50)",
    "docs/privacy.md": "sections from runs before later changes to the methods it runs, not yet re-run (issue 50)",
}

COMMIT = re.compile(r"\bcommit `?([0-9a-f]{7,40})\b")
SECTION = re.compile(r"^<!-- section: ([\w.-]+) -->$", re.MULTILINE)


def recorded(page: str) -> list[str]:
    """The commits ``page`` says its figures come from, in order of first mention."""
    found = COMMIT.findall((ROOT / page).read_text())
    return list(dict.fromkeys(found))


def sections(text: str) -> dict[str, str]:
    """A page's ``<!-- section: NAME -->`` sections, each to the next marker (the last to the page's end)."""
    marks = list(SECTION.finditer(text))
    return {m.group(1): text[m.end():marks[i + 1].start() if i + 1 < len(marks) else len(text)]
            for i, m in enumerate(marks)}


def undated(text: str) -> list[str]:
    """The sections of a page's ``text`` that record no commit."""
    return [name for name, body in sections(text).items() if not COMMIT.search(body)]


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout


def known_commit(sha: str) -> bool:
    return subprocess.run(["git", "cat-file", "-e", f"{sha}^{{commit}}"], check=False, cwd=ROOT,
                          capture_output=True).returncode == 0


def later(page: str, since: str) -> list[str]:
    """Commits after ``since`` (to HEAD) that touched the code ``page`` measures: short hashes, newest first."""
    out = git("log", "--format=%h", "--abbrev=7", f"{since}..HEAD", "--", *PAGES[page].code)
    return out.split()


@dataclass(frozen=True)
class Status:
    page: str
    commits: tuple[str, ...]
    unexplained: tuple[str, ...]  # later changes to its code that nothing declares harmless
    unsaid: tuple[str, ...]  # changes declared harmless that the page does not name
    undated: tuple[str, ...] = ()  # sections that record no commit

    @property
    def fresh(self) -> bool:
        return bool(self.commits) and not self.unexplained and not self.unsaid and not self.undated


def status(page: str) -> Status:
    commits = recorded(page)
    text = (ROOT / page).read_text()
    unexplained: list[str] = []
    unsaid: list[str] = []
    for since in commits:
        for change in later(page, since):
            if any(change.startswith(c) or c.startswith(change) for p, c in KNOWN if p == page):
                if change not in text:
                    unsaid.append(change)
            elif change not in unexplained:
                unexplained.append(change)
    return Status(page, tuple(commits), tuple(unexplained), tuple(dict.fromkeys(unsaid)), tuple(undated(text)))


def main() -> int:
    for page in PAGES:
        s = status(page)
        state = "fresh" if s.fresh else ("pending: " + PENDING[page] if page in PENDING else "STALE")
        print(f"{page}: {state}")
        print(f"  records {', '.join(c[:7] for c in s.commits) or 'no commit'}")
        if s.unexplained:
            print(f"  changed since by {', '.join(s.unexplained)}")
        if s.unsaid:
            print(f"  declared harmless but not named on the page: {', '.join(s.unsaid)}")
        if s.undated:
            print(f"  sections that record no commit: {', '.join(s.undated)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
