"""What a deployment gets without asking: private set intersection, a privacy budget kept across restarts, noise a
coordinator cannot average away within a run, and files only their owner can read."""

from __future__ import annotations

import logging
import stat
import tomllib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import PARTY_SEEDS, vertical_split
from vflo.align.engines import DEPLOYED_ALIGNMENT, AlignmentConfig
from vflo.comm.tls import init_certs
from vflo.deploy import (
    DataConfig,
    DeployConfig,
    Deployment,
    PartyConfig,
    PeerConfig,
    PeerEntry,
    TLSConfig,
    export_federation,
    start_party,
)
from vflo.deploy.export import ca_folder
from vflo.deploy.party import RunningParty
from vflo.dp import DEFAULT_BUDGET, GaussianNoise, PrivacyAccount, PrivacyBudget, gdp_epsilon
from vflo.errors import ConfigError, PrivacyBudgetError, RefusedError, RemoteError
from vflo.experiments.config import load_deployment_experiment
from vflo.methods.registry import get_method
from vflo.methods.split_learning import Bottom
from vflo.nn.train import TrainConfig
from vflo.party.policy import Policy

QUICK = {"train": {"max_epochs": 2, "patience": 0}}


# -- PSI by default when deployed -------------------------------------------------------------------------------


def test_a_partys_policy_refuses_plain_alignment_unless_its_config_names_it() -> None:
    assert not Policy().accepts_plain
    assert Policy(alignment="plain").accepts_plain and Policy(alignment="any").accepts_plain
    with pytest.raises(ConfigError, match="give 'psi'"):
        Policy(alignment="clear")  # type: ignore[arg-type]


def test_a_deployed_experiment_without_alignment_aligns_by_psi_with_the_auto_engine(tmp_path: Path) -> None:
    bare = tmp_path / "bare.toml"
    bare.write_text('[[methods]]\nname = "local"\n')
    alignment = load_deployment_experiment(bare).alignment
    assert (alignment.method, alignment.engine) == ("psi", "auto") == (DEPLOYED_ALIGNMENT.method,
                                                                       DEPLOYED_ALIGNMENT.engine)
    named = tmp_path / "plain.toml"
    named.write_text('[[methods]]\nname = "local"\n[alignment]\nmethod = "plain"\n')
    assert load_deployment_experiment(named).alignment.method == "plain"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("certs")
    init_certs(directory, ["act", "pas"])
    return directory


def _party(certs: Path, *, policy: Policy | None = None, privacy: PrivacyBudget | None = None,
           account: Path | None = None) -> RunningParty:
    data = vertical_split(30)
    return start_party(PartyConfig(name="pas", listen="127.0.0.1:0", data=DataConfig(file="unused", id_column="id"),
                                   tls=TLSConfig(dir=str(certs)), seed=PARTY_SEEDS["pas"],
                                   peers={"act": PeerEntry(address="x", role="active")},
                                   policy=policy or Policy(), privacy=privacy,
                                   privacy_account=str(account) if account is not None else ""),
                       data=data.train["pas"], serve=data.serve["pas"])


def _deployment(certs: Path, pas: RunningParty) -> Deployment:
    data = vertical_split(30)
    deploy = DeployConfig(active=PartyConfig(name="act", role="active", listen="127.0.0.1:0",
                                             data=DataConfig(file="unused", id_column="id"),
                                             tls=TLSConfig(dir=str(certs)), seed=PARTY_SEEDS["act"]),
                          parties=(PeerConfig(name="pas", role="passive", address=pas.server.address),))
    from vflo.data.partydata import PartyData

    test = PartyData(party="act", ids=data.test_ids, X=data.serve["act"].subset(data.test_ids).X,
                     columns=data.serve["act"].columns, y=data.test_y)
    dep = Deployment(deploy, train=data.train["act"], test=test)
    pas.transport.peers["act"] = dep.party.server.address
    return dep


@pytest.fixture()
def lab(certs: Path) -> Iterator[RunningParty]:
    pas = _party(certs)
    yield pas
    pas.stop()


def test_a_deployed_run_with_the_defaults_sends_no_id_in_the_clear(certs: Path, lab: RunningParty) -> None:
    dep = _deployment(certs, lab)
    try:
        out = dep.run(get_method("splitnn")(**QUICK), seed=3)
    finally:
        dep.close()
    kinds = {e.kind for e in out.ledger.entries}
    assert "align.plain" not in kinds and any(k.startswith("align.psi") for k in kinds)
    assert "no ID crossed in the clear" in out.alignment_revealed and "pas" in out.alignment_revealed


