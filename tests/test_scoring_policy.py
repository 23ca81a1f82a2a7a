"""What a partner agrees to when it is asked to score: how fast each peer may ask (a token bucket per peer), with
which saved models, and its own record of who asked about which of its people (the people a kept intersection's
reuse names by position mapped back to its own IDs), which `vflo party audit --person` reads."""

from __future__ import annotations

import json
import stat
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import vertical_split
from vflo.align.engines import AlignmentConfig
from vflo.align.kept import AlignmentStore
from vflo.artifacts import PartStore
from vflo.cli import main
from vflo.comm.local import LocalTransport
from vflo.data.layout import FederatedData
from vflo.data.partydata import PartyData
from vflo.deploy import load_party_config
from vflo.deploy.deployment import held_rows
from vflo.errors import ConfigError, RemoteError, VfloError
from vflo.federation.coordinator import Coordinator
from vflo.federation.session import Session
from vflo.federation.simulation import party_node, run_method
from vflo.methods.base import Method
from vflo.methods.registry import get_method
from vflo.party.asked import AskedLog, about, per_peer, read_asked
from vflo.party.node import Node
from vflo.party.policy import Policy
from vflo.party.rates import PeerRates, TokenBucket
from vflo.scoring import SavedModel
from vflo.serve.sessions import prepare

# -- the rate: a token bucket per peer, on a clock the test moves -------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_bucket_holds_one_seconds_worth_and_refills_at_its_rate() -> None:
    clock = Clock()
    bucket = TokenBucket(4.0, clock=clock)
    assert [bucket.take() for _ in range(5)] == [True] * 4 + [False]  # full at the start: one second's worth
    assert not bucket.ready()
    clock.now += 0.25  # a quarter second: one token back
    assert bucket.ready() and bucket.ready()  # asking whether takes nothing
    assert bucket.take() and not bucket.take()
    clock.now += 60.0  # a long pause fills it again, no further
    assert [bucket.take() for _ in range(5)] == [True] * 4 + [False]
    clock.now -= 10.0  # a clock going backwards gives nothing (and takes nothing)
    assert not bucket.take()


def test_a_rate_under_one_a_second_still_lets_one_request_through() -> None:
    clock = Clock()
    bucket = TokenBucket(0.5, clock=clock)
    assert bucket.capacity == 1.0 and bucket.take() and not bucket.take()
    clock.now += 1.9
    assert not bucket.take()
    clock.now += 0.1
    assert bucket.take()
    with pytest.raises(ValueError, match="positive rate"):
        TokenBucket(0.0)


def test_each_peer_has_its_own_bucket_and_no_rate_lets_everything_through() -> None:
    clock = Clock()
    rates = PeerRates(1.0, clock=clock)
    assert rates.take("bank") and not rates.take("bank") and not rates.ready("bank")
    assert rates.ready("shop") and rates.take("shop")  # another peer is not held up by the first
    clock.now += 1.0
    assert rates.take("bank")
    unlimited = PeerRates(None, clock=clock)
    assert all(unlimited.take("bank") for _ in range(10_000))


# -- the policy's keys -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rate", [0, -1.0, float("inf"), float("nan"), True, "10"])
def test_a_rate_that_is_no_positive_number_is_refused_naming_the_key(rate: object) -> None:
    with pytest.raises(ConfigError, match="policy.max_peer_requests_per_second must be a positive number"):
        Policy(max_peer_requests_per_second=rate)  # type: ignore[arg-type]


@pytest.mark.parametrize("models", ["splitnn", ("splitnn", ""), (3,)])
def test_serve_models_must_be_a_list_of_names(models: object) -> None:
    with pytest.raises(ConfigError, match=r"policy.serve_models must be a list of saved model labels"):
        Policy(serve_models=models)  # type: ignore[arg-type]


def test_the_keys_read_from_a_partys_config_and_the_defaults(tmp_path: Path) -> None:
    default = Policy()
    assert default.max_peer_requests_per_second is None and default.serve_models is None
    path = tmp_path / "lab.toml"
    path.write_text('name = "lab"\n[data]\nfile = "f.csv"\nid_column = "id"\n[tls]\ninsecure = true\n'
                    '[peers]\nbank = { address = "127.0.0.1:1", role = "active" }\n'
                    '[policy]\nmax_peer_requests_per_second = 20\nserve_models = ["splitnn", "M123"]\n')
    config = load_party_config(path)
    assert config.policy.max_peer_requests_per_second == 20.0 and config.policy.serve_models == ("splitnn", "M123")
    # The record of who asked lies beside the config by default, apart from the audit file.
    assert config.asked_log == str(tmp_path / "lab_asked.jsonl") != config.audit_log
    assert Policy(serve_models=()).serve_models == ()  # none: a partner that only trains


