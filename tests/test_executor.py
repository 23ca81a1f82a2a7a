"""A party's bulk work on its executor: a Ray cluster gives the same PSI points and the same scores, bit for bit,
as this host's cores; bad settings are refused with the fix."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch

from vflo.align import psi
from vflo.errors import ConfigError
from vflo.executor import Executor, ExecutorConfig, configure, current


@pytest.fixture(scope="module")
def on_ray() -> Iterator[Executor]:
    pytest.importorskip("ray")
    executor = configure(ExecutorConfig(kind="ray", workers=2))  # a Ray instance of this host alone
    try:
        yield executor
    finally:
        configure(None)


def test_psi_blinding_on_ray_gives_the_points_of_one_local_worker(on_ray: Executor) -> None:
    assert current() is on_ray and on_ray.kind == "ray" and on_ray.workers == 2
    ids = np.array([f"person-{i}" for i in range(psi.PARALLEL_FROM + 7)])  # long enough to leave this process
    salt, key = b"s" * 32, psi.new_key()
    with psi.Blinder(key, size=len(ids)) as blinder:
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
