"""SecureBoost's partner answers for the tree being grown and nothing else: one split per node of that tree, a
node only where the tree has it, its lookup table only the splits the label holder chose, and its candidate
sums shuffled afresh per node by its own secret, with the trees unchanged."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest

from tests.test_secureboost import _blocks
from vflo.errors import ProtocolError, RefusedError, RemoteError
from vflo.federation.coordinator import Coordinator
from vflo.federation.session import Session
from vflo.federation.simulation import build_federation, run_method
from vflo.methods.registry import get_method
from vflo.methods.secureboost import BoostPart, _pack_asks
from vflo.party.node import Node
from vflo.trees.crypto import HESettings, new_keys, plain_side, to_wire
from vflo.trees.growth import Candidate, GrowthRules, HistogramAsk, SplitAsk, best_split
from vflo.trees.lookup import ColumnsParty

RULES = GrowthRules(min_node_rows=1, scale=100.0)


def _party(X: np.ndarray, seed: int = 0, *, shuffled: bool = True) -> ColumnsParty:
    own = {"shuffle": np.random.default_rng(seed)} if shuffled else {}
    return ColumnsParty(X, 8, plain_side(), min_node_rows=5, **own)


def _natural(party: ColumnsParty, gh: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The left and right present sums of every (column, bin) whose bin holds one of ``rows``, in column order."""
    lefts, rights = [], []
    for j in range(party.n_columns):
        codes = party.codes[rows, j]
        for b in range(party.n_bins):
            if b and not np.any(codes == b):
                continue
            lefts.append(gh[rows][codes <= b].sum(axis=0))
            rights.append(gh[rows][(codes > b) & (codes < party.n_bins)].sum(axis=0))
    return np.asarray(lefts), np.asarray(rights)


def _sums(party: ColumnsParty, ask: HistogramAsk, gh: np.ndarray, rows: np.ndarray) -> object:
    """A partner's shuffled sums of one node, the right sums it leaves to the grower filled in."""
    from vflo.trees.growth import ShuffledSums

    left, right, missing = party.histograms([ask])[ask.node]
    return ShuffledSums(left, right, missing).completed(gh[rows].sum(axis=0))


