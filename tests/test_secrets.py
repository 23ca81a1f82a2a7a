"""A party's secrets are its own: masks, projections, noise and private weights come from the party's own
randomness, never from the run seed every party receives; noise cannot be averaged away; ε says what it covers.

Each test is written as the attack a semi-honest party would try, or as the property that defeats it: with
everything public fixed (the same data, the same run seed, hence the same messages a party could use to
replay a stream), a secret must change when only its owner's own seed changes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.test_methods import data_for, quick
from vflo.comm.message import Message
from vflo.comm.tls import init_certs
from vflo.data.layout import FederatedData
from vflo.data.partydata import PartyData
from vflo.deploy import DataConfig, DeployConfig, Deployment, PartyConfig, PeerConfig, PeerEntry, TLSConfig, start_party
from vflo.dp import GaussianNoise, PrivacyAccount, PrivacyBudget, RowNoise
from vflo.errors import PrivacyBudgetError, RemoteError
from vflo.federation.coordinator import Coordinator
from vflo.federation.session import Session
from vflo.federation.simulation import build_federation
from vflo.methods.base import Method
from vflo.methods.masked_svd import SVDPart
from vflo.methods.masks import OrthogonalMask
from vflo.methods.rap import ClientTransform, RAPPart
from vflo.methods.registry import get_method
from vflo.party.node import Node
from vflo.seeding import numpy_rng

NOISE = GaussianNoise(clip=1.0, noise_multiplier=1.0)


def fitted(method: Method, data: FederatedData, *, seed: int = 0, party_seeds: dict[str, int] | None = None,
           seen: list[Message] | None = None) -> tuple[Coordinator, dict[str, Node]]:
    observers = () if seen is None else (seen.append,)
    fed, nodes = build_federation(data, method, seed=seed, party_seeds=party_seeds, observers=observers)
    Session(fed).start(method)
    method.fit(fed)
    fed.flush()
    return fed, nodes


def _rap_projection(nodes: dict[str, Node], _seen: list[Message]) -> np.ndarray:
    assert nodes["pas"].context is not None
    transform = nodes["pas"].context.part(RAPPart).transform
    assert transform is not None
    return np.asarray(transform.A)


def _row_mask(party: str) -> Callable[[dict[str, Node], list[Message]], np.ndarray]:
    def read(nodes: dict[str, Node], _seen: list[Message]) -> np.ndarray:
        ctx = nodes[party].context
        assert ctx is not None
        mask = ctx.part(SVDPart).P
        assert isinstance(mask, OrthogonalMask)
        return mask.dense()
    return read


def _upload(kind: str, field: str) -> Callable[[dict[str, Node], list[Message]], np.ndarray]:
    """What the server received: the noised rows themselves (their noise is the secret)."""
    def read(_nodes: dict[str, Node], seen: list[Message]) -> np.ndarray:
        return np.concatenate([np.asarray(m.payload[field]).ravel() for m in seen
                               if m.kind == kind and field in m.payload])
    return read


# The secret each method keeps at one party, read from that party's own state or from what left it.
SECRETS: dict[str, tuple[str, dict[str, Any], Callable[[dict[str, Node], list[Message]], np.ndarray]]] = {
    "rap projection": ("rap", {}, _rap_projection),
    "ldp noise": ("ldp", {}, _upload("rap.project", "x")),
    "fedsvd dealer's row mask": ("fedsvd", {}, _row_mask("pas")),
    "vfedtrans dealer's row mask": ("vfedtrans", {}, _row_mask("pas")),
    "vfl_asp dealer's row mask": ("vfl_asp", {}, _row_mask("p2")),
    "apc_vfl upload noise": ("apc_vfl", {"noise": NOISE}, _upload("apc.encode_aligned", "z")),
    "splitnn activation noise": ("splitnn", {"activation_noise": NOISE}, _upload("splitnn.forward", "acts")),
    # The active party's secrets, replayed by the passive party or the server in the old attacks:
    "splitnn gradient noise": ("splitnn", {"gradient_noise": NOISE}, _upload("split.backward", "grad")),
    "rap label map": ("rap", {}, _upload("rap.train", "labels")),
}


def _secret(case: str, party_seeds: dict[str, int] | None) -> np.ndarray:
    name, extra, read = SECRETS[case]
    method = get_method(name)(**{**_settings(name), **extra})
    seen: list[Message] = []
    _, nodes = fitted(method, data_for(name), seed=7, party_seeds=party_seeds, seen=seen)
    return read(nodes, seen)


def _settings(name: str) -> dict[str, Any]:
    return {f.name: getattr(quick(name).config, f.name) for f in dataclasses.fields(quick(name).config)}


@pytest.mark.parametrize("case", sorted(SECRETS))
def test_a_secret_changes_with_its_owners_seed_alone(case: str) -> None:
    """Everything every party receives (data, run seed 7, the messages built from them) stays the same; only the
    parties' own seeds change. A secret anyone could replay from what it was sent would stay the same."""
    ours = {n: 1000 + i for i, n in enumerate(("act", "pas", "p1", "p2", "server", "dealer"))}
    theirs = {n: s + 1 for n, s in ours.items()}
    first, again, other = _secret(case, ours), _secret(case, ours), _secret(case, theirs)
    assert np.array_equal(first, again)  # same seeds, same numbers
    assert first.shape == other.shape and not np.allclose(first, other)


