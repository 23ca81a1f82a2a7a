"""docs/privacy.md and its plots, generated from the runs of benchmarks/privacy/run.py (no figure typed by hand).

    python -m benchmarks.privacy.report [--runs runs/privacy] [--out docs]
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DATASETS = ("breast", "credit", "handwritten")
KNOWN = ("0.01", "0.05", "0.1")
UNDEFENDED_X = 1000.0
DEFENCE_NAMES = {"none": "none", "gradient_noise": "gradient noise (labels)",
                 "activation_noise": "activation noise (features)", "noise": "upload noise (features)",
                 "epsilon": "Laplace per value (LDP)", "ids": "blinded IDs"}
CROSSES = {
    "splitnn": "passive -> active: activations of every training row, every epoch; active -> passive: their "
               "gradients",
    "apc_vfl": "passive -> active: one upload of g1 latents of the aligned rows",
    "fedsvd": "parties -> server: masked blocks P X Q; server -> active: U', Σ (the active unmasks U)",
    "vfedtrans": "as FedSVD, then the active trains on U Σ",
    "rap": "clients -> server: one upload of projected rows X A; label owner -> server: transformed labels",
    "ldp": "clients -> server: one upload of Laplace-noised rows",
    "vfl_asp": "second hop -> server: masked rows P X2; server -> first hop: U', Σ (E = U Σ); then SplitNN "
               "between the first hop and the active party",
    "entity_augmentation": "guests -> host: activations and IDs of their own entities; host -> guests: gradients",
}


def load(runs: Path) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for dataset in DATASETS:
        files = sorted((runs / dataset).glob("*.json"))
        if files:
            out[dataset] = [json.loads(f.read_text()) for f in files]
    return out


def metric_of(run: dict[str, Any]) -> tuple[str, float]:
    metrics = run.get("metrics", {})
    for name in ("f1_macro", "accuracy", "rmse"):
        if name in metrics:
            return name, float(metrics[name])
    return "-", math.nan


def epsilon_of(run: dict[str, Any]) -> float:
    stats = run.get("stats", {})
    values = [v for k, v in stats.items() if k.startswith("epsilon") and k != "epsilon_per_value"]
    return float(max(values)) if values else math.inf


def best_reconstruction(run: dict[str, Any], share: str, *, own: bool = False) -> tuple[float, str]:
    """The best R² over receivers and decoders at ``share`` known rows, and which receiver; with ``own``, what
    that receiver reached from its own features alone (no message)."""
    best, where = -math.inf, ""
    for receiver, attacks in run.get("features", {}).items():
        for name, result in attacks.items():
            if not name.endswith(f"@{share}") or "r2_mean" not in result:
                continue
            if name.startswith("own features") != own:
                continue
            if result["r2_mean"] > best:
                best, where = result["r2_mean"], receiver
    return best, where


def label_attack(run: dict[str, Any]) -> dict[str, float]:
    """The strongest label inference over passive parties: AUCs, and model completion's lift over the
    majority class."""
    out: dict[str, float] = {}
    for result in run.get("labels", {}).values():
        for key, value in result.items():
            out[key] = max(out.get(key, -math.inf), value)
    return out


def fmt(value: float, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if math.isinf(value):
        return "∞" if value > 0 else "-"
    return f"{value:.{digits}f}"


def undefended_table(runs: list[dict[str, Any]]) -> list[str]:
    rows = ["| method | metric | what crosses, to whom | feature R² with 1 / 5 / 10 % known rows (receiver) "
            "[from its own features alone] | "
            "label AUC norm / direction | model completion 10 / 40 / 100 labels [own features alone] (majority) | "
            "IDs of others exposed |", "|---|---|---|---|---|---|---|"]
    for run in sorted((r for r in runs if r["defence"] == "none" and r["status"] == "ok"), key=lambda r: r["method"]):
        name, value = metric_of(run)
        recon = [best_reconstruction(run, s) for s in KNOWN]
        receiver = next((w for _, w in recon if w), "")
        alone = [best_reconstruction(run, s, own=True)[0] for s in KNOWN]
        labels = label_attack(run)
        completion = " / ".join(f"{fmt(labels.get(f'completion_{k}', math.nan))} "
                                f"[{fmt(labels.get(f'completion_raw_{k}', math.nan))}]" for k in (10, 40, 100))
        exposed = [f"{k}: {v['exposed_fraction']:.0%}" for k, v in run.get("identity", {}).items()
                   if v["outside_people"] > 0]
        rows.append(
            f"| {run['method']} | {name} {fmt(value, 3)} | {CROSSES.get(run['method'], '')} | "
            f"{' / '.join(fmt(r) for r, _ in recon)} ({receiver or '-'}) [{' / '.join(fmt(a) for a in alone)}] | "
            f"{fmt(labels.get('norm_auc', math.nan))} / {fmt(labels.get('direction_auc', math.nan))} | "
            f"{completion} ({fmt(labels.get('majority', math.nan))}) | {', '.join(exposed) or 'none'} |")
    return rows


def curves(runs: list[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Per (method, defence): the undefended run and every defended level, by ε (most private last)."""
    base = {r["method"]: r for r in runs if r["defence"] == "none" and r["status"] == "ok"}
    out: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for run in runs:
        if run["defence"] in ("none", "ids") or run["status"] != "ok":
            continue
        out[(run["method"], run["defence"])].append(run)
    for key, group in out.items():
        group.sort(key=epsilon_of, reverse=True)
        if key[0] in base:
            group.insert(0, base[key[0]])
    return dict(out)


