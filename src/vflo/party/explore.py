"""A partner's side of ``vflo explore``: per column of its own, how many of the shared people fall in each of its
own bins and, under the label holder's homomorphic encryption, the sums of their targets per bin.

The label holder sends its targets (of the people they share, or, by default, of every person it holds, the shared
ones found here from blinded IDs: see below) encrypted under its own key (HEU's OU or Paillier, two targets packed
per ciphertext, as SecureBoost packs a gradient and a hessian). This party cuts each of its columns into bins of
its own (equal-frequency, at most ``[policy] explore_bins``; adjacent bins merged until each holds at least
``[policy] min_bin_rows`` people; the people missing a value are a bin of their own, or withheld from the sums
where fewer than that), sums the ciphertexts per bin, and replies with the sums, each bin's people count and each
column's missing share and distinct values. It learns nothing of the targets (ciphertexts only); the label holder
learns, per bin, how many people and how many events, in the bins' order, never a threshold nor who is in which
bin. A party answers only where its policy says ``explore = true``, and each peer only ``explore_answers`` times
while it runs.

Who is shared: by default (``[policy] explore_shared = "count"``) the label holder learns only how many people it
shares with this party, never which: this party finds them from blinded IDs (:mod:`vflo.align.blind_join`), and
learns who itself. With ``explore_shared = "ids"`` it also answers over people the label holder names
(``explore.sums``), after the deployment's own alignment, which shows both of them who is shared.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from vflo.comm.message import IDS, STR, ArraySpec, Fields, Payload
from vflo.errors import ProtocolError
from vflo.party.handlers import Content, HandlerSet, handles
from vflo.party.policy import Policy, PolicyError
from vflo.trees.bins import MAX_BINS, bin_codes, quantile_cuts
from vflo.trees.crypto import BLOB_ROW, PublicSide, from_wire, to_wire

if TYPE_CHECKING:
    from vflo.party.context import NodeContext

KIND = "explore.sums"
POINTS_KIND = "explore.points"
BLIND_KIND = "explore.blind_sums"
SELECT_KIND = "explore.select"
BLOB = ArraySpec(("uint8",), (None, BLOB_ROW))
INTS = ArraySpec(("int64",), (None,))
PUBLIC_KEY = ArraySpec(("uint8",), (None,))
SUMS_REPLY: dict[str, Content] = {"columns": "control", "bins": "control", "counts": "control",
                                  "missing": "control", "gaps": "control", "distinct": "control",
                                  "sums": "ciphertexts"}


def own_bins(column: np.ndarray, n_bins: int, min_rows: int) -> tuple[np.ndarray, int, bool]:
    """A column's bin per person: equal-frequency bins of its present values (at most ``n_bins``), adjacent ones
    merged, the smallest with its smaller neighbour first, until each holds ``min_rows`` people or one is left;
    then the missing values' bin, or, where fewer than ``min_rows`` people miss a value, ``-1`` (withheld).
    Returns the codes, the number of value bins, and whether the missing bin is reported."""
    codes = bin_codes(column.reshape(-1, 1), [quantile_cuts(column, n_bins)], n_bins)[:, 0].astype(np.int64)
    present = codes < n_bins
    counts = np.bincount(codes[present], minlength=n_bins)
    groups = [[b] for b in range(n_bins) if counts[b] > 0]
    sizes = [int(counts[g[0]]) for g in groups]
    while len(groups) > 1 and min(sizes) < min_rows:
        i = int(np.argmin(sizes))
        j = i - 1 if i == len(groups) - 1 or (i > 0 and sizes[i - 1] <= sizes[i + 1]) else i + 1
        lo, hi = min(i, j), max(i, j)
        groups[lo] += groups.pop(hi)
        sizes[lo] += sizes.pop(hi)
    new = np.full(n_bins + 1, -1, dtype=np.int64)
    for g, members in enumerate(groups):
        new[members] = g
    missing = int((~present).sum())
    reported = missing >= min_rows
    new[n_bins] = len(groups) if reported else -1
    return new[codes], len(groups), reported


class ExploreHandlers(HandlerSet):
    """What every node serves for ``vflo explore``, refused unless its policy says ``explore = true``."""

    @handles(SELECT_KIND,
             served=("outside a run, after this party answered the sender's explore.sums or explore.blind_sums: its "
                     "columns' information values and missing shares, from which its own [policy] select_iv_below and "
                     "select_missing_above decide which of its columns it drops; the node drops them"),
             carries={}, replies={"dropped": "control"},
             columns=ArraySpec(("str",), (None,)), iv=ArraySpec(("float64",), (None,)),
             missing=ArraySpec(("float64",), (None,)))
    def _select(self, ctx: NodeContext, payload: Fields) -> Payload:
        data = ctx.require_data()
        names = tuple(str(c) for c in payload.array("columns"))
        iv, missing = payload.array("iv"), payload.array("missing")
        if names != data.columns or len(iv) != len(names) or len(missing) != len(names):
            raise ProtocolError(f"{SELECT_KIND}: one information value and one missing share for each of party "
                                f"{ctx.info.name!r}'s columns, in its order ({len(data.columns)} of them)")
        if ctx.tally.count(KIND, ctx.sender) == 0:
            raise PolicyError(f"{SELECT_KIND}: party {ctx.info.name!r} has answered no vflo explore from "
                              f"{ctx.sender!r}; the information values come after its per-bin sums")
        return {"dropped": np.asarray(selected_out(ctx.policy, names, iv, missing), dtype=str)}

    @handles(KIND,
             served=("before or after a run, where [policy] explore = true and explore_shared = \"ids\": once per "
                     "request, over the people the request names (which this party must hold), bins of its own of at "
                     "least min_bin_rows people"),
             carries={"ids": "ids", "labels": "ciphertexts"}, replies=SUMS_REPLY,
             ids=IDS, scheme=STR, public_key=PUBLIC_KEY, labels=BLOB)
    def _sums(self, ctx: NodeContext, payload: Fields) -> Payload:
        policy = answering(ctx)
        if policy.explore_shared != "ids":
            raise PolicyError(f"party {ctx.info.name!r} does not answer vflo explore over people named to it: its "
                              "policy lets the label holder learn only how many people they share "
                              "(explore_shared = \"count\"); explore with the count only (vflo explore's default, "
                              "--shared count), or set explore_shared = \"ids\" under [policy] in its config")
        take_answer(ctx)
        data = ctx.require_data()
        ids = payload.array("ids")
        if not data.contains(ids).all():
            raise ProtocolError(f"{KIND}: {int((~data.contains(ids)).sum())} of the {len(ids)} people named are "
                                f"not among party {ctx.info.name!r}'s rows: name the people the alignment found")
        ops, labels = encrypted_labels(payload, len(ids), KIND)
        return binned(ctx, np.asarray(data.subset(ids).X, dtype=np.float64), ops, labels, np.arange(len(ids)),
                      len(ids))


def answering(ctx: NodeContext) -> Policy:
    """The party's policy, where it answers this peer's vflo explore at all (explore on, answers left)."""
    policy = ctx.policy
    if not policy.explore:
        raise PolicyError(f"party {ctx.info.name!r} does not answer vflo explore: its policy leaves explore off; "
                          "set explore = true under [policy] in its config to let the label holder learn, per "
                          "bin of its columns, how many shared people and how many events")
    if ctx.tally.count(KIND, ctx.sender) >= policy.explore_answers:
        spent(ctx)
    return policy


def take_answer(ctx: NodeContext) -> None:
    if not ctx.tally.take(KIND, ctx.sender, ctx.policy.explore_answers):
        spent(ctx)


def spent(ctx: NodeContext) -> None:
    policy = ctx.policy
    raise PolicyError(f"party {ctx.info.name!r} has answered {ctx.sender!r}'s vflo explore "
                          f"{policy.explore_answers} time(s) while it runs, as many as its policy allows "
                          f"(explore_answers = {policy.explore_answers}: two answers over people that differ by "
                          "one would show which of its bins that person is in); raise it under [policy] to "
                          "answer again")


def encrypted_labels(payload: Fields, rows: int, kind: str) -> tuple[PublicSide, list[Any]]:
    """The label holder's public side and its encrypted targets, each ``rows`` long."""
    ops = PublicSide(payload.text("scheme"), payload.array("public_key").tobytes())
    try:
        labels = [ops.load(b) for b in unpack(from_wire(payload.array("labels")))]
    except ValueError as exc:
        raise ProtocolError(f"{kind}: the encrypted labels do not load: {exc}") from exc
    if not labels:
        raise ProtocolError(f"{kind}: no encrypted labels")
    for h in labels:
        got = h.shape[0] if hasattr(h, "shape") else len(h)
        if got != rows:
            raise ProtocolError(f"{kind}: {got} encrypted rows for {rows} people")
    return ops, labels


