"""Checkpoints and resume: a run cut short and resumed from its last common checkpoint ends with the same model
as a run that was never interrupted; each party keeps only its own checkpoint, in its own folder."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.test_methods import data_for
from vflo.artifacts import CheckpointStore
from vflo.cli import main
from vflo.comm.codec import decode
from vflo.comm.message import Message
from vflo.errors import ConfigError, ProtocolError, RemoteError
from vflo.federation.simulation import run_method
from vflo.methods.registry import checkpointed_tables, get_method
from vflo.nn.train import CheckpointPlan, TrainConfig

REPO = Path(__file__).resolve().parents[1]
EPOCHS = 5
TRAIN = {"lr": 0.01, "batch_size": 32, "max_epochs": EPOCHS, "patience": 100}
KILL_KIND = {"splitnn": "splitnn.forward", "entity_augmentation": "ea.forward", "vfl_asp": "splitnn.forward",
             "laser_vfl": "splitnn.forward"}
SHORT = {"max_epochs": 2, "batch_size": 64, "patience": 0, "validation_fraction": 0.0}


def method(name: str, every: int = 2, validation: float = 0.2) -> object:
    extra = {"student_train": SHORT, "embedding_train": SHORT} if name == "vfl_asp" else {}
    return get_method(name)(train={**TRAIN, "checkpoint_every": every, "validation_fraction": validation}, **extra)


class Killer:
    """Ends the run (as a party dying would) at the ``at``-th request of ``kind``."""

    def __init__(self, kind: str, at: int) -> None:
        self.kind, self.at, self.seen = kind, at, 0

    def __call__(self, message: Message) -> None:
        if message.kind == self.kind and message.sender == "act":  # requests, not their replies
            self.seen += 1
            if self.seen == self.at:
                raise ProtocolError(f"killed at {self.kind} #{self.at}")


def requests_per_epoch(name: str, data: object) -> int:
    counter = Killer(KILL_KIND[name], at=-1)
    run_method(method(name, every=0), data, seed=3, observers=(counter,))  # type: ignore[arg-type]
    return counter.seen // EPOCHS


@pytest.mark.parametrize(("name", "validation"), [("splitnn", 0.2), ("entity_augmentation", 0.0),
                                                  ("entity_augmentation", 0.2), ("vfl_asp", 0.2),
                                                  ("laser_vfl", 0.2)])
def test_resumed_run_ends_with_the_uninterrupted_model(name: str, validation: float, tmp_path: Path) -> None:
    data = data_for(name)
    reference = run_method(method(name, every=0, validation=validation), data, seed=3)  # type: ignore[arg-type]
    steps = requests_per_epoch(name, data)
    plan = CheckpointPlan(run="run1")
    # Killed in the middle of the fourth epoch: the checkpoints after epochs 2 and 4 (indices 1 and 3) ...
    killer = Killer(KILL_KIND[name], at=3 * steps + steps // 2)
    with pytest.raises(ProtocolError, match="killed"):
        run_method(method(name, validation=validation), data, seed=3, observers=(killer,),  # type: ignore[arg-type]
                   checkpoint=(tmp_path, plan))
    held = sorted(p.name for p in (tmp_path / "run1").iterdir())
    assert held == ["epoch-00001"]  # ... only the first was complete when it died
    resumed = run_method(method(name, validation=validation), data, seed=3,  # type: ignore[arg-type]
                         checkpoint=(tmp_path, CheckpointPlan(run="run1", resume=True)))
    assert np.array_equal(resumed.scores, reference.scores)  # bit for bit
    assert resumed.stats["epochs"] == reference.stats["epochs"]
    assert resumed.stats["resumed_after_epoch"] == 2 and "resumed_after_epoch" not in reference.stats
    # The resumed run trained only the epochs after the checkpoint.
    assert resumed.fit_entries < reference.fit_entries


def test_checkpointing_does_not_change_the_model(tmp_path: Path) -> None:
    data = data_for("splitnn")
    plain = run_method(method("splitnn", every=0), data, seed=1)  # type: ignore[arg-type]
    kept = run_method(method("splitnn", every=1), data, seed=1,  # type: ignore[arg-type]
                      checkpoint=(tmp_path, CheckpointPlan(run="abc")))
    assert np.array_equal(plain.scores, kept.scores)
    # Every epoch was checkpointed; each party keeps the newest three.
    kept_epochs = list(range(EPOCHS - 1))[-CheckpointStore.KEEP:]
    assert sorted(p.name for p in (tmp_path / "abc").iterdir()) == [f"epoch-{e:05d}" for e in kept_epochs]


def test_each_party_keeps_only_its_own_checkpoint(tmp_path: Path) -> None:
    data = data_for("splitnn")
    run_method(method("splitnn", every=2), data, seed=0,  # type: ignore[arg-type]
               checkpoint=(tmp_path, CheckpointPlan(run="r")))
    for epoch in (tmp_path / "r").iterdir():
        assert sorted(p.name for p in epoch.iterdir()) == sorted(p.name for p in data.parties)
        for folder in epoch.iterdir():
            manifest = json.loads((folder / "manifest.json").read_text())
            assert manifest["party"] == folder.name
            state = decode((folder / "state.vflo").read_bytes()).payload
            for other, table in data.train.items():
                if other == folder.name:
                    continue
                secret = {tuple(np.round(r, 4)) for r in table.X.astype(np.float64)}
                for value in state.values():
                    if isinstance(value, np.ndarray) and value.dtype.kind == "f" and value.ndim == 2:
                        assert not any(tuple(np.round(r.astype(np.float64), 4)) in secret for r in value)
            if folder.name != data.active:
                assert not any(k.startswith(("top.", "opt.", "loop.")) for k in state)


def test_resume_without_checkpoints_trains_from_the_start(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    data = data_for("splitnn")
    reference = run_method(method("splitnn", every=0), data, seed=2)  # type: ignore[arg-type]
    resumed = run_method(method("splitnn"), data, seed=2,  # type: ignore[arg-type]
                         checkpoint=(tmp_path, CheckpointPlan(run="none", resume=True)))
    assert np.array_equal(resumed.scores, reference.scores)
    assert "no checkpoint of this run" in caplog.text


def test_a_tampered_checkpoint_is_refused(tmp_path: Path) -> None:
    data = data_for("splitnn")
    run_method(method("splitnn", every=2), data, seed=0,  # type: ignore[arg-type]
               checkpoint=(tmp_path, CheckpointPlan(run="t")))
    state = tmp_path / "t" / "epoch-00003" / "pas" / "state.vflo"
    state.write_bytes(state.read_bytes()[:-5] + b"xxxxx")
    with pytest.raises(RemoteError, match=r"(?s)altered or truncated.*delete .*epoch-00003 at every party"):
        run_method(method("splitnn"), data, seed=0,  # type: ignore[arg-type]
                   checkpoint=(tmp_path, CheckpointPlan(run="t", resume=True)))


def test_checkpoint_settings_are_validated() -> None:
    with pytest.raises(ConfigError, match="checkpoint_every"):
        TrainConfig(checkpoint_every=-1)
    with pytest.raises(ConfigError, match=r"apc_vfl.train.checkpoint_every: this training keeps no checkpoints.*"
                                          r"remove the setting \(vflo methods lists the trainings that keep them\)"):
        get_method("apc_vfl")(train={**TRAIN, "checkpoint_every": 1})
    assert "splitnn.train" in checkpointed_tables() and "apc_vfl.train" not in checkpointed_tables()
    with pytest.raises(ConfigError, match="vfl_asp.student_train.checkpoint_every"):
        get_method("vfl_asp")(student_train={**TRAIN, "checkpoint_every": 1})
    get_method("vfl_asp")(train={**TRAIN, "checkpoint_every": 1})  # the teacher is SplitNN's loop


def test_run_and_resume_from_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = REPO / "examples" / "data"
    config = tmp_path / "exp.toml"
    config.write_text(f"""
