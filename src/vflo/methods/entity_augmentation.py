"""Entity Augmentation (Amalanshu et al.): split learning without aligning the guests' entities."""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np

from vflo.align import psi
from vflo.comm.message import BOOL, IDS, INT, ArraySpec, Fields, Payload, Reply, expect_rows
from vflo.data.datasets import Task
from vflo.dp import DPSGD, GaussianNoise, PrivacyPlan, RandomisedResponse
from vflo.errors import ConfigError, MethodError, ProtocolError, RefusedError
from vflo.methods.base import Claim, Layout, Method, MethodConfig, handles, reveals
from vflo.methods.saved import INTEGER, PARTY_NAMES, WIDTHS, Part, Saved, Saves, network
from vflo.methods.split_learning import (
    BOTTOM,
    RemoteBottomsTrainer,
    SplitPart,
    SplitParty,
    bottom_of,
    bottom_scope,
    labels_scope,
    randomised_labels,
    remote_activations,
)
from vflo.nn.train import (
    History,
    TrainConfig,
    adam,
    as_tensor,
    load_module_state,
    load_optimizer_state,
    module_state,
    optimizer_state,
    split_validation,
)
from vflo.nn.words import validate

if TYPE_CHECKING:
    import torch
    from torch import nn
    from torch.nn import functional as F

    from vflo.party.context import NodeContext
    from vflo.party.port import Federation
else:
    from vflo.lazy import functional as F
    from vflo.lazy import torch

logger = logging.getLogger(__name__)

POSITIONS = ArraySpec(("int64",), (None,))
MASK = ArraySpec(("bool",), (None,))


@dataclass(frozen=True, kw_only=True)
class EntityAugmentationConfig(MethodConfig):
    """Networks as layer words (see :mod:`vflo.nn.layers`), the entities used, and fault handling.

    ``guest``: every guest's network (``guest_layers`` overrides it for named guests); ``host``: the
    host's layers before its output layer, which is added (1 unit for binary tasks, C otherwise).
    ``host_features = 'use'``: a host that holds feature columns is its own guest: ``host_bottom`` (layer
    words) over its columns, walking its own labelled entities in its own order, its activation beside the
    guests' and its label weighted by its width; ``'ignore'`` leaves its columns unused (the paper's label-only
    host). A host with no columns is label-only either way.
    ``entities = 'all'``: each guest walks all of its entities the host has labels for, in its own
    order, and labels are interpolated (the method); ``'aligned'``: only entities every guest holds, in
    one shared order (standard split learning with the same networks and loss, the paper's baseline).
    ``ids``: how the host learns which of its labelled people each guest holds. ``'clear'`` (the paper): every
    guest sends the host all its IDs, people the host does not know included, and the host answers which it
    labels. ``'blinded'``: the host runs private set intersection with each guest (ECDH, as ``[alignment]
    method = 'psi'``; only the host learns the result) and so learns only which of its own people a guest
    holds; it then tells each guest which of the guest's people to walk, as in ``'clear'``.
    ``on_missing``: what the host does when a guest does not answer a step in time: ``'reuse'`` its last
    activation and IDs (the paper's queue), ``'skip'`` the step, or ``'fail'`` (any forward or backward
    message a guest does not answer ends the run). ``train.validation_fraction`` > 0 holds out that share of
    the labelled entities every guest holds: they are scored every epoch (true labels, no interpolation)
    and drive early stopping as for every other network; 0 (the paper's setting) trains ``max_epochs``.
    Defences (off by default, see :mod:`vflo.dp`): a guest's ``activation_noise`` clips and noises every activation
    it sends, and its ``dp_sgd`` trains its network by DP-SGD (each step drawing its rows from the batch it walks);
    the host's epoch is one pass over the largest guest's entities, so a smaller guest walks its own more than once:
    a noised guest releases each person at most ``passes`` times an epoch (its plan counts that many) and refuses
    a step past it. ``label_epsilon``: the host randomises its labels once, at that ε, before training.
    """

    guest: tuple[str, ...] = ("linear 64", "relu")
    guest_layers: dict[str, tuple[str, ...]] = field(default_factory=dict)
    host: tuple[str, ...] = ("linear 64", "leaky_relu")
    host_features: Literal["use", "ignore"] = "use"
    host_bottom: tuple[str, ...] = ("linear 64", "relu")
    entities: Literal["all", "aligned"] = "all"
    ids: Literal["clear", "blinded"] = "clear"
    on_missing: Literal["reuse", "skip", "fail"] = "reuse"
    payload_dtype: Literal["float32", "float16"] = "float32"
    train: TrainConfig = field(default_factory=lambda: TrainConfig(
        lr=5e-4, batch_size=64, max_epochs=60, patience=0, validation_fraction=0.0))
    activation_noise: GaussianNoise | None = None
    dp_sgd: DPSGD | None = None
    passes: int = 2
    label_epsilon: float | None = None

    def __post_init__(self) -> None:
        if self.dp_sgd is not None and self.activation_noise is None:
            raise ConfigError("entity_augmentation: dp_sgd makes a guest's network private, not the activations it "
                              "sends; give activation_noise too, so that every activation is a Gaussian release")
        if self.train.sampling != "shuffle" or self.train.lr_schedule != "constant":
            raise ConfigError("entity_augmentation: each guest walks its own entities on its own clock, so the host's "
                              "train.sampling and train.lr_schedule cannot reach them; leave them at 'shuffle' and "
                              "'constant'")
        if self.passes < 1:
            raise ConfigError(f"entity_augmentation: passes is how many times a noised guest walks its entities in "
                              f"an epoch, at least 1; got {self.passes}")
        if self.label_epsilon is not None:
            RandomisedResponse(epsilon=self.label_epsilon)
        validate(self.guest, "entity_augmentation guest")
        for name, spec in self.guest_layers.items():
            validate(spec, f"entity_augmentation guest_layers.{name}")
        if self.host:
            validate(self.host, "entity_augmentation host")
        validate(self.host_bottom, "entity_augmentation host_bottom")


