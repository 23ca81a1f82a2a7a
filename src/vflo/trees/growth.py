"""Growing one regression tree on gradient statistics, level by level, from per-bin sums each party computes
over its own columns (Chen & Guestrin 2016's second-order gain, with a learned branch for missing values).

Sums are integers (gradients in fixed point): added in any order, under encryption or not, they are the same,
so a tree grown from decrypted sums is the tree grown from plaintext ones, and the same as a centralized grower
given the same bins. Rows are positions in the grower's row list; a party holds some of them (``held``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from vflo.errors import ConfigError, ProtocolError


@dataclass(frozen=True, kw_only=True)
class GrowthRules:
    """``reg_lambda`` (λ) and ``gamma`` (γ) as in XGBoost; ``min_child_weight``: the least hessian sum of a child;
    ``max_depth``; ``min_node_rows``: a party gives bin sums only for nodes where it holds at least this many
    rows (and the node's sibling too, since the grower can subtract one from the parent); ``scale``: the
    fixed-point scale of the integer sums."""

    max_depth: int = 5
    reg_lambda: float = 1.0
    gamma: float = 0.0
    min_child_weight: float = 1.0
    min_node_rows: int = 5
    scale: float = float(2**20)

    def __post_init__(self) -> None:
        if self.max_depth < 1:
            raise ConfigError(f"max_depth must be at least 1, got {self.max_depth}")
        if self.reg_lambda < 0 or self.gamma < 0 or self.min_child_weight < 0:
            raise ConfigError("reg_lambda, gamma and min_child_weight must be >= 0")
        if self.min_node_rows < 1:
            raise ConfigError(f"min_node_rows must be at least 1, got {self.min_node_rows}")


@dataclass(frozen=True)
class Candidate:
    """The best split of a node at one party: after bin ``bin`` of column ``feature``; ``default_left``: where a
    person goes whose value is missing, or whom the party does not hold. At a party whose candidates came
    shuffled (:class:`ShuffledSums`) the grower knows no column or bin (both -1): ``ties`` holds the shuffled
    indices of the candidates of the best gain, each with its default branch, and the party, which alone knows
    their order, keeps the first (so the split is the one an unshuffled grower picks)."""

    gain: float
    feature: int
    bin: int
    default_left: bool
    ties: tuple[tuple[int, bool], ...] = ()


@dataclass(frozen=True)
class ShuffledSums:
    """A node's candidate splits at a partner, in an order only the partner knows: per candidate (a bin of one
    of its columns), the g and h sums of the node's people it holds whose value is present and at or below
    the bin (``left``, candidates x 2 integers) and above it (``right``). The people the partner lacks or has
    no value for make up the rest of the node's totals. ``right`` comes only for the candidates ``missing``
    marks (a column with a missing value in the node, rows in order); of the others' columns every person the
    partner holds is present, so their right sums are those people's total less the left (:meth:`completed`)."""

    left: np.ndarray
    right: np.ndarray
    missing: np.ndarray | None = None

    def completed(self, held_total: np.ndarray) -> ShuffledSums:
        """Every candidate's right sums, ``held_total`` being the node's sums over the people the partner holds."""
        if self.missing is None:
            return self
        right = held_total[None, :] - np.asarray(self.left, dtype=np.int64)
        right[self.missing] = self.right
        return ShuffledSums(self.left, right)


def _gains(left_sums: np.ndarray, total: np.ndarray, rules: GrowthRules) -> tuple[np.ndarray, np.ndarray]:
    """The gain of each split whose left child's integer g and h sums are ``left_sums`` (... x 2), and which of
    them are allowed; one expression for shuffled and unshuffled sums, so that equal sums gain equally."""
    left = left_sums.astype(np.float64) / rules.scale
    g, h = total.astype(np.float64) / rules.scale
    gl, hl = left[..., 0], left[..., 1]
    gr, hr = g - gl, h - hl
    lam = rules.reg_lambda
    gain = 0.5 * (gl * gl / (hl + lam) + gr * gr / (hr + lam) - g * g / (h + lam)) - rules.gamma
    valid = (hl >= rules.min_child_weight) & (hr >= rules.min_child_weight) & (gain > 0)
    return gain, valid