def binned(ctx: NodeContext, X: np.ndarray, ops: PublicSide, labels: list[Any], rows: np.ndarray,
           items: int) -> Payload:
    """The reply to an explore request: ``X`` the shared people's values, one row per entry of ``rows`` (their
    places among the ``items`` encrypted targets); per column its own bins over them, each bin's people and, per blob of
    targets, the encrypted sums of those in it."""
    policy, data = ctx.policy, ctx.require_data()
    n_bins = min(policy.explore_bins, MAX_BINS)
    columns = X.shape[1]
    codes = np.empty(X.shape, dtype=np.int8)  # a byte a value: at most 126 bins, the missing and the withheld
    bins = np.empty(columns, dtype=np.int64)
    missing = np.empty(columns, dtype=np.int64)
    for j in range(columns):
        codes[:, j], bins[j], reported = own_bins(X[:, j], n_bins, policy.min_bin_rows)
        nans = int(np.isnan(X[:, j]).sum())
        missing[j] = nans if reported else -nans
    # One layout for every column: its reported bins first, withheld people in the last bucket.
    buckets = int(bins.max() + 2) if columns else 2
    codes[codes < 0] = buckets - 1
    keep = np.concatenate([j * buckets + np.arange(bins[j] + (1 if missing[j] > 0 else 0))
                           for j in range(columns)]) if columns else np.zeros(0, dtype=np.int64)
    counts = np.concatenate([np.bincount(codes[:, j].astype(np.int64), minlength=buckets)
                             for j in range(columns)])[keep] if columns else np.zeros(0, dtype=np.int64)
    # Codes for every encrypted target, the shared people's in their places; only those are summed.
    every = np.full((items, columns), buckets - 1, dtype=np.int8)
    every[rows] = codes
    sums = [ops.dump(ops.rows(ops.bucket_sums(h, rows, every, buckets), keep)) for h in labels] if columns else []
    distinct = np.asarray([len(np.unique(X[~np.isnan(X[:, j]), j])) for j in range(columns)], dtype=np.int64)
    return {"columns": np.asarray(data.columns, dtype=str), "bins": bins, "counts": counts.astype(np.int64),
            "missing": missing, "gaps": gaps(data.columns, X, getattr(data.encoding, "fills", {})),
            "distinct": distinct, "sums": to_wire(pack(sums))}


