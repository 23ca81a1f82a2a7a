"""docs/privacy.md and its plots, generated from the runs of benchmarks/privacy/run.py and of the privacy axis
(vflo compare on configs/privacy/axis_*.toml), no figure typed by hand.

    python -m benchmarks.compare_all --configs configs/privacy/axis_*.toml --runs runs/privacy_axis
    for d in breast credit handwritten; do python -m benchmarks.privacy.run $d; done
    python -m benchmarks.privacy.report [--runs runs/privacy] [--axis runs/privacy_axis] [--out docs]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DATASETS = ("breast", "credit", "handwritten", "credit_files")
KNOWN = ("0.01", "0.05", "0.1")
UNDEFENDED_X = 1000.0
DEFENCE_NAMES = {"none": "none", "gradient_noise": "gradient noise (labels)",
                 "activation_noise": "activation noise (features)", "noise": "upload noise (features)",
                 "epsilon": "Laplace per value (LDP)", "ids": "blinded IDs",
                 "budget": "end to end at a target ε per party"}
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


#: A message leaks beyond what the receiver already holds when the attack's R² on it exceeds, by more than this,
#: the same decoder's R² on the receiver's own features for the same people and the same known rows.
R2_MARGIN = 0.05
#: Label scoring separates the classes when its AUC (better orientation) exceeds chance, 0.5, by more than this.
AUC_MARGIN = 0.1
#: Model completion on the trained bottom teaches the party something when its accuracy beats the same head on
#: another input (the party's raw features, or its first activations) by more than this.
ACCURACY_MARGIN = 0.05
#: RAP's attacks without known rows learnt nothing beyond the mean when their relative error is at least this
#: (1: the error of guessing the mean).
NOTHING_LEARNT_ERROR = 0.95


@dataclasses.dataclass(frozen=True)
class Reconstruction:
    """The strongest feature reconstruction at one share of known rows, over the flows and decoders asked for:
    R² from one release per person, from the releases averaged per person, and the same decoder on the same known
    rows reading the receiver's own features (its baseline)."""

    r2: float
    averaged: float
    own: float
    flow: str
    decoder: str
    releases: int
    same_rows: bool  # the attack and its baseline were fitted on the same known rows

    @property
    def best(self) -> float:
        return max(self.r2, self.averaged) if not math.isnan(self.averaged) else self.r2

    @property
    def baseline(self) -> float:
        """The own-features R², or 0 (the known rows' mean) where the receiver holds none of those features."""
        return 0.0 if math.isnan(self.own) else self.own

    @property
    def receiver(self) -> str:
        return self.flow.split(":")[0]


def flow_kind(key: str, attacks: dict[str, Any]) -> str:
    return str(attacks.get("flow", {}).get("kind", key.rpartition(": ")[2]))


def reconstruction(run: dict[str, Any], share: str, *, flows: Callable[[str, str], bool] | None = None
                   ) -> Reconstruction | None:
    """The best R² over the flows (``flows(key, kind)``; every flow without it) and decoders at ``share`` known
    rows, one release or averaged, with that flow's and decoder's own-features baseline; None where none."""
    best: Reconstruction | None = None
    for key, attacks in run.get("features", {}).items():
        if flows is not None and not flows(key, flow_kind(key, attacks)):
            continue
        for name, result in attacks.items():
            if not name.endswith(f"@{share}") or " " in name or "r2_mean" not in result:
                continue
            decoder = name.partition("@")[0]
            averaged = attacks.get(f"averaged {name}", {})
            own = attacks.get(f"own features {name}", {})
            found = Reconstruction(
                r2=float(result["r2_mean"]), averaged=float(averaged.get("r2_mean", math.nan)),
                own=float(own.get("r2_mean", math.nan)), flow=key, decoder=decoder,
                releases=int(attacks.get("flow", {}).get("releases_max", 1)),
                same_rows=all(r.get("known_digest") == result.get("known_digest") for r in (averaged, own) if r))
            if best is None or found.best > best.best:
                best = found
    return best


