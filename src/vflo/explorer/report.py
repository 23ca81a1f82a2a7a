"""What ``vflo explore`` found, as files: a CSV of the ranked columns, a JSON of every bin, a Markdown summary and
one HTML page (per partner, its columns ranked by information value, each with its bins' WOE). Column names come
from the partners: every page escapes them."""

from __future__ import annotations

import html
import json
import math
from pathlib import Path

import numpy as np

from vflo.explorer.run import Column, Exploration

#: Information value's customary reading in credit scoring (Siddiqi, "Credit Risk Scorecards", 2006).
STRENGTH = ((0.02, "not useful"), (0.1, "weak"), (0.3, "medium"), (0.5, "strong"), (math.inf, "suspiciously strong"))


def strength(iv: float) -> str:
    """Siddiqi's reading of an information value."""
    return next(word for bound, word in STRENGTH if iv < bound)


def _share(value: float) -> str:
    return "not known (filled without an indicator)" if math.isnan(value) else f"{value:.1%}"


def summary_lines(found: Exploration) -> list[str]:
    """What the run did, in sentences computed from it."""
    out = [f"{found.active} explored {len(found.shared)} partner(s) against {', '.join(found.targets)} "
           f"({found.task}), labels under {found.scheme.upper() if found.scheme != 'plaintext' else 'no'} encryption, "
           f"{found.binning} bins, alignment by {found.alignment}, in {found.seconds:.1f} s."]
    for party, shared in found.shared.items():
        mine = sorted((c for c in found.columns if c.party == party), key=lambda c: -c.best_iv)
        top = ", ".join(f"{c.name} ({c.best_iv:.3f}, {strength(c.best_iv)})" for c in mine[:3])
        useful = sum(c.best_iv >= STRENGTH[0][0] for c in mine)
        who = " (their count only: who they are stays with the partner)" if found.shared_as == "count" else ""
        out.append(f"{party}: {shared:,} of the {found.asked:,} people {found.active} holds are shared{who}; "
                   f"{useful} of its {len(mine)} columns reach IV {STRENGTH[0][0]}; the strongest: {top or 'none'}.")
        if party in found.dropped:
            gone = found.dropped[party]
            out.append(f"{party} dropped {len(gone)} of its columns by its own policy"
                       + (f": {', '.join(gone)}" if gone else "") + " (names only: no value of them left it).")
        if mine:
            gains = [c.guessed[0] - c.guessed[1] for c in mine]
            worst = mine[int(np.nanargmax(gains))]
            out.append(f"What {found.active} learnt of {party}'s people: from the bins' counts and its own labels, it "
                       f"guesses a person's bin of {worst.name} right for {worst.guessed[0]:.1%} of the shared people "
                       f"against {worst.guessed[1]:.1%} from the bins' sizes alone (the column where its labels help "
                       f"most); no threshold, no person's value.")
    return out


def markdown(found: Exploration) -> str:
    table = found.table()
    lines = ["# vflo explore", "", *(f"- {line}" for line in summary_lines(found)), ""]
    for party in found.shared:
        part = table[table["party"] == party]
        lines += [f"## {party}", "", "| rank | column | IV | reading | missing | distinct | bins | a person's bin "
                  "guessed from their label [from sizes alone] |", "|---|---|---|---|---|---|---|---|"]
        lines += [f"| {int(r['rank'])} | {_md(str(r['column']))} | {r['iv']:.4f} | {strength(float(r['iv']))} | "
                  f"{_share(float(r['missing_share']))} | {int(r['distinct'])} | {int(r['bins'])} | "
                  f"{r['bin_guessed']:.1%} [{r['bin_guessed_by_size']:.1%}] |" for _, r in part.iterrows()]
        lines.append("")
    return "\n".join(lines)


def _md(text: str) -> str:
    return html.escape(text).replace("|", "\\|")


