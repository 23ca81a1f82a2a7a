"""Files and folders that hold IDs, rows, labels, keys or models: only their owner may read them.

vflo writes such files (kept alignments, exports, spill files, checkpoints, saved parts, scores, a party's privacy
account and audit log) 0600 in folders 0700, whatever the process's umask: a party's host may have other users.
The command line also sets the umask to 077, so what a library underneath writes follows.
"""

from __future__ import annotations

import os
from pathlib import Path

FOLDER_MODE = 0o700
FILE_MODE = 0o600


def private_folder(path: Path) -> Path:
    """``path`` made, with its missing parents, each :data:`FOLDER_MODE`. A folder that already existed is left as
    it is: one the user made (a working folder, a home) is not vflo's to change."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for folder in reversed(missing):
        folder.mkdir(exist_ok=True, mode=FOLDER_MODE)
        folder.chmod(FOLDER_MODE)  # mkdir's mode passes through the umask
    return path


def private_file(path: Path) -> Path:
    """``path`` set to :data:`FILE_MODE`."""
    path.chmod(FILE_MODE)
    return path


def make_private(root: Path) -> None:
    """``root`` (a file or folder vflo wrote) and everything under it: folders :data:`FOLDER_MODE`, files
    :data:`FILE_MODE` (links left alone: their targets are not vflo's to change)."""
    if root.is_symlink():
        return
    if root.is_file():
        private_file(root)
        return
    root.chmod(FOLDER_MODE)
    for folder, dirs, files in os.walk(root):
        for name in dirs:
            if not (Path(folder) / name).is_symlink():
                (Path(folder) / name).chmod(FOLDER_MODE)
        for name in files:
            if not (Path(folder) / name).is_symlink():
                (Path(folder) / name).chmod(FILE_MODE)


def owner_only_umask() -> int:
    """Set the process's umask so that files it creates are its owner's only (077); the previous umask."""
    return os.umask(0o077)
