"""What each method leaks, and what a defence costs: every method at several defence levels, then every attack
that applies to what each party received (benchmark, not a test).

    python -m benchmarks.privacy.run DATASET [--data-dir ../shared/datasets] [--out runs/privacy] [--quick]
                                             [--serve-repeats 3]

Besides each defence at several noise levels, APC-VFL, SplitNN, VFL-ASP and Entity Augmentation (its guests' IDs
blinded) run end to end at ε 1, 4 and 8 per person (``budget``: every passive party protects what it sends with
``[privacy] epsilon`` alone, calibrated at its setup, and the label holder randomises its labels at the same ε
where the method sends what they shape); their ε is each party's own account.

DATASET is ``breast`` (APC-VFL's Breast Cancer partition), ``credit`` (APC-VFL's Credit partition; Entity
Augmentation on its own paper's Credit partition), ``handwritten`` (configs/privacy/handwritten.toml) or
``credit_files`` (two parties' own files, one with text columns: configs/privacy/credit_files.toml). VFL-ASP
runs on its own paper's second-hop partition of Breast Cancer and Credit. Each run's result is written to
``OUT/DATASET/RUN.json`` as soon as it finishes and a run already there is skipped, so a restart loses one run,
not all. One thread per process. ``benchmarks/privacy/report.py`` turns the results into docs/privacy.md.
Each run scores the test people ``--serve-repeats`` times (the protocol lets the active party ask again), so an
attacker holding several releases of one person can average them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.compare_all import commit
from vflo.dp import GaussianNoise, PrivacyBudget
from vflo.experiments.config import load_config
from vflo.methods.base import Method
from vflo.methods.registry import get_method
from vflo.privacy.evaluate import attack_run
from vflo.seeding import derive_seed, numpy_rng

ROOT = Path(__file__).resolve().parents[2]
LEVELS = (8.0, 4.0, 2.0, 1.0, 0.5)  # noise multipliers σ (clip C = 1): ε from about 1 to 14 at δ = 1e-5
LDP_EPSILONS = (0.5, 1.0, 2.0, 4.0, 8.0)
#: ε per person at each passive party, end to end (its network by DP-SGD and every release, calibrated at its
#: setup from ``[privacy] epsilon`` alone), with the label holder's labels randomised at the same ε.
BUDGETS = (1.0, 4.0, 8.0)
SPLIT_TRAIN = {"batch_size": 128, "max_epochs": 30, "patience": 5}
AE_TRAIN = {"batch_size": 128, "max_epochs": 100, "patience": 10}
# Handwritten's parties hold more columns than APC-VFL's default latents are wide (129 and 520 against 128 and
# 256): its encoders there are undercomplete, which the method allows when asked.
OVERRIDES: dict[str, dict[str, dict[str, Any]]] = {"handwritten": {"apc_vfl": {"overcomplete": False}}}
PARTITIONS = {
    "breast": {"main": "papers/apc_vfl_table2_breast.toml", "vfl_asp": "papers/vfl_asp_table2_breast.toml"},
    "credit": {"main": "papers/apc_vfl_table2_credit.toml", "vfl_asp": "papers/vfl_asp_table2_credit.toml",
               "entity_augmentation": "papers/ea_table3_credit.toml"},
    "handwritten": {"main": "privacy/handwritten.toml"},
    # Parties' own files with text columns (benchmarks/privacy/credit_files.py writes them first).
    "credit_files": {"main": "privacy/credit_files.toml"},
}


@dataclasses.dataclass(frozen=True)
class Run:
    """One method at one defence level on one partition."""

    method: str
    defence: str  # "none", or the setting that carries the noise
    level: float  # σ, or ε for LDP; 0 for no defence
    partition: str
    dataset: str = ""

    @property
    def key(self) -> str:
        return f"{self.method}__{self.defence}__{self.level:g}"

    def build(self) -> Method:
        cls = get_method(self.method)
        settings: dict[str, Any] = {
            "splitnn": {"train": SPLIT_TRAIN}, "apc_vfl": {"train": AE_TRAIN}, "vfedtrans": {"train": AE_TRAIN},
            "rap": {}, "ldp": {}, "fedsvd": {},
            "entity_augmentation": {"train": {"max_epochs": 10, "patience": 0, "validation_fraction": 0.0}},
            "vfl_asp": {"train": SPLIT_TRAIN, "embedding_train": AE_TRAIN},
        }[self.method] | OVERRIDES.get(self.dataset, {}).get(self.method, {})
        method = cls(**settings)
        if self.defence == "none":
            return method
        if self.method == "ldp":
            return cls(dataclasses.replace(method.config, epsilon=self.level))
        if self.defence == "ids":
            return cls(dataclasses.replace(method.config, ids="blinded"))
        if self.defence == "budget":  # the partners calibrate their own side; the label holder randomises
            return cls(dataclasses.replace(method.config, **cls.private_settings(self.level)))
        noise = GaussianNoise(clip=1.0, noise_multiplier=self.level)
        return cls(dataclasses.replace(method.config, **{self.defence: noise}))


def plan(dataset: str) -> Iterator[Run]:
    parts = PARTITIONS[dataset]
    yield Run("splitnn", "none", 0.0, "main")
    for level in LEVELS:
        yield Run("splitnn", "gradient_noise", level, "main")
        yield Run("splitnn", "activation_noise", level, "main")
    for epsilon in BUDGETS:
        yield Run("splitnn", "budget", epsilon, "main")
    yield Run("apc_vfl", "none", 0.0, "main")
    for level in LEVELS:
        yield Run("apc_vfl", "noise", level, "main")
    for epsilon in BUDGETS:
        yield Run("apc_vfl", "budget", epsilon, "main")
    yield Run("fedsvd", "none", 0.0, "main")
    yield Run("vfedtrans", "none", 0.0, "main")
    yield Run("rap", "none", 0.0, "main")
    for level in LEVELS:
        yield Run("rap", "noise", level, "main")
    for epsilon in LDP_EPSILONS:
        yield Run("ldp", "epsilon", epsilon, "main")
    if "vfl_asp" in parts:
        yield Run("vfl_asp", "none", 0.0, "vfl_asp")
        for level in LEVELS:
            yield Run("vfl_asp", "noise", level, "vfl_asp")
        for epsilon in BUDGETS:
            yield Run("vfl_asp", "budget", epsilon, "vfl_asp")
    if "entity_augmentation" in parts:
        yield Run("entity_augmentation", "none", 0.0, "entity_augmentation")
        yield Run("entity_augmentation", "ids", 0.0, "entity_augmentation")
        for epsilon in BUDGETS:
            yield Run("entity_augmentation", "budget", epsilon, "entity_augmentation")


def split_of(config_path: str, data_dir: str | None) -> tuple[Any, str, bool]:
    """The first split of the first variant of a config, as ``vflo run`` cuts it; the dataset's label."""
    config = load_config(ROOT / "configs" / config_path)
    layout = config.layout(config.variants[0], derive_seed(config.seed, "layout", 0), config.load_dataset(data_dir))
    split = config.protocol.splits(layout, numpy_rng(config.seed, "split", 0))[0]
    return (layout.materialize(test_ids=split.test_ids, train_scope=split.train_scope), layout.dataset.label,
            layout.dataset.standin)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dataset", choices=sorted(PARTITIONS))
    parser.add_argument("--data-dir", default=os.environ.get("VFLO_DATA_DIR"))
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "privacy")
    parser.add_argument("--quick", action="store_true", help="no defence levels: each method once")
    parser.add_argument("--retry-failed", action="store_true", help="run again the runs that failed before")
    parser.add_argument("--serve-repeats", type=int, default=3,
                        help="how many times each run scores the test people (every scoring release is attacked)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    folder = args.out / args.dataset
    folder.mkdir(parents=True, exist_ok=True)
    if args.dataset == "credit_files":
        from benchmarks.privacy.credit_files import write

        write(args.data_dir)
    splits: dict[str, Any] = {}
    code = commit()  # recorded with every run, for the page made from them
    for run in plan(args.dataset):
        if args.quick and run.defence != "none":
            continue
        run = dataclasses.replace(run, dataset=args.dataset)
        path = folder / f"{run.key}.json"
        if path.exists() and (args.retry_failed is False or json.loads(path.read_text())["status"] == "ok"):
            continue
        config_path = PARTITIONS[args.dataset][run.partition]
        if config_path not in splits:
            splits[config_path] = split_of(config_path, args.data_dir)
        data, label, standin = splits[config_path]
        started = time.perf_counter()
        try:
            budgets = {p.name: PrivacyBudget(epsilon=run.level) for p in data.parties if p.role == "passive"} \
                if run.defence == "budget" else None
            result = attack_run(run.build(), data, seed=0, serve_repeats=args.serve_repeats, budgets=budgets)
            result["status"] = "ok"
        except Exception as exc:  # recorded: the report says which runs failed and why
            result = {"status": "failed", "error": f"{type(exc).__name__}: {exc}"}
        result |= {"commit": code, "method": run.method, "defence": run.defence, "level": run.level, "dataset": label,
                   "standin": standin, "partition": config_path, "seconds": time.perf_counter() - started,
                   "rows": {p: int(d.n_samples) for p, d in data.train.items()}}
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(result, indent=1, default=float))
        tmp.replace(path)
        print(f"{args.dataset} {run.key}: {result['status']} in {result['seconds']:.1f} s", flush=True)


if __name__ == "__main__":
    main()
