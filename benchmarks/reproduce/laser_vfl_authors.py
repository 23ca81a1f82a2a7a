"""The LASER-VFL authors' own code on vflo's Credit split: an independent column for docs/reproductions/laser-vfl.md.

    python -m benchmarks.reproduce.laser_vfl_authors --authors-repo PATH [--data-dir ../shared/datasets]
        [--methods local svfl plug laser] [--p-miss 0.0 0.1 0.5] [--seeds 0 1 2 3 4]

``PATH``: the public repository Valdeira/LASER-VFL, as a checkout or a git directory (``fetch`` puts one under
/work/.mirror/). The script exports the people of ``configs/papers/laser_vfl_credit.toml`` (its held-out test
people, the others for training; all 23 columns, standardised with the training rows' means and scales) as the
``{X,y}_{train,test}.npy`` files their Credit loader reads (it keeps the first 20 columns, 4 blocks of 5), copies
their code into ``runs/repro/laser_vfl_authors/code``, and runs their ``main.py`` once per method and p_miss
(test p_miss = training p_miss), one thread. Their results are read from what ``main.py`` prints and written to
``runs/repro/laser_vfl_authors/results.json`` as each run ends; run again, it keeps those (same code, people and
seeds) and runs the rest.

Their code imports Weights & Biases, torchvision, imbalanced-learn and ``decorator`` at the top although the
Credit path uses none of them (logging is off with ``--no_wandb``); small stand-ins for those four modules,
written into ``stubs/`` beside their code, let it import without them. Nothing of their code is changed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "papers" / "laser_vfl_credit.toml"
LINE = re.compile(r"\(p_miss_test ([\d.]+|None)\) final_test_acc: ([\d.eE+-]+)(?: \| final_test_f1: ([\d.eE+-]+))?")

STUBS = {
    # Logging is off (--no_wandb); their modules only import it.
    "wandb/__init__.py": "def init(*a, **k):\n    return None\n\n\ndef log(*a, **k):\n    return None\n\n\n"
                         "def finish(*a, **k):\n    return None\n",
    # Image datasets and ResNet: not on the tabular path.
    "torchvision/__init__.py": "from torchvision import datasets, models, transforms  # noqa: F401\n",
    "torchvision/datasets.py": "",
    "torchvision/transforms.py": "",
    "torchvision/models/__init__.py": "from torchvision.models import resnet  # noqa: F401\n\n\n"
                                      "def resnet18(*a, **k):\n    raise RuntimeError('not on the tabular path')\n",
    "torchvision/models/resnet.py": "class BasicBlock:\n    expansion = 1\n",
    "imblearn/__init__.py": "",
    "imblearn/over_sampling.py": "class RandomOverSampler:\n    def __init__(self, *a, **k):\n"
                                 "        raise RuntimeError('not on the Credit path')\n",
    # `decorator.decorator(caller)`: a decorator calling caller(func, *args, **kwargs).
    "decorator.py": "import functools\n\n\ndef decorator(caller):\n    def wrap(func):\n"
                    "        @functools.wraps(func)\n        def inner(*args, **kwargs):\n"
                    "            return caller(func, *args, **kwargs)\n        return inner\n    return wrap\n",
}


def export_split(out: Path, data_dir: str | None) -> dict[str, int]:
    """vflo's Credit people as their loader reads them: the config's held-out test people, the rest to train."""
    from vflo.experiments.config import load_config
    from vflo.seeding import derive_seed

    config = load_config(CONFIG)
    source = config.load_dataset(data_dir)
    layout = config.layout(config.variants[0], derive_seed(config.seed, "layout", 0), source)
    dataset = layout.dataset
    test = np.isin(dataset.ids, layout.held_out("active"))
    X = dataset.X.to_numpy(dtype=np.float64)
    mean, scale = X[~test].mean(axis=0), X[~test].std(axis=0)
    X = (X - mean) / np.where(scale > 0, scale, 1.0)
    out.mkdir(parents=True, exist_ok=True)
    for part, rows in (("train", ~test), ("test", test)):
        np.save(out / f"X_{part}.npy", X[rows].astype(np.float32))
        np.save(out / f"y_{part}.npy", dataset.y[rows].astype(np.int64))
    return {"train": int((~test).sum()), "test": int(test.sum())}


def copy_code(repo: Path, out: Path) -> str:
    """Their code at ``out`` (from a checkout or a git directory); the commit it is."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    git = ["git", "--git-dir", str(repo / ".git" if (repo / ".git").exists() else repo)]
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    archive = subprocess.run([*git, "archive", "HEAD"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
    return commit


def write_stubs(out: Path) -> None:
    for name, text in STUBS.items():
        path = out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def run_one(code: Path, stubs: Path, method: str, p: float, seeds: list[int]) -> list[dict[str, float]]:
    """Their main.py for one method and p_miss over ``seeds``: each seed's test accuracy and F1 at test p_miss = p."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "CUDA_VISIBLE_DEVICES": "",
           "PYTHONPATH": str(stubs)}
    done = subprocess.run([sys.executable, "main.py", "--task_name", "credit", "--method", method, "--p_miss_train",
                           str(p), "--seeds", *map(str, seeds), "--no_wandb"], cwd=code, env=env,
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"their main.py failed for {method} at p_miss {p}:\n{done.stderr[-3000:]}")
    found = []
    for match in LINE.finditer(done.stdout):
        if match.group(1) != "None" and np.isclose(float(match.group(1)), p):
            found.append({"accuracy": float(match.group(2)),
                          "f1": float(match.group(3)) if match.group(3) is not None else float("nan")})
    if len(found) != len(seeds):
        raise RuntimeError(f"expected {len(seeds)} results for {method} at p_miss {p}, read {len(found)}:\n"
                           f"{done.stdout[-3000:]}")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--authors-repo", type=Path, required=True)
    parser.add_argument("--data-dir", default=os.environ.get("VFLO_DATA_DIR"))
    parser.add_argument("--runs", type=Path, default=ROOT / "runs" / "repro")
    parser.add_argument("--methods", nargs="+", default=["local", "svfl", "plug", "laser"])
    parser.add_argument("--p-miss", nargs="+", type=float, default=[0.0, 0.1, 0.5])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    args = parser.parse_args(argv)
    work = args.runs / "laser_vfl_authors"
    # Their loader reads <code>/../data/credit/.
    sizes = export_split(work / "data" / "credit", args.data_dir)
    commit = copy_code(args.authors_repo, work / "code")
    write_stubs(work / "stubs")
    path = work / "results.json"
    results = {"commit": commit, "people": sizes, "seeds": args.seeds, "runs": {}}
    if path.is_file():  # an interrupted queue goes on: runs of the same code, people and seeds are kept
        before = json.loads(path.read_text())
        if all(before.get(k) == results[k] for k in ("commit", "people", "seeds")):
            results["runs"] = before.get("runs", {})
    for method in args.methods:
        for p in args.p_miss:
            if f"{method}/{p:g}" in results["runs"]:
                print(f"{method} p_miss {p:g}: already there, kept", flush=True)
                continue
            t0 = time.perf_counter()
            results["runs"][f"{method}/{p:g}"] = run_one(work / "code", work / "stubs", method, p, args.seeds)
            print(f"{method} p_miss {p:g}: {time.perf_counter() - t0:.0f} s", flush=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(results, indent=1))
            tmp.replace(path)  # each result as it ends, never a half-written file
    return 0


if __name__ == "__main__":
    sys.exit(main())
