"""Files written into a folder a person also works in, without ever replacing one the writer did not write.

A writer (``vflo scenario --export``) prepares every file in a staging folder beside the target, then
:func:`publish` moves them into place. It records what it wrote, with each file's SHA-256, in the target's
``.vflo-written``; a later publish replaces a file only where that record says this writer wrote it and the file
is unchanged since, and only when asked to (``overwrite``). Everything is checked before anything moves, so a
refused publish leaves the target as it was, and files the writer does not write (a party's models, its privacy
account, notes) are never touched.
"""

from __future__ import annotations

import json
from pathlib import Path

from vflo.artifacts import sha256_of
from vflo.errors import ConfigError
from vflo.private import make_private, private_folder

RECORD = ".vflo-written"


def written(target: Path) -> dict[str, str]:
    """What the writer recorded in ``target``: relative path -> SHA-256 when written (empty where none)."""
    try:
        raw = json.loads((target / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    files = raw.get("files") if isinstance(raw, dict) else None
    return {str(k): str(v) for k, v in files.items()} if isinstance(files, dict) else {}


def _staged(staging: Path, leave: str = "") -> list[str]:
    return sorted(str(p.relative_to(staging)) for p in staging.rglob("*")
                  if p.is_file() and p.name != RECORD and not (leave and p.is_relative_to(staging / leave)))


def conflicts(staging: Path, target: Path, *, leave: str = "") -> tuple[list[str], list[str]]:
    """Files of ``staging`` (but those under ``leave``) that exist in ``target``: (the writer's own, unchanged;
    anyone else's, or edited since)."""
    record = written(target)
    own: list[str] = []
    foreign: list[str] = []
    for rel in _staged(staging, leave):
        there = target / rel
        if not there.exists() and not there.is_symlink():
            continue
        if there.is_file() and not there.is_symlink() and record.get(rel) == sha256_of(there):
            own.append(rel)
        else:
            foreign.append(rel)
    return own, foreign


def check(staging: Path, target: Path, *, overwrite: bool, command: str, leave: str = "") -> None:
    """Refuse (a :class:`ConfigError` naming the files and the fix) what :func:`publish` would refuse."""
    own, foreign = conflicts(staging, target, leave=leave)
    if foreign:
        listed = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise ConfigError(f"{target} already holds {listed}, which {command} did not write there or which was edited "
                          "since; nothing was written. Move those files out of the way (or keep your edits and "
                          "export into another folder)")
    if own and not overwrite:
        example = min(own, key=lambda f: (f.startswith("."), f))
        raise ConfigError(f"{target} already holds an earlier {command} ({len(own)} of its files, e.g. {example}); "
                          "nothing was written. Pass --overwrite to replace the files it wrote (files you edited or "
                          "added are never replaced), or export into another folder")


def publish(staging: Path, target: Path, *, overwrite: bool, command: str) -> list[Path]:
    """Move every file of ``staging`` into ``target`` (owner-only), or refuse with nothing moved: a file there
    that ``command`` did not write, or that was edited since, is never replaced; its own unchanged files are
    replaced only with ``overwrite``. Returns the files placed."""
    check(staging, target, overwrite=overwrite, command=command)
    private_folder(target)
    record = {rel: sha for rel, sha in written(target).items() if (target / rel).is_file()}
    placed: list[Path] = []
    for rel in _staged(staging):
        source, there = staging / rel, target / rel
        private_folder(there.parent)
        record[rel] = sha256_of(source)
        make_private(source)
        source.replace(there)
        placed.append(there)
    (target / RECORD).write_text(json.dumps({"writer": command, "files": record}, indent=1, sort_keys=True),
                                 encoding="utf-8")
    make_private(target / RECORD)
    return placed
