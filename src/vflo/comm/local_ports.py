"""A free TCP port on this machine, for servers a test, benchmark or local run starts on loopback."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS has just found free on ``host`` (another process may still take it before it is bound)."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
    return port
