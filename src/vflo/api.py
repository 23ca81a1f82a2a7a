"""The Python API a data scientist would guess: hold test rows out of the parties' tables, fit, score, evaluate.

    import vflo

    hospital = vflo.PartyData.from_file("hospital.csv", party="hospital", id_column="pid", label_column="outcome")
    lab = vflo.PartyData.from_file("lab.csv", party="lab", id_column="pid")
    split = vflo.hold_out([hospital, lab], test=0.25, seed=0)
    model = vflo.fit("apc_vfl", split, train={"max_epochs": 40})
    print(vflo.evaluate(model, split))

Everything runs in this process, every party a separate node behind the in-process transport, so the
messages, the bytes in the ledger and the party boundary are those of a deployment. Seeds are derived
exactly as an experiment derives them (``derive_seed(seed, "layout" | "method", ...)``), so
``hold_out(..., seed=s)`` and ``fit(..., seed=s)`` give the numbers of the first run of an experiment with
``seed = s`` and the same test settings.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vflo.align.engines import AlignmentConfig
from vflo.align.kept import AlignmentStore
from vflo.comm.ledger import Ledger, LedgerSummary
from vflo.data.layout import Count, FederatedData, Layout
from vflo.data.partydata import PartyData
from vflo.errors import ConfigError
from vflo.experiments.config import ExperimentConfig, load_config, parse_config
from vflo.experiments.protocols import Holdout, TestFrom
from vflo.experiments.runner import ExperimentResult
from vflo.federation.coordinator import Coordinator
from vflo.federation.session import Session
from vflo.federation.simulation import build_federation, give_stores, save_model
from vflo.methods.base import Method
from vflo.methods.registry import get_method
from vflo.metrics import compute_metrics
from vflo.party.node import Node
from vflo.scoring import SavedModel
from vflo.seeding import derive_seed, numpy_rng

__all__ = ["FittedModel", "SavedModel", "evaluate", "fit", "hold_out", "load", "run_experiment", "split"]


def hold_out(
    parties: Sequence[PartyData], *, test: Count = 0.2, test_from: TestFrom = "aligned", seed: int = 0,
    standardize: bool = True, aligned: Count | None = None, stratify: bool = True,
) -> FederatedData:
    """Hold test rows out of every party and standardise each party on its own training rows.

    ``parties``: one table per party; the one with labels is the active party. ``test``: a fraction of
    the candidate rows, or a count. ``test_from``: ``'aligned'`` (rows every party holds: any method
    can score them), ``'active'`` (any row of the active party) or ``'active_only'`` (people only the
    active party has: new people, for active-only models). ``aligned``: keep only that many of the
    shared people (a count, or a fraction), to ask what a smaller overlap would give.
    """
    layout = Layout.from_parties(list(parties), seed=derive_seed(seed, "layout", 0), standardize=standardize,
                                 aligned=aligned)
    cut = Holdout(test_fraction=test, test_from=test_from, stratify=stratify)
    test_ids = cut.splits(layout, numpy_rng(seed, "split", 0))[0].test_ids  # the stream's name keeps old seeds' rows
    return layout.materialize(test_ids=test_ids)


def split(parties: Sequence[PartyData], **kwargs: Any) -> FederatedData:
    """The former name of :func:`hold_out` ("split" also named how columns are dealt and which rows a party
    reads); the same function, with the same numbers for the same seeds."""
    warnings.warn("vflo.split is now vflo.hold_out (the same function and arguments); the old name goes in "
                  "vflo 0.3", DeprecationWarning, stacklevel=2)
    return hold_out(parties, **kwargs)


@dataclass(eq=False)
class FittedModel:
    """A method fitted over an in-process federation that stays up, so :meth:`predict` can still ask the
    other parties for their share where the method scores collaboratively."""

    method: Method
    data: FederatedData
    federation: Coordinator = field(repr=False)
    nodes: Mapping[str, Node] = field(repr=False)
    fit_seconds: float
    fit_entries: int

    @property
    def name(self) -> str:
        return self.method.name

    @property
    def ledger(self) -> Ledger:
        """Every message of training and of each scoring since."""
        return self.federation.transport.ledger

    @property
    def fit_summary(self) -> LedgerSummary:
        return self.ledger.summary(0, self.fit_entries)

    @property
    def psi_engine(self) -> str:
        """Which private set intersection found the shared people in training ("vflo", the PSI library's protocol,
        or "reused": a kept one; empty with plain alignment)."""
        return self.federation.alignment_engine

    @property
    def classes(self) -> tuple[str, ...]:
        """Class names in the order of the score columns (where the labels were text), else empty."""
        return self.data.classes

    def save(self, folder: str | Path, *, label: str | None = None) -> Path:
        """Every party writes its own part under ``folder/LABEL/PARTY`` (LABEL: the method's name by default);
        load it again with :func:`load`."""
        give_stores(self.nodes, self.data, Path(folder))
        card = save_model(Session(self.federation), self.nodes, self.method, self.data, Path(folder), label=label)
        return Path(folder) / card.label

    def predict(self, ids: Sequence[Any] | np.ndarray | None = None, *,
                partners: Sequence[str] | None = None) -> np.ndarray:
        """Scores for ``ids`` (default: the split's test rows): class probabilities (n, C) or values (n,).

        ``partners``: score with these partners only, the others absent as if they did not answer (a method
        that scores with any subset of its partners: LASER-VFL, SecureBoost, SplitNN with party dropout); None,
        every partner."""
        ids = self.data.test_ids if ids is None else np.asarray(ids)
        if len(ids) == 0:
            return np.empty((0,))
        fed = self.federation
        if partners is None:
            scores = self.method.predict(fed, ids)
        else:
            unknown = sorted(set(partners) - set(fed.names()))
            if unknown:
                raise ConfigError(f"partners {unknown} are not among this model's: {fed.names()}")
            why = self.method.subset_refusal()
            if why:
                raise ConfigError(f"{self.method.name} cannot score with a subset of its partners: {why}")
            with fed.scoring_with(partners):
                scores = self.method.predict(fed, ids)
        fed.flush()
        return scores


def fit(
    method: str | Method, data: FederatedData, *, seed: int = 0, alignment: AlignmentConfig | None = None,
    max_message_bytes: int | None = None, alignments: str | Path | None = None, **config: Any,
) -> FittedModel:
    """Fit ``method`` (a registered name with its settings as keyword arguments, or a Method) on ``data``.

    ``alignments``: with PSI (``alignment=AlignmentConfig(method="psi")``), a folder where every party keeps its
    intersections (``alignments/PARTY/``): a later fit on the same people reuses them instead of intersecting
    again (:mod:`vflo.align.kept`; ``model.psi_engine`` says which)."""
    if isinstance(method, str):
        method = get_method(method)(**config)
    elif config:
        raise ConfigError("settings go either into the Method you pass or as keyword arguments with its name, "
                          "not both")
    stores = None
    if alignments is not None:
        stores = {p.name: AlignmentStore(Path(alignments) / p.name, p.name) for p in data.parties}
    fed, nodes = build_federation(data, method, seed=derive_seed(seed, "method", 0, 0),
                                  max_message_bytes=max_message_bytes, alignment=alignment, alignments=stores)
    session = Session(fed)
    session.start(method)
    session.train(method.fit)
    # The run stays open: the model scores and saves over it (FittedModel.predict, .save).
    return FittedModel(method=method, data=data, federation=fed, nodes=nodes, fit_seconds=session.fit_seconds,
                       fit_entries=len(fed.transport.ledger))


def load(folder: str | Path, label: str | None = None) -> SavedModel:
    """A model saved by :meth:`FittedModel.save` or ``vflo run --save``: ``.predict(rows)`` scores new people."""
    return SavedModel.load(folder, label)


def evaluate(model: FittedModel, data: FederatedData | None = None) -> dict[str, float]:
    """Every metric on the split's test rows, with the training traffic from the ledger."""
    data = data if data is not None else model.data
    if data is not model.data:
        raise ConfigError("evaluate a model on the split it was fitted on: its test rows are the ones held out of "
                          "every party's training data")
    metrics = compute_metrics(data.task, data.test_y, model.predict(data.test_ids))
    summary = model.fit_summary
    return {**metrics, "comm_bytes": float(summary.bytes), "comm_rounds": float(summary.rounds),
            "fit_seconds": model.fit_seconds}


def run_experiment(
    config: Mapping[str, Any] | str | Path | ExperimentConfig, *, data_dir: str | Path | None = None,
    base_dir: str | Path | None = None, quick: bool = False, out: str | Path | None = None,
    overwrite: bool = False,
) -> ExperimentResult:
    """Run an experiment given as a TOML file, an already parsed config, or a dict with a TOML file's tables
    (party file paths in a dict are relative to ``base_dir``, default the current folder). With ``out``
    the results, report and plots are written there as ``vflo run`` writes them."""
    from vflo.experiments.output import write_results
    from vflo.experiments.runner import run_experiment as run

    if isinstance(config, ExperimentConfig):
        parsed = config
    elif isinstance(config, str | Path):
        parsed = load_config(config, quick=quick)
    else:
        parsed = parse_config(config, quick=quick, base_dir=base_dir)
    result = run(parsed, data_dir=None if data_dir is None else str(data_dir))
    if out is not None:
        write_results(result, Path(out), overwrite=overwrite)
    return result
