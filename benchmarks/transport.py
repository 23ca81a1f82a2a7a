"""Transport and SplitNN overhead benchmark (not a test: prints figures, writes runs/bench/transport.json).

    python benchmarks/transport.py [--data-dir ../shared/datasets] [--repeats 3]

Measures
1. codec encode + decode time for a 1 MiB float32 array;
2. per-message overhead of LocalTransport (a tiny request/reply round trip through the codec and ledger);
3. one SplitNN epoch on Credit (20000 rows, 10000 aligned, APC-VFL's partition and architecture, batch 128)
   against the same network trained in one process without messages.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from vflo.comm.codec import decode, encode
from vflo.comm.local import LocalTransport
from vflo.comm.message import INT, Message, Payload
from vflo.data.datasets import load_dataset
from vflo.data.scenario import PartySpec, SamplesSpec, ScenarioSpec
from vflo.federation.coordinator import Coordinator
from vflo.federation.simulation import party_node, run_method
from vflo.methods.base import Method, MethodConfig, handles
from vflo.methods.splitnn import SplitNN
from vflo.nn.models import mlp
from vflo.nn.train import TrainConfig, adam, as_tensor, run_epochs
from vflo.party.node import NodeContext
from vflo.roles import PartyInfo
from vflo.seeding import numpy_rng, torch_generator

ACTIVE_COLUMNS = ("X3", "X5", "X7", "X9", "X11")


def timeit(fn, repeats: int, number: int) -> float:  # type: ignore[no-untyped-def]
    """Best of ``repeats`` runs of ``number`` calls, in seconds per call."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - t0) / number)
    return best


def codec_figures(repeats: int) -> dict[str, float]:
    arr = np.random.default_rng(0).normal(size=(1 << 18,)).astype(np.float32)  # 1 MiB
    msg = Message("a", "b", "bench", 1, {"x": arr})
    frame = encode(msg)
    return {
        "payload_bytes": arr.nbytes,
        "frame_bytes": len(frame),
        "encode_ms": timeit(lambda: encode(msg), repeats, 50) * 1e3,
        "decode_ms": timeit(lambda: decode(frame), repeats, 50) * 1e3,
        "encode_decode_ms": timeit(lambda: decode(encode(msg)), repeats, 50) * 1e3,
    }


class Ping(Method):
    """Benchmark-only method: the passive party answers at once."""

    name = "ping"
    Config = MethodConfig

    @handles("ping.ping", served="any time (the benchmark's echo)", n=INT)
    def ping(self, ctx: NodeContext, payload: Payload) -> Payload:
        return {"n": payload["n"]}

    def fit(self, fed: Coordinator) -> None:  # pragma: no cover
        pass

    def predict(self, fed: Coordinator, ids: np.ndarray) -> np.ndarray:  # pragma: no cover
        return ids


def transport_figures(repeats: int) -> dict[str, float]:
    a, p = PartyInfo("a", "active"), PartyInfo("p", "passive")
    nodes = {"a": party_node(a, peers=(a, p)), "p": party_node(p, peers=(a, p))}
    transport = LocalTransport(nodes)
    method = Ping()
    nodes["p"].install(method, seed=0, parties=(a, p))
    nodes["a"].install(method, seed=0, parties=(a, p))
    fed = Coordinator(node=nodes["a"], transport=transport, parties=(a, p), seed=0, task="binary", n_classes=2)
    per_round = timeit(lambda: fed.request("p", "ping.ping", {"n": 1}), repeats, 2000)
    big = np.zeros((128, 256), np.float32)  # one SplitNN activation batch

    def echo_big() -> None:
        transport.request(Message("a", "p", "ping.ping", 1, {"n": 1, "x": big}))  # refused by the schema, still a trip

    return {
        "tiny_round_trip_us": per_round * 1e6,
        "batch_128x256_round_trip_us": timeit(echo_big, repeats, 500) * 1e6,
    }


def credit_split(data_dir: str | None):  # type: ignore[no-untyped-def]
    ds = load_dataset("credit_default", data_dir)
    spec = ScenarioSpec(
        parties=(PartySpec(name="bank", role="active", columns=ACTIVE_COLUMNS),
                 PartySpec(name="bureau", columns="rest")),
        samples=SamplesSpec(total=20000, active=20000, aligned=10000),
    )
    layout = spec.build(ds, seed=0)
    return layout.materialize(test_ids=np.sort(layout.aligned_ids())[:500], train_scope="aligned")


