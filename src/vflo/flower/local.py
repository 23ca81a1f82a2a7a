"""A Flower federation on this machine: a SuperLink, and a SuperNode with its party's worker per party.

For trying a federation out before deploying it, and for vflo's own end-to-end tests and benchmarks. Each
process writes its log to ``directory/logs/``; every wait is bounded; :meth:`LocalFlower.stop` ends them all.
Flower itself runs without its TLS here (``--insecure``, loopback only); what parties say to each other is
still sealed with their own certificates (see :mod:`vflo.comm.seal`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from vflo.comm.local_ports import free_port
from vflo.deploy import toml_document
from vflo.errors import TransportError

STARTUP_SECONDS = 120.0


def stop_process(process: subprocess.Popen[Any], grace: float = 15.0) -> None:
    """Ask ``process`` to end (SIGTERM), and kill it if it has not within ``grace`` seconds."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=5)


def wait_for_log(log: Path, text: str, process: subprocess.Popen[Any], *, until: float, what: str) -> None:
    """Wait until ``text`` is in the ``log`` a started ``process`` writes, at the latest until ``until``
    (time.monotonic); a process that ends first, or the time running out, is an error quoting the log's end."""
    while text not in log.read_text(errors="replace"):
        if process.poll() is not None or time.monotonic() > until:
            tail = log.read_text(errors="replace")[-3000:]
            raise TransportError(f"{what} did not start (waited for {text!r}); its log ends:\n{tail}")
        time.sleep(0.1)


class LocalFlower:
    """``flower-superlink`` and one ``vflo party serve ... --transport flower -- flower-supernode`` per party config,
    on 127.0.0.1."""

    def __init__(self, directory: Path, parties: dict[str, Path]) -> None:
        self.directory = directory
        self.parties = parties
        self.port = free_port()
        self.home = directory / "flwr-home"
        self.logs = directory / "logs"
        bin_dir = str(Path(sys.executable).parent)
        self.env = {**os.environ, "FLWR_HOME": str(self.home), "PYTHONUNBUFFERED": "1",
                    "PATH": os.pathsep.join([bin_dir, os.environ.get("PATH", "")]),
                    "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self._files: list[TextIO] = []
        self._runs = 0

    def _spawn(self, name: str, command: list[str]) -> subprocess.Popen[bytes]:
        log = (self.logs / f"{name}.log").open("w")
        self._files.append(log)
        process = subprocess.Popen(command, cwd=self.directory, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        self.processes[name] = process
        return process

    def _wait_for(self, name: str, text: str, end: float) -> None:
        wait_for_log(self.logs / f"{name}.log", text, self.processes[name], until=end, what=name)

    def start(self) -> LocalFlower:
        self.home.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        (self.home / "config.toml").write_text(
            '[superlink]\ndefault = "local"\n\n[superlink.local]\n'
            f'address = "127.0.0.1:{self.port}"\ninsecure = true\n')
        bin_dir = Path(sys.executable).parent
        end = time.monotonic() + STARTUP_SECONDS
        try:
            # Flower would otherwise install the app's dependencies into a fresh environment for every run.
            self._spawn("superlink", [str(bin_dir / "flower-superlink"), "--insecure", "--host", "127.0.0.1",
                                      "--port", str(self.port), "--disable-runtime-dependency-installation"])
            self._wait_for("superlink", "Uvicorn running", end)
            for name, config in self.parties.items():
                self._spawn(name, [sys.executable, "-m", "vflo", "party", "serve", str(config), "--transport",
                                   "flower", "--", "flower-supernode", "--insecure", "--superlink",
                                   f"127.0.0.1:{self.port}", "--port", str(free_port())])
            for name in self.parties:
                self._wait_for(name, "SuperNode ID", end)
        except BaseException:
            self.stop()
            raise
        return self

    def run(self, app: Path, run_config: dict[str, object], *,
            timeout: float = 1800.0) -> subprocess.CompletedProcess[str]:
        """``flwr run APP local --stream --run-config FILE``: waits until the run ends (at most ``timeout`` s)."""
        # A TOML file of overrides, not key=value pairs on the command line: those cannot hold spaces or quotes.
        self._runs += 1
        config = self.directory / f"run-config-{self._runs}.toml"
        config.write_text(toml_document(run_config))
        flwr = str(Path(sys.executable).parent / "flwr")
        return subprocess.run([flwr, "run", str(app), "local", "--stream", "--run-config", str(config)], env=self.env,
                              capture_output=True, text=True, timeout=timeout, check=False)

    def stop(self) -> None:
        # Parties first (each stops its SuperNode), then the SuperLink.
        for name in [*self.parties, "superlink"]:
            if name in self.processes:
                stop_process(self.processes[name])
        for f in self._files:
            f.close()
        self._files.clear()
