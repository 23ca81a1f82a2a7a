"""A party's side of growing trees over its own columns: bins, per-node sums, and the lookup table that keeps
its splits (column and threshold), which no other party sees."""

from __future__ import annotations

from typing import Any

import numpy as np

from vflo.errors import ProtocolError
from vflo.trees.bins import bin_codes, fit_cuts, threshold
from vflo.trees.crypto import PublicSide
from vflo.trees.growth import HistogramAsk, SplitAsk


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
    each node it is asked for, and the rows of each such node (which it learns from the asks)."""

    def __init__(self, X: np.ndarray, n_bins: int, ops: PublicSide, *, min_node_rows: int) -> None:
        self.X = np.asarray(X, dtype=np.float64)
        self.n_bins = n_bins
        self.cuts = fit_cuts(self.X, n_bins)
        self.codes = bin_codes(self.X, self.cuts, n_bins)
        self.ops = ops
        self.min_node_rows = min_node_rows
        self.table = LookupTable()
        self.gh: Any = None
        self.tree = -1
        self.nodes: dict[int, np.ndarray] = {}
        self.children: dict[int, list[int]] = {}

    @property
    def n_columns(self) -> int:
        return int(self.X.shape[1])

    def new_tree(self, gh: Any, tree: int = 0) -> None:
        """The statistics of tree number ``tree`` (encrypted or not): each row's, in the order of this party's
        rows."""
        self.gh, self.tree, self.nodes, self.children = gh, tree, {}, {}
        self.ops.share(gh)

    def histograms(self, asks: list[HistogramAsk]) -> dict[int, Any]:
        """The sums of each node asked with its rows; a node asked without rows (its parent's rows less its
        sibling's) is only recorded, for its children and its split: the grower, holding the parent's and the
        sibling's sums in the clear, subtracts them itself, cheaper than a subtraction of ciphertexts here and
        nothing it did not know.

        The nodes of one tree must nest as a tree's do: one root, then children of nodes already summed, two at
        most per parent, disjoint, together the parent's rows; and no node (nor what its parent less it leaves)
        may hold fewer than ``min_node_rows`` of this party's rows. Without that, sums over sets that differ by
        a row or two would come close to single rows' values."""
        if self.gh is None:
            raise ProtocolError("histograms asked before the tree's gradients")
        n = len(self.X)
        out = {}
        for ask in asks:
            if ask.node in self.nodes:
                raise ProtocolError(f"node {ask.node} was already summed in this tree")
            if ask.parent < 0:
                if self.nodes:
                    raise ProtocolError(f"node {ask.node} names no parent, but this tree has its root")
                rows = np.asarray(ask.rows, dtype=np.int64)
                if len(rows) and (rows.min() < 0 or rows.max() >= n or np.any(np.diff(rows) <= 0)):
                    raise ProtocolError(f"node {ask.node}: rows must be increasing positions among this party's "
                                        f"{n} rows")
                sums = self.ops.bucket_sums(self.gh, rows, self.codes, self.n_bins + 1)
            else:
                if ask.parent not in self.nodes:
                    raise ProtocolError(f"node {ask.node}: its parent {ask.parent} was not summed in this tree")
                parent, brothers = self.nodes[ask.parent], self.children.setdefault(ask.parent, [])
                if len(brothers) >= 2:
                    raise ProtocolError(f"node {ask.parent} already has two children")
                if ask.rows is None:
                    if ask.sibling not in brothers:
                        raise ProtocolError(f"node {ask.node}: sibling {ask.sibling} is not a summed child of "
                                            f"{ask.parent}")
                    rows, sums = np.setdiff1d(parent, self.nodes[ask.sibling]), None
                else:
                    rows = np.asarray(ask.rows, dtype=np.int64)
                    if len(np.intersect1d(rows, parent)) != len(rows) or len(np.unique(rows)) != len(rows):
                        raise ProtocolError(f"node {ask.node}: rows that are not its parent {ask.parent}'s")
                    if brothers and len(rows) + len(self.nodes[brothers[0]]) != len(parent):
                        raise ProtocolError(f"node {ask.node}: with its sibling, not its parent's rows")
                    rows = np.sort(rows)
                    sums = self.ops.bucket_sums(self.gh, rows, self.codes, self.n_bins + 1)
            if len(rows) < self.min_node_rows:
                raise ProtocolError(f"node {ask.node} has {len(rows)} of this party's rows, fewer than its "
                                    f"min_node_rows {self.min_node_rows}: its sums would be close to single rows'")
            if ask.parent >= 0:
                rest = len(self.nodes[ask.parent]) - len(rows)
                if 0 < rest < self.min_node_rows:
                    raise ProtocolError(f"node {ask.node} leaves {rest} of its parent's rows, fewer than "
                                        f"min_node_rows {self.min_node_rows}")
                self.children[ask.parent].append(ask.node)
            self.nodes[ask.node] = rows
            if sums is not None:
                out[ask.node] = sums
        return out

    def splits(self, asks: list[SplitAsk]) -> dict[int, tuple[int, np.ndarray]]:
        """Record each asked split in the lookup table; per node, its record and which of the node's rows go left."""
        out = {}
        for ask in asks:
            if ask.node not in self.nodes:
                raise ProtocolError(f"split of node {ask.node}, which this party never summed in this tree")
            c = ask.candidate
            if not 0 <= c.feature < self.n_columns or not 0 <= c.bin < self.n_bins:
                raise ProtocolError(f"split of node {ask.node} at column {c.feature}, bin {c.bin}: no such bin")
            value = threshold(self.cuts[c.feature], c.bin)
            record = self.table.add(c.feature, value, c.default_left)
            x = self.X[self.nodes[ask.node], c.feature]
            out[ask.node] = (record, np.where(np.isnan(x), c.default_left, x <= value))
        return out
