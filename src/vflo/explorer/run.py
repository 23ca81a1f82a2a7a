"""``vflo explore``: before training, what each partner's columns say about the label holder's label, computed
privately: per column its missing share, distinct values, and the weight of evidence of each of the partner's own
bins with the column's information value (:mod:`vflo.explorer.woe`), from per-bin sums of the label holder's
encrypted targets that the partner computes (:mod:`vflo.party.explore`), as FATE's hetero feature binning and
SecretFlow's vertical WOE binning do. Who is shared: by default (``shared = "count"``) the label holder learns
only how many people it shares with each partner, the partner matching blinded IDs (:mod:`vflo.party.explore`);
with ``shared = "ids"`` (where the partner's policy allows it) the run's own alignment finds them (PSI when
deployed), and both sides learn who.

One code path: :func:`explore_with` drives it from the label holder over an :class:`~vflo.federation.coordinator.
Aligner`, in one process (:func:`explore`, every party a node of its own) or deployed (``vflo explore --deploy``).
"""

from __future__ import annotations

import logging
import math
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import pandas as pd

from vflo.align.engines import AlignmentConfig
from vflo.align.psi import Blinder, blind, new_key, shuffled
from vflo.comm.local import LocalTransport
from vflo.comm.message import Reply
from vflo.data.datasets import infer_task
from vflo.data.partydata import PartyData
from vflo.errors import ConfigError, DataError
from vflo.explorer.woe import Targets, chi_merge, merged, targets, woe_iv
from vflo.federation.coordinator import Aligner
from vflo.federation.simulation import party_node
from vflo.party.explore import BLIND_KIND, KIND, POINTS_KIND, SELECT_KIND, pack, unpack
from vflo.party.policy import Policy
from vflo.roles import PartyInfo
from vflo.trees.crypto import HESettings, KeyPair, Scheme, from_wire, new_keys, to_wire

logger = logging.getLogger(__name__)

Binning = Literal["quantile", "chimerge"]
Shared = Literal["count", "ids"]


@dataclass(frozen=True)
class Column:
    """One partner column: its share of the shared people missing a value in the partner's file (NaN where the
    partner filled its gaps without a missing indicator, so it is not known), its distinct values, and per bin
    (the partner's own, in its order; the missing values' bin last where reported) the people and, per target,
    the events, WOE and the column's IV."""

    party: str
    name: str
    missing_share: float
    distinct: int
    counts: np.ndarray
    events: np.ndarray  # bins x targets
    woe: np.ndarray  # bins x targets
    iv: np.ndarray  # per target
    missing_bin: bool
    withheld: int  # people missing a value whose bin was too small to release

    @property
    def best_iv(self) -> float:
        return float(np.max(self.iv)) if len(self.iv) else 0.0

    @property
    def guessed(self) -> tuple[float, float]:
        """What the label holder can make of a person's bin from what it got, as a guess it can score itself: the
        share of the shared people whose bin it guesses right knowing their label (the bin with most people of
        that label; first target) against knowing only the bins' sizes (the largest bin)."""
        total = float(self.counts.sum())
        if total == 0:
            return math.nan, math.nan
        events = self.events[:, 0].astype(float)
        with_label = (events.max() + (self.counts - events).max()) / total
        return float(with_label), float(self.counts.max() / total)