class Walk:
    """A walk over entities of one's own (a guest's, or the host's over its own): their IDs and rows, and a fresh
    shuffle from one's own generator each time it runs out."""

    def __init__(self, ids: np.ndarray, x: torch.Tensor | None, rng: np.random.Generator) -> None:
        self.ids, self.x, self.rng = ids, x, rng
        self.order = np.empty(0, dtype=np.int64)
        self.cursor = 0

    def next(self, n: int) -> np.ndarray:
        picked: list[np.ndarray] = []
        while n > 0:
            if self.cursor >= len(self.order):
                self.order, self.cursor = self.rng.permutation(len(self.ids)), 0
            take = self.order[self.cursor:self.cursor + n]
            self.cursor += len(take)
            picked.append(take)
            n -= len(take)
        return np.concatenate(picked)

    def state(self, prefix: str) -> dict[str, Any]:
        """Where the walk stands, for a checkpoint."""
        return {prefix + "rng": json.dumps(self.rng.bit_generator.state), prefix + "order": self.order,
                prefix + "cursor": self.cursor}

    def restore(self, state: Mapping[str, Any], prefix: str) -> None:
        self.rng.bit_generator.state = json.loads(str(state[prefix + "rng"]))
        self.order = np.asarray(state[prefix + "order"], dtype=np.int64)
        self.cursor = int(state[prefix + "cursor"])


@dataclass
class GuestPart(Part):
    """A guest's side beside its bottom network: whether it built that network this run, and its walk."""

    initialised: bool = False
    walk: Walk | None = None


