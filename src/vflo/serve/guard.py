"""Who may call ``vflo serve``, and how much one call may send: a bearer token for predictions and metrics, a
second one for the admin calls that swap models, and a bound on a request's body, checked before FastAPI reads it.

A prediction names people and answers with their scores: whoever reaches the port learns what the model says about
anyone the active party or its partners hold. So every route but ``/healthz`` and ``/readyz`` (a probe's, saying
only whether the server is up and its partners present) needs ``Authorization: Bearer TOKEN`` unless the server
checks client certificates itself (``auth = "mtls"``), or its config names ``auth = "none"`` (logged).
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vflo.errors import ConfigError
from vflo.private import FILE_MODE

logger = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: Routes anyone who reaches the port may call: a load balancer's probes.
OPEN_PATHS = frozenset({"/healthz", "/readyz"})


@dataclass(frozen=True, kw_only=True)
class Access:
    """``token``: what ``Authorization: Bearer ...`` must carry on every route but the probes (None: none is asked,
    as the TLS layer checks client certificates, or the config chose ``auth = "none"``); ``admin_token``: what a
    model swap (``PUT /v1/models/NAME``) must carry (None: swaps over HTTP are off); ``max_request_bytes``: the
    largest request body read."""

    token: str | None
    admin_token: str | None = None
    max_request_bytes: int = 4 << 20

    @classmethod
    def unguarded(cls, *, admin_token: str | None = None) -> Access:
        """No token asked for predictions (an in-process test client, or a server behind client-certificate TLS)."""
        return cls(token=None, admin_token=admin_token)


def read_token(path: Path, *, create: bool, what: str) -> str:
    """The token in ``path``; with ``create``, a fresh one (32 random bytes from the OS) written there first, the
    file its owner's alone. A token file others may read is refused: anyone who can read it can call."""
    if not path.exists() and create:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_urlsafe(32) + "\n")
        logger.warning("wrote a new %s to %s (its owner's alone): give it to clients as 'Authorization: Bearer "
                       "TOKEN'", what, path)
    if not path.is_file():
        raise ConfigError(f"no {what} file at {path}: write one (a long random line, chmod 600), or leave the "
                          "setting out for a fresh one written there")
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise ConfigError(f"the {what} file {path} may be read by others (mode {mode:o}): chmod 600 {path}")
    token = path.read_text().strip()
    if len(token) < 16:
        raise ConfigError(f"the {what} in {path} is {len(token)} characters; use at least 16 random ones (or delete "
                          "the file for a fresh one)")
    return token


class Guard:
    """ASGI middleware in front of the API: the token checks, and the body read whole (at most
    ``max_request_bytes``) before the app sees it, so an oversized or endless body costs the server no more."""

    def __init__(self, app: ASGIApp, *, access: Access) -> None:
        self.app, self.access = app, access
        self._token = None if access.token is None else f"Bearer {access.token}".encode()
        self._admin = None if access.admin_token is None else f"Bearer {access.admin_token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path, method = scope["path"], scope["method"]
        headers = dict(scope.get("headers") or [])
        if path not in OPEN_PATHS:
            admin = method in ("PUT", "DELETE")
            if admin and self._admin is None:
                await _refuse(send, 403, "model swaps over HTTP are off on this server: set serve.admin_token_file "
                                         "in its config (a second token, for whoever deploys models)")
                return
            wanted = self._admin if admin else self._token
            if wanted is not None and not hmac.compare_digest(headers.get(b"authorization", b""), wanted):
                what = "serve.admin_token_file's" if admin else "serve.token_file's"
                await _refuse(send, 401, f"this call needs 'Authorization: Bearer TOKEN' with {what} token",
                              extra=[(b"www-authenticate", b"Bearer")])
                return
        if method in ("POST", "PUT"):
            body = await self._body(headers, receive, send)
            if body is None:
                return
            await self.app(scope, _replay(body, receive), send)
            return
        await self.app(scope, receive, send)

    async def _body(self, headers: dict[bytes, bytes], receive: Receive, send: Send) -> bytes | None:
        limit = self.access.max_request_bytes
        declared = headers.get(b"content-length")
        too_large = (f"a request body is at most {limit} bytes here (serve.max_request_bytes): ask for fewer people a "
                     "call")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            await _refuse(send, 413, too_large)
            return None
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                await _refuse(send, 413, too_large)
                return None
            chunks.append(chunk)
            if not message.get("more_body"):
                return b"".join(chunks)


def _replay(body: bytes, then: Receive) -> Receive:
    """The body read once, then the connection's own messages (its disconnect, when it comes)."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if sent:
            return await then()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


async def _refuse(send: Send, status: int, detail: str, *, extra: list[tuple[bytes, bytes]] | None = None) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *(extra or [])]})
    await send({"type": "http.response.body", "body": body})
