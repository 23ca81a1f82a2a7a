"""APC-VFL (Irureta et al.): local autoencoders, one exchange, distillation at the active party."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np

from vflo.align.plain import SELECTOR, selected_ids
from vflo.blocks import CHUNK
from vflo.comm.message import IDS, Fields, Payload, expect_rows
from vflo.dp import DPSGD, SCOPE_END_TO_END, SCOPE_FIXED_MODEL, GaussianNoise, PrivacyPlan
from vflo.errors import ConfigError, MethodError
from vflo.methods.base import Claim, Inference, MethodConfig, handles, reveals
from vflo.methods.representation import CLASSIFIER, RepresentationMethod
from vflo.methods.saved import PARTY_NAMES, At, Part, Saved, Saves, autoencoder
from vflo.nn.distill import DistillLoss, FittedAutoencoder, Reduction, fit_autoencoder
from vflo.nn.estimators import EstimatorConfig
from vflo.nn.train import TrainConfig
from vflo.party.port import Alignment
from vflo.spill import Rows, RowSink

if TYPE_CHECKING:
    from vflo.party.context import NodeContext
    from vflo.party.port import Federation


#: The largest latent upload in one message (a frame must stay under the transport's limit, 256 MB by default).
UPLOAD_BYTES = 64 << 20


@dataclass(frozen=True, kw_only=True)
class APCVFLConfig(MethodConfig):
    """APC-VFL's settings; defaults from the paper (Table 3 and Appendix B).

    Encoders list hidden widths after the input; the last is the latent. ``active_encoder``
    is g1 at the active party (a -> 64 -> 128), ``passive_encoder`` g1 at each passive party
    (p -> 128 -> 256), ``joint_encoder`` g2 over the concatenated aligned latents (-> 256 -> 256)
    and ``student_encoder`` g3 (a -> 256 -> 256), whose latent must be as wide as g2's.
    ``distill_weight`` is the paper's λ; ``reduction = 'sum'`` takes Eq. 5's norms as written (sums
    over dimensions), ``'mean'`` averages them (weaker distillation by the ratio of widths).
    """

    active_encoder: tuple[int, ...] = (64, 128)
    passive_encoder: tuple[int, ...] = (128, 256)
    joint_encoder: tuple[int, ...] = (256, 256)
    student_encoder: tuple[int, ...] = (256, 256)
    activation: str = "selu"
    distill: DistillLoss = "mse"
    distill_weight: float = 0.01
    reduction: Reduction = "sum"
    overcomplete: bool = True
    payload_dtype: Literal["float32", "float16"] = "float32"
    # Off by default: each passive party clips and noises every latent row it uploads (see vflo.dp).
    noise: GaussianNoise | None = None
    # Off by default: a passive party trains its encoder g1 with DP-SGD (vflo.nn.private), its own choice in its own
    # [methods.apc_vfl]; with noise on the upload too, its account then covers its data end to end.
    dp_sgd: DPSGD | None = None
    train: TrainConfig = field(default_factory=lambda: TrainConfig(batch_size=128, max_epochs=200, patience=10))
    classifier: EstimatorConfig = field(default_factory=EstimatorConfig)

    def __post_init__(self) -> None:
        for name in ("active_encoder", "passive_encoder", "joint_encoder", "student_encoder"):
            widths = getattr(self, name)
            if not widths or min(widths) < 1:
                raise ConfigError(f"{name} needs at least one positive layer width, got {list(widths)}")
        if self.student_encoder[-1] != self.joint_encoder[-1]:
            raise ConfigError(
                f"student_encoder's latent ({self.student_encoder[-1]}) must be as wide as joint_encoder's "
                f"({self.joint_encoder[-1]}): the student is distilled toward the joint latent"
            )
        if self.distill_weight < 0:
            raise ConfigError(f"distill_weight (λ) must be non-negative, got {self.distill_weight}")
        if self.distill not in ("mse", "mae"):
            raise ConfigError(f"distill must be 'mse' or 'mae', got {self.distill!r}")
        if self.dp_sgd is not None and self.noise is None:
            raise ConfigError("dp_sgd makes a passive party's encoder private, not the latents it uploads: each is "
                              "still a function of that person's own row. Give noise too (noise = { clip = ..., "
                              "noise_multiplier = ... }), so the upload is a Gaussian release and the account covers "
                              "both")


@dataclass
class APCPart(Part):
    """A passive party's own encoder g1, trained on every row it holds."""

    g1: FittedAutoencoder | None = None


