"""A deployed partner's own record of who asked about its people: `vflo predict --deploy` scores the active party's
test people with a partner serving its saved part (`vflo party serve`, gRPC with mutual TLS), and the partner's
record, beside its config and its owner's alone, names the people it was asked about, who asked, with which
saved model; `vflo party audit FILE --person ID` answers who asked about one of them."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from tests.conftest import vertical_split
from tests.e2e.conftest import start_federation, train_and_save, write_deploy
from vflo.artifacts import ModelCard
from vflo.cli import main
from vflo.methods.registry import get_method
from vflo.party.asked import about, read_asked

pytestmark = pytest.mark.slow
SETTINGS: dict[str, Any] = {"train": {"max_epochs": 1}}


def test_a_deployed_partner_records_who_asked_about_which_of_its_people(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = vertical_split(20)
    cls = get_method("splitnn")
    federation = start_federation(tmp_path / "fed", data, {}, proposals=[cls(**SETTINGS)])
    try:
        train_and_save(federation, cls(**SETTINGS), tmp_path / "models", "splitnn")
        deploy = write_deploy(federation.deploy, tmp_path / "deploy.toml")
        out = tmp_path / "scores.csv"
        assert main(["predict", str(tmp_path / "models"), "--method", "splitnn", "--data",
                     str(federation.deploy.test_file), "--deploy", str(deploy), "--out", str(out)]) == 0
    finally:
        federation.stop()
    capsys.readouterr()
    model_id = ModelCard.read(tmp_path / "models" / "splitnn").model_id
    scored = set(pd.read_csv(out, dtype={"id": str})["id"])
    held = set(pd.read_csv(tmp_path / "fed" / "pas_serve.csv", dtype={"id": str})["id"])
    record = tmp_path / "fed" / "pas_asked.jsonl"  # the default: beside the partner's config
    assert stat.S_IMODE(record.stat().st_mode) == 0o600
    lines = read_asked(record)
    asks = [r for r in lines if r.named_by == "ids"]
    assert asks and {(r.peer, r.model, r.model_id, r.status) for r in asks} == {("act", "splitnn", model_id, "ok")}
    # The people the scoring requests named: the test people the partner holds, as its own IDs.
    assert set().union(*(r.ids for r in asks)) == scored & held
    person = sorted(scored & held)[0]
    assert about(lines, person)
    audit = tmp_path / "fed" / "pas_audit.jsonl"
    assert main(["party", "audit", str(audit), "--person", person]) == 0
    shown = capsys.readouterr().out
    assert "split.activations" in shown and model_id in shown and "act" in shown
    assert main(["party", "audit", str(audit)]) == 0
    assert "who asked about the people of party pas" in capsys.readouterr().out
