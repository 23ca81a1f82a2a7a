"""Entity Augmentation: interpolated labels, no alignment, fault-tolerant queues, bad input."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import make_dataset
from vflo.comm.faults import FaultPlan
from vflo.comm.message import Message
from vflo.data.layout import FederatedData
from vflo.data.partydata import PartyData
from vflo.data.scenario import PartySpec, SamplesSpec, ScenarioSpec
from vflo.errors import ConfigError, DeliveryTimeoutError, MethodError, ProtocolError, ScenarioError
from vflo.federation.simulation import run_method
from vflo.methods.entity_augmentation import interpolated_labels
from vflo.methods.registry import get_method
from vflo.metrics import compute_metrics

TRAIN = {"lr": 5e-3, "batch_size": 32, "max_epochs": 3, "patience": 0, "validation_fraction": 0.0}


def _data(aligned: float = 0.2, n: int = 400, guests: int = 2, n_classes: int = 3, seed: int = 0,
          task: str | None = None) -> FederatedData:
    ds = make_dataset(n=n, n_features=6, n_classes=n_classes, seed=seed, task=task)
    spec = ScenarioSpec(
        parties=(PartySpec(name="host", role="active", columns=()),
                 *(PartySpec(name=f"g{i}", share=1.0) for i in range(guests))),
        samples=SamplesSpec(layout="misaligned", aligned=aligned),
    )
    layout = spec.build(ds, seed=seed)
    return layout.materialize(test_ids=np.sort(layout.aligned_ids())[:40])


def test_labels_are_interpolated_by_activation_width() -> None:
    y = np.array([[[1, 0], [0, 1]], [[0, 1], [0, 1]]], dtype=np.float32)  # 2 guests x 2 rows x 2 classes
    out = interpolated_labels(y, np.array([3.0, 1.0]))
    assert np.allclose(out, [[0.75, 0.25], [0.0, 1.0]])
    with pytest.raises(ValueError, match="positive width"):
        interpolated_labels(y, np.array([1.0, 0.0]))


def test_guests_walk_their_own_entities_without_alignment() -> None:
    data = _data(aligned=0.2)
    seen: list[Message] = []
    method = get_method("entity_augmentation")(train=TRAIN)
    out = run_method(method, data, seed=0, observers=(seen.append,))
    # every guest used all of its labelled training entities, not just the shared ones
    assert method.entities_used_ == {g: data.train[g].n_samples for g in ("g0", "g1")}
    assert out.stats["entities_used"] == data.train["g0"].n_samples + data.train["g1"].n_samples
    # within a step the guests send different entities: no alignment happened
    steps = [m for m in seen if m.kind == "ea.forward" and m.payload.get("ids") is not None]
    first_two = steps[:2]
    assert {m.sender for m in first_two} == {"g0", "g1"}
    assert not np.array_equal(first_two[0].payload["ids"], first_two[1].payload["ids"])
    assert not any(m.kind.startswith("align.") for m in seen)
    assert out.scores.shape == (40, 3) and np.allclose(out.scores.sum(1), 1.0)


def test_aligned_mode_sends_the_same_entities_from_every_guest() -> None:
    data = _data(aligned=0.5)
    seen: list[Message] = []
    method = get_method("entity_augmentation")(entities="aligned", train=TRAIN)
    run_method(method, data, seed=0, observers=(seen.append,))
    replies = [m for m in seen if m.kind == "ea.forward" and "ids" in m.payload]
    for a, b in zip(replies[::2], replies[1::2], strict=True):
        assert np.array_equal(a.payload["ids"], b.payload["ids"])
    assert set(method.entities_used_.values()) == {160}  # the 200 aligned rows less the 40 test rows


def test_it_learns_on_multiclass_data() -> None:
    data = _data(aligned=0.3, n=600)
    out = run_method(get_method("entity_augmentation")(train={**TRAIN, "max_epochs": 15}), data, seed=0)
    assert compute_metrics(data.task, data.test_y, out.scores)["accuracy"] > 0.6


def test_binary_task_uses_one_output() -> None:
    data = _data(n_classes=2)
    method = get_method("entity_augmentation")(train=TRAIN)
    out = run_method(method, data, seed=0)
    assert method.host_[-1].out_features == 1 and out.scores.shape == (40, 2)


def test_a_guest_that_drops_replies_is_replaced_by_its_queue(caplog: pytest.LogCaptureFixture) -> None:
    data = _data()
    faults = FaultPlan(drop={"g1": 0.3}, kinds=("ea.forward",), seed=1)
    method = get_method("entity_augmentation")(train={**TRAIN, "max_epochs": 4})
    with caplog.at_level(logging.WARNING):
        out = run_method(method, data, seed=0, faults=faults)
    assert faults.dropped["g1"] > 0
    assert method.reuses_["g1"] == faults.dropped["g1"] and method.reuses_["g0"] == 0
    assert out.ledger.summary().unanswered == faults.dropped["g1"]
    assert out.stats["reused_activations"] == faults.dropped["g1"]
    assert any("guest 'g1' did not answer" in r.message for r in caplog.records)


def test_skip_and_fail_policies() -> None:
    data = _data()
    faults = FaultPlan(drop={"g0": 0.3}, kinds=("ea.forward",), seed=2)
    method = get_method("entity_augmentation")(on_missing="skip", train=TRAIN)
    run_method(method, data, seed=0, faults=faults)
    assert method.skipped_steps_ == faults.dropped["g0"] > 0
    with pytest.raises(DeliveryTimeoutError, match="party 'g0' did not answer 'ea.forward'"):
        run_method(get_method("entity_augmentation")(on_missing="fail", train=TRAIN), data, seed=0,
                   faults=FaultPlan(drop={"g0": 0.5}, kinds=("ea.forward",), seed=3))


def test_regression_is_refused_with_the_reason() -> None:
    data = _data(task="regression")
    with pytest.raises(MethodError, match="regression is out of scope for this method"):
        run_method(get_method("entity_augmentation")(train=TRAIN), data, seed=0)


def test_a_host_without_labels_for_a_guest() -> None:
    host = PartyData(party="host", ids=np.arange(50), X=np.zeros((50, 0)), columns=(), y=np.arange(50) % 2)
    guest = PartyData(party="g0", ids=np.arange(1000, 1050), X=np.random.default_rng(0).normal(size=(50, 3)),
                      columns=("a", "b", "c"))
    from vflo.data.layout import Oracle
    from vflo.roles import PartyInfo

    data = FederatedData(
        parties=(PartyInfo("host", "active"), PartyInfo("g0", "passive")), train={"host": host, "g0": guest},
        serve={"host": host.subset([]), "g0": guest.subset([])}, test_ids=np.empty(0, dtype=np.int64),
        test_y=np.empty(0, dtype=np.int64), task="binary", n_classes=2, oracle=None,  # type: ignore[arg-type]
    )
    del Oracle
    with pytest.raises(MethodError, match="holds no label for any of guest 'g0'"):
        run_method(get_method("entity_augmentation")(train=TRAIN), data, seed=0)


def _host_with_features(n: int = 600, seed: int = 0) -> FederatedData:
    ds = make_dataset(n=n, n_features=6, seed=seed)
    spec = ScenarioSpec(parties=(PartySpec(name="host", role="active", n_columns=3), PartySpec(name="g", share=1.0)),
                        samples=SamplesSpec(aligned=0.2))
    layout = spec.build(ds, seed=seed)
    return layout.materialize(test_ids=np.sort(layout.aligned_ids())[:60])


def test_a_host_with_features_is_its_own_guest() -> None:
    """The usual layout (the active party holds columns): its own bottom walks every labelled entity it holds,
    shared or not, and nothing of it is sent; 'ignore' is the paper's label-only host."""
    data = _host_with_features()
    train = {**TRAIN, "max_epochs": 15}
    runs = {}
    for mode in ("use", "ignore"):
        seen: list[Message] = []
        method = get_method("entity_augmentation")(host_features=mode, train=train)
        out = run_method(method, data, seed=0, observers=(seen.append,))
        runs[mode] = (method, out, seen)
    used, ignored = runs["use"][0], runs["ignore"][0]
    assert used.host_in_ == 3 and used.host_width_ == 64 and ignored.host_bottom_ is None
    # The host's walk covers every one of its training entities: most of them no guest holds.
    assert runs["use"][1].stats["host_entities"] == data.train["host"].n_samples > 2 * data.train["g"].n_samples
    assert runs["ignore"][1].stats["host_entities"] == 0
    # No message goes to the host, and the guest's messages are those of the label-only run's kinds.
    for _, _, seen in runs.values():
        assert not [m for m in seen if m.receiver == "host" and m.kind.startswith(("ea.", "split.")) and
                    m.sender != "g"]
    assert {m.kind for m in runs["use"][2]} == {m.kind for m in runs["ignore"][2]}
    # Its own columns carry what the guest's few shared rows cannot: better scores.
    y = data.test_y
    accuracy = {mode: compute_metrics("binary", y, out.scores)["accuracy"] for mode, (_, out, _) in runs.items()}
    assert accuracy["use"] > accuracy["ignore"] + 0.05, accuracy


