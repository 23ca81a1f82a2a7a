"""A party protects itself: who may ask it what (from its own config), what it consents to run, and masks that
hide nothing are refused; a refused message leaves the legitimate run untouched."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from tests.test_methods import data_for, quick
from vflo.comm.message import Message, Table
from vflo.data.layout import FederatedData
from vflo.errors import ConfigError, RemoteError
from vflo.federation.session import Session
from vflo.federation.simulation import build_federation, party_node, run_method
from vflo.methods.masked_svd import SVDPart
from vflo.methods.masks import OrthogonalMask
from vflo.methods.registry import get_method
from vflo.party.node import parties_payload
from vflo.party.policy import Policy
from vflo.roles import PartyInfo


def federation(name: str, data: FederatedData | None = None):  # type: ignore[no-untyped-def]
    data = data or data_for(name)
    method = quick(name)
    fed, nodes = build_federation(data, method, seed=0)
    Session(fed).start(method)
    return data, method, fed, nodes


def send(fed, sender: str, receiver: str, kind: str, payload: dict) -> Message:  # type: ignore[no-untyped-def]
    """A message as a peer would put it on the wire, with its own (authenticated) name as the sender."""
    return fed.transport.request(Message(sender=sender, receiver=receiver, kind=kind, round=max(fed.rounds, 1),
                                         payload=payload, run=fed.run_id))


def identity_masks(m: int, d: int) -> dict[str, np.ndarray]:
    eye = OrthogonalMask(np.zeros((0, 0, 0)), np.eye(m))
    return {**eye.to_payload("p"), **OrthogonalMask(np.zeros((0, 0, 0)), np.eye(d)).to_payload("q")}


def test_the_fedsvd_exfiltration_by_a_malicious_server_is_refused_and_the_run_completes() -> None:
    """The issue's attack: the server sets identity masks and v = I, then asks for a projection of the serving
    rows; and aligns, then asks for an upload of the training rows. Every step is refused, nothing comes back."""
    data, method, fed, _nodes = federation("fedsvd")
    reference = run_method(quick("fedsvd"), data, seed=0)
    pas = data.train["pas"]
    attacks = [
        ("control.setup", {"method": "fedsvd", "config": Table(method.config_table()), "seed": 0, "save": False,
                           **parties_payload((PartyInfo("server", "active"), PartyInfo("pas", "passive")))}),
        ("svd.masks", identity_masks(len(pas.ids), pas.n_features)),
        ("svd.right", {"v": np.eye(pas.n_features)}),
        ("svd.project", {"ids": data.serve["pas"].ids}),
        ("align.plain", {"ids": pas.ids, "purpose": "train"}),
        ("svd.upload", {"selector": np.arange(len(pas.ids), dtype=np.int64)}),
        ("control.ledger", {}),
        ("control.teardown", {}),
    ]
    for kind, payload in attacks:
        reply = send(fed, "server", "pas", kind, payload)
        assert reply.error is not None and "refuse" in reply.error.message, kind
        if kind != "svd.right":  # the server may send V, but only as the answer to this party's upload
            assert reply.error.type == "RefusedError" and "'server' (role server)" in reply.error.message
        assert reply.payload == {}  # nothing of the party's rows came back
    # The legitimate run, set up before the attacks, goes on as if nothing had happened.
    method.fit(fed)
    assert np.array_equal(method.predict(fed, data.test_ids), reference.scores)


def test_a_passive_party_cannot_set_up_or_drive_another() -> None:
    data, _method, fed, _nodes = federation("splitnn", data_for("vfl_asp"))
    for kind, payload in (("control.setup", {"method": "splitnn", "config": Table({}), "seed": 0, "save": False,
                                             "parties": "[]"}),
                          ("split.activations", {"ids": data.train["p2"].ids, "purpose": "train"})):
        reply = send(fed, "p1", "p2", kind, payload)
        assert reply.error is not None and reply.error.type == "RefusedError"
        assert "from 'p1' (role passive)" in reply.error.message


def test_a_vfl_asp_first_hop_may_drive_only_what_the_method_delegates_to_it() -> None:
    data, _method, fed, _nodes = federation("vfl_asp")
    p2 = data.train["p2"]
    allowed = send(fed, "p1", "p2", "align.plain", {"ids": p2.ids[:3], "purpose": "train"})
    assert allowed.error is None
    refused = send(fed, "p1", "p2", "split.activations", {"ids": p2.ids[:3], "purpose": "train"})
    assert refused.error is not None and refused.error.type == "RefusedError"


def test_a_stranger_is_refused_before_any_handler_runs(caplog: pytest.LogCaptureFixture) -> None:
    data, _method, _fed, nodes = federation("splitnn")
    with caplog.at_level(logging.WARNING, logger="vflo.party.node"):
        reply = nodes["pas"].handle(Message(sender="mallory", receiver="pas", kind="align.plain", round=1,
                                            payload={"ids": data.train["pas"].ids, "purpose": "train"}))
    assert reply.error is not None and "not a peer" in reply.error.message
    # The party's own log says who asked for what (the issue: "the party logs none of it").
    assert any("refuses 'align.plain' from 'mallory'" in r.getMessage() and r.levelno == logging.WARNING
               for r in caplog.records)


def test_roles_come_from_the_partys_own_config_not_from_the_setup() -> None:
    info = PartyInfo("pas", "passive")
    node = party_node(info, peers={"act": "active", "srv": "server"})
    setup = {"method": "local", "config": Table(get_method("local")().config_table()), "seed": 0, "save": False,
             **parties_payload((PartyInfo("act", "active"), PartyInfo("pas", "passive"), PartyInfo("srv", "active")))}
    reply = node.handle(Message(sender="act", receiver="pas", kind="control.setup", round=0, payload=setup,
                                run="r1"))
    assert reply.error is not None and "knows 'srv' as server" in reply.error.message


@pytest.mark.parametrize(("names", "roles"), [(["act", "pas"], ["active"]), (["act", "act"], ["active", "passive"]),
                                              (["act", "pas"], ["active", "owner"])])
def test_a_setup_whose_party_list_does_not_add_up_is_refused(names: list[str], roles: list[str]) -> None:
    node = party_node(PartyInfo("pas", "passive"), peers={"act": "active"})
    setup = {"method": "local", "config": Table(get_method("local")().config_table()), "seed": 0, "save": False,
             "parties": np.asarray(names, dtype=np.str_), "roles": np.asarray(roles, dtype=np.str_)}
    reply = node.handle(Message(sender="act", receiver="pas", kind="control.setup", round=0, payload=setup,
                                run="r1"))
    assert reply.error is not None and "each party once, with one of the roles" in reply.error.message
    assert node.method is None


def test_a_method_outside_the_policy_is_refused_naming_party_and_method() -> None:
    data = data_for("splitnn")
    method = quick("rap")
    fed, nodes = build_federation(data, method, seed=0)
    nodes["pas"].policy = Policy(methods=("splitnn", "apc_vfl"))
    with pytest.raises(RemoteError, match=r"party 'pas' does not agree to run rap: its policy allows only splitnn"):
        Session(fed).start(method)
    nodes["pas"].policy = Policy(require={"rap.max_condition": {"max": 5.0}})
    with pytest.raises(RemoteError, match=r"'pas' does not agree to run rap with max_condition = 10.0"):
        Session(fed).start(method)
    nodes["pas"].policy = Policy(methods=("rap",), require={"rap.max_condition": {"max": 20.0}})
    Session(fed).start(method)  # within the policy


def test_policy_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="must name a method and a setting"):
        Policy(require={"mask": "dense"})
    with pytest.raises(ConfigError, match="takes min and/or max"):
        Policy(require={"rap.max_condition": {"below": 3}})
    assert Policy(methods=("rap",), require={"rap.max_condition": {"max": 5}}).describe() == \
        "rap (requiring rap.max_condition <= 5)"


@pytest.mark.parametrize("value", [0.0, float("inf"), 20.0])
def test_a_policy_bound_cannot_be_met_by_switching_the_check_off(value: float) -> None:
    """docs/security.md's own example, { max = 10 } on RAP's condition bound: 0 used to mean "no check" and met
    it. Now no value below 1 exists, and the bound is a client's own setting: whatever the coordinator proposes,
    the client projects with its own (the default, 10) and says so."""
    data = data_for("rap")
    method = get_method("rap")(estimator={"model": "mlp", "hidden": [8], "train": {"max_epochs": 1}})
    fed, nodes = build_federation(data, method, seed=0)
    nodes["pas"].policy = Policy(methods=("rap",), require={"rap.max_condition": {"max": 10}})
    nodes["pas"].settings = {}
    config = method.config_table()
    config["max_condition"] = value
    setup = {"method": "rap", "config": Table(config), "seed": 0,
             **parties_payload(fed.parties), "save": False}
    reply = fed.transport.request(Message(sender="act", receiver="pas", kind="control.setup", round=0, payload=setup,
                                          run="run-1"))
    if value < 1:
        assert reply.error is not None and "max_condition" in reply.error.message
        assert nodes["pas"].method is None
        return
    assert reply.error is None and reply.payload["own"] == {"max_condition": 10.0}
    assert nodes["pas"].method.config.max_condition == 10.0  # type: ignore[union-attr]


def test_a_partys_own_setting_outside_its_policy_is_refused() -> None:
    data = data_for("rap")
    method = get_method("rap")(estimator={"model": "mlp", "hidden": [8], "train": {"max_epochs": 1}})
    fed, nodes = build_federation(data, method, seed=0)
    nodes["pas"].policy = Policy(methods=("rap",), require={"rap.max_condition": {"max": 10}})
    nodes["pas"].settings = {"rap": {"max_condition": float("inf")}}
    with pytest.raises(RemoteError, match=r"'pas' does not agree to run rap with max_condition = inf"):
        Session(fed).start(method)


def _weak_mask(mask: str, m: int) -> OrthogonalMask:
    """Masks an attacking dealer deals: each hides nothing, at one block size or another."""
    rng = np.random.default_rng(0)
    no_blocks = np.zeros((0, 0, 0))
    if mask == "identity":
        return OrthogonalMask(no_blocks, np.eye(m))
    if mask == "permutation":
        return OrthogonalMask(no_blocks, np.eye(m)[rng.permutation(m)])
    if mask == "not orthogonal":
        return OrthogonalMask(no_blocks, np.ones((m, m)))
    if mask == "identity as 1x1 blocks":
        return OrthogonalMask(np.ones((m - 1, 1, 1)), np.eye(1))
    if mask == "permutations in 7x7 blocks":
        k = m // 7
        return OrthogonalMask(np.stack([np.eye(7)[rng.permutation(7)] for _ in range(k)]), np.eye(m - 7 * k))
    if mask == "half identity":
        half = np.eye(m)
        half[m // 2:, m // 2:] = OrthogonalMask.random(m - m // 2, None, rng).tail
        return OrthogonalMask(no_blocks, half)
    assert mask == "permutation inside one block"
    inner = np.zeros((m, m))
    for start in range(0, m, 7):  # block-diagonal 7x7 rotations, hidden by a permutation of the rows
        size = min(7, m - start)
        inner[start:start + size, start:start + size] = OrthogonalMask.random(size, None, rng).tail
    return OrthogonalMask(no_blocks, inner[rng.permutation(m)])


@pytest.mark.parametrize("mask", ["identity", "permutation", "not orthogonal", "identity as 1x1 blocks",
                                  "permutations in 7x7 blocks", "half identity", "permutation inside one block"])
def test_masks_that_hide_nothing_are_refused_even_from_the_dealer(mask: str) -> None:
    data, _method, fed, nodes = federation("fedsvd")
    pas = data.train["pas"]
    payload = {**_weak_mask(mask, len(pas.ids)).to_payload("p"),
               **OrthogonalMask(np.zeros((0, 0, 0)), np.zeros((0, 0))).to_payload("q")}
    reply = send(fed, "dealer", "pas", "svd.masks", payload)
    assert reply.error is not None and "refused" in reply.error.message
    assert nodes["pas"].context.part(SVDPart).P is None


def test_masks_and_v_cannot_be_replaced_mid_run() -> None:
    data, method, fed, _nodes = federation("fedsvd")
    method.fit(fed)
    pas = data.train["pas"]
    again = send(fed, "dealer", "pas", "svd.masks", identity_masks(len(pas.ids), pas.n_features))
    assert again.error is not None and "already holds its masks" in again.error.message
    late = send(fed, "server", "pas", "svd.right", {"v": np.eye(pas.n_features)})
    assert late.error is not None and "without an upload awaiting it" in late.error.message


def test_handlers_declare_who_may_send_them() -> None:
    from vflo.party.handlers import handles

    with pytest.raises(ValueError, match="senders must be some of"):
        handles("x.y", served="never", senders=("anyone",))  # type: ignore[arg-type]


def test_a_party_that_requires_psi_refuses_plain_alignment_and_runs_with_psi() -> None:
    """[policy] alignment = 'psi': a plain alignment request (guessed IDs, any split) is refused, naming the
    setting and the fix; the same method aligned by PSI runs."""
    from vflo.align.engines import AlignmentConfig

    data = data_for("splitnn")
    for alignment, refused in ((None, True), (AlignmentConfig(method="psi"), False)):
        method = quick("splitnn")
        fed, nodes = build_federation(data, method, seed=0, alignment=alignment)
        nodes["pas"].policy = Policy(alignment="psi")
        Session(fed).start(method)
        if refused:
            guessed = {"ids": data.train["pas"].ids[:5], "purpose": "serve"}
            reply = send(fed, "act", "pas", "align.plain", guessed)
            assert reply.error is not None and "[policy] alignment is 'psi'" in reply.error.message
            assert 'method = "psi"' in reply.error.message
            with pytest.raises(RemoteError, match="aligns only by private set intersection"):
                method.fit(fed)
        else:
            method.fit(fed)
            assert method.predict(fed, data.test_ids).shape[0] == len(data.test_ids)


def test_one_run_at_a_time_other_runs_and_backward_rounds_are_refused() -> None:
    """A second active peer's setup in the middle of the hospital's run used to be accepted and broke the run;
    messages carried no run ID and any round was accepted."""
    data = data_for("splitnn")
    method = quick("splitnn")
    fed, nodes = build_federation(data, method, seed=0)
    lab = nodes["pas"]
    lab.peers["rival"] = "active"  # the lab's config lists a second active peer
    Session(fed).start(method)
    assert len(fed.run_id) == 32
    setup = {"method": "splitnn", "config": Table(quick("splitnn").config_table()), "seed": 9,
             **parties_payload((PartyInfo("rival", "active"), PartyInfo("pas", "passive"))), "save": False}
    hijack = lab.handle(Message(sender="rival", receiver="pas", kind="control.setup", round=0, payload=setup,
                                run="rival-run"))
    assert hijack.error is not None and "serving a run of 'act'" in hijack.error.message
    method.fit(fed)  # the hospital's run goes on undisturbed
    assert method.predict(fed, data.test_ids).shape[0] == len(data.test_ids)
    other = send(fed, "act", "pas", "split.finish", {"keep_previous": False})
    assert other.error is None  # its own run, a round not behind
    stale = lab.handle(Message(sender="act", receiver="pas", kind="split.finish", round=fed.rounds + 1,
                               payload={"keep_previous": False}, run="an-old-run"))
    assert stale.error is not None and "not to the run this party serves" in stale.error.message
    backwards = lab.handle(Message(sender="act", receiver="pas", kind="split.finish", round=1,
                                   payload={"keep_previous": False}, run=fed.run_id))
    assert backwards.error is not None and "comes after round" in backwards.error.message
    Session(fed).teardown()
    after = lab.handle(Message(sender="act", receiver="pas", kind="split.finish", round=fed.rounds + 2,
                               payload={"keep_previous": False}, run=fed.run_id))
    assert after.error is not None and "serves no run now" in after.error.message
    # With the run over, the rival may start one of its own.
    assert lab.handle(Message(sender="rival", receiver="pas", kind="control.setup", round=0, payload=setup,
                              run="rival-run")).error is None


def test_steps_out_of_order_are_refused() -> None:
    """RAP's server pulled rap.project and rap.project_serve whenever it liked (and learnt which IDs the lab holds
    from the errors); APC-VFL's encode_serve was served though APC-VFL scores from the active party alone."""
    data = data_for("rap")
    method = quick("rap")
    fed, _nodes = build_federation(data, method, seed=0)
    Session(fed).start(method)
    lab_ids = data.serve["pas"].ids
    early = send(fed, "server", "pas", "rap.project_serve", {"ids": lab_ids[:3]})
    assert early.error is not None and "scoring session its coordinator opened" in early.error.message
    method.fit(fed)
    again = send(fed, "server", "pas", "rap.project", {"selector": np.ones(3, dtype=bool)})
    assert again.error is not None and "once a run" in again.error.message
    method.predict(fed, data.test_ids)  # the coordinator's own session: served, each row once
    replay = send(fed, "server", "pas", "rap.project_serve", {"ids": data.test_ids[:2]})
    assert replay.error is not None and "each row once" in replay.error.message
    # Guessing IDs through the server tells it nothing: the refusal is the same for held and unheld IDs.
    guesses = [send(fed, "server", "pas", "rap.project_serve", {"ids": np.asarray([i])}).error
               for i in (lab_ids[0], "nobody")]
    assert all(g is not None for g in guesses) and guesses[0].message == guesses[1].message  # type: ignore[union-attr]
    Session(fed).teardown()

    data, apc, fed, _nodes = federation("apc_vfl")
    apc.fit(fed)
    served = send(fed, "act", "pas", "apc.encode_serve", {"ids": data.serve["pas"].ids[:3]})
    assert served.error is not None and "running apc_vfl has no handler for 'apc.encode_serve'" in served.error.message