name = "ck"
seed = 0
[[scenario.parties]]
name = "hospital"
role = "active"
file = "{data / 'hospital.csv'}"
id_column = "pid"
label_column = "outcome"
categorical = ["sex", "ward"]
[[scenario.parties]]
name = "lab"
file = "{data / 'lab.csv'}"
id_column = "pid"
impute = "median"
[protocol]
name = "repeated_runs"
runs = 1
test_from = "aligned"
[[methods]]
name = "splitnn"
train = {{ lr = 0.01, batch_size = 16, max_epochs = 6, patience = 100, checkpoint_every = 2 }}
""")
    assert main(["run", str(config), "--resume", "--out", str(tmp_path / "x"), "--no-progress"]) == 2
    assert "--checkpoints DIR" in capsys.readouterr().err
    checkpoints = tmp_path / "ck"
    assert main(["run", str(config), "--out", str(tmp_path / "a"), "--checkpoints", str(checkpoints),
                 "--no-progress"]) == 0
    (run,) = list(checkpoints.iterdir())
    assert sorted(p.name for p in run.iterdir()) == ["epoch-00001", "epoch-00003"]
    assert sorted(p.name for p in (run / "epoch-00001").iterdir()) == ["hospital", "lab"]
    # As if the run had stopped during its fourth epoch: the lab lost its last checkpoint.
    shutil.rmtree(run / "epoch-00003" / "lab")
    assert main(["run", str(config), "--out", str(tmp_path / "a"), "--checkpoints", str(checkpoints), "--resume",
                 "--no-progress"]) == 0
    first = pd.read_csv(tmp_path / "a" / "results.csv")
    assert main(["run", str(config), "--out", str(tmp_path / "b"), "--no-progress"]) == 0
    plain = pd.read_csv(tmp_path / "b" / "results.csv")
    assert first["accuracy"].tolist() == plain["accuracy"].tolist()
    assert first["fit_rounds"].iloc[0] < plain["fit_rounds"].iloc[0]
    assert first["resumed_after_epoch"].iloc[0] == 2  # it trained only epochs 3 to 6, and says so
    assert "resumed_after_epoch" not in plain
    report = (tmp_path / "a" / "report.md").read_text()
    assert "## How training ended" in report and "1 (after epoch 2)" in report


def test_a_party_keeps_only_its_newest_checkpoints_whatever_epochs_it_is_asked_for(tmp_path: Path) -> None:
    """25 split.checkpoint calls with epoch numbers of the coordinator's choosing wrote 38 MB at a lab: a party
    keeps the newest three of a run, and a repeated epoch replaces its slot."""
    from vflo.errors import ProtocolError

    store = CheckpointStore(tmp_path, party="lab", role="passive")
    state = {"w": np.ones((100, 100))}
    for epoch in (5, 3, 900, 7, 7, 12, 40, 41):
        store.save("run1", epoch, state)
    assert store.epochs("run1") == [40, 41, 900]
    assert len(list((tmp_path / "run1").iterdir())) == 3
    with pytest.raises(ProtocolError, match="outside 0..99999"):
        store.save("run1", 10**6, state)
