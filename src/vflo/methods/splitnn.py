"""SplitNN / VFL-STD: bottom networks at every party, a top network at the active party."""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from vflo.comm.message import BOOL, IDS, STR, ArraySpec, Payload, floats
from vflo.data.partydata import PartyData
from vflo.errors import ConfigError, MethodError, ProtocolError
from vflo.federation.coordinator import Federation, PendingExchange
from vflo.federation.node import NodeContext
from vflo.methods.base import Inference, Method, MethodConfig, handles
from vflo.nn.models import mlp
from vflo.nn.train import History, TrainConfig, adam, as_tensor, run_epochs, split_validation

logger = logging.getLogger(__name__)

POSITIONS = ArraySpec(("int64",), (None,))


@dataclass(frozen=True, kw_only=True)
class SplitNNConfig(MethodConfig):
    """Bottom networks per role, a top network, and how they are trained.

    ``passive_bottom`` and ``active_bottom`` list hidden widths; the last is the width of
    the activations that party contributes. ``top`` lists the top network's hidden widths
    before its output layer. ``payload_dtype = 'float16'`` halves activation and gradient bytes.
    """

    passive_bottom: tuple[int, ...] = (64, 64)
    active_bottom: tuple[int, ...] = (64, 64)
    top: tuple[int, ...] = (64,)
    activation: str = "relu"
    payload_dtype: Literal["float32", "float16"] = "float32"
    train: TrainConfig = field(default_factory=TrainConfig)
    # The passive parties that take part (empty: all). VFL-STD beside VFL-ASP uses the first hop only.
    partners: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.passive_bottom or not self.active_bottom:
            raise ConfigError("splitnn: passive_bottom and active_bottom need at least one layer each")