def test_rap_server_replaying_the_run_seed_recovers_nothing() -> None:
    """The attack that worked: the server reads the run seed from its setup message, redraws the client's
    projection as the client used to (numpy_rng(run seed, party, purpose)), and inverts what it received."""
    data = data_for("rap")
    seen: list[Message] = []
    fitted(quick("rap"), data, seed=3, seen=seen)
    setup = next(m for m in seen if m.kind == "control.setup" and m.receiver == "server")
    run_seed = int(setup.payload["seed"])  # type: ignore[arg-type]
    received = next(m.payload["x"] for m in seen if m.kind == "rap.project" and m.sender == "pas")
    assert isinstance(received, np.ndarray)
    lab = data.train["pas"]
    guess = ClientTransform.fit(lab, numpy_rng(run_seed, "pas", "rap-projection"), other=False, pseudo=False)
    recovered = received[:, : guess.A.shape[1]] @ np.linalg.pinv(guess.A)
    truth = lab.subset(np.sort(lab.ids)[: len(recovered)]).X
    assert np.abs(recovered[: len(truth)] - truth[: len(recovered)]).mean() > 0.3


def test_fedsvd_server_replaying_the_run_seed_cannot_unmask() -> None:
    """The server redraws the dealer's masks from the run seed it was sent and unmasks the lab's block."""
    data = data_for("fedsvd")
    seen: list[Message] = []
    _, nodes = fitted(quick("fedsvd"), data, seed=3, seen=seen)
    setup = next(m for m in seen if m.kind == "control.setup" and m.receiver == "server")
    run_seed = int(setup.payload["seed"])  # type: ignore[arg-type]
    real = _row_mask("pas")(nodes, seen)
    settings = quick("fedsvd").svd_settings()  # type: ignore[attr-defined]
    replayed = OrthogonalMask.random(len(real), settings.row_block, numpy_rng(run_seed, "dealer", "svd-masks"))
    assert not np.allclose(replayed.dense(), real, atol=1e-3)


def test_one_row_releases_carry_independent_noise_and_a_row_asked_twice_is_the_same_release() -> None:
    """LDP keyed its noise by the number of rows: 50 one-row releases carried one noise vector, so row
    differences came out exact. Now each is keyed by the party's secret, the ID and the row."""
    method = quick("ldp")
    fed, nodes = fitted(method, data_for("ldp"))
    ctx, client = nodes["pas"].context, nodes["pas"].method
    assert ctx is not None and client is not None
    rows = ctx.require_data()
    c = method.config.clip  # type: ignore[attr-defined]
    singles = np.vstack([client.released_rows(ctx, rows.subset(rows.ids[i : i + 1])) for i in range(50)])  # type: ignore[attr-defined]
    noise = singles - np.clip(rows.X[:50], -c, c)
    # No two people share a noise vector (the old release gave all 50 the same one).
    assert len({tuple(np.round(v, 5)) for v in noise}) == 50
    assert abs(np.corrcoef(noise[:-1].ravel(), noise[1:].ravel())[0, 1]) < 0.2
    again = np.vstack([client.released_rows(ctx, rows.subset(rows.ids[i : i + 1])) for i in range(50)])  # type: ignore[attr-defined]
    assert np.array_equal(singles, again)  # asking twice gains nothing
    assert np.array_equal(client.released_rows(ctx, rows.subset(rows.ids[:50])), singles)  # type: ignore[attr-defined]
    Session(fed).teardown()


def test_a_scored_row_asked_again_returns_the_same_noised_activation() -> None:
    method = get_method("splitnn")(**{**_settings("splitnn"), "activation_noise": NOISE})
    data = data_for("splitnn")
    fed, nodes = fitted(method, data)
    ids = data.test_ids[:10]
    first = fed.score_together("split.activations", ids, ["pas"], extra={"purpose": "serve"})["pas"]["acts"]
    second = fed.score_together("split.activations", ids, ["pas"], extra={"purpose": "serve"})["pas"]["acts"]
    assert np.array_equal(first, second)  # type: ignore[arg-type]
    spent = nodes["pas"].privacy
    assert spent.people > 0 and spent.epsilon() > 0
    Session(fed).teardown()


