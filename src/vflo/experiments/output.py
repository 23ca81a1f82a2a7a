"""Write an experiment's results all at once, or not at all, and never lose a file vflo did not write.

Files are written into a hidden temporary folder beside the target and moved into
place with one rename when everything succeeded; a failure removes the temporary
folder, so an output folder never holds half a result. Each output folder lists what
vflo wrote into it (``.vflo-outputs``); ``--overwrite`` replaces a folder only when
it holds nothing else, so a certificate, a key or a config kept there is never deleted.
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


MANIFEST = ".vflo-outputs"


def check_out_dir(out_dir: Path, *, overwrite: bool) -> None:
    """Refuse an existing, non-empty output folder unless ``overwrite`` and everything in it is what vflo wrote
    there (listed in its manifest); checked before running."""
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"output path {out_dir} exists and is not a folder")
    if not out_dir.is_dir() or not any(out_dir.iterdir()):
        return
    if not overwrite:
        raise ConfigError(f"output folder {out_dir} is not empty; choose another --out or pass --overwrite")
    foreign = sorted(p.name for p in out_dir.iterdir()
                     if p.name != MANIFEST and p.name not in _written(out_dir) and not _saved_model(p))
    if foreign:
        raise ConfigError(f"--overwrite replaces only what vflo wrote into {out_dir}, but it also holds {foreign[:5]}"
                          f"{' and more' if len(foreign) > 5 else ''}, which vflo did not write there: move them "
                          "out (certificates, keys and party configs belong outside output folders) or choose "
                          "another folder")


def _saved_model(path: Path) -> bool:
    """A model vflo saved (``LABEL/`` with its card, as ``--save`` writes them into a models folder)."""
    from vflo.artifacts import CARD

    return path.is_dir() and (path / CARD).is_file()


def _written(out_dir: Path) -> set[str]:
    try:
        names = json.loads((out_dir / MANIFEST).read_text())
    except (OSError, ValueError):
        return set()
    return {str(n) for n in names} if isinstance(names, list) else set()


@contextmanager
def atomic_dir(out_dir: Path, *, overwrite: bool) -> Iterator[Path]:
    """Yield a temporary folder; on success it replaces ``out_dir`` in one rename."""
    check_out_dir(out_dir, overwrite=overwrite)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=out_dir.parent))
    try:
        yield tmp
        (tmp / MANIFEST).write_text(json.dumps(sorted(p.name for p in tmp.iterdir())) + "\n")
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


def json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if hasattr(value, "item"):
        return json_safe(value.item())
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
        (tmp / "results.json").write_text(json.dumps(json_safe(payload), indent=1), encoding="utf-8")
        (tmp / "report.md").write_text(render_markdown(result, summary), encoding="utf-8")
        write_plots(result, summary, tmp)
    return out_dir