@dataclass
class Exploration:
    """What ``vflo explore`` found: per partner, the people shared and each column's statistics."""

    active: str
    task: str
    targets: tuple[str, ...]
    binning: str
    scheme: str
    shared: dict[str, int]
    asked: int
    columns: list[Column] = field(default_factory=list)
    seconds: float = 0.0
    alignment: str = ""
    #: With ``select``: the columns each partner dropped by its own policy (names; nothing else said of them).
    dropped: dict[str, list[str]] = field(default_factory=dict)
    #: What the label holder learnt of who is shared: "count" (how many alone) or "ids" (who).
    shared_as: str = "count"

    def table(self) -> pd.DataFrame:
        """One row per partner column, each partner's columns ranked by information value (the largest over the
        targets)."""
        rows = []
        for c in self.columns:
            guess, sizes = c.guessed
            row = {"party": c.party, "column": c.name, "missing_share": c.missing_share, "distinct": c.distinct,
                   "bins": len(c.counts), "iv": c.best_iv, "bin_guessed": guess, "bin_guessed_by_size": sizes}
            if len(self.targets) > 1:
                row |= {f"iv[{t}]": float(v) for t, v in zip(self.targets, c.iv, strict=True)}
            rows.append(row)
        frame = pd.DataFrame(rows)
        if frame.empty:
            return frame
        frame = frame.sort_values(["party", "iv"], ascending=[True, False], kind="stable").reset_index(drop=True)
        frame.insert(2, "rank", frame.groupby("party").cumcount() + 1)
        return frame


def explore_with(fed: Aligner, data: PartyData, *, task: str | None = None, classes: tuple[str, ...] = (),
                 he: HESettings | None = None, binning: Binning = "quantile", max_bins: int = 6,
                 select: bool = False, shared: Shared = "count") -> Exploration:
    """The label holder's side: send each partner the targets encrypted under a fresh key of its own (of every
    person it holds, each partner finding the ones it shares by blinded IDs, with ``shared = "count"``; of the
    people the alignment finds, with ``"ids"``), decrypt the per-bin sums it returns, and compute WOE and IV
    (``binning = "chimerge"``:
    the partner's bins merged here, by χ² on their decrypted counts, to at most ``max_bins``; binary and
    regression tasks). With ``select``, each partner is then sent its own columns' IV and missing share, and drops
    those its own policy selects out (``explore.select``), from its rows and the models it trains after."""
    started = time.perf_counter()
    y = data.require_labels()
    task = task or infer_task(y)
    wanted = targets(y, task, classes)
    if binning not in ("quantile", "chimerge"):
        raise ConfigError(f"explore: binning is 'quantile' or 'chimerge', got {binning!r}")
    if binning == "chimerge" and wanted.values.shape[1] != 1:
        raise ConfigError("explore: chi-merge merges bins by one target; a multiclass label has one per class: "
                          "use binning = 'quantile'")
    if shared not in ("count", "ids"):
        raise ConfigError(f"explore: shared is 'count' (the label holder learns how many people it shares with "
                          f"each partner) or 'ids' (who, by the run's alignment), got {shared!r}")
    passives = fed.names("passive")
    if not passives:
        raise ConfigError("explore: no partner to explore; a partner is a party with role 'passive'")
    he = he or HESettings()
    keys = new_keys(he)  # the label holder's own, from the OS: never from anything another party knows
    try:
        if shared == "ids":
            replies, counts = _over_ids(fed, data, passives, keys, wanted, he)
            how = fed.alignment_engine or fed.alignment.method
        else:
            replies, counts = _over_blinded(fed, data, passives, keys, wanted, he)
            how = "blinded IDs (vflo's ECDH), the count only"
        found = Exploration(active=data.party, task=task, targets=wanted.names, binning=binning, scheme=he.scheme,
                            shared=counts, asked=len(data.ids), alignment=how, shared_as=shared)
        for name in passives:
            found.columns += _columns(name, replies[name], keys, wanted, counts[name], binning, max_bins)
    finally:
        keys.close()
    if select:
        asks = {name: {"columns": np.asarray([c.name for c in found.columns if c.party == name], dtype=str),
                       "iv": np.asarray([c.best_iv for c in found.columns if c.party == name], dtype=np.float64),
                       "missing": np.asarray([c.missing_share for c in found.columns if c.party == name],
                                             dtype=np.float64)} for name in passives}
        answers = fed.exchange(SELECT_KIND, asks)
        found.dropped = {name: [str(c) for c in np.asarray(answers[name]["dropped"])] for name in passives}
    found.seconds = time.perf_counter() - started
    return found


