"""Run a method once, capture every message, and run every attack that applies to what each party received.

The utility of the run (its test metric and ε where a defence is on) and every attack's success come out of
one call, so a privacy–utility curve is one loop over defence levels (benchmarks/privacy/).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from vflo.comm.message import Message
from vflo.data.scenario import FederatedData
from vflo.errors import ConfigError
from vflo.federation.simulation import build_federation
from vflo.methods.base import Method
from vflo.metrics import compute_metrics
from vflo.privacy.identity import exposure
from vflo.privacy.label_inference import gradient_attacks, model_completion
from vflo.privacy.reconstruction import decode
from vflo.privacy.views import gradients_received, ids_received, representations_received


def attack_run(method: Method, data: FederatedData, *, seed: int, known: Sequence[float] = (0.0, 0.01, 0.05, 0.1),
               completion: Sequence[int] = (10, 40, 100), decoders: Sequence[str] = ("ridge", "mlp"),
               max_rows: int = 4000) -> dict[str, Any]:
    """The run's metrics and stats, and the success of every applicable attack (nested by attack)."""
    seen: list[Message] = []
    method.check_task(data.task)
    fed, _ = build_federation(data, method, seed=seed, observers=(seen.append,))
    fed.setup(method)
    method.fit(fed)
    fed.flush()
    scores = method.predict(fed, data.test_ids)
    out: dict[str, Any] = {"metrics": compute_metrics(data.task, data.test_y, scores),
                           "stats": method.summary_stats(), "messages": len(seen)}
    rng = np.random.default_rng(seed)
    active = data.active
    y_active = data.train[active].y
    labels_of = dict(zip(data.train[active].ids.tolist(), (y_active.tolist() if y_active is not None else []),
                         strict=True))
    out["labels"] = _label_attacks(seen, data, labels_of, completion, rng)
    out["features"] = _feature_attacks(seen, data, known, decoders, rng, max_rows)
    out["identity"] = _identity(seen, data)
    fed.teardown()
    return out


def _label_attacks(seen: list[Message], data: FederatedData, labels_of: dict[object, int],
                   completion: Sequence[int], rng: np.random.Generator) -> dict[str, Any]:
    if data.task != "binary":
        return {}

    out: dict[str, Any] = {}
    for party in (p.name for p in data.parties if p.role == "passive"):
        try:
            ids, grads = gradients_received(seen, party)
        except ConfigError:
            continue
        known = np.asarray([i in labels_of for i in ids.tolist()], dtype=bool)
        result: dict[str, Any] = gradient_attacks(ids[known], grads[known], labels_of, rng=rng)
        # Model completion: a head on the passive party's own bottom-model outputs (the first activations it
        # sent for each person it shares with the active party, which it computed itself).
        own = [r for r in representations_received(seen, data.active) if r.sender == party]
        if own:
            rows = own[0]
            keep = np.asarray([i in labels_of for i in rows.ids.tolist()])
            labels = np.asarray([labels_of[i] for i in rows.ids[keep].tolist()])
            raw = data.train[party].subset(rows.ids[keep]).X  # what it could do with its own features alone
            for k in completion:
                if k + 20 <= len(labels):  # enough other rows to measure on
                    result[f"completion_{k}"] = model_completion(rows.values[keep], labels, known=k,
                                                                 rng=np.random.default_rng(k))
                    result[f"completion_raw_{k}"] = model_completion(raw, labels, known=k,
                                                                     rng=np.random.default_rng(k))
            result["majority"] = float(max(np.mean(labels), 1 - np.mean(labels)))
        out[party] = result
    return out