def test_plain_alignment_runs_only_where_the_partner_accepts_it_and_is_logged(
        certs: Path, lab: RunningParty, caplog: pytest.LogCaptureFixture) -> None:
    dep = _deployment(certs, lab)
    try:
        with pytest.raises(RemoteError, match="aligns only by private set intersection"):
            dep.run(get_method("splitnn")(**QUICK), seed=3, alignment=AlignmentConfig(method="plain"))
    finally:
        dep.close()
    willing = _party(certs, policy=Policy(alignment="plain"))
    dep = _deployment(certs, willing)
    try:
        with caplog.at_level(logging.WARNING, logger="vflo.federation.coordinator"):
            out = dep.run(get_method("splitnn")(**QUICK), seed=3, alignment=AlignmentConfig(method="plain"))
    finally:
        dep.close()
        willing.stop()
    assert any("go in the clear to pas" in r.getMessage() for r in caplog.records)
    assert "sent in the clear to pas" in out.alignment_revealed


# -- a privacy budget that holds by default -------------------------------------------------------------------


def test_a_deployed_party_without_privacy_gets_the_default_budget(certs: Path, lab: RunningParty) -> None:
    assert lab.node.privacy.budget == DEFAULT_BUDGET
    explicit = _party(certs, privacy=PrivacyBudget(epsilon=2.0))
    try:
        assert explicit.node.privacy.budget == PrivacyBudget(epsilon=2.0)
    finally:
        explicit.stop()


def test_a_restarted_party_continues_its_privacy_account(certs: Path, tmp_path: Path) -> None:
    """Each APC-VFL run releases the lab's latents once with noise σ = 2 (μ = 1; ε 4.4 at δ 1e-5): two runs fit in
    the default ε = 8, a third does not. With its account kept in its folder, a lab restarted after the first run
    refuses the third; an account that started again at zero would let it through."""
    assert gdp_epsilon(np.sqrt(2.0), 1e-5) < DEFAULT_BUDGET.epsilon < gdp_epsilon(np.sqrt(3.0), 1e-5)
    account = tmp_path / "lab" / "pas_privacy.jsonl"
    method = {"noise": {"clip": 1.0, "noise_multiplier": 2.0, "delta": 1e-5}, **QUICK}
    for seed, refused in ((1, False), (2, False), (3, True)):
        pas = _party(certs, account=account)  # a fresh process's account, read from the same file
        dep = _deployment(certs, pas)
        try:
            if refused:
                with pytest.raises(RemoteError, match="past its budget"):
                    dep.run(get_method("apc_vfl")(**method), seed=seed)
            else:
                dep.run(get_method("apc_vfl")(**method), seed=seed)
        finally:
            dep.close()
            pas.stop()
    assert stat.S_IMODE(account.stat().st_mode) == 0o600
    assert stat.S_IMODE(account.parent.stat().st_mode) == 0o700


def test_the_account_journal_replays_to_the_same_spending(tmp_path: Path) -> None:
    journal = tmp_path / "account.jsonl"
    first = PrivacyAccount("pas", PrivacyBudget(epsilon=30.0), journal=journal)
    ids = np.array(["a", "b", "c"])
    first.charge(ids, mu=1.0)
    first.charge(ids[:2], [b"p1", b"p2"], mu=0.5)
    first.charge(ids[:2], [b"p1", b"p2"], mu=0.5)  # the same release again: free
    first.charge(np.array([7]), epsilon=0.25)
    again = PrivacyAccount("pas", PrivacyBudget(epsilon=30.0), journal=journal)
    assert again.epsilon() == pytest.approx(first.epsilon())
    assert (again.releases, again.people) == (first.releases, first.people) == (3, 4)
    again.charge(ids[:2], [b"p1", b"p2"], mu=0.5)  # its fingerprints were kept too
    assert again.epsilon() == pytest.approx(first.epsilon())
    with pytest.raises(PrivacyBudgetError):
        PrivacyAccount("pas", PrivacyBudget(epsilon=1.0), journal=journal).charge(ids, mu=1.0)


def test_a_journal_that_is_not_an_account_is_refused_but_a_torn_last_line_is_set_aside(tmp_path: Path) -> None:
    journal = tmp_path / "account.jsonl"
    PrivacyAccount("pas", journal=journal).charge(np.array(["a"]), mu=1.0)
    journal.write_text(journal.read_text() + '{"releases": 1, "ids": ["b"')
    assert PrivacyAccount("pas", journal=journal).people == 1
    journal.write_text("not json\n" + journal.read_text())
    with pytest.raises(Exception, match="not a privacy account"):
        PrivacyAccount("pas", journal=journal)


def test_a_noised_bottom_releases_each_person_once_per_declared_epoch() -> None:
    from torch import nn

    bottom = Bottom(nn.Linear(3, 2), TrainConfig(max_epochs=3), "float32", noise=GaussianNoise(noise_multiplier=4.0),
                    rng=np.random.default_rng(0), keyed=_keyed(), account=PrivacyAccount("pas"))
    import torch

    x, ids = torch.ones(4, 3), np.array(["a", "b", "c", "d"])
    for _ in range(3):
        bottom.infer(x, ids, fresh=True)
    with pytest.raises(RefusedError, match="1 per epoch of the 3"):
        bottom.infer(x, ids, fresh=True)
    bottom.infer(x[:1], np.array(["e"]), fresh=True)  # someone not released yet still is
    for _ in range(3):
        bottom.forward(x, ids)
    with pytest.raises(RefusedError, match="training release"):
        bottom.forward(x, ids)
    assert bottom.infer(x, ids).shape == (4, 2)  # scoring: keyed noise, the same again, not bounded