def _over_ids(fed: Aligner, data: PartyData, passives: list[str], keys: KeyPair, wanted: Targets,
              he: HESettings) -> tuple[dict[str, Reply], dict[str, int]]:
    """Each partner's per-bin sums over the people the run's alignment finds it shares (both sides learn who)."""
    payloads, counts = {}, {}
    for name in passives:
        ids = fed.align(data.ids, [name]).ids
        if len(ids) == 0:
            raise DataError(f"explore: the label holder {data.party!r} shares no one with {name!r}")
        counts[name] = len(ids)
        payloads[name] = {"ids": ids, "scheme": he.scheme, "public_key": _public(keys),
                          "labels": to_wire(pack(_encrypted(keys, wanted.values[data.positions(ids)])))}
    return fed.exchange(KIND, payloads), counts


def _over_blinded(fed: Aligner, data: PartyData, passives: list[str], keys: KeyPair, wanted: Targets,
                  he: HESettings) -> tuple[dict[str, Reply], dict[str, int]]:
    """Each partner's per-bin sums over the people it shares, found by the partner from blinded IDs: every
    person this party holds goes, in a secret order of its own (the OS's), as H(x)^a with its encrypted targets;
    the partner's own points come back raised to a in the partner's order. Only how many matched comes back."""
    order = shuffled(len(data.ids))
    salt, key = secrets.token_bytes(32), new_key()
    with Blinder(key, size=len(order)) as blinder:  # hashed and blinded in one pass, as vflo's PSI does
        mine = blinder.ids(np.asarray(data.ids)[order], salt)()
    asked = {"salt": np.frombuffer(salt, dtype=np.uint8).copy(), "points": mine}
    theirs = fed.exchange(POINTS_KIND, dict.fromkeys(passives, asked))
    labels = to_wire(pack(_encrypted(keys, wanted.values[order])))  # one encryption, every partner
    payloads = {name: {"double": blind(theirs[name].array("points"), key), "scheme": he.scheme,
                       "public_key": _public(keys), "labels": labels} for name in passives}
    replies = fed.exchange(BLIND_KIND, payloads)
    counts = {name: int(replies[name].integer("shared")) for name in passives}
    for name, n in counts.items():
        if not 0 < n <= len(data.ids):
            raise DataError(f"explore: party {name!r} says it shares {n} of the {len(data.ids)} people "
                            f"{data.party!r} holds")
    return replies, counts


def _public(keys: KeyPair) -> np.ndarray:
    return np.frombuffer(keys.public_key, dtype=np.uint8).copy()


def _encrypted(keys: KeyPair, values: np.ndarray) -> list[bytes]:
    """The targets (rows x targets, 0/1) encrypted two to a ciphertext, as blobs."""
    out = []
    for k in range(0, values.shape[1], 2):
        pair = np.zeros((values.shape[0], 2), dtype=np.int64)
        pair[:, 0] = values[:, k]
        if k + 1 < values.shape[1]:
            pair[:, 1] = values[:, k + 1]
        out.append(keys.dump(keys.encrypt(pair)))
    return out