def best_split(sums: np.ndarray | ShuffledSums, total: np.ndarray, rules: GrowthRules) -> Candidate | None:
    """The best split in ``sums`` (columns x (bins + 1) x 2: g and h per bin, the last bin a column's missing
    values, never read; or a partner's :class:`ShuffledSums`), for a node whose g and h sums are ``total``;
    None when no split gains."""
    if isinstance(sums, ShuffledSums):
        return _best_shuffled(sums, total, rules)
    present = sums[:, :-1, :]
    cum = np.cumsum(present, axis=1)
    missing = total[None, :] - cum[:, -1, :]
    # Direction 0: missing values (and people the party lacks) go left; 1: they go right.
    gain, valid = _gains(np.stack([cum + missing[:, None, :], cum], axis=2), total, rules)
    if not valid.any():
        return None
    flat = int(np.argmax(np.where(valid, gain, -np.inf)))
    feature, bin_index, direction = np.unravel_index(flat, gain.shape)
    default_left = direction == 0
    if missing[feature, 1] == 0:
        # No one in this node is missing there: send the absent to the side with more weight.
        present_left = cum[feature, bin_index, 1]
        default_left = bool(present_left >= total[1] - present_left)
    return Candidate(float(gain[feature, bin_index, direction]), int(feature), int(bin_index), bool(default_left))


def _best_shuffled(sums: ShuffledSums, total: np.ndarray, rules: GrowthRules) -> Candidate | None:
    """:func:`best_split` over a partner's shuffled candidates. Every candidate of the best gain is a tie the
    partner breaks by its own (column, bin) order, which is how the unshuffled argmax breaks it; within one
    candidate, missing values going left comes first, as there."""
    left, right = np.asarray(sums.left, dtype=np.int64), np.asarray(sums.right, dtype=np.int64)
    if right.shape != left.shape:
        raise ProtocolError(f"{len(left)} candidates with {len(right)} right sums: the grower fills in the right sums "
                            "a partner leaves to it (ShuffledSums.completed) before it picks among them")
    # Direction 0: the missing (and people the partner lacks) go left, so the left child is all but the right.
    gain, valid = _gains(np.stack([total[None, :] - right, left], axis=1), total, rules)
    if not valid.any():
        return None
    scored = np.where(valid, gain, -np.inf)
    top = scored.max()
    ties = []
    for item in np.flatnonzero((scored == top).any(axis=1)).tolist():
        default_left = bool(scored[item, 0] == top)
        if total[1] - left[item, 1] - right[item, 1] == 0:
            # No one in this node is missing there: send the absent to the side with more weight.
            default_left = bool(left[item, 1] >= total[1] - left[item, 1])
        ties.append((int(item), default_left))
    return Candidate(float(top), -1, -1, ties[0][1], ties=tuple(ties))


def leaf_weight(total: np.ndarray, rules: GrowthRules) -> float:
    g, h = total.astype(np.float64) / rules.scale
    return float(-g / (h + rules.reg_lambda))


@dataclass
class Tree:
    """Nodes in the order they were made (a child after its parent). ``owner``: -1 a leaf, else the party that
    holds the split (0 the grower); ``record``: where that party keeps the split (its column and threshold, which
    only it knows); ``default_left``: where a person goes whom the owner lacks or has no value for."""

    owner: list[int] = field(default_factory=list)
    record: list[int] = field(default_factory=list)
    default_left: list[bool] = field(default_factory=list)
    left: list[int] = field(default_factory=list)
    right: list[int] = field(default_factory=list)
    value: list[float] = field(default_factory=list)

    def add(self) -> int:
        self.owner.append(-1)
        self.record.append(-1)
        self.default_left.append(False)
        self.left.append(-1)
        self.right.append(-1)
        self.value.append(0.0)
        return len(self.owner) - 1

    def __len__(self) -> int:
        return len(self.owner)

    def arrays(self) -> dict[str, np.ndarray]:
        return {"owner": np.asarray(self.owner, dtype=np.int64), "record": np.asarray(self.record, dtype=np.int64),
                "default_left": np.asarray(self.default_left, dtype=bool),
                "left": np.asarray(self.left, dtype=np.int64), "right": np.asarray(self.right, dtype=np.int64),
                "value": np.asarray(self.value, dtype=np.float64)}

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray]) -> Tree:
        return cls(owner=[int(v) for v in arrays["owner"]], record=[int(v) for v in arrays["record"]],
                   default_left=[bool(v) for v in arrays["default_left"]], left=[int(v) for v in arrays["left"]],
                   right=[int(v) for v in arrays["right"]], value=[float(v) for v in arrays["value"]])

    def route(self, n: int, goes_left: RouteRule) -> np.ndarray:
        """Each of ``n`` rows' leaf value: from the root, ``goes_left(node, rows)`` says which of ``rows`` take
        the left branch at an internal node."""
        at = np.zeros(n, dtype=np.int64)
        for node in range(len(self)):
            if self.owner[node] < 0:
                continue
            rows = np.flatnonzero(at == node)
            if len(rows) == 0:
                continue
            left = goes_left(node, rows)
            at[rows[left]] = self.left[node]
            at[rows[~left]] = self.right[node]
        return np.asarray(self.value, dtype=np.float64)[at]


