"""Split learning's shared pieces: used by SplitNN, VFL-ASP's teacher and Entity Augmentation.

A party keeps a *bottom* network over its own rows. The coordinator asks for its activations,
computes the loss at the top, and sends back the gradient of the loss with respect to those
activations (``split.backward``); the party finishes the backward pass through its own network
and steps its optimiser. For scoring (and for soft labels), the coordinator asks for activations
of rows by ID (``split.activations``), computed in evaluation mode.

Early stopping spans the parties: at every validation pass a party snapshots its bottom, and the
coordinator tells it with the next validation request, or with ``split.finish``, whether that
pass was the best so far (:class:`RemoteBottomsTrainer`), so every party ends at the same epoch.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from vflo.comm.message import BOOL, IDS, INT, STR, Fields, Payload, Reply, Value, expect_rows, floats
from vflo.data.partydata import PartyData
from vflo.dp import (
    DPSGD,
    SCOPE_END_TO_END,
    SCOPE_FIXED_MODEL,
    GaussianNoise,
    PrivacyAccount,
    PrivacyPlan,
    RandomisedResponse,
    RowNoise,
)
from vflo.errors import ConfigError, MethodError, ProtocolError, RefusedError, RemoteError, TransportError
from vflo.methods.base import State, prefixed, unprefixed
from vflo.methods.saved import At, Built, Part, Saved
from vflo.nn.private import private_training, quiet_hooks
from vflo.nn.train import (
    History,
    TrainConfig,
    Trainer,
    adam,
    as_tensor,
    load_module_state,
    load_optimizer_state,
    module_state,
    optimizer_state,
    set_lr,
)
from vflo.party.handlers import HandlerSet, handles, reveals

if TYPE_CHECKING:
    import torch
    from torch import nn

    from vflo.party.context import NodeContext
    from vflo.party.port import Federation
else:
    from vflo.lazy import torch



logger = logging.getLogger(__name__)


def labels_scope(holder: str) -> str:
    """What the label holder's ε covers where it randomised its labels (``label_epsilon``)."""
    return (f"labels: ε covers each person's label, randomised once before training (every gradient sent is "
            f"computed from the randomised labels); not {holder}'s own features, which the gradients also depend on")


def bottom_scope(noise: GaussianNoise | None, dp: DPSGD | None, network: str, counted: str = "") -> str:
    """What a party's ε covers for the activations of its ``network`` it sends: end to end where DP-SGD trained
    it, else the release given the fitted network (``counted``: how its releases are counted); "" without noise."""
    if noise is None:
        return ""
    if dp is not None:
        return "features: " + SCOPE_END_TO_END
    return "features: " + SCOPE_FIXED_MODEL.replace("encoder", network) + counted


def randomised_labels(fed: Federation, method: str, epsilon: float | None, ids: np.ndarray,
                      y: np.ndarray) -> np.ndarray:
    """The labels of ``ids`` the label holder trains on: ``y``, or with ``epsilon`` each randomised once
    (:class:`vflo.dp.RandomisedResponse`) from its own secret, which no partner can recompute, and counted in its
    account before any gradient computed from them leaves."""
    if epsilon is None:
        return y
    if fed.task == "regression" or fed.n_classes is None:
        raise ConfigError(f"{method}: label_epsilon randomises class labels (randomised response); this is a "
                          "regression task: leave label_epsilon out")
    mechanism = RandomisedResponse(epsilon=epsilon)
    fed.privacy.charge(ids, epsilon=mechanism.epsilon, what="its labels, randomised")
    out = mechanism.apply(y, fed.n_classes, fed.rng(method, "label-rr"))
    logger.info("%s: the label holder trains on its labels randomised at ε = %g (%.1f%% of %d changed)", method,
                mechanism.epsilon, 100 * float(np.mean(out != y)), len(y))
    return out.astype(y.dtype)


