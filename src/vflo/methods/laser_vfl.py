"""LASER-VFL: one family of split networks that trains on every row any subset of parties holds and scores a
person from the parties that hold them."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from vflo.comm.message import Payload
from vflo.errors import ConfigError, ProtocolError
from vflo.methods.base import Claim, Inference, Layout
from vflo.methods.saved import Saved, Saves, network
from vflo.methods.split_learning import BOTTOM, HeldRowsTrainer, SplitPart, holders_activations
from vflo.methods.splitnn import SplitNN, SplitNNConfig
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

    from vflo.party.port import Federation
    from vflo.roles import PartyInfo
else:
    from vflo.lazy import functional as F
    from vflo.lazy import torch


@dataclass(frozen=True, kw_only=True)
class LaserVFLConfig(SplitNNConfig):
    """Every party's bottom (``active_bottom``, ``passive_bottom``: hidden widths, the last the cut layer, the same
    for every party: representations are averaged) and one head per party at the active party (``top``: hidden
    widths before each head's output layer; empty, the paper's single linear layer). The networks follow the
    authors' tabular setting (Credit: 5 -> 10 -> 10 -> 10 bottoms, linear heads); training is vflo's default, as
    SplitNN's (:class:`~vflo.nn.train.TrainConfig`: early stopping on a validation share, smaller batches on a
    small table). The authors' training (Adam 1e-4, weight decay 1e-3, batch 128, 100 epochs, the last one kept)
    is made for Credit's 24,000 training people, about 19,000 steps; on a table of a hundred people it is a
    hundred steps of 1e-4, too few to learn anything. configs/papers/laser_vfl_credit.toml sets it."""

    passive_bottom: tuple[int, ...] = (10, 10, 10)
    active_bottom: tuple[int, ...] = (10, 10, 10)
    top: tuple[int, ...] = ()
    train: TrainConfig = field(default_factory=TrainConfig)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.passive_bottom[-1] != self.active_bottom[-1]:
            raise ConfigError(f"laser_vfl averages the parties' representations, so every bottom ends in the same "
                              f"cut width: active_bottom ends in {self.active_bottom[-1]}, passive_bottom in "
                              f"{self.passive_bottom[-1]}")


class LaserVFL(SplitNN):
    """LASER-VFL: Valdeira, Wang, Chi, "Vertical Federated Learning with Missing Features During Training and
    Inference" (ICLR 2025, arXiv 2410.22564).

    Every party j has a bottom f_j (its representation z_j = f_j(x^j)); party i has a head g_i. A person held by
    the blocks O is predicted by any subset S ⊆ O through g_i(mean_{j∈S} z_j) for i ∈ S, so one set of
    parameters covers every subset. Training samples, for every observed head i and every size k, one subset S
    of O with i ∈ S and |S| = k ("task sampling") and minimises
        L = Σ_{i∈O} Σ_{k=1..|O|} C(|O|-1, k-1) / k · ℓ(g_i(mean_{j∈S_ik} z_j), y)
    (ℓ cross-entropy, or squared error on the standardised target). A person is scored by the mean of the
    heads i ∈ O of g_i(mean_{j∈O} z_j) (class probabilities averaged).

    Where vflo differs: every head sits at the active party (the only label holder), not at each client; the
    active party's block is always observed (it holds the labels and the people), and O is each person's real
    set of holders (who holds them), not a pattern drawn per batch; task subsets are drawn per group of people
    with the same O in a batch. Passive parties run SplitNN's bottom steps (``splitnn.init``,
    ``splitnn.forward``, ``split.backward``), each for the people of a batch it holds.
    """

    name = "laser_vfl"
    Config = LaserVFLConfig
    summary = "split networks for every subset of parties (trains on every row, scores with whoever holds the person)"
    paper = "Valdeira, Wang, Chi, LASER-VFL (ICLR 2025)"
    claims: ClassVar[tuple[Claim, ...]] = (
        Claim(text=("LASER-VFL's claim, ahead of SplitNN with an active-only fallback when partners are absent "
                    "at scoring"),
              axis="absent", at="half", scored="missing", against="splitnn"),
        Claim(text="LASER-VFL against the active party alone when every partner is absent at scoring",
              axis="absent", at="largest", scored="missing", against="local"),
    )
    quick: ClassVar[Mapping[str, Any]] = {
        "train": {"max_epochs": 2, "patience": 0, "batch_size": 64, "validation_fraction": 0.2}}
    inference: ClassVar[Inference] = "collaborative"
    any_subset: ClassVar[bool] = True
    saves: ClassVar[Saves] = Saves(
        model=(*(s for s in SplitNN.saves.model if s.name not in ("bottom", "top")),
               Saved("bottom", network(lambda at: at.method.active_bottom_net(at.where)), "its own bottom network"),
               Saved("heads", network(lambda at: at.method.heads_net(at.where)), "one head per party")),
        part=SplitPart, parts={"passive": (BOTTOM,)})

    config: LaserVFLConfig

    def agreed(self, role: str) -> dict[str, Any]:
        return {"the cut width (passive_bottom's last)": self.config.passive_bottom[-1]} if role == "passive" else {}

    def scoring_parties(self, parties: tuple[PartyInfo, ...]) -> list[str]:
        return []  # a person is scored by whoever of the partners holds them: none is required

    @classmethod
    def layout_settings(cls, layout: Layout, *, first_hop: str = "", second_hop: str = "") -> dict[str, Any] | str:
        return {"partners": [first_hop]} if layout == "second_hop" else {}

    # -- the active party ---------------------------------------------------------------------------------

    def fit(self, fed: Federation) -> None:
        cfg = self.config
        data = fed.data
        data.require_labels()
        passives = self._partners(fed)
        ids = data.ids
        alignment = fed.align(ids, passives) if passives else None
        held = {p: alignment.holding(p, ids) for p in passives} if alignment else {}
        # Batches and validation rows are named to the partners: public choices, from the run seed.
        rng = fed.shared_rng("laser-train")
        train_pos, val_pos = split_validation(len(ids), cfg.train.validation_fraction, rng)
        widths: dict[str, int] = {}
        if passives:
            requests: dict[str, Payload] = {p: {"train_ids": ids[train_pos][held[p][train_pos]],
                                                "val_ids": ids[val_pos][held[p][val_pos]]} for p in passives}
            for name, reply in fed.exchange("splitnn.init", requests).items():
                width = reply.integer("width")
                if width != cfg.active_bottom[-1]:
                    raise ProtocolError(f"party {name!r} answered splitnn.init with width {width!r}; laser_vfl "
                                        f"averages representations of width {cfg.active_bottom[-1]}")
                widths[name] = width
        self.passives_, self.widths_, self.in_dim_ = passives, widths, data.n_features
        self.bottom_, self.heads_ = self.active_bottom_net(fed), self.heads_net(fed)
        y = data.require_labels()
        if cfg.label_epsilon is not None:  # every label it trains or validates on, randomised once
            y = self.private_labels(fed, ids, y)
        self.y_mean_, self.y_scale_ = 0.0, 1.0
        if fed.task == "regression":
            self.y_mean_ = float(np.mean(y[train_pos]))
            self.y_scale_ = float(np.std(y[train_pos])) or 1.0
            y = (y - self.y_mean_) / self.y_scale_
        trainer = _LaserTrainer(self, fed, x=data.X, y=y, held=held, train_pos=train_pos, val_pos=val_pos, rng=rng)
        self.history_: History = trainer.fit()
        self.n_train_ = len(train_pos)
        self.observed_ = {"+".join(k): v for k, v in trainer.patterns.items()}

    def active_bottom_net(self, fed: Federation) -> nn.Module:
        """A new bottom network over the active party's own columns (fit, and a saved model's restore)."""
        from vflo.nn.models import mlp

        cfg = self.config
        return mlp(self.in_dim_, cfg.active_bottom, None, activation=cfg.activation,
                   generator=fed.torch_generator("laser-bottom"))

    def heads_net(self, fed: Federation) -> nn.ModuleList:
        """New heads, one per party's block (fit, and a saved model's restore)."""
        from vflo.nn.models import mlp

        cfg = self.config
        self.n_out_ = fed.n_outputs
        generator = fed.torch_generator("laser-heads")
        return torch.nn.ModuleList([mlp(cfg.active_bottom[-1], cfg.top, fed.n_outputs, activation=cfg.activation,
                                        generator=generator) for _ in range(1 + len(self.passives_))])

    def combine(self, z: list[torch.Tensor], mask: np.ndarray, *, regression: bool) -> torch.Tensor:
        """Each row's prediction from the blocks it holds (``mask``: rows x blocks, block 0 the active party's):
        the mean over its heads i of g_i(mean of its blocks' representations); probabilities for classes."""
        out = torch.zeros(len(mask), self.n_out_)
        for blocks, positions in holder_groups(mask):
            rows = torch.as_tensor(positions)
            mean = torch.stack([z[j][rows] for j in blocks]).mean(dim=0)
            heads = [self.heads_[i](mean) for i in blocks]
            each = heads if regression else [torch.softmax(h, dim=1) for h in heads]
            out = out.index_copy(0, rows, torch.stack(each).mean(dim=0))
        return out

    def predict(self, fed: Federation, ids: np.ndarray) -> np.ndarray:
        return self.predict_by(fed, ids)[0]

    def predict_by(self, fed: Federation, ids: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        self.bottom_.eval()
        self.heads_.eval()
        with torch.no_grad():
            z = [self.bottom_(as_tensor(fed.serving.subset(ids).X))]
        remote, held = holders_activations(fed, ids, self.passives_, self.widths_)
        mask = np.column_stack([np.ones(len(ids), dtype=bool), *(held[p] for p in self.passives_)])
        z += remote
        with torch.no_grad():
            out = self.combine(z, mask, regression=fed.task == "regression")
        if fed.task == "regression":
            values: np.ndarray = out.squeeze(1).double().numpy() * self.y_scale_ + self.y_mean_
            return values, held
        result: np.ndarray = out.double().numpy()
        return result, held

    def summary_stats(self) -> dict[str, float]:
        """Epochs, and how many training people each set of holders had (``observed_active+p1``: ...)."""
        return {**self.history_.summary(), **{f"observed_{k}": float(v) for k, v in self.observed_.items()}}


def holder_groups(mask: np.ndarray) -> list[tuple[list[int], np.ndarray]]:
    """The rows of ``mask`` (rows x blocks) grouped by the set of blocks that hold them: (blocks, row positions)
    per set, in the same order for the same mask (tuples of booleans hash alike in every process)."""
    patterns = {tuple(row) for row in mask.tolist()}
    return [([j for j, seen in enumerate(pattern) if seen], np.flatnonzero((mask == np.asarray(pattern)).all(axis=1)))
            for pattern in patterns]


def task_weight(observed: int, size: int) -> float:
    """C(n-1, k-1) / k: the weight of a sampled subset of ``size`` k among ``observed`` n blocks (the authors')."""
    return math.comb(observed - 1, size - 1) / size


class _LaserTrainer(HeldRowsTrainer):
    """The active party's steps: each partner's activations of the batch's people it holds, every observed
    head trained on sampled subsets, each partner's gradient back."""

    def __init__(self, method: LaserVFL, fed: Federation, *, x: np.ndarray, y: np.ndarray,
                 held: dict[str, np.ndarray], train_pos: np.ndarray, val_pos: np.ndarray,
                 rng: np.random.Generator) -> None:
        super().__init__(method.config.train, rng, fed, method.passives_, held=held,
                         subsets={"train": train_pos, "val": val_pos}, widths=method.widths_)
        self.m = method
        self.regression = fed.task == "regression"
        target = torch.float32 if self.regression else torch.long
        self.x = {"train": as_tensor(x[train_pos]), "val": as_tensor(x[val_pos])}
        self.y = {"train": as_tensor(y[train_pos], dtype=target), "val": as_tensor(y[val_pos], dtype=target)}
        # Per subset: which blocks hold each row (block 0, the active party's, every row).
        self.mask = {name: np.column_stack([np.ones(len(pos), dtype=bool), *self.held[name].values()])
                     for name, pos in (("train", train_pos), ("val", val_pos))}
        self.patterns: dict[tuple[str, ...], int] = {}
        names = ["active", *method.passives_]
        for blocks, positions in holder_groups(self.mask["train"]):
            self.patterns[tuple(names[j] for j in blocks)] = len(positions)
        self.modules = {"bottom": method.bottom_, "heads": method.heads_}
        self.optimizer = adam([*method.bottom_.parameters(), *method.heads_.parameters()], self.config)
        # Which subsets the heads train on is the active party's own choice, never sent: its own stream.
        self.tasks = fed.rng("laser-tasks")
        self.payload_dtype = method.config.payload_dtype

    @property
    def n_train(self) -> int:
        return len(self.y["train"])

    def sampling_labels(self) -> np.ndarray | None:
        return None if self.regression else self.y["train"].numpy()

    def _loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(out.squeeze(1), y) if self.regression else F.cross_entropy(out, y)

    def train_step(self, batch: np.ndarray, upcoming: np.ndarray | None) -> float:
        m = self.m
        m.bottom_.train()
        m.heads_.train()
        mask = self.mask["train"][batch]
        remote = {p: a.requires_grad_(True) for p, a in self.remote(batch, "train", True).items()}
        z = [m.bottom_(self.x["train"][batch]), *self.in_place(remote, batch, "train")]
        y = self.y["train"][batch]
        loss = torch.zeros(())
        for blocks, positions in holder_groups(mask):
            rows = torch.as_tensor(positions)
            share = len(positions) / len(batch)
            for i in blocks:
                others = [j for j in blocks if j != i]
                for size in range(1, len(blocks) + 1):
                    chosen = [i, *(self.tasks.choice(others, size - 1, replace=False).tolist() if size > 1 else [])]
                    mean = torch.stack([z[j][rows] for j in chosen]).mean(dim=0)
                    loss = loss + share * task_weight(len(blocks), size) * self._loss(m.heads_[i](mean), y[rows])
        self.optimizer.zero_grad()
        loss.backward()
        if remote:
            self.fed.post("split.backward", {p: {"grad": a.grad.numpy().astype(self.payload_dtype)}  # type: ignore[union-attr]  # backward() just filled grad
                                             for p, a in remote.items()})
        self.optimizer.step()
        return float(loss.detach())

    @property
    def validates(self) -> bool:
        return len(self.y["val"]) > 0

    def validation_loss(self) -> float | None:
        if not self.validates:
            return None
        m = self.m
        batch = np.arange(len(self.y["val"]))
        remote = self.remote(batch, "val", False)
        m.bottom_.eval()
        m.heads_.eval()
        with torch.no_grad():
            z = [m.bottom_(self.x["val"]), *self.in_place(remote, batch, "val")]
            out = m.combine(z, self.mask["val"], regression=self.regression)
            if self.regression:
                return float(F.mse_loss(out.squeeze(1), self.y["val"]))
            return float(F.nll_loss(torch.log(out.clamp_min(1e-12)), self.y["val"]))

    def model_state(self) -> dict[str, Any]:
        return {**super().model_state(), "tasks": json.dumps(self.tasks.bit_generator.state)}

    def load_model_state(self, state: Mapping[str, Any]) -> None:
        super().load_model_state(state)
        self.tasks.bit_generator.state = json.loads(str(state["tasks"]))
