"""Entity Augmentation (Amalanshu et al.): split learning without aligning the guests' entities."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from vflo.comm.message import BOOL, IDS, INT, ArraySpec, Payload, floats
from vflo.data.datasets import Task
from vflo.errors import MethodError, ProtocolError
from vflo.federation.coordinator import Federation
from vflo.federation.node import NodeContext
from vflo.methods.base import Method, MethodConfig, handles
from vflo.nn.layers import build, output_size, validate
from vflo.nn.train import History, TrainConfig, adam, as_tensor

logger = logging.getLogger(__name__)

POSITIONS = ArraySpec(("int64",), (None,))
MASK = ArraySpec(("bool",), (None,))


@dataclass(frozen=True, kw_only=True)
class EntityAugmentationConfig(MethodConfig):
    """Networks as layer words (see :mod:`vflo.nn.layers`), the entities used, and fault handling.

    ``guest``: every guest's network (``guest_layers`` overrides it for named guests); ``host``: the
    host's layers before its output layer, which is added (1 unit for binary tasks, C otherwise).
    ``entities = 'all'``: each guest walks all of its entities the host has labels for, in its own
    order, and labels are interpolated (the method); ``'aligned'``: only entities every guest holds, in
    one shared order (standard split learning with the same networks and loss, the paper's baseline).
    ``on_missing``: what the host does when a guest does not answer a step in time: ``'reuse'`` its last
    activation and IDs (the paper's queue), ``'skip'`` the step, or ``'fail'``.
    """

    guest: tuple[str, ...] = ("linear 64", "relu")
    guest_layers: dict[str, tuple[str, ...]] = field(default_factory=dict)
    host: tuple[str, ...] = ("linear 64", "leaky_relu")
    entities: Literal["all", "aligned"] = "all"
    on_missing: Literal["reuse", "skip", "fail"] = "reuse"
    payload_dtype: Literal["float32", "float16"] = "float32"
    train: TrainConfig = field(default_factory=lambda: TrainConfig(
        lr=5e-4, batch_size=64, max_epochs=60, patience=0, validation_fraction=0.0))

    def __post_init__(self) -> None:
        validate(self.guest, "entity_augmentation guest")
        for name, spec in self.guest_layers.items():
            validate(spec, f"entity_augmentation guest_layers.{name}")
        if self.host:
            validate(self.host, "entity_augmentation host")


class EntityAugmentation(Method):
    """Entity Augmentation: Amalanshu et al., "Entity Augmentation for Efficient Classification of
    Vertically Partitioned Data with Limited Overlap" (Algorithm 1).

    A label-only host and G guests; no private set intersection and no alignment. At each step every
    guest sends the activations a_i of its own next entities j_i (its own order) with their IDs; the
    host predicts from [a_1, ..., a_G] and trains on the interpolated label
        ỹ = Σ_i w_i y_{j_i} / Σ_i w_i,   w_i = width of a_i,
    with binary cross-entropy on logits, L = BCE(h([a_1..a_G]), ỹ) (one-hot ỹ for several classes);
    gradients go back to each guest. A guest that does not answer in time is replaced by its last
    activation and IDs. Inference is collaborative on entities every guest holds.
    """

    name = "entity_augmentation"
    Config = EntityAugmentationConfig
    summary = "split learning on every guest's own entities with interpolated labels (no alignment)"
    paper = "Amalanshu et al., Entity Augmentation"
    inference = "collaborative"
    tasks: ClassVar[frozenset[Task]] = frozenset({"binary", "multiclass"})

    config: EntityAugmentationConfig

    def check_task(self, task: Task) -> None:
        if task not in self.tasks:
            raise MethodError(
                "entity_augmentation interpolates class labels, so it needs a classification task; regression is "
                "out of scope for this method (the paper leaves it to future work): use splitnn instead"
            )

    # -- guests -----------------------------------------------------------------------------------

    def _layers(self, ctx: NodeContext) -> tuple[str, ...]:
        return tuple(self.config.guest_layers.get(ctx.party, self.config.guest))

    @handles("ea.init")
    def _init(self, ctx: NodeContext, payload: Payload) -> Payload:
        """Build this guest's network; tell the host its width and the entities it could send."""
        data = ctx.require_data()
        if data.n_features == 0:
            raise MethodError(f"guest {ctx.party!r} holds no features; every guest needs at least one column")
        net = build(data.n_features, self._layers(ctx), generator=ctx.torch_generator("ea-guest"))
        width = output_size(net, data.n_features)
        ctx.state.update(net=net, optimizer=adam(net.parameters(), self.config.train), pending=None)
        return {"ids": data.ids, "width": width}

    @handles("ea.entities", mask=MASK, shared=BOOL)
    def _entities(self, ctx: NodeContext, payload: Payload) -> Payload:
        """The entities this guest will walk: those the host can label (and, if shared, in ID order)."""
        data = ctx.require_data()
        mask = payload["mask"]
        assert isinstance(mask, np.ndarray)
        if mask.shape != (data.n_samples,):
            raise ProtocolError(f"ea.entities: mask of {mask.shape[0]} flags for {data.n_samples} entities")
        ids = np.sort(data.ids[mask]) if payload["shared"] else data.ids[mask]
        ctx.state.update(ids=ids, x=as_tensor(data.subset(ids).X), order=np.empty(0, dtype=np.int64), cursor=0,
                         rng=ctx.rng("ea-walk"))
        return {"count": int(mask.sum())}

    def _next_positions(self, st: dict[str, Any], n: int) -> np.ndarray:
        """The guest's own walk: a fresh shuffle of its entities each time it runs out."""
        picked: list[np.ndarray] = []
        while n > 0:
            if st["cursor"] >= len(st["order"]):
                st["order"] = st["rng"].permutation(len(st["ids"]))
                st["cursor"] = 0
            take = st["order"][st["cursor"] : st["cursor"] + n]
            st["cursor"] += len(take)
            picked.append(take)
            n -= len(take)
        return np.concatenate(picked)

    @handles("ea.forward", n=INT, positions=POSITIONS)
    def _forward(self, ctx: NodeContext, payload: Payload) -> Payload:
        st = _guest_state(ctx)
        positions = payload["positions"]
        assert isinstance(positions, np.ndarray)
        if len(positions) == 0:
            positions = self._next_positions(st, int(payload["n"]))
        elif positions.max(initial=-1) >= len(st["ids"]):
            raise ProtocolError("ea.forward: a position beyond this guest's entities")
        net: nn.Module = st["net"]
        net.train()
        out = net(st["x"][torch.as_tensor(positions)])
        st["pending"] = out
        return {"acts": out.detach().numpy().astype(self.config.payload_dtype), "ids": st["ids"][positions]}

    @handles("ea.backward", grad=floats(None, None))
    def _backward(self, ctx: NodeContext, payload: Payload) -> Payload:
        st = _guest_state(ctx)
        out = st["pending"]
        grad = payload["grad"]
        assert isinstance(grad, np.ndarray)
        if out is None or grad.shape != tuple(out.shape):
            raise ProtocolError("ea.backward does not match the last ea.forward of this guest")
        st["optimizer"].zero_grad()
        out.backward(torch.as_tensor(grad, dtype=torch.float32))
        st["optimizer"].step()
        st["pending"] = None
        return {}

    @handles("ea.predict", ids=IDS)
    def _predict_rows(self, ctx: NodeContext, payload: Payload) -> Payload:
        st = _guest_state(ctx)
        ids = payload["ids"]
        assert isinstance(ids, np.ndarray)
        net: nn.Module = st["net"]
        net.eval()
        with torch.no_grad():
            acts = net(as_tensor(ctx.rows("serve").subset(ids).X))
        return {"acts": acts.numpy().astype(self.config.payload_dtype)}

    # -- host ---------------------------------------------------------------------------------------

    def fit(self, fed: Federation) -> None:
        cfg = self.config
        host = fed.data
        y_all = host.require_labels()
        if host.n_features:
            raise MethodError(
                f"entity_augmentation expects a label-only host (the paper's setting), but {fed.party!r} holds "
                f"{host.n_features} feature columns: give the active party columns = []"
            )
        guests = fed.names("passive")
        if not guests:
            raise MethodError("entity_augmentation needs at least one guest (passive party)")
        labelled = set(host.ids.tolist())
        inits = fed.broadcast("ea.init", {}, guests)
        widths, masks = {}, {}
        for g in guests:
            ids, width = inits[g].get("ids"), inits[g].get("width")
            if not isinstance(ids, np.ndarray) or not isinstance(width, int):
                raise ProtocolError(f"guest {g!r} answered ea.init without its IDs and width")
            if width < 1:
                raise MethodError(f"guest {g!r} produces activations of width {width}; every guest needs width >= 1")
            widths[g] = width
            masks[g] = np.fromiter((v in labelled for v in ids.tolist()), dtype=bool, count=len(ids))
            if not masks[g].any():
                raise MethodError(
                    f"the host {fed.party!r} holds no label for any of guest {g!r}'s {len(ids)} entities; guests "
                    "must share entities with the host (check the ID columns)"
                )
        shared = cfg.entities == "aligned"
        if shared:
            common = set.intersection(*(set(np.asarray(inits[g]["ids"])[masks[g]].tolist()) for g in guests))
            if not common:
                raise MethodError("entities = 'aligned' but no entity is held by every guest")
            for g in guests:
                ids = inits[g]["ids"]
                assert isinstance(ids, np.ndarray)
                masks[g] = np.fromiter((v in common for v in ids.tolist()), dtype=bool, count=len(ids))
        counts = {}
        for g, reply in fed.exchange("ea.entities", {g: {"mask": masks[g], "shared": shared} for g in guests}).items():
            count = reply.get("count")
            if not isinstance(count, int):
                raise ProtocolError(f"guest {g!r} answered ea.entities without a count")
            counts[g] = count
        self.guests_, self.widths_ = guests, widths
        self.entities_used_ = counts
        n_out = 1 if fed.task == "binary" else int(fed.n_classes or 2)
        total = sum(widths.values())
        self.host_ = build(total, (*cfg.host, f"linear {n_out}"), generator=fed.torch_generator("ea-host"))
        optimizer = adam(self.host_.parameters(), cfg.train)
        label_of = {v: i for i, v in enumerate(host.ids.tolist())}
        onehot = np.eye(max(n_out, 2), dtype=np.float32)[y_all] if n_out > 1 else y_all.astype(np.float32)[:, None]
        weights = np.array([widths[g] for g in guests], dtype=np.float32)
        bs = cfg.train.batch_size
        steps = int(np.ceil(max(counts.values()) / bs))
        rng = fed.rng("ea-host-order")
        last: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self.reuses_ = dict.fromkeys(guests, 0)
        self.skipped_steps_ = 0
        self.history_ = History(monitor="loss")
        shared_n = counts[guests[0]]
        for epoch in range(cfg.train.max_epochs):
            order = rng.permutation(shared_n) if shared else None
            total_loss, seen = 0.0, 0
            for step in range(steps):
                if order is not None:
                    positions = order[step * bs : (step + 1) * bs].astype(np.int64)
                    request: Payload = {"n": len(positions), "positions": positions}
                else:
                    # Each guest picks its own next entities: the host asks only for how many.
                    request = {"n": bs, "positions": np.empty(0, dtype=np.int64)}
                replies, failures = fed.exchange_tolerant("ea.forward", dict.fromkeys(guests, request))
                batch = self._assemble(guests, replies, failures, last)
                if batch is None:
                    self.skipped_steps_ += 1
                    continue
                acts, ids_by_guest, answered = batch
                rows = min(len(i) for i in ids_by_guest)
                inputs = [a[:rows].requires_grad_(True) for a in acts]
                label_rows = np.stack([[label_of[v] for v in ids[:rows].tolist()] for ids in ids_by_guest])
                target = torch.as_tensor(interpolated_labels(onehot[label_rows], weights))
                self.host_.train()
                logits = self.host_(torch.cat(inputs, dim=1))
                loss = F.binary_cross_entropy_with_logits(logits, target)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                grads = {g: {"grad": inputs[k].grad.numpy().astype(cfg.payload_dtype)}  # type: ignore[union-attr]
                         for k, g in enumerate(guests) if g in answered}
                if grads:
                    fed.exchange_tolerant("ea.backward", grads)
                total_loss += float(loss.detach()) * rows
                seen += rows
            self.history_.epochs.append({"epoch": float(epoch), "loss": total_loss / max(seen, 1)})
        for g, n in self.reuses_.items():
            if n:
                logger.warning("entity_augmentation: guest %r did not answer %d step(s); its last activation was "
                               "reused", g, n)
        self.host_.eval()

    def _assemble(
        self, guests: list[str], replies: dict[str, Payload], failures: dict[str, Any],
        last: dict[str, tuple[np.ndarray, np.ndarray]],
    ) -> tuple[list[torch.Tensor], list[np.ndarray], set[str]] | None:
        """Activations and IDs for this step, from replies or (policy permitting) each guest's queue."""
        acts, ids = [], []
        for g in guests:
            if g in replies:
                a, i = replies[g].get("acts"), replies[g].get("ids")
                if not (isinstance(a, np.ndarray) and isinstance(i, np.ndarray)):
                    raise ProtocolError(f"guest {g!r} sent no activations or IDs")
                if a.shape != (len(i), self.widths_[g]):
                    raise ProtocolError(f"guest {g!r} sent malformed activations")
                last[g] = (a.astype(np.float32), i)
            else:
                if self.config.on_missing == "fail":
                    raise failures[g]
                if self.config.on_missing == "skip" or g not in last:
                    return None
                self.reuses_[g] += 1
            a, i = last[g]
            acts.append(torch.as_tensor(a))
            ids.append(i)
        return acts, ids, set(replies)

    def predict(self, fed: Federation, ids: np.ndarray) -> np.ndarray:
        replies = fed.score_together("ea.predict", ids, self.guests_)
        acts = []
        for g in self.guests_:
            a = replies[g].get("acts")
            if not isinstance(a, np.ndarray) or a.shape != (len(ids), self.widths_[g]):
                raise ProtocolError(f"guest {g!r} sent malformed activations for scoring")
            acts.append(torch.as_tensor(a, dtype=torch.float32))
        with torch.no_grad():
            probs = torch.sigmoid(self.host_(torch.cat(acts, dim=1))).double().numpy()
        if probs.shape[1] == 1:
            return np.hstack([1.0 - probs, probs])
        result: np.ndarray = probs / np.clip(probs.sum(axis=1, keepdims=True), 1e-12, None)
        return result

    def summary_stats(self) -> dict[str, float]:
        return {
            "entities_used": float(sum(self.entities_used_.values())),
            "reused_activations": float(sum(self.reuses_.values())),
            "skipped_steps": float(self.skipped_steps_),
        }


def interpolated_labels(labels: np.ndarray, widths: np.ndarray) -> np.ndarray:
    """ỹ_k = Σ_i w_i y_{i,k} / Σ_i w_i for guests i (axis 0) and rows k (axis 1); labels one-hot or 0/1."""
    if labels.shape[0] != len(widths) or np.any(widths <= 0):
        raise ValueError("one positive width per guest is needed to interpolate labels")
    out: np.ndarray = np.tensordot(widths.astype(np.float32), labels.astype(np.float32), axes=(0, 0)) / widths.sum()
    return out.astype(np.float32)


def _guest_state(ctx: NodeContext) -> dict[str, Any]:
    if "ids" not in ctx.state:
        raise ProtocolError(f"guest {ctx.party!r} got a step before ea.init and ea.entities")
    return ctx.state