def selected_out(policy: Policy, columns: tuple[str, ...], iv: np.ndarray, missing: np.ndarray) -> list[str]:
    """The columns a party drops by its own policy: under ``select_iv_below`` or missing for more than
    ``select_missing_above`` of the shared people (a share not known never drops a column); never every column,
    its best one kept."""
    out = [c for c, v, m in zip(columns, iv.tolist(), missing.tolist(), strict=True)
           if v < policy.select_iv_below or (not math.isnan(m) and m > policy.select_missing_above)]
    if len(out) == len(columns) and columns:
        out.remove(columns[int(np.argmax(iv))])
    return out


def gaps(columns: tuple[str, ...], X: np.ndarray, fills: object) -> np.ndarray:
    """Per column, how many of the rows had no value in the party's file: its ``NAME=missing`` indicator's count
    (``missing_indicator = true``), or its NaNs where it filled none; -1 where the party filled its gaps
    (``impute``) without an indicator, so that how many it filled is not known here."""
    out = np.zeros(len(columns), dtype=np.int64)
    filled = set(fills) if isinstance(fills, dict) else set()
    for j, name in enumerate(columns):
        flag = f"{name}=missing"
        if flag in columns:
            out[j] = int(X[:, columns.index(flag)].sum())
        elif name in filled:
            out[j] = -1
        else:
            out[j] = int(np.isnan(X[:, j]).sum())
    return out


def pack(blobs: list[bytes]) -> bytes:
    """Blobs as one: their count and each one's length (int64), then the blobs."""
    head = np.asarray([len(blobs), *(len(b) for b in blobs)], dtype=np.int64).tobytes()
    return head + b"".join(blobs)


def unpack(blob: bytes) -> list[bytes]:
    """The blobs :func:`pack` put together; a head that does not fit the blob is refused."""
    if len(blob) < 8:
        raise ProtocolError("explore: a packed blob shorter than its count")
    n = int.from_bytes(blob[:8], "little")
    head = 8 * (n + 1)
    if n < 0 or head > len(blob):
        raise ProtocolError(f"explore: a packed blob says {n} parts but is {len(blob)} bytes")
    sizes = np.frombuffer(blob[8:head], dtype=np.int64)
    if np.any(sizes < 0) or head + int(sizes.sum()) != len(blob):
        raise ProtocolError("explore: a packed blob's lengths do not add up to it")
    ends = head + np.cumsum(sizes)
    return [blob[int(e - s):int(e)] for s, e in zip(sizes, ends, strict=True)]
