"""Model artifacts: each party writes only its own part of a trained model, and loads it without running code.

A saved model is a folder per method label holding one folder per party::

    MODEL_DIR/LABEL/model.json          the model card (the active party writes it)
    MODEL_DIR/LABEL/PARTY/manifest.json that party's manifest: method, config, columns, preprocessing,
                                        vflo version, model id and the SHA-256 of every file
    MODEL_DIR/LABEL/PARTY/state.vflo    its fitted state: arrays and plain values in vflo's message codec

Deployed, each host writes only ``PARTY/`` (and the active party ``model.json``): no part crosses to another
host. The state file is a codec frame, the same format every message travels in: it is checked on reading
and never evaluated, so loading cannot run code (no pickle; scikit-learn models other than the built-in ones
go through skops' secure format, inside the frame). A part is refused, with a message that says why, when
a file is missing, truncated or altered (checksums), written by an incompatible vflo version, saved by another
training run (model id), or when the rows to score do not have the columns it was trained on.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import secrets
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from vflo.comm.codec import decode, encode
from vflo.comm.message import Message, Value
from vflo.data.files import Source, TableEncoding, read_table
from vflo.data.partydata import PartyData
from vflo.data.preprocessing import Standardizer
from vflo.errors import ConfigError, DataError, ProtocolError, VfloError
from vflo.private import make_private, private_folder
from vflo.version import __version__

# 2: what a part keeps is each method's ``saves`` declaration (party names as string arrays, widths as names
# and sizes), read by one codec; a format-1 part is refused, with the fix (save the model again).
FORMAT = 2
STATE_FILE, MANIFEST, CARD = "state.vflo", "manifest.json", "model.json"
MAX_STATE_BYTES = 1 << 34


class ArtifactError(VfloError):
    """A saved model cannot be used: missing, altered, truncated, from another version or another model."""

    exit_code = 3


def new_model_id() -> str:
    return secrets.token_hex(8)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def safe_name(name: str, what: str) -> str:
    """A folder name from a party name or method label: never a path that leaves the model folder."""
    if not name or not name.replace("_", "").replace("-", "").replace(".", "").isalnum() or name.startswith("."):
        raise ConfigError(f"{what} {name!r} cannot name a folder: use letters, digits, '-', '_' and '.'")
    return name


@dataclass(frozen=True)
class Preprocessing:
    """What a party does to a raw table of its own before its model sees it: its columns, how its file is
    read (where it came from one), and the standardisation fitted on its training rows. Names and
    per-column statistics only, never a row."""

    columns: tuple[str, ...]
    encoding: TableEncoding | None = None
    scaler: Standardizer | None = None
    #: Columns its file has that the party dropped by its own selection (``vflo explore --select``): rows to score
    #: that still have them are read without them.
    dropped: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"columns": list(self.columns), "encoding": None if self.encoding is None else self.encoding.to_dict(),
                "scaler": None if self.scaler is None else {"mean": self.scaler.mean_.tolist(),
                                                            "scale": self.scaler.scale_.tolist()},
                "dropped": list(self.dropped)}

    def without(self, columns: Sequence[str]) -> Preprocessing:
        """The same, with ``columns`` dropped: from the columns, from the standardisation, and named as dropped."""
        gone = set(columns)
        keep = np.asarray([c not in gone for c in self.columns], dtype=bool)
        scaler = None if self.scaler is None else Standardizer(mean_=self.scaler.mean_[keep],
                                                              scale_=self.scaler.scale_[keep])
        return Preprocessing(columns=tuple(c for c, k in zip(self.columns, keep, strict=True) if k),
                             encoding=self.encoding, scaler=scaler,
                             dropped=(*self.dropped, *(c for c, k in zip(self.columns, keep, strict=True) if not k)))

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Preprocessing:
        scaler = raw.get("scaler")
        return cls(columns=tuple(str(c) for c in raw.get("columns", ())),
                   dropped=tuple(str(c) for c in raw.get("dropped", ())),
                   encoding=None if raw.get("encoding") is None else TableEncoding.from_dict(raw["encoding"]),
                   scaler=None if scaler is None else Standardizer(mean_=np.asarray(scaler["mean"], dtype=np.float64),
                                                                   scale_=np.asarray(scaler["scale"],
                                                                                     dtype=np.float64)))

    def rows(self, data: PartyData | Source, *, party: str) -> PartyData:
        """Rows to score in the form the model was trained on: a file (or a database's rows) read with the saved
        encoding, or a table whose columns must be the saved ones; then the saved standardisation."""
        return self._prepared(data if isinstance(data, PartyData) else self.read(data, party=party), party)

    def read(self, path: Source, *, party: str) -> PartyData:
        """The rows of a file (or a database's, :mod:`vflo.data.sql`) read with the saved encoding (its columns and
        categories), not yet standardised."""
        if self.encoding is None:
            raise DataError(f"party {party!r} was trained on a table, not a file: pass the rows to score as "
                            "PartyData with its columns")
        frame = read_table(path, party=party, id_column=self.encoding.id_column)
        return PartyData.encoded(frame, self.encoding, labelled=False)

    def _prepared(self, data: PartyData, party: str) -> PartyData:
        if self.dropped and set(data.columns) == {*self.columns, *self.dropped}:
            data = data.without(self.dropped)  # columns the party selected out: its model never read them
        if data.columns != self.columns:
            missing = [c for c in self.columns if c not in data.columns]
            extra = [c for c in data.columns if c not in self.columns]
            raise DataError(f"party {party!r}: the rows to score have columns that differ from those its model was "
                            f"trained on (missing {missing[:6]}, unexpected {extra[:6]}); give them the training "
                            "file's columns, in the same order")
        if data.party != party or data.y is not None:  # rows to score carry no labels, and belong to ``party``
            data = PartyData(party=party, ids=data.ids, X=data.X, columns=data.columns, categorical=data.categorical,
                             encoding=data.encoding)
        return data if self.scaler is None else self.scaler.apply(data)


@dataclass(frozen=True)
class Part:
    """One party's saved part, read and checked."""

    folder: Path
    manifest: Mapping[str, Any]
    state: dict[str, Value]

    @property
    def preprocessing(self) -> Preprocessing:
        return Preprocessing.from_dict(self.manifest.get("preprocessing") or {})

    @property
    def manifest_sha256(self) -> str:
        return sha256_of(self.folder / MANIFEST)


def write_part(folder: Path, *, party: str, role: str, method: str, label: str, config: str, model_id: str,
               state: Mapping[str, Value], preprocessing: Preprocessing | None) -> str:
    """Write ``folder`` (replacing this party's earlier part there whole, or not at all; never a folder it did not
    write, :func:`replaceable`); return the SHA-256 of its manifest."""
    frame = encode(Message(sender=party, receiver=party, kind="artifact.state", round=0, payload=dict(state)),
                   max_bytes=MAX_STATE_BYTES)
    replaceable(folder, party=party)
    private_folder(folder.parent)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        (tmp / STATE_FILE).write_bytes(frame)
        manifest = {
            "format": FORMAT, "vflo": __version__, "model_id": model_id, "label": label, "method": method,
            "config": json.loads(config), "party": party, "role": role,
            "preprocessing": None if preprocessing is None else preprocessing.to_dict(),
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
            "files": {STATE_FILE: sha256_of(tmp / STATE_FILE)},
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")
        make_private(tmp)
        if folder.exists():
            shutil.rmtree(folder)
        tmp.replace(folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return sha256_of(folder / MANIFEST)


def replaceable(folder: Path, *, party: str) -> None:
    """Refuse to save over ``folder`` unless it is absent or a part ``party`` saved there and nothing else: a
    party never replaces a folder it did not write (another party's part, a hand-made folder, foreign files)."""
    if not folder.exists() and not folder.is_symlink():
        return
    why = None
    if folder.is_symlink() or not folder.is_dir():
        why = "it is not a folder"
    else:
        others = sorted(p.name for p in folder.iterdir() if p.name not in (MANIFEST, STATE_FILE))
        try:
            manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            manifest = None
        if others:
            why = f"it holds {others[:3]}, which vflo did not write there"
        elif not isinstance(manifest, dict) or "model_id" not in manifest:
            why = "it holds no vflo model part"
        elif manifest.get("party") != party:
            why = f"it holds party {manifest.get('party')!r}'s part"
    if why is not None:
        raise ArtifactError(f"party {party!r} will not save its part over {folder}: {why}; move it out of the way or "
                            "save into another folder")


def _compatible(saved: str) -> bool:
    """Same major and minor version: the state layout of a method may change between minor versions."""
    return saved.split(".")[:2] == __version__.split(".")[:2]


def read_part(folder: Path, *, party: str, model_id: str | None = None, label: str | None = None) -> Part:
    """Read and check one party's part; an :class:`ArtifactError` says what is wrong with it."""
    manifest_path = folder / MANIFEST
    if not manifest_path.is_file():
        raise ArtifactError(f"no saved model part at {folder} (no {MANIFEST}); was the model saved there, with "
                            f"--save at party {party!r}?")
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ArtifactError(f"{manifest_path} is not valid JSON ({exc}): the file was altered or truncated") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ArtifactError(f"{manifest_path} is not a vflo model manifest of format {FORMAT} (it says "
                            f"{manifest.get('format') if isinstance(manifest, dict) else None}): fit and save the "
                            "model again with this vflo")
    if not _compatible(str(manifest.get("vflo", ""))):
        raise ArtifactError(f"{folder} was saved by vflo {manifest.get('vflo')}; this is vflo {__version__}, which "
                            "reads models saved by the same major and minor version: load it with that version, or "
                            "train and save it again")
    if manifest.get("party") != party:
        raise ArtifactError(f"{folder} holds party {manifest.get('party')!r}'s part, not {party!r}'s")
    if label is not None and manifest.get("label") != label:
        raise ArtifactError(f"{folder} holds method {manifest.get('label')!r}, not {label!r}")
    if model_id is not None and manifest.get("model_id") != model_id:
        raise ArtifactError(f"party {party!r}'s part in {folder} comes from another training (model id "
                            f"{manifest.get('model_id')}, expected {model_id}): every party must load the parts saved "
                            "by the same run")
    files = manifest.get("files")
    if not isinstance(files, dict) or set(files) != {STATE_FILE}:
        raise ArtifactError(f"{manifest_path} lists files {files!r}; expected exactly {STATE_FILE}")
    path = folder / STATE_FILE
    if not path.is_file():
        raise ArtifactError(f"{path} is missing: the model part is incomplete")
    actual = sha256_of(path)
    if actual != files[STATE_FILE]:
        raise ArtifactError(f"{path} has SHA-256 {actual}, but its manifest records {files[STATE_FILE]}: the file was "
                            "altered or truncated after it was saved; restore it or save the model again")
    try:
        message = decode(path.read_bytes(), max_bytes=MAX_STATE_BYTES)
    except VfloError as exc:
        raise ArtifactError(f"{path} cannot be read as a vflo state ({exc})") from exc
    return Part(folder=folder, manifest=manifest, state=dict(message.payload))


@dataclass(frozen=True)
class ModelCard:
    """``model.json``: which method, which parties in which role, the task and its classes."""

    label: str
    method: str
    config: str
    model_id: str
    seed: int
    task: str
    n_classes: int | None
    classes: tuple[str, ...]
    active: str
    parties: tuple[tuple[str, str], ...]
    inference: str
    manifests: Mapping[str, str] = field(default_factory=dict)

    def write(self, folder: Path) -> None:
        private_folder(folder)
        raw = {"format": FORMAT, "vflo": __version__, "label": self.label, "method": self.method,
               "config": json.loads(self.config), "model_id": self.model_id, "seed": self.seed, "task": self.task,
               "n_classes": self.n_classes, "classes": list(self.classes), "active": self.active,
               "parties": [list(p) for p in self.parties], "inference": self.inference,
               "manifests": dict(self.manifests)}
        (folder / CARD).write_text(json.dumps(raw, indent=1), encoding="utf-8")
        make_private(folder / CARD)

    @classmethod
    def read(cls, folder: Path) -> ModelCard:
        path = folder / CARD
        if not path.is_file():
            raise ArtifactError(f"no model at {folder} (no {CARD}); save one with `vflo run ... --save DIR` or "
                                "model.save(DIR)")
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            if raw.get("format") != FORMAT:
                raise ArtifactError(f"{path} is not a vflo model card of format {FORMAT} (it says "
                                    f"{raw.get('format')}): fit and save the model again with this vflo")
            if not _compatible(str(raw.get("vflo", ""))):
                raise ArtifactError(f"{folder} was saved by vflo {raw.get('vflo')}; this is vflo {__version__}: load "
                                    "it with that version, or train and save it again")
            return cls(label=str(raw["label"]), method=str(raw["method"]), config=json.dumps(raw["config"]),
                       model_id=str(raw["model_id"]), seed=int(raw["seed"]), task=str(raw["task"]),
                       n_classes=None if raw["n_classes"] is None else int(raw["n_classes"]),
                       classes=tuple(str(c) for c in raw["classes"]), active=str(raw["active"]),
                       parties=tuple((str(n), str(r)) for n, r in raw["parties"]), inference=str(raw["inference"]),
                       manifests={str(k): str(v) for k, v in raw.get("manifests", {}).items()})
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise ArtifactError(f"{path} is malformed ({exc}): the file was altered or truncated") from exc


class PartStore:
    """Where one party keeps the parts it saves and loads: its own folder, chosen by its own config.

    A coordinator names a method label and a model id, never a path, so no peer can make a party write or
    read outside its folder.
    """

    def __init__(self, root: Path, *, party: str, role: str, preprocessing: Preprocessing | None = None) -> None:
        self.root = Path(root)
        self.party = party
        self.role = role
        self.preprocessing = preprocessing

    def folder(self, label: str) -> Path:
        return self.root / safe_name(label, "method label") / safe_name(self.party, "party name")

    def drop_columns(self, columns: Sequence[str]) -> None:
        """Parts saved from now on read their rows without ``columns`` (the party's own selection)."""
        if self.preprocessing is not None:
            self.preprocessing = self.preprocessing.without(columns)

    def part_folder(self, label: str, model_id: str | None) -> Path:
        """Where this store keeps its part of training ``model_id``: here one model per label (a folder saved by
        one run); a deployed party's shelf keeps every training (:class:`vflo.shelf.ModelShelf`)."""
        return self.folder(label)

    def save(self, *, label: str, method: str, config: str, model_id: str, state: Mapping[str, Value]) -> str:
        return write_part(self.part_folder(label, model_id), party=self.party, role=self.role, method=method,
                          label=label, config=config, model_id=model_id, state=state,
                          preprocessing=self.preprocessing)

    def load(self, *, label: str, model_id: str | None) -> Part:
        return read_part(self.part_folder(label, model_id), party=self.party, model_id=model_id, label=label)

    def serving_rows(self, part: Part) -> PartyData | None:
        """In one process the rows to score are handed to the node already prepared."""
        return None


class CheckpointStore:
    """One party's training checkpoints: ``ROOT/RUN/epoch-NNNNN/PARTY``, each a checked part (state and manifest).

    ``RUN`` is a key the coordinator derives from the method, its config, the seed and the split, so a resumed
    run finds its own checkpoints and no other run's; the folder itself is the party's own choice.
    """

    #: Checkpoints a party keeps of one run: the newest ones. A coordinator asking for checkpoints at epochs of its
    #: choosing (each a whole copy of the party's state, on the party's disk) fills no more than this many slots.
    KEEP = 3

    def __init__(self, root: Path, *, party: str, role: str, keep: int = KEEP) -> None:
        if keep < 1:
            raise ConfigError(f"a checkpoint store keeps at least 1 checkpoint per run, not {keep}")
        self.root = Path(root)
        self.party = party
        self.role = role
        self.keep = keep

    def _folder(self, run: str, epoch: int) -> Path:
        if not run.isalnum():
            raise ConfigError(f"checkpoint run key {run!r} must be letters and digits")
        return self.root / run / f"epoch-{epoch:05d}" / safe_name(self.party, "party name")

    def save(self, run: str, epoch: int, state: Mapping[str, Value]) -> None:
        """Write the checkpoint after ``epoch`` (an earlier one of that epoch is replaced), then keep only the
        newest :attr:`keep` of the run: this party's own files, written by this store."""
        if not 0 <= epoch <= 99_999:
            raise ProtocolError(f"checkpoint epoch {epoch} is outside 0..99999; refused")
        write_part(self._folder(run, epoch), party=self.party, role=self.role, method="checkpoint", label=run,
                   config="{}", model_id=run, state=state, preprocessing=None)
        for old in self.epochs(run)[: -self.keep]:
            folder = self._folder(run, old)
            shutil.rmtree(folder, ignore_errors=True)
            with contextlib.suppress(OSError):  # the epoch's folder, once no party's checkpoint is left in it
                folder.parent.rmdir()

    def load(self, run: str, epoch: int) -> dict[str, Value]:
        folder = self._folder(run, epoch)
        try:
            return read_part(folder, party=self.party, model_id=run, label=run).state
        except ArtifactError as exc:
            raise ArtifactError(f"checkpoint {folder} cannot be used ({exc}); delete {folder.parent} at every party "
                                "to resume from the checkpoint before it") from exc

    def epochs(self, run: str) -> list[int]:
        """The epochs after which this party holds a complete checkpoint of ``run``."""
        if not run.isalnum() or not (self.root / run).is_dir():
            return []
        found = []
        for folder in (self.root / run).glob("epoch-*"):
            if (folder / self.party / MANIFEST).is_file():
                found.append(int(folder.name.removeprefix("epoch-")))
        return sorted(found)
