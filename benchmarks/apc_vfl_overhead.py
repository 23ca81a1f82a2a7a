"""APC-VFL's time against the physical limit: the same four autoencoders (the active party's g1, each passive
party's g1, the joint g2, the distilled student g3) trained by a plain PyTorch loop on the same rows, for the
same number of epochs, with the same batch size, optimiser and losses; and where vflo's time goes.

    python -m benchmarks.apc_vfl_overhead [--data-dir ../shared/datasets] [--repeats 3]

Writes runs/bench/apc_vfl_overhead.json and prints a table. Not a test: it measures. Two tables:

* ``clinical``: the newcomer's table of issue 26 in shape (a hospital with 4 columns and 6,500 people, a lab
  with 5 columns for 3,000 of them), generated here;
* ``credit``: APC-VFL's Credit partition (a bank with 5 columns and 20,000 people, a bureau with 18 for 10,000).

vflo's side runs APC-VFL as `vflo run` does (in-process federation, early stopping on a validation share);
the plain side is a bare loop per network (``torch.randperm`` batches, Adam, the loss, the step) with no
validation, for exactly the epochs vflo's run took, so the ratio is vflo's overhead at equal work. Time is
attributed to: the training steps, per-epoch validation passes, best-epoch snapshots, the alignment and the
exchange, the classifier on the student's representation, and the data preparation before training
(standardisation, in ``Layout.materialize``).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from vflo.data.datasets import Dataset, load_dataset
from vflo.data.layout import FederatedData
from vflo.data.scenario import PartySpec, SamplesSpec, ScenarioSpec
from vflo.federation.session import Session
from vflo.federation.simulation import build_federation
from vflo.methods.apc_vfl import APCVFL, APCPart
from vflo.nn import train as train_module

ROOT = Path(__file__).resolve().parents[1]


def clinical_dataset(seed: int = 0) -> Dataset:
    """6,500 people, 9 columns (4 demographic, 5 measurements) and a binary outcome that depends on both."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    n = 6500
    X = rng.normal(size=(n, 9))
    logit = X[:, :4] @ rng.normal(size=4) + X[:, 4:] @ rng.normal(size=5) * 1.5
    y = (logit + rng.normal(size=n) > 0).astype(np.int64)
    columns = [f"demo{i}" for i in range(4)] + [f"lab{i}" for i in range(5)]
    return Dataset(name="clinical_generated", X=pd.DataFrame(X, columns=columns), y=y, ids=np.arange(n),
                   task="binary", n_classes=2, standin=True, source="generated for this benchmark")


def partition(name: str, data_dir: str | None) -> tuple[FederatedData, float]:
    """The federated data and the seconds its preparation (standardisation included) took."""
    if name == "clinical":
        ds = clinical_dataset()
        spec = ScenarioSpec(parties=(PartySpec(name="hospital", role="active", columns=tuple(ds.columns[:4])),
                                     PartySpec(name="lab", columns="rest")),
                            samples=SamplesSpec(aligned=3000, test_active_only=500, test_seed=0))
        test_from = "active_only"
    else:
        ds = load_dataset("credit_default", data_dir)
        spec = ScenarioSpec(parties=(PartySpec(name="bank", role="active", columns=("X3", "X5", "X7", "X9", "X11")),
                                     PartySpec(name="bureau", columns="rest")),
                            samples=SamplesSpec(total=20500, active=20000, aligned=10000, test_active_only=500,
                                                test_seed=0))
        test_from = "active_only"
    t0 = time.perf_counter()
    layout = spec.build(ds, seed=0)
    data = layout.materialize(test_ids=layout.held_out(test_from))
    return data, time.perf_counter() - t0


