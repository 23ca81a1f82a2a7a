"""A party's side of growing trees over its own columns: bins, per-node sums, and the lookup table that keeps
its splits (column and threshold), which no other party sees."""

from __future__ import annotations

from typing import Any

import numpy as np

from vflo.errors import ProtocolError, RefusedError
from vflo.trees.bins import bin_codes, fit_cuts, threshold
from vflo.trees.crypto import PublicSide
from vflo.trees.growth import HistogramAsk, SplitAsk

#: A ciphertext subtraction costs about as many additions into a bin sum as this (HEU's OU and Paillier invert a
#: ciphertext to subtract it; ``python -m benchmarks.secureboost``'s floor measures both on a machine).
SUBTRACTION_IN_ADDITIONS = 100


def sums_afresh(rows: int, buckets: int) -> bool:
    """Whether a partner sums a node its grower derives (its parent's rows less its sibling's) afresh over its
    ``rows``, rather than subtracting its sibling's ciphertexts from its parent's: afresh costs an addition per row
    and column, subtracting one subtraction per bucket and column. The same sums either way."""
    return rows < SUBTRACTION_IN_ADDITIONS * buckets


class LookupTable:
    """Splits a party keeps, by record: column, threshold, where the missing go. It decides, for rows of its own
    columns, which go left at every record (a person it lacks is the grower's to send down the default)."""

    def __init__(self) -> None:
        self.column: list[int] = []
        self.threshold: list[float] = []
        self.default_left: list[bool] = []

    def add(self, column: int, value: float, default_left: bool) -> int:
        self.column.append(column)
        self.threshold.append(value)
        self.default_left.append(default_left)
        return len(self.column) - 1

    def __len__(self) -> int:
        return len(self.column)

    def decide(self, X: np.ndarray) -> np.ndarray:
        """Rows x records: whether each row goes left at each record (x <= threshold; a missing x by default)."""
        if not len(self):
            return np.zeros((len(X), 0), dtype=bool)
        values = X[:, np.asarray(self.column, dtype=np.int64)]
        left = values <= np.asarray(self.threshold)
        out: np.ndarray = np.where(np.isnan(values), np.asarray(self.default_left), left)
        return out

    def arrays(self) -> dict[str, np.ndarray]:
        return {"column": np.asarray(self.column, dtype=np.int64),
                "threshold": np.asarray(self.threshold, dtype=np.float64),
                "default_left": np.asarray(self.default_left, dtype=bool)}

    @classmethod
    def from_arrays(cls, column: np.ndarray, value: np.ndarray, default_left: np.ndarray) -> LookupTable:
        table = cls()
        for c, v, d in zip(column.tolist(), value.tolist(), default_left.tolist(), strict=True):
            table.add(int(c), float(v), bool(d))
        return table


