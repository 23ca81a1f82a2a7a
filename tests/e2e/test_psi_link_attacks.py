"""The PSI library's link between two live parties (``vflo party serve`` and ``vflo align``) under attack: a
stranger pushing into both parties' link ports, in plain text (brpc answered ``200`` to an HTTP push and a side
aborted) and with TLS but no certificate, another CA's or another party's, gets nothing back, and the
intersection completes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_psi_link_tls import Stranger
from vflo.align import spu
from vflo.align.link_relay import LinkTLS
from vflo.comm.local_ports import free_port
from vflo.comm.tls import init_certs

pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(spu.missing()), reason=spu.missing() or "installed")]
ROWS = 20_000


def _write(work: Path) -> dict[str, int]:
    init_certs(work / "certs", ["bank", "shop", "eve"])
    init_certs(work / "other", ["shop"])
    ports = {name: free_port() for name in ("bank", "shop", "bank_link", "shop_link")}
    (work / "bank.csv").write_text("id,x,label\n" + "".join(f"u{i:06d},{i % 7},{i % 2}\n" for i in range(ROWS)))
    (work / "shop.csv").write_text("id,z\n" + "".join(f"u{i:06d},{i % 5}\n" for i in range(ROWS // 2,
                                                                                          ROWS + ROWS // 2)))
    (work / "shop.toml").write_text(
        f'name = "shop"\nrole = "passive"\nlisten = "127.0.0.1:{ports["shop"]}"\naudit_log = ""\n'
        f'alignments = "shop_alignments"\n[policy]\npsi_link = "127.0.0.1:{ports["shop_link"]}"\n'
        '[tls]\ndir = "certs"\n[data]\nfile = "shop.csv"\nid_column = "id"\n'
        f'[peers]\nbank = {{ address = "127.0.0.1:{ports["bank"]}", role = "active" }}\n')
    (work / "deploy.toml").write_text(
        f'[active]\nname = "bank"\nlisten = "127.0.0.1:{ports["bank"]}"\naudit_log = ""\n'
        f'alignments = "bank_alignments"\n[active.policy]\npsi_link = "127.0.0.1:{ports["bank_link"]}"\n'
        '[active.tls]\ndir = "certs"\n[active.data]\nfile = "bank.csv"\nid_column = "id"\nlabel_column = "label"\n'
        f'[[parties]]\nname = "shop"\nrole = "passive"\naddress = "127.0.0.1:{ports["shop"]}"\n')
    return ports


def _vflo(*args: str, cwd: Path, out: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with out.open("wb") as log:
        return subprocess.Popen([sys.executable, "-m", "vflo", *args], cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                                env=env)


@pytest.mark.parametrize("engine", ["ecdh", "rr22"])
def test_a_stranger_pushing_into_both_link_ports_gets_nothing_and_the_intersection_completes(
        engine: str, tmp_path: Path) -> None:
    ports = _write(tmp_path)
    certs = {name: LinkTLS(str(tmp_path / "certs" / f"{name}.pem"), str(tmp_path / "certs" / f"{name}.key"),
                           str(tmp_path / "certs" / "ca.pem")) for name in ("bank", "shop", "eve")}
    certs["foreign-pas"] = LinkTLS(str(tmp_path / "other" / "shop.pem"), str(tmp_path / "other" / "shop.key"),
                                   str(tmp_path / "other" / "ca.pem"))
    shop_log, bank_log = tmp_path / "shop.log", tmp_path / "bank.log"
    shop = _vflo("party", "serve", "shop.toml", cwd=tmp_path, out=shop_log)
    stranger = None
    try:
        deadline = time.monotonic() + 90
        while "listening on" not in shop_log.read_text(errors="replace"):
            assert time.monotonic() < deadline and shop.poll() is None, shop_log.read_text(errors="replace")
            time.sleep(0.1)
        stranger = Stranger([ports["shop_link"], ports["bank_link"]], certs, limit_s=300)
        bank = _vflo("align", "deploy.toml", "--engine", engine, "--fresh", cwd=tmp_path, out=bank_log)
        try:
            code = bank.wait(timeout=300)
        finally:
            if bank.poll() is None:
                bank.kill()
                bank.wait(10)
    finally:
        if stranger is not None:
            stranger.stop()
        shop.terminate()
        try:
            shop.wait(timeout=30)
        except subprocess.TimeoutExpired:
            shop.kill()
            shop.wait(10)
    output, served = bank_log.read_text(errors="replace"), shop_log.read_text(errors="replace")
    assert code == 0, output + served
    assert f"{ROWS // 2:,} of {ROWS:,} IDs shared (found by {engine})" in output
    assert stranger.answers == [], stranger.answers[:3]  # brpc answered a plain push with HTTP 200
    # The stranger reached the relays while they listened, and each of its connections was refused and logged.
    assert "PSI link refused a connection" in served + output
