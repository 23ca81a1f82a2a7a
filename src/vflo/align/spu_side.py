"""One side of an intersection by SecretFlow's PSI library, in the child process a party starts for it
(:mod:`vflo.align.spu` starts it and hands it its order), and the loading of the library.

Kept apart from :mod:`vflo.align.spu` so that the child imports the standard library and the two native modules
only: importing NumPy and pyarrow as well made its start several times as long, and the party waits for that
start (``python -m benchmarks.psi_engines`` times a side's start: docs/deploy.md).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import threading
import types
from functools import cache
from pathlib import Path
from typing import Any

from vflo.errors import ConfigError

#: The protocols vflo runs through the library: the name a config gives, and the library's.
#: The PSI library's balanced protocols vflo runs, by the name a config gives (each an engine of
#: :mod:`vflo.align.linked`), and the library's name for each.
PROTOCOLS = {name: f"PROTOCOL_{name.upper()}" for name in ("rr22", "kkrt", "ecdh")}
#: The library's unbalanced PSI (ECDH-OPRF): the large side's evaluated set prepared once, then each intersection
#: costs what the small side holds (:mod:`vflo.align.unbalanced`).
UNBALANCED = "unbalanced"
INSTALL = "pip install --no-deps spu==0.9.5"


@cache
def libraries() -> tuple[Any, Any]:
    """``libspu`` (its link) and ``libpsi``, loaded from the installed ``spu`` package without running its
    ``__init__`` (which imports JAX)."""
    spec = importlib.util.find_spec("spu") if "spu" not in sys.modules else None
    root = Path(spec.submodule_search_locations[0]) if spec is not None and spec.submodule_search_locations \
        else Path(getattr(sys.modules.get("spu"), "__path__", [""])[0])
    if not (root / "libpsi.so").is_file() or not (root / "libspu.so").is_file():
        raise ConfigError(f"the PSI library is not installed here: {INSTALL} (or use vflo's own PSI: "
                          "[alignment] engine = 'vflo')")
    if "spu" not in sys.modules:
        package = types.ModuleType("spu")
        package.__path__ = [str(root)]
        sys.modules["spu"] = package
    loaded = []
    for name in ("libspu", "libpsi"):
        full = f"spu.{name}"
        if full not in sys.modules:
            spec_so = importlib.util.spec_from_file_location(full, root / f"{name}.so")
            assert spec_so is not None and spec_so.loader is not None
            module = importlib.util.module_from_spec(spec_so)
            sys.modules[full] = module
            spec_so.loader.exec_module(module)
        loaded.append(sys.modules[full])
    return loaded[0], loaded[1]


def child() -> None:
    """The library's side, in the child process :class:`vflo.align.spu.Prepared` starts: load the library, read
    the order from standard input (none: the side was not run, so leave), run, mark it done."""
    libspu, libpsi = libraries()
    text = sys.stdin.read()
    if not text:
        return
    order = json.loads(text)
    link = libspu.link
    desc = link.Desc()
    desc.id = "vflo-psi"
    own, peer, rank = order["own"], order["peer"], order["rank"]
    for i, address in enumerate((own, peer) if rank == 0 else (peer, own)):
        desc.add_party(f"r{i}", address)
    desc.recv_timeout_ms = int(order["timeout_s"] * 1000)
    desc.connect_retry_times = max(1, int(order["timeout_s"] / 0.05))
    desc.connect_retry_interval_ms = 50
    # A message the link could not deliver (its peer's relay still refusing, a loaded peer) is sent again after
    # 1, 3 and 5 s by default: most of a small intersection's time. Every 50 ms, then at most every 200 ms, for as
    # long as the side may run.
    retry = desc.retry_opts
    retry.retry_interval_ms, retry.retry_interval_incr_ms, retry.max_retry_interval_ms = 50, 50, 200
    retry.max_retry = max(3, int(order["timeout_s"] / 0.2))
    # No TLS of the library's own: it listens and dials on Unix sockets in the side's folder, and vflo's relays
    # carry the link under mutual TLS (vflo.align.link_relay); brpc takes plain text on a port it serves with TLS.
    context = link.create_brpc(desc, rank)
    if order["protocol"] == UNBALANCED:
        # The library's unbalanced PSI connects the link to its peer a second time (its handshake, under the same
        # key as create_brpc's). A handshake that arrives while the first one is still unread is dropped, so a side
        # that raced ahead into the second could leave a slower one (a loaded machine) waiting for it until the
        # timeout, as its tests did now and then beside busy processes, the stacks showing one side in the
        # second connect and the other past it. A barrier first lets neither side on before both have read
        # the first handshake.
        context.barrier()
        count = _unbalanced(libpsi, order, context)
    else:
        count = _balanced(libpsi, order, context)
    Path(order["done"]).write_text(str(count))
    # Stopping the link waits for the peer to acknowledge what this side sent last; a peer that has already gone
    # would keep it retrying for as long as the retries above allow. The result is written: wait a little, then go.
    stopping = threading.Thread(target=context.stop_link, daemon=True)
    stopping.start()
    stopping.join(timeout=5)
    sys.stdout.flush()
    # Past this point nothing is left to do; leaving without the interpreter's teardown keeps the link's threads
    # from running into freed objects.
    os._exit(0)


def _balanced(libpsi: Any, order: dict[str, Any], context: Any) -> int:
    config = libpsi.PsiExecuteConfig()
    config.protocol_conf.protocol = getattr(libpsi.PsiProtocol, PROTOCOLS[order["protocol"]])
    config.protocol_conf.receiver_rank = 0
    config.protocol_conf.broadcast_result = order["broadcast"]
    config.protocol_conf.ecdh_params.curve = libpsi.EllipticCurveType.CURVE_25519  # ECDH's, as vflo's
    config.input_params.type = libpsi.SourceType.SOURCE_TYPE_FILE_CSV
    config.input_params.path = order["source"]
    config.input_params.selected_keys = ["id"]
    config.input_params.keys_unique = True
    config.output_params.type = libpsi.SourceType.SOURCE_TYPE_FILE_CSV
    config.output_params.path = order["result"]
    config.output_params.disable_alignment = True
    return int(libpsi.psi_execute(config, context).intersection_count)


def _unbalanced(libpsi: Any, order: dict[str, Any], context: Any) -> int:
    """The library's ECDH-OPRF unbalanced PSI: the active party (rank 0) is its client, the partner its server.
    Offline, the server evaluates its IDs under its own key (kept in its cache folder) and the client keeps what
    it receives; online, the client's IDs are evaluated by the server and looked up there."""
    config = libpsi.UbPsiExecuteConfig()
    client = order["rank"] == 0
    config.role = libpsi.UbPsiRole.ROLE_CLIENT if client else libpsi.UbPsiRole.ROLE_SERVER
    config.cache_path = order["cache"]
    reads = not client if order["stage"] == "offline" else client
    if order["stage"] == "offline":
        config.mode = libpsi.UbPsiMode.MODE_OFFLINE
    else:
        config.mode = libpsi.UbPsiMode.MODE_ONLINE
        config.client_receive_result = True
        config.server_receive_result = order["broadcast"]
        config.output_params.type = libpsi.SourceType.SOURCE_TYPE_FILE_CSV
        config.output_params.path = order["result"]
        config.output_params.disable_alignment = True
    if reads:
        config.input_params.type = libpsi.SourceType.SOURCE_TYPE_FILE_CSV
        config.input_params.path = order["source"]
        config.input_params.selected_keys = ["id"]
        config.input_params.keys_unique = True
    return int(libpsi.ub_psi_execute(config, context).intersection_count)
