"""SecureBoost: what a label holder that breaks the protocol learns of a partner's columns (not a test). Prints
a JSON report and writes it to ``--out``.

    python -m benchmarks.secureboost_attack [--data-dir ../shared/datasets] [--rows 3000] [--trees 50]
                                            [--out runs/bench/secureboost_attack.json]

The partner is UCI Credit Card's bureau (X6-X23, 18 columns, 32 bins), its first ``--rows`` people. The attacker
drives the partner's side of the protocol directly (:class:`vflo.trees.lookup.ColumnsParty`, what ``sb.gradients``,
``sb.histograms`` and ``sb.splits`` run), with the plaintext backend so that it can read what it decrypts; every
ask a partner refuses is counted. The measure is Spearman's rank correlation between the order the attacker
recovers of the people in a column and their raw values, averaged over the 18 columns (0 for a column it learns
nothing of); ``ceiling`` is that of the true bins, the most any attack on bins can reach. Where the attacker
cannot tell which column a recovered order is (shuffled candidates), each column is credited with the best of
the attacker's orders: an upper bound on what it knows.

1. ``repeated_root``: honest-looking statistics (the first tree's logistic gradients); the attacker asks the
   root's split at every candidate it has (the measured attack: every person's bin in every column), and again
   in each of ``--trees`` trees (a new tree is the only way to a new root), then clusters the cuts it got into
   chains of nested sets (one chain per column, since one column's cuts nest).
2. ``crafted``: instead of gradients, one power of two per person (62 people in g, 62 in h per tree), so that
   each decrypted sum is the set of people it covers; per tree, the root's sums alone, decoded and clustered.
3. ``honest``: what the protocol tells an honest label holder of the same columns, for scale: the bank
   (X1-X5, the labels) and the bureau train ``--trees`` trees of depth 5 on ``--rows`` people (80 % of them to
   train); the label holder learns which of a node's people go left at each split the bureau keeps. Counted:
   those splits, those at a root (a cut of every person), and the measure above from the roots' cuts alone.

Run it on the code before a protocol change too (``PYTHONPATH=<that src>``): it speaks whichever partner side
it finds (unshuffled bin sums and any split asked, or shuffled candidates answered once per node).
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import linear_sum_assignment
from scipy.stats import spearmanr

from vflo.data.datasets import load_dataset
from vflo.errors import ProtocolError
from vflo.trees.crypto import plain_side
from vflo.trees.growth import Candidate, HistogramAsk, SplitAsk
from vflo.trees.lookup import ColumnsParty

logger = logging.getLogger(__name__)
N_BINS = 32
BITS = 62  # people per int64 channel: a sum of distinct powers below 2^62 never overflows
SHUFFLED = hasattr(ColumnsParty, "_draw_order")


def _partner(X: np.ndarray, seed: int) -> ColumnsParty:
    if SHUFFLED:
        return ColumnsParty(X, N_BINS, plain_side(), min_node_rows=5, shuffle=np.random.default_rng(seed))
    return ColumnsParty(X, N_BINS, plain_side(), min_node_rows=5)


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    if np.ptp(a) == 0 or np.ptp(b) == 0:
        return 0.0
    return abs(float(spearmanr(a, b).statistic))


def _credit(rows: int, data_dir: str | None) -> tuple[np.ndarray, np.ndarray]:
    data = load_dataset("credit_default", data_dir)
    X = np.asarray(data.X, dtype=np.float64)[:rows, 5:23]
    return X, np.asarray(data.y[:rows], dtype=np.float64)


def _chains(sets: Sequence[np.ndarray]) -> list[list[np.ndarray]]:
    """Boolean sets grouped into chains of nested sets, smallest first: each set joins the chain whose largest
    set is the largest one inside it, else starts its own."""
    chains: list[list[np.ndarray]] = []
    unique = {s.tobytes(): s for s in sets if s.any()}
    for s in sorted(unique.values(), key=lambda v: int(v.sum())):
        fits = [c for c in chains if not np.any(c[-1] & ~s)]
        if fits:
            max(fits, key=lambda c: int(c[-1].sum())).append(s)
        else:
            chains.append([s])
    return chains


def _ranks(chain: list[np.ndarray]) -> np.ndarray:
    """Each person's position in a chain's order: how many of its (left) sets leave them out."""
    return np.sum([~s for s in chain], axis=0)


def _credited(X: np.ndarray, orders: list[np.ndarray], people: np.ndarray) -> tuple[list[float], list[float]]:
    """Per column, the best Spearman over ``people`` of any recovered order with it, and of the order matched to
    it when each order may name one column only (the best such matching); 0 without an order."""
    table = np.array([[_spearman(o[people], X[people, j]) for j in range(X.shape[1])] for o in orders])
    if not len(orders):
        return [0.0] * X.shape[1], [0.0] * X.shape[1]
    matched = [0.0] * X.shape[1]
    for o, j in zip(*linear_sum_assignment(table, maximize=True), strict=True):
        matched[j] = float(table[o, j])
    return table.max(axis=0).tolist(), matched


def _ceiling(party: ColumnsParty, X: np.ndarray, people: np.ndarray) -> float:
    return float(np.mean([_spearman(party.codes[people, j], X[people, j]) for j in range(X.shape[1])]))


def _ask_split(party: ColumnsParty, node: int, choice: Any) -> np.ndarray | None:
    """The left set of one split asked of ``node`` (a (column, bin) unshuffled, a position shuffled); None: refused."""
    candidate = (Candidate(0.0, -1, -1, True, ties=((int(choice), True),)) if SHUFFLED
                 else Candidate(0.0, int(choice[0]), int(choice[1]), True))
    try:
        return np.asarray(party.splits([SplitAsk(node, candidate)])[node][1], dtype=bool)
    except ProtocolError:
        return None


def repeated_root(X: np.ndarray, y: np.ndarray, trees: int, seed: int) -> dict[str, Any]:
    n = len(X)
    p = float(np.mean(y))
    gh = np.rint(np.stack([(p - y), np.full(n, p * (1 - p))], axis=1) * 2**20).astype(np.int64)
    party = _partner(X, seed)
    rng = np.random.default_rng(seed)
    cuts: dict[int, list[np.ndarray]] = {j: [] for j in range(X.shape[1])}  # unshuffled: cuts known by column
    unlabelled: list[np.ndarray] = []
    answered = refused = 0
    first_tree: dict[str, float] = {}
    for tree in range(trees):
        party.new_tree(gh, tree)
        sums = party.histograms([HistogramAsk(0, np.arange(n))])[0]
        choices: list[Any] = ([(j, b) for j in range(X.shape[1]) for b in range(N_BINS)] if not SHUFFLED
                              else rng.permutation(len(sums[0])).tolist())
        for choice in choices:
            left = _ask_split(party, 0, choice)
            if left is None:
                refused += 1
                continue
            answered += 1
            (unlabelled.append(left) if SHUFFLED else cuts[choice[0]].append(left))
        try:  # the root again, and the same tree's gradients again to reach a new root of it
            party.histograms([HistogramAsk(0, np.arange(n))])
        except ProtocolError:
            refused += 1
        try:
            party.new_tree(gh, tree)
        except ProtocolError:
            refused += 1
        if tree == 0:
            first_tree = _summary(X, cuts, unlabelled, answered)
        if not SHUFFLED:
            break  # one tree gave it all
    return {"protocol": "shuffled, once per node" if SHUFFLED else "unshuffled, any split",
            "trees_asked": tree + 1, "splits_answered": answered, "asks_refused": refused,
            "lookup_records": len(party.table), "ceiling": _ceiling(party, X, np.arange(n)),
            "after_first_tree": first_tree, "after_all_trees": _summary(X, cuts, unlabelled, answered)}


def _summary(X: np.ndarray, cuts: dict[int, list[np.ndarray]], unlabelled: list[np.ndarray],
             answered: int) -> dict[str, float]:
    everyone = np.arange(len(X))
    if SHUFFLED:
        best, matched = _credited(X, [_ranks(c) for c in _chains(unlabelled)], everyone)
    else:
        best = matched = [_spearman(_ranks(cuts[j]), X[:, j]) if cuts[j] else 0.0 for j in range(X.shape[1])]
    return {"splits_answered": float(answered), "mean_spearman_best": float(np.mean(best)),
            "mean_spearman_matched": float(np.mean(matched)),
            "columns_above_0.9_matched": float(sum(c > 0.9 for c in matched))}


def _decode(values: np.ndarray, people: np.ndarray, n: int) -> np.ndarray:
    """The set of people (of ``n``) whose powers of two make up a decrypted (g, h) sum."""
    out = np.zeros(n, dtype=bool)
    for channel in (0, 1):
        mine = people[channel * BITS:(channel + 1) * BITS]
        bits = (int(values[channel]) >> np.arange(len(mine))) & 1
        out[mine] = bits.astype(bool)
    return out


def crafted(X: np.ndarray, trees: int, seed: int) -> dict[str, Any]:
    n = len(X)
    party = _partner(X, seed)
    per_tree = []
    decoded = 0
    for tree in range(min(trees, n // (2 * BITS))):
        people = np.arange(tree * 2 * BITS, (tree + 1) * 2 * BITS)
        gh = np.zeros((n, 2), dtype=np.int64)
        gh[people[:BITS], 0] = 1 << np.arange(BITS, dtype=np.int64)
        gh[people[BITS:], 1] = 1 << np.arange(BITS, dtype=np.int64)
        party.new_tree(gh, tree)
        sums = party.histograms([HistogramAsk(0, np.arange(n))])[0]
        if SHUFFLED:
            left, sent, missing = sums
            right = gh.sum(axis=0)[None, :] - np.asarray(left)  # the grower's own where no value is missing
            if sent is not None:
                right[missing] = np.asarray(sent)
            lefts = [_decode(v, people, n) for v in left]
            presents = [a | _decode(v, people, n) for a, v in zip(lefts, right, strict=True)]
            orders = []
            for present in {p.tobytes(): p for p in presents}.values():  # one column's cuts share who is present
                group = [a for a, p in zip(lefts, presents, strict=True) if np.array_equal(p, present)]
                orders += [_ranks(c) for c in _chains(group)]
            best, matched = _credited(X, orders, people)
            chains = len(orders)
        else:
            bins = np.asarray(sums).reshape(X.shape[1], N_BINS + 1, 2)
            codes = np.zeros((n, X.shape[1]), dtype=np.int64)
            for j in range(X.shape[1]):
                for b in range(N_BINS + 1):
                    codes[_decode(bins[j, b], people, n), j] = b
            best = matched = [_spearman(codes[people, j], X[people, j]) for j in range(X.shape[1])]
            chains = X.shape[1]
        decoded += len(people)
        per_tree.append({"best": float(np.mean(best)), "matched": float(np.mean(matched)), "orders": chains})
    return {"protocol": "shuffled, once per node" if SHUFFLED else "unshuffled, any split",
            "trees": len(per_tree), "people_decoded": decoded, "people_per_tree": 2 * BITS,
            "ceiling": _ceiling(party, X, np.arange(decoded)),
            "mean_spearman_best": float(np.mean([t["best"] for t in per_tree])),
            "mean_spearman_matched": float(np.mean([t["matched"] for t in per_tree])),
            "orders_per_tree": float(np.mean([t["orders"] for t in per_tree])), "columns": X.shape[1]}


def honest(rows: int, trees: int, data_dir: str | None) -> dict[str, Any]:
    from benchmarks.secureboost import split
    from vflo.federation.simulation import run_method
    from vflo.methods.registry import get_method

    data = split("credit_default", [{"name": "bank", "role": "active", "columns": ["X1", "X2", "X3", "X4", "X5"]},
                                    {"name": "bureau", "columns": "rest"}], rows, data_dir)
    seen: list[tuple[ColumnsParty, np.ndarray, np.ndarray]] = []  # the bureau's side, a node's rows, who went left
    answer = ColumnsParty.splits

    def recorded(self: ColumnsParty, asks: list[SplitAsk]) -> Any:
        out = answer(self, asks)
        if self.n_columns == data.train["bureau"].n_features:
            seen.extend((self, self.nodes[a.node], np.asarray(out[a.node][1], dtype=bool)) for a in asks)
        return out

    ColumnsParty.splits = recorded  # type: ignore[method-assign]
    try:
        run_method(get_method("secureboost")(n_trees=trees, max_depth=5, n_bins=N_BINS, he={"scheme": "plaintext"}),
                   data, seed=0)
    finally:
        ColumnsParty.splits = answer  # type: ignore[method-assign]
    party = seen[0][0]
    n = len(party.X)
    cuts = [left for _, members, left in seen if len(members) == n]
    best, matched = _credited(party.X, [_ranks(c) for c in _chains(cuts)], np.arange(n))
    return {"people": n, "splits_learnt": len(seen), "at_roots": len(cuts),
            "people_per_split": float(np.mean([len(m) for _, m, _ in seen])),
            "roots_mean_spearman_best": float(np.mean(best)), "roots_mean_spearman_matched": float(np.mean(matched)),
            "roots_columns_above_0.9_matched": float(sum(c > 0.9 for c in matched))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--rows", type=int, default=3000)
    parser.add_argument("--trees", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("runs/bench/secureboost_attack.json"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    X, y = _credit(args.rows, args.data_dir)
    report = {"rows": len(X), "columns": X.shape[1], "bins": N_BINS,
              "repeated_root": repeated_root(X, y, args.trees, args.seed),
              "crafted": crafted(X, args.trees, args.seed), "honest": honest(args.rows, args.trees, args.data_dir)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    logger.info("wrote %s", args.out)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