def _activation(at: At) -> str:
    return str(at.method.config.activation)


class _Stopwatch:
    """Wall time per stage, for the per-stage benchmark."""

    def __init__(self) -> None:
        self.laps: dict[str, float] = {}
        self._t = time.perf_counter()
        # (stage, when it ended on time.perf_counter's clock), from the start: a benchmark's memory samples by stage.
        self.stamps: list[tuple[str, float]] = [("start", self._t)]

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[name] = now - self._t
        self.stamps.append((name, now))
        self._t = now


def _check_overcomplete(who: str, n_features: int, latent: int, enabled: bool) -> None:
    if enabled and latent < n_features:
        raise ConfigError(
            f"{who} has {n_features} features but its encoder's latent is only {latent} wide; APC-VFL uses "
            "overcomplete autoencoders: widen the encoder or set overcomplete = false"
        )


class APCVFL(RepresentationMethod):
    """APC-VFL: Irureta et al., "Towards Active Participant Centric Vertical Federated Learning:
    Some Representations May Be All You Need" (four steps, one exchange).

    1. every party trains a local autoencoder g1 on all of its rows, unsupervised;
    2. each passive party sends g1(X_aligned) to the active party (the only exchange);
    3. the active party trains a joint autoencoder g2 on [g1_A(x), g1_P1(x), ...] of the aligned
       rows and takes its latent z_A as the teacher;
    4. the student g3 is trained on all of the active party's rows with
       L(x_i) = ||x_i - f3(g3(x_i))||² + λ · 1[i aligned] · D(z_A,i, g3(x_i)),  D = MSE or MAE,
       and a classifier (logistic regression) is fitted on g3(X_A).
    Prediction needs the active party's features only.
    """

    name = "apc_vfl"
    Config = APCVFLConfig
    summary = "local autoencoders, one exchange of aligned representations, distilled student at the active party"
    paper = "Irureta et al., APC-VFL"
    claims: ClassVar[tuple[Claim, ...]] = (
        Claim(text="APC-VFL's claim, its active-only model helps people partners never saw",
              axis="aligned", at="smallest", scored="active_only", against="local"),
    )
    quick: ClassVar[Mapping[str, Any]] = {"train": {"max_epochs": 2, "patience": 0, "batch_size": 64}}
    inference: ClassVar[Inference] = "active_only"
    #: How often a person's latent may leave a passive party: at training (scoring is the active party's alone).
    uploads: ClassVar[int] = 1

    # A passive party's encoder g1 is trained at that party alone; the latent's width is what the others rely on.
    own_settings: ClassVar[Mapping[str, tuple[str, ...]]] = {
        "passive": ("passive_encoder", "activation", "train", "reduction", "overcomplete", "dp_sgd")}
    shared_settings: ClassVar[Mapping[str, tuple[str, ...]]] = {"passive": ("noise", "payload_dtype")}
    saves: ClassVar[Saves] = Saves(model=(
        Saved("g3", autoencoder(lambda at: at.method.config.student_encoder, _activation),
              "the encoder distilled onto its own columns", attr="student_"), CLASSIFIER))

    config: APCVFLConfig

    def planned_privacy(self, role: str, *, party: str = "") -> PrivacyPlan | None:
        """A passive party's: its encoder's DP-SGD run (where it trains one) and one upload of each person's latent."""
        noise, dp = self.config.noise, self.config.dp_sgd
        if role != "passive" or (noise is None and dp is None):
            return None
        training = () if dp is None else (dp.event(self.config.train.max_epochs),)
        words = [f"DP-SGD of its encoder, {dp.steps(self.config.train.max_epochs)} steps at σ = "
                 f"{dp.noise_multiplier:g}, sampling rate {dp.sample_rate:g}"] if dp is not None else []
        releases = self.uploads if noise is not None else 0
        if noise is not None:
            words.append(f"{releases} upload(s) of each person's latent at σ = {noise.noise_multiplier:g}")
        return PrivacyPlan(mu=noise.mu if noise is not None else 0.0, releases=releases, training=training,
                           what="; ".join(words))

    def protected(self, role: str, scale: float, *, rows: int,
                  party: str = "") -> tuple[APCVFL, PrivacyPlan] | None:
        """Active: it sends nothing derived from its rows (the selector is the alignment's). Passive: its encoder
        trained by DP-SGD at noise multiplier ``scale`` (batches of about the training config's size, clipping norm
        1, for its ``max_epochs``) and the upload noised at twice that: the upload is one release at sensitivity 2C,
        where each DP-SGD step sees a person only when it samples them."""
        if role != "passive":
            return self, PrivacyPlan(what="nothing derived from its rows")
        rate = min(1.0, self.config.train.batch_size / max(rows, 1))
        config = replace(self.config, noise=GaussianNoise(clip=1.0, noise_multiplier=2 * scale),
                         dp_sgd=DPSGD(noise_multiplier=scale, max_grad_norm=1.0, sample_rate=rate))
        chosen = type(self)(config)
        plan = chosen.planned_privacy(role)
        assert plan is not None
        return chosen, plan

    def agreed(self, role: str) -> dict[str, Any]:
        return {"the latent width (passive_encoder's last)": self.config.passive_encoder[-1]} \
            if role == "passive" else {}

    # -- passive party ----------------------------------------------------------------------------

    def _local_encoder(self, ctx: NodeContext) -> FittedAutoencoder:
        part = ctx.part(APCPart)
        encoder = part.g1
        if encoder is None:
            data = ctx.require_data()
            _check_overcomplete(f"party {ctx.party!r}", data.n_features, self.config.passive_encoder[-1],
                                self.config.overcomplete)
            dp = self.config.dp_sgd
            if dp is not None:  # the whole run is charged before it starts: refused now, or never part way
                ctx.privacy.charge(data.ids, training=[dp.event(self.config.train.max_epochs)],
                                   what="its encoder's DP-SGD training")
            encoder = fit_autoencoder(
                data.X, self.config.passive_encoder, activation=self.config.activation, train=self.config.train,
                generator=ctx.torch_generator("apc-g1"), rng=ctx.rng("apc-g1"), reduction=self.config.reduction,
                dp=dp, noise_generator=ctx.torch_generator("apc-g1", "dp-sgd") if dp is not None else None,
            )
            part.g1 = encoder
        return encoder

    @reveals("aligned rows")
    @handles("apc.encode_aligned",
             served="after alignment; trains g1 once a run, then encodes the aligned rows asked",
             carries={"selector": "membership"}, replies={"z": "outputs"}, selector=SELECTOR)
    def _encode_aligned(self, ctx: NodeContext, payload: Fields) -> Payload:
        """The single exchange: train g1 on all own rows (once), return g1 of the aligned rows."""
        selector = payload.array("selector")
        ids = selected_ids(ctx, selector)
        z = self._local_encoder(ctx).encode(ctx.require_data().subset(ids).X)
        return {"z": self._released(ctx, z, ids)}

    def _released(self, ctx: NodeContext, z: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """Latents as they leave the party: noised when the config asks, with noise keyed by the party's own
        secret, the person and the latent (the same latent asked again is the same release), and counted
        against the party's privacy budget."""
        noise = self.config.noise
        if noise is not None:
            z = noise.release_rows(z, ids, ctx.row_noise("apc-upload"), ctx.privacy, what="latents")
        return z.astype(self.config.payload_dtype)

    # -- active party -----------------------------------------------------------------------------

    def _align(self, fed: Federation) -> Alignment:
        passives = fed.names("passive")
        if not passives:
            raise MethodError(f"{self.name} needs at least one passive party; use 'local' for the active party alone")
        alignment = fed.align(fed.data.ids, passives)
        for party in passives:
            if not alignment.held[party].any():
                raise MethodError(
                    f"passive party {party!r} shares no aligned sample with the active party {fed.party!r}; "
                    f"{self.name} needs aligned rows with every passive party"
                )
            _check_overcomplete(f"party {party!r}", alignment.widths[party], self.config.passive_encoder[-1],
                                self.config.overcomplete)
        if len(alignment.ids) == 0:
            raise MethodError(f"no sample is shared by the active party and all of {passives}")
        return alignment

    def _fit_g1_active(self, fed: Federation) -> FittedAutoencoder:
        data = fed.data
        if data.n_features == 0:
            raise MethodError(f"{self.name} needs features at the active party; it has none (a label-only party)")
        _check_overcomplete(f"the active party {fed.party!r}", data.n_features, self.config.active_encoder[-1],
                            self.config.overcomplete)
        return fit_autoencoder(
            data.X, self.config.active_encoder, activation=self.config.activation, train=self.config.train,
            generator=fed.torch_generator("apc-g1"), rng=fed.rng("apc-g1"), reduction=self.config.reduction,
        )

    def _exchange(self, fed: Federation, alignment: Alignment) -> list[Rows]:
        """The one exchange: each passive party's g1 of the aligned rows. Replies are kept under 64 MB each, so
        beyond about 65,000 shared rows (latents of 256 float32) the upload takes one round per 64 MB."""
        passives = list(alignment.held)
        width = self.config.passive_encoder[-1] * np.dtype(self.config.payload_dtype).itemsize
        per_round = max(1, UPLOAD_BYTES // width)
        selectors = {p: alignment.selector(p) for p in passives}
        # Each passive party's latents as they arrive: in memory, or on disk beyond the party's [spill] limit.
        dtype = np.dtype(self.config.payload_dtype)
        parts = {p: RowSink(len(alignment.ids), self.config.passive_encoder[-1], dtype, what=f"{p}'s latents")
                 for p in passives}
        for start in range(0, max(len(alignment.ids), 1), per_round):
            stop = min(start + per_round, len(alignment.ids))
            requests: dict[str, Payload] = {}
            for p, selector in selectors.items():
                chosen = np.flatnonzero(selector)[start:stop]
                part = np.zeros_like(selector)
                part[chosen] = True
                requests[p] = {"selector": part}
            replies = fed.exchange("apc.encode_aligned", requests)
            for p in passives:
                parts[p].write(self._latent(p, replies[p], stop - start))
        return [parts[p].finish() for p in passives]

    def _latent(self, party: str, reply: Payload, n: int) -> np.ndarray:
        return expect_rows(reply, "z", party=party, rows=n, width=self.config.passive_encoder[-1],
                           what="representations")

    def _fit_teacher(self, fed: Federation, joint: Rows) -> FittedAutoencoder:
        return fit_autoencoder(
            joint, self.config.joint_encoder, activation=self.config.activation, train=self.config.train,
            generator=fed.torch_generator("apc-g2"), rng=fed.rng("apc-g2"), reduction=self.config.reduction,
        )

    def _joint_input(self, g1_active: FittedAutoencoder, x_active: np.ndarray, remote: Sequence[Rows]) -> Rows:
        """[g1_A(x), g1_P1(x), ...] of the aligned rows, a chunk at a time (kept on disk beyond the [spill] limit)."""
        sink = RowSink(len(x_active), g1_active.width + sum(int(r.shape[1]) for r in remote), np.float32,
                       what="the joint autoencoder's input")
        for start in range(0, len(x_active), CHUNK):
            stop = start + CHUNK
            sink.write(np.hstack([g1_active.encode(x_active[start:stop]), *(r[start:stop] for r in remote)]))
        return sink.finish()

    def _teacher_steps(self, fed: Federation, clock: _Stopwatch) -> tuple[np.ndarray, Rows]:
        """Steps 1-3: local g1, the one exchange, joint g2. Returns the aligned IDs and their teacher latent."""
        data = fed.data
        self.g1_active_ = self._fit_g1_active(fed)
        clock.lap("g1_active")
        alignment = self._align(fed)
        clock.lap("alignment")
        remote = self._exchange(fed, alignment)
        clock.lap("exchange (passive g1 training and encoding included)")
        joint = self._joint_input(self.g1_active_, data.subset(alignment.ids).X, remote)
        del remote
        self.teacher_ = self._fit_teacher(fed, joint)
        clock.lap("g2_joint")
        self.passives_ = list(alignment.held)
        self.n_aligned_ = len(alignment.ids)
        return alignment.ids, self.teacher_.encode_rows(joint, what="the teacher's latents")

    def fit_representation(self, fed: Federation) -> tuple[np.ndarray, Rows]:
        data = fed.data
        clock = _Stopwatch()
        aligned_ids, teacher = self._teacher_steps(fed, clock)
        self.student_ = fit_student(fed, self.config, targets=teacher, rows=data.positions(aligned_ids))
        del teacher
        clock.lap("g3_student")
        Z = self.student_.encode_rows(data.X, what="the student's latents")
        clock.lap("g3_encode")
        self.timings_ = clock.laps
        self.stamps_ = clock.stamps
        return data.ids, Z

    def represent(self, fed: Federation, ids: np.ndarray) -> Rows:
        return self.student_.encode_rows(fed.serving.subset(ids).X, what="the student's latents")

    def summary_stats(self) -> dict[str, float]:
        """Epochs of each autoencoder the active party trained (g1, g2 the teacher, g3 the student), and the ε of
        a passive party's person whose latent was uploaded once (with the config's noise)."""
        stats = super().summary_stats()
        if self.config.noise is not None:
            stats["epsilon_features"] = self.config.noise.epsilon(releases=1)
        return stats | self._encoder_stats()

    def epsilon_scope(self) -> str:
        if self.config.noise is None:
            return ""
        if self.config.dp_sgd is not None:
            return SCOPE_END_TO_END
        return (SCOPE_FIXED_MODEL + ": replacing one person's row moves every uploaded latent, not only theirs; "
                "counted once per uploaded row")

    def _encoder_stats(self) -> dict[str, float]:
        stats: dict[str, float] = {}
        for prefix, attr in (("g1_", "g1_active_"), ("g2_", "teacher_"), ("g3_", "student_")):
            encoder = getattr(self, attr, None)
            if isinstance(encoder, FittedAutoencoder):
                stats.update(encoder.history.summary(prefix))
        return stats


class APCVFLAligned(APCVFL):
    """APC-VFL's fully aligned variant (Irureta et al., Figure 4), for the comparison with SplitNN.

    Steps 1-3 as APC-VFL; the classifier is trained on the joint latent g2([g1_A(x), g1_P(x), ...])
    of the aligned rows, with no distillation (L = ||j - f2(g2(j))||² for g2). Prediction is
    collaborative: each passive party encodes the rows to score with its g1.
    """

    name = "apc_vfl_aligned"
    summary = "APC-VFL's fully aligned variant: classifier on the joint latent (collaborative inference)"
    inference = "collaborative"
    # At training, and again when the person is scored (the same row again is the same release and costs nothing).
    uploads = 2
    # A passive party keeps its g1: it encodes the rows to score.
    saves: ClassVar[Saves] = Saves(
        model=(Saved("g1", autoencoder(lambda at: at.method.config.active_encoder, _activation), "its own encoder",
                     attr="g1_active_"),
               Saved("g2", autoencoder(lambda at: at.method.config.joint_encoder, _activation), "the joint encoder",
                     attr="teacher_"),
               Saved("passives", PARTY_NAMES, "who encodes"), CLASSIFIER),
        part=APCPart, parts={"passive": (Saved("g1", autoencoder(lambda at: at.method.config.passive_encoder,
                                                                 _activation), "its own encoder"),)})

    def fit_representation(self, fed: Federation) -> tuple[np.ndarray, Rows]:
        clock = _Stopwatch()
        result = self._teacher_steps(fed, clock)
        self.timings_ = clock.laps
        return result

    # -- a passive party: its share of scoring -----------------------------------------------------------

    @reveals("scoring rows")
    @handles("apc.encode_serve",
             served="after training: rows to score",
             carries={"ids": "ids"}, replies={"z": "outputs"}, ids=IDS)
    def _encode_serve(self, ctx: NodeContext, payload: Fields) -> Payload:
        """Collaborative inference: g1 of rows to score."""
        ids = payload.array("ids")
        z = self._local_encoder(ctx).encode(ctx.rows("serve").subset(ids).X)
        return {"z": self._released(ctx, z, ids)}

    # -- the active party ----------------------------------------------------------------------------------

    def represent(self, fed: Federation, ids: np.ndarray) -> Rows:
        replies = fed.score_together("apc.encode_serve", ids, self.passives_)
        remote = [self._latent(p, replies[p], len(ids)) for p in self.passives_]
        return self.teacher_.encode_rows(self._joint_input(self.g1_active_, fed.serving.subset(ids).X, remote))


class Ablation(RepresentationMethod):
    """APC-VFL's Ablation (Irureta et al., Section 6.1): the student g3 without distillation.

    The active party trains g3 on its own rows alone, L(x_i) = ||x_i - f3(g3(x_i))||², and fits the
    classifier on g3(X_A): no message is sent. It isolates what the nonlinear encoding alone adds. It takes
    APC-VFL's settings (the same student and classifier) and no part of its protocol: it has no handler.
    """

    name = "ablation"
    Config = APCVFLConfig
    summary = "APC-VFL's student encoder trained on local data only, without distillation (no messages)"
    paper = APCVFL.paper
    quick: ClassVar[Mapping[str, Any]] = APCVFL.quick
    inference: ClassVar[Inference] = "active_only"
    saves: ClassVar[Saves] = APCVFL.saves

    config: APCVFLConfig

    def fit_representation(self, fed: Federation) -> tuple[np.ndarray, Rows]:
        data = fed.data
        if data.n_features == 0:
            raise MethodError("ablation needs features at the active party; it has none")
        self.student_ = fit_student(fed, self.config)
        return data.ids, self.student_.encode_rows(data.X, what="the student's latents")

    def represent(self, fed: Federation, ids: np.ndarray) -> Rows:
        return self.student_.encode_rows(fed.serving.subset(ids).X, what="the student's latents")

    def summary_stats(self) -> dict[str, float]:
        """Epochs of the student g3."""
        return super().summary_stats() | self.student_.history.summary("g3_")


def fit_student(fed: Federation, config: APCVFLConfig, *, targets: Rows | None = None,
                rows: np.ndarray | None = None) -> FittedAutoencoder:
    """Step 4, the student g3 on every row of the active party: distilled towards ``targets`` (one row for each
    of the active party's rows at ``rows``: the aligned ones) in APC-VFL, or reconstruction alone (no targets: the
    Ablation)."""
    distill = {} if targets is None else {"target": targets, "target_rows": rows, "weight": config.distill_weight,
                                          "distill": config.distill}
    return fit_autoencoder(fed.data.X, config.student_encoder, activation=config.activation, train=config.train,
                           generator=fed.torch_generator("apc-g3"), rng=fed.rng("apc-g3"),
                           reduction=config.reduction, **distill)  # type: ignore[arg-type]  # distill's keys are fit_autoencoder's, typed loosely as a dict
