"""VFL-ASP's Table 4 ablation: is the federated-SVD embedding E as informative as the raw data it came from?

    python -m benchmarks.reproduce.vfl_asp_ablation configs/papers/vfl_asp_table2_breast.toml \
        [--data-dir DIR] [--out runs/repro/vfl_asp_ablation_breast] [--runs N] [--quick]

On the rows the first-hop party P1 shares with the second-hop party P2 (P1 n P2), one model per input:
E (the embedding P1 receives from the one-mask federated SVD, computed by the real protocol), P2's raw
columns, P1's raw columns, and both pooled (centralized). Nobody holds labels for these rows in the
federation (the active party does not hold them), so this study takes them from the dataset: it is a
simulation-only check of the embedding, as in the paper. Each run draws its own scenario layout and a
stratified 80/20 split of P1 n P2; the model is the config's ``local`` MLP. E is computed once per layout
from every P1 n P2 row (an unsupervised transform, no labels involved).

Writes results.csv (one row per run and input), summary.csv and report.md under --out.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.model_selection import train_test_split

from vflo.data.datasets import get_spec, load_dataset
from vflo.errors import ConfigError, VfloError
from vflo.experiments.config import ExperimentConfig, load_config
from vflo.experiments.output import atomic_dir
from vflo.experiments.report import markdown_table, t_halfwidth
from vflo.federation.session import Session
from vflo.federation.simulation import build_federation
from vflo.methods.vfl_asp import VFLASP, VFLASPConfig
from vflo.metrics import compute_metrics
from vflo.nn.estimators import EstimatorConfig, make_estimator
from vflo.seeding import derive_seed, numpy_rng

logger = logging.getLogger("vfl_asp_ablation")
INPUTS = ("embedding", "second_hop", "first_hop", "centralized")


def embeddings(config: ExperimentConfig, data_dir: str | None, run: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """One layout: the oracle labels of P1 n P2, and E (from the federated protocol) and the raw blocks."""
    variant = config.variants[0]
    dataset = load_dataset(config.dataset.name, data_dir)
    layout = variant.spec.build(dataset, seed=derive_seed(config.seed, "layout", run))
    data = layout.materialize()
    entry = next(e for e in config.methods if e.method_cls is VFLASP)
    asp: VFLASPConfig = entry.config
    # Only the extraction is needed here: the embedding autoencoder is not part of this study.
    method = VFLASP(replace(asp, embedding_train=replace(asp.embedding_train, max_epochs=1)))
    fed, nodes = build_federation(data, method, seed=derive_seed(config.seed, "ablation", run))
    Session(fed).start(method)
    fed.request(asp.first_hop, "asp.extract", {"second_hop": asp.second_hop})
    shared, E = nodes[asp.first_hop].context.state["asp.embeddings"]
    position = {v: i for i, v in enumerate(dataset.ids.tolist())}
    y = dataset.y[[position[v] for v in shared.tolist()]]
    x1 = data.train[asp.first_hop].subset(shared).X
    x2 = data.train[asp.second_hop].subset(shared).X
    return y, {"embedding": E, "second_hop": x2, "first_hop": x1, "centralized": np.hstack([x1, x2])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", help="a VFL-ASP Table 2 config (its scenario, its local MLP and its vfl_asp entry)")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--runs", type=int, default=None, help="default: the config's protocol.runs")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    try:
        config = load_config(args.config, quick=args.quick)
        runs = args.runs or getattr(config.protocol, "runs", 1)
        local = next((e for e in config.methods if e.label == "local"), None)
        if local is None or not isinstance(local.config, EstimatorConfig):
            raise ConfigError(f"{args.config} needs a [[methods]] entry named 'local' (the model to train)")
        task = get_spec(config.dataset.name).task
        out = args.out or Path("runs/repro") / config.name.replace("table2", "ablation")
        rows = []
        t0 = time.perf_counter()
        for run in range(runs):
            y, inputs = embeddings(config, args.data_dir, run)
            idx = np.arange(len(y))
            rng = numpy_rng(config.seed, "ablation-split", run)
            train, test = train_test_split(idx, test_size=0.2, stratify=y, random_state=int(rng.integers(2**31)))
            for name in INPUTS:
                X = np.asarray(inputs[name], dtype=np.float32)
                model = make_estimator(local.config, task=task, n_classes=int(y.max()) + 1,
                                       seed=derive_seed(config.seed, "ablation-model", run))
                model.fit(X[train], y[train])
                scores = model.predict_scores(X[test])
                acc = compute_metrics(task, y[test], scores)["accuracy"]
                rows.append({"run": run, "input": name, "columns": X.shape[1], "rows": len(y), "accuracy": acc})
                logger.info("run %d %s (%d columns): accuracy %.4f", run, name, X.shape[1], acc)
        results = pd.DataFrame(rows)
        summary = results.groupby("input", sort=False)["accuracy"].agg(
            mean="mean", std="std", ci95=lambda v: t_halfwidth(list(v)), runs="count").reset_index()
        with atomic_dir(out, overwrite=True) as tmp:
            results.to_csv(tmp / "results.csv", index=False)
            summary.to_csv(tmp / "summary.csv", index=False)
            (tmp / "report.md").write_text(
                f"# {config.name}: VFL-ASP Table 4 ablation on P1 n P2 ({results['rows'].iloc[0]} rows)\n\n"
                + markdown_table(["input", "accuracy", "± 95% CI", "runs"],
                                 [[r.input, f"{r.mean:.4f}", f"{r.ci95:.4f}", r.runs] for r in summary.itertuples()])
                + f"\n\n{runs} runs in {time.perf_counter() - t0:.1f} s\n", encoding="utf-8")
        print(f"wrote {out}/ (results.csv, summary.csv, report.md)")
        print(summary.to_string(index=False))
    except VfloError as exc:
        print(f"vfl_asp_ablation: error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
