"""VFL-ASP: learning from a second-hop party through one-mask federated SVD, embedding approximation,
a split-learning teacher and a distilled student."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np

from vflo.align import plain
from vflo.comm.message import STR, Fields, Payload, Value
from vflo.data.datasets import Task
from vflo.data.partydata import PartyData
from vflo.dp import GaussianNoise
from vflo.errors import ConfigError, MethodError, ProtocolError, RefusedError
from vflo.methods.base import Claim, Inference, Layout, Method, State, handles, need
from vflo.methods.masked_svd import FedSVDSettings, MaskedSVD
from vflo.methods.split_learning import remote_activations
from vflo.methods.splitnn import SplitNN, SplitNNConfig
from vflo.nn.distill import FittedAutoencoder, fit_autoencoder
from vflo.nn.train import TrainConfig, as_tensor, fit_module, load_module_state, module_state

if TYPE_CHECKING:
    import torch
    from torch.nn import functional as F

    from vflo.federation.coordinator import Federation
    from vflo.party.node import NodeContext
    from vflo.roles import PartyInfo
else:
    from vflo.lazy import functional as F
    from vflo.lazy import torch

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class VFLASPConfig(SplitNNConfig):
    """VFL-ASP's settings; defaults follow the authors' code (NOTES.md).

    ``first_hop`` overlaps the active party and the second-hop party; ``second_hop`` overlaps only
    the first-hop party. ``components``: singular vectors kept (0 = as many as P1's and P2's columns).
    ``embedding_encoder`` lists the encoder's hidden widths before the latent (the embedding width);
    ``embedding_weight`` is λ in λ·MSE(enc(x), E) + (1 - λ)·MSE(dec(enc(x)), x). The teacher is the split
    network (``passive_bottom``, ``active_bottom``, ``top``, ``train``); the student (``vfl_asp_student``)
    an MLP of ``student_hidden``. ``on_overlap``: what to do if the second-hop party turns out to share
    samples with the active party (checked by an alignment before anything else).
    """

    passive_bottom: tuple[int, ...] = (128, 64, 32)
    active_bottom: tuple[int, ...] = (128, 64, 32)
    top: tuple[int, ...] = (64, 128, 64)
    activation: str = "relu"
    train: TrainConfig = field(default_factory=lambda: TrainConfig(
        lr=0.01, batch_size=50, max_epochs=1000, patience=100, min_delta=1e-4, validation_fraction=0.0))
    first_hop: str = "p1"
    second_hop: str = "p2"
    components: int = 0
    svd: FedSVDSettings = field(default_factory=FedSVDSettings)
    # Off by default: the second hop clips and noises each of its rows before masking its one upload.
    noise: GaussianNoise | None = None
    embedding_encoder: tuple[int, ...] = (32, 64, 128)
    embedding_activation: str = "leaky_relu"
    embedding_weight: float = 0.9
    embedding_train: TrainConfig = field(default_factory=lambda: TrainConfig(lr=1e-3, batch_size=64))
    student_hidden: tuple[int, ...] = (128, 64, 32)
    student_train: TrainConfig = field(default_factory=lambda: TrainConfig(
        lr=0.01, batch_size=50, max_epochs=1000, patience=100, min_delta=1e-4, validation_fraction=0.0))
    on_overlap: Literal["error", "warn", "skip"] = "error"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.embedding_weight <= 1.0:
            raise ConfigError(f"embedding_weight (λ) must be in [0, 1], got {self.embedding_weight}")
        if self.components < 0:
            raise ConfigError("components must be 0 (all) or positive")
        if self.first_hop == self.second_hop:
            raise ConfigError("first_hop and second_hop must name two different parties")


class VFLASP(MaskedSVD, SplitNN):
    """VFL-ASP: "Vertical Federated Learning Across Second-hop Parties" (four modules).

    1. Embedding extraction: a dealer hands one orthogonal mask P to the first-hop party P1 and the
       second-hop party P2; each sends P X_i of their shared rows to a server, which takes the SVD of
       [P X_P1, P X_P2] = U^ε Σ V^T and returns U^ε, Σ to P1; P1 gets E = P^T U^ε Σ (= U Σ of the joined rows).
    2. Embedding approximation at P1: an autoencoder on all of P1's rows with
       L = λ·MSE(enc(x), E) + (1 - λ)·MSE(dec(enc(x)), x) where E exists, MSE(dec(enc(x)), x) elsewhere;
       Ê = enc(X_P1∩A).
    3. Teacher: split learning between P1 (on Ê) and the active party, cross-entropy.
    4. Student at the active party: min KL(ỹ_teacher ‖ S(x_A)) on the rows the teacher labels; it scores
       rows no other party holds.
    """

    name = "vfl_asp"
    Config = VFLASPConfig
    summary = "second-hop features via one-mask federated SVD and embedding approximation; the teacher scores"
    paper = "VFL-ASP (Vertical Federated Learning Across Second-hop Parties)"
    claims: ClassVar[tuple[Claim, ...]] = (
        Claim(text="VFL-ASP's claim, a second-hop party's features help (SplitNN: the first hop alone)",
              axis="second_hop", at="largest", scored="aligned", against="splitnn"),
    )
    quick: ClassVar[Mapping[str, Any]] = {
        t: {"max_epochs": 2, "patience": 0, "batch_size": 64} for t in ("train", "student_train", "embedding_train")}
    inference: ClassVar[Inference] = "collaborative"
    student: ClassVar[bool] = False

    # P1's embedding autoencoder runs at P1 alone; the second hop's noise is shared (the reported ε is its).
    own_settings: ClassVar[Mapping[str, tuple[str, ...]]] = {"passive": (
        *SplitNN.own_settings["passive"], "embedding_encoder", "embedding_activation", "embedding_weight",
        "embedding_train")}
    shared_settings: ClassVar[Mapping[str, tuple[str, ...]]] = {"passive": (
        *SplitNN.shared_settings["passive"], "noise")}
    # The one-mask SVD keeps no right factors and scores nothing: its exchange, split learning and the extract.
    serves: ClassVar[frozenset[str] | None] = (
        frozenset(MaskedSVD.handler_table()) - {"svd.right", "svd.project"} | frozenset(SplitNN.handler_table())
        | {"asp.extract"})

    config: VFLASPConfig

    @classmethod
    def layout_settings(cls, layout: Layout, *, first_hop: str = "", second_hop: str = "") -> dict[str, Any] | str:
        if layout != "second_hop":
            return "needs a second-hop party, which shares people with a partner but none with the active party"
        return {"first_hop": first_hop, "second_hop": second_hop}

    def svd_settings(self) -> FedSVDSettings:
        return self.config.svd

    def scoring_parties(self, parties: tuple[PartyInfo, ...]) -> list[str]:
        return [] if self.inference == "active_only" else [self.config.first_hop]

    def upload_noise(self) -> GaussianNoise | None:
        return self.config.noise

    def delegates(self) -> frozenset[str]:
        """The first hop aligns with the second hop and drives their masked SVD (its own coordinator there)."""
        return frozenset({self.config.first_hop})

    # -- first-hop party --------------------------------------------------------------------------

    @handles("asp.extract",
             served="first hop: after setup; once a run",
             replies={"shared": "control", "components": "control"}, second_hop=STR)
    def _extract(self, ctx: NodeContext, payload: Fields) -> Payload:
        """P1 drives steps 1 and 2: align with P2, get the mask, have both blocks masked, solve, approximate."""
        if ctx.state.get("asp.extracting"):
            raise RefusedError(f"first hop {ctx.party!r} extracts embeddings once a run; refused")
        ctx.state["asp.extracting"] = True
        data = ctx.require_data()
        t0 = time.perf_counter()
        second = payload.text("second_hop")
        ids = np.sort(data.ids)
        reply = ctx.send(second, plain.KIND, {"ids": ids, "split": "train"})
        held = reply.get("held")
        if not isinstance(held, np.ndarray) or held.shape != (len(ids),):
            raise ProtocolError(f"party {second!r} answered alignment with a malformed mask")
        shared = ids[held]
        if len(shared) == 0:
            raise MethodError(f"the first-hop party {ctx.party!r} shares no sample with the second-hop party "
                              f"{second!r}; VFL-ASP needs their overlap to extract embeddings")
        # One row mask, no column masks: the second hop uploads P X of every row it shares with this party.
        svd = self.masked_svd(ctx, ctx, shared, {second: np.ones(len(shared), dtype=bool)}, widths=None,
                              rank=self.config.components)
        E = svd.U * svd.S
        ctx.state["asp.embeddings"] = (shared, E)
        svd_seconds = time.perf_counter() - t0
        targets = np.zeros((data.n_samples, E.shape[1]), dtype=np.float32)
        targets[data.positions(shared)] = E
        cfg = self.config
        ctx.state["asp.encoder"] = fit_autoencoder(
            data.X, (*cfg.embedding_encoder, E.shape[1]), activation=cfg.embedding_activation,
            train=cfg.embedding_train, generator=ctx.torch_generator("asp-ae"), rng=ctx.rng("asp-ae"),
            target=targets, target_mask=np.isin(data.ids, shared), weight=cfg.embedding_weight,
            distill="mse", reduction="mean", target_rec_weight=1.0 - cfg.embedding_weight)
        ctx.state["asp.seconds"] = {"svd": svd_seconds, "autoencoder": time.perf_counter() - t0 - svd_seconds}
        logger.info("%s: embeddings of %d shared rows in %.2fs (federated SVD), encoder in %.2fs", ctx.party,
                    len(shared), svd_seconds, ctx.state["asp.seconds"]["autoencoder"])
        return {"shared": len(shared), "components": int(E.shape[1])}

    def bottom_input(self, ctx: NodeContext, rows: PartyData) -> np.ndarray:
        encoder = ctx.state.get("asp.encoder")
        if not isinstance(encoder, FittedAutoencoder):
            raise ProtocolError(f"party {ctx.party!r} has no embedding encoder: it is not VFL-ASP's first hop")
        return encoder.encode(rows.X)

    def _partners(self, fed: Federation) -> list[str]:
        return [self.config.first_hop]

    # -- active party -----------------------------------------------------------------------------

    def fit(self, fed: Federation) -> None:
        cfg = self.config
        passives = fed.names("passive")
        for role, name in (("first_hop", cfg.first_hop), ("second_hop", cfg.second_hop)):
            if name not in passives:
                raise ConfigError(f"{role} = {name!r} is not a passive party of this federation ({passives})")
        if cfg.on_overlap != "skip":
            overlap = len(fed.align(fed.data.ids, [cfg.second_hop]).ids)
            if overlap:
                text = (f"the second-hop party {cfg.second_hop!r} shares {overlap} samples with the active party "
                        f"{fed.party!r}, so the topology is not second-hop")
                if cfg.on_overlap == "error":
                    raise MethodError(text + "; fix the split or set on_overlap = 'warn'")
                logger.warning("%s", text)
        extracted = fed.request(cfg.first_hop, "asp.extract", {"second_hop": cfg.second_hop})
        self.shared_ = int(extracted.get("shared", 0))
        self.components_ = int(extracted.get("components", 0))
        if len(fed.align(fed.data.ids, [cfg.first_hop]).ids) == 0:
            raise MethodError(f"the active party shares no sample with the first-hop party {cfg.first_hop!r}; "
                              "the teacher needs their overlap")
        super().fit(fed)
        if self.student:
            self._fit_student(fed)

    def _fit_student(self, fed: Federation) -> None:
        cfg = self.config
        data = fed.data
        ids = fed.align(data.ids, [cfg.first_hop]).ids
        reply = fed.request(cfg.first_hop, "split.activations", {"ids": ids, "split": "train"})
        remote = remote_activations({cfg.first_hop: reply}, [cfg.first_hop], len(ids), self.widths_)
        own = as_tensor(data.subset(ids).X)
        with torch.no_grad():
            soft = torch.softmax(self.top_(torch.cat([self.bottom_(own), *remote], dim=1)), dim=1)
        from vflo.nn.models import mlp

        student = mlp(data.n_features, cfg.student_hidden, fed.n_outputs, activation=cfg.activation,
                      generator=fed.torch_generator("asp-student"))

        def kl(model: torch.nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
            loss: torch.Tensor = F.kl_div(F.log_softmax(model(batch["x"]), dim=1), batch["soft"],
                                          reduction="batchmean")
            return loss

        fit_module(student, kl, {"x": own, "soft": soft}, config=cfg.student_train, rng=fed.rng("asp-student"))
        self.student_ = student
        self.student_rows_ = len(ids)

    def predict(self, fed: Federation, ids: np.ndarray) -> np.ndarray:
        return self.predict_by(fed, ids)[0]

    def predict_by(self, fed: Federation, ids: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        if not self.student:
            return super().predict_by(fed, ids)
        with torch.no_grad():
            out = torch.softmax(self.student_(as_tensor(fed.serving.subset(ids).X)), dim=1)
        result: np.ndarray = out.double().numpy()
        return result, {}

    def subset_refusal(self) -> str:
        # The teacher scores with the first hop it trained beside, always; the student needs no one.
        return Method.subset_refusal(self)

    def summary_stats(self) -> dict[str, float]:
        noise = {"epsilon_second_hop": self.config.noise.epsilon(releases=1)} if self.config.noise else {}
        return {"second_hop_shared": float(self.shared_), "components": float(self.components_),
                **super().summary_stats(), **noise}

    def epsilon_scope(self) -> str:
        scope = super().epsilon_scope()
        if self.config.noise is not None:
            scope = "; ".join(filter(None, [scope, "second hop: ε covers its rows, clipped and noised once before "
                                            "masking; the first hop's activations and embedding carry no noise"]))
        return scope

    # -- saving: the teacher as SplitNN's parts, P1's embedding encoder with P1's bottom; the student alone ----

    def coordinator_state(self, fed: Federation) -> State:
        if self.student:
            return {**module_state(self.student_, "student."), "in_dim": fed.data.n_features}
        return {**super().coordinator_state(fed), "shared": self.shared_, "components": self.components_}

    def load_coordinator_state(self, fed: Federation, state: Mapping[str, Value]) -> None:
        if not self.student:
            super().load_coordinator_state(fed, state)
            self.shared_, self.components_ = int(need(state, "shared")), int(need(state, "components"))
            return
        from vflo.nn.models import mlp

        self.student_ = mlp(int(need(state, "in_dim")), self.config.student_hidden, fed.n_outputs,
                            activation=self.config.activation, generator=fed.torch_generator("asp-student"))
        load_module_state(self.student_, state, "student.")
        self.student_.eval()
        self.shared_ = self.components_ = 0

    def party_state(self, ctx: NodeContext) -> State:
        encoder = ctx.state.get("asp.encoder")
        if self.student or not isinstance(encoder, FittedAutoencoder):
            return {}
        return {**super().party_state(ctx), **encoder.state("encoder."),
                "encoder.components": int(ctx.state["asp.embeddings"][1].shape[1])}

    def load_party_state(self, ctx: NodeContext, state: Mapping[str, Value]) -> None:
        if "encoder.components" not in state:
            return
        cfg = self.config
        hidden = (*cfg.embedding_encoder, int(state["encoder.components"]))
        ctx.state["asp.encoder"] = FittedAutoencoder.from_state(
            {k: v for k, v in state.items() if k != "encoder.components"}, "encoder.", hidden,
            activation=cfg.embedding_activation)
        super().load_party_state(ctx, state)


class VFLASPStudent(VFLASP):
    """VFL-ASP's student (its Table 3): all four modules, then the active party's student scores new rows
    from its own features alone, min KL(ỹ_teacher ‖ S(x_A))."""

    name = "vfl_asp_student"
    claims: ClassVar[tuple[Claim, ...]] = (
        Claim(text="VFL-ASP's student against the active party alone, scoring new people",
              axis="second_hop", at="largest", scored="active_only", against="local"),
    )
    summary = "VFL-ASP's distilled student: scores from the active party's features alone"
    inference: ClassVar[Inference] = "active_only"
    student: ClassVar[bool] = True
    # The student learns the teacher's class probabilities (KL); a regression teacher has none to give.
    tasks: ClassVar[frozenset[Task]] = frozenset({"binary", "multiclass"})