def test_releases_past_a_partys_own_budget_are_refused_naming_the_budget() -> None:
    """Two epochs of activations at σ = 1 spend more than ε = 2 (one release alone is ε 6.1 at δ 1e-5 for
    μ = 2): the lab's own budget refuses the run at setup, from its plan, before any release; a release past the
    budget that no plan announced (a coordinator asking for one more) is refused when it comes."""
    method = get_method("splitnn")(**{**_settings("splitnn"), "activation_noise": NOISE})
    fed, nodes = build_federation(data_for("splitnn"), method, seed=0)
    # A budget that bounds what the method noises (protect = false).
    nodes["pas"].privacy = PrivacyAccount("pas", PrivacyBudget(epsilon=2.0, protect=False))
    with pytest.raises(RemoteError, match=r"refuses splitnn at setup.*past its budget ε = 2 \(\[privacy\] epsilon"):
        Session(fed).start(method)
    account = PrivacyAccount("pas", PrivacyBudget(epsilon=2.0, protect=False))
    with pytest.raises(PrivacyBudgetError, match=r"refuses to release activations.*past its budget ε = 2"):
        NOISE.release(np.ones((3, 2)), np.random.default_rng(0), account, np.array(["a", "b", "c"]),
                      what="activations")


def test_the_accountant_counts_each_release_and_skips_repeats() -> None:
    account = PrivacyAccount("lab", PrivacyBudget(epsilon=50.0))
    noise, ids, rows = RowNoise(b"0123456789abcdef"), np.array(["a", "b"]), np.ones((2, 3))
    NOISE.release_rows(rows, ids, noise, account)
    once = account.epsilon()
    NOISE.release_rows(rows, ids, noise, account)  # the same rows again: the same release, no new spending
    assert account.epsilon() == once == NOISE.epsilon(releases=1)
    NOISE.release_rows(-rows, ids, noise, account)  # new values: a second release, composed
    assert account.epsilon() == pytest.approx(NOISE.epsilon(releases=2))


def test_replacing_one_row_moves_only_that_release_by_at_most_2c_given_a_fixed_model() -> None:
    """The sensitivity the accountant assumes (2C per released row), checked on the mechanism itself."""
    rng = np.random.default_rng(0)
    rows = rng.normal(0, 3, size=(40, 5))
    other = rows.copy()
    other[7] = rng.normal(0, 30, size=5)
    before, after = NOISE.clipped(rows), NOISE.clipped(other)
    moved = np.linalg.norm(after - before, axis=1)
    assert np.all(moved[np.arange(40) != 7] == 0) and moved[7] <= 2 * NOISE.clip + 1e-12


def test_an_encoder_fitted_on_every_row_moves_every_release_so_epsilon_says_what_it_covers() -> None:
    """Replacing one passive row and fitting APC-VFL's encoder again moves every other person's latent as well:
    the 2C bound holds only given a fixed encoder, and the results say so."""
    name = "apc_vfl"
    method = get_method(name)(**{**_settings(name), "noise": NOISE})
    data = data_for(name)
    changed = dataclasses.replace(data, train=dict(data.train))
    lab = data.train["pas"]
    X = lab.X.copy()
    X[0] = X[0] * -5.0
    changed.train["pas"] = dataclasses.replace(lab, X=X)

    def latents(d: FederatedData) -> np.ndarray:
        quiet = get_method(name)(**_settings(name))
        seen: list[Message] = []
        fitted(quiet, d, seed=1, seen=seen)
        return np.asarray(next(m.payload["z"] for m in seen if m.kind == "apc.encode_aligned" and "z" in m.payload))

    a, b = latents(data), latents(changed)
    others = np.linalg.norm((a - b)[1:], axis=1)
    assert others.sum() > 2 * NOISE.clip  # the whole upload moved: more than one row's 2C
    fitted(method, data)
    assert "fixed encoder" in method.epsilon_scope() and "epsilon_features" in method.summary_stats()


# -- over gRPC with mutual TLS: parties without a seed of their own draw from the operating system ----------------


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("certs")
    init_certs(directory, ["act", "pas", "server", "dealer"])
    return directory


def _received_by(party: Any) -> list[Message]:
    """Every request a party's node handled and every reply its own requests got: what that party saw (its own
    view, as an attacker)."""
    seen: list[Message] = []
    node, transport = party.node, party.transport
    handle, deliver = node.handle, transport._deliver

    def spy(message: Message) -> Message:
        seen.append(message)
        return handle(message)

    def spy_replies(messages: Any) -> list[Message]:
        replies = deliver(messages)
        seen.extend(replies)
        return replies

    node.handle = spy
    transport._deliver = spy_replies
    return seen


