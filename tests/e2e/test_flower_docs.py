"""Every command in docs/flower.md, run as written, in order: the SuperLink and the parties in the background,
`flwr run` to completion. The ports the page names are swapped for free ones; `pip install` is skipped (the
test's environment has the flower extra, as CI installs it)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from tests.e2e.test_docs import doc_steps
from vflo.comm.local_ports import free_port
from vflo.flower.local import stop_process, wait_for_log

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "flower.md"
PORTS = ("8000", "9195", "9196")
STARTUP_SECONDS = 120
RUN_SECONDS = 900

pytestmark = pytest.mark.slow


def test_the_flower_guides_commands_are_parsed() -> None:
    steps = doc_steps(DOC.read_text())
    runs = [c for kind, c in steps if kind == "run"]
    assert runs[0].startswith("pip install") and runs[1] == "source .venv/bin/activate"
    assert sum(c.startswith("flower-superlink") for c in runs) == 1
    assert sum(c.startswith("vflo flower party") for c in runs) == 2
    assert sum(c.startswith("flwr run") for c in runs) == 1
    assert {k for k, _ in steps if k.startswith("file")} == {"file runs/fl/experiment.toml",
                                                             "file ~/.flwr/config.toml"}
    assert all(port in DOC.read_text() for port in PORTS)


def test_every_command_in_the_flower_guide(tmp_path: Path) -> None:
    for folder in ("configs", "examples"):
        shutil.copytree(REPO / folder, tmp_path / folder)
    home = tmp_path / "flwr-home"
    home.mkdir()
    ports = {p: str(free_port()) for p in PORTS}
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "FLWR_HOME": str(home)}

    def ported(text: str) -> str:
        for old, new in ports.items():
            text = text.replace(old, new)
        return text

    background: list[subprocess.Popen[bytes]] = []
    logs = []
    try:
        for kind, content in doc_steps(DOC.read_text()):
            if kind.startswith("file "):
                name = kind.removeprefix("file ")
                path = home / "config.toml" if name == "~/.flwr/config.toml" else tmp_path / name
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(ported(content))
                continue
            if content == "source .venv/bin/activate" or content.startswith("pip install"):
                continue
            command = shlex.split(ported(content))
            if command[0] == "flower-superlink" or command[:3] == ["vflo", "flower", "party"]:
                log = tmp_path / f"background-{len(background)}.log"
                logs.append(log)
                with log.open("wb") as out:
                    proc = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)
                background.append(proc)
                wait_for_log(log, "Uvicorn running" if command[0] == "flower-superlink" else "SuperNode ID", proc,
                             until=time.monotonic() + STARTUP_SECONDS, what=f"`{content}`")
                continue
            done = subprocess.run(command, check=False, cwd=tmp_path, env=env, text=True, capture_output=True,
                                  timeout=RUN_SECONDS)
            assert done.returncode == 0, f"`{content}` exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
            last = done
    finally:
        for proc in reversed(background):
            stop_process(proc)
    results = tmp_path / "runs" / "fl" / "results" / "results.csv"
    assert results.is_file(), last.stdout[-4000:]
    frame = pd.read_csv(results)
    assert list(frame["method"]) == ["local", "apc_vfl", "rap"]
    assert (frame["status"] == "ok").all()
    assert (frame.loc[frame["method"] != "local", "fit_rounds"] == 1).all()
    assert "# over-flower (deployed)" in (results.parent / "report.md").read_text()
