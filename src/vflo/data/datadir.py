"""Where dataset files live and how they are verified.

Files that no Python package ships are read from a data directory (``--data-dir``,
then ``VFLO_DATA_DIR``, then ``~/.vflo/data``) and checked against a known SHA-256
before use, so a truncated download or a different release cannot silently change
results.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from vflo.errors import DataFileError

ENV_VAR = "VFLO_DATA_DIR"
DEFAULT_DATA_DIR = Path("~/.vflo/data")


@dataclass(frozen=True)
class DataFile:
    """A file a dataset needs, with the checksums of its accepted forms."""

    name: str
    sha256: str
    description: str
    # Same content stored differently (e.g. uncompressed): name -> sha256.
    alternatives: tuple[tuple[str, str], ...] = ()
    # How a package can provide the file instead: a shell command to run, and where the file then is:
    # inside an installed Python package (package name, then folders), or in a system folder.
    install_hint: str = ""
    package: tuple[str, ...] = ()
    system_dir: str = ""

    def elsewhere(self) -> tuple[Path | None, ...]:
        places: list[Path | None] = []
        if self.package:
            places.append(package_dir(*self.package))
        if self.system_dir:
            places.append(Path(self.system_dir))
        return tuple(places)


def resolve_data_dir(explicit: str | Path | None = None) -> Path:
    """The data directory: the explicit argument, else ``$VFLO_DATA_DIR``, else ``~/.vflo/data``."""
    if explicit is not None:
        return Path(explicit).expanduser()
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser()
    return DEFAULT_DATA_DIR.expanduser()


def sha256_of(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def package_dir(package: str, *parts: str) -> Path | None:
    """A folder inside an installed package, found without importing the package."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))).joinpath(*parts)


def locate(file: DataFile, data_dir: str | Path | None = None) -> Path:
    """Path of a verified copy of ``file`` (data directory first, then where a package puts it).

    A :class:`DataFileError` says what to put where, or what to install.
    """
    directory = resolve_data_dir(data_dir)
    where = (
        f"--data-dir {data_dir}" if data_dir is not None
        else f"${ENV_VAR}" if os.environ.get(ENV_VAR) else f"the default {DEFAULT_DATA_DIR}"
    )
    candidates = ((file.name, file.sha256), *file.alternatives)
    folders = [directory, *(d for d in file.elsewhere() if d is not None)]
    for folder, (name, expected) in ((f, c) for f in folders for c in candidates):
        path = folder / name
        if not path.is_file():
            continue
        actual = sha256_of(path)
        if actual != expected:
            raise DataFileError(
                f"{path} fails its checksum: SHA-256 is {actual}, expected {expected}. The file is corrupt "
                f"or a different release; replace it with {file.description}"
            )
        return path
    install = f"; or install it: {file.install_hint}" if file.install_hint else ""
    raise DataFileError(
        f"{file.name} not found in {directory} (data directory from {where}). Put {file.description} "
        f"there as {file.name} (SHA-256 {file.sha256}), or point --data-dir / ${ENV_VAR} at the folder "
        f"that holds it{install}"
    )