def _columns(party: str, reply: Reply, keys: KeyPair, wanted: Targets, shared: int, binning: str,
             max_bins: int) -> list[Column]:
    names = [str(v) for v in np.asarray(reply["columns"])]
    if not names:
        return []  # a partner with no columns of its own
    bins, counts = np.asarray(reply["bins"], dtype=np.int64), np.asarray(reply["counts"], dtype=np.int64)
    missing, distinct = np.asarray(reply["missing"], dtype=np.int64), np.asarray(reply["distinct"], dtype=np.int64)
    holes = np.asarray(reply["gaps"], dtype=np.int64)
    blobs = unpack(from_wire(np.asarray(reply["sums"])))
    sums = np.concatenate([keys.decrypt(keys.load(b)) for b in blobs], axis=1)[:, :wanted.values.shape[1]]
    sizes = bins + (missing > 0)
    if not (len(names) == len(bins) == len(missing) == len(distinct) == len(holes)) or int(sizes.sum()) != len(counts) \
            or len(sums) != len(counts):
        raise DataError(f"explore: party {party!r} sent per-bin sums that do not fit its columns and bins")
    if np.any(counts < 0) or np.any(sums < 0) or np.any(sums > counts[:, None]):
        raise DataError(f"explore: party {party!r} sent per-bin counts that its bins' event sums do not fit (a bin's "
                        "events lie between 0 and its people)")
    out, start = [], 0
    for j, name in enumerate(names):
        stop = start + int(sizes[j])
        n, e = counts[start:stop], sums[start:stop]
        start = stop
        if int(n.sum()) > shared:
            raise DataError(f"explore: party {party!r} counts {int(n.sum())} people in the bins of {name!r}, more "
                            f"than the {shared} it shares with the label holder")
        if binning == "chimerge" and bins[j] > max_bins:
            values = int(bins[j])
            groups = chi_merge(e[:values, 0], n[:values], max_bins)
            tail = np.arange(len(n) - values) + int(groups.max()) + 1  # the missing bin stays apart
            groups = np.concatenate([groups, tail])
            n, e = merged(n, groups), np.stack([merged(e[:, k], groups) for k in range(e.shape[1])], axis=1)
        woe, iv = zip(*(woe_iv(e[:, k], n) for k in range(e.shape[1])), strict=True)
        present = int(missing[j]) if missing[j] > 0 else 0
        gone = -int(missing[j]) if missing[j] < 0 else 0
        share = math.nan if holes[j] < 0 else int(holes[j]) / max(shared, 1)
        out.append(Column(party=party, name=name, missing_share=share,
                          distinct=int(distinct[j]), counts=n, events=e, woe=np.stack(woe, axis=1),
                          iv=np.asarray(iv), missing_bin=present > 0, withheld=gone))
    return out


def explore(parties: Sequence[PartyData], *, task: str | None = None, classes: tuple[str, ...] = (),
            bins: int = 10, min_bin_rows: int = 50, binning: Binning = "quantile", max_bins: int = 6,
            scheme: Scheme = "ou", key_size: int = 2048, select_iv_below: float = 0.0,
            select_missing_above: float = 1.0, shared: Shared = "count") -> Exploration:
    """``vflo.explore``: every party a node of its own in this process, behind the in-process transport, the one
    with labels exploring the others' columns as a deployment would (each partner answering with its policy's
    ``explore_bins = bins``, ``min_bin_rows`` and ``explore_shared = shared``); where a selection threshold is
    given, each partner then drops its columns as its policy's ``select_iv_below`` and ``select_missing_above``
    would (``Exploration.dropped``; :func:`kept` gives the parties' tables without them)."""
    labelled = [p for p in parties if p.has_labels]
    if len(labelled) != 1:
        raise ConfigError(f"explore: exactly one party holds the labels (the active party), found "
                          f"{[p.party for p in labelled] or 'none'}")
    active = labelled[0]
    infos = tuple(PartyInfo(p.party, "active" if p is active else "passive") for p in parties)
    policy = Policy(alignment="plain", explore=True, explore_bins=bins, min_bin_rows=min_bin_rows,  # fresh nodes
                    explore_shared=shared, select_iv_below=select_iv_below,
                    select_missing_above=select_missing_above)
    nodes = {info.name: party_node(info, p, peers=infos, policy=policy)
             for info, p in zip(infos, parties, strict=True)}
    transport = LocalTransport(nodes)
    fed = Aligner(node=nodes[active.party], transport=transport, parties=infos,
                  alignment=AlignmentConfig(method="plain"))
    return explore_with(fed, active, task=task, classes=classes, he=HESettings(scheme=scheme, key_size=key_size),
                        binning=binning, max_bins=max_bins, shared=shared,
                        select=select_iv_below > 0 or select_missing_above < 1)


def kept(parties: Sequence[PartyData], found: Exploration) -> list[PartyData]:
    """The parties' tables without the columns each dropped by its own selection (:func:`explore`'s)."""
    return [p.without(found.dropped.get(p.party, [])) for p in parties]