@pytest.mark.parametrize("counters", ["arrays", "json text"])
def test_a_host_with_features_resumes_and_saves_its_bottom(tmp_path: Path, counters: str) -> None:
    """Resumed from its checkpoint, the run ends as the uninterrupted one; the host's fault counters are kept as
    arrays, and a checkpoint that holds them as one JSON text (as vflo wrote them before) resumes alike."""
    import json

    from vflo.artifacts import CheckpointStore
    from vflo.nn.train import CheckpointPlan

    data = _host_with_features()
    settings = {"train": {**TRAIN, "max_epochs": 4, "checkpoint_every": 1}}
    reference = run_method(get_method("entity_augmentation")(**settings), data, seed=2)
    kill = {"n": 0}

    def killer(message: Message) -> None:
        if message.kind == "ea.forward" and message.sender == "host":
            kill["n"] += 1
            if kill["n"] == 40:  # in the third epoch (17 steps each: the host walks 540 entities)
                raise ProtocolError("killed")

    with pytest.raises(ProtocolError, match="killed"):
        run_method(get_method("entity_augmentation")(**settings), data, seed=2, observers=(killer,),
                   checkpoint=(tmp_path, CheckpointPlan(run="r")))
    store = CheckpointStore(tmp_path, party="host", role="active")
    assert store.epochs("r")
    for epoch in store.epochs("r"):
        state = store.load("r", epoch)
        assert "counters" not in state and state["counters.guests"].tolist() == ["g"]
        assert state["counters.reuses"].dtype == np.int64 and int(state["counters.skipped"]) == 0
        # Counts no fault-free run reaches, which the resumed run must carry on from.
        if counters == "json text":
            for key in ("counters.guests", "counters.reuses", "counters.skipped"):
                del state[key]
            state["counters"] = json.dumps({"reuses": {"g": 5}, "skipped": 2})
        else:
            state |= {"counters.reuses": np.asarray([5], dtype=np.int64), "counters.skipped": 2}
        store.save("r", epoch, state)
    resumed = run_method(get_method("entity_augmentation")(**settings), data, seed=2,
                         checkpoint=(tmp_path, CheckpointPlan(run="r", resume=True)))
    assert "resumed_after_epoch" in resumed.stats
    assert np.array_equal(resumed.scores, reference.scores)  # the host's own walk and bottom resumed bit for bit
    assert (resumed.stats["reused_activations"], resumed.stats["skipped_steps"]) == (5.0, 2.0)


