"""SplitNN / VFL-STD: bottom networks at every party, a top network at the active party."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np

from vflo.comm.message import BOOL, IDS, INT, STR, ArraySpec, Fields, Payload
from vflo.dp import DPSGD, GaussianNoise, PrivacyPlan, RandomisedResponse
from vflo.errors import ConfigError, MethodError, ProtocolError
from vflo.methods.base import Claim, Inference, Layout, Method, MethodConfig, handles, reveals
from vflo.methods.saved import INTEGER, NUMBER, PARTY_NAMES, WIDTHS, Saved, Saves, network
from vflo.methods.split_learning import (
    BOTTOM,
    HeldRowsTrainer,
    SplitPart,
    SplitParty,
    bottom_of,
    bottom_scope,
    holders_activations,
    labels_scope,
    randomised_labels,
    remote_activations,
)
from vflo.nn.train import (
    History,
    TrainConfig,
    adam,
    as_tensor,
    split_validation,
)

if TYPE_CHECKING:
    import torch
    from torch import nn
    from torch.nn import functional as F

    from vflo.party.context import NodeContext
    from vflo.party.port import Federation, Pending
    from vflo.roles import PartyInfo
else:
    from vflo.lazy import functional as F
    from vflo.lazy import torch

logger = logging.getLogger(__name__)

POSITIONS = ArraySpec(("int64",), (None,))


@dataclass(frozen=True, kw_only=True)
class SplitNNConfig(MethodConfig):
    """Bottom networks per role, a top network, and how they are trained.

    ``passive_bottom`` and ``active_bottom`` list hidden widths; the last is the width of
    the activations that party contributes. ``top`` lists the top network's hidden widths
    before its output layer. ``payload_dtype = 'float16'`` halves activation and gradient bytes.
    Defences (off by default, see :mod:`vflo.dp`): ``activation_noise`` clips and noises every activation
    row a passive party sends (its features' protection); ``gradient_noise`` every per-example gradient row
    the active party sends back (label protection; the gradient of each example's own loss is clipped, as in
    DP-SGD, then divided by the batch size as the mean loss's is). Each training example is released once per epoch, so
    the ε reported composes over the epochs trained.
    ``party_dropout`` (PlugVFL's party-wise dropout, Sun et al. 2023): in training, each passive party's
    activations are left out of a whole batch with this probability (zeros at the top, the party not asked for
    that batch), so the model also scores a person a partner lacks, with zeros in that partner's place; a model
    trained with it trains on every person the active party holds (zeros for a partner that lacks one, which
    is asked only for the people of a batch it holds) and scores each person with whichever partners hold them.
    """

    passive_bottom: tuple[int, ...] = (64, 64)
    active_bottom: tuple[int, ...] = (64, 64)
    top: tuple[int, ...] = (64,)
    activation: str = "relu"
    payload_dtype: Literal["float32", "float16"] = "float32"
    train: TrainConfig = field(default_factory=TrainConfig)
    # The passive parties that take part (empty: all). VFL-STD beside VFL-ASP uses the first hop only.
    partners: tuple[str, ...] = ()
    activation_noise: GaussianNoise | None = None
    gradient_noise: GaussianNoise | None = None
    party_dropout: float = 0.0
    # Off by default: a passive party trains its bottom with DP-SGD (its own choice, in its own [methods.splitnn]),
    # drawing from each named batch the rows its step uses; with activation_noise too, its account covers its data
    # end to end.
    dp_sgd: DPSGD | None = None
    # Off by default: the active party randomises its training and validation labels once, at this ε (label DP by
    # randomised response), and trains on them; every gradient it sends is then computed from the randomised labels.
    label_epsilon: float | None = None

    def __post_init__(self) -> None:
        if self.label_epsilon is not None:
            RandomisedResponse(epsilon=self.label_epsilon)  # a bad ε is named here, not at training
        if not self.passive_bottom or not self.active_bottom:
            raise ConfigError("splitnn: passive_bottom and active_bottom need at least one layer each")
        if self.train.sampling == "balanced" and self.gradient_noise is not None:
            raise ConfigError("train.sampling = 'balanced' draws people by their labels and names the draws to every "
                              "partner, which tells it their class whatever gradient_noise protects; use "
                              "train.sampling = 'shuffle', or label_epsilon (draws by randomised labels)")
        if self.dp_sgd is not None and self.activation_noise is None:
            raise ConfigError("dp_sgd makes a passive party's bottom private, not the activations it sends: each is "
                              "still a function of that person's own row. Give activation_noise too, so every "
                              "activation is a Gaussian release and the account covers both")
        if not 0.0 <= self.party_dropout < 1.0:
            raise ConfigError(f"party_dropout is a probability in [0, 1), got {self.party_dropout}")


class SplitNN(SplitParty, Method):
    """Each party a bottom network, the active party a top network over their outputs.

    Vepakomma et al. 2018, "Split learning for health" (the vertical split used as the
    VFL-STD baseline by APC-VFL and VFL-ASP). Trained end to end on the aligned rows:

        min_{θ_top, θ_1..θ_K} Σ_{i ∈ aligned} ℓ( h_top([b_1(x_i^1), ..., b_K(x_i^K)]), y_i )

    with ℓ cross-entropy (classification) or squared error on the standardised target (regression). Per batch, one
    round sends row positions to every passive party and returns its activations, and
    one round returns the gradients of ℓ with respect to those activations. Inference
    is collaborative: every party must hold the rows to score. With ``party_dropout`` (PlugVFL, Sun et al. 2023)
    the sum runs over every row the active party holds, b_k(x_i^k) replaced by zeros where party k lacks i or
    is dropped from the batch, and a person is scored with whichever partners hold them. Training stops by the
    ``train`` config's rule on a validation split of the aligned rows (:class:`~vflo.nn.train.Trainer`).
    """

    name = "splitnn"
    Config = SplitNNConfig
    summary = "vertical split learning on aligned rows (VFL-STD); collaborative inference"
    paper = "Vepakomma et al. 2018; the VFL-STD / SplitNN baseline of APC-VFL and VFL-ASP"
    claims: ClassVar[tuple[Claim, ...]] = (
        Claim(text="Federating with everyone shared",
              axis="aligned", at="largest", scored="aligned", against="local"),
        Claim(text="Party-wise dropout (PlugVFL) against SplitNN with an active-only fallback",
              axis="absent", at="half", scored="missing", against="splitnn", method="plugvfl"),
    )
    #: PlugVFL (Sun et al. 2023): SplitNN with party-wise dropout, in the comparison's missing-partner cells.
    variants: ClassVar[Mapping[str, Mapping[str, Any]]] = {"plugvfl": {"party_dropout": 0.5}}
    subset_when = "party_dropout > 0"
    quick: ClassVar[Mapping[str, Any]] = {
        "train": {"lr": 1e-2, "batch_size": 32, "max_epochs": 2, "patience": 5}}
    inference: ClassVar[Inference] = "collaborative"
    checkpointed = ("train",)
    # A passive party's bottom network and how it steps are its own; what it sends is shared.
    own_settings: ClassVar[Mapping[str, tuple[str, ...]]] = {
        "passive": ("passive_bottom", "activation", "train.lr", "train.weight_decay", "train.lr_schedule",
                    "train.lr_final", "dp_sgd")}
    shared_settings: ClassVar[Mapping[str, tuple[str, ...]]] = {"passive": ("activation_noise", "payload_dtype")}

    saves: ClassVar[Saves] = Saves(
        model=(Saved("passives", PARTY_NAMES, "who sends activations"),
               Saved("widths", WIDTHS, "what width each sends"),
               Saved("in_dim", INTEGER, "its own width"),
               Saved("y_mean", NUMBER, "the regression target's mean"), Saved("y_scale", NUMBER, "and scale"),
               Saved("bottom", network(lambda at: at.method.active_bottom_net(at.where)), "its own bottom network"),
               Saved("top", network(lambda at: at.method.top_net(at.where)), "the top network")),
        part=SplitPart, parts={"passive": (BOTTOM,)})

    config: SplitNNConfig

    @classmethod
    def layout_settings(cls, layout: Layout, *, first_hop: str = "", second_hop: str = "") -> dict[str, Any] | str:
        if layout == "missing":
            # Trained on the people every partner holds; the others scored by the active party alone.
            return {"fallback": "local"}
        # Beside a second hop, split learning trains with the first hop alone (VFL-ASP's VFL-STD baseline).
        return {} if layout == "star" else {"partners": [first_hop]}

    # -- the active party's networks: from the config, its own width and the partners' widths -----------------

    def active_bottom_net(self, fed: Federation) -> nn.Module:
        """A new bottom network over the active party's own columns (fit, and a saved model's restore)."""
        from vflo.nn.models import mlp
        cfg = self.config
        return mlp(self.in_dim_, cfg.active_bottom, None, activation=cfg.activation,
                   generator=fed.torch_generator("splitnn-bottom"))

    def top_net(self, fed: Federation) -> nn.Module:
        """A new top network over every bottom's outputs (fit, and a saved model's restore)."""
        from vflo.nn.models import mlp
        cfg = self.config
        return mlp(cfg.active_bottom[-1] + sum(self.widths_.values()), cfg.top, fed.n_outputs,
                   activation=cfg.activation, generator=fed.torch_generator("splitnn-top"))

    # -- hooks for methods built on split learning (VFL-ASP's teacher) ---------------------------------

    def _partners(self, fed: Federation) -> list[str]:
        """The passive parties that take part: those named in ``partners``, else all of them."""
        self.check_parties(fed.parties)
        return list(self.config.partners) or fed.names("passive")

    def check_parties(self, parties: tuple[PartyInfo, ...]) -> None:
        passives = [p.name for p in parties if p.role == "passive"]
        unknown = [p for p in self.config.partners if p not in passives]
        if unknown:
            raise ConfigError(f"{self.name}: partners {unknown} are not passive parties of this run (its passive "
                              f"parties: {passives}); name some of those in partners, or leave partners out to train "
                              "with all of them")

    def scoring_parties(self, parties: tuple[PartyInfo, ...]) -> list[str]:
        if self.config.party_dropout > 0:
            return []  # trained to do without any partner: whoever holds a person scores them
        return list(self.config.partners) or super().scoring_parties(parties)

    def build_bottom(self, ctx: NodeContext, in_dim: int) -> nn.Module:
        from vflo.nn.models import mlp

        return mlp(in_dim, self.config.passive_bottom, None, activation=self.config.activation,
                   generator=ctx.torch_generator("splitnn-bottom"))

    def bottom_noise(self) -> GaussianNoise | None:
        return self.config.activation_noise

    def bottom_dp(self) -> DPSGD | None:
        return self.config.dp_sgd

    def passive_side_is_splitnns(self) -> bool:
        """Whether this method's parties serve SplitNN's kinds and no other (LASER-VFL's do): then they send what
        SplitNN's plan counts. A subclass that serves more (VFL-ASP's first hop) sends more than it plans for."""
        return set(type(self).handler_table()) == set(SplitNN.handler_table())

    def planned_privacy(self, role: str, *, party: str = "") -> PrivacyPlan | None:
        """A passive party's: its bottom's DP-SGD (one named batch an epoch per person) where it trains one, and its
        activations: at most one training or validation release a person an epoch (its bottom refuses more, and
        ``splitnn.init`` a person named in both sets) and one when the person is scored."""
        noise, dp, epochs = self.config.activation_noise, self.config.dp_sgd, self.config.train.max_epochs
        if role == "active" and self.config.label_epsilon is not None:
            return PrivacyPlan(epsilon=self.config.label_epsilon, pure_releases=1,
                               what=f"randomised response on its labels at ε = {self.config.label_epsilon:g}, once")
        if role != "passive" or noise is None or not self.passive_side_is_splitnns():
            return None
        releases = epochs + 1
        words = [f"DP-SGD of its bottom, {epochs} batches per person at σ = {dp.noise_multiplier:g}, drawing "
                 f"{dp.sample_rate:g} of each"] if dp is not None else []
        words.append(f"up to {releases} releases of each person's activations at σ = {noise.noise_multiplier:g}")
        return PrivacyPlan(mu=noise.mu, releases=releases,
                           training=() if dp is None else (dp.within_batches(epochs),), what="; ".join(words))

    def protected(self, role: str, scale: float, *, rows: int,
                  party: str = "") -> tuple[SplitNN, PrivacyPlan] | None:
        """A passive party's side: its bottom by DP-SGD at noise multiplier ``scale`` drawing half of each named
        batch, and its activations noised at twice that. The active party's is not covered here (its gradients
        carry its labels)."""
        if role != "passive" or not self.passive_side_is_splitnns():
            return None
        chosen, plan = self.calibrated_bottom(role, scale)
        return chosen, plan

    def bottom_settings(self) -> tuple[TrainConfig, str]:
        return self.config.train, self.config.payload_dtype

    # -- the passive parties' side -----------------------------------------------------------------

    @reveals("row ids")
    @handles("splitnn.init",
             served="after setup and alignment",
             carries={"train_ids": "ids", "val_ids": "ids"}, replies={"width": "control"},
             train_ids=IDS, val_ids=IDS)
    def _init(self, ctx: NodeContext, payload: Fields) -> Payload:
        data = ctx.require_data()
        train_ids, val_ids = payload.array("train_ids"), payload.array("val_ids")
        both = np.intersect1d(train_ids, val_ids)
        if len(both):  # each would be released once per epoch as a training row and again as a validation row
            raise ProtocolError(f"splitnn.init names {len(both)} people (e.g. {both[0]!r}) for both training and "
                                "validation; refused: a person is one or the other")
        x_train = self.bottom_input(ctx, data.subset(train_ids))
        x_val = self.bottom_input(ctx, data.subset(val_ids))
        self.new_bottom(ctx, int(x_train.shape[1]), people=np.asarray(train_ids))
        part = ctx.part(SplitPart)
        part.x = {"train": as_tensor(x_train), "val": as_tensor(x_val)}
        part.x_ids = {"train": np.asarray(train_ids), "val": np.asarray(val_ids)}
        return {"width": self.config.passive_bottom[-1]}

    @reveals("training batch")
    @handles("splitnn.forward",
             served="after splitnn.init",
             carries={"rows": "membership"}, replies={"acts": "outputs"}, rows=POSITIONS,
             subset=STR, training=BOOL, keep_previous=BOOL, epoch=INT)
    def _forward(self, ctx: NodeContext, payload: Fields) -> Payload:
        bottom = bottom_of(ctx)
        subset = payload.text("subset")
        part = ctx.part(SplitPart)
        if subset not in part.x:
            raise ProtocolError(f"splitnn.forward: unknown subset {subset!r}")
        rows = payload.array("rows")
        x = part.x[subset][torch.as_tensor(rows)]
        ids = part.x_ids[subset][rows]
        if payload.flag("training"):
            bottom.at_epoch(payload.integer("epoch"))
            return {"acts": bottom.forward(x, ids)}
        bottom.validation_pass(payload.flag("keep_previous"))
        return {"acts": bottom.infer(x, ids, fresh=True)}

    # -- the coordinator ------------------------------------------------------------------------------

    def fit(self, fed: Federation) -> None:
        cfg = self.config
        data = fed.data
        data.require_labels()
        passives = self._partners(fed)
        if cfg.party_dropout > 0:
            # Trained to do without a partner, it trains on every person the active party holds: a partner that
            # lacks one gives zeros there, as a dropped one does (PlugVFL as LASER-VFL's authors run it).
            ids = data.ids
            alignment = fed.align(ids, passives) if passives else None
            held = {p: alignment.holding(p, ids) for p in passives} if alignment else {}
        else:
            ids = fed.align(data.ids, passives).ids
            held = {p: np.ones(len(ids), dtype=bool) for p in passives}
        if len(ids) == 0:
            raise MethodError(
                f"splitnn needs aligned rows, but the active party {fed.party!r} shares no training sample "
                f"with {passives}; check the ID columns or the scenario's aligned count"
            )
        # Batches and validation rows are named to the passive parties: public choices, from the run seed (a
        # restarted coordinator resumes with the same ones); its own weights come from its own secret.
        rng = fed.shared_rng("splitnn-train")
        train_pos, val_pos = split_validation(len(ids), cfg.train.validation_fraction, rng)
        train_ids, val_ids = ids[train_pos], ids[val_pos]
        widths: dict[str, int] = {}
        if passives:
            requests: dict[str, Payload] = {p: {"train_ids": train_ids[held[p][train_pos]],
                                                "val_ids": val_ids[held[p][val_pos]]} for p in passives}
            for name, reply in fed.exchange("splitnn.init", requests).items():
                width = reply.integer("width")
                if width < 1:
                    raise ProtocolError(f"party {name!r} answered splitnn.init with width {width!r}")
                widths[name] = width
        self.passives_, self.widths_, self.in_dim_ = passives, widths, data.n_features
        self.bottom_, self.top_ = self.active_bottom_net(fed), self.top_net(fed)
        y_train = data.subset(train_ids).require_labels()
        y_val = data.subset(val_ids).require_labels()
        if cfg.label_epsilon is not None:  # both: the validation loss decides when to stop, which the partners see
            both = self.private_labels(fed, np.concatenate([train_ids, val_ids]), np.concatenate([y_train, y_val]))
            y_train, y_val = both[:len(train_ids)], both[len(train_ids):]
        # Regression targets are standardised on the training rows, as the MLP estimator does: Adam's steps
        # assume unit scale, and a target of mean 2000 left SplitNN far from it when it stopped.
        self.y_mean_, self.y_scale_ = 0.0, 1.0
        if fed.task == "regression":
            self.y_mean_ = float(np.mean(y_train))
            self.y_scale_ = float(np.std(y_train)) or 1.0
            y_train = (y_train - self.y_mean_) / self.y_scale_
            y_val = (y_val - self.y_mean_) / self.y_scale_
        trainer = _SplitTrainer(self, fed, x={"train": data.subset(train_ids).X, "val": data.subset(val_ids).X},
                                y={"train": y_train, "val": y_val}, rng=rng, ids=train_ids, held=held,
                                subsets={"train": train_pos, "val": val_pos})
        self.history_: History = trainer.fit()
        self.n_train_ = len(train_ids)

    def private_labels(self, fed: Federation, ids: np.ndarray, y: np.ndarray) -> np.ndarray:
        """The labels of ``ids`` the active party trains on (:func:`randomised_labels` at ``label_epsilon``)."""
        return randomised_labels(fed, self.name, self.config.label_epsilon, ids, y)

    def predict(self, fed: Federation, ids: np.ndarray) -> np.ndarray:
        return self.predict_by(fed, ids)[0]

    def predict_by(self, fed: Federation, ids: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        own = as_tensor(fed.serving.subset(ids).X)
        if self.config.party_dropout > 0:
            # Trained to do without any partner: zeros where one lacks a person, as a dropped one's were.
            remote, held = holders_activations(fed, ids, self.passives_, self.widths_)
        else:
            replies = fed.score_together("split.activations", ids, self.passives_, extra={"purpose": "serve"})
            remote = remote_activations(replies, self.passives_, len(ids), self.widths_)
            held = {p: np.ones(len(ids), dtype=bool) for p in self.passives_}
        with torch.no_grad():
            out = self.top_(torch.cat([self.bottom_(own), *remote], dim=1))
        if fed.task == "regression":
            values: np.ndarray = out.squeeze(1).double().numpy() * self.y_scale_ + self.y_mean_
            return values, held
        result: np.ndarray = torch.softmax(out, dim=1).double().numpy()
        return result, held

    def subset_refusal(self) -> str:
        if self.any_subset or self.config.party_dropout > 0:
            return ""
        return ("its top layer was trained with every partner's activation present; train it with "
                "party_dropout > 0 (PlugVFL's party-wise dropout) or use laser_vfl, which score without a partner")

    def summary_stats(self) -> dict[str, float]:
        return {**self.history_.summary(), **self.privacy_stats()}

    def privacy_stats(self) -> dict[str, float]:
        """ε (at each mechanism's δ) of a training example, over the epochs it was released in."""
        epochs = max(len(self.history_.epochs), 1)
        out = {}
        if self.config.activation_noise is not None:  # each row once per epoch (training or validation pass)
            out["epsilon_features"] = self.config.activation_noise.epsilon(releases=epochs)
        if self.config.gradient_noise is not None:  # each example once per epoch to every passive party
            out["epsilon_labels"] = self.config.gradient_noise.epsilon(
                releases=epochs * max(len(getattr(self, "passives_", [])), 1))
        if self.config.label_epsilon is not None:  # once, before training; the rest is post-processing
            out["epsilon_labels"] = min(float(self.config.label_epsilon), out.get("epsilon_labels", math.inf))
        return out

    def epsilon_scope(self) -> str:
        return "; ".join(self._scopes("passive") + self._scopes("active"))

    def account_scope(self, role: str) -> str:
        return "; ".join(self._scopes(role))

    def _scopes(self, role: str) -> list[str]:
        """What the ε of the side in ``role`` covers: a passive party's activations, the active party's labels."""
        if role == "passive":
            scope = bottom_scope(self.config.activation_noise, self.config.dp_sgd, "bottom model",
                                 "; counted once per epoch trained and once per scored row (a row scored again is the "
                                 "same release)")
            return [scope] if scope else []
        if role != "active":
            return []
        parts = [labels_scope("the active party")] if self.config.label_epsilon is not None else []
        if self.config.gradient_noise is not None:
            parts.append("labels: ε covers each example's gradient given the fixed top model, once per epoch to each "
                         "passive party; the top model was trained on every label without privacy, and the "
                         "early-stopping decision and the validation rows' choice are not noised")
        return parts


class _SplitTrainer(HeldRowsTrainer):
    """SplitNN's steps: the passives' activations cross the transport, the loss is computed at the top."""

    lookahead = True

    def __init__(self, method: SplitNN, fed: Federation, *, x: dict[str, np.ndarray], y: dict[str, np.ndarray],
                 rng: np.random.Generator, ids: np.ndarray, held: dict[str, np.ndarray],
                 subsets: dict[str, np.ndarray]) -> None:
        config = method.config.train
        # Which partners a batch leaves out is the active party's own draw (a left-out partner is simply not asked).
        super().__init__(config, rng, fed, method.passives_, held=held, subsets=subsets, widths=method.widths_,
                         party_dropout=method.config.party_dropout, dropout_rng=fed.rng("splitnn-party-dropout"))
        self.m = method
        self.ids = ids  # the training rows' IDs, for the active party's account of the gradients it releases
        self.regression = fed.task == "regression"
        target = torch.float32 if self.regression else torch.long
        self.x = {k: as_tensor(v) for k, v in x.items()}
        self.y = {k: as_tensor(v, dtype=target) for k, v in y.items()}
        self.modules = {"bottom": method.bottom_, "top": method.top_}
        self.optimizer = adam([*method.bottom_.parameters(), *method.top_.parameters()], config)
        self.payload_dtype = method.config.payload_dtype
        self.upcoming: Pending | None = None
        self.fetched_ahead = False
        self.noise_rng = fed.rng("splitnn-gradient-noise")

    @property
    def n_train(self) -> int:
        return len(self.y["train"])

    def sampling_labels(self) -> np.ndarray | None:
        return None if self.regression else self.y["train"].numpy()

    def _loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(out.squeeze(1), y) if self.regression else F.cross_entropy(out, y)

    def train_step(self, batch: np.ndarray, upcoming: np.ndarray | None) -> float:
        m, passives = self.m, self.m.passives_
        m.bottom_.train()
        m.top_.train()
        # The own bottom first: over a network the passives' activations are still on their way.
        own = m.bottom_(self.x["train"][batch])
        if self.fetched_ahead:
            # Asked with the last step (an empty ask when it left every partner out: never drawn twice).
            replies = self.upcoming.result() if self.upcoming is not None else {}
            self.upcoming, self.fetched_ahead = None, False
            acts = self.activations(replies, batch, "train")
        else:
            acts = self.remote(batch, "train", True)
        # Only the partners asked answered: one left out of this batch, or holding none of it, gets no gradient.
        acts = {name: a.requires_grad_(True) for name, a in acts.items()}
        loss = self._loss(m.top_(torch.cat([own, *self.in_place(acts, batch, "train")], dim=1)),
                          self.y["train"][batch])
        self.optimizer.zero_grad()
        loss.backward()
        if passives:
            noise = m.config.gradient_noise
            grads = {}
            for name, a in acts.items():
                grad = a.grad.numpy()  # type: ignore[union-attr]  # backward() just filled grad
                if noise is not None:  # label protection: each example's gradient row clipped and noised
                    # The loss is a batch mean, so a row is 1/n of the gradient of that example's own loss: clip
                    # and noise the example's own gradient, as DP-SGD does, then scale back (post-processing).
                    # Clipping the 1/n rows, a clip of 1 never binds and Adam, blind to scale, makes every σ the same.
                    # Each receiver gets its own noisy gradient of each example: a release per receiver.
                    about = self.ids[batch][self.held["train"][name][batch]]
                    grad = noise.release(grad * len(batch), self.noise_rng, self.fed.privacy, about,
                                         what="gradients") / len(batch)
                grads[name] = {"grad": grad.astype(self.payload_dtype)}
            # Posted: it goes out with the next forward, one round trip per batch over a network.
            if grads:
                self.fed.post("split.backward", grads)
            if upcoming is not None:
                # The next batch's forward leaves now, before this step's update: the passives' work and
                # the transfer overlap the active party's optimizer step and bottom.
                ahead = self.forward_requests(upcoming, "train", True)
                self.upcoming = self.fed.exchange_async("splitnn.forward", ahead) if ahead else None
                self.fetched_ahead = True
        self.optimizer.step()
        return float(loss.detach())

    @property
    def validates(self) -> bool:
        return len(self.y["val"]) > 0

    def validation_loss(self) -> float | None:
        if not self.validates:
            return None
        m = self.m
        rows = np.arange(len(self.y["val"]))
        remote = self.in_place(self.remote(rows, "val", False), rows, "val")
        m.bottom_.eval()
        m.top_.eval()
        with torch.no_grad():
            out = m.top_(torch.cat([m.bottom_(self.x["val"]), *remote], dim=1))
            return float(self._loss(out, self.y["val"]))