def defended_table(runs: list[dict[str, Any]]) -> list[str]:
    rows = ["| method | defence | σ (LDP: ε per value) | ε (δ = 1e-5) | metric | feature R², 5 % known | "
            "label AUC direction | completion, 40 labels |", "|---|---|---|---|---|---|---|---|"]
    for (method, _), group in sorted(curves(runs).items()):
        for run in group:
            name, value = metric_of(run)
            labels = label_attack(run)
            level = fmt(run["level"], 1) if run["level"] else "-"
            rows.append(f"| {method} | {DEFENCE_NAMES[run['defence']]} | {level} | {fmt(epsilon_of(run), 1)} | "
                        f"{name} {fmt(value, 3)} | "
                        f"{fmt(best_reconstruction(run, '0.05')[0])} | {fmt(labels.get('direction_auc', math.nan))} | "
                        f"{fmt(labels.get('completion_40', math.nan))} |")
    return rows


def plot(dataset: str, runs: list[dict[str, Any]], out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = curves(runs)
    if not groups:
        return []
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for (method, defence), group in sorted(groups.items()):
        eps = [epsilon_of(r) if math.isfinite(epsilon_of(r)) else UNDEFENDED_X for r in group]
        label = f"{method}: {DEFENCE_NAMES[defence]}"
        left.plot(eps, [metric_of(r)[1] for r in group], marker="o", label=label)
        if defence == "gradient_noise":
            attack = [label_attack(r).get("direction_auc", math.nan) for r in group]
        else:
            attack = [best_reconstruction(r, "0.05")[0] for r in group]
        right.plot(eps, attack, marker="o", label=label)
    for ax, title in ((left, "utility (test metric)"), (right, "attack success: feature R² (5 % known rows); "
                                                               "labels: direction AUC")):
        ax.set_xscale("log")
        ax.set_xlabel(f"ε at δ = 1e-5 (log; the undefended run drawn at {UNDEFENDED_X:g})")
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
    left.set_ylabel(metric_of(group[0])[0])
    right.legend(fontsize=7, loc="best")
    fig.tight_layout()
    path = out / "privacy" / f"{dataset}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [f"![privacy-utility on {dataset}](privacy/{dataset}.png)", ""]


def claims(data: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The papers' privacy claims, checked against these runs."""
    lines = []
    for runs in data.values():
        base = {r["method"]: r for r in runs if r["defence"] == "none" and r["status"] == "ok"}
        label = runs[0]["dataset"]
        if "apc_vfl" in base:
            r2, _ = best_reconstruction(base["apc_vfl"], "0.05")
            alone, _ = best_reconstruction(base["apc_vfl"], "0.05", own=True)
            verdict = "holds" if r2 < max(0.1, alone + 0.05) else "does not hold"
            lines.append(f"- **APC-VFL, {label}**: does one latent upload resist a receiver that knows 5 % of the "
                         f"sender's rows? Best decoder R² = {fmt(r2)}, against {fmt(alone)} from the receiver's own "
                         f"features alone: the claim {verdict} here.")
        for m in ("fedsvd", "vfedtrans"):
            if m in base:
                r2, _ = best_reconstruction(base[m], "0.05")
                alone, _ = best_reconstruction(base[m], "0.05", own=True)
                lines.append(f"- **{m}, {label}**: the active party unmasks U and holds U Σ, a linear map of every "
                             f"party's columns; with 5 % known rows a decoder reaches R² = {fmt(r2)} on the "
                             f"passive party's features ({fmt(alone)} from its own features alone).")
        if "vfl_asp" in base:
            r2, _ = best_reconstruction(base["vfl_asp"], "0.05")
            alone, _ = best_reconstruction(base["vfl_asp"], "0.05", own=True)
            lines.append(f"- **VFL-ASP, {label}**: the first hop's embeddings E = U Σ with 5 % known second-hop "
                         f"rows: R² = {fmt(r2)} on the second hop's features, against {fmt(alone)} from the first "
                         "hop's own features alone (the masks hide the rows from the server, not from the party "
                         "that holds E).")
        if "rap" in base:
            r2, _ = best_reconstruction(base["rap"], "0.05")
            paper = [a for a in base["rap"].get("features", {}).values() if "rap_known_means" in a]
            means = max((a["rap_known_means"]["relative_error"] for a in paper), default=math.nan)
            blind = min((a["rap_no_knowledge"]["relative_error"] for a in paper), default=math.nan)
            lines.append(f"- **RAP, {label}**: the server with 5 % of a client's rows and their IDs (the paper's "
                         f"collusion case): R² = {fmt(r2)}. The paper's attacks without known rows leave relative "
                         f"errors of {fmt(blind)} (random guess of the inverse) and {fmt(means)} (known column "
                         "means), where 1 means nothing beyond the mean was learnt: the projection resists them, "
                         "as the paper says.")
        if "splitnn" in base and label_attack(base["splitnn"]):
            labels = label_attack(base["splitnn"])
            lines.append(f"- **SplitNN, {label}**: a passive party's direction scoring of its gradients reaches AUC "
                         f"{fmt(labels.get('direction_auc', math.nan))}; model completion with 40 labels "
                         f"{fmt(labels.get('completion_40', math.nan))}, against "
                         f"{fmt(labels.get('completion_raw_40', math.nan))} from its own features alone (majority "
                         f"class {fmt(labels.get('majority', math.nan))}).")
        clear = base.get("entity_augmentation")
        blinded = next((r for r in runs if r["method"] == "entity_augmentation" and r["defence"] == "ids"
                        and r["status"] == "ok"), None)
        if clear is not None:
            shares = [v["exposed_fraction"] for k, v in clear.get("identity", {}).items() if v["outside_people"]]
            after = [v["exposed_fraction"] for v in (blinded or {}).get("identity", {}).values() if v["outside_people"]]
            if shares:
                lines.append(f"- **Entity Augmentation, {label}** (\"no alignment\"): with IDs in the clear, the share "
                             f"of people exposed to a party that does not hold them: up to {max(shares):.0%}; with "
                             f"ids = 'blinded': up to {max(after, default=0):.0%}.")
            else:
                lines.append(f"- **Entity Augmentation, {label}**: in this partition the host labels every guest's "
                             "people, so IDs in the clear expose no one beyond the intersection; where guests hold "
                             "people the host does not, they reach the host in the clear and 'blinded' keeps them "
                             "away (tests/test_entity_augmentation.py).")
    return lines


def render(data: dict[str, list[dict[str, Any]]], out: Path) -> str:
    lines = [
        "# What each method leaks, measured", "",
        "Generated by `python -m benchmarks.privacy.report` from the runs of `python -m benchmarks.privacy.run "
        "DATASET` (breast, credit, handwritten); nothing here is typed by hand. Every attack reads only the "
        "messages its attacking party received in a real run (`vflo.privacy.views`), never a method's state.", "",
        "**Attacks** (`vflo.privacy`), each by an honest-but-curious party:", "",
        "- *Feature reconstruction* by the receiver of a representation: it knows the raw features of 1, 5 or "
        "10 % of the sender's rows, fits a decoder (ridge, or an MLP) from message rows to feature rows, and "
        "decodes the rest. Success: mean per-feature R² on the other rows (1 = recovered, 0 = no better than "
        "the known rows' mean). With no known rows the best guess is the prior mean (R² 0). Beside it, in "
        "brackets, the same decoder on the receiver's own features for those people: what it could infer "
        "without any message, from columns that correlate with the sender's.",
        "- *Label inference* at a passive party from the gradients it receives (SplitNN, VFL-ASP's teacher, "
        "Entity Augmentation): norm and direction scoring (Li et al., ICLR 2022; AUC, binary tasks) and "
        "passive model completion with 10, 40 or 100 known labels (Fu et al., USENIX Security 2022; accuracy "
        "on the other rows, beside the same head on the passive party's own raw features, which it could fit "
        "without any protocol, and the majority class).",
        "- *Identity exposure*: the share of a sender's people that a receiver does not hold whose IDs reached "
        "it in the clear.", "",
        "**Defences** (method settings, off by default): each row a party sends is clipped to L2 norm 1 and "
        "gets N(0, σ²) noise (`vflo.dp.GaussianNoise`); ε at δ = 1e-5 is the exact Gaussian-DP conversion, "
        "composed over the releases of a person's row (SplitNN: once per epoch trained). LDP adds Laplace noise "
        "per value; its ε composes over a row's values.", "",
    ]
    for dataset, runs in data.items():
        label = runs[0]["dataset"] + (" [STAND-IN DATA]" if runs[0].get("standin") else "")
        failed = [r for r in runs if r["status"] != "ok"]
        seconds = sum(r.get("seconds", 0.0) for r in runs)
        lines += [f"## {label}", "",
                  f"{len(runs)} runs ({len(failed)} failed) in {seconds / 60:.1f} min; partitions: "
                  f"{', '.join(sorted({r['partition'] for r in runs}))}.", "",
                  "### Without defence", "", *undefended_table(runs), ""]
        defended = defended_table(runs)
        if len(defended) > 2:
            lines += ["### Privacy and utility", "", *plot(dataset, runs, out), *defended, ""]
        if failed:
            lines += ["### Failed runs", "", *(f"- {r['method']} ({r['defence']} {r['level']:g}): {r['error']}"
                                              for r in failed), ""]
    lines += ["## The papers' claims, here", "", *claims(data), ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=Path, default=ROOT / "runs" / "privacy")
    parser.add_argument("--out", type=Path, default=ROOT / "docs")
    args = parser.parse_args()
    data = load(args.runs)
    if not data:
        raise SystemExit(f"no runs under {args.runs}: run python -m benchmarks.privacy.run DATASET first")
    args.out.mkdir(parents=True, exist_ok=True)
    text = render(data, args.out)
    (args.out / "privacy.md").write_text(text)
    print(f"wrote {args.out / 'privacy.md'} from {sum(len(v) for v in data.values())} runs")


if __name__ == "__main__":
    main()