def test_bad_networks() -> None:
    with pytest.raises(ConfigError, match="layer 'linear' sizes must be positive"):
        get_method("entity_augmentation")(guest=("linear 0",))
    with pytest.raises(ConfigError, match=r"unknown layer 'reul' \(did you mean 'relu'\?\)"):
        get_method("entity_augmentation")(host=("linear 4", "reul"))
    with pytest.raises(ConfigError, match="host_features"):
        get_method("entity_augmentation")(host_features="both")


def test_a_misaligned_split_asking_for_more_entities_than_exist() -> None:
    spec = ScenarioSpec(parties=(PartySpec(name="host", role="active", columns=()), PartySpec(name="g", share=1.0)),
                        samples=SamplesSpec(layout="misaligned", active=500, aligned=0.1))
    with pytest.raises(ScenarioError, match="asks for 500 rows but only 200 exist"):
        spec.build(make_dataset(n=200), seed=0)


def test_a_lost_backward_pass_fails_the_run_under_fail() -> None:
    data = _data()
    with pytest.raises(DeliveryTimeoutError, match="party 'g1' did not answer 'split.backward'"):
        run_method(get_method("entity_augmentation")(on_missing="fail", train=TRAIN), data, seed=0,
                   faults=FaultPlan(drop={"g1": 0.5}, kinds=("split.backward",), seed=3))


def test_blinded_ids_reveal_only_the_hosts_own_people_and_train_the_same_model() -> None:
    """ids = 'blinded': no guest sends the host an ID of someone the host does not label; the entities walked,
    and so the model, are those of IDs in the clear."""
    import dataclasses

    full = _data(aligned=0.2)
    host_rows = full.train["host"]
    data = dataclasses.replace(full, train={**full.train, "host": host_rows.subset(host_rows.ids[::2])})
    clear_seen: list[Message] = []
    blind_seen: list[Message] = []
    clear = run_method(get_method("entity_augmentation")(train=TRAIN), data, seed=0, observers=(clear_seen.append,))
    blind = run_method(get_method("entity_augmentation")(train=TRAIN, ids="blinded"), data, seed=0,
                       observers=(blind_seen.append,))
    assert np.array_equal(clear.scores, blind.scores)
    host = set(data.train["host"].ids.tolist())
    outside = {g: set(data.train[g].ids.tolist()) - host for g in ("g0", "g1")}
    assert all(outside.values())  # each guest holds people the host does not label...

    def sent_ids(seen: list[Message], guest: str) -> set[object]:
        out: set[object] = set()
        for m in seen:
            if m.sender == guest and m.receiver == "host":
                for v in m.payload.values():
                    if isinstance(v, np.ndarray) and v.dtype.kind in "iuU":
                        out |= set(v.ravel().tolist())
        return out

    for g in ("g0", "g1"):
        assert sent_ids(clear_seen, g) & outside[g]  # ...which the paper's protocol sends the host in the clear,
        assert not sent_ids(blind_seen, g) & outside[g]  # and the blinded one does not
    assert any(m.kind == "align.psi" for m in blind_seen)
    assert blind.fit_summary.align_bytes > 0
