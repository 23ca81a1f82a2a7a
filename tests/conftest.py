"""Shared fixtures: small seeded synthetic data, and scenarios built from it."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from vflo.data.datasets import Dataset
from vflo.data.layout import FederatedData
from vflo.data.scenario import BlockSpec, PartySpec, SamplesSpec, ScenarioSpec
from vflo.seeding import derive_seed

REPO = Path(__file__).resolve().parents[1]


class _PartySeeds(Mapping[str, int]):
    """Each party's own seed in tests, by name: what a deployed party's own config holds (``seed = ...``) and what
    the in-process run of the same experiment is handed (``run_method(..., party_seeds=PARTY_SEEDS)``), so the
    two draw the same secret numbers. Any name has one."""

    def __getitem__(self, name: str) -> int:
        return derive_seed(20261124, "test-party-seed", name)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str)

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


PARTY_SEEDS: Mapping[str, int] = _PartySeeds()


def own_sections(proposals: Sequence[Any], role: str = "passive") -> dict[str, dict[str, Any]]:
    """A party's own ``[methods.NAME]`` sections set as the experiment's ``proposals`` set them (the first entry
    of each method), as an export writes them."""
    from vflo.methods.own_settings import party_section

    out: dict[str, dict[str, Any]] = {}
    for method in proposals:
        out.setdefault(method.name, party_section(type(method), role, method.config_json()))
    return out


def make_dataset(
    n: int = 300, n_features: int = 8, n_classes: int = 2, seed: int = 0, task: str | None = None,
) -> Dataset:
    """A seeded classification (or regression) table where every feature carries some signal."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, n_features))
    w = rng.normal(size=(n_features, max(n_classes, 1)))
    logits = X @ w + 0.3 * rng.normal(size=(n, max(n_classes, 1)))
    if task == "regression":
        y = logits[:, 0].astype(np.float64)
        kind, classes = "regression", None
    else:
        y = logits.argmax(axis=1).astype(np.int64)
        kind, classes = ("binary" if n_classes == 2 else "multiclass"), n_classes
    columns = [f"f{i}" for i in range(n_features)]
    return Dataset(
        name="synthetic", X=pd.DataFrame(X, columns=columns), y=y, ids=np.arange(1000, 1000 + n, dtype=np.int64),
        task=kind, n_classes=classes, standin=False, source="test data",  # type: ignore[arg-type]
    )


def two_party_spec(active_cols: int = 3, active: int | float | None = None, aligned: int | float = 1.0,
                   passive_only: int | float = 0) -> ScenarioSpec:
    """An active party with the first ``active_cols`` features, a passive party with the rest."""
    return ScenarioSpec(
        parties=(
            PartySpec(name="act", role="active", columns=tuple(f"f{i}" for i in range(active_cols))),
            PartySpec(name="pas", role="passive", columns="rest"),
        ),
        samples=SamplesSpec(active=active, aligned=aligned, passive_only=passive_only),
    )



def vertical_split(test_rows: int) -> FederatedData:
    """The two-party split the transport, PSI and process tests share: 300 rows of 6 features, 200 aligned, the
    first ``test_rows`` aligned IDs held out."""
    layout = two_party_spec(active=300, aligned=200).build(make_dataset(n=300, n_features=6), seed=0)
    return layout.materialize(test_ids=np.sort(layout.aligned_ids())[:test_rows])

def chain_data() -> FederatedData:
    """Active a, first hop p1 (overlaps a and p2), second hop p2 (overlaps p1 only): VFL-ASP's topology."""
    ds = make_dataset(n=400, n_features=9)
    spec = ScenarioSpec(parties=(PartySpec(name="p2", share=1.0), PartySpec(name="p1", share=1.0),
                                 PartySpec(name="a", role="active", share=1.0)),
                        samples=SamplesSpec(layout="blocks", blocks=(
                            BlockSpec(parties=("p1", "p2"), rows=120), BlockSpec(parties=("p1", "a"), rows=160),
                            BlockSpec(parties=("a",), rows=120))))
    layout = spec.build(ds, seed=0)
    return layout.materialize(test_ids=np.sort(layout.aligned_ids())[:40])


def assert_same_run(deployed: Any, local: Any) -> None:
    """A run across processes (gRPC, Flower) against the same run in one process: scores within 1e-6 (PyTorch's
    threaded kernels may differ in the last bits), the same messages, bytes and rounds, in all and in training
    (every party's own record of it, not only the coordinator's), the same alignment, nothing unanswered."""
    assert np.allclose(deployed.scores, local.scores, rtol=0, atol=1e-6)
    for a, b in ((deployed.ledger.summary(), local.ledger.summary()), (deployed.fit_summary, local.fit_summary)):
        assert (a.messages, a.bytes, a.rounds) == (b.messages, b.bytes, b.rounds)
        assert (a.align_bytes, a.align_rounds) == (b.align_bytes, b.align_rounds)
        assert a.unanswered == 0


@pytest.fixture
def dataset() -> Dataset:
    return make_dataset()


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The data directory the README's test command points at (``../shared/datasets``)."""
    env = os.environ.get("VFLO_DATA_DIR")
    path = Path(env) if env else REPO.parent / "shared" / "datasets"
    if not (path / "SHA256SUMS").is_file() and not any(path.glob("*.csv*")):
        pytest.fail(f"data directory {path} has no dataset files; set VFLO_DATA_DIR to ../shared/datasets")
    return path