def test_a_partner_records_one_split_per_node_and_only_for_nodes_the_tree_has() -> None:
    """The label holder's own columns serve the same order rules as a partner's (no shuffling there)."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 3))
    party = _party(X, shuffled=False)
    gh = np.stack([rng.integers(-100, 100, 40), rng.integers(0, 100, 40)], axis=1)
    party.new_tree(gh, 0)
    with pytest.raises(RefusedError, match="every one of this party's 40 rows"):  # a root of people it chose
        party.histograms([HistogramAsk(0, np.arange(12))])
    party.histograms([HistogramAsk(0, np.arange(40))])
    record, left = party.splits([SplitAsk(0, Candidate(1.0, 0, 3, True))])[0][:2]
    assert record == 0
    for column, bin_index in ((0, 4), (1, 3), (2, 0)):  # the measured attack: every bin of every column at the root
        with pytest.raises(RefusedError, match="asked again"):
            party.splits([SplitAsk(0, Candidate(1.0, column, bin_index, True))])
    assert len(party.table) == 1
    with pytest.raises(RefusedError, match="never summed"):
        party.splits([SplitAsk(7, Candidate(1.0, 0, 3, True))])
    # A child of the split chosen here is exactly one of its sides: not a set the label holder picks.
    sides = np.flatnonzero(left), np.flatnonzero(~left)
    with pytest.raises(RefusedError, match="neither side"):
        party.histograms([HistogramAsk(1, np.sort(np.r_[sides[0][1:], sides[1][:1]]), 0, 2)])
    party.histograms([HistogramAsk(1, sides[0], 0, 2), HistogramAsk(2, None, 0, 1)])
    # A node whose children were asked was split elsewhere: this party keeps no split of it.
    other = _party(X, shuffled=False)
    other.new_tree(gh, 0)
    other.histograms([HistogramAsk(0, np.arange(40)), HistogramAsk(1, np.arange(20), 0, 2)])
    with pytest.raises(RefusedError, match="children were already asked"):
        other.splits([SplitAsk(0, Candidate(1.0, 0, 3, True))])
    # A tree's gradients come once, numbered upwards: no second root for a tree already grown.
    with pytest.raises(RefusedError, match="increasing tree order"):
        party.new_tree(gh, 0)
    party.new_tree(gh, 1)
    assert party.histograms([HistogramAsk(0, np.arange(40))]) is not None


def test_a_partners_candidates_come_shuffled_per_node_and_the_first_of_a_tie_is_kept() -> None:
    from vflo.trees.growth import ShuffledSums
    rng = np.random.default_rng(1)
    X = rng.normal(size=(400, 3))
    X = np.c_[X, X[:, 1]]  # the last column repeats the second: every split of one ties with the other's
    g = np.where(X[:, 1] > 0, 100, -100) + rng.integers(-10, 10, 400)  # the best split is the second column's
    gh = np.stack([g, rng.integers(1, 100, 400)], axis=1)
    X[rng.random(400) < 0.1, 0] = np.nan  # the first column lacks some values: its right sums come too
    party = _party(X, seed=2)
    party.new_tree(gh, 0)
    root = _sums(party, HistogramAsk(0, np.arange(400)), gh, np.arange(400))
    assert isinstance(root, ShuffledSums)
    left, right = root.left, root.right
    assert party.order[0].size == len(left)
    natural_left, natural_right = _natural(party, gh, np.arange(400))
    assert not np.array_equal(left, natural_left)  # not in column order ...
    assert sorted(map(tuple, np.c_[left, right])) == sorted(map(tuple, np.c_[natural_left, natural_right]))
    found = best_split(root, gh.sum(axis=0), RULES)
    assert found is not None and len(found.ties) == 2 and (found.feature, found.bin) == (-1, -1)
    record, goes_left, _ = party.splits([SplitAsk(0, found)])[0]
    assert party.table.column[record] == 1  # the first of the two in column order, as an unshuffled grower's
    for seed in range(6):  # whatever order the two tied candidates come in
        again = _party(X, seed=seed)
        again.new_tree(gh, 0)
        tied = best_split(_sums(again, HistogramAsk(0, np.arange(400)), gh, np.arange(400)), gh.sum(axis=0),
                          RULES)
        assert tied is not None and again.table.column[again.splits([SplitAsk(0, tied)])[0][0]] == 1
    rows = np.flatnonzero(goes_left), np.flatnonzero(~goes_left)
    children = party.histograms([HistogramAsk(1, rows[0], 0, 2), HistogramAsk(2, None, 0, 1)])
    assert set(children) == {1, 2}  # the subtracted child's sums too: the label holder cannot subtract them
    for node, members in ((1, rows[0]), (2, rows[1])):
        left, right, missing = children[node]
        got = ShuffledSums(left, right, missing).completed(gh[members].sum(axis=0))
        expected = _natural(party, gh, members)
        assert sorted(map(tuple, np.c_[got.left, got.right])) == sorted(map(tuple, np.c_[expected[0], expected[1]]))
        assert 0 < int(missing.sum()) < len(missing)  # the right sums of the first column's candidates alone
    orders = [party.order[n] for n in (0, 1, 2)]
    assert all(not np.array_equal(o, np.sort(o)) for o in orders)
    assert not np.array_equal(np.argsort(orders[1]), np.argsort(orders[2]))  # ... a fresh order per node
    with pytest.raises(ProtocolError, match="not distinct positions"):
        party.splits([SplitAsk(1, Candidate(1.0, -1, -1, True, ties=((len(orders[1]), True),)))])


def _scores(data: object, *, party_seeds: dict[str, int] | None = None) -> tuple[np.ndarray, list[object]]:
    method = get_method("secureboost")(n_trees=4, max_depth=4, n_bins=16, min_node_rows=1, he={"scheme": "plaintext"})
    out = run_method(method, data, seed=0, party_seeds=party_seeds)
    return out.scores, [t.arrays() for t in method.trees_]


def test_shuffled_candidates_grow_the_trees_of_unshuffled_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever order the partners send their candidates in (their own secrets), the same trees, bit for bit."""
    together, _ = _blocks(n=700, seed=3)
    shuffled = _scores(together, party_seeds={"a": 1, "p1": 2, "p2": 3})
    reshuffled = _scores(together, party_seeds={"a": 1, "p1": 20, "p2": 30})
    monkeypatch.setattr(ColumnsParty, "_draw_order", staticmethod(lambda shuffle, n: np.arange(n)))
    natural = _scores(together, party_seeds={"a": 1, "p1": 2, "p2": 3})
    for other in (reshuffled, natural):
        assert np.array_equal(shuffled[0], other[0])
        assert all(np.array_equal(a[k], b[k]) for a, b in zip(shuffled[1], other[1], strict=True)
                   for k in a)