class RouteRule(Protocol):
    def __call__(self, node: int, rows: np.ndarray) -> np.ndarray: ...


@dataclass(frozen=True)
class HistogramAsk:
    """Bin sums of ``node`` at one party: over ``rows`` (positions among the rows that party holds); with ``rows``
    None, the node is ``parent``'s rows less ``sibling``'s (both asked before): the label holder's own columns
    send no sums for it, the grower subtracting the sibling's from the parent's; a partner, whose candidates
    reach the grower shuffled afresh per node, subtracts its ciphertexts itself and sends the node's."""

    node: int
    rows: np.ndarray | None
    parent: int = -1
    sibling: int = -1
    #: How many of the party's rows the node's sums run over (the grower's own count, never sent: the party knows
    #: them): the rows it holds there, or those of them the tree is grown on (GOSS).
    held: int = 0


@dataclass(frozen=True)
class SplitAsk:
    """Record the split ``candidate`` of ``node`` and say which of the node's rows it holds go left."""

    node: int
    candidate: Candidate


class Parties(Protocol):
    """The parties' side of growing a tree, one call per level for all of them (a round each, over a network)."""

    def histograms(self, asks: Mapping[int, list[HistogramAsk]]) -> dict[int, dict[int, np.ndarray | ShuffledSums]]:
        """Per party, per node asked with rows: its bin sums (columns x (bins + 1) x 2, integers), or its
        shuffled candidates' (a partner's, which it gives for a node asked without rows too)."""
        ...

    def splits(self, asks: Mapping[int, list[SplitAsk]]) -> dict[int, dict[int, tuple[int, np.ndarray, bool]]]:
        """Per party, per node: the record it keeps the split under, which of the node's rows it holds (in the
        order they were asked) go left, and where the others go."""
        ...