class SplitNN(Method):
    """Each party a bottom network, the active party a top network over their outputs.

    Vepakomma et al. 2018, "Split learning for health" (the vertical split used as the
    VFL-STD baseline by APC-VFL and VFL-ASP). Trained end to end on the aligned rows:

        min_{θ_top, θ_1..θ_K} Σ_{i ∈ aligned} ℓ( h_top([b_1(x_i^1), ..., b_K(x_i^K)]), y_i )

    with ℓ cross-entropy (classification) or squared error on the standardised target (regression). Per batch, one
    round sends row positions to every passive party and returns its activations, and
    one round returns the gradients of ℓ with respect to those activations. Inference
    is collaborative: every party must hold the rows to score.
    """

    name = "splitnn"
    Config = SplitNNConfig
    summary = "vertical split learning on aligned rows (VFL-STD); collaborative inference"
    paper = "Vepakomma et al. 2018; the VFL-STD / SplitNN baseline of APC-VFL and VFL-ASP"
    inference: ClassVar[Inference] = "collaborative"

    config: SplitNNConfig

    # -- hooks for methods built on split learning (VFL-ASP's teacher) ---------------------------------

    def _passive_features(self, ctx: NodeContext, rows: PartyData) -> np.ndarray:
        """What a passive party feeds its bottom network for ``rows``: its raw features here."""
        return rows.X

    def _partners(self, fed: Federation) -> list[str]:
        """The passive parties that take part: those named in ``partners``, else all of them."""
        passives = fed.names("passive")
        unknown = [p for p in self.config.partners if p not in passives]
        if unknown:
            raise ConfigError(f"partners {unknown} are not passive parties of this federation ({passives})")
        return list(self.config.partners) or passives

    # -- the passive parties' side -----------------------------------------------------------------

    @handles("splitnn.init", train_ids=IDS, val_ids=IDS)
    def _init(self, ctx: NodeContext, payload: Payload) -> Payload:
        data = ctx.require_data()
        train_ids, val_ids = payload["train_ids"], payload["val_ids"]
        assert isinstance(train_ids, np.ndarray) and isinstance(val_ids, np.ndarray)
        x_train = self._passive_features(ctx, data.subset(train_ids))
        x_val = self._passive_features(ctx, data.subset(val_ids))
        bottom = mlp(x_train.shape[1], self.config.passive_bottom, None, activation=self.config.activation,
                     generator=ctx.torch_generator("splitnn-bottom"))
        ctx.state.update(
            bottom=bottom,
            optimizer=adam(bottom.parameters(), self.config.train),
            x={"train": as_tensor(x_train), "val": as_tensor(x_val)},
            pending=None, candidate=None, best=None,
        )
        return {"width": self.config.passive_bottom[-1]}

    @handles("splitnn.forward", rows=POSITIONS, subset=STR, training=BOOL, keep_previous=BOOL)
    def _forward(self, ctx: NodeContext, payload: Payload) -> Payload:
        st = _state(ctx)
        subset = str(payload["subset"])
        if subset not in st["x"]:
            raise ProtocolError(f"splitnn.forward: unknown subset {subset!r}")
        rows = payload["rows"]
        assert isinstance(rows, np.ndarray)
        x = st["x"][subset][torch.as_tensor(rows)]
        bottom: nn.Module = st["bottom"]
        if payload["training"]:
            bottom.train()
            out = bottom(x)
            st["pending"] = out
            acts = out.detach()
        else:
            if payload["keep_previous"]:
                st["best"] = st["candidate"]
            # Snapshot at each validation pass; the coordinator says later whether it was the best.
            st["candidate"] = copy.deepcopy(bottom.state_dict())
            bottom.eval()
            with torch.no_grad():
                acts = bottom(x)
        return {"acts": acts.numpy().astype(self.config.payload_dtype)}

    @handles("splitnn.backward", grad=floats(None, None))
    def _backward(self, ctx: NodeContext, payload: Payload) -> Payload:
        st = _state(ctx)
        out = st["pending"]
        if out is None:
            raise ProtocolError("splitnn.backward arrived without a training forward before it")
        grad = payload["grad"]
        assert isinstance(grad, np.ndarray)
        if grad.shape != tuple(out.shape):
            raise ProtocolError(f"splitnn.backward: gradient shape {grad.shape} != activation shape {tuple(out.shape)}")
        st["optimizer"].zero_grad()
        out.backward(torch.as_tensor(grad, dtype=torch.float32))
        st["optimizer"].step()
        st["pending"] = None
        return {}

    @handles("splitnn.finish", keep_previous=BOOL)
    def _finish(self, ctx: NodeContext, payload: Payload) -> Payload:
        st = _state(ctx)
        if payload["keep_previous"]:
            st["best"] = st["candidate"]
        if self.config.train.restore_best and st["best"] is not None:
            st["bottom"].load_state_dict(st["best"])
        st["bottom"].eval()
        # Training rows are no longer needed; serving rows are read on demand.
        st.update(x={}, pending=None, candidate=None, best=None, optimizer=None)
        return {}

    @handles("splitnn.predict", ids=IDS)
    def _predict_rows(self, ctx: NodeContext, payload: Payload) -> Payload:
        st = _state(ctx)
        ids = payload["ids"]
        assert isinstance(ids, np.ndarray)
        x = as_tensor(self._passive_features(ctx, ctx.rows("serve").subset(ids)))
        with torch.no_grad():
            acts = st["bottom"](x)
        return {"acts": acts.numpy().astype(self.config.payload_dtype)}

    # -- the coordinator ------------------------------------------------------------------------------

    def fit(self, fed: Federation) -> None:
        cfg = self.config
        data = fed.data
        data.require_labels()
        passives = self._partners(fed)
        ids = fed.align(data.ids, passives).ids
        if len(ids) == 0:
            raise MethodError(
                f"splitnn needs aligned rows, but the active party {fed.party!r} shares no training sample "
                f"with {passives}; check the ID columns or the scenario's aligned count"
            )
        rng = fed.rng("splitnn-train")
        train_pos, val_pos = split_validation(len(ids), cfg.train.validation_fraction, rng)
        train_ids, val_ids = ids[train_pos], ids[val_pos]
        widths: dict[str, int] = {}
        if passives:
            replies = fed.broadcast("splitnn.init", {"train_ids": train_ids, "val_ids": val_ids}, passives)
            for name, reply in replies.items():
                width = reply.get("width")
                if not isinstance(width, int) or width < 1:
                    raise ProtocolError(f"party {name!r} answered splitnn.init with width {width!r}")
                widths[name] = width
        self.passives_ = passives
        self.widths_ = widths
        self.bottom_ = mlp(data.n_features, cfg.active_bottom, None, activation=cfg.activation,
                           generator=fed.torch_generator("splitnn-bottom"))
        in_top = cfg.active_bottom[-1] + sum(widths.values())
        self.top_ = mlp(in_top, cfg.top, fed.n_outputs, activation=cfg.activation,
                        generator=fed.torch_generator("splitnn-top"))
        params = list(self.bottom_.parameters()) + list(self.top_.parameters())
        optimizer = adam(params, cfg.train)
        regression = fed.task == "regression"
        target_dtype = torch.float32 if regression else torch.long
        x_own = {"train": as_tensor(data.subset(train_ids).X), "val": as_tensor(data.subset(val_ids).X)}
        y_train = data.subset(train_ids).require_labels()
        y_val = data.subset(val_ids).require_labels()
        # Regression targets are standardised on the training rows, as the MLP estimator does: Adam's steps
        # assume unit scale, and a target of mean 2000 left SplitNN far from it when it stopped.
        self.y_mean_, self.y_scale_ = 0.0, 1.0
        if regression:
            self.y_mean_ = float(np.mean(y_train))
            self.y_scale_ = float(np.std(y_train)) or 1.0
            y_train = (y_train - self.y_mean_) / self.y_scale_
            y_val = (y_val - self.y_mean_) / self.y_scale_
        y_own = {"train": as_tensor(y_train, dtype=target_dtype), "val": as_tensor(y_val, dtype=target_dtype)}
        improved_last = False
        best: dict[str, Any] | None = None

        def loss_of(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return F.mse_loss(out.squeeze(1), y) if regression else F.cross_entropy(out, y)

        def forward_payloads(rows: np.ndarray, subset: str, training: bool) -> dict[str, Payload]:
            nonlocal improved_last
            payload: Payload = {"rows": rows.astype(np.int64), "subset": subset, "training": training,
                                "keep_previous": improved_last and not training}
            if not training:
                improved_last = False
            return {name: payload for name in passives}

        def forward_remote(rows: np.ndarray, subset: str, training: bool) -> list[torch.Tensor]:
            if not passives:
                return []
            replies = fed.exchange("splitnn.forward", forward_payloads(rows, subset, training))
            return [self._acts(name, replies[name], len(rows)) for name in passives]

        upcoming: PendingExchange | None = None

        def train_step(idx: np.ndarray, next_idx: np.ndarray | None) -> float:
            nonlocal upcoming
            self.bottom_.train()
            self.top_.train()
            # The own bottom first: over a network the passives' activations are still on their way.
            own = self.bottom_(x_own["train"][idx])
            if upcoming is not None:
                replies, upcoming = upcoming.result(), None
                remote = [self._acts(name, replies[name], len(idx)) for name in passives]
            else:
                remote = forward_remote(idx, "train", True)
            remote = [a.requires_grad_(True) for a in remote]
            out = self.top_(torch.cat([own, *remote], dim=1))
            loss = loss_of(out, y_own["train"][idx])
            optimizer.zero_grad()
            loss.backward()
            if passives:
                grads = {
                    name: {"grad": a.grad.numpy().astype(cfg.payload_dtype)}  # type: ignore[union-attr]
                    for name, a in zip(passives, remote, strict=True)
                }
                # Posted: it goes out with the next forward, one round trip per batch over a network.
                fed.post("splitnn.backward", grads)
                if next_idx is not None:
                    # The next batch's forward leaves now, before this step's update: the passives'
                    # work and the transfer overlap the active party's optimizer step and bottom.
                    upcoming = fed.exchange_async("splitnn.forward", forward_payloads(next_idx, "train", True))
            optimizer.step()
            return float(loss.detach())

        def validate() -> float:
            rows = np.arange(len(val_ids))
            remote = forward_remote(rows, "val", False)
            self.bottom_.eval()
            self.top_.eval()
            with torch.no_grad():
                out = self.top_(torch.cat([self.bottom_(x_own["val"]), *remote], dim=1))
                return float(loss_of(out, y_own["val"]))

        def on_improve(_epoch: int) -> None:
            nonlocal improved_last, best
            improved_last = True
            best = {"bottom": copy.deepcopy(self.bottom_.state_dict()), "top": copy.deepcopy(self.top_.state_dict())}

        self.history_: History = run_epochs(
            n_train=len(train_ids), config=cfg.train, rng=rng, train_step=train_step, lookahead=True,
            validate=validate if len(val_ids) else None,
            on_improve=on_improve if cfg.train.restore_best else None,
        )
        if passives:
            fed.broadcast("splitnn.finish", {"keep_previous": improved_last}, passives)
        if cfg.train.restore_best and best is not None:
            self.bottom_.load_state_dict(best["bottom"])
            self.top_.load_state_dict(best["top"])
        self.bottom_.eval()
        self.top_.eval()
        self.n_train_ = len(train_ids)

    def _acts(self, name: str, reply: Payload, n: int) -> torch.Tensor:
        acts = reply.get("acts")
        width = self.widths_[name]
        if not isinstance(acts, np.ndarray) or acts.shape != (n, width) or acts.dtype.kind != "f":
            shape = getattr(acts, "shape", None)
            raise ProtocolError(f"party {name!r} sent activations of shape {shape}, expected ({n}, {width})")
        return torch.as_tensor(acts, dtype=torch.float32)

    def predict(self, fed: Federation, ids: np.ndarray) -> np.ndarray:
        own = as_tensor(fed.serving.subset(ids).X)
        replies = fed.score_together("splitnn.predict", ids, self.passives_)
        remote = [self._acts(n, replies[n], len(ids)) for n in self.passives_]
        with torch.no_grad():
            out = self.top_(torch.cat([self.bottom_(own), *remote], dim=1))
        if fed.task == "regression":
            values: np.ndarray = out.squeeze(1).double().numpy() * self.y_scale_ + self.y_mean_
            return values
        result: np.ndarray = torch.softmax(out, dim=1).double().numpy()
        return result


def _state(ctx: NodeContext) -> dict[str, Any]:
    if "bottom" not in ctx.state:
        raise ProtocolError(f"party {ctx.party!r} got a splitnn message before splitnn.init")
    return ctx.state
