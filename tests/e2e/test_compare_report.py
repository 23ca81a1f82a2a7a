"""vflo compare end to end, and its HTML report checked as a person would: rendered in headless Chromium, with
its plots and tables present and no console errors."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from vflo.cli import main

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
FAST = "{ batch_size = 64, max_epochs = 5, patience = 0 }"
CONFIG = f"""
name = "tiny_compare"
seed = 0
[dataset]
name = "breast_cancer"
[compare]
aligned = [0.5, 1.0]
passives = [1, 2]
splits = ["random", "correlation"]
second_hop = [1.0]
base_second_hop = 1.0
p_miss = []
absent = [0.5]
epsilons = [4.0]
scored = ["aligned", "active_only"]
base_aligned = 0.5
repeats = 3
methods = ["local", "splitnn", "apc_vfl", "rap", "centralized", "entity_augmentation", "vfl_asp"]
[compare.settings.splitnn]
train = {FAST}
[compare.settings.apc_vfl]
train = {FAST}
[compare.settings.entity_augmentation]
train = {FAST}
[compare.settings.vfl_asp]
train = {FAST}
student_train = {FAST}
embedding_train = {FAST}
"""


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def test_compare_writes_a_report_that_renders_in_a_browser(tmp_path: Path) -> None:
    config = tmp_path / "compare.toml"
    config.write_text(CONFIG)
    out = tmp_path / "out"
    assert main(["compare", str(config), "--out", str(out)]) == 0
    rows = pd.read_csv(out / "results.csv")
    assert set(rows["axis"]) == {"aligned", "passives", "split", "second_hop", "absent", "epsilon", "epsilon_hop"}
    missing = rows[rows["scored"] == "missing"]
    # The same held-out people everywhere; the missing-partner cell scores both kinds' count, each lacking partners.
    assert (rows["status"] == "ok").all() and set(rows.drop(missing.index)["n_test"]) == {57}
    assert set(missing["n_test"]) == {114}
    assert set(missing["method"]) == {"local", "splitnn", "plugvfl", "apc_vfl", "centralized"}
    # Collaborative methods do not score people only the active party holds; the rest do, on the same splits.
    active_only = rows[rows["scored"] == "active_only"]
    assert set(active_only["method"]) == {"local", "apc_vfl", "centralized"}
    assert {"splitnn", "rap", "entity_augmentation"} <= set(rows[rows["scored"] == "aligned"]["method"])
    assert set(rows[rows["method"] == "vfl_asp"]["axis"]) == {"second_hop", "epsilon_hop"}
    # The privacy axis: the methods that protect a partner's side, and Local beside them.
    private = rows[rows["axis"] == "epsilon"]
    assert set(private[private["scored"] == "aligned"]["method"]) == {"local", "splitnn", "apc_vfl"}
    assert set(private[private["scored"] == "active_only"]["method"]) == {"local", "apc_vfl"}
    # With a second hop, VFL-ASP's ε cells beside them (ε = ∞: the second-hop cell at the base share).
    assert "vfl_asp" in set(rows[(rows["axis"] == "epsilon_hop") & (rows["scored"] == "aligned")]["method"])
    report = (out / "report.md").read_text()
    assert "Which method when" in report
    # Skipped in star cells, with why: a row of the short table naming it among the methods, the cells and why.
    assert any("vfl_asp" in line.split("|")[1] and "aligned" in line.split("|")[2] and "second-hop" in line
               for line in report.splitlines() if line.startswith("| ") and line.count("|") == 4)
    assert "scores together with its partners" in report and "paired t-test" in report
    assert "What the runs say about the papers' claims" in report and "VFL-ASP's claim" in report
    assert "no spread to tell by" not in report  # three repeats: every cell names a best method
    assert report.index("## The answer for the base scenario") < report.index("## Which method when")
    assert "Scoring people every party holds: use " in report
    browser = chromium()
    if browser is None:
        pytest.skip("no Chromium on this machine (Debian: apt-get install chromium); .ci/run installs it")
    page = (out / "report.html").resolve().as_uri()
    done = subprocess.run([browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
                           "--v=0", "--virtual-time-budget=3000", "--dump-dom", page],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    dom = done.stdout
    assert dom.count("<svg") >= 5 and "plot-metric_missing" in dom, "the plots are missing"
    assert len(re.findall(r"<table", dom)) >= 4 and "Which method when" in dom
    # The page opens with the answer for the base scenario, before any plot or table.
    assert dom.index('id="answer"') < min(dom.index("<svg"), dom.index("<table"))
    assert "% " in dom or "%<" in dom  # the log axes' ticks are labelled as percentages
    console = [line for line in done.stderr.splitlines() if "CONSOLE" in line]
    assert console == [], console
    shot = tmp_path / "shot.png"
    subprocess.run([browser, "--headless=new", "--no-sandbox", "--disable-gpu", f"--screenshot={shot}",
                    "--window-size=1200,1600", page], capture_output=True, timeout=120, check=True)
    assert shot.stat().st_size > 10_000
