"""A partner keeps scoring sessions of one coordinator open side by side (an A/B test of two saved models served
with partners): each message is answered by the session its run names, as if it were the only one; at most
MAX_SCORING_SESSIONS are kept, the least recently used closed first."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.test_laser_vfl import TRAIN, _blocks
from vflo.api import fit
from vflo.artifacts import PartStore
from vflo.comm.local import LocalTransport
from vflo.errors import RemoteError
from vflo.federation.simulation import party_node
from vflo.methods.registry import get_method
from vflo.party.node import MAX_SCORING_SESSIONS
from vflo.scoring import SavedModel


def test_a_partner_answers_two_scoring_sessions_side_by_side(tmp_path: Path) -> None:
    data, _ = _blocks()
    for label, seed in (("v1", 0), ("v2", 1)):
        fit(get_method("laser_vfl")(train={**TRAIN, "max_epochs": 3}), data, seed=seed).save(tmp_path, label=label)
    models = {label: SavedModel.load(tmp_path, label) for label in ("v1", "v2")}
    parties = models["v1"].parties
    ids = data.test_ids[:40]

    def partners() -> dict[str, object]:
        return {p: party_node(info, None, data.serve[p], peers=parties,
                              store=PartStore(tmp_path, party=p, role=info.role))
                for info in parties if (p := info.name) != data.active}

    def session(label: str, others: dict[str, object]) -> tuple[object, object]:
        active = next(i for i in parties if i.name == data.active)
        own = party_node(active, None, data.serve[data.active], peers=parties,
                         store=PartStore(tmp_path, party=active.name, role="active"))
        return models[label].restore(own, LocalTransport({active.name: own, **others}))  # type: ignore[dict-item]

    alone = {}
    for label in models:
        fed, method = session(label, partners())
        alone[label] = method.predict(fed, ids)
    assert not np.allclose(alone["v1"], alone["v2"])  # two models, two answers
    shared = partners()
    a_fed, a = session("v1", shared)
    b_fed, b = session("v2", shared)  # the partners keep v1's session open beside it
    for _ in range(2):  # interleaved: each session's messages answered by its own model
        assert np.allclose(a.predict(a_fed, ids), alone["v1"], atol=1e-6)  # type: ignore[attr-defined]
        assert np.allclose(b.predict(b_fed, ids), alone["v2"], atol=1e-6)  # type: ignore[attr-defined]
    # More sessions than a partner keeps: the least recently used one (v1's) is closed, and says so.
    for _ in range(MAX_SCORING_SESSIONS - 1):
        session("v2", shared)
    with pytest.raises(RemoteError, match="not to the run this party serves"):
        a.predict(a_fed, ids)  # type: ignore[attr-defined]
