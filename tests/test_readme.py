"""The README's examples, run as a newcomer would run them: every Python block, and the own-files command."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}


def test_every_python_block_in_the_readme_runs() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README, flags=re.DOTALL)
    assert len(blocks) >= 2
    for block in blocks:
        done = subprocess.run([sys.executable, "-c", block], cwd=REPO, env=ENV, capture_output=True, text=True,
                              check=False, timeout=300)
        assert done.returncode == 0, f"README block failed:\n{block}\n{done.stderr[-2000:]}"


def test_the_own_files_commands_as_written(tmp_path: Path) -> None:
    commands = [line.removeprefix(".venv/bin/") for line in re.findall(r"^\.venv/bin/vflo [^\n#]+", README, flags=re.M)
                if "own_" in line and not line.startswith(".venv/bin/vflo compare")]
    assert len(commands) == 4
    for folder in ("configs", "examples"):
        shutil.copytree(REPO / folder, tmp_path / folder)
    for command in commands:
        done = subprocess.run(command.split(), cwd=tmp_path, env=ENV, capture_output=True, text=True, check=False,
                              timeout=300)
        assert done.returncode == 0, f"`{command}` failed:\n{done.stderr[-2000:]}"
    frame = pd.read_csv(tmp_path / "runs/own_files/results.csv")
    assert (frame.status == "ok").all() and {"local", "splitnn", "apc_vfl", "rap", "centralized"} <= set(frame.method)
    scores = pd.read_csv(tmp_path / "runs/own_scores.csv")
    new = pd.read_csv(tmp_path / "examples/data/hospital_new.csv")
    assert list(scores.pid) == list(new.pid)
    assert list(scores.columns) == ["pid", "readmitted", "recovered", "prediction", "model", "scored_by"]
    assert sorted(p.name for p in (tmp_path / "runs/own_models/splitnn").iterdir()) == ["hospital", "lab", "model.json"]


COMPARE = [line.removeprefix(".venv/bin/")
           for line in re.findall(r"^\.venv/bin/vflo compare [^\n#]+", README, flags=re.M)]


@pytest.mark.parametrize("command", COMPARE)
def test_the_compare_commands_as_written(tmp_path: Path, command: str) -> None:
    """On a dataset and on the example files: every cell of the report names a best method or says why not."""
    assert len(COMPARE) == 2
    for folder in ("configs", "examples"):
        shutil.copytree(REPO / folder, tmp_path / folder)
    done = subprocess.run(command.split(), cwd=tmp_path, env={**ENV, "VFLO_DATA_DIR": str(REPO.parent / "shared" /
                                                                                          "datasets")},
                          capture_output=True, text=True, check=False, timeout=600)
    assert done.returncode == 0, f"`{command}` failed:\n{done.stderr[-2000:]}"
    out = tmp_path / command.split("--out ")[1].split(maxsplit=1)[0]
    report = (out / "report.md").read_text()
    assert (out / "report.html").is_file() and report.index("## The answer") < report.index("## Which method when")
    table = report.split("## Which method when")[1].split("\n## ")[0]
    rows = [line.split("|")[1:-1] for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    header, cells = rows[0], rows[1:]
    assert cells and all(cell[header.index(" best ")].strip() for cell in cells), table