class Joined(nn.Module):
    """The SplitNN network in one process: the same bottoms on column blocks, the same top."""

    def __init__(self, bottoms: list[nn.Module], top: nn.Module, widths: list[int]) -> None:
        super().__init__()
        self.bottoms = nn.ModuleList(bottoms)
        self.top = top
        self.cuts = np.cumsum([0, *widths]).tolist()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = [b(x[:, s:e]) for b, s, e in zip(self.bottoms, self.cuts[:-1], self.cuts[1:], strict=True)]
        return self.top(torch.cat(parts, dim=1))


def splitnn_figures(data_dir: str | None, repeats: int) -> dict[str, float]:
    data = credit_split(data_dir)
    train = TrainConfig(batch_size=128, max_epochs=1, patience=0, validation_fraction=0.0, lr=1e-3)
    cfg = {"active_bottom": (64, 128), "passive_bottom": (128, 256), "top": (256, 256), "activation": "selu",
           "train": train}
    split_epochs, bytes_per_epoch, rounds = [], 0, 0
    for r in range(repeats):
        method = SplitNN(**cfg)
        out = run_method(method, data, seed=r)
        split_epochs.append(method.history_.epochs[0]["seconds"])
        by_kind = out.ledger.by_kind()
        bytes_per_epoch = by_kind["splitnn.forward"]["bytes"] + by_kind["split.backward"]["bytes"]
        rounds = out.ledger.summary().rounds

    # the same network and batches in one process
    act, pas = data.train["bank"], data.train["bureau"]
    ids = np.sort(act.ids)
    X = np.hstack([act.subset(ids).X, pas.subset(ids).X])
    y = as_tensor(act.subset(ids).require_labels(), dtype=torch.long)
    x = as_tensor(X)
    central_epochs = []
    for r in range(repeats):
        model = Joined(
            [mlp(act.n_features, (64, 128), None, activation="selu", generator=torch_generator(r, "a")),
             mlp(pas.n_features, (128, 256), None, activation="selu", generator=torch_generator(r, "p"))],
            mlp(128 + 256, (256, 256), 2, activation="selu", generator=torch_generator(r, "t")),
            [act.n_features, pas.n_features],
        )
        opt = adam(model.parameters(), train)

        def step(idx: np.ndarray, model: nn.Module = model, opt: torch.optim.Optimizer = opt) -> float:
            opt.zero_grad()
            loss = F.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            return float(loss.detach())

        hist = run_epochs(n_train=len(ids), config=train, rng=numpy_rng(r), train_step=step)
        central_epochs.append(hist.epochs[0]["seconds"])
    s, c = statistics.median(split_epochs), statistics.median(central_epochs)
    return {
        "aligned_train_rows": len(ids),
        "splitnn_epoch_s": s,
        "central_epoch_s": c,
        "ratio": s / c,
        "splitnn_epoch_mb": bytes_per_epoch / 1e6,
        "splitnn_rounds_total": rounds,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("runs/bench/transport.json"))
    args = parser.parse_args(argv)
    default_threads = torch.get_num_threads()
    results: dict[str, object] = {
        "codec_1MiB": codec_figures(args.repeats),
        "local_transport": transport_figures(args.repeats),
    }
    # Both thread settings: with two OpenMP threads the in-process network gains from parallel matmuls, and
    # the Python work between SplitNN's per-batch messages lets the worker thread fall asleep and wake again.
    for threads in sorted({1, default_threads}):
        torch.set_num_threads(threads)
        results[f"splitnn_credit_epoch_{threads}_threads"] = splitnn_figures(args.data_dir, args.repeats)
    torch.set_num_threads(default_threads)
    for section, figures in results.items():
        if isinstance(figures, dict):
            print(f"[{section}]")
            for k, v in figures.items():
                print(f"  {k:28s} {v:,.4f}" if isinstance(v, float) else f"  {k:28s} {v}")
        else:
            print(f"{section}: {figures}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
