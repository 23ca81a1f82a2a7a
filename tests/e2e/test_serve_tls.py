"""vflo serve reachable only as its config says: over TLS with client certificates from the deployment's PKI
(auth = "mtls"), a client without one refused at the handshake; with a bearer token over TLS otherwise; its gRPC
API beside HTTP under the same rules."""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
import time
from pathlib import Path

import grpc
import httpx
import pytest

from vflo.cli import main
from vflo.comm.local_ports import free_port
from vflo.comm.tls import init_certs
from vflo.serve.grpc_api import call

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
HOSPITAL = REPO / "examples/data/hospital.csv"


def _ready(base: str, server: subprocess.Popen[bytes], **client: object) -> None:
    """Until the server answers /healthz over TLS (bounded)."""
    until = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{base}/healthz", timeout=2.0, **client).status_code == 200:  # type: ignore[arg-type]
                return
        except httpx.HTTPError:
            pass
        assert server.poll() is None and time.monotonic() < until, "vflo serve did not start"
        time.sleep(0.2)


def test_vflo_serve_over_tls_asks_for_a_client_certificate_or_the_token(tmp_path: Path) -> None:
    assert main(["run", str(REPO / "configs/examples/own_files.toml"), "--quick",
                 "--out", str(tmp_path / "results"), "--save", str(tmp_path / "models")]) == 0
    certs = tmp_path / "certs"
    init_certs(certs, ["serve", "app"], san={"serve": ["127.0.0.1"]})
    ca = ssl.create_default_context(cafile=str(certs / "ca.pem"))
    mine = ssl.create_default_context(cafile=str(certs / "ca.pem"))
    mine.load_cert_chain(certs / "app.pem", certs / "app.key")
    person = {"ids": [HOSPITAL.read_text().splitlines()[1].split(",")[0]]}
    for auth in ("mtls", "token"):
        port, grpc_port = free_port(), free_port()
        config = tmp_path / f"{auth}.toml"
        config.write_text(f'[serve]\nmodels = "{tmp_path / "models"}"\nrows = "{HOSPITAL}"\nlisten = "0.0.0.0:{port}"\n'
                          f'grpc_listen = "127.0.0.1:{grpc_port}"\n'
                          f'auth = "{auth}"\ncertificate = "{certs / "serve.pem"}"\nkey = "{certs / "serve.key"}"\n' +
                          (f'client_ca = "{certs / "ca.pem"}"\n' if auth == "mtls" else "") + "\n[models.local]\n")
        server = subprocess.Popen([sys.executable, "-m", "vflo", "serve", str(config)],
                                  env={**os.environ, "OMP_NUM_THREADS": "1"})
        base, url = f"https://127.0.0.1:{port}", f"https://127.0.0.1:{port}/v1/models/local:predict"
        try:
            if auth == "mtls":
                _ready(base, server, verify=mine)
                assert httpx.post(url, json=person, verify=mine).status_code == 200
                with pytest.raises((httpx.HTTPError, ssl.SSLError)):  # no certificate: refused at the handshake
                    httpx.post(url, json=person, verify=ca).raise_for_status()
            else:
                _ready(base, server, verify=ca)
                token = (tmp_path / "token.token").read_text().strip()
                assert httpx.post(url, json=person, verify=ca).status_code == 401
                reply = httpx.post(url, json=person, verify=ca, headers={"Authorization": f"Bearer {token}"})
                assert reply.status_code == 200 and reply.json()["predictions"][0]["model"] == "local"
            # The gRPC API beside it: the same TLS, and the same client certificate or token.
            root = (certs / "ca.pem").read_bytes()
            own = {"private_key": (certs / "app.key").read_bytes(),
                   "certificate_chain": (certs / "app.pem").read_bytes()}
            token = None if auth == "mtls" else (tmp_path / "token.token").read_text().strip()
            options = [("grpc.ssl_target_name_override", "serve")]
            with grpc.secure_channel(f"127.0.0.1:{grpc_port}", grpc.ssl_channel_credentials(root, **own),
                                     options=options) as channel:
                assert call(channel, {"model": "local", **person}, token=token)["predictions"][0]["model"] == "local"
            with grpc.secure_channel(f"127.0.0.1:{grpc_port}", grpc.ssl_channel_credentials(root),
                                     options=options) as channel, pytest.raises(grpc.RpcError) as refused:
                call(channel, {"model": "local", **person}, timeout=5.0)  # no certificate, or no token
            assert refused.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAUTHENTICATED)
            with pytest.raises(httpx.HTTPError):  # plain HTTP is not served
                httpx.post(f"http://127.0.0.1:{port}/v1/models/local:predict", json=person).raise_for_status()
        finally:
            server.terminate()
            server.wait(timeout=10)