class EntityAugmentation(SplitParty, Method):
    """Entity Augmentation: Amalanshu et al., "Entity Augmentation for Efficient Classification of
    Vertically Partitioned Data with Limited Overlap" (Algorithm 1).

    A label-only host and G guests; no private set intersection and no alignment. At each step every
    guest sends the activations a_i of its own next entities j_i (its own order) with their IDs; the
    host predicts from [a_1, ..., a_G] and trains on the interpolated label
        ỹ = Σ_i w_i y_{j_i} / Σ_i w_i,   w_i = width of a_i,
    with binary cross-entropy on logits, L = BCE(h([a_1..a_G]), ỹ) (one-hot ỹ for several classes);
    gradients go back to each guest. A guest that does not answer in time is replaced by its last
    activation and IDs. Inference is collaborative on entities every guest holds.

    Where vflo differs: the paper's host holds labels only. A host that holds features (the usual layout)
    is here its own guest 0, L = BCE(h([a_0, a_1..a_G]), ỹ) with a_0 = its bottom on its own next entities
    j_0 and w_0 its width in ỹ; its walk covers every labelled entity it holds, shared or not, and its
    network never leaves it (``host_features = 'ignore'``: the paper's setting).
    """

    name = "entity_augmentation"
    Config = EntityAugmentationConfig
    summary = "split learning on every guest's own entities with interpolated labels (no alignment)"
    paper = "Amalanshu et al., Entity Augmentation"
    claims: ClassVar[tuple[Claim, ...]] = (
        Claim(text="Entity Augmentation's claim, the records partners do not share help split learning",
              axis="aligned", at="smallest", scored="aligned", against="splitnn"),
    )
    label_only_active = True
    quick: ClassVar[Mapping[str, Any]] = {
        "train": {"max_epochs": 2, "patience": 0, "batch_size": 64, "validation_fraction": 0.0}}
    inference = "collaborative"
    checkpointed = ("train",)
    tasks: ClassVar[frozenset[Task]] = frozenset({"binary", "multiclass"})
    # A guest's network and its steps are its own; whether its IDs go out in the clear is shared, so a guest
    # that says ids = 'blinded' in its own config refuses a run that would send them.
    own_settings: ClassVar[Mapping[str, tuple[str, ...]]] = {
        "passive": ("guest", "guest_layers", "train.lr", "train.weight_decay", "dp_sgd", "activation_noise")}
    shared_settings: ClassVar[Mapping[str, tuple[str, ...]]] = {"passive": ("ids", "payload_dtype")}
    saves: ClassVar[Saves] = Saves(
        model=(Saved("guests", PARTY_NAMES, "who sends activations"), Saved("widths", WIDTHS, "of what width"),
               Saved("n_out", INTEGER, "the head's outputs"), Saved("host_in", INTEGER, "its own width"),
               Saved("host_width", INTEGER, "its own bottom's width"),
               Saved("host_bottom", network(lambda at: at.method.host_bottom_net(at.where, at.method.host_in_)[0]),
                     "its own bottom, when it holds columns", optional=True),
               Saved("host", network(lambda at: at.method.host_net(at.where)), "the head")),
        part=SplitPart, parts={"passive": (BOTTOM,)})

    config: EntityAugmentationConfig

    @classmethod
    def private_settings(cls, epsilon: float) -> dict[str, Any]:
        # A guest that protects what it sends refuses to send its IDs in the clear.
        return {**super().private_settings(epsilon), "ids": "blinded"}

    @classmethod
    def private_refusal(cls, layout: Layout) -> str:
        if layout == "second_hop":
            return ""  # it does not run there anyway
        return ("its host, holding every person with features of its own, walks them in each epoch, so a smaller "
                "guest walks its people several times an epoch, in batches that may name one twice: more releases "
                "than a guest can plan for at setup; its guests protect what they send beside a label-only host "
                "(host_features = 'ignore', guests of like size: benchmarks/privacy/run.py credit)")

    def check_task(self, task: Task) -> None:
        if task not in self.tasks:
            raise MethodError(
                "entity_augmentation interpolates class labels, so it needs a classification task; regression is "
                "out of scope for this method (the paper leaves it to future work): use splitnn instead"
            )

    # -- guests -----------------------------------------------------------------------------------

    def _layers(self, ctx: NodeContext) -> tuple[str, ...]:
        return tuple(self.config.guest_layers.get(ctx.party, self.config.guest))

    @handles("ea.init", served="after setup; once", replies={"ids": "ids", "width": "control"})
    def _init(self, ctx: NodeContext, payload: Fields) -> Payload:
        """Build this guest's network; tell the host its width and (IDs in the clear) the entities it holds."""
        part = ctx.part(GuestPart)
        if part.initialised:  # a second init would only rebuild the network mid-run
            raise RefusedError(f"guest {ctx.party!r} builds its network once a run; refused")
        part.initialised = True
        data = ctx.require_data()
        if data.n_features == 0:
            raise MethodError(f"guest {ctx.party!r} holds no features; every guest needs at least one column")
        from vflo.nn.layers import output_size

        bottom = self.new_bottom(ctx, data.n_features)
        width = output_size(bottom.net, data.n_features)
        return {"width": width} if self.config.ids == "blinded" else {"ids": data.ids, "width": width}

    def build_bottom(self, ctx: NodeContext, in_dim: int) -> nn.Module:
        from vflo.nn.layers import build

        return build(in_dim, self._layers(ctx), generator=ctx.torch_generator("ea-guest"))

    def bottom_settings(self) -> tuple[TrainConfig, str]:
        return self.config.train, self.config.payload_dtype

    def bottom_noise(self) -> GaussianNoise | None:
        return self.config.activation_noise

    def bottom_dp(self) -> DPSGD | None:
        return self.config.dp_sgd

    def releases_per_epoch(self) -> int:
        return self.config.passes if self.config.activation_noise is not None else 1

    # -- privacy: what a guest's side spends, planned before it runs --------------------------------------

    def planned_privacy(self, role: str, *, party: str = "") -> PrivacyPlan | None:
        """A guest's: its network's DP-SGD (at most ``passes`` walked batches a person an epoch) where it trains
        one, and its activations: at most ``passes`` training releases a person an epoch (its network refuses
        more), or one validation release an epoch for a validation person (never walked), and one when scored.
        The host's: its labels randomised once."""
        cfg = self.config
        if role == "active" and cfg.label_epsilon is not None:
            return PrivacyPlan(epsilon=cfg.label_epsilon, pure_releases=1,
                               what=f"randomised response on its labels at ε = {cfg.label_epsilon:g}, once")
        noise, dp = cfg.activation_noise, cfg.dp_sgd
        if role != "passive" or noise is None:
            return None
        walked = cfg.train.max_epochs * cfg.passes
        words = [f"DP-SGD of its network, {walked} walked batches per person at σ = {dp.noise_multiplier:g}, "
                 f"drawing {dp.sample_rate:g} of each"] if dp is not None else []
        words.append(f"up to {walked + 1} releases of each person's activations at σ = {noise.noise_multiplier:g}")
        return PrivacyPlan(mu=noise.mu, releases=walked + 1,
                           training=() if dp is None else (dp.within_batches(walked),), what="; ".join(words))

    def protected(self, role: str, scale: float, *, rows: int,
                  party: str = "") -> tuple[EntityAugmentation, PrivacyPlan] | None:
        """A guest's side with its network by DP-SGD at noise multiplier ``scale`` drawing half of each walked
        batch and its activations noised at twice that; none while its IDs go to the host in the clear
        (``ids = 'clear'``), which no noise covers."""
        if role != "passive" or self.config.ids != "blinded":
            return None
        chosen, plan = self.calibrated_bottom(role, scale)
        return chosen, plan

    def unprotectable(self, role: str) -> str:
        if role == "passive" and self.config.ids != "blinded":
            return ("sends every one of its IDs to the host in the clear (ids = 'clear'), which no noise covers; run "
                    "with ids = 'blinded'")
        return super().unprotectable(role)

    def epsilon_scope(self) -> str:
        return "; ".join(filter(None, (self.account_scope("passive"), self.account_scope("active"))))

    def account_scope(self, role: str) -> str:
        cfg = self.config
        if role == "active":
            return labels_scope("the host") if cfg.label_epsilon is not None else ""
        return bottom_scope(cfg.activation_noise, cfg.dp_sgd, "guest network") if role == "passive" else ""

    @handles("ea.entities",
             served="after ea.init",
             carries={"mask": "membership", "ids": "ids"}, replies={"count": "control"}, mask=MASK,
             ids=IDS, shared=BOOL)
    def _entities(self, ctx: NodeContext, payload: Fields) -> Payload:
        """The entities this guest will walk: those the host can label (and, if shared, in ID order), as flags
        over this guest's entities (IDs in the clear) or as the IDs themselves (blinded: the host's own)."""
        data = ctx.require_data()
        mask = payload.array("mask")
        if self.config.ids == "blinded":
            chosen = payload.array("ids")
            mask = np.isin(data.ids, chosen.astype(data.ids.dtype))
            if int(mask.sum()) != len(np.unique(chosen)):
                raise ProtocolError("ea.entities: the host named entities this guest does not hold")
        if mask.shape != (data.n_samples,):
            raise ProtocolError(f"ea.entities: mask of {mask.shape[0]} flags for {data.n_samples} entities")
        ids = np.sort(data.ids[mask]) if payload.flag("shared") else data.ids[mask]
        ctx.part(GuestPart).walk = Walk(ids, as_tensor(data.subset(ids).X), ctx.rng("ea-walk"))
        return {"count": int(mask.sum())}


    @reveals("training batch")
    @handles("ea.forward",
             served="after ea.entities; a batch of at most [policy] max_rows",
             carries={"positions": "membership"}, replies={"acts": "outputs", "ids": "ids"}, n=INT,
             positions=POSITIONS)
    def _forward(self, ctx: NodeContext, payload: Fields) -> Payload:
        walk = _walk(ctx)
        positions = payload.array("positions")
        if len(positions) == 0:
            n = payload.integer("n")
            if not 0 < n <= ctx.policy.max_rows:
                raise ProtocolError(f"ea.forward: a batch of {n} entities; this guest walks between 1 and "
                                    f"{ctx.policy.max_rows} ([policy] max_rows) a step")
            if self.config.activation_noise is not None and n > len(walk.ids):
                # One person twice in a batch would be two releases, and two draws in one DP-SGD step.
                raise RefusedError(f"ea.forward: a batch of {n} entities from a guest that walks {len(walk.ids)} "
                                   "and noises what it sends; refused (a batch names each person once)")
            positions = walk.next(n)
        elif positions.min(initial=0) < 0 or positions.max(initial=-1) >= len(walk.ids):
            raise ProtocolError("ea.forward: a position beyond this guest's entities")
        assert walk.x is not None
        acts = bottom_of(ctx).forward(walk.x[torch.as_tensor(positions)], walk.ids[positions])
        return {"acts": acts, "ids": walk.ids[positions]}

    def checkpoint_extras(self, ctx: NodeContext) -> dict[str, Any]:
        return _walk(ctx).state("walk.")

    def restore_extras(self, ctx: NodeContext, state: Mapping[str, Any]) -> None:
        _walk(ctx).restore(state, "walk.")

    @reveals("activations")
    @handles("ea.validate", served="after ea.entities", carries={"ids": "ids"}, replies={"acts": "outputs"},
             ids=ArraySpec(("int64", "str"), (None,)), keep_previous=BOOL)
    def _validate(self, ctx: NodeContext, payload: Fields) -> Payload:
        """Evaluation-mode activations of held-out training entities, with a snapshot for early stopping."""
        ids = payload.array("ids")
        bottom = bottom_of(ctx)
        bottom.validation_pass(payload.flag("keep_previous"))
        return {"acts": bottom.infer(as_tensor(ctx.require_data().subset(ids).X), ids, fresh=True)}

    # -- host ---------------------------------------------------------------------------------------

    def fit(self, fed: Federation) -> None:
        cfg = self.config
        host = fed.data
        host.require_labels()
        guests = fed.names("passive")
        if not guests:
            raise MethodError("entity_augmentation needs at least one guest (passive party)")
        labelled = set(host.ids.tolist())
        inits = fed.broadcast("ea.init", {}, guests)
        widths, guest_ids, masks = {}, {}, {}
        for g in guests:
            width = inits[g].integer("width")
            ids = inits[g].array("ids") if cfg.ids == "clear" else None
            if width < 1:
                raise MethodError(f"guest {g!r} produces activations of width {width}; every guest needs width >= 1")
            widths[g] = width
            if cfg.ids == "blinded":
                # Private set intersection: the host learns which of its own people the guest holds, nothing else.
                ids = psi.intersect(fed, np.sort(host.ids), [g], mode="active").ids
            assert isinstance(ids, np.ndarray)
            guest_ids[g] = ids
            masks[g] = np.fromiter((v in labelled for v in ids.tolist()), dtype=bool, count=len(ids))
            if not masks[g].any():
                raise MethodError(
                    f"the host {fed.party!r} holds no label for any of guest {g!r}'s {len(ids)} entities; guests "
                    "must share entities with the host (check the ID columns)"
                )
        # The order and the validation rows are named to the guests in the messages: public choices, from the run
        # seed, so a restarted host resumes with the same ones.
        rng = fed.shared_rng("ea-host-order")
        # Validation entities: labelled and held by every guest, so each can be scored with its true label.
        common = sorted(set.intersection(*(set(guest_ids[g][masks[g]].tolist()) for g in guests)))
        val_pos = split_validation(len(common), cfg.train.validation_fraction, fed.shared_rng("ea-validation"))[1]
        val_ids = np.asarray([common[i] for i in val_pos], dtype=host.ids.dtype)
        held_out = set(val_ids.tolist())
        shared = cfg.entities == "aligned"
        if shared:
            if not set(common) - held_out:
                raise MethodError("entities = 'aligned' but no entity is held by every guest")
            keep = set(common) - held_out
        for g in guests:
            ids = guest_ids[g]
            masks[g] &= np.fromiter((v not in held_out and (not shared or v in keep) for v in ids.tolist()),
                                    dtype=bool, count=len(ids))
        counts = {}
        none = np.empty(0, dtype=host.ids.dtype)
        requests: dict[str, Payload] = {
            g: {"mask": np.zeros(0, dtype=bool), "ids": guest_ids[g][masks[g]], "shared": shared}
            if cfg.ids == "blinded" else {"mask": masks[g], "ids": none, "shared": shared} for g in guests}
        for g, reply in fed.exchange("ea.entities", requests).items():
            counts[g] = reply.integer("count")
        self.guests_, self.widths_ = guests, widths
        self.entities_used_ = counts
        self.n_out_ = 1 if fed.task == "binary" else int(fed.n_classes or 2)

        self.host_in_ = host.n_features if cfg.host_features == "use" else 0
        self.host_bottom_, self.host_width_ = self.host_bottom_net(fed, self.host_in_)
        self.host_ = self.host_net(fed)
        self.reuses_ = dict.fromkeys(guests, 0)
        self.skipped_steps_ = 0
        if self.host_bottom_ is not None:
            # The host walks its own labelled entities: every one it holds (shared with a guest or not), or
            # the aligned ones in the guests' shared order; validation entities are kept out of either.
            own = np.sort(np.asarray(sorted(keep), dtype=host.ids.dtype)) if shared else \
                host.ids[~np.isin(host.ids, val_ids)]
            if len(own) == 0:
                raise MethodError(f"the host {fed.party!r} has no labelled entity left to train its own bottom on")
            counts_all = {**counts, fed.party: len(own)}
        else:
            own, counts_all = host.ids[:0], counts
        self.host_entities_ = len(own)
        trainer = _HostTrainer(self, fed, counts=counts_all, shared=shared, val_ids=val_ids, rng=rng, own=own)
        self.history_: History = trainer.fit()
        for g, n in self.reuses_.items():
            if n:
                logger.warning("entity_augmentation: guest %r did not answer %d step(s); its last activation was "
                               "reused", g, n)
        self.host_.eval()

    def targets(self, y: np.ndarray) -> np.ndarray:
        """One-hot labels (several classes) or 0/1 labels as a column (binary): the host's BCE targets."""
        if self.n_out_ == 1:
            return y.astype(np.float32)[:, None]
        onehot: np.ndarray = np.eye(self.n_out_, dtype=np.float32)[y]
        return onehot

    def assemble_step(
        self, guests: list[str], replies: Mapping[str, Reply], failures: Mapping[str, ProtocolError],
        last: dict[str, tuple[np.ndarray, np.ndarray]],
    ) -> tuple[list[torch.Tensor], list[np.ndarray], set[str]] | None:
        """Activations and IDs for this step, from replies or (policy permitting) each guest's queue."""
        acts, ids = [], []
        for g in guests:
            if g in replies:
                i = replies[g].array("ids")
                if i.ndim != 1:
                    raise ProtocolError(f"guest {g!r} sent no entity IDs with its activations")
                a = expect_rows(replies[g], "acts", party=g, rows=len(i), width=self.widths_[g], what="activations")
                last[g] = (a, i)
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

    def host_net(self, fed: Federation) -> nn.Module:
        """A new head over the host's own bottom and every guest's activations (fit, and a saved model's
        restore)."""
        from vflo.nn.layers import build

        return build(self.host_width_ + sum(self.widths_.values()), (*self.config.host, f"linear {self.n_out_}"),
                     generator=fed.torch_generator("ea-host"))

    def host_bottom_net(self, fed: Federation, in_dim: int) -> tuple[nn.Module | None, int]:
        """The host's own bottom over its columns (None for a label-only host) and its width."""
        if in_dim == 0:
            return None, 0
        from vflo.nn.layers import build, output_size

        net = build(in_dim, self.config.host_bottom, generator=fed.torch_generator("ea-host-bottom"))
        return net, output_size(net, in_dim)

    def host_activations(self, fed: Federation, ids: np.ndarray, *, serving: bool = True) -> list[torch.Tensor]:
        """The host's own activation of ``ids`` (evaluation mode), or nothing for a label-only host."""
        if self.host_bottom_ is None:
            return []
        rows = (fed.serving if serving else fed.data).subset(ids).X
        self.host_bottom_.eval()
        with torch.no_grad():
            return [self.host_bottom_(as_tensor(rows))]

    def subset_refusal(self) -> str:
        return ("the host's network reads every guest's activation beside its own, and in training each guest's "
                "slot always held a real entity's activation (one with the person's label); a stand-in for an "
                "absent guest would have to be chosen by the label it is meant to predict. Score people a guest "
                "lacks with an active-only fallback (--missing active_only --fallback apc_vfl)")

    def predict(self, fed: Federation, ids: np.ndarray) -> np.ndarray:
        replies = fed.score_together("split.activations", ids, self.guests_, extra={"purpose": "serve"})
        acts = [*self.host_activations(fed, ids), *remote_activations(replies, self.guests_, len(ids), self.widths_)]
        with torch.no_grad():
            probs = torch.sigmoid(self.host_(torch.cat(acts, dim=1))).double().numpy()
        if probs.shape[1] == 1:
            return np.hstack([1.0 - probs, probs])
        result: np.ndarray = probs / np.clip(probs.sum(axis=1, keepdims=True), 1e-12, None)
        return result

    def summary_stats(self) -> dict[str, float]:
        return {
            "entities_used": float(sum(self.entities_used_.values())),
            "host_entities": float(self.host_entities_),
            "reused_activations": float(sum(self.reuses_.values())),
            "skipped_steps": float(self.skipped_steps_),
            **self.history_.summary(),
        }


