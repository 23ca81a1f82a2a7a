"""FedSVD against numpy's SVD of the joined columns; masks; VFedTrans's five exchanges."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import make_dataset, two_party_spec
from vflo.align.plain import intersect
from vflo.comm.message import Message
from vflo.data.layout import FederatedData
from vflo.data.scenario import PartySpec, SamplesSpec, ScenarioSpec
from vflo.errors import RemoteError
from vflo.federation.session import Session
from vflo.federation.simulation import build_federation, run_method
from vflo.methods.fedsvd import FedSVD
from vflo.methods.masked_svd import SVDPart
from vflo.methods.masks import OrthogonalMask
from vflo.methods.registry import get_method
from vflo.metrics import compute_metrics
from vflo.party.policy import Policy


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 40), block=st.one_of(st.none(), st.integers(1, 50)), seed=st.integers(0, 1000))
def test_masks_are_orthogonal_and_apply_without_forming_them(n: int, block: int | None, seed: int) -> None:
    rng = np.random.default_rng(seed)
    mask = OrthogonalMask.random(n, block, rng)
    dense = mask.dense()
    assert np.allclose(dense @ dense.T, np.eye(n), atol=1e-10)
    X = rng.normal(size=(n, 3))
    assert np.allclose(mask.left(X), dense @ X) and np.allclose(mask.left_t(X), dense.T @ X)
    assert np.allclose(mask.right(X.T), X.T @ dense)
    back = OrthogonalMask.from_payload(mask.to_payload("p"), "p")
    assert np.array_equal(back.dense(), dense)


def _three_party(n: int = 120) -> FederatedData:
    ds = make_dataset(n=n, n_features=9)
    spec = ScenarioSpec(parties=(PartySpec(name="a", role="active", n_columns=2), PartySpec(name="p", n_columns=3),
                                 PartySpec(name="q", n_columns=4)), samples=SamplesSpec(aligned=0.8))
    layout = spec.build(ds, seed=1)
    return layout.materialize(test_ids=np.sort(layout.aligned_ids())[:10])


@pytest.mark.parametrize("mask", ["dense", "block"])
def test_federated_svd_equals_numpy_svd_of_the_joined_columns(mask: str) -> None:
    data = _three_party()
    method = FedSVD(fedsvd={"mask": mask, "block_size": 16})
    seen: list[Message] = []
    fed, nodes = build_federation(data, method, seed=0, observers=(seen.append,))
    for node in nodes.values():  # blocks of 16 rows: below the default policy's 64, so the parties allow them
        node.policy = Policy(min_mask_block=16, alignment="plain")
    Session(fed).start(method)
    alignment = intersect(fed, np.sort(data.train["a"].ids), ["p", "q"])
    result = method.federated_svd(fed, alignment, right=True)
    joined = np.hstack([data.train[n].subset(alignment.ids).X for n in ("a", "p", "q")]).astype(np.float64)
    U, S, Vt = np.linalg.svd(joined, full_matrices=False)
    assert np.allclose(result.S, S, rtol=1e-6)
    signs = np.sign(np.sum(result.U * U, axis=0))
    assert np.allclose(result.U * signs, U, atol=1e-8)
    V = np.vstack([fed.ctx.part(SVDPart).V, nodes["p"].context.part(SVDPart).V,
                   nodes["q"].context.part(SVDPart).V])
    assert np.allclose(V * signs, Vt.T, atol=1e-8)
    # the server only ever sees masked blocks, never a party's raw columns
    to_server = [m for m in seen if m.receiver == "server" and m.kind in ("svd.block", "svd.solve")]
    assert len(to_server) == 3
    for msg in to_server:
        block = msg.payload["block"]
        assert isinstance(block, np.ndarray)
        raw = data.train[msg.sender].subset(alignment.ids).X
        assert block.shape == raw.shape and not np.allclose(block, raw, atol=1e-3)


def test_dense_mask_cost_grows_with_the_square_of_the_rows() -> None:
    costs = {}
    for n in (100, 200):
        ds = make_dataset(n=n, n_features=6)
        layout = two_party_spec(active=n, aligned=n).build(ds, seed=0)
        data = layout.materialize(test_ids=np.sort(layout.ids("act"))[:5])
        out = run_method(get_method("vfedtrans")(fedsvd={"mask": "dense"}, train={"max_epochs": 1}), data, seed=0)
        # the passive party's masks travel as a message; the active party's ride on the deal's reply
        costs[n] = out.ledger.by_kind()["svd.masks"]["request_bytes"]
    # 95 and 195 aligned training rows (5 test rows held out): bytes follow m²
    assert costs[200] / costs[100] == pytest.approx((195 / 95) ** 2, rel=0.02)


def test_block_masks_cost_linear_bytes() -> None:
    ds = make_dataset(n=400, n_features=6)
    layout = two_party_spec(active=400, aligned=400).build(ds, seed=0)
    data = layout.materialize(test_ids=np.sort(layout.ids("act"))[:5])
    dense = run_method(get_method("vfedtrans")(fedsvd={"mask": "dense"}, train={"max_epochs": 1}), data, seed=0)
    block = run_method(get_method("vfedtrans")(fedsvd={"mask": "block", "block_size": 64},
                                               train={"max_epochs": 1}), data, seed=0)
    ratio = block.ledger.by_kind()["svd.masks"]["bytes"] / dense.ledger.by_kind()["svd.masks"]["bytes"]
    # 395 rows: five blocks of 64 and a last one of 75 (the remainder joins the last block, never a tiny one)
    assert ratio == pytest.approx((5 * 64**2 + 75**2) / 395**2, rel=0.05)


def test_vfedtrans_runs_the_five_exchanges_through_the_transport() -> None:
    ds = make_dataset(n=200, n_features=8)
    layout = two_party_spec(active=200, aligned=120).build(ds, seed=0)
    data = layout.materialize(test_ids=np.sort(layout.ids("act"))[:20])
    method = get_method("vfedtrans")(train={"max_epochs": 2})
    out = run_method(method, data, seed=0)
    flows = {(e.sender, e.receiver, e.kind) for e in out.ledger.entries if e.direction == "request" and e.is_method}
    # active -> dealer (its masks come back in the reply), dealer -> passive, active -> passive (upload),
    # passive -> server, active -> server (with the solve request), and the server -> active reply carrying U'
    assert flows == {("act", "dealer", "svd.deal"), ("dealer", "pas", "svd.masks"), ("act", "pas", "svd.upload"),
                     ("pas", "server", "svd.block"), ("act", "server", "svd.solve")}
    replies = [e for e in out.ledger.entries if e.kind == "svd.solve" and e.direction == "reply"]
    assert replies[0].nbytes > 105 * 8 * 8  # U' of the aligned training rows x 8 components, float64
    assert method.latent_width_ == 8
    assert out.scores.shape == (20, 2)


def test_fedsvd_scores_new_rows_as_the_joined_projection() -> None:
    data = _three_party(200)
    method = get_method("fedsvd")()
    out = run_method(method, data, seed=0)
    assert compute_metrics(data.task, data.test_y, out.scores)["accuracy"] > 0.5
    kinds = {e.kind for e in out.ledger.entries if e.is_method}
    assert "svd.project" in kinds


def test_a_dense_mask_over_the_message_limit_says_to_use_blocks() -> None:
    ds = make_dataset(n=300, n_features=6)
    layout = two_party_spec(active=300, aligned=300).build(ds, seed=0)
    data = layout.materialize(test_ids=np.sort(layout.ids("act"))[:5])
    with pytest.raises(RemoteError, match="over the limit.*block-diagonal masks"):
        run_method(get_method("vfedtrans")(fedsvd={"mask": "dense"}), data, seed=0, max_message_bytes=200_000)