class Clock:
    """Seconds spent inside wrapped functions, by label."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def wrap(self, owner: Any, attr: str, label: str) -> Iterator[None]:
        original = getattr(owner, attr)

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[label] = self.seconds.get(label, 0.0) + time.perf_counter() - t0

        setattr(owner, attr, timed)
        try:
            yield
        finally:
            setattr(owner, attr, original)


def run_vflo(data: FederatedData, seed: int) -> dict[str, Any]:
    method = APCVFL()
    fed, nodes = build_federation(data, method, seed=seed)
    Session(fed).start(method)
    clock = Clock()
    trainer = train_module.ModuleTrainer
    with clock.wrap(trainer, "validation_loss", "validation passes"), \
            clock.wrap(trainer, "snapshot", "best-epoch snapshots"), \
            clock.wrap(trainer, "train_step", "training steps"):
        t0 = time.perf_counter()
        method.fit(fed)
        fed.flush()
        total = time.perf_counter() - t0
    passive = next(n for n in nodes.values() if n.info.role == "passive")
    assert passive.context is not None
    g1_passive = passive.context.part(APCPart).g1  # the passive party's own encoder, kept in its part
    assert g1_passive is not None
    histories = {"g1_active": method.g1_active_.history, "g1_passive": g1_passive.history,
                 "g2_joint": method.teacher_.history, "g3_student": method.student_.history}
    Session(fed).teardown()
    laps = dict(method.timings_)
    networks = sum(sum(e["seconds"] for e in h.epochs) for h in histories.values())
    return {"fit_seconds": total, "stages": laps, "epochs": {k: len(h) for k, h in histories.items()},
            "network_seconds": networks, "inside_networks": clock.seconds,
            "classifier_and_rest": total - sum(laps.values()),
            "n_active": data.train[data.active].n_samples,
            "n_aligned": int(method.n_aligned_)}


def plain_autoencoder(in_dim: int, hidden: tuple[int, ...], generator: torch.Generator) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=generator)))
    widths = [in_dim, *hidden]
    enc: list[nn.Module] = []
    for a, b in pairwise(widths):
        enc += [nn.Linear(a, b), nn.SELU()]
    mirror = list(reversed(hidden))
    dec: list[nn.Module] = []
    for a, b in pairwise(mirror):
        dec += [nn.Linear(a, b), nn.SELU()]
    dec.append(nn.Linear(mirror[-1], in_dim))
    return nn.Sequential(*enc), nn.Sequential(*dec)


def plain_fit(X: np.ndarray, hidden: tuple[int, ...], epochs: int, *, batch: int = 128, lr: float = 1e-3,
              target: np.ndarray | None = None, mask: np.ndarray | None = None, weight: float = 0.01,
              rows: int | None = None) -> float:
    """A bare training loop; ``rows`` (vflo's training share after its validation split) rows are used."""
    g = torch.Generator().manual_seed(0)
    encoder, decoder = plain_autoencoder(X.shape[1], hidden, g)
    params = [*encoder.parameters(), *decoder.parameters()]
    opt = torch.optim.Adam(params, lr=lr, foreach=True)
    n = rows or len(X)
    x = torch.tensor(X[:n], dtype=torch.float32)
    z_t = None if target is None else torch.tensor(target[:n], dtype=torch.float32)
    m_t = None if mask is None else torch.tensor(mask[:n], dtype=torch.float32)
    t0 = time.perf_counter()
    for _ in range(epochs):
        for idx in torch.randperm(n, generator=g).split(batch):
            xb = x[idx]
            z = encoder(xb)
            loss_rows = ((xb - decoder(z)) ** 2).sum(dim=1)
            if z_t is not None and m_t is not None:
                loss_rows = loss_rows + weight * m_t[idx] * ((z - z_t[idx]) ** 2).sum(dim=1)
            loss = loss_rows.mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    return time.perf_counter() - t0


def run_plain(data: FederatedData, epochs: dict[str, int]) -> dict[str, float]:
    cfg = APCVFL().config
    keep = 1.0 - cfg.train.validation_fraction
    active = data.train[data.active]
    passive = next(d for name, d in data.train.items() if name != data.active)
    shared = np.intersect1d(active.ids, passive.ids)
    out = {
        "g1_active": plain_fit(active.X, cfg.active_encoder, epochs["g1_active"], rows=round(keep * active.n_samples)),
        "g1_passive": plain_fit(passive.X, cfg.passive_encoder, epochs["g1_passive"],
                                rows=round(keep * passive.n_samples)),
    }
    joint = np.random.default_rng(0).normal(size=(len(shared), cfg.active_encoder[-1] + cfg.passive_encoder[-1]))
    out["g2_joint"] = plain_fit(joint, cfg.joint_encoder, epochs["g2_joint"], rows=round(keep * len(shared)))
    target = np.random.default_rng(1).normal(size=(active.n_samples, cfg.joint_encoder[-1]))
    mask = np.isin(active.ids, shared)
    out["g3_student"] = plain_fit(active.X, cfg.student_encoder, epochs["g3_student"], target=target, mask=mask,
                                  weight=cfg.distill_weight, rows=round(keep * active.n_samples))
    out["g3_without_distillation"] = plain_fit(active.X, cfg.student_encoder, epochs["g3_student"],
                                               rows=round(keep * active.n_samples))
    # The same classifier on a representation as wide as the student's, for the whole pipeline's limit.
    from vflo.nn.estimators import make_estimator

    rep = np.random.default_rng(2).normal(size=(active.n_samples, cfg.student_encoder[-1])).astype(np.float32)
    t0 = time.perf_counter()
    make_estimator(cfg.classifier, task=data.task, n_classes=data.n_classes, seed=0).fit(rep, active.require_labels())
    out["classifier"] = time.perf_counter() - t0
    return out


NOT_NETWORKS = ("g3_without_distillation", "classifier")


def measure(name: str, data_dir: str | None, repeats: int) -> dict[str, Any]:
    torch.set_num_threads(1)
    plain_fit(np.zeros((256, 4)), (8,), 2)  # warm-up: neither side pays torch's first-call costs
    runs = []
    for seed in range(repeats):
        data, prepare = partition(name, data_dir)
        vflo = run_vflo(data, seed)
        plain = run_plain(data, vflo["epochs"])
        networks_plain = sum(v for k, v in plain.items() if k not in NOT_NETWORKS)
        runs.append({"prepare_seconds": prepare, "vflo": vflo, "plain": plain,
                     "ratio_fit": vflo["fit_seconds"] / (networks_plain + plain["classifier"]),
                     "ratio_networks": vflo["network_seconds"] / networks_plain})
    return {"table": name, "runs": runs,
            "median_ratio_fit": float(np.median([r["ratio_fit"] for r in runs])),
            "median_ratio_networks": float(np.median([r["ratio_networks"] for r in runs]))}


def report(result: dict[str, Any], emit: Callable[[str], None]) -> None:
    for r in result["runs"]:
        v, p = r["vflo"], r["plain"]
        emit(f"{result['table']}: {v['n_active']} active rows, {v['n_aligned']} shared; epochs {v['epochs']}")
        nets = sum(x for k, x in p.items() if k not in NOT_NETWORKS)
        emit(f"  the four networks: vflo {v['network_seconds']:.2f} s, plain loop {nets:.2f} s -> "
             f"{r['ratio_networks']:.2f}x; the whole fit: vflo {v['fit_seconds']:.2f} s, plain networks and the same "
             f"classifier {nets + p['classifier']:.2f} s -> {r['ratio_fit']:.2f}x")
        emit(f"  where vflo's time went: stages {json.dumps({k: round(x, 2) for k, x in v['stages'].items()})}; "
             f"inside the networks {json.dumps({k: round(x, 2) for k, x in v['inside_networks'].items()})}; "
             f"classifier and the rest {v['classifier_and_rest']:.2f} s; data preparation "
             f"(standardisation) {r['prepare_seconds']:.2f} s")
        emit(f"  distillation: plain g3 {p['g3_student']:.2f} s with it, {p['g3_without_distillation']:.2f} s "
             "without")
    emit(f"{result['table']}: median ratio {result['median_ratio_networks']:.2f}x (the four networks), "
         f"{result['median_ratio_fit']:.2f}x (the whole fit)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tables", nargs="+", default=["clinical", "credit"], choices=["clinical", "credit"])
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench" / "apc_vfl_overhead.json")
    args = parser.parse_args()
    results = [measure(t, args.data_dir, args.repeats) for t in args.tables]
    for result in results:
        report(result, print)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    from benchmarks.compare_all import commit

    args.out.write_text(json.dumps({"threads": 1, "commit": commit(), "results": results}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
