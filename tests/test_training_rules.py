"""The training rules LASER-VFL's authors use, as options: class-balanced draws per epoch (opt-in: the draws name each
partner's people by class, measured here) and a cosine learning-rate schedule that every party follows on its own
settings, told only the epoch."""

from __future__ import annotations

import logging
from dataclasses import replace

import numpy as np
import pytest

from tests.conftest import make_dataset
from tests.test_laser_vfl import _blocks
from vflo.comm.message import Message
from vflo.errors import ConfigError, ProtocolError
from vflo.federation.session import Session
from vflo.federation.simulation import build_federation, run_method
from vflo.methods.registry import get_method
from vflo.nn.train import TrainConfig, balanced_draws, class_weights, fit_module

TRAIN = {"lr": 3e-3, "batch_size": 64, "max_epochs": 6, "validation_fraction": 0.0}


def test_cosine_is_torchs_cosine_annealing_stepped_once_an_epoch() -> None:
    import torch

    config = TrainConfig(lr=1e-3, max_epochs=12, lr_schedule="cosine", lr_final=0.2)
    optimizer = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=12, eta_min=2e-4)
    for epoch in range(12):
        assert config.lr_at(epoch) == pytest.approx(optimizer.param_groups[0]["lr"], rel=1e-12)
        optimizer.step()
        schedule.step()
    assert TrainConfig(lr=1e-3).lr_at(7) == 1e-3
    with pytest.raises(ConfigError, match="lr_final"):
        TrainConfig(lr_schedule="cosine", lr_final=1.5)
    with pytest.raises(ConfigError, match="lr_schedule"):
        TrainConfig(lr_schedule="step")  # type: ignore[arg-type]  # a wrong value, on purpose


def test_balanced_draws_give_every_class_the_same_share() -> None:
    labels = np.r_[np.zeros(7800, dtype=np.int64), np.ones(2200, dtype=np.int64)]
    draws = balanced_draws(class_weights(labels, owner="test"), np.random.default_rng(0))
    assert len(draws) == len(labels)
    assert abs(labels[draws].mean() - 0.5) < 0.02  # 22 % positive in the rows, half of the draws
    assert np.array_equal(draws, balanced_draws(class_weights(labels, owner="test"), np.random.default_rng(0)))
    with pytest.raises(ConfigError, match="sampling = 'shuffle'"):
        class_weights(None, owner="a regression")


