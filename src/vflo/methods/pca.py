"""PCA upload: each partner sends the principal components of the people it shares, once.

A small one-shot baseline, and the worked example of adding a method (README, "Adding a method"): this module,
one line in the registry and ``tests/test_pca.py``; the common suite (``tests/test_every_method.py``) and the
multi-process equivalence test hold it to what they hold every method to.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from vflo.align.plain import SELECTOR, selected_ids
from vflo.comm.message import IDS, Fields, Payload, expect_rows
from vflo.errors import ConfigError, MethodError, RefusedError
from vflo.methods.base import MethodConfig, handles, reveals
from vflo.methods.representation import CLASSIFIER, RepresentationMethod
from vflo.methods.saved import ARRAY, PARTY_NAMES, Part, Saved, Saves
from vflo.nn.estimators import EstimatorConfig

if TYPE_CHECKING:
    from vflo.party.context import NodeContext
    from vflo.party.port import Federation

__all__ = ["PCAConfig", "PCAUpload"]


@dataclass
class PCAPart(Part):
    """A partner's PCA (its column means and top directions) and whether it sent its components this run."""

    mean: np.ndarray | None = None
    components: np.ndarray | None = None
    uploaded: bool = False


@dataclass(frozen=True, kw_only=True)
class PCAConfig(MethodConfig):
    """``components``: principal components a partner sends per person, its own setting (fewer than its columns,
    so its rows cannot be solved for from what it sends). ``classifier``: the active party's model on its own
    columns beside every partner's components."""

    components: int = 2
    classifier: EstimatorConfig = field(default_factory=EstimatorConfig)

    def __post_init__(self) -> None:
        if self.components < 1:
            raise ConfigError(f"components must be at least 1, got {self.components}")


class PCAUpload(RepresentationMethod):
    """Principal components uploaded once (PCA: Pearson 1901, "On lines and planes of closest fit"; Hotelling
    1933), a one-exchange baseline for vertical federated learning.

    Each partner k fits PCA on every row it holds, shared or not: μ_k and W_k (its top ``components``
    directions) stay with it. Once, it sends z_i^k = (x_i^k - μ_k) W_k for the people it shares with the active
    party, which trains its classifier on its own columns beside them:

        min_θ Σ_{i ∈ aligned} ℓ( f_θ([x_i^A, z_i^1, ..., z_i^K]), y_i )

    To score, each partner sends (x^k - μ_k) W_k of the people asked (collaborative inference).

    What crosses is a linear function of the partner's rows with no noise and no secret randomness: a receiver
    that knows some of a partner's rows can fit μ_k and W_k from them, and then holds ``components`` linear
    combinations of every shared person's features. Fewer components than columns keep the rows themselves from
    being solved for. A baseline, not a private method.
    """

    name = "pca"
    Config = PCAConfig
    summary = "each partner's principal components of the shared people, sent once; classifier at the active party"
    paper = "Pearson 1901, Hotelling 1933 (PCA); a one-exchange baseline"
    inference = "collaborative"
    # How much of its rows a partner releases is its own decision.
    own_settings: ClassVar[Mapping[str, tuple[str, ...]]] = {"passive": ("components",)}
    quick: ClassVar[Mapping[str, Any]] = {}
    saves: ClassVar[Saves] = Saves(
        model=(CLASSIFIER, Saved("passives", PARTY_NAMES, "who sends components"),
               Saved("widths", ARRAY, "how many components each sends")),
        part=PCAPart, parts={"passive": (Saved("mean", ARRAY, "its column means", optional=True),
                                         Saved("components", ARRAY, "its PCA, fitted on every row it holds",
                                               optional=True))})

    config: PCAConfig

    # -- a passive party --------------------------------------------------------------------------------------

    def _fitted(self, ctx: NodeContext) -> tuple[np.ndarray, np.ndarray]:
        part = ctx.part(PCAPart)
        if part.components is None or part.mean is None:
            X = ctx.require_data().X.astype(np.float64)
            k = self.config.components
            if k >= X.shape[1]:
                raise MethodError(
                    f"party {ctx.party!r}: components = {k} is not fewer than its {X.shape[1]} columns, so the "
                    f"active party could solve for its rows; set [methods.pca] components = {max(X.shape[1] - 1, 1)} "
                    "or fewer in its own config" + (" (a one-column party cannot take part)" if X.shape[1] < 2 else ""))
            mean = X.mean(axis=0)
            _, _, vt = np.linalg.svd(X - mean, full_matrices=False)
            part.mean, part.components = mean, vt[:k].T.copy()
        return part.mean, part.components

    def _project(self, ctx: NodeContext, X: np.ndarray) -> np.ndarray:
        mean, W = self._fitted(ctx)
        z: np.ndarray = ((X.astype(np.float64) - mean) @ W).astype(np.float32)
        return z

    @reveals("aligned rows")
    @handles("pca.upload", served="after alignment; once a run: the components of the aligned rows",
             carries={"selector": "membership"}, replies={"z": "outputs"}, selector=SELECTOR)
    def _upload(self, ctx: NodeContext, payload: Fields) -> Payload:
        if ctx.part(PCAPart).uploaded:
            raise RefusedError(f"party {ctx.party!r} sent its components for this run already; refused")
        ids = selected_ids(ctx, payload.array("selector"))
        z = self._project(ctx, ctx.require_data().subset(ids).X)
        ctx.part(PCAPart).uploaded = True
        return {"z": z}

    @reveals("scoring rows")
    @handles("pca.project", served="after pca.upload, or from a saved part: rows to score",
             carries={"ids": "ids"}, replies={"z": "outputs"}, ids=IDS)
    def _project_serve(self, ctx: NodeContext, payload: Fields) -> Payload:
        if ctx.part(PCAPart).components is None:
            raise RefusedError(f"party {ctx.party!r} has no fitted components (pca.upload comes first); refused")
        return {"z": self._project(ctx, ctx.rows("serve").subset(payload.array("ids")).X)}

    # -- the active party -------------------------------------------------------------------------------------

    def fit_representation(self, fed: Federation) -> tuple[np.ndarray, np.ndarray]:
        passives = fed.names("passive")
        if not passives:
            raise MethodError("pca needs at least one passive party: with the active party alone, use a method "
                              "that scores from its own columns")
        alignment = fed.align(fed.data.ids, passives)
        if len(alignment.ids) == 0:
            raise MethodError(f"no person is shared by the active party and all of {passives}; pca trains on them")
        replies = fed.exchange("pca.upload", {p: {"selector": alignment.selector(p)} for p in passives})
        parts = [expect_rows(replies[p], "z", party=p, rows=len(alignment.ids), what="components") for p in passives]
        self.passives_ = passives
        self.widths_ = np.asarray([part.shape[1] for part in parts], dtype=np.int64)
        return alignment.ids, np.hstack([fed.data.subset(alignment.ids).X, *parts])

    def represent(self, fed: Federation, ids: np.ndarray) -> np.ndarray:
        replies = fed.score_together("pca.project", ids, self.passives_)
        parts = [expect_rows(replies[p], "z", party=p, rows=len(ids), width=int(w), what="components")
                 for p, w in zip(self.passives_, self.widths_, strict=True)]
        return np.hstack([fed.serving.subset(ids).X, *parts])