def page(found: Exploration) -> str:
    """One HTML page, nothing fetched from elsewhere."""
    esc = html.escape
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>vflo explore</title><style>",
             "body{font-family:sans-serif;margin:2em;max-width:70em}table{border-collapse:collapse;margin:.5em 0}"
             "td,th{border:1px solid #ccc;padding:.2em .5em;text-align:right}td:nth-child(2){text-align:left}"
             ".bar{background:#4a7;height:.8em;display:inline-block}details{margin:.3em 0}",
             "</style></head><body><h1>vflo explore</h1><ul>",
             *(f"<li>{esc(line)}</li>" for line in summary_lines(found)), "</ul>"]
    for party in found.shared:
        mine = sorted((c for c in found.columns if c.party == party), key=lambda c: -c.best_iv)
        top = max((c.best_iv for c in mine), default=0.0) or 1.0
        parts += [f"<h2>{esc(party)}</h2><table><tr><th>rank</th><th>column</th><th>IV</th><th></th><th>reading</th>"
                  "<th>missing</th><th>distinct</th><th>bins</th></tr>"]
        for k, c in enumerate(mine, 1):
            width = 12 * c.best_iv / top
            parts.append(f"<tr><td>{k}</td><td>{esc(c.name)}</td><td>{c.best_iv:.4f}</td>"
                         f"<td style='text-align:left'><span class='bar' style='width:{width:.2f}em'></span></td>"
                         f"<td>{esc(strength(c.best_iv))}</td><td>{esc(_share(c.missing_share))}</td>"
                         f"<td>{c.distinct}</td><td>{len(c.counts)}</td></tr>")
        parts.append("</table>")
        for c in mine:
            parts.append(f"<details><summary>{esc(c.name)}: bins in {esc(party)}'s order</summary>{_bins(found, c)}"
                         "</details>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _bins(found: Exploration, c: Column) -> str:
    esc = html.escape
    head = "".join(f"<th>events: {esc(t)}</th><th>WOE: {esc(t)}</th>" for t in found.targets)
    rows = []
    for b in range(len(c.counts)):
        name = "missing" if c.missing_bin and b == len(c.counts) - 1 else str(b + 1)
        cells = "".join(f"<td>{int(c.events[b, k])}</td><td>{c.woe[b, k]:.4f}</td>" for k in range(len(found.targets)))
        rows.append(f"<tr><td>{name}</td><td>{int(c.counts[b])}</td>{cells}</tr>")
    withheld = f"<p>{c.withheld} people missing a value withheld (fewer than the partner's min_bin_rows).</p>" \
        if c.withheld else ""
    return f"<table><tr><th>bin</th><th>people</th>{head}</tr>{''.join(rows)}</table>{withheld}"


def as_json(found: Exploration) -> dict[str, object]:
    return {"active": found.active, "task": found.task, "targets": list(found.targets), "binning": found.binning,
            "scheme": found.scheme, "alignment": found.alignment, "seconds": found.seconds, "asked": found.asked,
            "shared": found.shared, "shared_as": found.shared_as, "dropped": found.dropped,
            "columns": [{"party": c.party, "column": c.name, "missing_share": None if math.isnan(c.missing_share)
                         else c.missing_share, "distinct": c.distinct, "iv": c.iv.tolist(),
                         "counts": c.counts.tolist(), "events": np.asarray(c.events).tolist(),
                         "woe": [[None if math.isnan(v) else float(v) for v in row] for row in c.woe],
                         "missing_bin": c.missing_bin, "withheld": c.withheld} for c in found.columns]}


def write(found: Exploration, out: Path) -> list[Path]:
    """explore.csv, explore.json, explore.md and explore.html under ``out``, each written whole (a file half
    written is never left: each goes to a temporary name first)."""
    out.mkdir(parents=True, exist_ok=True)
    texts = {"explore.csv": found.table().to_csv(index=False), "explore.json": json.dumps(as_json(found), indent=1),
             "explore.md": markdown(found), "explore.html": page(found)}
    written = []
    for name, text in texts.items():
        path = out / name
        temporary = path.with_suffix(path.suffix + ".part")
        temporary.write_text(text)
        temporary.replace(path)
        written.append(path)
    return written