@dataclass
class Attack:
    """A label holder that speaks to partner p1 directly: the protocol's messages, in an order of its choosing."""

    fed: Coordinator
    nodes: dict[str, Node]
    rows: np.ndarray

    def send(self, kind: str, payload: dict[str, object]) -> object:
        return self.fed.exchange(kind, {"p1": payload})["p1"]

    def gradients(self, tree: int, gh: np.ndarray) -> None:
        keys = new_keys(HESettings(scheme="plaintext"))
        self.send("sb.gradients", {"tree": tree, "gh": to_wire(keys.dump(keys.encrypt(gh)))})

    def root(self, tree: int) -> int:
        """The root's sums; how many candidates came."""
        reply = self.send("sb.histograms", {"tree": tree, **_pack_asks([HistogramAsk(0, np.arange(len(self.rows)))])})
        sizes = np.frombuffer(bytes(np.asarray(reply.array("sums")).ravel()[8:24]), dtype=np.int64)
        return int(sizes[0]) // 16

    def split(self, tree: int, node: int, choice: int) -> np.ndarray:
        reply = self.send("sb.splits", {"tree": tree, "nodes": np.array([node]), "ties": np.array([1]),
                                        "choices": np.array([choice]), "default_left": np.array([True])})
        return np.asarray(reply.array("left"))

    def table(self) -> int:
        part = self.nodes["p1"].context.part(BoostPart)
        table = part.training.table if part.training is not None else part.table
        assert table is not None
        return len(table)


@pytest.fixture
def attack() -> Iterator[Attack]:
    together, _ = _blocks(n=700)
    method = get_method("secureboost")(n_trees=2, max_depth=2, n_bins=8, he={"scheme": "plaintext"})
    fed, nodes = build_federation(together, method, seed=0)
    Session(fed).start(method)
    ids = fed.data.ids
    rows = ids[fed.align(ids, ["p1"]).holding("p1", ids)]
    keys = new_keys(HESettings(scheme="plaintext"))
    fed.exchange("sb.init", {"p1": {"train_ids": rows, "scheme": "plaintext",
                                    "public_key": np.frombuffer(keys.public_key, dtype=np.uint8)}})
    yield Attack(fed, nodes, rows)


def test_the_repeated_root_attack_is_refused_and_leaves_one_split_to_score_with(attack: Attack) -> None:
    """The measured attack asked the root's split at every candidate (775 times) and read each person's bin in
    every column, then in every serving person's answers: now the first answer is the only one."""
    gh = np.ones((len(attack.rows), 2), dtype=np.int64)  # honest-looking statistics
    attack.gradients(0, gh)
    candidates = attack.root(0)
    assert candidates > 10
    first = attack.split(0, 0, 0)
    assert len(first) == len(attack.rows)
    for choice in range(1, candidates):
        with pytest.raises(RemoteError, match="RefusedError: split of node 0 asked again"):
            attack.split(0, 0, choice)
    with pytest.raises(RemoteError, match="RefusedError: .*tree 0 has its root|already summed"):
        attack.root(0)
    with pytest.raises(RemoteError, match="increasing tree order"):  # the same tree again, to ask its root anew
        attack.gradients(0, gh)
    with pytest.raises(RemoteError, match="no such node"):
        attack.split(0, 5, 0)
    assert attack.table() == 1
    attack.send("sb.finish", {})
    ids = np.intersect1d(attack.nodes["p1"].context.rows("serve").ids, attack.fed.serving.ids)
    decided = attack.send("sb.decide", {"ids": ids, "purpose": "serve"})
    assert np.asarray(decided.array("left")).shape == (len(ids), 1)


def test_after_training_a_partners_table_holds_the_splits_of_the_trees_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """A label holder that asks every split twice during a real training: the second asks are refused, the run
    completes, and each partner's table (which scoring answers from) holds the trees' splits and no other."""
    from vflo.methods import secureboost

    refused: list[str] = []
    honest = secureboost._Federated.splits

    def twice(self: secureboost._Federated, asks: dict[int, list[SplitAsk]]) -> object:
        out = honest(self, asks)
        try:
            honest(self, {k: v for k, v in asks.items() if k > 0})
        except RemoteError as exc:
            refused.append(str(exc))
        return out

    monkeypatch.setattr(secureboost._Federated, "splits", twice)
    together, _ = _blocks(n=700)
    method = get_method("secureboost")(n_trees=3, max_depth=3, n_bins=8, he={"scheme": "plaintext"})
    fed, nodes = build_federation(together, method, seed=0)
    session = Session(fed)
    session.start(method)
    session.train(method.fit)
    assert refused and all("asked again" in r for r in refused)
    for k, p in enumerate(method.passives_, start=1):
        table = nodes[p].context.part(BoostPart).table
        assert table is not None
        assert len(table) == sum(owner == k for t in method.trees_ for owner in t.owner) > 0
    assert method.predict(fed, together.test_ids).shape == (len(together.test_ids), 2)
