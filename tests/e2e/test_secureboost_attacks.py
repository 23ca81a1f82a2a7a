"""A deployed SecureBoost partner protects its columns from the label holder that coordinates: over gRPC with
mutual TLS, a coordinator holding the active party's own certificate asks the root's split again and again (the
measured attack that read every person's bin in every column) and gets one answer, then refusals."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import vertical_split
from tests.e2e.conftest import Federation, start_federation, stopped
from tests.e2e.test_attacks import _setup, impostor
from vflo.comm.message import Message
from vflo.methods.registry import get_method
from vflo.methods.secureboost import _pack_asks
from vflo.trees.crypto import HESettings, new_keys, to_wire
from vflo.trees.growth import HistogramAsk

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def partner(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Federation]:
    data = vertical_split(40)
    yield from stopped(start_federation(tmp_path_factory.mktemp("sb"), data, {}, policy=("secureboost",)))


def test_a_deployed_partner_answers_the_roots_split_once(partner: Federation, tmp_path: Path) -> None:
    act = impostor(partner, "act")
    rounds = iter(range(1, 1000))

    def ask(kind: str, payload: dict[str, object]) -> Message:
        return act.request(Message("act", "pas", kind, next(rounds), payload, run="sb-attack"))  # type: ignore[arg-type]

    try:
        config = get_method("secureboost")(he={"scheme": "plaintext"}).config_json()
        setup = act.request(Message("act", "pas", "control.setup", 0,
                                    _setup(config, "secureboost", [["act", "active"], ["pas", "passive"]]),
                                    run="sb-attack"))
        assert setup.error is None, setup.error
        ids = partner.local.train["pas"].ids
        keys = new_keys(HESettings(scheme="plaintext"))
        init = ask("sb.init", {"train_ids": ids, "scheme": "plaintext",
                               "public_key": np.frombuffer(keys.public_key, dtype=np.uint8)})
        assert init.error is None, init.error
        gh = np.ones((len(ids), 2), dtype=np.int64)
        assert ask("sb.gradients", {"tree": 0, "gh": to_wire(keys.dump(keys.encrypt(gh)))}).error is None
        root = ask("sb.histograms", {"tree": 0, **_pack_asks([HistogramAsk(0, np.arange(len(ids)))])})
        assert root.error is None, root.error
        replies = [ask("sb.splits", {"tree": 0, "nodes": np.array([0]), "ties": np.array([1]),
                                     "choices": np.array([choice]), "default_left": np.array([True])})
                   for choice in range(20)]
        assert replies[0].error is None and len(replies[0].payload["left"]) == len(ids)  # type: ignore[arg-type]
        for reply in replies[1:]:
            assert reply.error is not None and reply.error.type == "RefusedError"
            assert "asked again" in reply.error.message and reply.payload == {}
        again = ask("sb.gradients", {"tree": 0, "gh": to_wire(keys.dump(keys.encrypt(gh)))})
        assert again.error is not None and "increasing tree order" in again.error.message
        ask("control.teardown", {})
    finally:
        act.close()