def test_a_coordinator_repeating_validation_passes_is_refused_by_a_noised_splitnn_party() -> None:
    from tests.test_security import data_for, send
    from vflo.federation.session import Session
    from vflo.federation.simulation import build_federation

    data = data_for("splitnn")
    method = get_method("splitnn")(train={"max_epochs": 2, "patience": 0},
                                   activation_noise={"noise_multiplier": 4.0})
    fed, _ = build_federation(data, method, seed=0)
    Session(fed).start(method)
    shared = fed.align(data.train["act"].ids, ["pas"]).ids
    assert send(fed, "act", "pas", "splitnn.init", {"train_ids": shared[10:], "val_ids": shared[:10]}).error is None
    rows = {"rows": np.arange(10), "subset": "val", "training": False, "keep_previous": False, "epoch": 0}
    for _ in range(2):  # the two validation passes two epochs declare
        assert send(fed, "act", "pas", "splitnn.forward", rows).error is None
    reply = send(fed, "act", "pas", "splitnn.forward", rows)
    assert reply.error is not None and "train.max_epochs" in reply.error.message


def _keyed():  # type: ignore[no-untyped-def]
    from vflo.dp import RowNoise

    return RowNoise(b"k" * 32)


# -- an export a newcomer runs as it is -----------------------------------------------------------------------


def test_an_export_is_private_keeps_the_ca_outside_and_carries_a_budget(tmp_path: Path) -> None:
    data = vertical_split(20)
    out = tmp_path / "demo"
    written = export_federation(data, out, extra_roles={"server": "server"})
    ca = ca_folder(out)
    assert (ca / "ca.key").is_file() and not list(out.rglob("ca.key"))
    for root in (out, ca):
        for path in [root, *root.rglob("*")]:
            mode = stat.S_IMODE(path.stat().st_mode)
            assert mode & 0o077 == 0, f"{path} is {oct(mode)}: readable by others"
    for name, path in written.items():
        config = tomllib.loads(path.read_text())
        table = config.get("active", config)
        # The default budget, with what it does not do named where it can be changed.
        assert table["privacy"] == {"epsilon": DEFAULT_BUDGET.epsilon, "delta": DEFAULT_BUDGET.delta,
                                    "protect": False}, name


# -- peer-controlled text on the terminal ----------------------------------------------------------------------


def test_party_audit_shows_a_peers_escapes_and_markup_as_text(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from vflo.cli import main

    evil = "\x1b]0;owned\x07[bold red]x[/] \x1b[2J"
    line = {"time": "2026-01-01T00:00:00", "party": "pas", "run": "r1", "peer": "act", "kind": evil,
            "direction": "reply", "round": 1, "rows": 0, "bytes": 10, "status": "refused", "error": ""}
    audit = tmp_path / "pas_audit.jsonl"
    audit.write_text(json.dumps(line) + "\n")
    assert main(["party", "audit", str(audit)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert "\\x1b]0;owned\\x07[bold red]x[/]" in out.replace("\n", "")


def test_an_error_with_a_peers_escapes_is_printed_as_text(capsys: pytest.CaptureFixture[str]) -> None:
    from vflo.cli import common, main

    assert common.printable("a\x1bb\tc\n") == "a\\x1bb\tc\n"
    code = main(["party", "audit", str(Path("/nonexistent") / "\x1b[2J.jsonl")])
    err = capsys.readouterr().err
    assert code != 0 and "\x1b" not in err and "\\x1b[2J" in err


def test_spill_files_kept_alignments_and_saved_parts_are_their_owners_only(tmp_path: Path) -> None:
    from vflo.artifacts import write_part
    from vflo.spill import RowSink, SpillConfig, configure

    before = configure(SpillConfig(limit_mb=0, folder=str(tmp_path / "spill" / "rows")))
    try:
        sink = RowSink(4, 3, np.float32)
        sink.write(np.ones((4, 3), dtype=np.float32))
        written = sink.finish()
    finally:
        configure(before)
    paths = [tmp_path / "spill", tmp_path / "spill" / "rows", *(tmp_path / "spill" / "rows").iterdir()]
    part = tmp_path / "models" / "splitnn" / "pas"
    write_part(part, party="pas", role="passive", method="splitnn", label="splitnn", config="{}", model_id="m",
               state={"w": np.zeros(3)}, preprocessing=None)
    paths += [tmp_path / "models", part.parent, part, *part.iterdir()]
    for path in paths:
        assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, f"{path} can be read by others"
    del written
