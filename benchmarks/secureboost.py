"""SecureBoost benchmark (not a test). Writes runs/bench/secureboost.json, part by part as each finishes.

    python -m benchmarks.secureboost [--data-dir ../shared/datasets] [--trees 50] [--score-rows 100000]
                                     [--only floor credit lossless colsample goss paillier leakage
                                            scoring]
                                     [--out runs/bench/secureboost.json]

Parts already in ``--out`` are kept (``--only`` adds or replaces the parts it runs).

1. ``floor``: what HEU costs on this machine, in one process and shared out among the party's workers as a
   training shares it (one per core): an OU encryption (2048-bit key, g and h packed), a ciphertext added into a
   per-bin sum (``feature_wise_bucket_sum``), a ciphertext subtracted (a partner's derived node), a decryption.
2. ``credit``: UCI Credit Card, the bank (label holder) with X1-X5 and the bureau with X6-X23, every person held
   by both, 80 % of them to train; ``--trees`` trees of depth 5 (rate 0.3, λ 1, 32 bins). Over gRPC with mutual
   TLS, the bureau as its own process (``vflo party serve``); then in one process. Seconds, bytes and rounds from
   the ledger, the homomorphic operations the protocol asked for, and their floor (count x cost, one core),
   with vflo's ratio to it. Beside it, XGBoost ``hist`` centralized on the same rows and columns with the same
   depth, rounds, rate, λ, γ, min_child_weight and bins: accuracy, ROC AUC, seconds.
3. ``lossless``: on Credit (as above) and scikit-learn's breast cancer (15 columns a party, every person held
   by both), SecureBoost in one process encrypted (OU) and with the plaintext backend, which must give the same
   scores bit for bit, against XGBoost as above, on its own bins and on vflo's (each value replaced by its bin
   number), accuracy within 0.005 being the target.
4. ``colsample``: Credit as above, 10 trees, each party splitting each tree on a share of its own columns (1,
   0.5, 0.3; ``colsample``), OU in one process: accuracy, ROC AUC, ciphertexts added, seconds.
4b. ``goss``: Credit as above, 10 trees, every person in every tree and GOSS (``row_sampling = "goss"``) at
   top_rate/other_rate 0.2/0.1 and 0.3/0.2, each GOSS setting at three seeds of the label holder's draws, OU in
   one process: accuracy, ROC AUC, encryptions, ciphertexts added, sums decrypted, seconds.
5. ``paillier``: Paillier's floor (2048-bit) beside OU's, and Credit as above, 10 trees, in one process under
   each: seconds, and whether both grew the same trees.
6. ``leakage``: label inference by the bureau from the instance spaces it is asked to sum over (who shares a
   node), on Credit as above with 10 trees, with the first 0, 1 or 2 trees grown at the bank alone
   (``active_trees``, SecureBoost's reduced-leakage option): ROC AUC of the attack with k known labels, from
   the first tree the bureau saw and from all of them, beside the model's own test ROC AUC.
7. ``scoring``: a SecureBoost model (10 trees, trained on 20,000 synthetic people, half shared) scores
   ``--score-rows`` new people both parties hold, the passive party serving as its own process over gRPC with
   mutual TLS (``vflo predict --deploy``): wall time of the command (benchmarks/predict.py's ``together``), then
   of the same command again, the intersection the first kept reused (``command_kept``); and the private set
   intersection of that many people alone, which deployed scoring runs first
   (benchmarks/network.py's ``psi``: both parties in one process, 50 % shared).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import vflo
from vflo.deploy import Deployment, export_federation, load_deploy_config
from vflo.experiments.config import parse_config
from vflo.federation.simulation import RunOutput, run_method
from vflo.methods.secureboost import SecureBoost
from vflo.metrics import compute_metrics
from vflo.seeding import derive_seed, numpy_rng
from vflo.trees.bins import bin_codes, fit_cuts
from vflo.trees.crypto import HESettings, PublicSide, new_keys

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from predict import together  # noqa: E402

from benchmarks.link import wait_for  # noqa: E402

BINS = 32


def floor_costs(rows: int = 24_000, columns: int = 18, decrypts: int = 8_000, *,
                scheme: str = "ou") -> dict[str, float]:
    """Seconds per encryption, per ciphertext added into a bin sum, per decryption: HEU OU in one process, and
    shared out as a training shares them, among this process and the workers of the party's executor (one per
    core it may use, as SecureBoost's ``workers = 0``), each measured after its workers started."""
    from vflo.trees.crypto import processes

    rng = np.random.default_rng(0)
    gh = np.stack([rng.integers(-2**20, 2**20, rows), rng.integers(0, 2**20, rows)], axis=1)
    codes = rng.integers(0, BINS + 1, size=(rows, columns)).astype(np.int8)
    out: dict[str, float] = {}
    for workers, suffix in ((1, ""), (processes(0), "_workers")):
        keys = new_keys(HESettings(scheme=scheme), workers=workers)  # type: ignore[arg-type]
        side = PublicSide(scheme, keys.public_key, workers=workers)
        try:
            keys.encrypt(gh[:9_000])  # starts the workers, outside the timing
            started = time.perf_counter()
            encrypted = keys.encrypt(gh)
            out[f"encrypt{suffix}_s"] = (time.perf_counter() - started) / rows
            side.share(encrypted)
            side.bucket_sums(encrypted, np.arange(rows // 4), codes, BINS + 1)  # the workers start and hold it
            started = time.perf_counter()
            sums = side.bucket_sums(encrypted, np.arange(rows), codes, BINS + 1)
            out[f"add{suffix}_s"] = (time.perf_counter() - started) / (rows * columns)
            half = side.bucket_sums(encrypted, np.arange(rows // 2), codes, BINS + 1, cumulative=True)
            started = time.perf_counter()
            side.subtract(sums, half)  # a partner's derived node, in its process (HEU subtracts on one thread)
            out[f"subtract{suffix}_s"] = (time.perf_counter() - started) / (columns * (BINS + 1))
            batch = keys.rows(encrypted, np.arange(decrypts))
            keys.decrypt_many([keys.rows(encrypted, np.arange(4_096))])
            started = time.perf_counter()
            keys.decrypt_many([batch])
            out[f"decrypt{suffix}_s"] = (time.perf_counter() - started) / decrypts
            assert keys.decrypt(sums).shape == (columns * (BINS + 1), 2)
        finally:
            side.close()
            keys.close()
    out["workers"] = float(processes(0))
    return out


def homomorphic_floor(counts: dict[str, float], costs: dict[str, float], cost: str = "_s") -> float:
    """Seconds the homomorphic operations a run counted (``counts``: its stats) cost at ``costs`` (the ``floor``
    part: ``encrypt_s``, ...; ``cost="_workers_s"``: each as shared out among the party's workers)."""
    return (counts["encryptions"] * costs["encrypt" + cost] + counts["ciphertext_additions"] * costs["add" + cost]
            + counts.get("ciphertext_subtractions", 0) * costs["subtract" + cost]
            + counts["sums_decrypted"] * costs["decrypt" + cost])


def split(dataset: str, parties: list[dict[str, Any]], total: int, data_dir: str | None) -> Any:
    """The first holdout split (20 % to test) of ``dataset`` cut among ``parties``, every person held by all."""
    config = parse_config({
        "name": "bench", "seed": 0, "dataset": {"name": dataset},
        "scenario": {"parties": parties, "samples": {"total": total, "active": total, "aligned": total}},
        "protocol": {"name": "holdout", "test_fraction": 0.2, "test_from": "active", "repeats": 1},
        "methods": [{"name": "local"}]})
    layout = config.layout(config.variants[0], derive_seed(config.seed, "layout", 0), config.load_dataset(data_dir))
    cut = config.protocol.splits(layout, numpy_rng(config.seed, "split", 0))[0]
    return layout.materialize(test_ids=cut.test_ids, train_scope=cut.train_scope)


def scores_of(data: Any, out: RunOutput) -> dict[str, float]:
    metrics = compute_metrics(data.task, data.test_y, out.scores)
    return {"accuracy": metrics["accuracy"], "roc_auc": metrics["roc_auc"]}


def xgboost_beside(data: Any, settings: dict[str, Any], *, same_bins: bool = False) -> dict[str, float]:
    """XGBoost ``hist`` on the same train rows, every party's columns joined, same tree settings; with
    ``same_bins``, on vflo's bins (each value replaced by its bin number under the quantile cuts vflo's parties
    draw from the train rows), so the two choose among the same splits."""
    import xgboost

    def joined(ids: np.ndarray) -> np.ndarray:
        return np.hstack([data.oracle.features(ids, p.name) for p in data.parties])

    train_ids = data.train[data.active].ids
    X, y, Xt = joined(train_ids), data.train[data.active].require_labels(), joined(data.test_ids)
    bins = BINS
    if same_bins:
        cuts = fit_cuts(X, BINS)
        X, Xt = bin_codes(X, cuts, BINS).astype(np.float64), bin_codes(Xt, cuts, BINS).astype(np.float64)
        bins = 2 * BINS  # more bins than codes: each code is a bin of its own
    model = xgboost.XGBClassifier(
        n_estimators=settings["n_trees"], max_depth=settings["max_depth"], learning_rate=settings["learning_rate"],
        reg_lambda=1.0, gamma=0.0, min_child_weight=1.0, tree_method="hist", max_bin=bins, n_jobs=1)
    started = time.perf_counter()
    model.fit(X, y)
    seconds = time.perf_counter() - started
    metrics = compute_metrics("binary", data.test_y, model.predict_proba(Xt))
    return {"accuracy": metrics["accuracy"], "roc_auc": metrics["roc_auc"], "fit_seconds": seconds}


def run_summary(out: RunOutput) -> dict[str, Any]:
    fit = out.fit_summary
    return {"fit_seconds": out.fit_seconds, "bytes": fit.bytes, "rounds": fit.rounds, "messages": fit.messages,
            "stats": out.stats}


def over_grpc(data: Any, settings: dict[str, Any], work: Path) -> tuple[dict[str, Any], RunOutput]:
    export_federation(data, work, base_port=57000 + os.getpid() % 1000, proposals=[SecureBoost(**settings)])
    proc = subprocess.Popen([sys.executable, "-m", "vflo", "party", "serve", "bureau.toml"], cwd=work,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"})
    try:
        wait_for(proc, "listening on")
        deployment = Deployment(load_deploy_config(work / "deploy.toml"))
        try:
            out = deployment.run(SecureBoost(**settings), seed=0)
        finally:
            deployment.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    return run_summary(out), out


def credit_data(data_dir: str | None) -> Any:
    return split("credit_default", [{"name": "bank", "role": "active", "columns": ["X1", "X2", "X3", "X4", "X5"]},
                                    {"name": "bureau", "columns": "rest"}], 30_000, data_dir)


def credit(data_dir: str | None, trees: int, costs: dict[str, float] | None, work: Path) -> dict[str, Any]:
    data = credit_data(data_dir)
    settings = {"n_trees": trees, "max_depth": 5, "learning_rate": 0.3, "n_bins": BINS}
    result: dict[str, Any] = {"train_rows": int(data.train[data.active].n_samples),
                              "test_rows": len(data.test_ids), "settings": settings}
    grpc, out = over_grpc(data, settings, work)
    result["grpc_mtls"] = {**grpc, **scores_of(data, out)}
    print("credit over gRPC:", json.dumps(result["grpc_mtls"]), flush=True)
    local = run_method(SecureBoost(**settings), data, seed=0)
    result["in_process"] = {**run_summary(local), **scores_of(data, local)}
    result["xgboost"] = xgboost_beside(data, settings)
    if costs is not None:
        counts = out.stats
        floor, shared = homomorphic_floor(counts, costs), homomorphic_floor(counts, costs, "_workers_s")
        result["floor"] = {"one_core_s": floor, "ratio_grpc": out.fit_seconds / floor,
                           "ratio_in_process": local.fit_seconds / floor, "workers_s": shared,
                           "ratio_grpc_workers": out.fit_seconds / shared, "workers": costs["workers"]}
    return result


def lossless(data_dir: str | None, trees: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, data in (("credit", credit_data(data_dir)), ("breast_cancer", split(
            "breast_cancer", [{"name": "a", "role": "active", "n_columns": 15}, {"name": "b", "share": 1.0}],
            569, None))):
        settings = {"n_trees": trees, "max_depth": 5, "learning_rate": 0.3, "n_bins": BINS}
        encrypted = run_method(SecureBoost(**settings), data, seed=0)
        plain = run_method(SecureBoost(**settings, he={"scheme": "plaintext"}), data, seed=0)
        out[name] = {"train_rows": int(data.train[data.active].n_samples), "test_rows": len(data.test_ids),
                     "trees": trees, "identical_to_plaintext": bool(np.array_equal(encrypted.scores, plain.scores)),
                     "secureboost": scores_of(data, encrypted), "xgboost": xgboost_beside(data, settings),
                     "xgboost_same_bins": xgboost_beside(data, settings, same_bins=True)}
        print(name, json.dumps(out[name]), flush=True)
    return out


def colsample(data_dir: str | None, trees: int = 10, shares: tuple[float, ...] = (1.0, 0.5, 0.3)) -> dict[str, Any]:
    """What column sampling costs and saves: Credit as above, ``trees`` trees, each party splitting each tree on
    a share of its columns (``colsample``), in one process with OU: accuracy, ROC AUC, the ciphertexts added
    and the training's seconds, per share."""
    data = credit_data(data_dir)
    out: dict[str, Any] = {"trees": trees, "train_rows": int(data.train[data.active].n_samples)}
    for share in shares:
        settings = {"n_trees": trees, "max_depth": 5, "learning_rate": 0.3, "n_bins": BINS, "colsample": share}
        run = run_method(SecureBoost(**settings), data, seed=0)
        out[str(share)] = {**scores_of(data, run), "fit_seconds": run.fit_seconds,
                           "ciphertext_additions": run.stats["ciphertext_additions"],
                           "sums_decrypted": run.stats["sums_decrypted"]}
        print("colsample", share, json.dumps(out[str(share)]), flush=True)
    return out


GOSS_RATES = ((0.2, 0.1), (0.3, 0.2))


def goss(data_dir: str | None, trees: int = 10, seeds: tuple[int, ...] = (0, 1, 2)) -> dict[str, Any]:
    """What row sampling costs and saves: Credit as above, ``trees`` trees, every person in every tree and GOSS at
    each of :data:`GOSS_RATES` (top_rate, other_rate), in one process with OU; GOSS run at each of ``seeds`` (the
    label holder's draws are its own seed's), every person once (its trees do not depend on the seed): accuracy,
    ROC AUC, encryptions, ciphertexts added, sums decrypted, seconds."""
    data = credit_data(data_dir)
    out: dict[str, Any] = {"trees": trees, "train_rows": int(data.train[data.active].n_samples), "runs": {}}
    base = {"n_trees": trees, "max_depth": 5, "learning_rate": 0.3, "n_bins": BINS}
    plans = [("all", {}, (0,)), *((f"goss {top}/{other}", {"row_sampling": "goss", "top_rate": top,
                                                           "other_rate": other}, seeds) for top, other in GOSS_RATES)]
    for label, extra, plan_seeds in plans:
        runs = []
        for seed in plan_seeds:
            run = run_method(SecureBoost(**base, **extra), data, seed=seed)
            runs.append({"seed": seed, **scores_of(data, run), "fit_seconds": run.fit_seconds,
                         **{k: run.stats[k] for k in ("encryptions", "ciphertext_additions", "sums_decrypted")}})
            print("goss", label, json.dumps(runs[-1]), flush=True)
        out["runs"][label] = runs
    return out


def paillier(data_dir: str | None, trees: int = 10) -> dict[str, Any]:
    """Paillier at scale: its homomorphic floor (as ``floor``, 2048-bit) beside OU's, and Credit as above with
    ``trees`` trees in one process under each: seconds, and whether both grew the same trees (the same scores)."""
    data = credit_data(data_dir)
    out: dict[str, Any] = {"trees": trees, "train_rows": int(data.train[data.active].n_samples)}
    scores = {}
    for scheme in ("ou", "paillier"):
        settings = {"n_trees": trees, "max_depth": 5, "learning_rate": 0.3, "n_bins": BINS, "he": {"scheme": scheme}}
        run = run_method(SecureBoost(**settings), data, seed=0)
        scores[scheme] = run.scores
        out[scheme] = {"floor": floor_costs(scheme=scheme), "fit_seconds": run.fit_seconds, **scores_of(data, run),
                       "stats": run.stats}
        print(scheme, json.dumps(out[scheme], default=float), flush=True)
    out["same_scores"] = bool(np.array_equal(scores["ou"], scores["paillier"]))
    return out


def leakage(data_dir: str | None, trees: int = 10) -> dict[str, Any]:
    from vflo.privacy.evaluate import attack_run

    data = credit_data(data_dir)
    out: dict[str, Any] = {"trees": trees, "train_rows": int(data.train[data.active].n_samples)}
    for first in (0, 1, 2):
        method = SecureBoost(n_trees=trees, max_depth=5, learning_rate=0.3, n_bins=BINS, active_trees=first)
        run = attack_run(method, data, seed=0, completion=(10, 40, 100), decoders=())
        out[f"active_trees_{first}"] = {"roc_auc": run["metrics"]["roc_auc"], "attack": run["labels"]["bureau"]}
        print(first, json.dumps(out[f"active_trees_{first}"]), flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=os.environ.get("VFLO_DATA_DIR"))
    parser.add_argument("--trees", type=int, default=50)
    parser.add_argument("--score-rows", type=int, default=100_000)
    parser.add_argument("--only", nargs="+", choices=["floor", "credit", "lossless", "colsample", "goss",
                                                      "paillier", "leakage", "scoring"])
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench" / "secureboost.json")
    args = parser.parse_args(argv)
    results: dict[str, Any] = json.loads(args.out.read_text()) if args.out.is_file() else {}
    from benchmarks.compare_all import commit

    # Each part records the commit that ran it: a file built by several runs names each part's own code.
    ran = commit()
    results.update({"machine": f"{len(os.sched_getaffinity(0))} cores", "vflo": vflo.__version__})
    results.setdefault("commit", ran)
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def keep(name: str, value: Any) -> None:
        if isinstance(value, dict):  # other work on the machine over the last minute, as the part ended
            value = {**value, "load_average": os.getloadavg()[0]}
        results[name] = value
        results.setdefault("commits", {})[name] = ran
        args.out.write_text(json.dumps(results, indent=1, default=float))
        print(name, json.dumps(value, default=float)[:1500], flush=True)

    wanted = set(args.only or ["floor", "credit", "lossless", "colsample", "goss", "paillier", "leakage", "scoring"])
    costs = floor_costs() if wanted & {"floor", "credit"} else None
    if "floor" in wanted:
        keep("floor", costs)
    with tempfile.TemporaryDirectory() as tmp:
        if "credit" in wanted:
            (Path(tmp) / "credit").mkdir()
            keep("credit", credit(args.data_dir, args.trees, costs, Path(tmp) / "credit"))
        if "lossless" in wanted:
            keep("lossless", lossless(args.data_dir, args.trees))
        if "colsample" in wanted:
            keep("colsample", colsample(args.data_dir))
        if "goss" in wanted:
            keep("goss", goss(args.data_dir))
        if "paillier" in wanted:
            keep("paillier", paillier(args.data_dir))
        if "leakage" in wanted:
            keep("leakage", leakage(args.data_dir))
        if "scoring" in wanted:
            (Path(tmp) / "scoring").mkdir()
            scoring = together(Path(tmp) / "scoring", args.score_rows, "secureboost", train_rows=20_000, again=True)
            # Deployed scoring aligns by PSI (a partner sees only its own people scored): that part alone.
            from network import psi
            keep("scoring", {**scoring, "psi_alone": psi(args.score_rows)})
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
