"""VFL-ASP: learning from a second-hop party through one-mask federated SVD, embedding approximation,
a split-learning teacher and a distilled student."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np

from vflo.align import plain, psi
from vflo.comm.message import STR, Fields, Payload, Value
from vflo.data.datasets import Task
from vflo.data.partydata import PartyData
from vflo.dp import DPSGD, GaussianNoise, PrivacyPlan
from vflo.errors import ConfigError, MethodError, ProtocolError, RefusedError
from vflo.methods.base import Claim, Inference, Layout, Method, State, handles
from vflo.methods.masked_svd import FedSVDSettings, MaskedSVD
from vflo.methods.saved import INTEGER, At, Built, Part, Saved, Saves, network
from vflo.methods.split_learning import BOTTOM, SplitPart, remote_activations
from vflo.methods.splitnn import SplitNN, SplitNNConfig
from vflo.nn.distill import FittedAutoencoder, fit_autoencoder
from vflo.nn.train import TrainConfig, as_tensor, fit_module

if TYPE_CHECKING:
    import torch
    from torch.nn import functional as F

    from vflo.party.context import NodeContext
    from vflo.party.port import Federation
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
    # Off by default: the first hop trains its embedding encoder by DP-SGD (its own choice); with its bottom's
    # dp_sgd and activation_noise, its account covers everything it sends.
    embedding_dp_sgd: DPSGD | None = None
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
        if self.embedding_dp_sgd is not None and self.dp_sgd is None:
            raise ConfigError("embedding_dp_sgd makes the first hop's encoder private, not the bottom over it whose "
                              "activations it sends: give dp_sgd and activation_noise too")


@dataclass
class ASPPart(Part):
    """The first hop's side: whether it extracted this run, the people it shares with the second hop and their
    embedding, its encoder approximating that embedding from its own columns, and how long each step took."""

    extracting: bool = False
    shared: np.ndarray | None = None
    embeddings: np.ndarray | None = None
    encoder: FittedAutoencoder | None = None
    seconds: dict[str, float] = field(default_factory=dict)


def _save_encoder(encoder: FittedAutoencoder) -> State:
    return {**encoder.state(""), "components": encoder.width}


def _load_encoder(sub: Mapping[str, Value], at: At) -> FittedAutoencoder:
    components = sub.get("components")
    if not isinstance(components, int):
        raise MethodError("the saved embedding encoder lacks its width")
    cfg = at.method.config
    return FittedAutoencoder.from_state({k: v for k, v in sub.items() if k != "components"}, "",
                                        (*cfg.embedding_encoder, components), activation=cfg.embedding_activation)


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
    # The teacher as SplitNN's parts, with the first hop's embedding encoder beside its bottom.
    saves: ClassVar[Saves] = Saves(
        model=(*SplitNN.saves.model, Saved("shared", INTEGER, "the SVD embedding's rows"),
               Saved("components", INTEGER, "and width")),
        part=SplitPart, parts={"passive": (BOTTOM, Saved("encoder", Built(_save_encoder, _load_encoder),
                                                         "first hop: its embedding encoder", optional=True,
                                                         part=ASPPart))})

    # P1's embedding autoencoder runs at P1 alone; the second hop's noise is shared (the reported ε is its).
    own_settings: ClassVar[Mapping[str, tuple[str, ...]]] = {"passive": (
        *SplitNN.own_settings["passive"], "embedding_encoder", "embedding_activation", "embedding_weight",
        "embedding_train", "embedding_dp_sgd")}
    shared_settings: ClassVar[Mapping[str, tuple[str, ...]]] = {"passive": (
        *SplitNN.shared_settings["passive"], "noise")}
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
             replies={"shared": "control", "components": "control"}, second_hop=STR, alignment=STR)
    def _extract(self, ctx: NodeContext, payload: Fields) -> Payload:
        """P1 drives steps 1 and 2: align with P2, get the mask, have both blocks masked, solve, approximate."""
        part = ctx.part(ASPPart)
        if part.extracting:
            raise RefusedError(f"first hop {ctx.party!r} extracts embeddings once a run; refused")
        part.extracting = True
        data = ctx.require_data()
        t0 = time.perf_counter()
        second = payload.text("second_hop")
        ids = np.sort(data.ids)
        # The first hop aligns with the second as the run aligns: by PSI unless the run is plain (in one process,
        # where no ID leaves it); the second hop then learns the shared people only, never this party's others.
        if payload.text("alignment") == "plain":
            reply = ctx.send(second, plain.KIND, {"ids": ids, "purpose": "train"})
            held = reply.array("held")
            if held.shape != (len(ids),) or held.dtype != bool:
                raise ProtocolError(f"party {second!r} answered alignment with a malformed mask")
            shared = ids[held]
        else:
            # A party's context exchanges as a coordinator does (psi.intersect needs exchange() alone).
            found = psi.intersect(ctx, ids, [second], mode="both")
            shared = found.ids
        if len(shared) == 0:
            raise MethodError(f"the first-hop party {ctx.party!r} shares no sample with the second-hop party "
                              f"{second!r}; VFL-ASP needs their overlap to extract embeddings")
        # One row mask, no column masks: the second hop uploads P X of every row it shares with this party.
        svd = self.masked_svd(ctx, ctx, shared, {second: np.ones(len(shared), dtype=bool)}, widths=None,
                              rank=self.config.components)
        E = svd.U * svd.S
        part.shared, part.embeddings = shared, E
        svd_seconds = time.perf_counter() - t0
        targets = np.zeros((data.n_samples, E.shape[1]), dtype=np.float32)
        targets[data.positions(shared)] = E
        cfg = self.config
        dp = cfg.embedding_dp_sgd
        if dp is not None:  # charged for the whole run before it trains, as every DP-SGD run is
            ctx.privacy.charge(data.ids, training=[dp.event(cfg.embedding_train.max_epochs)],
                               what="its embedding encoder's DP-SGD training")
        part.encoder = fit_autoencoder(
            data.X, (*cfg.embedding_encoder, E.shape[1]), activation=cfg.embedding_activation,
            train=cfg.embedding_train, generator=ctx.torch_generator("asp-ae"), rng=ctx.rng("asp-ae"),
            target=targets, target_mask=np.isin(data.ids, shared), weight=cfg.embedding_weight,
            distill="mse", reduction="mean", target_rec_weight=1.0 - cfg.embedding_weight, dp=dp,
            noise_generator=ctx.torch_generator("asp-ae", "dp-sgd") if dp is not None else None)
        part.seconds = {"svd": svd_seconds, "autoencoder": time.perf_counter() - t0 - svd_seconds}
        logger.info("%s: embeddings of %d shared rows in %.2fs (federated SVD), encoder in %.2fs", ctx.party,
                    len(shared), svd_seconds, part.seconds["autoencoder"])
        return {"shared": len(shared), "components": int(E.shape[1])}

    def bottom_input(self, ctx: NodeContext, rows: PartyData) -> np.ndarray:
        encoder = ctx.part(ASPPart).encoder
        if encoder is None:
            raise ProtocolError(f"party {ctx.party!r} has no embedding encoder: it is not VFL-ASP's first hop")
        return encoder.encode(rows.X)

    def _partners(self, fed: Federation) -> list[str]:
        return [self.config.first_hop]

    # -- active party -----------------------------------------------------------------------------

    def check_parties(self, parties: tuple[PartyInfo, ...]) -> None:
        cfg = self.config
        active = next((p.name for p in parties if p.role == "active"), "")
        passives = [p.name for p in parties if p.role == "passive"]
        wrong = [f"{role} = {name!r}" for role, name in (("first_hop", cfg.first_hop), ("second_hop", cfg.second_hop))
                 if name not in passives]
        if not wrong:
            return
        named = " and ".join(wrong)
        if len(passives) < 2:
            having = f"one partner, {passives[0]!r}" if passives else "no partner"
            raise ConfigError(
                f"{self.name} learns from a second-hop party (one that shares people with a partner of "
                f"{active!r} but none with {active!r}) through that partner, and this run has {having}: there is no "
                f"second hop ({named} name no party of it). Leave {self.name} out"
                + (f"; splitnn trains with {passives[0]!r} on the people it shares with {active!r}" if passives
                   else ""))
        raise ConfigError(
            f"{self.name}: {named} name no partner of this run (its partners: "
            f"{', '.join(repr(p) for p in passives)}). In {self.name}'s settings, set first_hop = '...' to the "
            f"partner that shares people with {active!r} and second_hop = '...' to the one that shares people with "
            f"the first hop but none with {active!r}, or leave {self.name} out")

    def fit(self, fed: Federation) -> None:
        cfg = self.config
        self.check_parties(fed.parties)
        if cfg.on_overlap != "skip":
            overlap = len(fed.align(fed.data.ids, [cfg.second_hop]).ids)
            if overlap:
                text = (f"the second-hop party {cfg.second_hop!r} shares {overlap} samples with the active party "
                        f"{fed.party!r}, so the topology is not second-hop")
                if cfg.on_overlap == "error":
                    raise MethodError(text + "; fix the split or set on_overlap = 'warn'")
                logger.warning("%s", text)
        extracted = fed.request(cfg.first_hop, "asp.extract", {"second_hop": cfg.second_hop,
                                                               "alignment": fed.alignment.method})
        self.shared_ = extracted.integer("shared")
        self.components_ = extracted.integer("components")
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
        reply = fed.request(cfg.first_hop, "split.activations", {"ids": ids, "purpose": "train"})
        remote = remote_activations({cfg.first_hop: reply}, [cfg.first_hop], len(ids), self.widths_)
        own = as_tensor(data.subset(ids).X)
        with torch.no_grad():
            soft = torch.softmax(self.top_(torch.cat([self.bottom_(own), *remote], dim=1)), dim=1)
        student = self.student_net(fed)

        def kl(model: torch.nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
            loss: torch.Tensor = F.kl_div(F.log_softmax(model(batch["x"]), dim=1), batch["soft"],
                                          reduction="batchmean")
            return loss

        fit_module(student, kl, {"x": own, "soft": soft}, config=cfg.student_train, rng=fed.rng("asp-student"))
        self.student_ = student
        self.student_rows_ = len(ids)

    def student_net(self, fed: Federation) -> torch.nn.Module:
        """A new student network over the active party's own columns (fit, and a saved model's restore)."""
        from vflo.nn.models import mlp

        return mlp(self.in_dim_, self.config.student_hidden, fed.n_outputs, activation=self.config.activation,
                   generator=fed.torch_generator("asp-student"))

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

    # -- privacy: each hop's side, planned before it runs -------------------------------------------

    def passive_side_is_splitnns(self) -> bool:
        return False  # the first hop also extracts embeddings; the second hop uploads rows: planned here

    def planned_privacy(self, role: str, *, party: str = "") -> PrivacyPlan | None:
        """The second hop's: one noised upload of each shared person's row. The first hop's: its encoder's and its
        bottom's DP-SGD where it trains them, and its activations as SplitNN's (a release a person an epoch, one
        when scored or when the student is taught, keyed alike). The active party's: its labels randomised."""
        cfg = self.config
        if role != "passive":
            return super().planned_privacy(role, party=party)
        if party == cfg.second_hop:
            if cfg.noise is None:
                return None
            return PrivacyPlan(mu=cfg.noise.mu, releases=1, what=f"one upload of each shared person's row at σ = "
                                                                   f"{cfg.noise.noise_multiplier:g}")
        noise, dp, epochs = cfg.activation_noise, cfg.dp_sgd, cfg.train.max_epochs
        if party != cfg.first_hop or noise is None:
            return None
        embedding = cfg.embedding_dp_sgd
        words = [f"DP-SGD of its embedding encoder, {embedding.steps(cfg.embedding_train.max_epochs)} steps at σ = "
                 f"{embedding.noise_multiplier:g}"] if embedding is not None else []
        words += [f"DP-SGD of its bottom, {epochs} batches per person at σ = {dp.noise_multiplier:g}"] \
            if dp is not None else []
        words.append(f"up to {epochs + 1} releases of each person's activations at σ = {noise.noise_multiplier:g}")
        training = ((embedding.event(cfg.embedding_train.max_epochs),) if embedding is not None else ()) + \
            ((dp.within_batches(epochs),) if dp is not None else ())
        return PrivacyPlan(mu=noise.mu, releases=epochs + 1, training=training, what="; ".join(words))

    def protected(self, role: str, scale: float, *, rows: int,
                  party: str = "") -> tuple[VFLASP, PrivacyPlan] | None:
        """The second hop's upload noised at ``scale``; the first hop's encoder and bottom by DP-SGD at ``scale``
        (the encoder's batches of about its training batch size) and its activations noised at twice that."""
        cfg = self.config
        if role != "passive":
            return None  # the active party's labels: its own label_epsilon, checked against its plan
        if party == cfg.second_hop:
            chosen = type(self)(replace(cfg, noise=GaussianNoise(clip=1.0, noise_multiplier=scale)))
            plan = chosen.planned_privacy(role, party=party)
            assert plan is not None
            return chosen, plan
        if party != cfg.first_hop:
            return None
        rate = min(1.0, cfg.embedding_train.batch_size / max(rows, 1))
        found: tuple[VFLASP, PrivacyPlan] = self.calibrated_bottom(
            role, scale, party=party, embedding_dp_sgd=DPSGD(noise_multiplier=scale, max_grad_norm=1.0,
                                                             sample_rate=rate))
        return found

    def unprotectable(self, role: str) -> str:
        return ("sends what no noise it can calibrate covers (only the first and the second hop named in the "
                "proposal have a side to protect)") if role == "passive" else super().unprotectable(role)

    def epsilon_scope(self) -> str:
        return self._with_second_hop(super().epsilon_scope())

    def account_scope(self, role: str) -> str:
        # Both hops are passive: a passive party's account may hold either hop's releases.
        scope = super().account_scope(role)
        return self._with_second_hop(scope) if role == "passive" else scope

    def _with_second_hop(self, scope: str) -> str:
        if self.config.noise is None:
            return scope
        return "; ".join(filter(None, [scope, "second hop: ε covers its rows, clipped and noised once before masking; "
                                       "the first hop's activations and embedding carry no noise"]))


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
    # The student alone, at the active party: the others keep nothing.
    saves: ClassVar[Saves] = Saves(model=(
        Saved("in_dim", INTEGER, "its own width"),
        Saved("student", network(lambda at: at.method.student_net(at.where)), "the network on its own columns")))
    shared_ = components_ = 0  # a loaded student knows nothing of the teacher's embedding
