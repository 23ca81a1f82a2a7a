"""The page's table of attacks lists the catalog's, and every test the catalog names exists."""

from __future__ import annotations

import re
from pathlib import Path

from tests.attack_catalog import ATTACKS, table

ROOT = Path(__file__).resolve().parents[1]


def test_every_test_the_catalog_names_exists() -> None:
    for attack in ATTACKS:
        assert attack.tests, attack.surface
        for target in attack.tests:
            path, _, name = target.partition("::")
            source = (ROOT / path).read_text()
            assert re.search(r"^def test_", source, flags=re.M), f"{path} holds no test"
            if name:
                assert re.search(rf"^def {re.escape(name)}\(", source, flags=re.M), f"{target} is no test"


def test_the_security_page_lists_the_catalogs_attacks() -> None:
    text = (ROOT / "docs" / "security.md").read_text()
    shown = text[text.index("<!-- attacks:begin -->"):text.index("<!-- attacks:end -->")]
    rows = [line for line in shown.splitlines() if line.startswith("| ") and not line.startswith("| surface")]
    expected = [line for line in table().splitlines()[2:]]
    # the last column is the run's outcome: compared apart
    assert [r.rsplit("|", 2)[0] for r in rows] == [e.rsplit("|", 2)[0] for e in expected], (
        "regenerate the table: python -m benchmarks.attacks_table")
    assert all("held:" in r.rsplit("|", 2)[1] for r in rows), "an attack's tests did not all pass when last run"
