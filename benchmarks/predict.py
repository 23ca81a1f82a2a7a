"""Scoring with saved models at scale, and every method's save and load times (benchmark, not a test).

    python benchmarks/predict.py [--rows 1000000] [--together 100000] [--data-dir ../shared/datasets]
                                 [--out runs/bench/predict.json]

1. Active-only: APC-VFL trained on two synthetic party files (20,000 people, half of them shared), saved,
   then ``vflo predict`` on a file of ``--rows`` new people the active party alone holds (Parquet): the
   command's wall time (start-up, reading, preprocessing, scoring, writing the CSV; its default threads, all
   cores) and peak memory, and the same in this process (``vflo.load(...).score(file)``, this process's
   threads). Goals: under 5 s and 2 GB.
2. Collaborative: SplitNN, saved; the passive party serves its saved part as its own process (``vflo party
   serve``, gRPC with mutual TLS, ``serve_file`` of ``--together`` rows), and the active party scores as
   many rows with ``vflo predict --deploy``. Goal: under 10 s.
3. Every deployable method on Credit (the first split of the first variant of its paper's Credit config in
   configs/papers/), trained briefly, saved (``model.save``), loaded, and the test rows scored from their
   raw values (``vflo.load(...).predict``, checked equal to the trained model's scores): seconds and folder
   sizes per method.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import vflo
from vflo.comm.local_ports import free_port
from vflo.comm.tls import init_certs
from vflo.methods.registry import get_method, method_names

ROOT = Path(__file__).resolve().parents[1]
QUICK = {"batch_size": 256, "max_epochs": 3, "patience": 0, "validation_fraction": 0.0}
SETTINGS: dict[str, dict[str, Any]] = {
    "splitnn": {"train": QUICK}, "apc_vfl": {"train": QUICK}, "apc_vfl_aligned": {"train": QUICK},
    "ablation": {"train": QUICK}, "vfedtrans": {"train": QUICK}, "entity_augmentation": {"train": QUICK},
    "rap": {"estimator": {"model": "mlp", "hidden": [32], "train": QUICK}},
    "ldp": {"estimator": {"model": "mlp", "hidden": [32], "train": QUICK}},
    "vfl_asp": {"train": QUICK, "student_train": QUICK, "embedding_train": QUICK},
    "vfl_asp_student": {"train": QUICK, "student_train": QUICK, "embedding_train": QUICK},
    "secureboost": {"n_trees": 10},
}


def people(rng: np.random.Generator, ids: np.ndarray, signal: np.ndarray, width: int, prefix: str,
           offset: int) -> pd.DataFrame:
    frame = pd.DataFrame(rng.normal(size=(len(ids), width)).astype(np.float32),
                         columns=[f"{prefix}{i}" for i in range(width)])
    frame.iloc[:, :2] += signal[:, offset:offset + 2]
    frame.insert(0, "id", [f"P{v:08d}" for v in ids])
    return frame


def write_parties(folder: Path, rows: int, seed: int) -> tuple[Path, Path]:
    """An active party (24 columns and a label) and a passive party (50 columns), half of each shared."""
    rng = np.random.default_rng(seed)
    ids = rng.permutation(int(rows * 1.5))
    active_ids, passive_ids = ids[:rows], ids[rows // 2: rows // 2 + rows]
    signal = rng.normal(size=(len(ids), 4))
    active = people(rng, active_ids, signal[active_ids], 24, "a", 0)
    active["label"] = (signal[active_ids].sum(axis=1) > 0).astype(np.int64)
    passive = people(rng, passive_ids, signal[passive_ids], 50, "p", 2)
    active.to_csv(folder / "active.csv", index=False)
    passive.to_csv(folder / "passive.csv", index=False)
    return folder / "active.csv", folder / "passive.csv"


def fit_and_save(method: str, active: Path, passive: Path, models: Path) -> None:
    a = vflo.PartyData.from_file(active, party="active", id_column="id", label_column="label")
    p = vflo.PartyData.from_file(passive, party="passive", id_column="id")
    vflo.fit(method, vflo.hold_out([a, p], test=0.1, seed=0), **SETTINGS[method]).save(models)


def timed_command(command: list[str], cwd: Path) -> dict[str, float]:
    """Wall seconds and peak resident memory (GB) of a command run to completion."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    started = time.perf_counter()
    # `vflo predict` picks its own threads (all cores unless told otherwise), as a user would run it.
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False, env=env)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stdout}\n{done.stderr}")
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return {"seconds": seconds, "peak_gb": max(peak, before) / 1e6}


