"""Every command in docs/deploy.md, run exactly as written, in order, from a copy of the repository's
configs and example files: servers (``vflo party serve``) in the background, everything else to completion."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from tests.e2e.conftest import drain

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "deploy.md"
STARTUP_SECONDS = 90
RUN_SECONDS = 600

pytestmark = pytest.mark.slow


def doc_steps(text: str) -> list[tuple[str, str]]:
    """("file PATH", content) for each TOML block named just before it, ("run", command) for each bash line."""
    steps: list[tuple[str, str]] = []
    position = 0
    for match in re.finditer(r"```(\w+)\n(.*?)```", text, flags=re.DOTALL):
        language, body = match.group(1), match.group(2)
        before = text[position : match.start()]
        position = match.end()
        if language == "toml":
            named = re.findall(r"`([^`\s]+\.toml)`", before)
            assert named, f"a TOML block in {DOC.name} is not preceded by the file it goes into:\n{body[:80]}"
            steps.append((f"file {named[-1]}", body))
        elif language == "bash":
            for line in body.splitlines():
                command = re.sub(r"\s{2,}#.*$", "", line).strip()
                if command and not command.startswith("#"):
                    steps.append(("run", command))
    return steps


def test_the_docs_commands_are_parsed() -> None:
    steps = doc_steps(DOC.read_text())
    runs = [c for kind, c in steps if kind == "run"]
    assert runs[0] == "source .venv/bin/activate"
    assert sum(c.startswith("vflo party serve") for c in runs) == 5
    assert sum(c.startswith("vflo run") for c in runs) == 7
    assert sum(c.startswith("vflo align") for c in runs) == 3
    assert sum(c.startswith("vflo predict") for c in runs) == 2
    assert sum(c.startswith("vflo certs") for c in runs) == 7  # a CA, and each party's own key, signed
    assert "vflo party audit runs/own/lab_audit.jsonl --run last" in runs
    assert {k for k, _ in steps if k.startswith("file")} == {
        "file runs/own/lab.toml", "file runs/own/deploy.toml", "file runs/own/experiment.toml",
        "file runs/own/server.toml", "file runs/own/rap.toml", "file runs/own/aligned.toml"}


def test_every_command_in_the_deploy_guide(tmp_path: Path) -> None:
    for folder in ("configs", "examples"):
        shutil.copytree(REPO / folder, tmp_path / folder)
    # `source .venv/bin/activate` puts the venv's vflo on the path; the test's interpreter is that venv.
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    servers: list[subprocess.Popen[str]] = []
    try:
        for kind, content in doc_steps(DOC.read_text()):
            if kind.startswith("file "):
                path = tmp_path / kind.removeprefix("file ")
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(content)
            elif content == "source .venv/bin/activate":
                continue
            elif content.startswith("vflo party serve"):
                proc = subprocess.Popen(content.split(), cwd=tmp_path, env=env, text=True, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT)
                servers.append(proc)
                _wait_listening(proc, content)
            else:
                done = subprocess.run(content.split(), check=False, cwd=tmp_path, env=env, text=True,
                                      capture_output=True,
                                      timeout=RUN_SECONDS)
                assert done.returncode == 0, f"`{content}` exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    finally:
        for proc in servers:
            proc.terminate()
        for proc in servers:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
    for results in ("runs/demo/results", "runs/own/results", "runs/own/saved", "runs/own/long", "runs/own/rap",
                    "runs/own/aligned"):
        frame = pd.read_csv(tmp_path / results / "results.csv")
        assert (frame.status == "ok").all() and len(frame) >= (1 if results.endswith(("rap", "aligned")) else 2)
    # vflo align kept each intersection at both parties, and the PSI run reused them without intersecting again.
    assert (pd.read_csv(tmp_path / "runs/own/aligned/results.csv").psi_engine == "reused").all()
    for party, peer in (("hospital", "lab"), ("lab", "hospital")):
        folder = tmp_path / "runs/own" / f"{party}_alignments"
        assert {p.name.split(".")[:2][1] for p in folder.glob(f"{peer}.*.json")} == {"train", "serve"}, party
        # and the unbalanced preparations: the lab's key at the lab, what the lab sent at the hospital
        assert {p.parent.name.split(".")[1] for p in (folder / "unbalanced").glob(f"{peer}.*/prep.json")} == {
            "train", "serve"}, party
    # vflo align --stream: each party keeps its own rows' flags, the same people as the kept intersection.
    for party, peer in (("hospital", "lab"), ("lab", "hospital")):
        (record,) = (tmp_path / "runs/own" / f"{party}_alignments" / "streamed").glob(f"{peer}.train.*.json")
        flags = pd.read_parquet(record.with_suffix(".parquet"))
        assert flags["shared"].sum() == pd.read_json(record, typ="series")["shared"] > 0, party
    # No private key travelled: each lies only in the folder of the party that made it.
    keys = sorted(str(p.relative_to(tmp_path / "runs/own")) for p in (tmp_path / "runs/own").rglob("*.key"))
    assert keys == ["ca/ca.key", "hospital-tls/hospital.key", "lab-tls/lab.key", "server-tls/server.key"]
    # Each party, the hospital that coordinates included, keeps its own record of what left it.
    for party in ("hospital", "lab", "server"):
        assert (tmp_path / "runs/own" / f"{party}_audit.jsonl").stat().st_size > 0, party
    own = tmp_path / "runs/own"
    resumed = pd.read_csv(own / "long" / "results.csv").set_index("method")
    assert resumed.loc["splitnn", "resumed_after_epoch"] >= 10
    saved = pd.read_csv(own / "saved" / "results.csv").set_index("method")
    assert resumed.loc["splitnn", "accuracy"] == saved.loc["splitnn", "accuracy"]
    for name in ("apc", "splitnn"):
        scores = pd.read_csv(own / f"{name}_scores.csv")
        assert list(scores.columns) == ["pid", "readmitted", "recovered", "prediction", "model", "scored_by"]
        assert len(scores) > 0
    assert len(list((own / "lab_models" / "splitnn").glob("*/lab/manifest.json"))) >= 1  # under each model ID
    assert not (own / "models" / "splitnn" / "lab").exists()
    assert (tmp_path / "runs/demo/.gitignore").read_text().strip().endswith("*")
    # The export, run as written: its files, and all the parties wrote beside them, for their owner only; the CA
    # outside it; no ID in the clear (every run aligned by PSI); every party with a budget it kept an account of.
    for root in (tmp_path / "runs/demo", tmp_path / "runs/demo-ca"):
        for path in (root, *root.rglob("*")):
            assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, f"{path} can be read by others"
    assert not list((tmp_path / "runs/demo").rglob("ca.key")) and (tmp_path / "runs/demo-ca/ca.key").is_file()
    demo = pd.read_csv(tmp_path / "runs/demo/results/results.csv")
    revealed = demo.alignment_revealed.dropna()  # a method that aligns with no one (local) reveals nothing
    assert len(revealed) and revealed.str.contains("no ID crossed in the clear").all()
    for config in (tmp_path / "runs/demo").glob("*.toml"):
        assert "[privacy]" in config.read_text() or "[active.privacy]" in config.read_text(), config


def _wait_listening(proc: subprocess.Popen[str], command: str) -> None:
    assert proc.stdout is not None
    deadline = time.monotonic() + STARTUP_SECONDS
    line = ""
    while "listening on" not in line:
        if time.monotonic() > deadline or proc.poll() is not None:
            raise AssertionError(f"`{command}` did not start: {line!r}{proc.stdout.read() if proc.poll() else ''}")
        line = proc.stdout.readline()
    drain(proc)