class ColumnsParty:
    """One party's columns over the rows it holds (in the grower's order), binned once; per tree, the sums of
    each node it is asked for, and the rows of each such node (which it learns from the asks).

    With ``shuffle`` (a partner's own generator, never seeded from anything another party knows) it is a
    partner's side: it gives, per node, its candidate splits' sums in a fresh order of its own
    (:class:`~vflo.trees.growth.ShuffledSums`), keeps which candidate each position is, and records only the
    split the grower picks among them. Without, it is the label holder's own columns (bin sums in column order).
    """

    def __init__(self, X: np.ndarray, n_bins: int, ops: PublicSide, *, min_node_rows: int,
                 shuffle: np.random.Generator | None = None, colsample: float = 1.0,
                 columns_rng: np.random.Generator | None = None) -> None:
        self.X = np.asarray(X, dtype=np.float64)
        # Each tree splits on a share of this party's columns, drawn per tree from its own stream (XGBoost's
        # colsample_bytree): which ones, no other party learns.
        if colsample < 1.0 and columns_rng is None:
            raise ValueError("a column share below 1 needs the party's own generator to draw it")
        self.colsample, self.columns_rng = colsample, columns_rng
        self.sampled = np.arange(self.X.shape[1])
        self.n_bins = n_bins
        self.cuts = fit_cuts(self.X, n_bins)
        self.codes = bin_codes(self.X, self.cuts, n_bins)
        self._codes = self.codes
        self.ops = ops
        self.min_node_rows = min_node_rows
        self.shuffle = shuffle
        self.table = LookupTable()
        self.gh: Any = None
        self.tree = -1
        # GOSS: the tree's statistics are of these rows alone (positions, increasing); each row's place among
        # them (-1: not in this tree's sums). None: every row's.
        self.picked: np.ndarray | None = None
        self.slot = np.zeros(0, dtype=np.int64)
        self._forget()

    def _forget(self) -> None:
        """Drops what this party knows of the tree being grown."""
        self.nodes: dict[int, np.ndarray] = {}
        self.children: dict[int, list[int]] = {}
        # A partner's: each node's cumulative bucket sums (its children's, asked without rows, are differences
        # of them), and which candidate (column * n_bins + bin) each position of the shuffled reply is.
        self.cumulative: dict[int, Any] = {}
        self.order: dict[int, np.ndarray] = {}
        self.split: dict[int, np.ndarray] = {}  # a node split here: which of its rows go left

    @property
    def n_columns(self) -> int:
        return int(self.X.shape[1])

    @property
    def n_sampled(self) -> int:
        """How many of its columns the tree being grown may split on."""
        return len(self.sampled)

    def _sample(self) -> None:
        if self.colsample >= 1.0 or self.n_columns == 0:
            self.sampled = np.arange(self.n_columns)
            return
        assert self.columns_rng is not None
        k = max(1, round(self.colsample * self.n_columns))
        self.sampled = np.sort(self.columns_rng.choice(self.n_columns, size=k, replace=False))

    def new_tree(self, gh: Any, tree: int = 0, blob: bytes | None = None, *, picked: np.ndarray | None = None) -> None:
        """The statistics of tree number ``tree`` (encrypted or not): each row's, in the order of this party's
        rows, or with ``picked`` (GOSS: the rows the tree is grown on, positions in increasing order) those rows'.
        Trees come once each, numbered upwards: a tree's root is asked once, so the gradients of a tree
        already grown (or skipped) are refused. ``blob``: ``gh`` serialized as it arrived, for the helpers."""
        if tree <= self.tree:
            raise RefusedError(f"gradients of tree {tree} after those of tree {self.tree}: each tree's gradients "
                               "come once, in increasing tree order; start a new training (sb.init) to grow again")
        n = len(self.X)
        if picked is not None and (picked.ndim != 1 or (len(picked) and (picked[0] < 0 or picked[-1] >= n))
                                   or np.any(np.diff(picked) <= 0)):
            raise ProtocolError(f"tree {tree}: the rows it is grown on must be distinct positions among this "
                                f"party's {n} rows, in increasing order")
        self.gh, self.tree, self.picked = gh, tree, picked
        self._forget()
        self._sample()
        self._codes = self.codes[:, self.sampled] if len(self.sampled) < self.n_columns else self.codes
        if picked is not None:
            self.slot = np.full(n, -1, dtype=np.int64)
            self.slot[picked] = np.arange(len(picked))
            self._codes = self._codes[picked]  # the bins of the rows whose statistics there are, in their order
        self.ops.share(gh, blob)

    def _summed(self, rows: np.ndarray) -> np.ndarray:
        """Of a node's ``rows``, the places of those whose statistics this tree has (every one without GOSS)."""
        if self.picked is None:
            return rows
        places = self.slot[rows]
        kept: np.ndarray = places[places >= 0]
        return kept

    def histograms(self, asks: list[HistogramAsk]) -> dict[int, Any]:
        """The sums of each node asked: a node asked without rows (its parent's rows less its sibling's) is
        recorded, for its children and its split; the label holder's own side sends no sums for it (the grower,
        holding the parent's and the sibling's in the clear, subtracts them itself), a partner's side subtracts
        its ciphertexts and sends them (its shuffled sums cannot be subtracted elsewhere). The label holder's own
        side gives a node's bin sums; a partner's, in its shuffled order, its candidates' left sums, the right
        sums of those whose column lacks a value in the node (None if none does), and which those are.

        The nodes of one tree must nest as a tree's do: the root, over every row this party holds (the label
        holder does not choose who is in it), once; then children of nodes already summed, two at most per
        parent, disjoint, together the parent's rows, and exactly the two sides of the parent's split where
        this party holds that split; and no node (nor what its parent less it leaves) may hold fewer than
        ``min_node_rows`` of this party's rows. Without that, sums over sets that differ by a row or two would
        come close to single rows' values, and a node the tree does not have could be asked."""
        if self.gh is None:
            raise ProtocolError("histograms asked before the tree's gradients")
        n = len(self.X)
        out = {}
        for ask in asks:
            if ask.node in self.nodes:
                raise RefusedError(f"node {ask.node} was already summed in tree {self.tree}: each node of a tree "
                                   "is asked once")
            if ask.parent < 0:
                if self.nodes:
                    raise RefusedError(f"node {ask.node} names no parent, but tree {self.tree} has its root")
                rows = np.arange(n, dtype=np.int64)
                if ask.rows is None or not np.array_equal(np.asarray(ask.rows), rows):
                    raise RefusedError(f"node {ask.node}: a tree's root holds every one of this party's {n} rows, "
                                       "not a set the label holder chooses")
            else:
                rows = self._child_rows(ask)
            # Sums run over the rows whose statistics the tree has: with GOSS, fewer than the node's.
            places = self._summed(rows)
            summed = len(places)
            if summed < self.min_node_rows:
                raise ProtocolError(f"node {ask.node} sums {summed} of this party's rows, fewer than its "
                                    f"min_node_rows {self.min_node_rows}: its sums would be close to single rows'")
            if ask.parent >= 0:
                rest = len(self._summed(self.nodes[ask.parent])) - summed
                if 0 < rest < self.min_node_rows:
                    raise ProtocolError(f"node {ask.node} leaves {rest} of its parent's summed rows, fewer than "
                                        f"min_node_rows {self.min_node_rows}")
                self.children[ask.parent].append(ask.node)
            self.nodes[ask.node] = rows
            sums = self._sums(ask, places)
            if sums is not None:
                out[ask.node] = sums
        return out

    def _child_rows(self, ask: HistogramAsk) -> np.ndarray:
        """A child's rows, checked against what this party knows of its parent."""
        if ask.parent not in self.nodes:
            raise RefusedError(f"node {ask.node}: its parent {ask.parent} was not summed in tree {self.tree}, so "
                               "this tree has no such node")
        parent, brothers = self.nodes[ask.parent], self.children.setdefault(ask.parent, [])
        if len(brothers) >= 2:
            raise ProtocolError(f"node {ask.parent} already has two children")
        if ask.rows is None:
            if ask.sibling not in brothers:
                raise ProtocolError(f"node {ask.node}: sibling {ask.sibling} is not a summed child of {ask.parent}")
            return np.setdiff1d(parent, self.nodes[ask.sibling])
        rows = np.asarray(ask.rows, dtype=np.int64)
        if len(np.intersect1d(rows, parent)) != len(rows) or len(np.unique(rows)) != len(rows):
            raise ProtocolError(f"node {ask.node}: rows that are not its parent {ask.parent}'s")
        if brothers and len(rows) + len(self.nodes[brothers[0]]) != len(parent):
            raise ProtocolError(f"node {ask.node}: with its sibling, not its parent's rows")
        rows = np.sort(rows)
        if ask.parent in self.split:
            left = self.split[ask.parent]
            if not (np.array_equal(rows, parent[left]) or np.array_equal(rows, parent[~left])):
                raise RefusedError(f"node {ask.node}: its rows are neither side of the split this party chose for "
                                   f"its parent {ask.parent}, so the tree has no such node")
        return rows

    def _sums(self, ask: HistogramAsk, rows: np.ndarray) -> Any:
        # ``rows``: the node's places among the rows whose statistics (and bins, in ``codes``) the tree has
        # (:meth:`_summed`). The tree's columns alone (all of them, or its share): positions below are among those.
        buckets, shuffle, codes, columns = self.n_bins + 1, self.shuffle, self._codes, self.n_sampled
        if shuffle is None:
            return None if ask.rows is None else self.ops.bucket_sums(self.gh, rows, codes, buckets)
        if ask.rows is None and not sums_afresh(len(rows), buckets):
            cumulative = self.ops.subtract(self.cumulative[ask.parent], self.cumulative[ask.sibling])
        else:
            cumulative = self.ops.bucket_sums(self.gh, rows, codes, buckets, cumulative=True)
        self.cumulative[ask.node] = cumulative
        # A bin none of the node's rows fall in splits them as the bin before it does: its sums (and gain) are
        # that bin's, a tie the unshuffled grower breaks to the earlier, so it is not sent at all.
        counts = np.bincount((codes[rows].astype(np.int64) + np.arange(columns) * buckets).ravel(),
                             minlength=columns * buckets).reshape(columns, buckets)
        keep = counts[:, :self.n_bins] > 0
        keep[:, 0] = True
        order = np.flatnonzero(keep.ravel())[self._draw_order(shuffle, int(keep.sum()))]
        self.order[ask.node] = order
        column, bin_index = np.divmod(order, self.n_bins)
        at = column * buckets + bin_index
        # Where no one in the node lacks a value of the column, the grower knows the right sums (its total over
        # the people this party holds, less the left): they are sent only for the other columns.
        missing = counts[column, self.n_bins] > 0
        right = (self.ops.subtract(self.ops.rows(cumulative, (column * buckets + self.n_bins - 1)[missing]),
                                   self.ops.rows(cumulative, at[missing])) if missing.any() else None)
        return self.ops.rows(cumulative, at), right, missing

    @staticmethod
    def _draw_order(shuffle: np.random.Generator, n: int) -> np.ndarray:
        """The order ``n`` candidates are sent in: a fresh permutation each node."""
        order: np.ndarray = shuffle.permutation(n)
        return order

    def splits(self, asks: list[SplitAsk]) -> dict[int, tuple[int, np.ndarray, bool]]:
        """Record each asked split in the lookup table; per node, its record, which of the node's rows go left
        and where the others go. One split per node summed, before any child of it is asked: the table keeps
        the splits of the trees and nothing else, so that scoring answers for those alone."""
        chosen: list[tuple[SplitAsk, int, int, bool]] = []
        for ask in asks:
            if ask.node not in self.nodes:
                raise RefusedError(f"split of node {ask.node}, which this party never summed in tree {self.tree}: "
                                   "no such node")
            if ask.node in self.split or any(a.node == ask.node for a, _, _, _ in chosen):
                raise RefusedError(f"split of node {ask.node} asked again: a party records one split per node of "
                                   f"a tree, and node {ask.node} of tree {self.tree} has its split")
            if self.children.get(ask.node):
                raise RefusedError(f"split of node {ask.node}, whose children were already asked: its split is "
                                   "another party's")
            column, bin_index, default_left = self._chosen(ask)
            chosen.append((ask, column, bin_index, default_left))
        out = {}
        for ask, column, bin_index, default_left in chosen:
            value = threshold(self.cuts[column], bin_index)
            record = self.table.add(column, value, default_left)
            x = self.X[self.nodes[ask.node], column]
            left = np.where(np.isnan(x), default_left, x <= value)
            self.split[ask.node] = left
            out[ask.node] = (record, left, default_left)
        return out

    def _chosen(self, ask: SplitAsk) -> tuple[int, int, bool]:
        """The column, bin and default branch of the split asked: the candidate named, or, at a partner, the
        first in its own order of the shuffled positions the grower found tied."""
        c = ask.candidate
        if self.shuffle is None:
            column, bin_index, default_left = c.feature, c.bin, c.default_left
        else:
            order = self.order[ask.node]
            positions = [p for p, _ in c.ties]
            if not positions or len(set(positions)) != len(positions) or not all(
                    0 <= p < len(order) for p in positions):
                raise ProtocolError(f"split of node {ask.node}: the positions {positions} are not distinct "
                                    f"positions among its {len(order)} candidates")
            position, default_left = min(c.ties, key=lambda tie: int(order[tie[0]]))
            column, bin_index = divmod(int(order[position]), self.n_bins)
        if not 0 <= column < self.n_sampled or not 0 <= bin_index < self.n_bins:
            raise ProtocolError(f"split of node {ask.node} at column {column}, bin {bin_index}: no such bin")
        return int(self.sampled[column]), bin_index, bool(default_left)