class _HostTrainer(RemoteBottomsTrainer):
    """The host's steps: each guest sends activations of entities it picks, the host trains on interpolated
    labels and returns each guest's gradient."""

    def __init__(self, method: EntityAugmentation, fed: Federation, *, counts: dict[str, int], shared: bool,
                 val_ids: np.ndarray, rng: np.random.Generator, own: np.ndarray) -> None:
        super().__init__(method.config.train, rng, fed, method.guests_)
        self.m = method
        self.shared = shared
        self.counts = counts
        # Each guest walks its own entities: an epoch is one pass over the largest guest's, in batches sized for it.
        self.batch = self.config.batch_rows(max(counts.values()))
        self.steps = int(np.ceil(max(counts.values()) / self.batch))
        own_params = [] if method.host_bottom_ is None else list(method.host_bottom_.parameters())
        self.optimizer = adam([*method.host_.parameters(), *own_params], self.config)
        host = fed.data
        y = randomised_labels(fed, method.name, method.config.label_epsilon, host.ids, host.require_labels())
        self.label_of = {v: i for i, v in enumerate(host.ids.tolist())}
        self.onehot = method.targets(y)
        widths = ([method.host_width_] if method.host_bottom_ is not None else []) + \
            [method.widths_[g] for g in method.guests_]
        self.weights = np.array(widths, dtype=np.float32)
        # The host as its own guest: its entities, their rows, and its own walk (never sent, so from its secret).
        self.own = Walk(own, as_tensor(host.subset(own).X) if len(own) else None, fed.rng("ea-host-walk"))
        self.val_ids = val_ids
        # The randomised labels here too: the validation loss decides when training stops, which the guests see.
        self.val_target = torch.as_tensor(method.targets(y[[self.label_of[v] for v in val_ids.tolist()]])) \
            if len(val_ids) else None
        self.last: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    @property
    def n_train(self) -> int:
        return self.counts[self.m.guests_[0]] if self.shared else self.steps * self.batch

    def batches(self, epoch: int) -> list[np.ndarray]:
        if self.shared:  # one shared order over the aligned entities
            return super().batches(epoch)
        # Each guest picks its own next entities: the host asks only for how many.
        return [np.arange(self.batch)] * self.steps

    def train_step(self, batch: np.ndarray, upcoming: np.ndarray | None) -> float | None:
        m, guests = self.m, self.m.guests_
        if self.shared:
            request: Payload = {"n": len(batch), "positions": batch.astype(np.int64)}
        else:
            request = {"n": len(batch), "positions": np.empty(0, dtype=np.int64)}
        replies, failures = self.fed.exchange_tolerant("ea.forward", dict.fromkeys(guests, request))
        step = m.assemble_step(guests, replies, failures, self.last)
        if step is None:
            m.skipped_steps_ += 1
            return None
        acts, ids_by_guest, answered = step
        rows = min(len(i) for i in ids_by_guest)
        inputs = [a[:rows].requires_grad_(True) for a in acts]
        own: list[torch.Tensor] = []
        if m.host_bottom_ is not None:
            positions = batch if self.shared else self.own.next(len(batch))
            positions = positions[:rows]
            m.host_bottom_.train()
            assert self.own.x is not None
            own = [m.host_bottom_(self.own.x[torch.as_tensor(positions)])]
            ids_by_guest = [self.own.ids[positions], *ids_by_guest]
        label_rows = np.stack([[self.label_of[v] for v in ids[:rows].tolist()] for ids in ids_by_guest])
        target = torch.as_tensor(interpolated_labels(self.onehot[label_rows], self.weights))
        m.host_.train()
        loss = F.binary_cross_entropy_with_logits(m.host_(torch.cat([*own, *inputs], dim=1)), target)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        grads = {g: {"grad": inputs[k].grad.numpy().astype(m.config.payload_dtype)}  # type: ignore[union-attr]  # backward() just filled grad
                 for k, g in enumerate(guests) if g in answered}
        if grads:
            _, lost = self.fed.exchange_tolerant("split.backward", grads)
            if lost and m.config.on_missing == "fail":
                raise next(iter(lost.values()))
        return float(loss.detach())

    @property
    def validates(self) -> bool:
        return self.val_target is not None

    def validation_loss(self) -> float | None:
        if self.val_target is None:
            return None
        payload: Payload = {"ids": self.val_ids, "keep_previous": self.keep_previous()}
        replies = self.fed.exchange("ea.validate", dict.fromkeys(self.m.guests_, payload))
        acts = [*self.m.host_activations(self.fed, self.val_ids, serving=False),
                *remote_activations(replies, self.m.guests_, len(self.val_ids), self.m.widths_)]
        self.m.host_.eval()
        with torch.no_grad():
            return float(F.binary_cross_entropy_with_logits(self.m.host_(torch.cat(acts, dim=1)), self.val_target))

    def snapshot(self) -> Any:
        # One flat state dict (a checkpoint keeps it as ``best.*`` arrays): the head, and the host's own bottom.
        own = {} if self.m.host_bottom_ is None else \
            {f"own/{k}": v for k, v in self.m.host_bottom_.state_dict().items()}
        return copy.deepcopy({**self.m.host_.state_dict(), **own})

    def model_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {**module_state(self.m.host_, "host."), **optimizer_state(self.optimizer, "opt."),
                                 **counters_state(self.m.reuses_, self.m.skipped_steps_)}
        if self.m.host_bottom_ is not None:
            state |= {**module_state(self.m.host_bottom_, "host_bottom."), **self.own.state("own.")}
        # The queue of each guest's last activations: a resumed run reuses what the interrupted one would have.
        for g, (acts, ids) in self.last.items():
            state[f"last.{g}.acts"], state[f"last.{g}.ids"] = acts, ids
        return state

    def load_model_state(self, state: Mapping[str, Any]) -> None:
        load_module_state(self.m.host_, state, "host.")
        if self.m.host_bottom_ is not None:
            load_module_state(self.m.host_bottom_, state, "host_bottom.")
            self.own.restore(state, "own.")
        load_optimizer_state(self.optimizer, state, "opt.")
        self.m.reuses_, self.m.skipped_steps_ = counters_from(state)
        self.last = {g: (np.asarray(state[f"last.{g}.acts"]), np.asarray(state[f"last.{g}.ids"]))
                     for g in self.m.guests_ if f"last.{g}.acts" in state}

    def restore(self, state: Any) -> None:
        self.m.host_.load_state_dict({k: v for k, v in state.items() if not k.startswith("own/")})
        if self.m.host_bottom_ is not None:
            self.m.host_bottom_.load_state_dict({k[4:]: v for k, v in state.items() if k.startswith("own/")})