def test_serving_a_model_outside_serve_models_is_refused_by_label_or_model_id() -> None:
    policy = Policy(serve_models=("splitnn", "M7"))
    policy.check_serving("lab", "splitnn", "M1")
    policy.check_serving("lab", "other", "M7")
    with pytest.raises(VfloError, match=r"party 'lab' does not open a scoring session for model 'laser' \(model ID "
                                        r"M1\): its policy serves only splitnn, M7; add 'laser' to \[policy\] "
                                        "serve_models"):
        policy.check_serving("lab", "laser", "M1")
    with pytest.raises(VfloError, match="serves no saved model"):
        Policy(serve_models=()).check_serving("lab", "splitnn", "M1")


# -- a scoring session over the in-process transport, as `vflo serve` opens it --------------------------------------


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[FederatedData, Path]:
    data = vertical_split(30)
    folder = tmp_path_factory.mktemp("saved")
    # Trained with party-wise dropout, so that it may also score with whoever answers (missing = "subset").
    run_method(get_method("splitnn")(train={"max_epochs": 1}, party_dropout=0.5), data, seed=0,
               save=(folder, "splitnn"))
    return data, folder


@dataclass
class Scoring:
    fed: Coordinator
    method: Method
    model: SavedModel
    asked: Path
    nodes: dict[str, Node]
    transport: LocalTransport
    everyone: PartyData  # the active party's rows to score, prepared as its model expects

    def batch(self, ids: np.ndarray) -> np.ndarray:
        """One batch as a served model with missing = "refuse" scores it: which of ``ids`` the partner holds (the
        kept intersection reused), then its share of the scores for those."""
        self.fed.ctx.serving = rows = self.everyone.subset(ids)
        held = held_rows(self.fed, rows.ids, "pas", self.method.name)
        asked: np.ndarray = rows.ids[held]
        self.method.predict_by(self.fed, asked)
        return asked


@pytest.fixture
def scoring(saved: tuple[FederatedData, Path], tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Scoring]:
    data, folder = saved
    param = getattr(request, "param", {})
    policy, missing = param.get("policy", Policy()), param.get("missing", "refuse")
    model = SavedModel.load(folder, "splitnn")
    asked = tmp_path / "pas_asked.jsonl"
    nodes = {"act": party_node(model.parties[0], None, model.rows("act", data.serve["act"]), peers=model.parties,
                               store=PartStore(folder, party="act", role="active"),
                               alignments=AlignmentStore(tmp_path / "act", "act")),
             "pas": party_node(model.parties[1], None, model.rows("pas", data.serve["pas"]), peers=model.parties,
                               store=PartStore(folder, party="pas", role="passive"), policy=policy,
                               alignments=AlignmentStore(tmp_path / "pas", "pas"), asked=AskedLog(asked, "pas"))}
    transport = LocalTransport(nodes)
    fed, method = model.restore(nodes["act"], transport, alignment=AlignmentConfig(method="psi"), missing=missing)
    everyone = fed.ctx.serving
    assert everyone is not None
    prepare(fed, method)  # the whole table aligned once, each side keeping it
    try:
        yield Scoring(fed=fed, method=method, model=model, asked=asked, nodes=nodes, transport=transport,
                      everyone=everyone)
    finally:
        fed.ctx.serving = everyone
        Session(fed).teardown()


def _people(data: FederatedData, k: int) -> np.ndarray:
    """``k`` people the active party scores: some the partner holds, some it does not."""
    act, pas = data.serve["act"].ids, set(data.serve["pas"].ids.tolist())
    shared = [i for i in act if i in pas][:k]
    only = [i for i in act if i not in pas][:2]
    return np.asarray(shared + only)


