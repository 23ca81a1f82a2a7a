"""One results row layout for every run, simulated or deployed: who ran, how it scored, what crossed, how long.

``vflo run`` (in process), ``vflo run --deploy`` (gRPC), a Flower deployment and ``vflo compare`` write the
same columns for the same things; a row adds only what its setting knows besides (a simulated run's variant
and layout facts, a deployed run's file sizes).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from vflo.comm.ledger import Ledger
from vflo.errors import VfloError
from vflo.federation.session import RunOutput
from vflo.methods.base import Method


def method_columns(label: str, cls: type[Method]) -> dict[str, Any]:
    """Which entry ran: its label in the config, the registered method and what its tags say of its scoring."""
    return {"method": label, "method_name": cls.name, "inference": cls.inference,
            "simulation_only": cls.simulation_only}


def traffic_columns(ledger: Ledger, fit_entries: int) -> dict[str, Any]:
    """What crossed, from the ledger of the messages that did: in all, in training and in scoring."""
    summary, fit = ledger.summary(), ledger.summary(0, fit_entries)
    return {
        "comm_bytes": summary.bytes, "comm_mb": summary.bytes / 1e6, "comm_messages": summary.messages,
        "comm_rounds": summary.rounds, "fit_bytes": fit.bytes, "fit_rounds": fit.rounds,
        "predict_bytes": summary.bytes - fit.bytes, "predict_rounds": summary.rounds - fit.rounds,
        "align_bytes": summary.align_bytes, "align_rounds": summary.align_rounds,
        "control_bytes": summary.control_bytes, "framing_bytes": summary.framing_bytes,
    }


def ok_row(label: str, method: Method, out: RunOutput, metrics: Mapping[str, float], *, wall: float,
           context: Mapping[str, Any]) -> dict[str, Any]:
    """A run that finished: ``context`` first (experiment, dataset, variant, repeat, sizes), then the method, its
    metrics, the traffic, the times, its own stats and what its ε columns cover."""
    row: dict[str, Any] = {"status": "ok", **context, **method_columns(label, type(method)), **metrics,
                           **traffic_columns(out.ledger, out.fit_entries), "fit_seconds": out.fit_seconds,
                           "predict_seconds": out.predict_seconds, "wall_seconds": wall, **out.stats,
                           **method.epsilon_columns(out.stats)}
    if out.psi_engine:  # which private set intersection found the shared people
        row["psi_engine"] = out.psi_engine
    if out.alignment_revealed:
        row["alignment_revealed"] = out.alignment_revealed
    if out.account_scopes:  # each party's own account: what its epsilon_account_PARTY covers
        row["epsilon_scope"] = "; ".join(f"{party}: {scope or 'its releases'}" for party, scope
                                         in sorted(out.account_scopes.items()))
    if out.party_settings:  # where a party ran its own side other than the experiment proposed, by party
        row["party_settings"] = json.dumps(out.party_settings, sort_keys=True)
    mark_resumed(row)
    return row


def majority_columns(train_y: np.ndarray, test_y: np.ndarray, scores: np.ndarray) -> dict[str, Any]:
    """A classification run against always answering one class: the most frequent class of its training labels
    (``majority_class``, its code), its share of the training rows, the accuracy answering it would have on the
    test rows (``majority_accuracy``), whether the model answers one class for every test row
    (``answers_one_class``), and whether it learned nothing it can use (``no_better_than_majority``: its test
    accuracy is no better than ``majority_accuracy``, or it answers one class for all). Measured on the test rows:
    the model's accuracy on its training rows is not known (a collaborative method would need another round with
    its partners to score them)."""
    codes = np.asarray(train_y).astype(np.int64)
    counts = np.bincount(codes)
    majority = int(np.argmax(counts))
    truth = np.asarray(test_y).astype(np.int64)
    answered = np.asarray(scores).argmax(axis=1)
    accuracy = float(np.mean(answered == truth)) if len(truth) else float("nan")
    baseline = float(np.mean(truth == majority)) if len(truth) else float("nan")
    one_class = len(truth) > 1 and len(np.unique(answered)) == 1
    return {"majority_class": majority, "majority_share_train": float(counts[majority] / len(codes)),
            "majority_accuracy": baseline, "answers_one_class": bool(one_class),
            "no_better_than_majority": bool(accuracy <= baseline or one_class)}


def majority_warning(label: str, row: Mapping[str, Any], *, n_train: int, n_test: int,
                     class_names: tuple[str, ...] = ()) -> str:
    """What the terminal says of a run :func:`majority_columns` flagged, naming exactly what was compared."""
    code = int(row["majority_class"])
    name = class_names[code] if code < len(class_names) else str(code)
    share = row["majority_share_train"]
    one = " and answers one class for every test row" if row["answers_one_class"] else ""
    return (f"{label} ended no better than always answering one class{one}: accuracy {row['accuracy']:.3f} on the "
            f"{n_test} test rows, where always answering the most frequent class of its training rows, class {name} "
            f"({share:.0%} of the {n_train}), scores {row['majority_accuracy']:.3f} (its accuracy on its own training "
            "rows is not measured). It has learned nothing it can use: look at its training settings (learning "
            "rate, epochs, batch size: the report's 'How training ended'), or at the noise a privacy setting adds")


def failed_row(label: str, cls: type[Method], exc: Exception, *, context: Mapping[str, Any]) -> dict[str, Any]:
    """A run that failed: the same context and method columns, the error and the exit code it maps to."""
    code = exc.exit_code if isinstance(exc, VfloError) else 1
    return {"status": "failed", **context, **method_columns(label, cls), "error_type": type(exc).__name__,
            "error": str(exc), "exit_code": code}


def mark_resumed(row: dict[str, Any]) -> None:
    """A resumed run's ledger holds only what came after the restart: say so, and add the totals with the
    traffic before it (up to the checkpoint it resumed from)."""
    if "before_resume_bytes" not in row:
        return
    row["fit_traffic_scope"] = "after the restart only; before_resume_* up to the checkpoint; *_total both"
    row["fit_bytes_total"] = row["fit_bytes"] + row["before_resume_bytes"]
    row["fit_rounds_total"] = row["fit_rounds"] + row.get("before_resume_rounds", 0)
