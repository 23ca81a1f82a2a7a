"""Run an experiment's methods over a deployed federation and write the results.

Each method is fitted on the parties' own training files and scored on the active party's
labelled test file; communication is read from the merged ledgers of every party.
"""

from __future__ import annotations

import json
import logging
import shlex
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from vflo.deploy import Deployment
from vflo.errors import AddressInUseError, ConfigError, PartyBoundaryError, TransportError
from vflo.experiments.config import DeploymentExperiment
from vflo.experiments.output import atomic_dir, json_safe
from vflo.experiments.report import markdown_table, own_settings_section
from vflo.experiments.rows import failed_row, majority_columns, majority_warning, ok_row
from vflo.experiments.runner import environment, now_iso, run_key
from vflo.metrics import compute_metrics, default_metric
from vflo.nn.train import CheckpointPlan
from vflo.seeding import derive_seed

logger = logging.getLogger(__name__)


def run_deployed(experiment: DeploymentExperiment, deployment: Deployment, *, save: Path | None = None,
                 checkpoints: Path | None = None, resume: bool = False,
                 communication: list[dict[str, Any]] | None = None,
                 command: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """One row per method: metrics on the test file, and the traffic from every party's ledger.

    Checks that concern every method (test rows held out of every party's training rows, shared IDs, rows
    to score at the parties that score collaboratively) run first, before anything trains. A method that
    fails later is recorded as a failed row and the others go on. ``command``: the command line that started the
    run (``vflo run ... --deploy ...``); given, a method that failed because a party went away says how to go on
    (:func:`partner_gone_advice`).
    """
    if deployment.test is None or deployment.test.y is None:
        raise ConfigError("a deployed experiment needs the active party's labelled test file: set test_file in the "
                          "deploy config")
    entries = [e for e in experiment.methods if not e.method_cls.simulation_only]
    for entry in experiment.methods:
        if entry.method_cls.simulation_only:
            logger.warning("%s is simulation-only (it pools every party's raw features): skipped in a deployment",
                           entry.label)
    deployment.preflight([e.instantiate() for e in entries], alignment=experiment.alignment, save=save is not None,
                         checkpoints=checkpoints is not None)
    rows = []
    for entry in entries:
        seed = derive_seed(experiment.seed, "method", 0, 0)
        t0 = time.perf_counter()
        try:
            method = entry.instantiate()
            method.check_parties(deployment.data_parties)  # settings naming parties this deployment lacks
            plan = None
            if checkpoints is not None and method.checkpointed:
                key = run_key(experiment.name, entry.label, method.config_json(), seed)
                plan = (checkpoints, CheckpointPlan(run=key, resume=resume))
            out = deployment.run(method, seed=seed, alignment=experiment.alignment,
                                 save=None if save is None else (save, entry.label), checkpoint=plan)
        except Exception as exc:  # one method failing must not discard the others' results
            # Said once: the command prints each failed method when the run ends (and the results record it).
            logger.info("%s: %s failed: %s", experiment.name, entry.label, exc)
            row = failed_row(entry.label, entry.method_cls, exc, context={"experiment": experiment.name})
            if command is not None and partner_gone(exc):
                row["error"] += "; " + partner_gone_advice(entry.instantiate(), checkpoints=checkpoints,
                                                           command=command)
            rows.append(row)
            continue
        wall = time.perf_counter() - t0
        metrics = compute_metrics(deployment.task, deployment.test.y, out.scores)
        row = ok_row(entry.label, method, out, metrics, wall=wall, context={
            "experiment": experiment.name, "n_train_active": deployment.train.n_samples,
            "n_test": deployment.test.n_samples})
        train_y = deployment.train.y
        if deployment.task != "regression" and train_y is not None and len(train_y) and "accuracy" in row:
            row |= majority_columns(train_y, deployment.test.y, out.scores)
            if row["no_better_than_majority"]:
                logger.warning("%s | %s", experiment.name, majority_warning(
                    entry.label, row, n_train=len(train_y), n_test=deployment.test.n_samples,
                    class_names=tuple(labels_of(deployment)["classes"])))
        rows.append(row)
        if communication is not None:  # the ledger's detail, as a simulated run's results.json has it
            communication.append({"method": entry.label, "by_kind": out.ledger.by_kind(),
                                  "by_party": out.ledger.by_party()})
        logger.info("%s: %s done in %.1fs", experiment.name, entry.label, wall)
    return rows


def partner_gone(exc: BaseException) -> bool:
    """Whether ``exc`` says that a party went away mid-run (stopped, killed, unreachable, or silent past its
    deadline): a failure the run can go on from once the party is back. Not a party refused for its certificate,
    nor one whose certificate comes from another CA, nor this party's own address taken."""
    from vflo.comm.tls import ProbeError

    cause = exc.__cause__
    return (isinstance(exc, TransportError) and not isinstance(exc, AddressInUseError)
            and not isinstance(cause, PartyBoundaryError)
            and not (isinstance(cause, ProbeError) and not cause.transient))


def partner_gone_advice(method: Any, *, checkpoints: Path | None, command: Sequence[str]) -> str:
    """What to do after a party went away (:func:`partner_gone`) in a run started with ``command``: resume from the
    checkpoints where the run kept them, else how to keep them next time."""
    keeping = [t for t in method.checkpointed if getattr(getattr(method.config, t), "checkpoint_every", 0)]
    if checkpoints is not None and keeping:
        again = [*command, *(["--resume"] if "--resume" not in command else [])]
        return ("once every party is serving again, resume from the last checkpoint every party holds (the same "
                f"model as a run never stopped): {shlex.join(again)}")
    if not method.checkpointed:
        return f"{method.name} keeps no checkpoints: once every party is serving again, run it again"
    missing = [] if keeping else [
        f"set checkpoint_every = N in {method.name}'s {' or '.join(method.checkpointed)} table of the experiment "
        f"config (e.g. {method.checkpointed[0]} = {{ checkpoint_every = 5 }} in its [[methods]] entry)"]
    if checkpoints is None:
        missing.append("add --checkpoints DIR (every other party keeps its own where its config's checkpoints says)")
    return (f"this run kept no checkpoints, so it cannot be resumed: run it again once every party is serving "
            f"again. To make a long training resumable, {' and '.join(missing)}; after a stop like this one, the "
            "same command with --resume then goes on from the last checkpoint every party holds")


def _training(row: dict[str, Any]) -> str:
    """How the method's main network's training ended in this run: epochs, the rule or the cap, a resume."""
    if "epochs" not in row:
        return ""
    text = f"{row['epochs']:.0f} epochs, " + ("stopped by its rule" if row.get("stopped_by_rule") else "to the cap")
    if row.get("resumed_after_epoch") is not None:
        text += f", resumed after epoch {row['resumed_after_epoch']:.0f}"
        if "before_resume_bytes" in row:
            text += (f"; traffic: {row['fit_bytes'] / 1e6:.3f} MB after the restart + "
                     f"{row['before_resume_bytes'] / 1e6:.3f} MB before it = {row['fit_bytes_total'] / 1e6:.3f} MB")
    return text


def run_and_write(experiment: DeploymentExperiment, deployment: Deployment, out_dir: Path, *, overwrite: bool,
                  save: Path | None = None, checkpoints: Path | None = None,
                  resume: bool = False, command: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """:func:`run_deployed`, then the deployment closed and the results written (:func:`write_deployed`), with
    when it started, how long it took and the ledger's detail: ``vflo run --deploy`` and its Flower app."""
    communication: list[dict[str, Any]] = []
    started, clock = now_iso(), time.perf_counter()
    try:
        rows = run_deployed(experiment, deployment, save=save, checkpoints=checkpoints, resume=resume,
                            communication=communication, command=command)
    finally:
        deployment.close()
    write_deployed(experiment, deployment, rows, out_dir, overwrite=overwrite, communication=communication,
                   seconds=time.perf_counter() - clock, started=started)
    return rows


def labels_of(deployment: Deployment) -> dict[str, Any]:
    """The task, the class names in the order of the score columns, and the class F1 and AUC count as positive."""
    encoding = deployment.preprocessing.encoding if deployment.preprocessing is not None else None
    classes = list(encoding.classes) if encoding is not None else []
    out: dict[str, Any] = {"task": deployment.task, "label_column": None if encoding is None else encoding.label_column,
                           "classes": classes}
    if deployment.task == "binary":
        out["positive"] = classes[1] if len(classes) == 2 else 1
        out["positive_note"] = "f1_binary and auc treat this class (code 1, the second in 'classes') as positive"
    return out


def write_deployed(experiment: DeploymentExperiment, deployment: Deployment, rows: list[dict[str, Any]],
                   out_dir: Path, *, overwrite: bool = False, communication: list[dict[str, Any]] | None = None,
                   seconds: float | None = None, started: str = "") -> Path:
    metric = experiment.metric or default_metric(deployment.task)
    done = [r for r in rows if r["status"] == "ok"]
    failed = [r for r in rows if r["status"] == "failed"]
    labels = labels_of(deployment)
    with atomic_dir(out_dir, overwrite=overwrite) as tmp:
        pd.DataFrame(rows).to_csv(tmp / "results.csv", index=False)
        payload = {"experiment": experiment.name, "deployed": True, "config": experiment.raw,
                   "environment": environment(), "started": started, "seconds": seconds,
                   "parties": [{"name": p.name, "role": p.role} for p in deployment.parties],
                   "labels": labels, "rows": rows, "failures": failed, "communication": communication or []}
        (tmp / "results.json").write_text(json.dumps(json_safe(payload), indent=1))
        body = [[r["method"], f"{r[metric]:.4f}", f"{r['fit_bytes'] / 1e6:.3f} MB", r["fit_rounds"],
                 f"{r['align_bytes'] / 1e6:.3f} MB", f"{r['fit_seconds']:.2f}", _training(r)] for r in done]
        failures = ["## Failures", "", markdown_table(["method", "error"], [
            [r["method"], f"{r['error_type']}: {r['error']}"] for r in failed]), ""] if failed else []
        parties = ", ".join(f"{p.name} ({p.role})" for p in deployment.parties)
        (tmp / "report.md").write_text("\n".join([
            f"# {experiment.name} (deployed)", "", f"- Parties: {parties}",
            f"- Training rows at the active party: {deployment.train.n_samples}; test rows: "
            f"{0 if deployment.test is None else deployment.test.n_samples}",
            f"- Alignment: {experiment.alignment.method}"
            + "".join(sorted({f"; {r['alignment_revealed']}" for r in done if r.get("alignment_revealed")})),
            *([f"- Classes: {', '.join(labels['classes'])}" + (f"; positive for F1 and AUC: {labels['positive']}"
                                                               if "positive" in labels else "")]
              if labels["classes"] else []), "",
            markdown_table(["method", metric, "train comm", "train rounds", "alignment", "fit s", "training"], body),
            "",
            *failures,
            *own_settings_section(rows),
            "Communication is the sum of every party's own ledger of the messages it sent and the replies it got.",
            "",
        ]))
    return out_dir