def _feature_attacks(seen: list[Message], data: FederatedData, known: Sequence[float], decoders: Sequence[str],
                     rng: np.random.Generator, max_rows: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    holders = {p.name for p in data.parties if p.holds_data and data.train[p.name].n_features}
    for receiver in sorted({m.receiver for m in seen}):
        aligned = _aligned_at(seen, data, receiver)
        for rows in representations_received(seen, receiver, aligned=aligned):
            # A server's reply (the SVD's U Σ) is about every other data party's columns.
            targets = [rows.sender] if rows.sender in holders else sorted(holders - {receiver})
            for target in targets:
                table = data.train[target]
                keep = table.contains(rows.ids)
                if keep.sum() < 20:
                    continue
                ids, values = rows.ids[keep][:max_rows], rows.values[keep][:max_rows]
                X = table.subset(ids).X
                key = f"{receiver} <- {rows.sender}" + (f" (about {target})" if target != rows.sender else "")
                out[key] = {f"{decoder}@{share:g}": decode(values, X, known=share, decoder=decoder, rng=rng)
                            for share in known for decoder in (decoders if share > 0 else ("mean",))}
                own = data.train.get(receiver)
                if own is not None and own.n_features and own.contains(ids).all():
                    # What the receiver could infer from its own features alone, with the same known rows: the
                    # part of the success that needs no message at all (correlated columns).
                    mine = own.subset(ids).X
                    for share in (s for s in known if s > 0):
                        out[key][f"own features@{share:g}"] = decode(mine, X, known=share, decoder="ridge",
                                                                     rng=np.random.default_rng(int(share * 1000)))
                if receiver == "server" and _sent_kind(seen, rows.sender) == "rap.project":
                    # RAP's own server attacks (Zhang et al., Section 3) on the same rows: relative error.
                    from vflo.privacy.attacks import known_means, no_knowledge

                    out[key]["rap_no_knowledge"] = {"relative_error": no_knowledge(values, X, rng)}
                    out[key]["rap_known_means"] = {"relative_error": known_means(values, X)}
    return out


def _sent_kind(seen: list[Message], sender: str) -> str:
    """The kind of the representation ``sender`` sent (its first reply carrying rows)."""
    return next((m.kind for m in seen if m.sender == sender and m.kind in ("rap.project", "apc.encode_aligned",
                                                                         "splitnn.forward", "ea.forward")), "")


def _aligned_at(seen: list[Message], data: FederatedData, party: str) -> np.ndarray | None:
    """The sorted IDs ``party`` aligned on (as its own alignment answers told it), where it aligned."""
    from vflo.privacy.views import exchanges

    for request, reply in exchanges(seen):
        if request.sender == party and request.kind == "align.plain" and reply is not None and reply.error is None:
            asked = np.asarray(request.payload["ids"])
            held = np.asarray(reply.payload["held"], dtype=bool)
            ids = asked[held]
            # With several partners the party keeps the IDs every one holds.
            for other_request, other_reply in exchanges(seen):
                if other_request.sender == party and other_request.kind == "align.plain" and \
                        other_reply is not None and other_reply.error is None and other_request is not request:
                    other = np.asarray(other_request.payload["ids"])[np.asarray(other_reply.payload["held"])]
                    ids = np.intersect1d(ids, other)
            return np.sort(ids)
    if party == "server":  # RAP's server: the label owner's aligned order, which rap.train's selectors follow
        for m in seen:
            if m.kind == "rap.train" and m.receiver == party:
                return _rap_aligned(data)
    return None


def _rap_aligned(data: FederatedData) -> np.ndarray:
    ids = data.train[data.active].ids
    for p in data.parties:
        if p.role == "passive":
            ids = ids[data.train[p.name].contains(ids)]
    return np.sort(ids)


def _identity(seen: list[Message], data: FederatedData) -> dict[str, Any]:
    out: dict[str, Any] = {}
    people = {p: np.union1d(data.train[p].ids, data.serve[p].ids) for p in data.train}
    for receiver, own in people.items():
        for sender, ids in ids_received(seen, receiver).items():
            if sender in people:
                out[f"{receiver} <- {sender}"] = exposure(ids, own, people[sender])
    return out
