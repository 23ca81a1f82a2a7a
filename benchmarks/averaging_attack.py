"""A coordinator asking a noised SplitNN party for its validation activations again and again, to average the noise
away: what it recovers with the bound on releases (one per declared epoch) and a party's budget, against what it
recovered without them.

    python -m benchmarks.averaging_attack [--passes 1000] [--sigma 4] [--epochs 10]

The lab (passive) holds a seeded synthetic table's last columns, noised activations on (σ = ``--sigma``). The
attacker is the coordinator: after ``splitnn.init`` it sends validation forwards of the same people without
training in between, and averages what comes back. Reported: the correlation of its average with the lab's true
clipped activations after each count of passes it got answered, for three parties: no bound and no budget (as
before), the bound alone (``train.max_epochs`` passes), and the bound with the default budget. Nothing here is a
test; the figures go to docs/security.md by hand with the command that made them.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import pandas as pd

from vflo.comm.message import Message
from vflo.data.datasets import Dataset
from vflo.data.scenario import PartySpec, SamplesSpec, ScenarioSpec
from vflo.dp import DEFAULT_BUDGET, PrivacyBudget
from vflo.federation.session import Session
from vflo.federation.simulation import build_federation
from vflo.methods.registry import get_method
from vflo.methods.split_learning import bottom_of


def _data(seed: int = 0):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(600, 10))
    y = (X @ rng.normal(size=10) > 0).astype(np.int64)
    ds = Dataset(name="synthetic", X=pd.DataFrame(X, columns=[f"f{i}" for i in range(10)]), y=y,
                 ids=np.arange(1000, 1600, dtype=np.int64), task="binary", n_classes=2, standin=True,
                 source="seeded synthetic table")
    spec = ScenarioSpec(parties=(PartySpec(name="act", role="active", columns=("f0", "f1", "f2")),
                                 PartySpec(name="pas", role="passive", columns="rest")),
                        samples=SamplesSpec(aligned=1.0))
    layout = spec.build(ds, seed=seed)
    return layout.materialize(test_ids=np.sort(layout.aligned_ids())[:50])


def attack(*, passes: int, sigma: float, epochs: int, bound: bool, budget: PrivacyBudget | None) -> list[dict]:
    """The coordinator's averaging over up to ``passes`` validation passes of 100 people: after each answered pass,
    the correlation of its running mean with the lab's clipped activations."""
    data = _data()
    method = get_method("splitnn")(train={"max_epochs": epochs, "patience": 0},
                                   activation_noise={"noise_multiplier": sigma})
    fed, nodes = build_federation(data, method, seed=0)
    nodes["pas"].privacy.budget = budget
    Session(fed).start(method)
    shared = fed.align(data.train["act"].ids, ["pas"]).ids
    request = {"train_ids": shared[100:], "val_ids": shared[:100]}
    fed.transport.request(Message(sender="act", receiver="pas", kind="splitnn.init", round=max(fed.rounds, 1),
                                  payload=request, run=fed.run_id)).unwrap()
    ctx = nodes["pas"].context
    bottom = bottom_of(ctx)
    if not bound:
        bottom.max_releases = passes + 1
    import torch

    from vflo.methods.split_learning import SplitPart

    x = ctx.part(SplitPart).x["val"]
    with torch.no_grad():
        bottom.net.eval()
        truth = bottom.noise.clipped(bottom.net(x).numpy()) if bottom.noise is not None else bottom.net(x).numpy()
    total = np.zeros_like(truth)
    out: list[dict] = []
    rows = {"rows": np.arange(100), "subset": "val", "training": False, "keep_previous": False, "epoch": 0}
    for n in range(1, passes + 1):
        reply = fed.transport.request(Message(sender="act", receiver="pas", kind="splitnn.forward",
                                              round=max(fed.rounds, 1), payload=rows, run=fed.run_id))
        if reply.error is not None:
            out.append({"passes": n - 1, "refused": reply.error.type})
            break
        total += reply.payload["acts"].reshape(total.shape)
        if n in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000) or n == passes:
            corr = float(np.corrcoef((total / n).ravel(), truth.ravel())[0, 1])
            out.append({"passes": n, "correlation": round(corr, 3)})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passes", type=int, default=1000)
    parser.add_argument("--sigma", type=float, default=4.0)
    parser.add_argument("--epochs", type=int, default=10)
    args = parser.parse_args(argv)
    cases = {"no bound, no budget (before)": (False, None), "bound (max_epochs)": (True, None),
             f"bound + default budget (ε {DEFAULT_BUDGET.epsilon:g})": (True, DEFAULT_BUDGET)}
    results = {name: attack(passes=args.passes, sigma=args.sigma, epochs=args.epochs, bound=bound, budget=budget)
               for name, (bound, budget) in cases.items()}
    json.dump({"command": " ".join(["python -m benchmarks.averaging_attack", *(argv or sys.argv[1:])]),
               "results": results}, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