def active_only(work: Path, rows: int) -> dict[str, Any]:
    active, passive = write_parties(work, 20_000, seed=0)
    fit_and_save("apc_vfl", active, passive, work / "models")
    rng = np.random.default_rng(1)
    new = people(rng, np.arange(10**8, 10**8 + rows), rng.normal(size=(rows, 4)), 24, "a", 0)
    new.to_parquet(work / "new.parquet")
    vflo_bin = str(Path(sys.executable).parent / "vflo")
    # Three times: on this machine one run of the same command took anywhere from 10 to 16 s.
    runs = [timed_command([vflo_bin, "predict", "models", "--method", "apc_vfl", "--data", "new.parquet", "--out",
                           "scores.csv", "--overwrite"], work) for _ in range(3)]
    command = {"seconds": float(np.median([r["seconds"] for r in runs])), "runs": [r["seconds"] for r in runs],
               "peak_gb": max(r["peak_gb"] for r in runs)}
    assert len((work / "scores.csv").read_text().splitlines()) == rows + 1
    saved = vflo.load(work / "models", "apc_vfl")
    started = time.perf_counter()
    frame = saved.score(work / "new.parquet")
    in_process = time.perf_counter() - started
    assert len(frame) == rows
    timings = []
    for _ in range(3):  # each step's median of three fresh processes: single steps here jump by seconds at times
        done = subprocess.run([sys.executable, "-c", STAGES, str(work)], capture_output=True, text=True, check=True,
                              env={k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"})
        timings.append(json.loads(done.stdout.splitlines()[-1]))
    stages = {name: float(np.median([t[name] for t in timings])) for name in timings[0]}
    return {"rows": rows, "command": command, "in_process_seconds": in_process, "stages": stages,
            "stage_runs": timings}


#: Where the command's time goes: its steps one by one in a fresh interpreter (so each import is paid where it
#: first happens, as in the command), with the command's thread setting.
STAGES = """
import json, sys, time
from pathlib import Path
work = Path(sys.argv[1])
spent = {}
def stage(name, started):
    spent[name] = time.perf_counter() - started
    return time.perf_counter()
t = time.perf_counter()
from vflo.cli.common import configure_threads
configure_threads(None, all_cores=True)
from vflo.scoring import SavedModel
t = stage("start Python and import vflo's scoring", t)
model = SavedModel.load(work / "models", "apc_vfl")
rows = model.rows("active", work / "new.parquet")
t = stage("read the Parquet file and prepare its rows", t)
import torch
t = stage("import PyTorch", t)
from vflo.methods.apc_vfl import APCVFL
from vflo.nn.estimators import LogisticEstimator
timed = {"encode": 0.0, "classify": 0.0}
def timing(name, fn):
    def run(*args, **kwargs):
        began = time.perf_counter()
        out = fn(*args, **kwargs)
        timed[name] += time.perf_counter() - began
        return out
    return run
APCVFL.represent = timing("encode", APCVFL.represent)
LogisticEstimator.predict_scores = timing("classify", LogisticEstimator.predict_scores)
frame = model.score(rows)
total = time.perf_counter() - t
spent["run the encoder (PyTorch)"] = timed["encode"]
spent["apply the classifier"] = timed["classify"]
spent["restore the model, match IDs, assemble the table"] = total - timed["encode"] - timed["classify"]
t = time.perf_counter()
import pyarrow as pa, pyarrow.csv
pyarrow.csv.write_csv(pa.Table.from_pandas(frame, preserve_index=False), work / "stages.csv",
                      pyarrow.csv.WriteOptions(quoting_style="needed"))
stage("write the CSV", t)
print(json.dumps(spent))
"""


def together(work: Path, rows: int, method: str = "splitnn", train_rows: int | None = None, *,
             again: bool = False) -> dict[str, Any]:
    """``method`` scoring ``rows`` people with the passive party as its own process over gRPC and mutual TLS:
    people both parties held in training, or with ``train_rows``, a model trained on that many and ``rows`` new
    people both hold. With ``again``, the same command once more (``command_kept``): the intersection the first
    kept in both parties' alignments folders is reused (vflo.align.kept), as a deployment scoring the same people
    again would."""
    active, passive = write_parties(work, train_rows or max(2 * rows, 20_000), seed=2)  # half of each shared
    fit_and_save(method, active, passive, work / "models")
    if train_rows is None:
        a, p = pd.read_csv(active, dtype={"id": str}), pd.read_csv(passive, dtype={"id": str})
        shared = np.intersect1d(a["id"], p["id"])[:rows]
        a, p = a[a["id"].isin(shared)].drop(columns="label"), p[p["id"].isin(shared)]
    else:
        rng = np.random.default_rng(3)
        shared, signal = np.arange(10**8, 10**8 + rows), rng.normal(size=(rows, 4))
        a, p = people(rng, shared, signal, 24, "a", 0), people(rng, shared, signal, 50, "p", 2)
    a.to_csv(work / "score_active.csv", index=False)
    p.to_csv(work / "serve_passive.csv", index=False)
    init_certs(work / "certs", ["active", "passive"])
    write_pair(work, "serve_passive.csv")
    vflo_bin = str(Path(sys.executable).parent / "vflo")
    server = subprocess.Popen([vflo_bin, "party", "serve", "passive.toml"], cwd=work, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        assert server.stdout is not None
        deadline = time.monotonic() + 90
        line = ""
        while "listening on" not in line:
            if time.monotonic() > deadline or server.poll() is not None:
                rest = server.stdout.read() if server.poll() is not None else ""
                raise RuntimeError(f"the passive party did not start: {line}{rest}")
            line = server.stdout.readline()
        predict = [vflo_bin, "predict", "models", "--method", method, "--data", "score_active.csv", "--deploy",
                   "deploy.toml", "--out"]
        command = timed_command([*predict, "scores.csv"], work)
        kept = timed_command([*predict, "scores_kept.csv"], work) if again else None
    finally:
        server.terminate()
        server.wait(timeout=10)
    assert len((work / "scores.csv").read_text().splitlines()) == len(shared) + 1
    out: dict[str, Any] = {"method": method, "rows": len(shared), "command": command}
    if kept is not None:
        first, second = pd.read_csv(work / "scores.csv"), pd.read_csv(work / "scores_kept.csv")
        assert first.equals(second), "scoring again with the kept intersection changed the scores"
        out["command_kept"] = kept
    return out


def write_pair(work: Path, serve_file: str) -> None:
    """passive.toml (serving its part from models/ and its rows from ``serve_file``) and deploy.toml (the active
    party's, from active.csv) in ``work``, each on a free port, with the certificates in work/certs."""
    ports = {"active": free_port(), "passive": free_port()}
    (work / "passive.toml").write_text(
        f'name = "passive"\nlisten = "127.0.0.1:{ports["passive"]}"\nmodels = "models"\n[data]\n'
        f'id_column = "id"\nserve_file = "{serve_file}"\n[tls]\ndir = "certs"\n'
        f'[peers]\nactive = {{ address = "127.0.0.1:{ports["active"]}", role = "active" }}\n')
    (work / "deploy.toml").write_text(
        f'[active]\nname = "active"\nrole = "active"\nlisten = "127.0.0.1:{ports["active"]}"\n[active.data]\n'
        f'file = "active.csv"\nid_column = "id"\nlabel_column = "label"\n[active.tls]\ndir = "certs"\n'
        f'[[parties]]\nname = "passive"\nrole = "passive"\naddress = "127.0.0.1:{ports["passive"]}"\n')


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


CREDIT = {"entity_augmentation": "ea_table3_credit.toml", "vfl_asp": "vfl_asp_table2_credit.toml",
          "vfl_asp_student": "vfl_asp_table2_credit.toml"}


def credit_split(config_name: str, data_dir: str | None) -> Any:
    """The first split of the first variant of a paper's Credit config, as ``vflo run`` would cut it."""
    from vflo.experiments.config import load_config
    from vflo.seeding import derive_seed, numpy_rng

    config = load_config(ROOT / "configs" / "papers" / config_name)
    layout = config.layout(config.variants[0], derive_seed(config.seed, "layout", 0), config.load_dataset(data_dir))
    split = config.protocol.splits(layout, numpy_rng(config.seed, "split", 0))[0]
    return layout.materialize(test_ids=split.test_ids, train_scope=split.train_scope)


def save_and_load(work: Path, data_dir: str | None) -> dict[str, Any]:
    """Every deployable method on Credit: save, load, and score the split's test rows from raw values."""
    out: dict[str, Any] = {}
    splits: dict[str, Any] = {}
    for name in method_names():
        method = get_method(name)
        if method.simulation_only:
            continue
        config_name = CREDIT.get(name, "apc_vfl_table2_credit.toml")
        data = splits.setdefault(config_name, credit_split(config_name, data_dir))
        model = vflo.fit(method(**SETTINGS.get(name, {})), data, seed=0)
        started = time.perf_counter()
        folder = model.save(work / name)
        save_s = time.perf_counter() - started
        started = time.perf_counter()
        loaded = vflo.load(work / name)
        load_s = time.perf_counter() - started
        raw = {party: _raw(data, party, serve.subset(data.test_ids[serve.contains(data.test_ids)]))
               for party, serve in data.serve.items() if serve.n_features or party == data.active}
        started = time.perf_counter()
        scores = loaded.predict(raw if not loaded.active_only else raw[data.active])
        score_s = time.perf_counter() - started
        assert np.array_equal(scores, model.predict())  # the saved model is the trained one
        out[name] = {"config": config_name, "train_rows_active": int(data.train[data.active].n_samples),
                     "test_rows": len(data.test_ids), "save_seconds": save_s, "load_seconds": load_s,
                     "score_seconds": score_s, "bytes": folder_bytes(folder)}
        print(f"{name}: save {save_s:.3f} s, load {load_s:.3f} s, score {score_s:.3f} s, "
              f"{folder_bytes(folder) / 1e3:.0f} kB", flush=True)
    return out


def _raw(data: Any, party: str, rows: Any) -> Any:
    from vflo.data.partydata import PartyData

    return PartyData(party=party, ids=rows.ids, X=data.oracle.features(rows.ids, party), columns=rows.columns)


MARK_BEGIN, MARK_END = "<!-- predict-million:begin -->", "<!-- predict-million:end -->"


def docs(path: Path, page: Path) -> None:
    """The active-only part of a results file as a table in ``page``, between its markers."""
    results = json.loads(path.read_text())
    run = results["active_only"]
    stages = run["stages"]
    lines = [f"Measured by `python benchmarks/predict.py --only active_only --rows {run['rows']}` on this "
             f"project's machine ({results['machine']}): APC-VFL trained on 20,000 people, then `vflo predict` "
             f"on {run['rows']:,} new people (24 columns, Parquet in, CSV out).", "",
             f"- The command: {run['command']['seconds']:.1f} s, the median of "
             f"{', '.join(f'{x:.1f}' for x in run['command']['runs'])} s; peak memory "
             f"{run['command']['peak_gb']:.2f} GB (the goal is under 5 s).",
             f"- `vflo.load(...).score(file)` in a process that has imported everything already: "
             f"{run['in_process_seconds']:.1f} s.", "",
             "Where the command's time goes, its steps one by one in a fresh process (each step's median of three "
             "such processes):", "",
             "| step | seconds |", "|---|---|"]
    lines += [f"| {name} | {seconds:.2f} |" for name, seconds in stages.items()]
    lines.append(f"| the medians' sum | {sum(stages.values()):.2f} |")
    text = page.read_text()
    a, b = text.index(MARK_BEGIN) + len(MARK_BEGIN), text.index(MARK_END)
    page.write_text(text[:a] + "\n" + "\n".join(lines) + "\n" + text[b:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--together", type=int, default=100_000)
    parser.add_argument("--data-dir", default=os.environ.get("VFLO_DATA_DIR"))
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench" / "predict.json")
    parser.add_argument("--only", nargs="+", choices=["active_only", "together", "save_and_load"],
                        help="run only these parts")
    parser.add_argument("--docs", type=Path, help="write the active-only table of this results file into "
                                                   "docs/deploy.md")
    args = parser.parse_args()
    if args.docs is not None:
        docs(args.docs, ROOT / "docs" / "deploy.md")
        return
    results: dict[str, Any] = {"machine": f"{os.cpu_count()} cores", "vflo": vflo.__version__}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name, run in (("active_only", lambda w: active_only(w, args.rows)),
                          ("together", lambda w: together(w, args.together)),
                          ("save_and_load", lambda w: save_and_load(w, args.data_dir))):
            if args.only and name not in args.only:
                continue
            (work / name).mkdir()
            results[name] = run(work / name)
            print(name, json.dumps(results[name], indent=1, default=str)[:2000], flush=True)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(results, indent=1))
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
