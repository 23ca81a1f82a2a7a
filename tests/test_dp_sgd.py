"""DP-SGD by Opacus and one ε per person by dp_accounting: checked against the two libraries used alone.

- vflo's DP path (``vflo.nn.private.fit_private``) takes the steps a plain Opacus loop takes on the same batches
  with the same noise generator: the same clipped and noised updates;
- the accountant (``vflo.dp.composed_epsilon``) is dp_accounting's PLD read through its own event API, agrees with
  Opacus's PRV accountant (add/remove neighbours, Opacus's) and lies under the RDP bound, on a grid of σ, sampling
  rates and steps;
- APC-VFL with a passive party's DP-SGD encoder and a noised upload: the party plans the run's ε at setup, refuses
  a plan over its budget with the figures before anything trains, and reports its account, end to end.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import pytest
import torch

from tests.test_methods import data_for
from vflo.dp import DPSGD, SCOPE_END_TO_END, GaussianNoise, PrivacyAccount, PrivacyBudget, composed_epsilon
from vflo.errors import ConfigError, PrivacyBudgetError, RemoteError
from vflo.federation.session import Session
from vflo.federation.simulation import build_federation, run_method
from vflo.methods.registry import get_method
from vflo.nn.models import autoencoder
from vflo.nn.private import fit_private, poisson_batches
from vflo.nn.train import TrainConfig
from vflo.seeding import torch_generator


def _loss(module: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    _, x_hat = module(batch["x"])
    return ((batch["x"] - x_hat) ** 2).sum(dim=1).mean()


def test_vflos_dp_sgd_takes_the_steps_opacus_takes_alone() -> None:
    from opacus import GradSampleModule
    from opacus.optimizers import DPOptimizer

    X = np.random.default_rng(0).normal(size=(120, 5)).astype(np.float32)
    dp, train = DPSGD(noise_multiplier=1.3, max_grad_norm=0.7, sample_rate=0.1), TrainConfig(max_epochs=2, lr=1e-2)
    ours = autoencoder(5, (8, 4), generator=torch_generator(0, "init"))
    alone = autoencoder(5, (8, 4), generator=torch_generator(0, "init"))
    fit_private(ours, _loss, {"x": X}, train=train, dp=dp, rng=np.random.default_rng(7),
                generator=torch_generator(0, "noise"))

    # Opacus alone: its per-sample gradients and its optimizer over the same Poisson batches and noise generator.
    module = GradSampleModule(alone)
    optimizer = DPOptimizer(torch.optim.Adam(module.parameters(), lr=1e-2), noise_multiplier=1.3, max_grad_norm=0.7,
                            expected_batch_size=12, generator=torch_generator(0, "noise"))
    batches = poisson_batches(120, 0.1, dp.steps(2), np.random.default_rng(7))
    assert any(len(b) == 0 for b in poisson_batches(120, 0.01, 200, np.random.default_rng(0)))  # empty ones happen
    for positions in batches:
        optimizer.zero_grad()
        if len(positions):
            _loss(module, {"x": torch.as_tensor(X[positions])}).backward()
        else:
            for p in module.parameters():
                p.grad_sample = torch.zeros((0, *p.shape))
        optimizer.step()
    for a, b in zip(ours.parameters(), alone.parameters(), strict=True):
        assert torch.equal(a, b)
    # The noise matters: another noise generator, another model.
    other = autoencoder(5, (8, 4), generator=torch_generator(0, "init"))
    fit_private(other, _loss, {"x": X}, train=train, dp=dp, rng=np.random.default_rng(7),
                generator=torch_generator(1, "noise"))
    assert not all(torch.equal(a, b) for a, b in zip(ours.parameters(), other.parameters(), strict=True))


GRID = [(sigma, rate, steps) for sigma in (0.8, 1.5) for rate in (0.01, 0.1) for steps in (50, 1000)]


@pytest.mark.parametrize(("sigma", "rate", "steps"), GRID)
def test_the_account_of_a_dp_sgd_run_is_dp_accountings_and_agrees_with_opacus(sigma: float, rate: float,
                                                                               steps: int) -> None:
    import dp_accounting
    from dp_accounting.pld import PLDAccountant
    from dp_accounting.rdp import RdpAccountant
    from opacus.accountants import PRVAccountant

    run = DPSGD(noise_multiplier=sigma, sample_rate=rate).event(1)
    run = dataclasses.replace(run, steps=steps)
    ours = composed_epsilon(0.0, 0.0, [run], 1e-5)
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(rate, dp_accounting.GaussianDpEvent(sigma)), steps)
    from vflo.dp import DISCRETISATION

    pld = PLDAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE,
                        value_discretization_interval=DISCRETISATION)
    pld.compose(event)
    assert ours == pytest.approx(pld.get_epsilon(1e-5), rel=1e-9)
    # vflo's grid against dp_accounting's default, ten times finer: an upper bound still, and as tight.
    finer = PLDAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    finer.compose(event)
    assert finer.get_epsilon(1e-5) * (1 - 1e-9) <= ours <= finer.get_epsilon(1e-5) * (1 + 1e-3)
    # Opacus counts with add/remove neighbours: the same run read that way agrees with its PRV accountant, and lies
    # under the RDP bound (dp_accounting's RDP has no replace-one subsampling to compare with).
    added = composed_epsilon(0.0, 0.0, [run], 1e-5, relation="add_remove")
    prv = PRVAccountant()
    prv.history = [(sigma, rate, steps)]
    assert added == pytest.approx(prv.get_epsilon(1e-5), rel=0.03, abs=0.02)  # PRV is within ±0.01 of its own
    rdp = RdpAccountant()
    rdp.compose(event)
    assert added <= rdp.get_epsilon(1e-5) * (1 + 1e-6) and added <= ours


def test_releases_and_training_compose_into_one_epsilon() -> None:
    noise, run = GaussianNoise(noise_multiplier=4.0), DPSGD(noise_multiplier=1.0, sample_rate=0.02).event(5)
    account = PrivacyAccount("lab", PrivacyBudget(epsilon=100.0))
    ids = np.array(["a", "b", "c"])
    account.charge(ids, training=[run], what="training")
    account.charge(ids[:2], mu=noise.mu, what="upload")
    both = composed_epsilon(noise.mu**2, 0.0, [run], 1e-5)
    assert account.epsilon() == pytest.approx(both)
    assert both > max(composed_epsilon(0.0, 0.0, [run], 1e-5), noise.epsilon())  # composition costs
    half = GaussianNoise(noise_multiplier=4.0, delta=5e-6).epsilon()
    assert both < composed_epsilon(0.0, 0.0, [run], 5e-6) + half  # and less than their sum at δ/2 each


def test_a_journal_keeps_training_runs_across_restarts(tmp_path: object) -> None:
    from pathlib import Path

    journal = Path(str(tmp_path)) / "lab_privacy.jsonl"
    run = DPSGD(noise_multiplier=1.0, sample_rate=0.05).event(3)
    PrivacyAccount("lab", journal=journal).charge(np.array(["a", "b"]), training=[run])
    again = PrivacyAccount("lab", journal=journal)
    assert again.epsilon() == pytest.approx(composed_epsilon(0.0, 0.0, [run], 1e-5)) and again.people == 2


def test_dp_sgd_needs_noise_on_the_upload_and_sane_settings() -> None:
    with pytest.raises(ConfigError, match="Give noise too"):
        get_method("apc_vfl")(dp_sgd={"noise_multiplier": 1.0})
    with pytest.raises(ConfigError, match="sample_rate"):
        DPSGD(sample_rate=0.0)
    with pytest.raises(ConfigError, match="raise it to at least"):
        fit_private(autoencoder(3, (4,), generator=torch_generator(0, "x")), _loss, {"x": np.zeros((10, 3))},
                    train=TrainConfig(max_epochs=1), dp=DPSGD(sample_rate=0.01), rng=np.random.default_rng(0),
                    generator=torch_generator(0, "n"))


QUICK = {"train": {"max_epochs": 2, "patience": 0, "batch_size": 64}}
UPLOAD = {"clip": 1.0, "noise_multiplier": 3.0}
PRIVATE = {"noise_multiplier": 1.2, "max_grad_norm": 1.0, "sample_rate": 0.1}


def test_apc_vfl_with_a_private_encoder_reports_the_partys_account_end_to_end() -> None:
    data = data_for("apc_vfl")
    proposal = get_method("apc_vfl")(**QUICK, noise=UPLOAD)
    own = get_method("apc_vfl")(**QUICK, noise=UPLOAD, dp_sgd=PRIVATE)  # the passive party's own config
    out = run_method(proposal, data, seed=0, party_config=own)
    expected = composed_epsilon(GaussianNoise(**UPLOAD).mu ** 2, 0.0, [DPSGD(**PRIVATE).event(2)], 1e-5)
    passive = next(p.name for p in data.parties if p.role == "passive")
    assert out.stats[f"epsilon_account_{passive}"] == pytest.approx(expected)
    assert out.account_scopes[passive] == SCOPE_END_TO_END
    assert out.party_settings[passive]["dp_sgd"] == PRIVATE
    # Without DP-SGD the same run's ε is the upload's alone, and says it is given a fixed encoder.
    plain = run_method(proposal, data, seed=0)
    assert plain.stats[f"epsilon_account_{passive}"] == pytest.approx(GaussianNoise(**UPLOAD).epsilon())
    assert "trained without privacy" in plain.account_scopes[passive]


def test_a_plan_over_the_partys_budget_is_refused_at_setup_with_the_figures() -> None:
    data = data_for("apc_vfl")
    proposal = get_method("apc_vfl")(**QUICK, noise=UPLOAD)
    own = get_method("apc_vfl")(**QUICK, noise=UPLOAD, dp_sgd=PRIVATE)
    fed, nodes = build_federation(data, proposal, seed=0, party_config=own)
    passive = next(p.name for p in data.parties if p.role == "passive")
    planned = composed_epsilon(GaussianNoise(**UPLOAD).mu ** 2, 0.0, [DPSGD(**PRIVATE).event(2)], 1e-5)
    nodes[passive].privacy = PrivacyAccount(passive, PrivacyBudget(epsilon=math.floor(planned)))
    with pytest.raises(RemoteError, match=rf"refuses apc_vfl at setup: its plan \(DP-SGD of its encoder, 20 steps "
                                          rf".*would bring its people to ε = {planned:.3g}.*past its budget ε = "
                                          rf"{math.floor(planned)}"):
        Session(fed).start(proposal)
    assert nodes[passive].privacy.releases == 0 and nodes[passive].method is None  # nothing ran, nothing is set up
    # Within the budget the same plan runs, and the account ends where the plan said.
    fed, nodes = build_federation(data, proposal, seed=0, party_config=own)
    nodes[passive].privacy = PrivacyAccount(passive, PrivacyBudget(epsilon=math.ceil(planned)))
    session = Session(fed)
    session.start(proposal)
    session.train(proposal.fit)
    assert nodes[passive].privacy.epsilon() == pytest.approx(planned)


def _protected_federation(proposal_name: str, epsilon: float) -> tuple[Any, dict[str, Any], str]:
    data = data_for("apc_vfl")
    proposal = get_method(proposal_name)(**QUICK)
    fed, nodes = build_federation(data, proposal, seed=0)
    passive = next(p.name for p in data.parties if p.role == "passive")
    nodes[passive].privacy = PrivacyAccount(passive, PrivacyBudget(epsilon=epsilon))  # protect: the default
    return fed, nodes, passive


def test_a_party_that_gives_only_a_target_epsilon_is_calibrated_to_it() -> None:
    fed, nodes, passive = _protected_federation("apc_vfl", 4.0)
    method = get_method("apc_vfl")(**QUICK)
    session = Session(fed)
    session.start(method)
    session.train(method.fit)
    spent = nodes[passive].privacy.epsilon()
    assert 4.0 * 0.98 < spent <= 4.0  # calibrated to the budget, to the search's precision
    ran = session.party_settings[passive]
    assert ran["noise"]["noise_multiplier"] == pytest.approx(2 * ran["dp_sgd"]["noise_multiplier"])
    assert nodes[passive].method is not None and nodes[passive].method.epsilon_scope() == SCOPE_END_TO_END
    session.teardown()
    assert session.accounts[passive] == (pytest.approx(spent), SCOPE_END_TO_END)


def test_a_protecting_party_refuses_a_method_it_cannot_cover_and_a_run_past_what_is_left() -> None:
    fed, nodes, passive = _protected_federation("vfl_asp", 4.0)
    with pytest.raises(RemoteError, match=r"vfl_asp's passive side sends what no noise it can calibrate "
                                          r"covers.*protect = false"):
        Session(fed).start(get_method("vfl_asp")(**QUICK))
    fed, nodes, passive = _protected_federation("apc_vfl", 4.0)
    # Its people spent ε 4.38 before it lowered its budget to 4: no run fits what is left.
    account = PrivacyAccount(passive)
    account.charge(data_for("apc_vfl").train[passive].ids, mu=GaussianNoise(noise_multiplier=2.0).mu)
    account.budget = PrivacyBudget(epsilon=4.0)
    nodes[passive].privacy = account
    with pytest.raises(RemoteError, match=r"even with the most noise it calibrates to, the run would pass its budget "
                                          r"ε = 4 at δ = 1e-05 \(4\.38 spent before it"):
        Session(fed).start(get_method("apc_vfl")(**QUICK))


def test_the_default_budget_does_not_protect_and_leaves_the_run_as_proposed() -> None:
    from vflo.dp import DEFAULT_BUDGET

    assert not DEFAULT_BUDGET.protect and PrivacyBudget(epsilon=4.0).protect
    fed, nodes, passive = _protected_federation("apc_vfl", 4.0)
    nodes[passive].privacy = PrivacyAccount(passive, DEFAULT_BUDGET)
    session = Session(fed)
    session.start(get_method("apc_vfl")(**QUICK))
    assert passive not in session.party_settings and nodes[passive].privacy.releases == 0


# -- SplitNN: a passive party's bottom by DP-SGD, drawing its rows from each named batch ---------------------------

SPLIT = {"train": {"max_epochs": 2, "patience": 0, "batch_size": 32}}
ACTS = {"clip": 1.0, "noise_multiplier": 4.0}


def test_a_dp_sgd_bottom_without_clipping_or_noise_steps_as_the_plain_one() -> None:
    """Opacus's per-person gradients, summed and divided by the batch the step expects, are the batch's gradient:
    with every row drawn, no clipping and no noise, a DP-SGD bottom takes the steps of a plain one."""
    from vflo.methods.split_learning import Bottom

    x = torch.as_tensor(np.random.default_rng(0).normal(size=(16, 5)).astype(np.float32))
    grad = np.random.default_rng(1).normal(size=(16, 3)).astype(np.float32) / 16
    nets = [torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.ReLU(), torch.nn.Linear(4, 3)) for _ in range(2)]
    nets[1].load_state_dict(nets[0].state_dict())
    train = TrainConfig(lr=1e-2)
    plain = Bottom(nets[0], train, "float32")
    private = Bottom(nets[1], train, "float32", dp=DPSGD(noise_multiplier=1e-12, max_grad_norm=1e4, sample_rate=1.0),
                     dp_rng=np.random.default_rng(2), dp_generator=torch_generator(0, "n"))
    for bottom in (plain, private):
        for _ in range(3):
            bottom.forward(x)
            bottom.backward(grad)
    for a, b in zip(nets[0].parameters(), nets[1].parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-5)


def test_splitnn_with_a_private_bottom_plans_runs_and_reports_the_partys_account() -> None:
    data = data_for("splitnn")
    proposal = get_method("splitnn")(**SPLIT, activation_noise=ACTS)
    own = get_method("splitnn")(**SPLIT, activation_noise=ACTS, dp_sgd=PRIVATE)
    passive = next(p.name for p in data.parties if p.role == "passive")
    fed, nodes = build_federation(data, proposal, seed=0, party_config=own)
    mu2 = GaussianNoise(**ACTS).mu ** 2
    run = DPSGD(**PRIVATE).within_batches(2)
    planned = composed_epsilon(3 * mu2, 0.0, [run], 1e-5)  # a release an epoch (training or validation), and 1
    nodes[passive].privacy = PrivacyAccount(passive, PrivacyBudget(epsilon=math.floor(planned), protect=False))
    with pytest.raises(RemoteError, match=rf"refuses splitnn at setup: its plan \(DP-SGD of its bottom, 2 batches "
                                          rf"per person.*up to 3 releases.*ε = {planned:.3g}"):
        Session(fed).start(proposal)
    out = run_method(proposal, data, seed=0, party_config=own)
    assert out.stats[f"epsilon_account_{passive}"] == pytest.approx(composed_epsilon(2 * mu2, 0.0, [run], 1e-5))
    assert out.account_scopes[passive] == "features: " + SCOPE_END_TO_END
    with pytest.raises(ConfigError, match="Give activation_noise too"):
        get_method("splitnn")(dp_sgd=PRIVATE)


def test_laser_vfl_passive_side_is_splitnns_and_vfl_asps_is_not() -> None:
    assert get_method("laser_vfl")().passive_side_is_splitnns() and get_method("splitnn")().passive_side_is_splitnns()
    assert not get_method("vfl_asp")().passive_side_is_splitnns()
    assert get_method("laser_vfl")().protected("passive", 1.0, rows=100) is not None
    assert get_method("vfl_asp")().protected("passive", 1.0, rows=100) is None


def test_a_passive_party_refuses_a_person_named_for_training_and_validation() -> None:
    data = data_for("splitnn")
    method = get_method("splitnn")(**SPLIT)
    fed, _ = build_federation(data, method, seed=0)
    Session(fed).start(method)
    passive = next(p.name for p in data.parties if p.role == "passive")
    ids = data.train[passive].ids[:4]
    with pytest.raises(RemoteError, match=r"names 1 people .* for both training and validation; refused"):
        fed.control("splitnn.init", {passive: {"train_ids": ids[:3], "val_ids": ids[2:]}})


def test_a_protecting_party_calibrates_its_splitnn_bottom() -> None:
    data = data_for("splitnn")
    proposal = get_method("splitnn")(**SPLIT)
    fed, nodes = build_federation(data, proposal, seed=0)
    passive = next(p.name for p in data.parties if p.role == "passive")
    nodes[passive].privacy = PrivacyAccount(passive, PrivacyBudget(epsilon=8.0))
    session = Session(fed)
    session.start(proposal)
    session.train(proposal.fit)
    ran = session.party_settings[passive]
    assert ran["dp_sgd"]["sample_rate"] == 0.5 and ran["activation_noise"]["noise_multiplier"] > 1
    assert 0 < nodes[passive].privacy.epsilon() <= 8.0


def test_a_dp_sgd_bottom_keeps_no_checkpoint_and_a_missing_account_is_named(tmp_path: Any) -> None:
    from pathlib import Path

    from vflo.errors import DataError, RefusedError
    from vflo.methods.split_learning import Bottom

    net = torch.nn.Sequential(torch.nn.Linear(3, 2))
    bottom = Bottom(net, TrainConfig(), "float32", dp=DPSGD(sample_rate=0.5), dp_rng=np.random.default_rng(0),
                    dp_generator=torch_generator(0, "n"))
    with pytest.raises(RefusedError, match="keeps no checkpoint of it.*train without --checkpoints"):
        bottom.state()
    with pytest.raises(DataError, match="does not exist: give party 'lab'.s privacy account"):
        PrivacyAccount.read(Path(str(tmp_path)) / "lab_privacy.jsonl", "lab")


def test_randomised_response_keeps_a_label_with_its_probability_and_flips_to_the_others_uniformly() -> None:
    from vflo.dp import RandomisedResponse

    rr = RandomisedResponse(epsilon=1.0)
    y = np.repeat(np.arange(3), 20000)
    out = rr.apply(y, 3, np.random.default_rng(0))
    assert rr.keep(3) == pytest.approx(math.e / (math.e + 2))
    assert np.mean(out == y) == pytest.approx(rr.keep(3), abs=0.01)
    # Any output's probability moves by at most e^ε when the label changes: the likelihood ratio is e^ε exactly.
    stay, move = np.mean(out[y == 0] == 0), np.mean(out[y == 1] == 0)
    assert stay / move == pytest.approx(math.e, rel=0.05)
    assert rr.keep(2) == pytest.approx(1 / (1 + math.exp(-1.0)))
    with pytest.raises(ConfigError, match="label_epsilon must be a positive number"):
        get_method("splitnn")(label_epsilon=0.0)


def test_splitnn_trains_on_randomised_labels_counted_in_the_active_partys_own_account() -> None:
    data = data_for("splitnn")
    active = data.active
    method = get_method("splitnn")(**SPLIT, label_epsilon=2.0)
    assert method.planned_privacy("active") is not None
    out = run_method(method, data, seed=0)
    assert out.stats[f"epsilon_account_{active}"] == pytest.approx(2.0, rel=1e-3)
    assert out.stats["epsilon_labels"] == 2.0
    assert out.account_scopes[active].startswith("labels: ε covers each person's label, randomised once")
    assert "features:" not in out.account_scopes[active]
    # The active party's own budget is checked against its plan before anything runs, as a partner's is.
    fed, nodes = build_federation(data, method, seed=0)
    nodes[active].privacy = PrivacyAccount(active, PrivacyBudget(epsilon=1.0, protect=False))
    with pytest.raises(PrivacyBudgetError, match=r"randomised response on its labels at ε = 2.*past its budget ε = 1"):
        Session(fed).start(method)
    # Randomised from the active party's own secret: another secret, other labels; the same, the same scores.
    again = run_method(method, data, seed=0)
    assert np.array_equal(again.scores, out.scores)
    other = run_method(method, data, seed=0, party_seeds={active: 99})
    assert not np.array_equal(other.scores, out.scores)


EA = {"train": {"max_epochs": 2, "patience": 0, "batch_size": 32, "validation_fraction": 0.0}}


def test_an_entity_augmentation_guest_is_calibrated_and_its_host_randomises_its_labels() -> None:
    data = data_for("entity_augmentation")
    guests = [p.name for p in data.parties if p.role == "passive"]
    # IDs in the clear are what no noise covers: a protecting guest refuses them, naming the setting that allows it.
    clear = get_method("entity_augmentation")(**EA)
    fed, nodes = build_federation(data, clear, seed=0)
    nodes[guests[0]].privacy = PrivacyAccount(guests[0], PrivacyBudget(epsilon=4.0))
    with pytest.raises(RemoteError, match=r"sends every one of its IDs to the host in the clear.*ids = 'blinded'"):
        Session(fed).start(clear)
    method = get_method("entity_augmentation")(**EA, ids="blinded", label_epsilon=4.0)
    budgets = {g: PrivacyBudget(epsilon=4.0) for g in guests}
    out = run_method(method, data, seed=0, budgets=budgets)
    for g in guests:
        ran = out.party_settings[g]
        assert ran["dp_sgd"]["sample_rate"] == 0.5 and ran["activation_noise"]["noise_multiplier"] > 1
        assert 0 < out.stats[f"epsilon_account_{g}"] <= 4.0
        assert out.account_scopes[g] == "features: " + SCOPE_END_TO_END
    assert out.stats[f"epsilon_account_{data.active}"] == pytest.approx(4.0, rel=1e-3)
    assert out.account_scopes[data.active].startswith("labels: ε covers each person's label")


def test_a_noised_guest_plans_its_passes_and_refuses_a_walk_past_them() -> None:
    acts = GaussianNoise(**ACTS)
    method = get_method("entity_augmentation")(**EA, ids="blinded", activation_noise=ACTS, dp_sgd=PRIVATE, passes=3)
    plan = method.planned_privacy("passive")
    assert plan is not None and plan.releases == 2 * 3 + 1 and plan.mu == acts.mu
    assert plan.training == (DPSGD(**PRIVATE).within_batches(2 * 3),)
    # One pass an epoch allowed: the host's epoch over a larger guest walks a smaller one's people twice, refused.
    data = data_for("entity_augmentation")
    once = get_method("entity_augmentation")(**EA, ids="blinded", activation_noise=ACTS, passes=1)
    with pytest.raises(RemoteError, match=r"refuses another noised training release .* released 2 times already, "
                                          r"1 per epoch of the 2"):
        run_method(once, data, seed=0)
    with pytest.raises(ConfigError, match="give activation_noise too"):
        get_method("entity_augmentation")(dp_sgd=PRIVATE)


def test_vfl_asps_hops_are_calibrated_each_to_its_own_side() -> None:
    data = data_for("vfl_asp")
    fast = {"max_epochs": 2, "patience": 0, "batch_size": 32, "validation_fraction": 0.0}
    method = get_method("vfl_asp")(train=fast, embedding_train=fast, label_epsilon=4.0)
    out = run_method(method, data, seed=0, budgets={p: PrivacyBudget(epsilon=4.0) for p in ("p1", "p2")})
    first, second = out.party_settings["p1"], out.party_settings["p2"]
    assert {"dp_sgd", "activation_noise", "embedding_dp_sgd"} <= set(first) and "noise" not in first
    assert set(second) == {"noise"}
    for party in ("p1", "p2"):
        assert 0 < out.stats[f"epsilon_account_{party}"] <= 4.0
    assert out.account_scopes["p1"].startswith("features: " + SCOPE_END_TO_END)
    assert out.stats[f"epsilon_account_{data.active}"] == pytest.approx(4.0, rel=1e-3)
    # The first hop's plan counts its encoder's and its bottom's DP-SGD runs, and a release an epoch and one more.
    own = get_method("vfl_asp")(train=fast, embedding_train=fast, activation_noise=ACTS, dp_sgd=PRIVATE,
                                embedding_dp_sgd=PRIVATE)
    plan = own.planned_privacy("passive", party="p1")
    assert plan is not None and plan.releases == 3 and len(plan.training) == 2
    assert own.planned_privacy("passive", party="p2") is None  # no noise of its own: nothing noised to plan
    with pytest.raises(ConfigError, match="give dp_sgd and activation_noise too"):
        get_method("vfl_asp")(embedding_dp_sgd=PRIVATE)
