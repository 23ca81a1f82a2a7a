"""A party's bulk work on its executor: a Ray cluster gives the same PSI points, SecureBoost sums and scores, bit
for bit, as this host's cores; each party in a process uses its own executor; bad settings are refused with the
fix."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from vflo.align import psi
from vflo.errors import ConfigError
from vflo.executor import Executor, ExecutorConfig, WorkerGroup, configure, current, make, using
from vflo.helpers import HelperError
from vflo.seeding import numpy_rng
from vflo.trees import crypto


@pytest.fixture(scope="module")
def on_ray() -> Iterator[Executor]:
    pytest.importorskip("ray")
    # A Ray instance of this host alone, as a party's own executor: current inside using(), the process's default
    # untouched.
    executor = make(ExecutorConfig(kind="ray", workers=2))
    try:
        yield executor
    finally:
        executor.close()


def test_psi_blinding_on_ray_gives_the_points_of_one_local_worker(on_ray: Executor) -> None:
    assert current() is not on_ray and on_ray.kind == "ray" and on_ray.workers == 2
    ids = np.array([f"person-{i}" for i in range(psi.PARALLEL_FROM + 7)])  # long enough to leave this process
    salt, key = b"s" * 32, psi.new_key()
    with using(on_ray), psi.Blinder(key, size=len(ids)) as blinder:
        assert blinder.workers == 2
        on_cluster = blinder.ids(ids, salt)()
        again = blinder.points(on_cluster)()
    local = psi.blind(psi.hash_ids(ids, salt), key, workers=1)
    assert np.array_equal(on_cluster, local) and np.array_equal(again, psi.blind(local, key, workers=1))


def test_scoring_blocks_on_ray_give_the_numbers_of_one_local_thread(on_ray: Executor) -> None:
    from vflo.blocks import BLOCK
    from vflo.nn.distill import FittedAutoencoder
    from vflo.nn.models import autoencoder
    from vflo.nn.train import History
    from vflo.seeding import numpy_rng, torch_generator

    model = autoencoder(6, (32, 16), activation="selu", generator=torch_generator(0, "ray"))
    X = numpy_rng(0, "rows").normal(size=(3 * BLOCK + 11, 6)).astype(np.float32)
    with using(on_ray):
        on_cluster = FittedAutoencoder(model=model, history=History()).encode(X)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            local = model.encoder(torch.from_numpy(X)).numpy()
    finally:
        torch.set_num_threads(before)
    assert on_cluster.dtype == np.float32 and np.array_equal(on_cluster, local)


def test_bad_executor_settings_are_refused_with_the_fix() -> None:
    with pytest.raises(ConfigError, match="kind = 'ray' too"):
        ExecutorConfig(kind="processes", address="auto")
    with pytest.raises(ConfigError, match="workers must be 0"):
        ExecutorConfig(workers=-1)
    with pytest.raises(ConfigError, match="choose 'processes' or 'ray'"):
        ExecutorConfig(kind="spark")  # type: ignore[arg-type]
    assert configure(ExecutorConfig(workers=3)).workers == 3 and current().kind == "processes"
    configure(None)


class Recording(Executor):
    """This host's cores, counting the worker groups made on it."""

    def __init__(self, workers: int = 0) -> None:
        super().__init__(workers)
        self.groups: list[int] = []

    def group(self, size: int) -> WorkerGroup:
        self.groups.append(size)
        return super().group(size)


def _sums_and_decryption(executor: Executor | None, monkeypatch: pytest.MonkeyPatch) -> tuple[np.ndarray, ...]:
    """A tree's bin sums summed by a partner and decrypted by the label holder, both sides made under
    ``executor`` (None: in this process alone) and used after it is left, shared out (thresholds lowered so
    they are)."""
    monkeypatch.setattr(crypto, "PARALLEL_MIN", 10)
    monkeypatch.setattr(crypto, "PARALLEL_SUMS", 10)
    workers = 1 if executor is None else 3
    with using(executor):
        keys = crypto.new_keys(crypto.HESettings(scheme="ou"), workers=workers)
        side = crypto.PublicSide("ou", keys.public_key, workers=workers)
    try:
        rng = numpy_rng(0, "crypto")
        handle = side.load(keys.dump(keys.encrypt(rng.integers(-1000, 1000, size=(240, 2)))))
        codes = rng.integers(0, 5, size=(240, 3)).astype(np.int8)
        rows = np.sort(rng.choice(240, size=150, replace=False))
        side.share(handle)
        sums = [side.bucket_sums(handle, rows, codes, 5), side.bucket_sums(handle, rows, codes, 5, cumulative=True)]
        return tuple(keys.decrypt_many(sums))
    finally:
        keys.close()
        side.close()


def test_secureboosts_sums_and_decryption_run_on_the_executor_current_where_each_side_is_made(
        monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("heu")
    serial = _sums_and_decryption(None, monkeypatch)
    party = Recording()
    shared = _sums_and_decryption(party, monkeypatch)
    assert party.groups == [2, 2]  # the partner's summers and the label holder's decrypters, 2 each beside this one
    assert all(np.array_equal(a, b) for a, b in zip(serial, shared, strict=True))
    assert serial[0].shape == (15, 2) and np.array_equal(serial[1].reshape(3, 5, 2)[:, -1],
                                                         serial[0].reshape(3, 5, 2).sum(axis=1))


def test_secureboosts_sums_and_decryption_on_ray_equal_those_of_this_process(
        on_ray: Executor, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("heu")
    import vflo.executor

    monkeypatch.setattr(vflo.executor, "SHARE_FROM", 1000)  # the tree's ciphertexts go once into the object store
    assert all(np.array_equal(a, b) for a, b in zip(_sums_and_decryption(None, monkeypatch),
                                                      _sums_and_decryption(on_ray, monkeypatch), strict=True))


def test_each_party_sees_its_own_executor_in_its_handlers_and_the_process_default_outside() -> None:
    """Two fake parties in one process, as in simulation: each handles its messages under its own executor, one
    inside the other's handler (a call in one process) and both at once from two threads."""
    default = current()
    parties = {"a": Executor(workers=2), "b": Executor(workers=3)}
    seen: dict[str, list[int]] = {"a": [], "b": []}
    both_inside = threading.Barrier(2, timeout=30)

    def handle(party: str, *, then: str | None = None, wait: bool = False) -> None:
        with using(parties[party]):
            seen[party].append(current().workers)
            if wait:
                both_inside.wait()
            if then is not None:
                handle(then)
            seen[party].append(current().workers)

    handle("a", then="b")
    assert seen == {"a": [2, 2], "b": [3, 3]} and current() is default
    threads = [threading.Thread(target=handle, args=(p,), kwargs={"wait": True}) for p in parties]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert seen == {"a": [2, 2, 2, 2], "b": [3, 3, 3, 3]} and current() is default
    with using(None):
        assert current() is default


def test_an_executor_runs_registered_calls_only() -> None:
    def unregistered(key: bytes, points: bytes) -> bytes:
        return points

    with pytest.raises(HelperError, match="not a helper call"):
        Executor(workers=2).submit(unregistered, (psi.new_key(),), [bytes(32)], workers=2)