@pytest.mark.parametrize(("name", "kinds"), [("ablation", ["apc.encode_aligned", "apc.encode_serve"]),
                                             ("vfedtrans", ["svd.right", "svd.project"]),
                                             ("vfl_asp", ["svd.right", "svd.project"])])
def test_a_variant_answers_only_the_steps_it_uses(name: str, kinds: list[str]) -> None:
    """Ablation sends nothing, yet a party running it answered APC-VFL's upload (it inherited the handlers):
    a coordinator could install the harmless-looking method and pull latents. A variant has only its own steps'
    handlers; VFedTrans and VFL-ASP score without the SVD's right factors and answer neither of those kinds."""
    _data, method, fed, _nodes = federation(name)
    method.fit(fed)
    for kind in kinds:
        reply = send(fed, "act", "pas" if "pas" in fed.names() else fed.names("passive")[0], kind, {})
        assert reply.error is not None and f"running {name} has no handler for {kind!r}" in reply.error.message


def test_a_delegate_must_be_a_data_party_in_the_partys_own_config() -> None:
    """VFL-ASP with first_hop = "server" in the setup made the server a delegate that could send align.plain."""
    data = data_for("vfl_asp")
    method = get_method("vfl_asp")(**{**{f: getattr(quick("vfl_asp").config, f) for f in ("train", "student_train",
                                                                                          "embedding_train")},
                                      "first_hop": "server"})
    fed, _nodes = build_federation(data, method, seed=0)
    Session(fed).start(method)
    asked = send(fed, "server", "p2", "align.plain", {"ids": data.train["p2"].ids[:3], "purpose": "train"})
    assert asked.error is not None and asked.error.type == "RefusedError"