def grow(gh: np.ndarray, held: list[np.ndarray], parties: Parties, rules: GrowthRules, *,
         eligible: list[bool] | None = None, least: list[int] | None = None,
         counted: list[np.ndarray] | None = None) -> tuple[Tree, np.ndarray]:
    """One tree over every row of ``gh`` (rows x 2 integers: g and h in fixed point), and each row's leaf.
    ``held[k]``: which rows party k holds (party 0, the grower's own, holds every row); ``eligible[k]``: whether
    party k's columns may split this tree (SecureBoost's first trees at the label holder alone); ``least[k]``:
    the fewest of its rows party k sums a node over (default ``rules.min_node_rows`` for every party);
    ``counted[k]``: the rows party k sums over (default ``held[k]``; with GOSS, those of them the tree is grown on,
    the others' statistics being zero and never sent)."""
    eligible = eligible if eligible is not None else [True] * len(held)
    least = least if least is not None else [rules.min_node_rows] * len(held)
    counted = counted if counted is not None else held
    leaf = np.zeros(len(gh), dtype=np.int64)
    where = [np.where(h, np.cumsum(h) - 1, -1) for h in held]
    tree = Tree()
    root = tree.add()
    level: list[tuple[int, np.ndarray, int, int]] = [(root, np.arange(len(gh)), -1, -1)]  # node, rows, parent, sib
    asked: list[set[int]] = [set() for _ in held]
    kept: list[dict[int, np.ndarray | ShuffledSums]] = [{} for _ in held]  # each party's sums of its nodes
    for depth in range(rules.max_depth + 1):
        totals = {node: gh[rows].sum(axis=0) for node, rows, _, _ in level}
        splittable = [entry for entry in level if depth < rules.max_depth and len(entry[1]) >= 2
                      and totals[entry[0]][1] / rules.scale >= 2 * rules.min_child_weight]
        for node, _, _, _ in level:
            tree.value[node] = leaf_weight(totals[node], rules)
        if not splittable:
            break
        asks: dict[int, list[HistogramAsk]] = {}
        for k, h in enumerate(held):
            if eligible[k]:
                mine = {node: int(counted[k][rows].sum()) for node, rows, _, _ in level}
                asks[k] = _asks(splittable, mine, asked[k], where[k], h, least[k])
        asks = {k: v for k, v in asks.items() if v}
        sums = parties.histograms(asks)
        for k, v in asks.items():
            asked[k] |= {a.node for a in v}
            got = sums.setdefault(k, {})
            summed = {a.node for a in v if a.rows is not None}
            if not summed <= set(got) <= {a.node for a in v}:
                raise ProtocolError(f"party {k} sent sums of nodes {sorted(got)}, asked for {sorted(summed)}")
            for ask in v:
                if ask.rows is None and ask.node not in got:
                    parent, sibling = kept[k][ask.parent], got[ask.sibling]
                    if isinstance(parent, ShuffledSums) or isinstance(sibling, ShuffledSums):
                        raise ProtocolError(f"party {k} sent no sums of node {ask.node}: its shuffled sums cannot "
                                            "be subtracted here")
                    got[ask.node] = parent - sibling
            kept[k] = got
        best: dict[int, tuple[int, Candidate]] = {}
        members = {node: rows for node, rows, _, _ in level}
        for k in sorted(sums):
            for node, s in sums[k].items():
                if isinstance(s, ShuffledSums):
                    s = s.completed(gh[members[node][held[k][members[node]]]].sum(axis=0))
                found = best_split(s, totals[node], rules)
                if found is not None and (node not in best or found.gain > best[node][1].gain):
                    best[node] = (k, found)
        split_asks: dict[int, list[SplitAsk]] = {}
        for node, (k, candidate) in best.items():
            split_asks.setdefault(k, []).append(SplitAsk(node, candidate))
        decided = parties.splits(split_asks)
        following = []
        for node, rows, _, _ in splittable:
            if node not in best:
                continue
            k, candidate = best[node]
            record, left_held, default_left = decided[k][node]
            mine = held[k][rows]
            if len(left_held) != int(mine.sum()):
                raise ProtocolError(f"party {k} decided {len(left_held)} rows of node {node}, which holds "
                                    f"{int(mine.sum())} of its rows")
            left = np.full(len(rows), default_left)
            left[mine] = left_held
            tree.owner[node], tree.record[node] = k, record
            tree.default_left[node] = default_left
            a, b = tree.add(), tree.add()
            tree.left[node], tree.right[node] = a, b
            following += [(a, rows[left], node, b), (b, rows[~left], node, a)]
            leaf[rows[left]], leaf[rows[~left]] = a, b
        level = following
        if not level:
            break
    return tree, leaf


def _asks(splittable: list[tuple[int, np.ndarray, int, int]], held_in: Mapping[int, int], asked: set[int],
          where: np.ndarray, held: np.ndarray, least: int) -> list[HistogramAsk]:
    """One party's asks for a level: a node only where the party summed its parent and it holds ``least`` rows
    of the party, and its sibling none or ``least`` too (the grower, holding the parent's sums, could subtract
    either from it, so the party refuses otherwise: :class:`~vflo.trees.lookup.ColumnsParty`); of two siblings,
    the one with fewer of the party's rows summed and the other subtracted from the parent."""
    ok = {node for node, _, parent, sibling in splittable if held_in[node] >= least and (
        parent < 0 or (parent in asked and (held_in[sibling] >= least or held_in[sibling] == 0)))}
    out: list[HistogramAsk] = []
    derived = []
    for node, rows, parent, sibling in splittable:
        if node not in ok:
            continue
        if sibling in ok and (held_in[sibling], sibling) < (held_in[node], node):
            derived.append(HistogramAsk(node, None, parent, sibling, held=int(held_in[node])))
        else:
            out.append(HistogramAsk(node, where[rows[held[rows]]], parent, sibling, held=int(held_in[node])))
    return out + derived