def test_the_record_names_who_asked_about_whom_with_which_model(scoring: Scoring, saved: tuple[FederatedData, Path],
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    data, _ = saved
    asked_for = scoring.batch(_people(data, 5))
    assert len(asked_for) == 5
    records = read_asked(scoring.asked)
    card = scoring.model.card
    # The reuse named the batch's people by their places among those shared: mapped back to the lab's own IDs;
    # the scoring request named the same people by ID.
    reuse, score = records[-2:]
    assert (reuse.kind, reuse.named_by, score.kind, score.named_by) == ("align.reuse", "positions",
                                                                        "split.activations", "ids")
    expected = sorted(str(i) for i in asked_for)
    assert sorted(reuse.ids) == expected == sorted(score.ids)
    for r in (reuse, score):
        assert (r.peer, r.party, r.model, r.model_id, r.status) == ("act", "pas", "splitnn", card.model_id, "ok")
        assert r.run and r.time
    assert stat.S_IMODE(scoring.asked.stat().st_mode) == 0o600  # it holds IDs: its owner's alone
    person = expected[0]
    assert [r.kind for r in about(records, person)][-2:] == ["align.reuse", "split.activations"]
    assert about(records, "nobody") == []
    assert per_peer(records)[0]["peer"] == "act"

    # `vflo party audit FILE --person ID`: the record beside the audit file, by its default name.
    audit = scoring.asked.with_name("pas_audit.jsonl")
    audit.write_text("")
    assert main(["party", "audit", str(audit), "--person", person]) == 0
    out = capsys.readouterr().out
    assert "who asked about" in out and "split.activations" in out and card.model_id in out and "act" in out
    assert main(["party", "audit", str(audit)]) == 0
    out = capsys.readouterr().out
    assert "who asked about the people of party pas" in out and "splitnn" in out


@pytest.mark.parametrize("scoring", [{"policy": Policy(max_peer_requests_per_second=0.001)}], indirect=True)
def test_a_peer_over_its_rate_is_refused_naming_the_policy_key(scoring: Scoring,
                                                               saved: tuple[FederatedData, Path]) -> None:
    data, _ = saved
    people = _people(data, 4)
    scoring.batch(people)  # one token a second's worth: the first batch takes it
    # The next batch is refused at its first step (the reuse), so that serving with missing = "subset" leaves
    # the partner out of it rather than failing on its scoring request.
    with pytest.raises(VfloError, match=r"max_peer_requests_per_second = 0.001"):
        scoring.batch(people)
    before = len(read_asked(scoring.asked))
    # A scoring request sent over the rate anyway is refused, and recorded with the people it named.
    ids = scoring.everyone.ids[:2]
    with pytest.raises(RemoteError, match=r"over the rate of scoring requests .* raise it there"):
        scoring.fed.request("pas", "split.activations", {"ids": ids, "purpose": "serve"})
    refused = read_asked(scoring.asked)[before:]
    assert [(r.status, r.why, r.ids) for r in refused] == [
        ("refused", "policy.max_peer_requests_per_second", tuple(str(i) for i in ids))]


@pytest.mark.parametrize("scoring", [{"policy": Policy(max_peer_requests_per_second=0.001), "missing": "subset"}],
                         indirect=True)
def test_serving_with_whoever_answers_leaves_a_partner_over_its_rate_out_of_the_batch(
        scoring: Scoring, saved: tuple[FederatedData, Path]) -> None:
    data, _ = saved
    people = _people(data, 4)
    fed, method = scoring.fed, scoring.method
    fed.ctx.serving = scoring.everyone.subset(people)
    _, first = method.predict_by(fed, people)
    assert first["pas"].sum() == 4  # the partner scored the people it holds
    _, second = method.predict_by(fed, people)  # its rate spent: refused at the reuse, absent for this batch only
    assert not second["pas"].any() and "pas" not in fed.absent


@pytest.mark.parametrize("scoring", [{"policy": Policy(max_peer_requests_per_second=1000.0), "missing": "subset"}],
                         indirect=True)
def test_a_scoring_request_refused_by_a_partners_policy_leaves_it_out_of_an_any_subset_batch(
        scoring: Scoring, saved: tuple[FederatedData, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    data, _ = saved
    people = _people(data, 4)
    fed, method = scoring.fed, scoring.method
    fed.ctx.serving = scoring.everyone.subset(people)
    # The reuse passes (the bucket looks ready), then the scoring request itself is refused over the rate.
    monkeypatch.setattr(scoring.nodes["pas"]._rates, "take", lambda sender: False)
    scores, by = method.predict_by(fed, people)
    assert len(scores) == 4 and not by["pas"].any() and "pas" not in fed.absent  # scored without it, this batch
    monkeypatch.undo()
    _, again = method.predict_by(fed, people)
    assert again["pas"].all()


@pytest.mark.parametrize("scoring", [{"policy": Policy(serve_models=("splitnn",))}], indirect=True)
def test_a_session_for_a_model_outside_serve_models_is_refused_at_load(scoring: Scoring) -> None:
    # "splitnn" opened (the fixture's session); the same part under another label is refused before it is read.
    relabelled = SavedModel(folder=scoring.model.folder, card=replace(scoring.model.card, label="other"),
                            active=scoring.model.active)
    with pytest.raises(VfloError, match=r"does not open a scoring session for model 'other' .*: its policy serves "
                                        r"only splitnn; add 'other' to \[policy\] serve_models"):
        relabelled.restore(scoring.nodes["act"], scoring.transport, alignment=AlignmentConfig(method="psi"))


def test_a_record_line_is_json_with_the_ids_as_text(tmp_path: Path) -> None:
    log = AskedLog(tmp_path / "deep" / "lab_asked.jsonl", "lab")
    log.asked(peer="bank", run="r1", model="m", model_id="M1", kind="k", named_by="ids", ids=np.asarray([3, 1]))
    log.asked(peer="bank", run="r2", model="m", model_id="M1", kind="k", named_by="ids", ids=["1"],
              refused="policy.max_peer_requests_per_second")
    lines = [json.loads(line) for line in log.path.read_text().splitlines()]
    assert lines[0]["ids"] == ["3", "1"] and lines[1]["status"] == "refused"
    assert per_peer(read_asked(log.path)) == [{"peer": "bank", "requests": 2, "named": 3, "people": 2, "refused": 1,
                                               "models": ["m"]}]
    (tmp_path / "bad.jsonl").write_text('{"time": 1}\n')
    with pytest.raises(ConfigError, match="bad.jsonl:1 is not a line of a vflo record of who asked"):
        read_asked(tmp_path / "bad.jsonl")
