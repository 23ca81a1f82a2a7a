"""A party's own model folder across trainings: every training's part kept under its model ID, side by side.

A deployed party names one folder for its parts in its config (``models = ...``) and serves every training of
every coordinator from it, so one training must never replace another's part there::

    MODELS/LABEL/MODEL_ID/PARTY/manifest.json   this party's part of one training (vflo.artifacts' format)
    MODELS/LABEL/MODEL_ID/PARTY/state.vflo

The coordinator asks for a part by method label and model ID (the model card's), never by path. A model saved
in one process (``vflo run --save DIR``, ``model.save(DIR)``) is one training in a folder of its own and keeps
the flat ``DIR/LABEL/PARTY`` layout of :class:`~vflo.artifacts.PartStore`; a part a deployed party saved that
way before this layout (``MODELS/LABEL/PARTY``) is still read when its model ID is the one asked for.

:func:`list_parts` and :func:`prune` are ``vflo models list`` and ``vflo models prune --keep N``: they read
manifests only, and remove nothing that is not a part vflo wrote.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vflo.artifacts import CARD, FORMAT, MANIFEST, STATE_FILE, ArtifactError, Part, PartStore, read_part, safe_name
from vflo.errors import ConfigError

logger = logging.getLogger(__name__)


class ModelShelf(PartStore):
    """A party's model folder where trainings live side by side: each part under ``LABEL/MODEL_ID/PARTY``."""

    def part_folder(self, label: str, model_id: str | None) -> Path:
        if model_id is None:
            raise ConfigError("a part on a model shelf is named by its model ID; none was given")
        return self.root / safe_name(label, "method label") / safe_name(model_id, "model id") / \
            safe_name(self.party, "party name")

    def load(self, *, label: str, model_id: str | None) -> Part:
        if model_id is None:
            newest = [p for p in list_parts(self.root) if p.label == label and p.party == self.party]
            if not newest:
                raise ArtifactError(f"party {self.party!r} holds no part of {label!r} in {self.root}")
            model_id = max(newest, key=lambda p: p.created).model_id
        folder = self.part_folder(label, model_id)
        legacy = self.root / safe_name(label, "method label") / safe_name(self.party, "party name")
        old = _read(legacy / MANIFEST)
        if not (folder / MANIFEST).is_file() and old is not None and old.get("model_id") == model_id:
            folder = legacy
        if not (folder / MANIFEST).is_file():
            held = sorted({p.model_id for p in list_parts(self.root) if p.label == label and p.party == self.party})
            raise ArtifactError(
                f"party {self.party!r} holds no part of {label!r} from training {model_id} in its model folder "
                f"{self.root} (it holds {', '.join(held[-5:]) if held else 'none of that label'}): the model was "
                "trained while this party saved elsewhere (its config's models = ..., or serve --save), or its part "
                "was pruned; start the party with the folder it saved into, or train and save the model again")
        return read_part(folder, party=self.party, model_id=model_id, label=label)


@dataclass(frozen=True)
class SavedEntry:
    """One part (or model card) found in a model folder, as its manifest describes it."""

    path: Path
    label: str
    model_id: str
    party: str
    method: str
    created: str
    bytes: int
    card: bool = False

    def row(self) -> dict[str, Any]:
        return {"label": self.label, "model_id": self.model_id, "party": self.party if not self.card else "(card)",
                "method": self.method, "created": self.created, "bytes": self.bytes, "path": str(self.path)}


def _read(path: Path) -> Mapping[str, Any] | None:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return raw if isinstance(raw, dict) and raw.get("format") == FORMAT else None


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())


def list_parts(root: Path, *, cards: bool = False) -> list[SavedEntry]:
    """Every part vflo saved under ``root`` (both layouts; with ``cards``, model cards too), oldest first.
    Anything that is not a manifest of this vflo's format is passed over, never read further."""
    root = Path(root)
    if not root.is_dir():
        raise ConfigError(f"model folder {root} does not exist; give the folder a party saves its parts in (its "
                          "config's models = ..., or the DIR of vflo run --save DIR)")
    found: list[SavedEntry] = []
    for manifest in sorted(root.glob(f"*/{MANIFEST}")) + sorted(root.glob(f"*/*/{MANIFEST}")) + \
            sorted(root.glob(f"*/*/*/{MANIFEST}")):
        raw = _read(manifest)
        if raw is None or raw.get("method") == "checkpoint":
            continue
        found.append(SavedEntry(path=manifest.parent, label=str(raw.get("label")), model_id=str(raw.get("model_id")),
                                party=str(raw.get("party")), method=str(raw.get("method")),
                                created=str(raw.get("created", "")), bytes=_size(manifest.parent)))
    if cards:
        for card in sorted(root.glob(f"*/{CARD}")):
            raw = _read(card)
            if raw is not None:
                found.append(SavedEntry(path=card.parent, label=str(raw.get("label")),
                                        model_id=str(raw.get("model_id")), party=str(raw.get("active")),
                                        method=str(raw.get("method")), created="", bytes=card.stat().st_size,
                                        card=True))
    return sorted(found, key=lambda e: (e.label, e.created, e.model_id, e.party))


def prune(root: Path, *, keep: int, party: str | None = None, dry_run: bool = False) -> list[SavedEntry]:
    """Remove all but the newest ``keep`` parts of each method label and party (``party``: that party's only);
    return what was (``dry_run``: would be) removed. Only folders that hold a vflo part and nothing else go."""
    if keep < 1:
        raise ConfigError(f"--keep is how many trainings of each method to keep, at least 1, not {keep}")
    groups: dict[tuple[str, str], list[SavedEntry]] = {}
    for entry in list_parts(root):
        if party is None or entry.party == party:
            groups.setdefault((entry.label, entry.party), []).append(entry)
    removed: list[SavedEntry] = []
    for entries in groups.values():
        for entry in sorted(entries, key=lambda e: (e.created, e.model_id))[:-keep]:
            others = sorted(p.name for p in entry.path.iterdir() if p.name not in (MANIFEST, STATE_FILE))
            if others:
                logger.warning("kept %s: it holds %s besides a vflo part, which vflo did not write", entry.path,
                               others[:3])
                continue
            removed.append(entry)
            if dry_run:
                continue
            shutil.rmtree(entry.path)
            parent = entry.path.parent
            if parent != Path(root) and parent.name == entry.model_id and not any(parent.iterdir()):
                parent.rmdir()
    return removed
