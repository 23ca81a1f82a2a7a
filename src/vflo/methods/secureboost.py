"""SecureBoost: vertical gradient-boosted trees, gradients under homomorphic encryption, trained on every person
the label holder holds and scoring a person with whichever partners hold them."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np

from vflo.comm.message import IDS, INT, STR, ArraySpec, Fields, Payload, Value
from vflo.errors import ConfigError, MethodError, ProtocolError
from vflo.methods.base import Inference, Layout, Method, MethodConfig, State, handles, reveals
from vflo.methods.saved import ARRAY, INTEGER, NUMBER, PARTY_NAMES, TEXT, At, Built, Part, Saved, Saves
from vflo.methods.split_learning import ask_holders
from vflo.trees.bins import MAX_BINS
from vflo.trees.crypto import BLOB_ROW, HESettings, KeyPair, PublicSide, from_wire, new_keys, plain_side, to_wire
from vflo.trees.goss import goss_weights
from vflo.trees.growth import Candidate, GrowthRules, HistogramAsk, ShuffledSums, SplitAsk, Tree, grow
from vflo.trees.lookup import ColumnsParty, LookupTable, sums_afresh

if TYPE_CHECKING:
    from vflo.party.context import NodeContext
    from vflo.party.port import Federation

BYTES = ArraySpec(("uint8",), (None,))
BLOB = ArraySpec(("uint8",), (None, BLOB_ROW))
INTS = ArraySpec(("int64",), (None,))
FLAGS = ArraySpec(("bool",), (None,))
FLAG_MATRIX = ArraySpec(("bool",), (None, None))
TREE_FIELDS = ("owner", "record", "default_left", "left", "right", "value")

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class SecureBoostConfig(MethodConfig):
    """``n_trees`` boosting rounds (one tree per class per round for more than two classes) of depth at most
    ``max_depth``, each leaf's weight shrunk by ``learning_rate``; ``reg_lambda``, ``gamma`` and
    ``min_child_weight`` as in XGBoost. ``n_bins``: quantile bins per column (a passive party's own choice).
    ``min_node_rows``: a passive party sums a node only if it holds at least this many of its people.
    ``he``: the encryption (:class:`~vflo.trees.crypto.HESettings`). ``workers``: how many ways a
    party shares out its decryption (the label holder) or its ciphertext sums (a partner): this process and
    ``workers - 1`` workers of its executor; 0: as many as its executor has (one per core, unless its
    ``[executor]`` says otherwise; each party's own).
    ``active_trees``: the first trees grown from
    the label holder's columns alone (SecureBoost's reduced-leakage option: the partners never see the instance
    spaces of the trees nearest the labels). ``aligned_only``: train only on people every partner holds (the
    anchors' SecureBoost), instead of every person the label holder holds. ``colsample``: the share of each
    party's columns a tree may split on (XGBoost's ``colsample_bytree``), each party drawing its own per tree
    from its own secret stream, so no other party learns which; 1 (the default): every column. Fewer columns,
    fewer ciphertexts a partner adds and the label holder decrypts. ``row_sampling = "goss"``: each round's trees
    are grown on the ``top_rate`` share of people with the largest gradients and ``other_rate`` drawn from the
    rest, weighed up (gradient-based one-side sampling, :mod:`vflo.trees.goss`): the label holder encrypts, and a
    partner sums, those people's statistics alone; a partner holding fewer than ``min_node_rows`` of a round's
    sample sits that round out. Opt-in: each round tells a partner which of its people were kept, most of them
    those the model predicts worst; the label holder logs a warning naming the partners.
    """

    n_trees: int = 50
    max_depth: int = 5
    learning_rate: float = 0.3
    reg_lambda: float = 1.0
    gamma: float = 0.0
    min_child_weight: float = 1.0
    n_bins: int = 32
    min_node_rows: int = 5
    he: HESettings = field(default_factory=HESettings)
    workers: int = 0
    active_trees: int = 0
    aligned_only: bool = False
    colsample: float = 1.0
    row_sampling: Literal["all", "goss"] = "all"
    top_rate: float = 0.2
    other_rate: float = 0.1

    def __post_init__(self) -> None:
        if self.n_trees < 1:
            raise ConfigError(f"n_trees must be at least 1, got {self.n_trees}")
        if not 0 < self.learning_rate <= 1:
            raise ConfigError(f"learning_rate must be in (0, 1], got {self.learning_rate}")
        if not 2 <= self.n_bins <= MAX_BINS:
            raise ConfigError(f"n_bins must be in 2..{MAX_BINS}, got {self.n_bins}")
        if self.workers < 0:
            raise ConfigError(f"workers must be >= 0 (0: one per core), got {self.workers}")
        if self.active_trees < 0:
            raise ConfigError(f"active_trees must be >= 0, got {self.active_trees}")
        if not 0 < self.colsample <= 1:
            raise ConfigError(f"colsample must be a share of the columns in (0, 1], got {self.colsample}")
        if self.row_sampling not in ("all", "goss"):
            raise ConfigError(f"row_sampling must be 'all' (every person, every tree) or 'goss' (gradient-based "
                              f"one-side sampling), got {self.row_sampling!r}")
        if not (0 < self.top_rate < 1 and 0 < self.other_rate < 1 and self.top_rate + self.other_rate < 1):
            raise ConfigError(f"top_rate {self.top_rate} and other_rate {self.other_rate} must be shares in (0, 1) "
                              "adding up to less than 1 (LightGBM's defaults: 0.2 and 0.1)")
        self.rules()  # validates the rest

    def rules(self) -> GrowthRules:
        return GrowthRules(max_depth=self.max_depth, reg_lambda=self.reg_lambda, gamma=self.gamma,
                           min_child_weight=self.min_child_weight, min_node_rows=self.min_node_rows)


@dataclass
class BoostPart(Part):
    """A passive party's side: its columns, binned, while trees grow; then its lookup table, kept to score."""

    training: ColumnsParty | None = None
    table: LookupTable | None = None
    trainings: int = 0  # names this party's shuffling stream afresh for each training it starts


def _save_table(table: LookupTable) -> State:
    return dict(table.arrays())


def _load_table(sub: Mapping[str, Value], at: At) -> LookupTable:
    arrays = [sub.get(k) for k in ("column", "threshold", "default_left")]
    if not all(isinstance(a, np.ndarray) for a in arrays):
        raise MethodError("a saved lookup table lacks its columns, thresholds or default branches")
    return LookupTable.from_arrays(*arrays)  # type: ignore[arg-type]  # the arrays are checked present just above


def _save_trees(trees: list[Tree]) -> State:
    arrays = [tree.arrays() for tree in trees]
    return {"sizes": np.asarray([len(t) for t in trees], dtype=np.int64),
            **{k: np.concatenate([a[k] for a in arrays]) for k in TREE_FIELDS}}


def _load_trees(sub: Mapping[str, Value], at: At) -> list[Tree]:
    sizes, *columns = (sub.get(k) for k in ("sizes", *TREE_FIELDS))
    if not isinstance(sizes, np.ndarray) or not all(isinstance(c, np.ndarray) for c in columns):
        raise MethodError("saved trees lack their sizes or a node field")
    ends = np.cumsum(sizes.astype(np.int64))
    by_field = dict(zip(TREE_FIELDS, columns, strict=True))
    return [Tree.from_arrays({k: np.asarray(v)[end - size:end] for k, v in by_field.items()})
            for size, end in zip(np.diff(ends, prepend=0).tolist(), ends.tolist(), strict=True)]


TABLE = Built(_save_table, _load_table)


class SecureBoost(Method):
    """SecureBoost: Cheng et al., "SecureBoost: A Lossless Federated Learning Framework" (IEEE Intelligent
    Systems 2021; arXiv 1901.08755), with SecureBoost+'s packing and histogram subtraction (arXiv 2110.10927).

    Boosting minimises Σ_i ℓ(y_i, F(x_i)) + Σ_t (γ T_t + ½ λ ||w_t||²), one tree f_t per round on the gradients
    g_i and hessians h_i of ℓ at F_{t-1}; a split of node I into I_L, I_R gains
        ½ [G_L²/(H_L+λ) + G_R²/(H_R+λ) − G_I²/(H_I+λ)] − γ,   a leaf weighs −G/(H+λ),
    with ℓ the logistic (binary), softmax cross-entropy (one tree per class) or squared error (standardised
    target). The label holder encrypts (g_i, h_i) in fixed point, packed in one ciphertext, under its own key;
    each partner returns, for each node of the tree it is asked (once each), the encrypted sums of every
    candidate split of its columns (the people at or below a bin, and above it), in an order it draws afresh
    per node from its own secret (as SecretFlow's SGB shuffles its buckets); the label holder decrypts, picks
    the best and names its position (every position of the best gain: the partner keeps the first in its own
    column order, so ties break as unshuffled); the partner records that split, one per node, in its lookup
    table, the label holder knowing only the party and a record number. Sums of integers are exact, so the
    trees are those of centralized boosting on the same bins (the lossless property).

    Where vflo differs: it trains on every person the label holder holds (``aligned_only = False``): a person a
    partner lacks counts, at that partner's splits, as a missing value, and every split learns where missing
    values go (XGBoost's sparsity-aware split); so a person is scored with whichever partners hold them, the
    others' splits sending them down the learned branch. A partner sends its decisions at every split it keeps
    for a batch of people in one round (the paper walks the tree a node at a time).
    """

    name = "secureboost"
    Config = SecureBoostConfig
    summary = "gradient-boosted trees with homomorphic encryption; every row trained on, any subset scores"
    paper = "Cheng et al. 2021, SecureBoost (arXiv 1901.08755); SecureBoost+ (arXiv 2110.10927)"
    quick: ClassVar[Mapping[str, Any]] = {"n_trees": 2, "max_depth": 2, "n_bins": 8}
    inference: ClassVar[Inference] = "collaborative"
    any_subset: ClassVar[bool] = True
    own_settings: ClassVar[Mapping[str, tuple[str, ...]]] = {"passive": ("n_bins", "workers")}
    saves: ClassVar[Saves] = Saves(
        model=(Saved("passives", PARTY_NAMES, "who decides"), Saved("task", TEXT, "the task"),
               Saved("classes", INTEGER, "how many classes", attr="n_classes_"),
               Saved("y_mean", NUMBER, "the regression target's mean"), Saved("y_scale", NUMBER, "and scale"),
               Saved("base", ARRAY, "the starting score"),
               Saved("trees", Built(_save_trees, _load_trees),
                     "each node's owner, record number, default branch, children, leaf value"),
               Saved("own", TABLE, "its lookup table: column, threshold, default branch per record",
                     attr="own_table_")),
        part=BoostPart,
        parts={"passive": (Saved("table", TABLE, "its lookup table: column, threshold, default branch per record",
                                 optional=True),)})
    n_train_ = 0  # a loaded model says nothing of the rows it trained on
    shared_settings: ClassVar[Mapping[str, tuple[str, ...]]] = {"passive": ("min_node_rows", "colsample",
                                                                            "row_sampling")}

    config: SecureBoostConfig

    def scoring_parties(self, parties: tuple[Any, ...]) -> list[str]:
        return []  # whoever of the partners holds a person scores them

    @classmethod
    def layout_settings(cls, layout: Layout, *, first_hop: str = "", second_hop: str = "") -> dict[str, Any] | str:
        return cls.NO_SECOND_HOP if layout == "second_hop" else {}

    # -- a passive party -----------------------------------------------------------------------------------

    @reveals("row ids")
    @handles("sb.init",
             served="after setup and alignment; once a run",
             carries={"train_ids": "ids"}, replies={"columns": "control", "bins": "control"},
             train_ids=IDS, scheme=STR, public_key=BYTES)
    def _init(self, ctx: NodeContext, payload: Fields) -> Payload:
        data = ctx.require_data()
        train_ids, key = payload.array("train_ids"), payload.array("public_key")
        ops = PublicSide(payload.text("scheme"), key.tobytes(), workers=self.config.workers)
        _close(ctx)
        part = ctx.part(BoostPart)
        # The order this party's candidate splits reach the label holder in comes from its own secret, which the
        # label holder cannot recompute: it learns the sums of a node's candidates, not whose they are.
        shuffle = ctx.rng("secureboost", "shuffle", part.trainings)
        columns = ctx.rng("secureboost", "columns", part.trainings)  # which of its columns each tree may use
        part.trainings += 1
        party = ColumnsParty(data.subset(train_ids).X, self.config.n_bins, ops,
                             min_node_rows=self.config.min_node_rows, shuffle=shuffle,
                             colsample=self.config.colsample, columns_rng=columns)
        # No scoring while trees grow: a new table is served once training ends.
        part.training, part.table = party, None
        return {"columns": party.n_columns, "bins": party.n_bins}

    @handles("sb.gradients",
             served="after sb.init; one tree's at a time, each tree once, in increasing tree order",
             carries={"gh": "ciphertexts"}, tree=INT, gh=BLOB)
    def _gradients(self, ctx: NodeContext, payload: Fields) -> Payload:
        if self.config.row_sampling != "all":
            raise ProtocolError("sb.gradients: every person's gradients, but this training samples people per tree "
                                f"(row_sampling = {self.config.row_sampling!r}): sb.sampled_gradients")
        return _take_gradients(ctx, payload, picked=None)

    @handles("sb.sampled_gradients",
             served=("after sb.init, with row_sampling = 'goss': one tree's at a time, each tree once, in increasing "
                     "tree order; the gradients of the people the tree is grown on, and who they are"),
             carries={"gh": "ciphertexts", "picked": "membership"}, tree=INT, gh=BLOB, picked=INTS)
    def _sampled_gradients(self, ctx: NodeContext, payload: Fields) -> Payload:
        if self.config.row_sampling != "goss":
            raise ProtocolError("sb.sampled_gradients: a sample of people per tree, but this training grows every "
                                "tree on every person (row_sampling = 'all'): sb.gradients")
        return _take_gradients(ctx, payload, picked=np.asarray(payload.array("picked"), dtype=np.int64))

    @reveals("tree nodes")
    @handles("sb.histograms",
             served=("after the tree's sb.gradients or sb.sampled_gradients: each node of that tree once, nested as "
                     "a tree's (the root over all this party's people; a child of a split this party chose, one side "
                     "of it), none summing fewer than min_node_rows of this party's people (of the tree's sample, "
                     "with row_sampling = 'goss'), nor leaving fewer of its parent's; candidates' sums shuffled "
                     "afresh per node"),
             carries={"rows": "membership"}, replies={"sums": "ciphertexts", "missing": "control"},
             tree=INT, nodes=INTS, parents=INTS, siblings=INTS, counts=INTS, rows=INTS)
    def _histograms(self, ctx: NodeContext, payload: Fields) -> Payload:
        party = _party(ctx)
        if payload.integer("tree") != party.tree:
            raise ProtocolError(f"sb.histograms for tree {payload['tree']}, but this party holds the gradients of "
                                f"tree {party.tree}")
        asks = _unpack_asks(payload)
        sums = party.histograms(asks).values()
        # Per node: its candidates' left sums, then the right sums of those the missing flags mark (none: empty).
        blobs = [b"" if s is None else party.ops.dump(s) for left, right, _ in sums for s in (left, right)]
        sizes = np.asarray([len(b) for b in blobs], dtype=np.int64)
        missing = [flags for _, _, flags in sums]
        return {"sums": to_wire(sizes.tobytes() + b"".join(blobs)),
                "missing": np.concatenate(missing) if missing else np.zeros(0, dtype=bool)}

    @handles("sb.splits",
             served=("after sb.histograms of the same tree: once per node this party summed, before any child of it; "
                     "the split kept is one of the node's shuffled candidates the label holder names"),
             replies={"records": "control", "sizes": "control", "left": "decisions", "default_left": "decisions"},
             tree=INT, nodes=INTS, ties=INTS, choices=INTS, default_left=FLAGS)
    def _splits(self, ctx: NodeContext, payload: Fields) -> Payload:
        party = _party(ctx)
        if payload.integer("tree") != party.tree:
            raise ProtocolError(f"sb.splits for tree {payload['tree']}, not this party's current tree")
        nodes, ties, choices, default_left = (np.asarray(payload[k]) for k in ("nodes", "ties", "choices",
                                                                             "default_left"))
        if (len(nodes) != len(ties) or np.any(ties < 1) or int(ties.sum()) != len(choices)
                or len(choices) != len(default_left)):
            raise ProtocolError("sb.splits: each node needs one or more choices, each with its default branch "
                                "(nodes and ties of one length, ties adding up to the choices)")
        ends = np.cumsum(ties)
        asks = [SplitAsk(int(n), Candidate(0.0, -1, -1, False, ties=tuple(
                    (int(c), bool(d)) for c, d in zip(choices[end - t:end], default_left[end - t:end], strict=True))))
                for n, t, end in zip(nodes.tolist(), ties.tolist(), ends.tolist(), strict=True)]
        decided = party.splits(asks)
        return {"records": np.asarray([decided[int(n)][0] for n in nodes], dtype=np.int64),
                "sizes": np.asarray([len(decided[int(n)][1]) for n in nodes], dtype=np.int64),
                "left": np.concatenate([decided[int(n)][1] for n in nodes]).astype(bool) if len(nodes)
                else np.zeros(0, dtype=bool),
                "default_left": np.asarray([decided[int(n)][2] for n in nodes], dtype=bool)}

    @handles("sb.finish", served="after sb.init: ends training (the binned columns dropped, the lookup table kept)")
    def _finish(self, ctx: NodeContext, payload: Fields) -> Payload:
        party = _party(ctx, gradients=False)
        ctx.part(BoostPart).table = party.table  # kept for scoring; the binned columns and the sums are dropped
        _close(ctx)
        return {}

    @handles("sb.decide",
             served="after sb.finish, or from a saved part: rows to score, never training rows",
             carries={"ids": "ids"}, replies={"left": "decisions"}, ids=IDS, purpose=STR)
    def _decide(self, ctx: NodeContext, payload: Fields) -> Payload:
        table = ctx.part(BoostPart).table
        if table is None:
            raise ProtocolError("sb.decide before training ended (sb.finish) or a saved part was loaded")
        if payload.text("purpose") != "serve":
            raise ProtocolError(f"sb.decide scores people to serve, not the {payload['purpose']!r} rows")
        ids = payload.array("ids")
        rows = ctx.rows("serve").subset(ids)
        return {"left": table.decide(np.asarray(rows.X, dtype=np.float64))}

    # -- the label holder ------------------------------------------------------------------------------------

    def fit(self, fed: Federation) -> None:
        cfg = self.config
        data = fed.data
        data.require_labels()
        passives = fed.names("passive")
        ids = data.ids
        if cfg.aligned_only:
            ids = fed.align(ids, passives).ids if passives else ids
            held = {p: np.ones(len(ids), dtype=bool) for p in passives}
        else:
            alignment = fed.align(ids, passives) if passives else None
            held = {p: alignment.holding(p, ids) for p in passives} if alignment else {}
        if len(ids) == 0:
            raise MethodError(f"secureboost has no training people: the active party {fed.party!r} shares none "
                              f"with {passives} (aligned_only = true)")
        # The key pair is this party's own, drawn from the OS: never from the run seed the others know.
        keys = new_keys(cfg.he, workers=cfg.workers)
        own = ColumnsParty(data.subset(ids).X, cfg.n_bins, plain_side(), min_node_rows=1, colsample=cfg.colsample,
                           columns_rng=fed.rng("secureboost", "columns"))
        shapes: dict[str, tuple[int, int]] = {}
        if passives:
            requests: dict[str, Payload] = {p: {"train_ids": ids[held[p]], "scheme": cfg.he.scheme,
                                                "public_key": np.frombuffer(keys.public_key, dtype=np.uint8)}
                                            for p in passives}
            for p, reply in fed.exchange("sb.init", requests).items():
                columns, bins = reply.integer("columns"), reply.integer("bins")
                if not (columns >= 0 and 2 <= bins <= MAX_BINS):
                    raise ProtocolError(f"party {p!r} answered sb.init with columns {columns!r}, bins {bins!r}")
                shapes[p] = (columns, bins)
        y = data.subset(ids).require_labels()
        self.passives_ = passives
        self.task_: str = fed.task
        self.n_classes_ = fed.n_outputs if fed.task == "multiclass" else 1
        self.y_mean_, self.y_scale_ = 0.0, 1.0
        if fed.task == "regression":
            self.y_mean_, self.y_scale_ = float(np.mean(y)), float(np.std(y)) or 1.0
            target = (np.asarray(y, dtype=np.float64) - self.y_mean_) / self.y_scale_
        else:
            target = np.asarray(y, dtype=np.int64)
        self.base_ = _base_score(fed.task, target, self.n_classes_)
        rules = cfg.rules()
        goss = cfg.row_sampling == "goss"
        if goss and passives:
            logger.warning("secureboost: row_sampling = 'goss' tells %s, each round, which of their people its trees "
                           "are grown on: the %.0f %% with the largest gradients (the people the model predicts "
                           "worst) and %.0f %% drawn from the rest", ", ".join(passives), 100 * cfg.top_rate,
                           100 * cfg.other_rate)
        # This party's own draws (who is kept beside the top), from a stream no partner can recompute.
        picks = fed.rng("secureboost", "goss") if goss else None
        scores = np.tile(self.base_, (len(ids), 1))
        parties = _Federated(fed, keys, own, passives, shapes, held)
        held_list = [np.ones(len(ids), dtype=bool), *(held[p] for p in passives)]
        least = [1, *([rules.min_node_rows] * len(passives))]
        self.trees_: list[Tree] = []
        self.own_table_ = own.table
        try:
            for round_ in range(cfg.n_trees):
                g, h = _gradients(fed.task, target, scores)
                # One sample for the round's trees (one per class): a partner sees one set of people a round.
                weights = (goss_weights(g, top_rate=cfg.top_rate, other_rate=cfg.other_rate, rng=picks)
                           if picks is not None else None)
                picked = None if weights is None else weights > 0
                # A partner sums over the people it holds that the round's trees are grown on: what it counts.
                counted = None if picked is None else [held_list[0], *(m & picked for m in held_list[1:])]
                for k in range(self.n_classes_):
                    gk, hk = (g[:, k], h[:, k]) if weights is None else (g[:, k] * weights, h[:, k] * weights)
                    gh = np.rint(np.stack([gk, hk], axis=1) * rules.scale).astype(np.int64)
                    shared = round_ >= cfg.active_trees
                    sent = parties.new_tree(len(self.trees_), gh, send=shared, picked=picked,
                                            least=rules.min_node_rows)
                    eligible = [True, *(p in sent for p in passives)]
                    tree, leaf = grow(gh, held_list, parties, rules, eligible=eligible, least=least, counted=counted)
                    tree.value = [cfg.learning_rate * v for v in tree.value]
                    scores[:, k] += np.asarray(tree.value)[leaf]
                    self.trees_.append(tree)
        finally:
            keys.close()  # the decrypting processes
        if passives:
            fed.broadcast("sb.finish", {}, passives)
        self.n_train_ = len(ids)
        self.traffic_ = parties.counts

    def predict(self, fed: Federation, ids: np.ndarray) -> np.ndarray:
        return self.predict_by(fed, ids)[0]

    def predict_by(self, fed: Federation, ids: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        own = self.own_table_.decide(np.asarray(fed.serving.subset(ids).X, dtype=np.float64))
        decisions, held = _partner_decisions(fed, ids, self.passives_)
        owners = [own, *(decisions[p] for p in self.passives_)]
        holds = [np.ones(len(ids), dtype=bool), *(held[p] for p in self.passives_)]
        where = [np.where(h, np.cumsum(h) - 1, -1) for h in holds]
        scores = np.tile(self.base_, (len(ids), 1))
        for t, tree in enumerate(self.trees_):

            def goes_left(node: int, rows: np.ndarray, tree: Tree = tree) -> np.ndarray:
                k, record = tree.owner[node], tree.record[node]
                out = np.full(len(rows), tree.default_left[node])
                mine = holds[k][rows]
                if mine.any():  # an absent partner holds no one: its decisions are an empty table
                    out[mine] = owners[k][where[k][rows[mine]], record]
                return out

            scores[:, t % self.n_classes_] += tree.route(len(ids), goes_left)
        return _transform(self.task_, scores, self.y_mean_, self.y_scale_), held

    def summary_stats(self) -> dict[str, float]:
        return {"trees": float(len(self.trees_)), "rows_trained": float(self.n_train_),
                **{k: float(v) for k, v in getattr(self, "traffic_", {}).items()}}


def _take_gradients(ctx: NodeContext, payload: Fields, *, picked: np.ndarray | None) -> Payload:
    """A tree's encrypted statistics: of every one of this party's training rows, or of the ``picked`` ones."""
    party = _party(ctx, gradients=False)
    blob = _unwire(payload.array("gh"))
    handle = party.ops.load(blob)
    rows = handle.shape[0] if hasattr(handle, "shape") else len(handle)
    expected = len(party.X) if picked is None else len(picked)
    if rows != expected:
        kind = "sb.gradients" if picked is None else "sb.sampled_gradients"
        raise ProtocolError(f"{kind}: {rows} rows of gradients for the {expected} rows they are of")
    party.new_tree(handle, payload.integer("tree"), blob, picked=picked)
    return {}


def _unwire(array: np.ndarray) -> bytes:
    try:
        return from_wire(array)
    except ValueError as exc:
        raise ProtocolError(f"secureboost: {exc}") from exc


def _close(ctx: NodeContext) -> None:
    """Ends a training under way at this party, and its helper processes."""
    part = ctx.part(BoostPart)
    if part.training is not None:
        part.training.ops.close()
        part.training = None


def _party(ctx: NodeContext, *, gradients: bool = True) -> ColumnsParty:
    party = ctx.part(BoostPart).training
    if party is None:
        raise ProtocolError("secureboost: this party has no training under way (sb.init first)")
    if gradients and party.gh is None:
        raise ProtocolError("secureboost: no gradients for a tree yet (sb.gradients first)")
    return party


def _pack_asks(asks: list[HistogramAsk]) -> dict[str, Value]:
    return {"nodes": np.asarray([a.node for a in asks], dtype=np.int64),
            "parents": np.asarray([a.parent for a in asks], dtype=np.int64),
            "siblings": np.asarray([a.sibling for a in asks], dtype=np.int64),
            "counts": np.asarray([-1 if a.rows is None else len(a.rows) for a in asks], dtype=np.int64),
            "rows": np.concatenate([a.rows for a in asks if a.rows is not None] or [np.zeros(0)]).astype(np.int64)}


def _unpack_asks(payload: Payload) -> list[HistogramAsk]:
    nodes, parents, siblings, counts, rows = (np.asarray(payload[k], dtype=np.int64)
                                              for k in ("nodes", "parents", "siblings", "counts", "rows"))
    if not len(nodes) == len(parents) == len(siblings) == len(counts):
        raise ProtocolError("sb.histograms: nodes, parents, siblings and counts differ in length")
    if int(counts[counts > 0].sum()) != len(rows) or np.any(counts < -1):
        raise ProtocolError("sb.histograms: the counts do not add up to the rows sent")
    asks, at = [], 0
    for node, parent, sibling, count in zip(nodes.tolist(), parents.tolist(), siblings.tolist(), counts.tolist(),
                                            strict=True):
        if count < 0:
            asks.append(HistogramAsk(node, None, parent, sibling))
        else:
            asks.append(HistogramAsk(node, rows[at:at + count], parent, sibling))
            at += count
    return asks


class _Federated:
    """The grower's parties in the protocol: the label holder's own columns here, the partners' over ``fed``."""

    def __init__(self, fed: Federation, keys: KeyPair, own: ColumnsParty, passives: list[str],
                 shapes: dict[str, tuple[int, int]], held: dict[str, np.ndarray]) -> None:
        self.fed, self.keys, self.own, self.passives, self.shapes, self.held = fed, keys, own, passives, shapes, held
        self.colsample = own.colsample
        self.tree = -1
        # The homomorphic work the protocol asks for (the benchmark's floor): encryptions, ciphertexts added into
        # a partner's bin sums (rows summed x its columns), and sums decrypted.
        self.counts = {"encryptions": 0, "ciphertext_additions": 0, "ciphertext_subtractions": 0,
                       "sums_decrypted": 0}

    def new_tree(self, tree: int, gh: np.ndarray, *, send: bool = True, picked: np.ndarray | None = None,
                 least: int = 1) -> set[str]:
        """A tree's statistics: to the partners too with ``send`` (a tree grown at the label holder alone sends
        them nothing); with ``picked`` (GOSS), those of the people the tree is grown on alone, and who they are
        among each partner's, to the partners holding at least ``least`` of them (a partner would sum no node
        over fewer). The partners sent to, whose columns may split the tree."""
        self.tree = tree
        self.own.new_tree(gh, tree)
        if not self.passives or not send:
            return set()
        passives = self.passives
        if picked is not None:
            passives = [p for p in passives if int((self.held[p] & picked).sum()) >= least]
            if not passives:
                return set()
        # Only the people some partner holds (and the tree is grown on): the others' statistics never leave.
        anyone = np.logical_or.reduce([self.held[p] for p in passives])
        if picked is not None:
            anyone = anyone & picked
        blob = self.keys.encrypted_blob(gh[anyone])
        self.counts["encryptions"] += int(anyone.sum())
        position = np.cumsum(anyone) - 1
        encrypted = None  # loaded only where a partner holds fewer than the people encrypted
        requests: dict[str, Payload] = {}
        for p in passives:
            mine = self.held[p] & anyone
            if mine[anyone].all():
                request: dict[str, Value] = {"tree": tree, "gh": to_wire(blob)}
            else:
                encrypted = self.keys.load(blob) if encrypted is None else encrypted
                request = {"tree": tree, "gh": to_wire(self.keys.dump(self.keys.rows(encrypted, position[mine])))}
            if picked is not None:
                request["picked"] = np.flatnonzero(picked[self.held[p]]).astype(np.int64)
            requests[p] = request
        self.fed.exchange("sb.gradients" if picked is None else "sb.sampled_gradients", requests)
        return set(passives)

    def histograms(self, asks: Mapping[int, list[HistogramAsk]]) -> dict[int, dict[int, np.ndarray | ShuffledSums]]:
        out: dict[int, dict[int, np.ndarray | ShuffledSums]] = {}
        if 0 in asks:
            columns = self.own.n_sampled
            out[0] = {node: np.asarray(s).reshape(columns, self.own.n_bins + 1, 2)
                      for node, s in self.own.histograms(asks[0]).items()}
        requests = {self.passives[k - 1]: {"tree": self.tree, **_pack_asks(v)} for k, v in asks.items() if k > 0}
        for k, v in asks.items():
            if k > 0:
                columns, bins = self.shapes[self.passives[k - 1]]
                columns = max(1, round(self.colsample * columns)) if columns else 0  # a tree's share of them
                for a in v:  # a node derived from its parent and sibling: summed afresh, or by subtraction
                    if a.rows is not None or sums_afresh(a.held, bins + 1):
                        self.counts["ciphertext_additions"] += columns * a.held
                    else:
                        self.counts["ciphertext_subtractions"] += columns * (bins + 1)
        summed: list[tuple[int, int, Any]] = []  # party, node, ciphertexts: decrypted together, in parallel
        flags: dict[int, np.ndarray] = {}
        for p, reply in (self.fed.exchange("sb.histograms", requests) if requests else {}).items():
            k = self.passives.index(p) + 1
            nodes = [a.node for a in asks[k]]  # a partner sends a node asked without rows too: two blobs each
            framed = _unwire(reply.array("sums"))
            head = 16 * len(nodes)
            sizes = np.frombuffer(framed[:head], dtype=np.int64) if len(framed) >= head else np.zeros(0)
            if len(sizes) != 2 * len(nodes) or int(sizes.sum()) != len(framed) - head or np.any(sizes < 0):
                raise ProtocolError(f"party {p!r} answered sb.histograms with sums that do not frame "
                                    f"{len(nodes)} nodes")
            at = head
            for node, size in zip([n for n in nodes for _ in (0, 1)], sizes.tolist(), strict=True):
                summed.append((k, node, self.keys.load(framed[at:at + size]) if size else None))
                at += size
            flags[k] = reply.array("missing").astype(bool)
        plain = iter(self.keys.decrypt_many([handle for _, _, handle in summed if handle is not None]))
        values = [np.zeros((0, 2), dtype=np.int64) if handle is None else next(plain) for _, _, handle in summed]
        at_flag: dict[int, int] = {}
        for i in range(0, len(summed), 2):
            (k, node, _), left, right = summed[i], values[i], values[i + 1]
            columns, bins = self.shapes[self.passives[k - 1]]
            start = at_flag.get(k, 0)
            missing = flags[k][start:start + len(left)]
            at_flag[k] = start + len(left)
            if (not 0 < len(left) <= columns * bins or len(missing) != len(left)
                    or len(right) != int(missing.sum())):
                raise ProtocolError(f"party {self.passives[k - 1]!r} sent {len(left)} candidates' sums, "
                                    f"{len(missing)} missing flags and {len(right)} right sums for node {node}, "
                                    f"for its {columns} columns of {bins} bins")
            self.counts["sums_decrypted"] += len(left) + len(right)
            out.setdefault(k, {})[node] = ShuffledSums(left, right, missing)
        if any(len(f) != at_flag.get(k, 0) for k, f in flags.items()):
            raise ProtocolError("a partner sent missing flags for more candidates than it sent sums of")
        return out

    def splits(self, asks: Mapping[int, list[SplitAsk]]) -> dict[int, dict[int, tuple[int, np.ndarray, bool]]]:
        out: dict[int, dict[int, tuple[int, np.ndarray, bool]]] = {}
        if 0 in asks:
            out[0] = self.own.splits(asks[0])
        requests: dict[str, Payload] = {}
        for k, v in asks.items():
            if k > 0:
                requests[self.passives[k - 1]] = {
                    "tree": self.tree, "nodes": np.asarray([a.node for a in v], dtype=np.int64),
                    "ties": np.asarray([len(a.candidate.ties) for a in v], dtype=np.int64),
                    "choices": np.asarray([c for a in v for c, _ in a.candidate.ties], dtype=np.int64),
                    "default_left": np.asarray([d for a in v for _, d in a.candidate.ties], dtype=bool)}
        for p, reply in (self.fed.exchange("sb.splits", requests) if requests else {}).items():
            k = self.passives.index(p) + 1
            records, sizes = reply.array("records"), reply.array("sizes")
            left, default_left = reply.array("left").astype(bool), reply.array("default_left").astype(bool)
            if (records.shape != (len(asks[k]),) or sizes.shape != records.shape or int(sizes.sum()) != len(left)
                    or default_left.shape != records.shape):
                raise ProtocolError(f"party {p!r} answered sb.splits with {records.shape} records and "
                                    f"{len(left)} decisions for {len(asks[k])} nodes")
            for ask, chosen in zip(asks[k], default_left.tolist(), strict=True):
                if chosen not in {d for _, d in ask.candidate.ties}:
                    raise ProtocolError(f"party {p!r} sent node {ask.node}'s missing people down a branch none of "
                                        "the splits named sends them")
            ends = np.cumsum(sizes)
            out[k] = {ask.node: (int(record), left[end - size:end], bool(d))
                      for ask, record, size, end, d in zip(asks[k], records.tolist(), sizes.tolist(), ends.tolist(),
                                                           default_left.tolist(), strict=True)}
        return out


def _partner_decisions(fed: Federation, ids: np.ndarray,
                       parties: list[str]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Each partner's decisions at every split it keeps for the people among ``ids`` it holds (one round), and
    which people each partner scored; a partner that does not answer, with ``missing = "subset"``, scores none."""
    if not parties:
        return {}, {}
    replies, held = ask_holders(fed, "sb.decide", ids, parties)
    decisions = {}
    for p in parties:
        reply = replies.get(p)
        left = reply.array("left").astype(bool) if reply is not None else np.zeros((0, 0), dtype=bool)
        if reply is not None and (left.ndim != 2 or len(left) != int(held[p].sum())):
            raise ProtocolError(f"party {p!r} answered sb.decide with {left.shape} decisions for "
                                f"{int(held[p].sum())} people")
        decisions[p] = left
    return decisions, held


def _base_score(task: str, target: np.ndarray, classes: int) -> np.ndarray:
    """The starting score: the prior's log-odds (binary), log-priors (classes), 0 (standardised target)."""
    if task == "binary":
        p = float(np.clip(np.mean(target), 1e-6, 1 - 1e-6))
        return np.asarray([np.log(p / (1 - p))])
    if task == "multiclass":
        prior = np.clip(np.bincount(target, minlength=classes) / len(target), 1e-6, None)
        return np.log(prior)
    return np.zeros(1)


def _gradients(task: str, target: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """g and h of the loss at the current scores, rows x trees per round."""
    if task == "binary":
        p = 1 / (1 + np.exp(-scores[:, 0]))
        return (p - target)[:, None], (p * (1 - p))[:, None]
    if task == "multiclass":
        e = np.exp(scores - scores.max(axis=1, keepdims=True))
        p = e / e.sum(axis=1, keepdims=True)
        onehot = np.eye(scores.shape[1])[target]
        return p - onehot, p * (1 - p)
    return scores - target[:, None], np.ones_like(scores)


def _transform(task: str, scores: np.ndarray, mean: float, scale: float) -> np.ndarray:
    if task == "binary":
        p = 1 / (1 + np.exp(-scores[:, 0]))
        return np.stack([1 - p, p], axis=1)
    if task == "multiclass":
        e = np.exp(scores - scores.max(axis=1, keepdims=True))
        out: np.ndarray = e / e.sum(axis=1, keepdims=True)
        return out
    values: np.ndarray = scores[:, 0] * scale + mean
    return values
