"""Write an experiment's results all at once, or not at all.

Files are written into a hidden temporary folder beside the target and moved into
place with one rename when everything succeeded; a failure removes the temporary
folder, so an output folder never holds half a result.
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pandas as pd

from vflo import schema
from vflo.errors import ConfigError
from vflo.experiments.plots import write_plots
from vflo.experiments.report import render_markdown, summarize
from vflo.experiments.runner import ExperimentResult


def default_out_dir(name: str) -> Path:
    from datetime import datetime

    return Path("runs") / f"{name}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


def check_out_dir(out_dir: Path, *, overwrite: bool) -> None:
    """Refuse an existing, non-empty output folder unless ``overwrite`` (checked before running)."""
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"output path {out_dir} exists and is not a folder")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not overwrite:
        raise ConfigError(f"output folder {out_dir} is not empty; choose another --out or pass --overwrite")


@contextmanager
def atomic_dir(out_dir: Path, *, overwrite: bool) -> Iterator[Path]:
    """Yield a temporary folder; on success it replaces ``out_dir`` in one rename."""
    check_out_dir(out_dir, overwrite=overwrite)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=out_dir.parent))
    try:
        yield tmp
        if out_dir.exists():
            old = out_dir.with_name(f".{out_dir.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            out_dir.replace(old)
            tmp.replace(out_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.replace(out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if hasattr(value, "item"):
        return _json_safe(value.item())
    return value


def write_results(result: ExperimentResult, out_dir: Path, *, overwrite: bool = False) -> Path:
    """``results.csv``, ``results.json``, ``summary.csv``, ``report.md`` and plots, atomically."""
    summary = summarize(result)
    with atomic_dir(out_dir, overwrite=overwrite) as tmp:
        pd.DataFrame(result.rows).to_csv(tmp / "results.csv", index=False)
        summary.to_csv(tmp / "summary.csv", index=False)
        payload = {
            "experiment": result.config.name,
            "dataset": {"name": result.dataset.name, "label": result.dataset.label,
                        "standin": result.dataset.standin, "source": result.dataset.source,
                        "task": result.dataset.task, "classes": list(result.dataset.classes)},
            "failures": result.failures,
            "config": result.config.raw,
            "protocol": {"name": result.config.protocol.name, **schema.to_plain(result.config.protocol)},
            "quick": result.config.quick,
            "started": result.started,
            "seconds": result.seconds,
            "environment": result.environment(),
            "rows": result.rows,
            "summary": summary.to_dict(orient="records"),
            "communication": result.communication,
        }
        (tmp / "results.json").write_text(json.dumps(_json_safe(payload), indent=1), encoding="utf-8")
        (tmp / "report.md").write_text(render_markdown(result, summary), encoding="utf-8")
        write_plots(result, summary, tmp)
    return out_dir