def counters_state(reuses: Mapping[str, int], skipped: int) -> dict[str, Any]:
    """The host's fault counters for a checkpoint, as arrays: each guest's reused activations
    (``counters.guests``, ``counters.reuses``) and the steps skipped (``counters.skipped``)."""
    return {"counters.guests": np.asarray(list(reuses), dtype=np.str_),
            "counters.reuses": np.asarray(list(reuses.values()), dtype=np.int64),
            "counters.skipped": int(skipped)}


def counters_from(state: Mapping[str, Any]) -> tuple[dict[str, int], int]:
    """The counters :func:`counters_state` kept: (reuses by guest, steps skipped). A checkpoint written before they
    were arrays holds them as one JSON text, ``counters``, which is read as it was written."""
    if "counters.guests" not in state and "counters" in state:
        old = json.loads(str(state["counters"]))
        return {str(g): int(n) for g, n in old["reuses"].items()}, int(old["skipped"])
    guests, reuses = np.asarray(state["counters.guests"]), np.asarray(state["counters.reuses"], dtype=np.int64)
    if guests.shape != reuses.shape or guests.ndim != 1:
        raise MethodError(f"a checkpoint's counters name {guests.size} guests with {reuses.size} reuse counts: it "
                          "was not written by this method; delete it to train from the first epoch")
    return dict(zip(guests.astype(str).tolist(), reuses.tolist(), strict=True)), int(state["counters.skipped"])


def interpolated_labels(labels: np.ndarray, widths: np.ndarray) -> np.ndarray:
    """ỹ_k = Σ_i w_i y_{i,k} / Σ_i w_i for guests i (axis 0) and rows k (axis 1); labels one-hot or 0/1."""
    if labels.shape[0] != len(widths) or np.any(widths <= 0):
        raise ValueError("one positive width per guest is needed to interpolate labels")
    out: np.ndarray = np.tensordot(widths.astype(np.float32), labels.astype(np.float32), axes=(0, 0)) / widths.sum()
    return out.astype(np.float32)


def _walk(ctx: NodeContext) -> Walk:
    walk = ctx.part(GuestPart).walk
    if walk is None:
        raise ProtocolError(f"guest {ctx.party!r} got a step before ea.init and ea.entities")
    return walk