class Bottom:
    """A party's bottom network and its optimiser. A training forward keeps its output for the backward."""

    def __init__(self, net: nn.Module, train: TrainConfig, payload_dtype: str, *, noise: GaussianNoise | None = None,
                 rng: np.random.Generator | None = None, keyed: RowNoise | None = None,
                 account: PrivacyAccount | None = None, dp: DPSGD | None = None,
                 dp_rng: np.random.Generator | None = None, dp_generator: torch.Generator | None = None,
                 per_epoch: int = 1) -> None:
        self.net = net
        # Activations this party sends are clipped and noised (when the method asks): every release, training,
        # validation and scoring alike. Training releases get fresh noise from the party's own stream (the model
        # changes every step, so each is a new release, counted); scoring releases noise keyed by the party's
        # secret, the person and the activation (asked again: the same release, nothing to average).
        self.noise = noise
        if noise is not None and (rng is None or keyed is None):
            raise ProtocolError("a noised bottom needs the party's own noise stream and keyed noise")
        self.rng = rng
        self.keyed = keyed
        self.account = account
        # Fresh noise averages away when a release is asked for again and again, so each person's noised training
        # and validation releases are bounded by the schedule the method declared: ``per_epoch`` of each per epoch
        # (one in SplitNN; an Entity Augmentation guest may walk its people more than once in the host's epoch).
        self.max_releases, self.per_epoch = train.max_epochs * per_epoch, per_epoch
        self.train = train
        self._releases: dict[str, dict[object, int]] = {"training": {}, "validation": {}}
        self.optimizer: torch.optim.Optimizer | None = adam(net.parameters(), train)
        # DP-SGD (the party's own choice): each step uses the rows of the shared batch its own secret draws (each with
        # probability dp.sample_rate), each one's gradient clipped and the sum noised by Opacus. Only the party
        # knows who counted, so a person in a batch is protected as by a subsampled Gaussian mechanism.
        self.dp, self.dp_rng = dp, dp_rng
        self.private: Any = None
        if dp is not None:
            if dp_rng is None or dp_generator is None:
                raise ProtocolError("a DP-SGD bottom needs the party's own sampling stream and noise generator")
            assert self.optimizer is not None
            self.private, self.optimizer = private_training(net, self.optimizer, dp, generator=dp_generator,
                                                            expected_batch_size=1)
        self.payload_dtype = payload_dtype
        self.restore_best = train.restore_best
        self.pending: torch.Tensor | None = None
        self.candidate: dict[str, Any] | None = None
        self.best: dict[str, Any] | None = None
        self.in_dim = 0

    def forward(self, x: torch.Tensor, ids: np.ndarray | None = None) -> np.ndarray:
        """Training-mode activations of people ``ids``; the graph is kept for the :meth:`backward` that
        follows."""
        self.net.train()
        out = self.net(x) if self.private is None else self.private(x)
        self.pending = out
        return self._released(out.detach(), ids, fresh="training")

    def at_epoch(self, epoch: int) -> None:
        """The next training step belongs to epoch ``epoch`` (the coordinator's count): this party's own learning
        rate for it, from its own ``train.lr`` and ``train.lr_schedule``."""
        if not 0 <= epoch < self.train.max_epochs:
            raise ProtocolError(f"a training batch of epoch {epoch}: this party trains epochs 0 to "
                                f"{self.train.max_epochs - 1} (train.max_epochs {self.train.max_epochs})")
        if self.train.lr_schedule != "constant" and self.optimizer is not None:
            set_lr([self.optimizer], self.train.lr_at(epoch))

    def backward(self, grad: np.ndarray) -> None:
        """Finish the backward pass with the coordinator's gradient and take one optimiser step."""
        out = self.pending
        if out is None or self.optimizer is None:
            raise ProtocolError("split.backward arrived without a training forward before it")
        if grad.shape != tuple(out.shape):
            raise ProtocolError(f"split.backward: gradient shape {grad.shape} != activation shape {tuple(out.shape)}")
        self.optimizer.zero_grad()
        if self.dp is not None:
            assert self.dp_rng is not None
            chosen = self.dp_rng.random(len(grad)) < self.dp.sample_rate
            grad = np.where(chosen[:, None], grad, 0.0)  # a row not drawn adds nothing, clipped or not
            # Opacus divides the noised sum by the batch it expects: the rows this step draws, on average.
            self.optimizer.expected_batch_size = max(1.0, self.dp.sample_rate * len(grad))  # type: ignore[attr-defined]  # DPOptimizer has it, typed here as the Optimizer it wraps
        with quiet_hooks():
            out.backward(torch.as_tensor(grad, dtype=torch.float32))
        self.optimizer.step()
        self.pending = None

    def infer(self, x: torch.Tensor, ids: np.ndarray | None = None, *, fresh: bool = False) -> np.ndarray:
        """Evaluation-mode activations of people ``ids``, no graph kept; ``fresh``: a validation pass during
        training (the model still changes), else a scoring release (keyed: the same again for the same row)."""
        self.net.eval()
        with torch.no_grad():
            return self._released(self.net(x), ids, fresh="validation" if fresh else "")

    def _released(self, out: torch.Tensor, ids: np.ndarray | None, *, fresh: str) -> np.ndarray:
        """``out`` as it leaves: noised where the method asks; ``fresh``: ``"training"`` or ``"validation"`` (fresh
        noise, bounded per person by the schedule), ``""`` for scoring (keyed noise)."""
        wire = self._wire(out)
        if self.noise is None:
            return wire
        if ids is None:
            raise ProtocolError("a noised activation release needs the IDs of the people it describes")
        if fresh:
            self._count(fresh, ids)
            assert self.rng is not None
            return self.noise.release(wire, self.rng, self.account, ids, what="activations")
        assert self.keyed is not None
        return self.noise.release_rows(wire, ids, self.keyed, self.account, what="activations")

    def _count(self, what: str, ids: np.ndarray) -> None:
        """Count one ``what`` release of each of ``ids``; refuse, before anything is sent, one past the schedule."""
        counts = self._releases[what]
        people = np.asarray(ids).tolist()
        over = [p for p in people if counts.get(p, 0) >= self.max_releases]
        if over:
            raise RefusedError(
                f"this party refuses another noised {what} release of {len(over)} people (e.g. {over[0]!r}): each "
                f"was released {self.max_releases} times already, {self.per_epoch} per epoch of the "
                f"{self.max_releases // self.per_epoch} the method declared (train.max_epochs); repeated fresh noise "
                "averages away, so a coordinator may not ask for more")
        for p in people:
            counts[p] = counts.get(p, 0) + 1

    def state(self) -> dict[str, Any]:
        """The network mid-training (weights, optimiser, validation snapshots), for a checkpoint."""
        if self.pending is not None:
            raise ProtocolError("a checkpoint was asked for between a training forward and its backward")
        if self.dp is not None:
            raise RefusedError("this party trains its bottom with DP-SGD and keeps no checkpoint of it: a run resumed "
                               "from one would draw its noise again from the start, and two updates with the same "
                               "noise cancel it; train without --checkpoints")
        out: dict[str, Any] = {**module_state(self.net, "net."), "in_dim": self.in_dim}
        if self.optimizer is not None:
            out |= optimizer_state(self.optimizer, "opt.")
        for name in ("candidate", "best"):
            snapshot = getattr(self, name)
            if snapshot is not None:
                out |= {f"{name}.{k}": v.detach().cpu().numpy().copy() for k, v in snapshot.items()}
        return out

    def load_state(self, state: Mapping[str, Any]) -> None:
        load_module_state(self.net, {k: v for k, v in state.items() if k.startswith("net.")}, "net.")
        if self.optimizer is not None and "opt.groups" in state:
            load_optimizer_state(self.optimizer, state, "opt.")
        for name in ("candidate", "best"):
            snapshot = {k[len(name) + 1:]: torch.as_tensor(v) for k, v in state.items() if k.startswith(name + ".")}
            setattr(self, name, snapshot or None)

    def validation_pass(self, keep_previous: bool) -> None:
        """Snapshot the network at a validation pass; ``keep_previous``: the last pass was the best so far."""
        if keep_previous:
            self.best = self.candidate
        self.candidate = state_copy(self.net)

    def finish(self, keep_previous: bool) -> None:
        """Training is over: go back to the best validation pass (if asked) and drop the optimiser."""
        if keep_previous:
            self.best = self.candidate
        if self.restore_best and self.best is not None:
            self.net.load_state_dict(self.best)
        if self.private is not None:  # Opacus's hooks and per-person gradients off the network it keeps
            self.private.to_standard_module()
            self.private = None
        self.net.eval()
        self.optimizer, self.pending, self.candidate, self.best = None, None, None, None

    def _wire(self, acts: torch.Tensor) -> np.ndarray:
        out: np.ndarray = acts.numpy().astype(self.payload_dtype)
        return out


