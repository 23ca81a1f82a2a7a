"""Run a method once, capture every message, and run every attack that applies to what each party holds: what
it received, and what it sent itself (its own bottom model's outputs).

The utility of the run (its test metric and ε where a defence is on) and every attack's success come out of
one call, so a privacy–utility curve is one loop over defence levels (benchmarks/privacy/).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from vflo.align import plain
from vflo.comm.message import Message
from vflo.data.layout import FederatedData
from vflo.data.partydata import PartyData
from vflo.dp import PrivacyBudget
from vflo.errors import ConfigError, VfloError
from vflo.federation.session import Session
from vflo.federation.simulation import build_federation
from vflo.methods.base import Method
from vflo.metrics import compute_metrics
from vflo.party.port import Federation
from vflo.privacy.identity import exposure
from vflo.privacy.label_inference import gradient_attacks, instance_space_attack, model_completion
from vflo.privacy.reconstruction import decode, decode_each
from vflo.privacy.views import (
    activations_sent,
    exchanges,
    gradients_received,
    ids_received,
    instance_spaces_received,
    kinds_revealing,
    projected_rows,
    releases_received,
)


def attack_run(method: Method, data: FederatedData, *, seed: int, known: Sequence[float] = (0.0, 0.01, 0.05, 0.1),
               completion: Sequence[int] = (10, 40, 100), decoders: Sequence[str] = ("ridge", "mlp"),
               max_rows: int = 4000, serve_repeats: int = 1,
               budgets: Mapping[str, PrivacyBudget] | None = None) -> dict[str, Any]:
    """The run's metrics and stats, and the success of every applicable attack (nested by attack).

    ``serve_repeats``: how many times the test people are scored (the protocol lets the active party ask again);
    the metrics are those of the first, and every scoring release that crossed is an attacker's input.
    ``budgets``: parties' own privacy budgets (a protecting one calibrates its side at setup); each party's account
    at the end is in the stats (``epsilon_account_PARTY``) with what it covers (``account_scopes``)."""
    if serve_repeats < 1:
        raise ConfigError(f"serve_repeats must be at least 1 (the scoring the metrics come from), got {serve_repeats}")
    seen: list[Message] = []
    fed, _ = build_federation(data, method, seed=seed, observers=(seen.append,), budgets=budgets)
    session = Session(fed)
    session.start(method)
    session.train(method.fit)
    scores = method.predict(fed, data.test_ids)
    out: dict[str, Any] = {"metrics": compute_metrics(data.task, data.test_y, scores),
                           "stats": method.summary_stats(), "epsilon_scope": method.epsilon_scope()}
    out["serving"] = _score_again(method, fed, data, serve_repeats)
    fed.flush()
    out["messages"] = len(seen)
    started = time.perf_counter()
    rng = np.random.default_rng(seed)
    active = data.active
    y_active = data.train[active].y
    labels_of = dict(zip(data.train[active].ids.tolist(), (y_active.tolist() if y_active is not None else []),
                         strict=True))
    out["labels"] = label_attacks(seen, data, labels_of, completion, rng)
    out["features"] = feature_attacks(seen, data, known, decoders, rng, max_rows)
    out["identity"] = _identity(seen, data)
    out["attack_seconds"] = time.perf_counter() - started
    session.teardown()
    out["stats"] |= session.account_stats()
    out["account_scopes"] = session.account_scopes()
    out["party_settings"] = session.party_settings
    return out


def _score_again(method: Method, fed: Federation, data: FederatedData, repeats: int) -> dict[str, Any]:
    """Score the test people ``repeats`` times in all (the first already done); a party that refuses a release
    (its privacy budget spent) ends the repeats, and the refusal is recorded."""
    done: dict[str, Any] = {"asked": repeats, "answered": 1}
    for _ in range(repeats - 1):
        try:
            method.predict(fed, data.test_ids)
        except VfloError as exc:  # the defence at work: recorded, not a failed run
            done["refused"] = f"{type(exc).__name__}: {exc}"
            break
        done["answered"] += 1
    return done


def label_attacks(seen: list[Message], data: FederatedData, labels_of: dict[object, int],
                   completion: Sequence[int], rng: np.random.Generator) -> dict[str, Any]:
    """Label inference by each passive party, from what it holds: the gradients it received, and the outputs of
    its own bottom model, which it knows because it sent them; or, under SecureBoost, who shared a node."""
    if data.task != "binary":
        return {}

    out: dict[str, Any] = {}
    for party in (p.name for p in data.parties if p.role == "passive"):
        spaces = _instance_spaces(seen, party, labels_of, completion)
        if spaces:
            out[party] = spaces
        try:
            ids, grads = gradients_received(seen, party)
        except ConfigError:
            continue
        known = np.asarray([i in labels_of for i in ids.tolist()], dtype=bool)
        result: dict[str, Any] = gradient_attacks(ids[known], grads[known], labels_of, rng=rng)
        # Model completion (Fu et al.): a head on the passive party's own bottom-model outputs for each person it
        # shares with the active party. The party's final bottom is the last it trained: the last activations it
        # sent for each person (the sender knows what it sent; nothing of any other party is read). Beside it,
        # the first activations it sent (an untrained bottom) and its raw features (no protocol at all), on the
        # same people and, for each k, the same known labels.
        sent = activations_sent(seen, party, data.active)
        if sent is not None:
            final, first = sent.last(), sent.first()  # people in the same order
            keep = np.asarray([i in labels_of for i in final.ids.tolist()], dtype=bool)
            keep &= data.train[party].contains(final.ids)
            labels = np.asarray([labels_of[i] for i in final.ids[keep].tolist()])
            raw = data.train[party].subset(final.ids[keep]).X  # what it could do with its own features alone
            inputs = {"completion": final.values[keep], "completion_first": first.values[keep],
                      "completion_raw": raw}
            for k in completion:
                if k + 20 <= len(labels):  # enough other rows to measure on
                    for name, values in inputs.items():
                        result[f"{name}_{k}"] = model_completion(values, labels, known=k,
                                                                 rng=np.random.default_rng(k))
            result["completion_rows"] = len(labels)
            result["majority"] = float(max(np.mean(labels), 1 - np.mean(labels))) if len(labels) else math.nan
        out[party] = result
    return out


def _instance_spaces(seen: list[Message], party: str, labels_of: dict[object, int],
                     completion: Sequence[int]) -> dict[str, Any]:
    """The instance-space attack with k known labels (``completion``): from the first tree the party saw, and
    from every tree it saw."""
    try:
        ids, groups = instance_spaces_received(seen, party)
    except ConfigError:
        return {}
    keep = np.asarray([i in labels_of for i in ids.tolist()], dtype=bool)
    labels = np.asarray([labels_of[i] for i in ids[keep].tolist()])
    result: dict[str, Any] = {"instance_rows": int(keep.sum()), "instance_trees": int(groups.shape[1])}
    for k in completion:
        if k + 20 <= len(labels) and len(np.unique(labels)) == 2:
            result[f"instance_first_{k}"] = instance_space_attack(groups[keep, :1], labels, known=k,
                                                                  rng=np.random.default_rng(k))
            result[f"instance_all_{k}"] = instance_space_attack(groups[keep], labels, known=k,
                                                                rng=np.random.default_rng(k))
    return result


def feature_attacks(seen: list[Message], data: FederatedData, known: Sequence[float], decoders: Sequence[str],
                     rng: np.random.Generator, max_rows: int) -> dict[str, Any]:
    """Feature reconstruction by each receiver of rows of another party's data, per flow (sender and kind): from
    one release per person (the first), from all its releases averaged per person, and, on the same known rows
    with the same decoder, from the receiver's own features alone."""
    out: dict[str, Any] = {}
    holders = {p.name for p in data.parties if p.holds_data and data.train[p.name].n_features}
    for receiver in sorted({m.receiver for m in seen}):
        aligned = aligned_at(seen, data, receiver)
        for flow in releases_received(seen, receiver, aligned=aligned):
            rows, averaged, counts = flow.first(), flow.averaged(), flow.counts()
            # A server's reply (the SVD's U Σ) is about every other data party's columns.
            targets = [flow.sender] if flow.sender in holders else sorted(holders - {receiver})
            for target in targets:
                split, keep = _rows_of(data, target, rows.ids)
                if keep.sum() < 20:
                    continue
                ids = rows.ids[keep][:max_rows]
                inputs = {"message": rows.values[keep][:max_rows]}
                repeated = counts[keep][:max_rows]
                if repeated.max() > 1:
                    inputs["averaged"] = averaged.values[keep][:max_rows]
                X = split[target].subset(ids).X
                own = split.get(receiver)
                if own is not None and own.n_features and own.contains(ids).all():
                    inputs["own features"] = own.subset(ids).X
                key = f"{receiver} <- {flow.sender}" + (f" (about {target})" if target != flow.sender else "") + \
                    f": {flow.kind}"
                result: dict[str, Any] = {"flow": {"receiver": receiver, "sender": flow.sender, "target": target,
                                                   "kind": flow.kind, "people": len(ids),
                                                   "releases_mean": float(repeated.mean()),
                                                   "releases_max": int(repeated.max())}}
                for share in known:
                    if share == 0:
                        result["mean@0"] = decode(inputs["message"], X, known=0.0, decoder="mean", rng=rng)
                        continue
                    if round(share * len(ids)) < 2:  # a decoder needs more than one known row
                        continue
                    for decoder in decoders:
                        fits = decode_each(inputs, X, known=share, decoder=decoder, rng=rng)
                        for name, fit in fits.items():
                            prefix = "" if name == "message" else f"{name} "
                            result[f"{prefix}{decoder}@{share:g}"] = fit
                if projected_rows(flow.kind):
                    # The attacks on a secret projection (Zhang et al., RAP, Section 3) on the same rows: relative
                    # error.
                    from vflo.privacy.attacks import known_means, no_knowledge

                    result["rap_no_knowledge"] = {"relative_error": no_knowledge(inputs["message"], X, rng)}
                    result["rap_known_means"] = {"relative_error": known_means(inputs["message"], X)}
                out[key] = result
    return out