def _grpc_run(certs: Path, name: str, data: FederatedData, run_seed: int) -> tuple[list[Message], list[Message]]:
    """One run of ``name`` over gRPC + mTLS, the lab, server and dealer served in threads with no seed of their
    own (the default: the OS's randomness); what the server saw, and what the lab saw."""
    tls = TLSConfig(dir=str(certs))
    dummy = DataConfig(file="unused", id_column="id")
    helpers = {"server": "server", "dealer": "dealer"}
    running = {}
    try:
        for party, role in {"pas": "passive", **helpers}.items():
            peers = {n: PeerEntry(address="x", role=r) for n, r in  # type: ignore[misc]
                     {"act": "active", "pas": "passive", **helpers}.items() if n != party}
            config = PartyConfig(name=party, role=role, listen="127.0.0.1:0",  # type: ignore[arg-type]
                                 data=dummy if party == "pas" else None, tls=tls, peers=peers)
            running[party] = start_party(config, data=data.train.get(party), serve=data.serve.get(party))
        for party, run in running.items():
            run.transport.peers.update({n: r.server.address for n, r in running.items()  # type: ignore[union-attr]
                                        if n != party})
        deploy = DeployConfig(
            active=PartyConfig(name="act", role="active", listen="127.0.0.1:0", data=dummy, tls=tls),
            parties=tuple(PeerConfig(name=n, role=r, address=running[n].server.address)  # type: ignore[arg-type,union-attr]
                          for n, r in {"pas": "passive", **helpers}.items()))
        test = PartyData(party="act", ids=data.test_ids, X=data.serve["act"].subset(data.test_ids).X,
                         columns=data.serve["act"].columns, y=data.test_y)
        dep = Deployment(deploy, train=data.train["act"], test=test)
        for run in running.values():
            run.transport.peers["act"] = dep.party.server.address  # type: ignore[union-attr]
        server_view, lab_view = _received_by(running["server"]), _received_by(running["pas"])
        try:
            dep.run(quick(name), seed=run_seed)
        finally:
            dep.close()
        return server_view, lab_view
    finally:
        for run in running.values():
            run.stop()


def test_over_grpc_a_semi_honest_server_cannot_replay_a_clients_projection(certs: Path) -> None:
    """RAP over gRPC + mTLS: the server reads the run seed from its own setup message, redraws the lab's
    projection as the lab once drew it, and inverts the rows it received: nothing comes back. A second run with
    the same run seed and a restarted lab (a new secret) sends other rows: nothing public decides them."""
    data = data_for("rap")
    views = [_grpc_run(certs, "rap", data, run_seed=5)[0] for _ in range(2)]
    uploads = [next(m.payload["x"] for m in v if m.kind == "rap.project" and "x" in m.payload) for v in views]
    setup = next(m for m in views[0] if m.kind == "control.setup")
    assert int(setup.payload["seed"]) == 5  # type: ignore[arg-type]
    assert not np.allclose(uploads[0], uploads[1])  # type: ignore[arg-type]
    lab = data.train["pas"]
    guess = ClientTransform.fit(lab, numpy_rng(5, "pas", "rap-projection"), other=False, pseudo=False)
    x = np.asarray(uploads[0])
    recovered = x[:, : guess.A.shape[1]] @ np.linalg.pinv(guess.A)
    truth = lab.subset(np.sort(lab.ids)[: len(x)]).X
    assert np.abs(recovered - truth).mean() > 0.3


def test_over_grpc_the_server_cannot_recompute_the_dealers_masks(certs: Path) -> None:
    """FedSVD over gRPC + mTLS: the masks the lab got from the dealer are not what the run seed (which the
    server was sent) redraws, and a restarted dealer deals others for the same run seed."""
    data = data_for("fedsvd")
    masks = []
    for _ in range(2):
        _server_view, lab_view = _grpc_run(certs, "fedsvd", data, run_seed=5)
        got = next(m for m in lab_view if m.kind == "svd.masks")
        masks.append(OrthogonalMask.from_payload(got.payload, "p").dense())
    assert not np.allclose(masks[0], masks[1], atol=1e-3)
    settings = quick("fedsvd").svd_settings()  # type: ignore[attr-defined]
    replayed = OrthogonalMask.random(len(masks[0]), settings.row_block, numpy_rng(5, "dealer", "svd-masks"))
    assert not np.allclose(replayed.dense(), masks[0], atol=1e-3)
