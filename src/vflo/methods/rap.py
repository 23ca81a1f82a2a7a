"""RAP (Zhang et al.): one round of Gaussian-projected features, then a server trains alone."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np

from vflo.align.plain import SELECTOR, selected_ids
from vflo.comm.message import IDS, INT, NAMES, STR, ArraySpec, Fields, Payload, Value, expect_rows
from vflo.data.partydata import PartyData
from vflo.dp import GaussianNoise, RowNoise, laplace_epsilon
from vflo.errors import ConfigError, DataError, MethodError, ProtocolError, RefusedError, RemoteError
from vflo.methods.base import Claim, Method, MethodConfig, State, handles, need, prefixed, reveals, unprefixed
from vflo.methods.saved import INTEGER, PARTY_NAMES, TEXT, At, Built, Part, Saved, Saves
from vflo.nn.estimators import Estimator, EstimatorConfig, make_estimator, training_stats
from vflo.nn.train import TrainConfig
from vflo.roles import PartyInfo
from vflo.seeding import derive_seed, own_seed

if TYPE_CHECKING:
    from vflo.party.context import NodeContext
    from vflo.party.port import Federation

logger = logging.getLogger(__name__)

SERVER = "server"
MATRIX = ArraySpec(("float32",), (None, None))
LABELS = ArraySpec(("int64", "float32"), (None, None))
LENGTHS = ArraySpec(("int64",), (None,))
CHUNK = 100_000


@dataclass(frozen=True, kw_only=True)
class RAPConfig(MethodConfig):
    """The server's model (``estimator``: an MLP with one hidden layer of 128 by default, or
    ``model = 'logistic'`` / ``'linear'``), RAP's convergence rule, an optional learning-rate grid
    (chosen on the server's validation split), and how unseen categories are handled at serving."""

    # The server's validation loss is on the hidden labels (each class one of two server classes drawn per person,
    # or y mixed with a pseudo label), and what a network can memorise of them on a small table (which of the two,
    # the pseudo label's noise) is what decoding throws away: that loss rises from the first epoch while the decoded
    # prediction improves, so on a small table its best epoch is an untrained network. The last epoch is kept
    # (restore_best off); the plateau rule still decides when to stop.
    estimator: EstimatorConfig = field(default_factory=lambda: EstimatorConfig(
        model="mlp", hidden=(128,), train=TrainConfig(lr=1e-3, batch_size=512, max_epochs=200, patience=5,
                                                      validation_fraction=0.125, stop="plateau", plateau=1e-4,
                                                      restore_best=False)))
    lr_grid: tuple[float, ...] = ()
    unseen: Literal["error", "other"] = "error"
    one_feature_pseudo: bool = True
    # A Gaussian matrix's condition number is heavy-tailed (median about 3.4 x its width); a nearly
    # singular projection squashes a direction that regularised models then cannot recover. Redraw
    # until the condition number is at most this many times the width (inf turns the check off; no value
    # below 1 exists, so a party's policy bound such as { max = 10 } cannot be met by switching the check off).
    max_condition: float = 10.0
    # The regression label's 2 x 2 matrix A_Y mixes y with a pseudo label of the same variance. When A_Y is
    # badly conditioned, y's share of both server targets can be a few per cent, the two regressors learn
    # noise, and decoding with A_Y^-1 amplifies their errors (RMSE 297 against 91 on the WOC stand-in at
    # condition number 30). Redraw until cond(A_Y) is at most this (absolute, not times the width; inf: off).
    label_max_condition: float = 2.0
    # Regression: the paper trains two models, one per column of [y, y_p] A_Y ("two"). By default one
    # network with two outputs (a shared hidden layer) learns both: it costs what Centralized's model
    # costs instead of twice that, at the same RMSE.
    label_models: Literal["one", "two"] = "one"
    # The pseudo label y_p ~ N(mean y, (scale x std y)^2). The paper's 1 makes y and y_p alike, so the server
    # cannot tell which mixture of its two targets is the label; on nearly noise-free labels y_p then adds
    # most of each target's variance and costs accuracy (HousePricing stand-in: +6% RMSE). A smaller scale
    # trades some of that hiding for accuracy.
    pseudo_label_scale: float = 1.0
    # The server whitens what it received (PCA on its own training rows) before training. A Gaussian
    # projection's condition number grows with the width (cond <= 10 x width is allowed), and Adam does not
    # undo an ill-conditioned linear map: on the YearPrediction stand-in a 90 x 90 projection alone cost 4%
    # RMSE, and whitening after it recovered Centralized's. No data leaves the server for this.
    whiten: bool = True
    # ... but only with enough rows to estimate the covariance: with few rows per column its smallest
    # eigenvalues come out too small and whitening blows up noise (Breast Cancer, 455 rows x 30 columns:
    # 95.3% accuracy whitened, 97.4% not). Whiten when rows >= this many times the columns.
    whiten_min_rows: int = 100
    # ... and not when a block holds one-hot columns (each client says how many of its encoded columns are
    # one-hot; a count, no values). An indicator's 0/1 scale carries information that whitening, like
    # Centralized's standardisation, erases by blowing rare categories up: on the Covertype stand-in (44
    # indicator columns) an MLP reached 91.4% on the whitened projection, 94.1% on the projection as
    # received, and 91.0% on the standardised original columns. True whitens these as well.
    whiten_one_hot: bool = False
    # Off by default: each client clips and noises every projected row it sends (see vflo.dp).
    noise: GaussianNoise | None = None

    def __post_init__(self) -> None:
        if any(lr <= 0 for lr in self.lr_grid):
            raise ConfigError("lr_grid values must be positive")
        if not self.pseudo_label_scale > 0:
            raise ConfigError(f"pseudo_label_scale must be positive, got {self.pseudo_label_scale}")
        if self.whiten_min_rows < 1:
            raise ConfigError(f"whiten_min_rows must be at least 1, got {self.whiten_min_rows}")
        for name in ("max_condition", "label_max_condition"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and value >= 1):  # NaN fails too
                raise ConfigError(f"{name} must be at least 1 (inf turns the check off), got {value!r}")


def gaussian_matrix(width: int, rng: np.random.Generator, max_condition: float) -> np.ndarray:
    """A width x width matrix of N(0, 1/width) entries, redrawn while its condition number exceeds
    ``max_condition`` x width (about 15% of draws are)."""
    for _ in range(1000):
        A = rng.normal(0.0, 1.0 / np.sqrt(width), size=(width, width))
        if math.isinf(max_condition) or np.linalg.cond(A) <= max_condition * width:
            return A.astype(np.float32)
    raise ConfigError(f"no {width} x {width} Gaussian matrix with condition number <= {max_condition} x {width} in "
                      "1000 draws; raise max_condition")


def whitening(X: np.ndarray, *, rel_tol: float = 1e-6) -> tuple[np.ndarray, np.ndarray]:
    """PCA whitening of the rows of ``X``: (mean, W) with cov((X - mean) W) = I. Directions with variance
    below ``rel_tol`` x the largest (one-hot blocks, constant columns) are dropped, not blown up."""
    mean = X.mean(axis=0, dtype=np.float64)
    cov = np.zeros((X.shape[1], X.shape[1]))
    for start in range(0, len(X), CHUNK):  # in chunks: no float64 copy of a million rows
        block = X[start : start + CHUNK].astype(np.float64) - mean
        cov += block.T @ block
    cov /= max(len(X) - 1, 1)
    values, vectors = np.linalg.eigh(cov)
    keep = values > rel_tol * max(float(values.max()), 1e-300)
    W = vectors[:, keep] / np.sqrt(values[keep])
    return mean.astype(np.float32), W.astype(np.float32)


def whiten(X: np.ndarray, fitted: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    mean, W = fitted
    out: np.ndarray = (X - mean) @ W
    return out.astype(np.float32, copy=False)  # already float32 from float32 inputs: no second copy


def _one_hot_width(categories: list[np.ndarray], other: bool) -> int:
    """Encoded indicator columns: one per category seen at fit time, plus an "other" one if configured."""
    return sum(len(c) + (1 if other else 0) for c in categories)


@dataclass
class ClientTransform:
    """A client's secret: how its columns are encoded, and its Gaussian projection A_m."""

    numeric: list[int]
    categorical: list[int]
    categories: list[np.ndarray]
    other: bool
    pseudo: tuple[float, float] | None
    A: np.ndarray
    columns: tuple[str, ...] = ()

    @classmethod
    def fit(cls, data: PartyData, rng: np.random.Generator, *, other: bool, pseudo: bool,
            max_condition: float = math.inf) -> ClientTransform:
        if data.n_features == 0:
            raise DataError(f"client {data.party!r} holds no feature column; RAP needs at least one per client")
        cat = [data.columns.index(c) for c in data.categorical]
        numeric = [i for i in range(data.n_features) if i not in cat]
        categories = []
        for i in cat:
            seen = np.unique(data.X[:, i])
            if len(seen) < 2:
                raise DataError(
                    f"client {data.party!r}: categorical column {data.columns[i]!r} has a single category; it "
                    "carries no information: drop it"
                )
            categories.append(seen)
        width = len(numeric) + _one_hot_width(categories, other)
        pseudo_stats = None
        if width == 1 and pseudo:
            # One numerical feature: add a pseudo feature ~ N(mean, var) so the server cannot undo a scaling.
            x = data.X[:, numeric[0]].astype(np.float64)
            pseudo_stats = (float(x.mean()), float(x.std() or 1.0))
            width = 2
        A = gaussian_matrix(width, rng, max_condition)
        return cls(numeric=numeric, categorical=cat, categories=categories, other=other, pseudo=pseudo_stats, A=A,
                   columns=data.columns)

    @property
    def width(self) -> int:
        return int(self.A.shape[0])

    def state(self, prefix: str) -> dict[str, Any]:
        """The client's secret transform, for its own model part (never sent anywhere)."""
        out: dict[str, Any] = {prefix + "A": self.A, prefix + "numeric": np.asarray(self.numeric, dtype=np.int64),
                               prefix + "categorical": np.asarray(self.categorical, dtype=np.int64),
                               prefix + "other": self.other,
                               prefix + "columns": np.asarray(list(self.columns), dtype=np.str_)}
        for i, seen in enumerate(self.categories):
            out[f"{prefix}categories.{i}"] = np.asarray(seen, dtype=np.float64)
        if self.pseudo is not None:
            out[prefix + "pseudo"] = np.asarray(self.pseudo, dtype=np.float64)
        return out

    @classmethod
    def from_state(cls, state: Mapping[str, Any], prefix: str) -> ClientTransform:
        categorical = [int(i) for i in np.asarray(need(state, prefix + "categorical"))]
        pseudo = state.get(prefix + "pseudo")
        return cls(numeric=[int(i) for i in np.asarray(need(state, prefix + "numeric"))], categorical=categorical,
                   categories=[np.asarray(need(state, f"{prefix}categories.{i}")) for i in range(len(categorical))],
                   other=bool(need(state, prefix + "other")),
                   pseudo=None if pseudo is None else (float(pseudo[0]), float(pseudo[1])),
                   A=np.asarray(need(state, prefix + "A"), dtype=np.float32),
                   columns=tuple(str(c) for c in np.asarray(need(state, prefix + "columns")).tolist()))

    @property
    def one_hot_width(self) -> int:
        """How many of the encoded columns are one-hot indicators."""
        return _one_hot_width(self.categories, self.other)

    def encode(self, X: np.ndarray, pseudo: np.ndarray | None, columns: tuple[str, ...]) -> np.ndarray:
        """The encoded rows; ``pseudo``: one standard normal per row for the pseudo feature (when it is on)."""
        parts = [X[:, self.numeric].astype(np.float32)]
        for i, seen in zip(self.categorical, self.categories, strict=True):
            codes = X[:, i]
            position = np.searchsorted(seen, codes)
            known = (position < len(seen)) & (seen[np.minimum(position, len(seen) - 1)] == codes)
            if not known.all() and not self.other:
                bad = sorted(set(codes[~known].tolist()))[:5]
                raise DataError(f"column {columns[i]!r} has categories {bad} not seen in training; set "
                                "unseen = 'other' to map them to an extra category")
            onehot = np.zeros((len(X), len(seen) + (1 if self.other else 0)), dtype=np.float32)
            onehot[np.flatnonzero(known), position[known]] = 1.0
            if self.other:
                onehot[np.flatnonzero(~known), len(seen)] = 1.0
            parts.append(onehot)
        if self.pseudo is not None:
            if pseudo is None:
                raise ProtocolError("the pseudo feature needs one standard normal per row")
            parts.append((self.pseudo[0] + self.pseudo[1] * pseudo.reshape(len(X), 1)).astype(np.float32))
        return np.hstack(parts)

    def project(self, data: PartyData, noise: RowNoise) -> np.ndarray:
        """X_m A_m, in chunks so a million rows never need more than a chunk of the encoded matrix. The pseudo
        feature's value of a row is keyed by the party's secret, the ID and the row (``noise``): the same row
        projected again is the same release."""
        if data.columns != self.columns:
            raise DataError(f"client {data.party!r}: rows to project have columns {list(data.columns)[:6]}..., not "
                            f"the {len(self.columns)} columns the transform was fitted on")
        out = np.empty((data.n_samples, self.width), dtype=np.float32)
        for start in range(0, data.n_samples, CHUNK):
            X = data.X[start : start + CHUNK]
            pseudo = noise.normal(data.ids[start : start + CHUNK], X)[0][:, :1] if self.pseudo is not None else None
            block = self.encode(X, pseudo, data.columns)
            out[start : start + CHUNK] = block @ self.A
        return out


def label_matrix(rng: np.random.Generator, max_condition: float) -> np.ndarray:
    """A 2 x 2 N(0, 1) matrix, redrawn while it is nearly singular or its condition number exceeds
    ``max_condition`` (inf: only the singularity check). About 20% of draws have cond <= 2."""
    for _ in range(1000):
        A = rng.normal(size=(2, 2))
        cond = np.linalg.cond(A)
        if abs(np.linalg.det(A)) >= 1e-3 and (math.isinf(max_condition) or cond <= max_condition):
            return A
    raise ConfigError(f"no 2 x 2 label matrix with condition number <= {max_condition} in 1000 draws; "
                      "raise label_max_condition")


@dataclass
class LabelTransform:
    """The label owner's secret: C classes mapped at random to 2C (two per class), or [y, y_p] A_Y."""

    kind: Literal["classes", "projection", "plain"]
    mapping: np.ndarray | None = None   # (C, 2): the two new classes of each class
    A: np.ndarray | None = None         # (2, 2)
    pseudo: tuple[float, float] | None = None

    @classmethod
    def fit(cls, y: np.ndarray, task: str, n_classes: int | None, rng: np.random.Generator, *,
            max_condition: float = 2.0, pseudo_scale: float = 1.0) -> LabelTransform:
        if task == "regression":
            if y.dtype.kind != "f":
                raise DataError("a regression task needs numerical labels, got class codes; check the task")
            return cls(kind="projection", A=label_matrix(rng, max_condition),
                       pseudo=(float(y.mean()), pseudo_scale * float(y.std() or 1.0)))
        if y.dtype.kind == "f":
            raise DataError("a classification task needs class codes 0..C-1, got numerical labels; check the task")
        assert n_classes is not None
        return cls(kind="classes", mapping=rng.permutation(2 * n_classes).reshape(n_classes, 2))

    def state(self, prefix: str = "") -> dict[str, Any]:
        out: dict[str, Any] = {prefix + "kind": self.kind}
        for name in ("mapping", "A"):
            value = getattr(self, name)
            if value is not None:
                out[prefix + name] = value
        if self.pseudo is not None:
            out[prefix + "pseudo"] = np.asarray(self.pseudo, dtype=np.float64)
        return out

    @classmethod
    def from_state(cls, state: Mapping[str, Any], prefix: str = "") -> LabelTransform:
        kind = str(need(state, prefix + "kind"))
        if kind not in ("classes", "projection", "plain"):
            raise MethodError(f"a saved RAP label transform has kind {kind!r}")
        pseudo = state.get(prefix + "pseudo")
        return cls(kind=kind, mapping=state.get(prefix + "mapping"), A=state.get(prefix + "A"),  # type: ignore[arg-type]  # saved arrays or None, as the fields allow
                   pseudo=None if pseudo is None else (float(pseudo[0]), float(pseudo[1])))

    @property
    def server_classes(self) -> int:
        """How many classes the server's model predicts (0 for regression)."""
        if self.mapping is not None:
            return int(self.mapping.size)
        return 0

    def encode(self, y: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        if self.kind == "plain":
            return (y.astype(np.int64) if y.dtype.kind in "iu" else y.astype(np.float32))[:, None]
        if self.kind == "classes":
            assert self.mapping is not None
            pick = rng.integers(0, 2, size=len(y))
            return self.mapping[y.astype(np.int64), pick].astype(np.int64)[:, None]
        assert self.A is not None and self.pseudo is not None
        pseudo = rng.normal(self.pseudo[0], self.pseudo[1], size=len(y))
        projected: np.ndarray = (np.column_stack([y, pseudo]) @ self.A).astype(np.float32)
        return projected

    def decode(self, scores: np.ndarray) -> np.ndarray:
        if self.kind == "plain":
            return scores[:, 0] if scores.shape[1] == 1 and self.mapping is None else scores
        if self.kind == "classes":
            assert self.mapping is not None
            proba: np.ndarray = scores[:, self.mapping[:, 0]] + scores[:, self.mapping[:, 1]]
            normalised: np.ndarray = proba / np.clip(proba.sum(axis=1, keepdims=True), 1e-12, None)
            return normalised
        assert self.A is not None
        values: np.ndarray = (scores.astype(np.float64) @ np.linalg.inv(self.A))[:, 0]
        return values


@dataclass
class RAPPart(Part):
    """A client's secret transform and the state of its exchanges (projected its training rows this run; the
    rows a scoring session opened); at the server, its models on the projected rows, their task and classes,
    and the whitening it applied."""

    transform: ClientTransform | None = None
    projected: bool = False
    scoring: np.ndarray | None = None
    models: list[Estimator] = field(default_factory=list)
    task: str = ""
    n_classes: int | None = None
    whitening: tuple[np.ndarray, np.ndarray] | None = None


def _save_models(models: list[Estimator]) -> State:
    out: State = {"count": len(models)}
    for i, model in enumerate(models):
        out |= prefixed(f"{i}.", model.get_state())
    return out


def _load_models(sub: Mapping[str, Value], at: At) -> list[Estimator]:
    count, part = sub.get("count"), at.target
    if not isinstance(count, int):
        raise MethodError("the server's saved models lack their count")
    kind = "regression" if part.task == "regression" else "multiclass"
    seed = derive_seed(at.where.seed, "rap-server")
    return [make_estimator(at.method.config.estimator, task=kind, n_classes=part.n_classes, seed=seed)  # type: ignore[arg-type]  # RAP's label kinds are estimator tasks
            .set_state(unprefixed(f"{i}.", sub)) for i in range(count)]


def _load_whitening(sub: Mapping[str, Value], at: At) -> tuple[np.ndarray, np.ndarray]:
    mean, W = sub.get("mean"), sub.get("W")
    if not isinstance(mean, np.ndarray) or not isinstance(W, np.ndarray):
        raise MethodError("the server's saved whitening lacks its mean or matrix")
    return mean, W


#: A client's secret projection, its own part (never sent anywhere).
TRANSFORM = Saved("transform", Built(lambda t: t.state(""), lambda sub, at: ClientTransform.from_state(sub, "")),
                  "its projection", optional=True)


class RAP(Method):
    """RAP: Zhang et al., "RAP: Random Projection is What You Need for Vertical Federated Learning".

    Each client m sends X̃_m = T_m(X_m) = [one-hot(X_m), pseudo] A_m once (A_m Gaussian, secret); the
    label owner sends T_Y(Y) (each class mapped at random to one of two of 2C classes, or
    [y, y_p] A_Y for regression). The server then trains alone, min_θ Σ ℓ(f'(x̃; θ), ỹ) on the
    concatenation x̃ = [x̃_1, ..., x̃_M] (two regressors for the two label columns). Serving is
    collaborative: clients project new rows, the server predicts ỹ', the label owner decodes
    T_Y^-1(ỹ'). One round of communication for training.
    """

    name = "rap"
    Config = RAPConfig
    summary = "one round of Gaussian-projected features; the server trains alone (collaborative serving)"
    paper = "Zhang et al., RAP"
    claims: ClassVar[tuple[Claim, ...]] = (
        Claim(text="RAP's claim, close to the centralised model",
              axis="aligned", at="largest", scored="aligned", against="centralized"),
    )
    quick: ClassVar[Mapping[str, Any]] = {
        "estimator": {"model": "mlp", "hidden": [8], "train": {"max_epochs": 2, "patience": 0, "batch_size": 64}}}
    inference = "collaborative"

    # A client's encoding and its secret projection are its own.
    own_settings: ClassVar[Mapping[str, tuple[str, ...]]] = {
        "passive": ("unseen", "one_feature_pseudo", "max_condition")}

    # The label owner keeps its label transform, each client its projection, the server its model.
    saves: ClassVar[Saves] = Saves(
        model=(Saved("labels", Built(lambda t: t.state(""), lambda sub, at: LabelTransform.from_state(sub, "")),
                     "the label transform"),
               Saved("clients", PARTY_NAMES, "who projects"),
               Saved("server_features", INTEGER, "the server's input width")),
        part=RAPPart,
        parts={"active": (TRANSFORM,), "passive": (TRANSFORM,),
               "server": (Saved("task", TEXT, "the task"),
                          Saved("n_classes", INTEGER, "how many classes", optional=True),
                          Saved("models", Built(_save_models, _load_models), "its estimators on projected rows"),
                          Saved("whitening", Built(lambda w: {"mean": w[0], "W": w[1]}, _load_whitening),
                                "the whitening it applied, if any", optional=True))})

    config: RAPConfig

    def extra_parties(self, parties: tuple[PartyInfo, ...]) -> tuple[PartyInfo, ...]:
        return (PartyInfo(SERVER, "server"),)

    # -- clients ----------------------------------------------------------------------------------

    def _transform(self, ctx: NodeContext) -> ClientTransform:
        part = ctx.part(RAPPart)
        if part.transform is None:
            part.transform = ClientTransform.fit(ctx.require_data(), ctx.rng("rap-projection"),
                                                 other=self.config.unseen == "other",
                                                 pseudo=self.config.one_feature_pseudo,
                                                 max_condition=self.config.max_condition)
        return part.transform

    # -- RAP's two variation points: what a client releases of its rows, how the label owner hides its labels. A
    # -- variant (LDP) replaces these, and takes the protocol as it is.

    def released_rows(self, ctx: NodeContext, rows: PartyData) -> np.ndarray:
        """What a client sends of ``rows``: their projection by its secret transform (noised if the config asks)."""
        transform = self._transform(ctx)
        projected = transform.project(rows, ctx.row_noise("rap-pseudo"))
        noise = getattr(self.config, "noise", None)
        if noise is not None:  # a person's projected row: one release, the same again for the same row
            projected = noise.release_rows(projected, rows.ids, ctx.row_noise("rap-upload"), ctx.privacy,
                                           what="projected rows")
        return projected

    @reveals("aligned rows")
    @handles("rap.project",
             served="client: once a run, after alignment (training rows)",
             senders=("server",), carries={"selector": "membership"},
             replies={"x": "masked features", "one_hot": "control"}, selector=SELECTOR)
    def _project(self, ctx: NodeContext, payload: Fields) -> Payload:
        """The one exchange of a client: its projected aligned training rows, to the server, once a run (a server
        asking again could only be fishing: the rows it trains on do not change)."""
        selector = payload.array("selector")
        part = ctx.part(RAPPart)
        if part.projected:
            raise RefusedError(f"party {ctx.party!r} sends its projected training rows once a run; refused")
        part.projected = True
        return {"x": self.released_rows(ctx, ctx.require_data().subset(selected_ids(ctx, selector))),
                "one_hot": self._transform(ctx).one_hot_width}

    @reveals("scoring rows")
    @handles("rap.project_serve",
             served="client: only IDs of a scoring session the label owner opened, each row once",
             senders=("server",), carries={"ids": "ids"}, replies={"x": "masked features"},
             ids=IDS)
    def _project_serve(self, ctx: NodeContext, payload: Fields) -> Payload:
        """Projected rows to score, for the server: only rows of a scoring session the coordinator opened here, each
        once. A refusal never says which of the IDs this party holds."""
        ids = payload.array("ids")
        part = ctx.part(RAPPart)
        opened = part.scoring
        if opened is None or not np.isin(ids, opened).all():
            raise RefusedError(f"party {ctx.party!r} projects rows to score only for a scoring session its coordinator "
                               "opened (rap.open_scoring), each row once; refused")
        part.scoring = opened[~np.isin(opened, ids)]
        rows = ctx.rows("serve")
        if not rows.contains(ids).all():
            raise DataError(f"party {ctx.party!r} holds no sample for some rows of this scoring session")
        return {"x": self.released_rows(ctx, rows.subset(ids))}

    @handles("rap.open_scoring", served="client: after training, from the label owner", carries={"ids": "ids"}, ids=IDS)
    def _open_scoring(self, ctx: NodeContext, payload: Fields) -> Payload:
        """The coordinator names the rows it will score: the only ones the server may then ask this party for."""
        ids = payload.array("ids")
        ctx.part(RAPPart).scoring = ids
        return {}

    # -- server -----------------------------------------------------------------------------------

    def _gather(self, ctx: NodeContext, payload: Fields, kind: str,
                requests: dict[str, Payload]) -> tuple[np.ndarray, int]:
        """The label owner's block followed by every client's, asked for in the same round; and how many
        of the encoded columns behind them are one-hot (training only: serving replies leave it out)."""
        own = payload.array("block")
        blocks = [own]
        one_hot = payload.integer("one_hot") if "one_hot" in payload else 0
        for client, request in requests.items():
            reply = ctx.send(client, kind, request)
            x = expect_rows(reply, "x", party=client, rows=own.shape[0], what="projected rows")
            count = reply.integer("one_hot") if "one_hot" in reply else 0  # serving replies leave it out
            if count < 0:
                raise ProtocolError(f"client {client!r} sent a one-hot column count of {count!r}")
            blocks.append(x)
            one_hot += count
        return np.hstack(blocks).astype(np.float32, copy=False), one_hot

    @handles("rap.train", served="server: once the clients' projections are gathered",
             carries={"block": "masked features", "labels": "transformed labels", "selectors": "membership"},
             replies={"epochs": "control", "features": "control", "stopped_by_rule": "control"},
             block=MATRIX, labels=LABELS, clients=NAMES, selectors=SELECTOR, lengths=LENGTHS,
             task=STR, classes=ArraySpec(("int64",), (1,)), one_hot=INT)
    def _train(self, ctx: NodeContext, payload: Fields) -> Payload:
        clients = payload.names("clients")
        selectors, lengths = payload.array("selectors"), payload.array("lengths")
        cuts = np.cumsum([0, *lengths.tolist()])
        requests: dict[str, Payload] = {
            c: {"selector": selectors[cuts[i] : cuts[i + 1]]} for i, c in enumerate(clients)}
        X, one_hot = self._gather(ctx, payload, "rap.project", requests)
        if self.config.whiten and len(X) >= self.config.whiten_min_rows * X.shape[1]:
            if one_hot and not self.config.whiten_one_hot:
                logger.info("rap server: %d of the encoded columns are one-hot; trained on the projections as "
                            "received, not whitened (whiten_one_hot = true whitens them)", one_hot)
            else:
                fitted = ctx.part(RAPPart).whitening = whitening(X)
                X = whiten(X, fitted)
        elif self.config.whiten:
            logger.info("rap server: %d rows for %d columns, too few to whiten (whiten_min_rows = %d)",
                        len(X), X.shape[1], self.config.whiten_min_rows)
        labels = payload.array("labels")
        task = payload.text("task")
        classes = payload.array("classes")
        if task == "regression" and self.config.label_models == "one":
            models = [self._fit_server(ctx, X, labels.astype(np.float64), "regression", None)]
        elif task == "regression":
            models = [self._fit_server(ctx, X, labels[:, j].astype(np.float64), "regression", None)
                      for j in range(labels.shape[1])]
        else:
            models = [self._fit_server(ctx, X, labels[:, 0], "multiclass", int(classes[0]))]
        part = ctx.part(RAPPart)
        part.models, part.task = models, task
        part.n_classes = None if task == "regression" else int(classes[0])
        stats = [training_stats(m) for m in models]
        # How the server's training ended: what a report needs to say whether the stopping rule fired.
        return {"features": int(X.shape[1]), "epochs": int(max((st.get("epochs", 0) for st in stats), default=0)),
                "stopped_by_rule": all(st.get("stopped_by_rule", 0.0) == 1.0 for st in stats) and bool(stats[0])}

    def _fit_server(self, ctx: NodeContext, X: np.ndarray, y: np.ndarray, task: str, n_classes: int | None) -> Any:
        cfg = self.config.estimator
        grid = self.config.lr_grid
        seed = own_seed(ctx.rng("rap-server"))
        if not grid:
            return make_estimator(cfg, task=task, n_classes=n_classes, seed=seed).fit(X, y)  # type: ignore[arg-type]  # RAP's label kinds are estimator tasks
        best, best_loss = None, float("inf")
        for lr in grid:
            candidate = replace(cfg, train=replace(cfg.train, lr=lr))
            est = make_estimator(candidate, task=task, n_classes=n_classes, seed=seed).fit(X, y)  # type: ignore[arg-type]  # RAP's label kinds are estimator tasks
            history = getattr(est, "history_", None)
            loss = min(history["val_loss"] or history["loss"]) if history is not None else 0.0
            if loss < best_loss:
                best, best_loss = est, loss
        return best

    @handles("rap.predict",
             served="server: after rap.train",
             carries={"block": "masked features", "ids": "ids"}, replies={"scores": "outputs"},
             block=MATRIX, ids=IDS, clients=NAMES)
    def _predict(self, ctx: NodeContext, payload: Fields) -> Payload:
        ids = payload.array("ids")
        clients = payload.names("clients")
        requests: dict[str, Payload] = {c: {"ids": ids} for c in clients}
        X, _ = self._gather(ctx, payload, "rap.project_serve", requests)
        part = ctx.part(RAPPart)
        if part.whitening is not None:
            X = whiten(X, part.whitening)
        models = part.models
        if part.task == "regression":
            scores = np.column_stack([m.predict_scores(X) for m in models])  # (n, 2) from one model or two
        else:
            scores = models[0].predict_scores(X)
        return {"scores": scores.astype(np.float32)}

    # -- label owner (coordinator) ---------------------------------------------------------------------

    def label_transform(self, y: np.ndarray, fed: Federation) -> LabelTransform:
        """How the label owner hides the labels it sends the server (see :meth:`released_rows`)."""
        labels = LabelTransform.fit(y, fed.task, fed.n_classes, fed.rng("rap-labels"),
                                    max_condition=self.config.label_max_condition,
                                    pseudo_scale=self.config.pseudo_label_scale)
        if labels.A is not None:
            logger.debug("rap: label matrix A_Y has condition number %.2f", np.linalg.cond(labels.A))
        return labels

    def _own_block(self, fed: Federation, rows: PartyData) -> np.ndarray:
        if rows.n_features == 0:
            return np.zeros((rows.n_samples, 0), dtype=np.float32)
        return self.released_rows(fed.ctx, rows)

    def fit(self, fed: Federation) -> None:
        data = fed.data
        data.require_labels()
        cfg = self.config
        if fed.task == "regression" and cfg.label_models == "one" and cfg.estimator.model not in ("mlp", "linear"):
            raise ConfigError(f"label_models = 'one' fits both projected regression targets with one model, which "
                              f"needs several outputs ('mlp' or 'linear'), not {cfg.estimator.model!r}; use "
                              "label_models = 'two'")
        clients = fed.names("passive")
        if not clients and data.n_features == 0:
            raise MethodError("rap needs at least one client with features")
        alignment = fed.align(data.ids, clients)
        ids = alignment.ids
        if len(ids) == 0:
            raise MethodError("rap needs rows that every client holds; none are shared")
        y = data.subset(ids).require_labels()
        self.labels_ = self.label_transform(y, fed)
        encoded = self.labels_.encode(y, fed.rng("rap-label-noise"))
        selectors = [alignment.selector(c) for c in clients]
        payload: Payload = {
            "block": self._own_block(fed, data.subset(ids)), "labels": encoded,
            "clients": np.asarray(clients, dtype=np.str_),
            "one_hot": self._transform(fed.ctx).one_hot_width if data.n_features else 0,
            "selectors": np.concatenate(selectors) if selectors else np.empty(0, dtype=bool),
            "lengths": np.array([len(s) for s in selectors], dtype=np.int64),
            "task": "regression" if fed.task == "regression" else "classification",
            "classes": np.array([self.labels_.server_classes or fed.n_classes or 0], dtype=np.int64),
        }
        reply = fed.request(SERVER, "rap.train", payload)
        self.clients_ = clients
        self.client_widths_ = {c: int(alignment.widths.get(c, 0)) for c in clients} | \
            ({fed.party: data.n_features} if data.n_features else {})
        self.n_train_ = len(ids)
        self.server_features_ = reply.integer("features")
        epochs = reply.integer("epochs")
        self.server_stats_ = {"epochs": float(epochs), "stopped_by_rule": float(reply.flag("stopped_by_rule"))} \
            if epochs > 0 else {}

    def summary_stats(self) -> dict[str, float]:
        """How the server's model trained, as its reply said; the ε of a client's person whose projected row
        was sent once (with the config's noise)."""
        noise = getattr(self.config, "noise", None)
        stats = getattr(self, "server_stats_", {})  # a loaded model has none
        return {**stats, **({"epsilon_features": noise.epsilon(releases=1)} if noise else {})}

    def epsilon_scope(self) -> str:
        if getattr(self.config, "noise", None) is None:
            return ""
        return ("ε covers each projected row given the client's fitted encoding (its standardisation and category "
                "sets, fitted on every row, and sent to no one but folded into the projection); counted once per "
                "distinct row sent, training and scoring (a row scored again is the same release); the one-hot "
                "column count goes to the server without noise")

    def subset_refusal(self) -> str:
        return ("the server's one model reads every client's projected block of a person and was trained only on "
                "people every client holds; without a block it has no input to score from. Score people a client "
                "lacks with an active-only fallback (--missing active_only --fallback apc_vfl)")

    def predict(self, fed: Federation, ids: np.ndarray) -> np.ndarray:
        own = self._own_block(fed, fed.serving.subset(ids))
        try:
            fed.broadcast("rap.open_scoring", {"ids": ids}, self.clients_)
            reply = fed.request(SERVER, "rap.predict", {"block": own, "ids": ids,
                                                   "clients": np.asarray(self.clients_, dtype=np.str_)})
        except RemoteError as exc:
            if "holds no sample" not in str(exc):
                raise
            raise MethodError(f"rap serves collaboratively, so every client must hold the rows to score: {exc}. "
                              "Score aligned rows only (test_from = 'aligned')") from exc
        scores = reply.array("scores")
        if len(scores) != len(ids):
            raise ProtocolError("the server's rap.predict reply is malformed")
        return self.labels_.decode(scores.astype(np.float64))


@dataclass(frozen=True, kw_only=True)
class LDPConfig(RAPConfig):
    """``epsilon``: the privacy budget of each feature value (Laplace mechanism on values clipped to
    [-clip, clip] after standardisation). Smaller is more private and noisier."""

    epsilon: float = 1.0
    clip: float = 3.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.epsilon > 0 or not self.clip > 0:
            raise ConfigError("epsilon and clip must be positive")


class LocalDP(RAP):
    """Local differential privacy baseline (as compared in RAP's Table 1): each client clips its
    features to [-c, c] and adds Laplace(2c / ε) noise to every value before the one upload;
    the server trains on the noisy features and the plain labels, min_θ Σ ℓ(f(x + η; θ), y)."""

    name = "ldp"
    Config = LDPConfig
    summary = "clients send Laplace-noised features once (local differential privacy); server trains"
    paper = "baseline in Zhang et al., RAP (Table 1)"

    shared_settings: ClassVar[Mapping[str, tuple[str, ...]]] = {"passive": ("epsilon", "clip")}

    config: LDPConfig

    def released_rows(self, ctx: NodeContext, rows: PartyData) -> np.ndarray:
        if ctx.data is not None and ctx.data.columns != rows.columns:
            raise DataError(f"client {ctx.party!r}: rows to send have a different column set from its training rows")
        c = self.config.clip
        clipped = np.clip(rows.X.astype(np.float64), -c, c)
        # Keyed by the party's secret, the person and the row: one-row releases carry independent noise, and
        # the same row asked again gets the same noise (nothing to average).
        standard, prints = ctx.row_noise("ldp").laplace(rows.ids, clipped)
        ctx.privacy.charge(rows.ids, prints, epsilon=laplace_epsilon(self.config.epsilon, clipped.shape[1]),
                           what="Laplace-noised features")
        return (clipped + 2 * c / self.config.epsilon * standard).astype(np.float32)

    def label_transform(self, y: np.ndarray, fed: Federation) -> LabelTransform:
        return LabelTransform(kind="plain")

    def summary_stats(self) -> dict[str, float]:
        """ε of a client's person whose row was sent once: ``epsilon`` per value, composed over the widest
        client's values (basic composition, exact for Laplace)."""
        width = max(self.client_widths_.values(), default=0)
        return {**super().summary_stats(), "epsilon_per_value": self.config.epsilon,
                "epsilon_features": laplace_epsilon(self.config.epsilon, width)}

    def epsilon_scope(self) -> str:
        return ("ε covers each row's values clipped to [-clip, clip] after the client's standardisation (fitted on "
                "every row without privacy); counted once per distinct row sent, training and scoring (a row sent "
                "again is the same release)")