@dataclass
class SplitPart(Part):
    """A party's side of split learning: its bottom network, and while training the inputs it feeds it (per
    subset, ``"train"`` and ``"val"``) with the IDs of their rows."""

    bottom: Bottom | None = None
    x: dict[str, torch.Tensor] = field(default_factory=dict)
    x_ids: dict[str, np.ndarray] = field(default_factory=dict)


def _save_bottom(bottom: Bottom) -> State:
    return {**module_state(bottom.net), "in_dim": bottom.in_dim}


def _load_bottom(sub: Mapping[str, Value], at: At) -> Bottom:
    in_dim = sub.get("in_dim")
    if not isinstance(in_dim, int):
        raise MethodError("the saved bottom network lacks its input width")
    bottom: Bottom = at.method.new_bottom(at.where, in_dim, trains=False)
    load_module_state(bottom.net, {k: v for k, v in sub.items() if k != "in_dim"})
    bottom.finish(False)
    return bottom


#: A party keeps its bottom network: it computes its share of every score.
BOTTOM = Saved("bottom", Built(_save_bottom, _load_bottom), "its bottom network", optional=True, part=None)


def bottom_of(ctx: NodeContext) -> Bottom:
    bottom = ctx.part(SplitPart).bottom
    if bottom is None:
        raise ProtocolError(f"party {ctx.party!r} got a split-learning message before its bottom network was built")
    return bottom