def test_a_plain_network_follows_both_rules() -> None:
    import torch

    rng = np.random.default_rng(0)
    x = torch.as_tensor(rng.normal(size=(400, 3)), dtype=torch.float32)
    y = torch.as_tensor((rng.random(400) < 0.2).astype(np.int64))
    module = torch.nn.Linear(3, 2)
    config = TrainConfig(lr=1e-2, batch_size=50, max_epochs=5, validation_fraction=0.0, sampling="balanced",
                         lr_schedule="cosine", lr_final=0.1)
    seen: list[np.ndarray] = []

    def loss(m: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        seen.append(batch["y"].numpy())
        return torch.nn.functional.cross_entropy(m(batch["x"]), batch["y"])

    from vflo.nn.train import ModuleTrainer

    trainer = ModuleTrainer(module, loss, {"x": x, "y": y}, config=config, rng=np.random.default_rng(1))
    trainer.fit()
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(config.lr_at(4))
    assert 0.4 < np.concatenate(seen).mean() < 0.6  # about half positive, from 20 %
    from vflo.nn.train import run_epochs

    with pytest.raises(ConfigError, match="not supported by _StepTrainer; set train.lr_schedule = 'constant'"):
        run_epochs(n_train=10, config=replace(config, sampling="shuffle"), rng=np.random.default_rng(0),
                   train_step=lambda batch: 0.0)  # plain functions: no optimiser to schedule
    with pytest.raises(ConfigError, match="no class labels"):
        fit_module(torch.nn.Linear(3, 1), lambda m, b: m(b["x"]).pow(2).mean(), {"x": x},
                   config=replace(config, lr_schedule="constant"), rng=np.random.default_rng(1))


@pytest.mark.parametrize("name", ["laser_vfl", "splitnn"])
def test_every_party_anneals_its_own_rate_told_only_the_epoch(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from vflo.methods.split_learning import Bottom

    rates: list[tuple[int, float]] = []  # (epoch, the rate a partner's optimiser then steps with)
    at_epoch = Bottom.at_epoch

    def spy(self: Bottom, epoch: int) -> None:
        at_epoch(self, epoch)
        assert self.optimizer is not None
        rates.append((epoch, float(self.optimizer.param_groups[0]["lr"])))

    monkeypatch.setattr(Bottom, "at_epoch", spy)
    together, _ = _blocks()
    proposal = get_method(name)(train={**TRAIN, "lr_schedule": "cosine", "lr_final": 0.2})
    # The partners decide their own rate and schedule: 1e-2 annealed to a tenth, not the proposal's.
    own = get_method(name)(train={**TRAIN, "lr": 1e-2, "lr_schedule": "cosine", "lr_final": 0.1})
    seen: list[Message] = []
    fed, _nodes = build_federation(together, proposal, seed=0, party_config=own, observers=(seen.append,))
    Session(fed).start(proposal)
    proposal.fit(fed)
    Session(fed).teardown()
    assert {e for e, _ in rates} == set(range(TRAIN["max_epochs"]))
    for epoch, lr in rates:
        assert lr == pytest.approx(own.config.train.lr_at(epoch))
    assert rates[-1][1] < rates[0][1] / 5
    epochs = sorted({int(m.payload["epoch"]) for m in seen
                     if m.kind == "splitnn.forward" and m.sender == "a" and m.payload["training"]})
    assert epochs == list(range(TRAIN["max_epochs"]))


def test_a_partner_refuses_an_epoch_outside_its_training() -> None:
    import torch

    from vflo.methods.split_learning import Bottom

    bottom = Bottom(torch.nn.Linear(2, 2), TrainConfig(max_epochs=3), "float32")
    bottom.at_epoch(2)
    with pytest.raises(ProtocolError, match="epochs 0 to 2"):
        bottom.at_epoch(3)


def test_balanced_draws_are_opt_in_logged_and_tell_a_partner_the_class(caplog: pytest.LogCaptureFixture) -> None:
    three = make_dataset(n=1400, n_features=8, n_classes=3, seed=0)
    together, _ = _blocks(dataset=replace(three, y=(three.y == 0).astype(np.int64), n_classes=2, task="binary"))
    seen: list[Message] = []
    with caplog.at_level(logging.WARNING, logger="vflo.methods.split_learning"):
        run_method(get_method("laser_vfl")(train={**TRAIN, "sampling": "balanced"}), together, seed=0,
                   observers=(seen.append,))
    assert "tells a partner their class" in caplog.text
    # What p1 could compute from the batches it was asked for: how often each of its people was drawn (rows are
    # positions in the training people splitnn.init named to it).
    named = next(m for m in seen if m.kind == "splitnn.init" and m.sender == "a" and m.receiver == "p1")
    people = np.asarray(named.payload["train_ids"])
    counts = np.zeros(len(people))
    for m in seen:
        if m.kind == "splitnn.forward" and m.sender == "a" and m.receiver == "p1" and m.payload["training"]:
            np.add.at(counts, np.asarray(m.payload["rows"]), 1)
    labels = together.train["a"].subset(people).require_labels()
    from sklearn.metrics import roc_auc_score

    # Fewer positives than negatives: a positive is drawn more often, and the counts rank people by class.
    assert labels.mean() < 0.5 and roc_auc_score(labels, counts) > 0.75
    seen.clear()
    run_method(get_method("laser_vfl")(train=TRAIN), together, seed=0, observers=(seen.append,))
    counts[:] = 0
    for m in seen:
        if m.kind == "splitnn.forward" and m.sender == "a" and m.receiver == "p1" and m.payload["training"]:
            np.add.at(counts, np.asarray(m.payload["rows"]), 1)
    assert np.all(counts == TRAIN["max_epochs"])  # the default: everyone once an epoch, nothing to read
    with pytest.raises(ConfigError, match="gradient_noise"):
        get_method("splitnn")(train={"sampling": "balanced"}, gradient_noise={"clip": 1.0, "noise_multiplier": 1.0})
    with pytest.raises(ConfigError, match="own clock"):
        get_method("entity_augmentation")(train={"lr_schedule": "cosine"})
