"""``vflo serve``: predictions online, over HTTP/JSON, from saved models kept live (docs/deploy.md)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from vflo.cli.common import exit_code_text


def add(sub: Any) -> None:
    """Its parser, under ``sub`` (the ``vflo`` command's subcommands)."""
    serve = sub.add_parser("serve", help="serve predictions online from saved models (HTTP/JSON)",
                           epilog=exit_code_text(), formatter_class=argparse.RawDescriptionHelpFormatter,
                           description="POST /v1/models/NAME:predict with {\"ids\": [...]} scores those people "
                                       "with the partners that hold them and answer in time; /healthz, /readyz, "
                                       "/metrics. The config: vflo.serve.config.")
    serve.set_defaults(func=_serve)
    serve.add_argument("config", type=Path, help="the serve config (TOML: [serve], [partners] or serve.deploy, "
                                                 "[models.NAME])")


def _serve(args: argparse.Namespace) -> int:
    from vflo.errors import ConfigError

    try:
        from vflo.serve.server import serve_forever
    except ImportError as exc:  # the serve extra: FastAPI, uvicorn, prometheus_client
        raise ConfigError(f"vflo serve needs its extra: pip install 'vflo[serve]' ({exc})") from None
    from vflo.serve.config import load_serve_config

    serve_forever(load_serve_config(args.config))
    return 0