def _rows_of(data: FederatedData, target: str, ids: np.ndarray) -> tuple[Mapping[str, PartyData], np.ndarray]:
    """The split (training or serving rows) that holds most of ``ids`` for ``target``, and which ``ids`` it holds."""
    best: tuple[Mapping[str, PartyData], np.ndarray] = (data.train, data.train[target].contains(ids))
    serve = data.serve.get(target)
    if serve is not None:
        held = serve.contains(ids)
        if held.sum() > best[1].sum():
            best = (data.serve, held)
    return best


def aligned_at(seen: list[Message], data: FederatedData, party: str) -> np.ndarray | None:
    """The sorted IDs ``party`` aligned on (as its own alignment answers told it), where it aligned; for a party
    without data that was sent rows in an aligned order (a server), the order of the active party's alignment,
    which the selectors it is given follow."""
    for request, reply in exchanges(seen):
        if request.sender == party and request.kind == plain.KIND and reply is not None and reply.error is None:
            asked = np.asarray(request.payload["ids"])
            held = np.asarray(reply.payload["held"], dtype=bool)
            ids = asked[held]
            # With several partners the party keeps the IDs every one holds.
            for other_request, other_reply in exchanges(seen):
                if other_request.sender == party and other_request.kind == plain.KIND and \
                        other_reply is not None and other_reply.error is None and other_request is not request:
                    other = np.asarray(other_request.payload["ids"])[np.asarray(other_reply.payload["held"])]
                    ids = np.intersect1d(ids, other)
            return np.sort(ids)
    aligned_rows = kinds_revealing("aligned rows")
    if party not in data.train and any(m.kind in aligned_rows and m.receiver == party for m in seen):
        return _shared_order(data)
    return None


def _shared_order(data: FederatedData) -> np.ndarray:
    """The IDs the active party holds with every passive party, sorted: the order of its alignment."""
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