class SplitParty(HandlerSet):
    """Handlers of a party that holds a bottom network; methods add how it is built and fed."""

    def bottom_input(self, ctx: NodeContext, rows: PartyData) -> np.ndarray:
        """What this party feeds its bottom network for ``rows``: its raw features unless overridden."""
        return rows.X

    def build_bottom(self, ctx: NodeContext, in_dim: int) -> nn.Module:
        """This party's bottom network for inputs of width ``in_dim`` (freshly initialised from its seed)."""
        raise NotImplementedError  # pragma: no cover - every method with bottoms says how to build them

    def bottom_settings(self) -> tuple[TrainConfig, str]:
        """The bottoms' training settings and the dtype of activations on the wire."""
        raise NotImplementedError  # pragma: no cover

    def bottom_noise(self) -> GaussianNoise | None:
        """Noise on every activation a party sends (none unless the method's config asks for it)."""
        return None

    def bottom_dp(self) -> DPSGD | None:
        """DP-SGD for this party's bottom (none unless its own config asks for it)."""
        return None

    def releases_per_epoch(self) -> int:
        """How many training releases of one person an epoch this party's side allows (and plans for)."""
        return 1

    def calibrated_bottom(self, role: str, scale: float, *, party: str = "", **more: Any) -> tuple[Any, PrivacyPlan]:
        """This method with the party's bottom trained by DP-SGD at noise multiplier ``scale``, drawing half of each
        batch, and its activations noised at twice that (``activation_noise`` and ``dp_sgd`` in its config); and
        what that plans to spend: how a protecting party calibrates its bottom to its budget. ``more``: other
        settings of the party's side calibrated with it."""
        config = replace(self.config, activation_noise=GaussianNoise(clip=1.0, noise_multiplier=2 * scale),  # type: ignore[attr-defined]  # every bottom-holding method's config has these
                         dp_sgd=DPSGD(noise_multiplier=scale, max_grad_norm=1.0, sample_rate=0.5), **more)
        chosen = type(self)(config)  # type: ignore[call-arg]  # a Method built from its config
        plan = chosen.planned_privacy(role, party=party)
        assert plan is not None
        return chosen, plan

    def new_bottom(self, ctx: NodeContext, in_dim: int, *, people: np.ndarray | None = None,
                   trains: bool = True) -> Bottom:
        """This party's bottom network; with DP-SGD, its whole training is charged to ``people`` (the rows it
        trains on; default every row it holds) before it starts. ``trains=False``: a saved one about to be loaded."""
        train, payload_dtype = self.bottom_settings()
        dp = self.bottom_dp() if trains else None
        per_epoch = self.releases_per_epoch()
        if dp is not None:
            who = ctx.require_data().ids if people is None else people
            ctx.privacy.charge(who, training=[dp.within_batches(train.max_epochs * per_epoch)],
                               what="its bottom network's DP-SGD training")
        bottom = Bottom(self.build_bottom(ctx, in_dim), train, payload_dtype, noise=self.bottom_noise(),
                        rng=ctx.rng("split-activation-noise"), keyed=ctx.row_noise("split-activations"),
                        account=ctx.privacy, dp=dp, dp_rng=ctx.rng("split-dp-sgd") if dp else None,
                        dp_generator=ctx.torch_generator("split-dp-sgd") if dp else None, per_epoch=per_epoch)
        bottom.in_dim = in_dim
        ctx.part(SplitPart).bottom = bottom
        return bottom

    @reveals("gradients")
    @handles("split.backward",
             served="after this party's forward pass of the same batch",
             carries={"grad": "gradients"}, grad=floats(None, None))
    def _split_backward(self, ctx: NodeContext, payload: Fields) -> Payload:
        grad = payload.array("grad")
        bottom_of(ctx).backward(grad)
        return {}

    # -- checkpoints: each party its own, in its own folder --------------------------------------------------

    def checkpoint_extras(self, ctx: NodeContext) -> dict[str, Any]:
        """Method-specific training state beyond the bottom network (e.g. a guest's walk through its rows)."""
        return {}

    def restore_extras(self, ctx: NodeContext, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`checkpoint_extras` returned."""

    @handles("split.checkpoint", served="after init; the newest three per run kept", run=STR, epoch=INT)
    def _split_checkpoint(self, ctx: NodeContext, payload: Fields) -> Payload:
        state = {**prefixed("bottom.", bottom_of(ctx).state()), **prefixed("extra.", self.checkpoint_extras(ctx))}
        ctx.require_checkpoints().save(payload.text("run"), payload.integer("epoch"), state)
        return {}

    @handles("split.checkpoints", served="after init", replies={"epochs": "control"}, run=STR)
    def _split_checkpoints(self, ctx: NodeContext, payload: Fields) -> Payload:
        store = ctx.checkpoints
        epochs = store.epochs(payload.text("run")) if store is not None else []
        return {"epochs": np.asarray(epochs, dtype=np.int64)}

    @handles("split.restore", served="after init, from this party's own checkpoint of the run", run=STR, epoch=INT)
    def _split_restore(self, ctx: NodeContext, payload: Fields) -> Payload:
        state = ctx.require_checkpoints().load(payload.text("run"), payload.integer("epoch"))
        bottom_of(ctx).load_state(unprefixed("bottom.", state))
        self.restore_extras(ctx, unprefixed("extra.", state))
        return {}

    @handles("split.finish", served="after init: ends training", keep_previous=BOOL)
    def _split_finish(self, ctx: NodeContext, payload: Fields) -> Payload:
        bottom_of(ctx).finish(payload.flag("keep_previous"))
        # Training rows are no longer needed; serving rows are read on demand.
        part = ctx.part(SplitPart)
        part.x, part.x_ids = {}, {}
        return {}

    @reveals("scoring activations")
    @handles("split.activations",
             served="after training (bottom network built): rows to score or the student's rows",
             carries={"ids": "ids"}, replies={"acts": "outputs"}, ids=IDS, purpose=STR)
    def _split_activations(self, ctx: NodeContext, payload: Fields) -> Payload:
        """Evaluation-mode activations of rows ``ids`` of this party's training or serving rows."""
        ids = payload.array("ids")
        rows = ctx.rows(payload.text("purpose")).subset(ids)
        return {"acts": bottom_of(ctx).infer(as_tensor(self.bottom_input(ctx, rows)), rows.ids)}


def remote_activations(replies: Mapping[str, Payload], parties: list[str], rows: int,
                       widths: dict[str, int]) -> list[torch.Tensor]:
    """Each party's activations from its reply, checked, as float32 tensors in ``parties`` order."""
    return [torch.as_tensor(expect_rows(replies[p], "acts", party=p, rows=rows, width=widths[p], what="activations"))
            for p in parties]


def scatter_rows(rows: torch.Tensor, held: np.ndarray, width: int) -> torch.Tensor:
    """``rows`` (one per True of ``held``) in a zero matrix of ``len(held)`` rows: a party's activations in the
    places of the people it holds, zeros where it lacks them (differentiable in ``rows``)."""
    return torch.zeros(len(held), width).index_copy(0, torch.as_tensor(np.flatnonzero(held)), rows)


def holders_activations(fed: Federation, ids: np.ndarray, parties: list[str],
                        widths: dict[str, int]) -> tuple[list[torch.Tensor], dict[str, np.ndarray]]:
    """Scoring with whoever holds a person: each party's evaluation-mode activations of the people among
    ``ids`` it holds (one alignment of the serving rows, one exchange), zeros for those it lacks; and which
    people each party scored.

    With ``fed.whoever_answers`` (``missing = "subset"``) a partner that does not answer (unreachable, past the
    deadline, or without rows to score) is absent: zeros for every person of this batch, as if it held none."""
    if not parties:
        return [], {}
    replies, held = ask_holders(fed, "split.activations", ids, parties)
    acts = []
    for p in parties:
        if p not in replies:
            acts.append(torch.zeros(len(ids), widths[p]))
            continue
        rows = expect_rows(replies[p], "acts", party=p, rows=int(held[p].sum()), width=widths[p], what="activations")
        acts.append(scatter_rows(torch.as_tensor(rows), held[p], widths[p]))
    return acts, held


def _held_by_whoever_answers(fed: Federation, ids: np.ndarray, parties: list[str]) -> dict[str, np.ndarray]:
    """Which of ``ids`` each partner holds, one alignment each, so that one that fails is absent alone."""
    held = {p: np.zeros(len(ids), dtype=bool) for p in parties}
    for p in fed.present(parties):
        try:
            held[p] = fed.align(ids, [p], purpose="serve").holding(p, ids)
        except (TransportError, RemoteError) as exc:
            fed.mark_absent(p, exc)
    return held


#: A partner's refusals of a scoring request that leave it out of the batch, as a partner that did not answer
#: is (its policy's rate or row bounds): an any-subset batch scores with the others.
SCORING_REFUSALS = frozenset({"RefusedError", "PolicyError"})


def ask_holders(fed: Federation, kind: str, ids: np.ndarray,
                parties: list[str]) -> tuple[dict[str, Reply], dict[str, np.ndarray]]:
    """Ask each partner ``kind`` about the people among ``ids`` it holds (one alignment of the serving rows, one
    exchange): the replies, and which people each partner holds. With ``fed.whoever_answers`` (``missing =
    "subset"``) a partner that does not answer is absent, holding none of them, and has no reply."""
    if fed.whoever_answers:
        held = _held_by_whoever_answers(fed, ids, parties)
        asked = {p: {"ids": ids[h], "purpose": "serve"} for p, h in held.items() if h.any()}
        replies, lost = fed.exchange_tolerant(kind, asked, refusals=SCORING_REFUSALS)
        for p, exc in lost.items():
            fed.mark_absent(p, exc)
            held[p] = np.zeros(len(ids), dtype=bool)
        return replies, held
    alignment = fed.align(ids, parties, purpose="serve")
    held = {p: alignment.holding(p, ids) for p in parties}
    return fed.exchange(kind, {p: {"ids": ids[held[p]], "purpose": "serve"} for p in parties}), held


def state_copy(module: nn.Module) -> dict[str, Any]:
    """A deep copy of a module's parameters (a snapshot of the best epoch)."""
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


class RemoteBottomsTrainer(Trainer):
    """A coordinator's trainer whose parties hold bottom networks: it keeps their snapshots in step.

    Subclasses send :meth:`keep_previous` with each validation request; :meth:`on_train_end` sends
    ``split.finish``, so every party returns to the best epoch when ``restore_best`` asks for it. With a
    checkpoint plan, every party saves its own checkpoint in its own folder at the same epochs, and a resumed
    run restores the last one every party holds.
    """

    def __init__(self, config: TrainConfig, rng: np.random.Generator, fed: Federation, parties: list[str]) -> None:
        super().__init__(config, rng, checkpoint=fed.checkpoint)
        self.fed = fed
        self.parties = parties
        self.improved_last = False

    def keep_previous(self) -> bool:
        """Whether the last validation pass was the best so far (the flag is read once per pass)."""
        flag, self.improved_last = self.improved_last, False
        return flag

    def on_improve(self, epoch: int) -> None:
        if self.config.restore_best:
            self.improved_last = True
        super().on_improve(epoch)

    def on_train_end(self, history: History) -> None:
        if self.parties:
            self.fed.broadcast("split.finish", {"keep_previous": self.improved_last}, self.parties)
        super().on_train_end(history)

    # -- checkpoints: this party's in its own folder, every other party's in its own ---------------------------

    def traffic(self, before: Mapping[str, float]) -> dict[str, float]:
        """Bytes, messages and rounds of the method's own messages so far, with those before a restart (the
        coordinator's ledger: every split-learning message is its request or the reply to it)."""
        self.fed.flush()
        now = self.fed.transport.ledger.summary()
        return {k: before.get(k, 0.0) + float(getattr(now, k)) for k in ("bytes", "messages", "rounds")}

    def write_checkpoint(self, epoch: int, state: dict[str, Any]) -> None:
        assert self.checkpoint is not None
        self.fed.flush()  # the last batch's gradients reach the parties before they save
        self.fed.ctx.require_checkpoints().save(self.checkpoint.run, epoch, {**state, "loop.flag": self.improved_last})
        if self.parties:
            self.fed.broadcast("split.checkpoint", {"run": self.checkpoint.run, "epoch": epoch}, self.parties)

    def checkpoint_epochs(self) -> list[int]:
        assert self.checkpoint is not None
        store = self.fed.ctx.checkpoints
        common = set(store.epochs(self.checkpoint.run)) if store is not None else set()
        if self.parties:
            for reply in self.fed.broadcast("split.checkpoints", {"run": self.checkpoint.run}, self.parties).values():
                common &= set(reply.array("epochs").tolist())
        return sorted(common)

    def read_checkpoint(self, epoch: int) -> dict[str, Any]:
        assert self.checkpoint is not None
        state = self.fed.ctx.require_checkpoints().load(self.checkpoint.run, epoch)
        self.improved_last = bool(state.get("loop.flag", False))
        if self.parties:
            self.fed.broadcast("split.restore", {"run": self.checkpoint.run, "epoch": epoch}, self.parties)
        return state


class HeldRowsTrainer(RemoteBottomsTrainer):
    """A coordinator's trainer over partners that may each hold only some of its training people (SplitNN,
    LASER-VFL): a partner is asked only for the people of a batch it holds, by their positions in its own rows,
    and its activations are put in place with zeros where it lacks a person or sat the batch out.

    ``held``: per partner, which of the coordinator's rows it holds; ``subsets``: the positions of each subset
    (``train``, ``val``) among those rows, in the order of the IDs sent with ``splitnn.init``. ``party_dropout``:
    the chance that a partner is left out of a training batch (PlugVFL), drawn from ``dropout_rng``, the
    coordinator's own stream. A subclass sets ``modules`` (its networks by name) and ``optimizer``: snapshots and
    checkpoints carry them.
    """

    optimizer: torch.optim.Optimizer

    def __init__(self, config: TrainConfig, rng: np.random.Generator, fed: Federation, parties: list[str], *,
                 held: dict[str, np.ndarray], subsets: dict[str, np.ndarray], widths: dict[str, int],
                 party_dropout: float = 0.0, dropout_rng: np.random.Generator | None = None) -> None:
        super().__init__(config, rng, fed, parties)
        self.held = {subset: {p: held[p][pos] for p in parties} for subset, pos in subsets.items()}
        self.widths = widths
        # Where each row is in the partner's own list of the rows it holds (-1: it lacks it).
        self.where = {subset: {p: np.where(h, np.cumsum(h) - 1, -1) for p, h in by.items()}
                      for subset, by in self.held.items()}
        self.party_dropout = party_dropout
        self.dropout_rng = dropout_rng
        self.modules: dict[str, nn.Module] = {}
        if config.sampling == "balanced" and parties:
            logger.warning("train.sampling = 'balanced': training batches are drawn by class and named to %s; how "
                           "often each person is drawn tells a partner their class (the default 'shuffle' does not)",
                           ", ".join(parties))

    def forward_requests(self, rows: np.ndarray, subset: str, training: bool) -> dict[str, Payload]:
        """The forward request to each partner asked for ``rows``: in training, those not left out that hold some
        of them (one holding none takes no step); in validation every partner, for its snapshot."""
        keep = not training and self.keep_previous()
        asked = self.parties
        if training and self.party_dropout > 0:
            assert self.dropout_rng is not None
            asked = [p for p in asked if self.dropout_rng.random() >= self.party_dropout]
        requests: dict[str, Payload] = {}
        for p in asked:
            mine = self.where[subset][p][rows]
            mine = mine[mine >= 0]
            if training and len(mine) == 0:
                continue
            requests[p] = {"rows": mine.astype(np.int64), "subset": subset, "training": training,
                           "keep_previous": keep, "epoch": self.epoch}
        return requests

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.optimizer]

    def activations(self, replies: Mapping[str, Payload], rows: np.ndarray, subset: str) -> dict[str, torch.Tensor]:
        """Each answering partner's activations, checked: one row per person of ``rows`` it holds."""
        return {p: torch.as_tensor(expect_rows(reply, "acts", party=p, rows=int(self.held[subset][p][rows].sum()),
                                               width=self.widths[p], what="activations"))
                for p, reply in replies.items()}

    def in_place(self, acts: dict[str, torch.Tensor], rows: np.ndarray, subset: str) -> list[torch.Tensor]:
        """Every partner's activations in the places of ``rows``, in order; zeros for a person it lacks and for
        a partner that was not asked (differentiable in ``acts``)."""
        out = []
        for p in self.parties:
            if p not in acts:
                out.append(torch.zeros(len(rows), self.widths[p]))
                continue
            held = self.held[subset][p][rows]
            out.append(acts[p] if held.all() else scatter_rows(acts[p], held, self.widths[p]))
        return out

    def remote(self, rows: np.ndarray, subset: str, training: bool) -> dict[str, torch.Tensor]:
        """Ask, wait, check: the activations of the partners asked for ``rows``."""
        requests = self.forward_requests(rows, subset, training)
        replies = self.fed.exchange("splitnn.forward", requests) if requests else {}
        return self.activations(replies, rows, subset)

    def snapshot(self) -> Any:
        # Flat names, so a checkpoint can carry the best-so-far snapshot as plain arrays.
        return {f"{name}.{k}": v.detach().clone() for name, module in self.modules.items()
                for k, v in module.state_dict().items()}

    def restore(self, state: Any) -> None:
        for name, module in self.modules.items():
            module.load_state_dict({k[len(name) + 1:]: v for k, v in state.items() if k.startswith(name + ".")})

    def model_state(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, module in self.modules.items():
            out.update(module_state(module, name + "."))
        return {**out, **optimizer_state(self.optimizer, "opt.")}

    def load_model_state(self, state: Mapping[str, Any]) -> None:
        for name, module in self.modules.items():
            load_module_state(module, state, name + ".")
        load_optimizer_state(self.optimizer, state, "opt.")

    def on_train_end(self, history: History) -> None:
        super().on_train_end(history)
        for module in self.modules.values():
            module.eval()