def leaks_beyond_own(rec: Reconstruction | None) -> bool | None:
    """The one test of every feature verdict here: the attack beats its own-features baseline by more than
    :data:`R2_MARGIN`."""
    return None if rec is None else rec.best - rec.baseline > R2_MARGIN


def leak_cell(rec: Reconstruction | None) -> str:
    verdict = leaks_beyond_own(rec)
    if rec is None or verdict is None:
        return "-"
    return f"{'yes' if verdict else 'no'} ({rec.best - rec.baseline:+.2f})"


def recon_cell(rec: Reconstruction | None) -> str:
    """R² of one release (averaged over releases) [own features, same decoder and known rows]."""
    if rec is None:
        return "-"
    return f"{fmt(rec.r2)} ({fmt(rec.averaged)}) [{fmt(rec.own)}]"


def label_attack(run: dict[str, Any]) -> dict[str, float]:
    """Label inference by the passive party it succeeds best at: the AUCs of the party with the highest direction
    AUC, the completion figures (final bottom, first activations, raw features, majority) of the party with the
    best completion, each set from one party."""
    parties = list(run.get("labels", {}).values())
    if not parties:
        return {}

    def key(name: str) -> Callable[[dict[str, float]], float]:
        return lambda r: r.get(name, -math.inf)

    out: dict[str, float] = {}
    by_auc = max(parties, key=key("direction_auc"))
    out |= {k: v for k, v in by_auc.items() if "auc" in k}
    by_completion = max(parties, key=lambda r: max((v for k, v in r.items() if re.fullmatch(r"completion_\d+", k)),
                                                   default=-math.inf))
    out |= {k: v for k, v in by_completion.items() if "auc" not in k}
    return out


def separates(auc: float) -> bool | None:
    """The one test of every label-scoring verdict here: AUC (better orientation) above 0.5 + :data:`AUC_MARGIN`."""
    return None if math.isnan(auc) else auc > 0.5 + AUC_MARGIN


