"""What RAP's server can reconstruct, and what its projections preserve (not a test).

    python -m benchmarks.rap_privacy [--data-dir ../shared/datasets]

On UCI Credit Card split between four clients: for each client's projected block, the relative
reconstruction error of each of the paper's server attacks (vflo.privacy.attacks); for a one-feature
client, the known-mean attack with and without RAP's pseudo feature; and k-means agreement, nearest
neighbour recall and distance distortion between the projected and the original rows
(vflo.privacy.distance). Writes runs/bench/rap_privacy.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from vflo.data.datasets import load_dataset
from vflo.data.partydata import PartyData
from vflo.data.scenario import PartySpec, SamplesSpec, ScenarioSpec
from vflo.dp import RowNoise
from vflo.methods.rap import ClientTransform
from vflo.privacy.attacks import attack_report, known_means
from vflo.privacy.distance import distortion, kmeans_agreement, neighbour_recall

# The client's keyed noise for the pseudo feature (its secret key stands in for a party's own).
PSEUDO = RowNoise(b"pseudo-feature-key")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--rows", type=int, default=10000)
    parser.add_argument("--out", type=Path, default=Path("runs/bench/rap_privacy.json"))
    args = parser.parse_args(argv)
    ds = load_dataset("credit_default", args.data_dir)
    spec = ScenarioSpec(parties=(PartySpec(name="owner", role="active", columns=()),
                                 *(PartySpec(name=f"client{i}", share=1.0) for i in range(4))),
                        samples=SamplesSpec(total=args.rows))
    data = spec.build(ds, seed=0).materialize()
    rng = np.random.default_rng(0)
    attacks = {}
    blocks = []
    for i in range(4):
        party = data.train[f"client{i}"]
        t = ClientTransform.fit(party, rng, other=False, pseudo=True, max_condition=10.0)
        Xt = t.project(party, PSEUDO)
        blocks.append((party.X.astype(np.float64), Xt.astype(np.float64)))
        for n_known in (party.n_features, 10 * party.n_features):
            attacks[f"client{i} ({party.n_features} features), {n_known} known rows"] = attack_report(
                Xt, party.X, n_known=n_known, seed=i)
    # The mean-based scale estimate needs a feature whose mean is not zero: take the raw credit limit (X1).
    limit = ds.X["X1"].to_numpy(np.float64)[: args.rows, None]
    one = PartyData(party="one", ids=np.arange(len(limit)), X=limit, columns=("X1",))
    one_feature = {}
    for pseudo in (False, True):
        t = ClientTransform.fit(one, rng, other=False, pseudo=pseudo)
        one_feature["with pseudo feature" if pseudo else "without pseudo feature"] = known_means(
            t.project(one, PSEUDO), one.X)
    X = np.hstack([b[0] for b in blocks])
    Xt = np.hstack([b[1] for b in blocks])
    low, high = distortion(X, Xt)
    distance = {"kmeans_ari_k8": kmeans_agreement(X, Xt, k=8), "nn_recall_at_10": neighbour_recall(X, Xt, k=10),
                "distance_ratio_p5": low, "distance_ratio_p95": high}
    result = {"attacks": attacks, "one_feature_known_mean": one_feature, "distance": distance}
    print(json.dumps(result, indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    from benchmarks.compare_all import commit

    result["commit"] = commit()  # the code that ran it (with "+changes" where src/ differed from it)
    args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