def test_plain_alignment_of_training_rows_answers_one_set_of_ids_a_run() -> None:
    """Each answer tells the asker which of the IDs it named the party holds: asked again and again with other
    guesses, a party would give away who it holds one guess at a time."""
    data, method, fed, _nodes = federation("splitnn")
    ids = data.train["act"].ids
    first = send(fed, "act", "pas", "align.plain", {"ids": ids, "purpose": "train"})
    assert first.error is None
    assert send(fed, "act", "pas", "align.plain", {"ids": ids, "purpose": "train"}).error is None  # the same set
    probe = send(fed, "act", "pas", "align.plain", {"ids": np.asarray(["someone"]), "purpose": "train"})
    assert probe.error is not None and "once a run" in probe.error.message
    Session(fed).start(method)  # a new run (the same coordinator starting again): one new set
    assert send(fed, "act", "pas", "align.plain", {"ids": ids[:5], "purpose": "train"}).error is None


def test_sizes_a_peer_chooses_are_bounded_by_the_partys_policy() -> None:
    """The issue's resource attacks: svd.deal with m = 2e6 kept the dealer busy 100-140 s (and would take 16 GB
    of block masks); a request may hold only so many rows; Entity Augmentation's batch size is the host's."""
    import time

    _data, _method, fed, nodes = federation("fedsvd")
    started = time.perf_counter()
    deal = send(fed, "act", "dealer", "svd.deal", {"m": 2_000_000, "parties": np.asarray(["act", "pas"]),
                                                   "widths": np.asarray([3, 3], dtype=np.int64),
                                                   "column_masks": True})
    assert deal.error is not None and "at most 1000000 rows" in deal.error.message
    assert time.perf_counter() - started < 5  # refused before any mask is drawn
    big = send(fed, "act", "dealer", "svd.deal", {"m": 900_000, "parties": np.asarray(["act", "pas"]),
                                                   "widths": np.asarray([3, 3], dtype=np.int64),
                                                  "column_masks": True})
    assert big.error is not None and "GiB of masks" in big.error.message
    wide = send(fed, "act", "dealer", "svd.deal", {"m": 100, "parties": np.asarray(["act", "pas"]),
                                                   "widths": np.asarray([3, 20000], dtype=np.int64),
                                                   "column_masks": True})
    assert wide.error is not None and "max_mask_bytes" in wide.error.message
    for names, widths in ((["act", "pas"], [3]), (["act", "act"], [3, 3])):  # a width missing; a party twice
        odd = send(fed, "act", "dealer", "svd.deal", {"m": 100, "parties": np.asarray(names),
                                                      "widths": np.asarray(widths, dtype=np.int64),
                                                      "column_masks": True})
        assert odd.error is not None and "svd.deal: one width per party, each party once" in odd.error.message
    nodes["pas"].policy = Policy(max_rows=50)
    rows = send(fed, "act", "pas", "svd.project", {"ids": np.arange(51).astype(str)})
    assert rows.error is not None and "more than this party's policy allows" in rows.error.message
    _data, method, fed, nodes = federation("entity_augmentation")
    method.fit(fed)
    guest = next(iter(fed.names("passive")))
    huge = send(fed, "act", guest, "ea.forward", {"n": 10**12, "positions": np.empty(0, dtype=np.int64)})
    assert huge.error is not None and "walks between 1 and 1000000" in huge.error.message
    with pytest.raises(ConfigError, match="max_rows must be an integer of at least 1"):
        Policy(max_rows=0)


def test_a_scoring_session_waits_for_the_training_run_it_would_replace() -> None:
    """One run at a time: the hospital scoring with the lab while its own training run goes on would replace
    that run. The lab refuses, says why and what to do; once the run ends (or falls silent), it scores."""
    _data, method, fed, nodes = federation("splitnn")
    lab = nodes["pas"]
    load = {"method": "splitnn", "config": Table(method.config_table()), "seed": 0, "label": "m", "model_id": "x",
            **parties_payload(fed.parties)}
    during = lab.handle(Message("act", "pas", "control.load", 0, load, run="scoring-1"))
    assert during.error is not None and "it scores after that run ends" in during.error.message
    assert lab._run == fed.run_id  # the training run is untouched
    lab.idle_run_seconds = 0.0  # a training run silent this long counts as abandoned
    after = lab.handle(Message("act", "pas", "control.load", 0, load, run="scoring-2"))
    assert after.error is not None and "no folder for model parts" in after.error.message  # past the run check