def fmt(value: float | None, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if math.isinf(value):
        return "∞" if value > 0 else "-"
    return f"{value:.{digits}f}"


def auc_cell(labels: dict[str, float]) -> str:
    return (f"{fmt(labels.get('norm_auc', math.nan))} / {fmt(labels.get('direction_auc', math.nan))} "
            f"({fmt(labels.get('norm_auc_positive', math.nan))} / "
            f"{fmt(labels.get('direction_auc_positive', math.nan))})")


def completion_cell(labels: dict[str, float], ks: tuple[int, ...] = (10, 40, 100)) -> str:
    return " / ".join(f"{fmt(labels.get(f'completion_{k}', math.nan))} "
                      f"({fmt(labels.get(f'completion_first_{k}', math.nan))}) "
                      f"[{fmt(labels.get(f'completion_raw_{k}', math.nan))}]" for k in ks)


def undefended_table(runs: list[dict[str, Any]]) -> list[str]:
    rows = ["| method | metric | what crosses, to whom | feature R² with 1 / 5 / 10 % known rows: one release "
            "(averaged over releases) [receiver's own features, same decoder and known rows] | flow attacked at 5 % "
            "(decoder; most releases of one person) | beyond own features at 5 % "
            f"(margin {R2_MARGIN:g}) | label AUC norm / direction, better orientation (label 1 first) | model "
            "completion 10 / 40 / 100 labels: final bottom (first activations) [own raw features] {majority} | "
            "IDs of others exposed |", "|---|---|---|---|---|---|---|---|---|"]
    for run in sorted((r for r in runs if r["defence"] == "none" and r["status"] == "ok"), key=lambda r: r["method"]):
        name, value = metric_of(run)
        recon = [reconstruction(run, s) for s in KNOWN]
        at5 = recon[KNOWN.index("0.05")]
        flow = f"{at5.flow} ({at5.decoder}; {at5.releases})" if at5 is not None else "-"
        labels = label_attack(run)
        exposed = [f"{k}: {v['exposed_fraction']:.0%}" for k, v in run.get("identity", {}).items()
                   if v["outside_people"] > 0]
        rows.append(
            f"| {run['method']} | {name} {fmt(value, 3)} | {CROSSES.get(run['method'], '')} | "
            f"{' / '.join(recon_cell(r) for r in recon)} | {flow} | {leak_cell(at5)} | {auc_cell(labels)} | "
            f"{completion_cell(labels)} {{{fmt(labels.get('majority', math.nan))}}} | "
            f"{', '.join(exposed) or 'none'} |")
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


@dataclasses.dataclass(frozen=True)
class Protection:
    """What a defence noises: the flows of those message kinds (features), or the gradients (labels)."""

    what: str  # "features", "labels", or "both" (the flows of those kinds, and the gradients)
    kinds: frozenset[str]
    flow: str  # the flow, in words, for the table

    def protects(self, key: str, kind: str) -> bool:
        return self.what in ("features", "both") and any(k in self.kinds for k in kind.split("+"))


#: The flows each (method, defence) noises, from the methods' settings (vflo.dp): everything else is not protected
#: by that defence and is reported apart.
PROTECTS: dict[tuple[str, str], Protection] = {
    ("splitnn", "activation_noise"): Protection("features", frozenset({"splitnn.forward", "split.activations"}),
                                                "passive -> active activations"),
    ("splitnn", "gradient_noise"): Protection("labels", frozenset({"split.backward"}),
                                              "active -> passive gradients"),
    ("apc_vfl", "noise"): Protection("features", frozenset({"apc.encode_aligned", "apc.encode_serve"}),
                                     "passive -> active latents"),
    ("rap", "noise"): Protection("features", frozenset({"rap.project", "rap.project_serve"}),
                                 "client -> server projected rows"),
    ("ldp", "epsilon"): Protection("features", frozenset({"rap.project", "rap.project_serve"}),
                                   "client -> server noised rows"),
    ("vfl_asp", "noise"): Protection("features", frozenset({"svd.block", "svd.solve"}),
                                     "second hop -> server masked rows, and the U Σ computed from them"),
    ("splitnn", "budget"): Protection("both", frozenset({"splitnn.forward", "split.activations"}),
                                      "passive -> active activations (its bottom by DP-SGD); active -> passive "
                                      "gradients (labels randomised)"),
    ("apc_vfl", "budget"): Protection("features", frozenset({"apc.encode_aligned", "apc.encode_serve"}),
                                      "passive -> active latents (its encoder by DP-SGD)"),
    ("vfl_asp", "budget"): Protection("both", frozenset({"svd.block", "svd.solve", "splitnn.forward",
                                                         "split.activations"}),
                                      "second hop -> server noised masked rows; first hop -> active activations "
                                      "(its encoder and bottom by DP-SGD); active -> first hop gradients (labels "
                                      "randomised)"),
    ("entity_augmentation", "budget"): Protection("both", frozenset({"ea.forward", "ea.validate",
                                                                     "split.activations"}),
                                                  "guests -> host activations (their networks by DP-SGD, IDs "
                                                  "blinded); host -> guests gradients (labels randomised)"),
}


def protected_attack(run: dict[str, Any], protection: Protection) -> tuple[float, str]:
    """The attack on the flow a defence protects, as the curve's y value and as a table cell."""
    if protection.what == "labels":
        labels = label_attack(run)
        return (labels.get("direction_auc", math.nan),
                f"label AUC norm / direction {auc_cell(labels)}; completion, 40 labels: "
                f"{completion_cell(labels, (40,))}")
    rec = reconstruction(run, "0.05", flows=protection.protects)
    labels = label_attack(run) if protection.what == "both" else {}
    said = (f"; label AUC norm / direction {auc_cell(labels)}; completion, 40 labels: "
            f"{completion_cell(labels, (40,))}") if labels else ""
    if rec is None:
        return math.nan, "-" + said
    return rec.best, (f"feature R², 5 % known: {recon_cell(rec)}, most releases of one person {rec.releases}; "
                      f"beyond own features: {leak_cell(rec)}{said}")


def unprotected_attacks(run: dict[str, Any], protection: Protection) -> str:
    """The attacks on the flows the defence does not noise."""
    parts = []
    rec = reconstruction(run, "0.05", flows=lambda key, kind: not protection.protects(key, kind))
    if rec is not None:
        parts.append(f"feature R², 5 % known ({rec.flow}): {recon_cell(rec)}")
    labels = label_attack(run)
    if protection.what == "features" and labels:
        parts.append(f"label AUC norm / direction {auc_cell(labels)}; completion, 40 labels: "
                     f"{completion_cell(labels, (40,))}")
    return "; ".join(parts) or "-"


def scopes(runs: list[dict[str, Any]]) -> list[str]:
    """What each defended method's ε covers, as the method itself states it in the run's results."""
    said = sorted({(r["method"], r["epsilon_scope"]) for r in runs
                   if r["status"] == "ok" and r.get("epsilon_scope")})
    # End to end, each party's own account says what it covers.
    said += sorted({(f"{r['method']}, {party}'s own account", scope) for r in runs
                    if r["status"] == "ok" for party, scope in r.get("account_scopes", {}).items() if scope})
    if not said:
        return []
    return ["What each ε covers (the method's or the party's own statement, recorded with its run):", "",
            *(f"- {method}: {scope}." for method, scope in said), ""]


def defended_table(runs: list[dict[str, Any]]) -> list[str]:
    rows = ["| method | defence | σ (LDP: ε per value) | ε (δ = 1e-5), as the method or the parties' accounts "
            "report it | metric | flow the "
            "defence protects | attack on that flow | attacks on flows this defence does not protect |",
            "|---|---|---|---|---|---|---|---|"]
    for (method, defence), group in sorted(curves(runs).items()):
        protection = PROTECTS.get((method, defence))
        for run in group:
            name, value = metric_of(run)
            level = (f"target ε {run['level']:g}" if run["defence"] == "budget" else fmt(run["level"], 1)) \
                if run["level"] else "-"
            if protection is None:
                cells = "(unknown to this report) | - | -"
            else:
                cells = (f"{protection.flow} | {protected_attack(run, protection)[1]} | "
                         f"{unprotected_attacks(run, protection)}")
            rows.append(f"| {method} | {DEFENCE_NAMES[run['defence']]} | {level} | {fmt(epsilon_of(run), 1)} | "
                        f"{name} {fmt(value, 3)} | {cells} |")
    return rows


def plot(dataset: str, runs: list[dict[str, Any]], out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = {k: v for k, v in curves(runs).items() if k in PROTECTS}
    if not groups:
        return []
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for (method, defence), group in sorted(groups.items()):
        eps = [epsilon_of(r) if math.isfinite(epsilon_of(r)) else UNDEFENDED_X for r in group]
        label = f"{method}: {DEFENCE_NAMES[defence]}"
        left.plot(eps, [metric_of(r)[1] for r in group], marker="o", label=label)
        right.plot(eps, [protected_attack(r, PROTECTS[(method, defence)])[0] for r in group], marker="o", label=label)
    for ax, title in ((left, "utility (test metric)"), (right, "attack on the protected flow: feature R² (5 % known "
                                                               "rows,\nbest of one release and averaged); labels: "
                                                               "direction AUC")):
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


def reconstruction_claim(rec: Reconstruction | None) -> tuple[bool | None, str]:
    """The verdict of :func:`leaks_beyond_own` on ``rec`` and the numbers it rests on."""
    if rec is None:
        return None, "no flow with enough rows to attack"
    source = (f"averaged over up to {rec.releases} releases of a person" if rec.best > rec.r2
              else "one release per person")
    own = (f"{fmt(rec.own)} from the receiver's own features with the same decoder and known rows"
           if not math.isnan(rec.own) else "0 (the known rows' mean: the receiver holds none of these features)")
    verdict = leaks_beyond_own(rec)
    return verdict, (f"best decoder ({rec.decoder}, {source}, flow {rec.flow}) R² = {fmt(rec.best)}, against {own}: "
                     f"a difference of {rec.best - rec.baseline:+.2f}, {'more' if verdict else 'no more'} than the "
                     f"margin of {R2_MARGIN:g}")


def claims(data: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The papers' privacy claims, checked against these runs: every verdict computed with the tables' tests."""
    lines = []
    for runs in data.values():
        base = {r["method"]: r for r in runs if r["defence"] == "none" and r["status"] == "ok"}
        label = runs[0]["dataset"]
        if "apc_vfl" in base:
            verdict, numbers = reconstruction_claim(reconstruction(base["apc_vfl"], "0.05"))
            if verdict is not None:
                lines.append(f"- **APC-VFL, {label}**: does one latent upload resist a receiver that knows 5 % of "
                             f"the sender's rows? The {numbers}: the claim {'does not hold' if verdict else 'holds'} "
                             "here.")
        for m in ("fedsvd", "vfedtrans"):
            if m in base:
                verdict, numbers = reconstruction_claim(reconstruction(base[m], "0.05"))
                if verdict is not None:
                    lines.append(f"- **{m}, {label}**: the active party unmasks U and holds U Σ; with 5 % known rows "
                                 f"the {numbers}: what it holds {'leaks' if verdict else 'does not leak'} the "
                                 "passive party's features beyond its own, by this test.")
        if "vfl_asp" in base:
            rec = reconstruction(base["vfl_asp"], "0.05", flows=lambda key, kind: kind == "svd.solve")
            verdict, numbers = reconstruction_claim(rec)
            if verdict is not None:
                lines.append(f"- **VFL-ASP, {label}**: the first hop's embeddings E = U Σ with 5 % known second-hop "
                             f"rows: the {numbers}: E {'reveals' if verdict else 'does not reveal'} the second "
                             "hop's features to the first hop beyond its own, by this test (the masks are there to "
                             "hide the rows from the server, whose view is not attacked here).")
        if "rap" in base:
            rec = reconstruction(base["rap"], "0.05", flows=lambda key, kind: kind == "rap.project")
            verdict, numbers = reconstruction_claim(rec)
            paper = [a for a in base["rap"].get("features", {}).values() if "rap_known_means" in a]
            means = min((a["rap_known_means"]["relative_error"] for a in paper), default=math.nan)
            blind = min((a["rap_no_knowledge"]["relative_error"] for a in paper), default=math.nan)
            resists = not math.isnan(means) and min(means, blind) >= NOTHING_LEARNT_ERROR
            if verdict is not None and paper:
                lines.append(
                    f"- **RAP, {label}**: the server with 5 % of a client's rows and their IDs (the paper's collusion "
                    f"case): the {numbers}: it {'learns' if verdict else 'does not learn'} the client's features. The "
                    f"paper's attacks without known rows leave relative errors of {fmt(blind)} (random guess of the "
                    f"inverse) and {fmt(means)} (known column means), where 1 is the error of guessing the mean: "
                    + (f"both at least {NOTHING_LEARNT_ERROR:g}, so the projection resists them, as the paper says."
                       if resists else f"not both at least {NOTHING_LEARNT_ERROR:g}, so the projection does not resist "
                          "them."))
        if "splitnn" in base and label_attack(base["splitnn"]):
            labels = label_attack(base["splitnn"])
            auc = labels.get("direction_auc", math.nan)
            leak = separates(auc)
            final, raw, first = (labels.get(f"completion{s}_40", math.nan) for s in ("", "_raw", "_first"))
            text = (f"- **SplitNN, {label}**: a passive party's direction scoring of its gradients reaches AUC "
                    f"{fmt(auc)} (better orientation; 0.5 is chance): "
                    f"{'more than' if leak else 'within'} {AUC_MARGIN:g} {'above' if leak else 'of'} chance, so the "
                    f"gradients "
                    f"{'reveal' if leak else 'do not reveal'} the labels, by this test.")
            if not math.isnan(final):
                gain = final - raw
                text += (f" Model completion with 40 labels on its final bottom: {fmt(final)}, against {fmt(raw)} "
                         f"from its own raw features with the same labels ({gain:+.2f}, margin {ACCURACY_MARGIN:g}: "
                         f"the trained bottom {'adds' if gain > ACCURACY_MARGIN else 'adds nothing'} beyond what the "
                         f"party could learn alone), {fmt(first)} from its first activations, majority class "
                         f"{fmt(labels.get('majority', math.nan))}.")
            lines.append(text)
        clear = base.get("entity_augmentation")
        blinded = next((r for r in runs if r["method"] == "entity_augmentation" and r["defence"] == "ids"
                        and r["status"] == "ok"), None)
        if clear is not None:
            shares = [v["exposed_fraction"] for k, v in clear.get("identity", {}).items() if v["outside_people"]]
            after = [v["exposed_fraction"] for v in (blinded or {}).get("identity", {}).values() if v["outside_people"]]
            if shares:
                lines.append(f"- **Entity Augmentation, {label}** (\"no alignment\"): with IDs in the clear, the share "
                             f"of people exposed to a party that does not hold them: up to {max(shares):.0%}; with "
                             f"ids = 'blinded': " + (f"up to {max(after):.0%}." if after else "not measured."))
            else:
                lines.append(f"- **Entity Augmentation, {label}**: in this partition no sender of IDs holds people "
                             f"its receiver does not (0 such people for each of the {len(clear.get('identity', {}))} "
                             "pairs that exchanged IDs), so IDs in the clear expose no one beyond the intersection, "
                             "and this run cannot show what 'blinded' IDs keep away.")
    return lines


#: The privacy axis's runs (``vflo compare`` on these configs, by ``benchmarks.compare_all --configs``), in order.
AXIS = ("axis_breast", "axis_credit")


def axis_section(runs: Path, out: Path | None = None) -> list[str]:
    """Which method at each ε, end to end: vflo compare's own privacy table and sentences (the same code as its
    report), from the runs of configs/privacy/axis_*.toml under ``runs``."""
    from types import SimpleNamespace

    import pandas as pd

    from vflo.experiments.compare_privacy import privacy_cells, privacy_figure, privacy_sentences, privacy_table
    from vflo.experiments.compare_report import PRIVACY_READING

    lines: list[str] = []
    for name in AXIS:
        results = runs / name / "results.json"
        if not results.is_file():
            continue
        meta = json.loads(results.read_text())
        rows = pd.DataFrame(meta["rows"])
        bases = sorted(set(rows[rows["axis"] == "aligned"]["value"].astype(str)))
        hops = sorted(set(rows[rows["axis"] == "second_hop"]["value"].astype(str)))
        if len(bases) != 1 or len(hops) > 1:
            raise SystemExit(f"{results}: the privacy axis reads against one base cell per layout, found aligned "
                             f"{bases} and second hop {hops}")
        comparison = SimpleNamespace(rows=rows, metric=meta["metric"],
                                     base_cell={"axis": "aligned", "value": bases[0]},
                                     base_hop_cell={"axis": "second_hop", "value": hops[0]} if hops else {})
        cells = privacy_cells(comparison)  # type: ignore[arg-type]
        header, body = privacy_table(comparison, cells)  # type: ignore[arg-type]
        stamp = runs / f"{name}.commit"
        code = f"the code of commit {stamp.read_text().strip()}" if stamp.is_file() else "code of an unrecorded commit"
        ok = rows[rows["status"] == "ok"]
        figure = []
        for layout, suffix, what in (("star", "", ""), ("second_hop", "_second_hop", ", with a second-hop party")):
            fig = privacy_figure(comparison, cells, "aligned", meta["dataset"], layout)  # type: ignore[arg-type]
            if fig is not None and out is not None:
                import matplotlib.pyplot as plt

                (out / "privacy").mkdir(parents=True, exist_ok=True)
                fig.savefig(out / "privacy" / f"{name}{suffix}.png", dpi=110)
                plt.close(fig)
                figure += [f"![privacy and utility{what}, {meta['dataset']}](privacy/{name}{suffix}.png)", ""]
        lines += [f"### {meta['dataset']}" + (" [STAND-IN DATA]" if meta.get("standin") else ""), "",
                  f"`vflo compare configs/privacy/{name}.toml` ({len(ok)} method runs, {meta['seconds'] / 60:.1f} min, "
                  f"{code}; {meta['test_people']} test people every party holds).", "", *figure,
                  *(f"- {line}" for line in privacy_sentences(comparison, cells)), "",  # type: ignore[arg-type]
                  "| " + " | ".join(header) + " |", "|" + "---|" * len(header),
                  *("| " + " | ".join(row) + " |" for row in body), ""]
    if not lines:
        return []
    return ["## Which method at each ε, end to end", "", PRIVACY_READING, "", *lines]


def render(data: dict[str, list[dict[str, Any]]], out: Path, axis: Path | None = None) -> str:
    lines = [
        "# What each method leaks, measured", "",
        "Generated by `python -m benchmarks.privacy.report` from the runs of `python -m benchmarks.privacy.run "
        "DATASET` (breast, credit, handwritten, credit_files) and of `vflo compare` on configs/privacy/axis_*.toml; "
        "nothing here is typed by hand. Every attack reads only what its "
        "attacking party holds in a real run (`vflo.privacy.views`): the messages it received and, for model "
        "completion, the activations it sent itself; never a method's state.", "",
        "**Attacks** (`vflo.privacy`), each by an honest-but-curious party:", "",
        "- *Feature reconstruction* by the receiver of a representation, per flow (sender and message kind): it "
        "knows the raw features of 1, 5 or 10 % of the sender's rows, fits a decoder (ridge, or an MLP) from message "
        "rows to feature rows, and decodes the rest. Success: mean per-feature R² on the other rows (1 = recovered, "
        "0 = no better than the known rows' mean). With no known rows the best guess is the prior mean (R² 0). "
        "Where a person's row reached the receiver several times (activations every epoch, a person scored again), "
        "the attack also averages the releases per person before decoding (in parentheses). In brackets, the same "
        "decoder fitted on the same known rows reading the receiver's own features for those people "
        "(`vflo.privacy.reconstruction.decode_each` fits all three in one call): what it could infer without any "
        f"message. A flow *leaks beyond own features* when the better of one release and averaged beats that by "
        f"more than {R2_MARGIN:g} R² (0 where the receiver holds none of those features).",
        "- *Label inference* at a passive party from the gradients it receives (SplitNN, VFL-ASP's teacher, "
        "Entity Augmentation): norm and direction scoring (Li et al., ICLR 2022; AUC, binary tasks), as the AUC of "
        "the better of the score's two orientations (0.5: chance; the AUC with label 1 ranked first in "
        f"parentheses; the scoring separates the classes when above 0.5 + {AUC_MARGIN:g}), and passive model "
        "completion with 10, 40 or 100 known labels (Fu et al., USENIX Security 2022; accuracy on the other rows) on "
        "the party's final bottom model: the last activations it sent for each person. Beside it, the same head on "
        "the first activations it sent (an untrained bottom), on its own raw features (no protocol at all), and the "
        "majority class. Where its activations are noised, what it sent carries the noise; the party itself knows "
        "its clean outputs, so there the figure is a lower bound.",
        "- *Identity exposure*: the share of a sender's people that a receiver does not hold whose IDs reached "
        "it in the clear.", "",
        "**Defences** (method settings, off by default): each row a party sends is clipped to L2 norm 1 and "
        "gets N(0, σ²) noise (`vflo.dp.GaussianNoise`); ε at δ = 1e-5 is the one the method reports, for what it "
        "covers (listed under each table). The noise comes from the sending party's own secret, which no other "
        "party can replay, and a row released again carries the same noise (nothing to average). LDP adds "
        "Laplace noise per value; its ε composes over a row's values. A defence noises one flow: the tables put the "
        "attack on that flow apart from the attacks on the flows it leaves as they were.", "",
        "**End to end at a target ε** (`end to end at a target ε per party`): every passive party writes only "
        "`[privacy] epsilon` and protects everything it sends, calibrated at its setup (its network by DP-SGD "
        "with Opacus, its releases noised; `vflo.party.node`), and the label holder of SplitNN, VFL-ASP's teacher "
        "and Entity Augmentation randomises its labels at the same ε (`label_epsilon`). The ε shown is the largest "
        "any party's own account reports at the run's end, training, validation and scoring included; what each "
        "covers is listed under each table.", "",
    ]
    if axis is not None:
        lines += axis_section(axis, out)
    for dataset, runs in data.items():
        label = runs[0]["dataset"] + (" [STAND-IN DATA]" if runs[0].get("standin") else "")
        failed = [r for r in runs if r["status"] != "ok"]
        seconds = sum(r.get("seconds", 0.0) for r in runs)
        scored = sorted({int(r.get("serving", {}).get("asked", 1)) for r in runs if r["status"] == "ok"})
        commits = sorted({str(r.get("commit", "unrecorded")) for r in runs})
        lines += [f"## {label}", "",
                  f"`python -m benchmarks.privacy.run {dataset}` (the code of commit {', '.join(commits)}): "
                  f"{len(runs)} runs ({len(failed)} failed) in {seconds / 60:.1f} min; partitions: "
                  f"{', '.join(sorted({r['partition'] for r in runs}))}; the test people scored "
                  f"{' or '.join(str(n) for n in scored) or '1'} time(s) per run.", "",
                  "### Without defence", "", *undefended_table(runs), ""]
        defended = defended_table(runs)
        if len(defended) > 2:
            lines += ["### Privacy and utility", "", *plot(dataset, runs, out), *defended, "", *scopes(runs)]
        if failed:
            lines += ["### Failed runs", "", *(f"- {r['method']} ({r['defence']} {r['level']:g}): {r['error']}"
                                              for r in failed), ""]
    lines += ["## The papers' claims, here", "", *claims(data), ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=Path, default=ROOT / "runs" / "privacy")
    parser.add_argument("--out", type=Path, default=ROOT / "docs")
    parser.add_argument("--axis", type=Path, default=ROOT / "runs" / "privacy_axis",
                        help="the privacy axis's compare runs (benchmarks.compare_all --configs "
                             "configs/privacy/axis_*.toml --runs runs/privacy_axis)")
    args = parser.parse_args()
    data = load(args.runs)
    if not data:
        raise SystemExit(f"no runs under {args.runs}: run python -m benchmarks.privacy.run DATASET first")
    args.out.mkdir(parents=True, exist_ok=True)
    text = render(data, args.out, args.axis)
    (args.out / "privacy.md").write_text(text)
    print(f"wrote {args.out / 'privacy.md'} from {sum(len(v) for v in data.values())} runs")


if __name__ == "__main__":
    main()
