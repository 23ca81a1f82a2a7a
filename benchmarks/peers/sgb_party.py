"""One party of SecretFlow's SGB (secretflow-lite) on the split benchmarks/peers/sgb.py exported: run in the
SecretFlow environment (benchmarks/peers/install_secretflow.sh), one process per party, SecretFlow's production
mode without Ray (``sf.init(cluster_config=..., ray_mode=False)``), over its own gRPC, no TLS.

    python benchmarks/peers/sgb_party.py --party bank|bureau --ports 61001,61002 --data DIR --out FILE
        [--trees 10] [--depth 5] [--rate 0.3] [--bins 32] [--key-bits 2048]

The bank holds ``bank_{train,test}.npy`` and the labels ``y_train.npy`` (``y_test.npy`` is read after training, to
score); the bureau ``bureau_{train,test}.npy``: each loads only its own files, in its own process. Both train the
same model (SGB is one program both parties run); the bank writes ``--out``: the seconds of ``train`` alone, and
the test accuracy and ROC AUC of the revealed scores. This file imports SecretFlow and runs only in its environment;
vflo never imports it.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--party", choices=["bank", "bureau"], required=True)
    parser.add_argument("--ports", required=True, help="the bank's port,the bureau's port")
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--trees", type=int, default=10)
    parser.add_argument("--depth", type=int, default=5)
    parser.add_argument("--rate", type=float, default=0.3)
    parser.add_argument("--bins", type=int, default=32)
    parser.add_argument("--key-bits", type=int, default=2048)
    args = parser.parse_args()

    import numpy as np
    import secretflow as sf
    import spu
    from secretflow.data import FedNdarray, PartitionWay
    from secretflow.ml.boost.sgb_v import Sgb

    bank_port, bureau_port = (int(p) for p in args.ports.split(","))
    cluster = {"parties": {"bank": {"address": f"127.0.0.1:{bank_port}"},
                           "bureau": {"address": f"127.0.0.1:{bureau_port}"}},
               "self_party": args.party}
    sf.init(cluster_config=cluster, ray_mode=False, logging_level="warning", job_name="vflo-peers-sgb")
    bank, bureau = sf.PYU("bank"), sf.PYU("bureau")
    data = args.data

    def load(name: str):  # runs at the party that owns the file
        return lambda: np.load(data / f"{name}.npy")

    def columns(part: str) -> FedNdarray:
        return FedNdarray(partitions={bank: bank(load(f"bank_{part}"))(), bureau: bureau(load(f"bureau_{part}"))()},
                          partition_way=PartitionWay.VERTICAL)

    label = FedNdarray(partitions={bank: bank(load("y_train"))()}, partition_way=PartitionWay.VERTICAL)
    heu = sf.HEU({"sk_keeper": {"party": "bank"}, "evaluators": [{"party": "bureau"}], "mode": "PHEU",
                  "he_parameters": {"schema": "ou", "key_pair": {"generate": {"bit_size": args.key_bits}}},
                  "encoding": {"cleartext_type": "DT_I32", "encoder": "IntegerEncoder",
                               "encoder_args": {"scale": 1}}},
                 spu.FieldType.FM128)
    params = {"num_boost_round": args.trees, "max_depth": args.depth, "learning_rate": args.rate,
              "sketch_eps": 1.0 / args.bins, "objective": "logistic", "reg_lambda": 1.0, "gamma": 0.0,
              "rowsample_by_tree": 1.0, "colsample_by_tree": 1.0, "base_score": 0.0, "seed": 0,
              # Every tree federated, as vflo grows them by default (active_trees = 0): SGB grows its first at
              # the label holder alone unless told otherwise.
              "first_tree_with_label_holder_feature": False}
    x_train = columns("train")
    sf.wait([p for p in x_train.partitions.values()])
    started = time.perf_counter()
    model = Sgb(heu).train(params, x_train, label)
    last = model.trees[-1]  # SecretFlow runs lazily: done once the last tree's splits and leaf weights exist
    sf.wait([*last.split_tree_dict.values(), last.leaf_weight])
    seconds = time.perf_counter() - started
    scores = model.predict(columns("test"), bank)  # both run it (one program); the scores stay at the bank
    if args.party == "bank":
        from sklearn.metrics import roc_auc_score

        y = np.load(data / "y_test.npy")
        held = scores.partitions[bank] if isinstance(scores, FedNdarray) else scores
        p = np.asarray(sf.reveal(held)).reshape(-1)
        args.out.write_text(json.dumps({"fit_seconds": seconds, "accuracy": float(np.mean((p >= 0.5) == y)),
                                        "roc_auc": float(roc_auc_score(y, p)), "trees": args.trees,
                                        "secretflow": sf.__version__}))
    sf.shutdown()


if __name__ == "__main__":
    main()
