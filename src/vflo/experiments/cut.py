"""``vflo holdout``: cut the parties' own files into training, scoring and test files for a deployment.

Test rows are held out of *every* party's training file, so a deployed run cannot score rows it trained
on. For each party NAME it writes ``NAME_train.csv`` (its rows minus the test rows) and ``NAME_serve.csv``
(the test rows it holds, features only: what it contributes when a method scores together), and for the
active party ``NAME_test.csv`` (the test rows with their labels, to score the methods). Columns are kept
as they are in each file; every party still reads and encodes its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from vflo.data.files import TableEncoding, read_table
from vflo.errors import AlignmentError, ConfigError
from vflo.experiments.output import atomic_dir
from vflo.experiments.protocols import TestFrom, draw_test
from vflo.seeding import numpy_rng


@dataclass(frozen=True)
class PartyFileSpec:
    """One party's file for ``vflo holdout``: its name, where the file is, its ID column."""

    name: str
    file: Path
    id_column: str


@dataclass(frozen=True)
class CutFile:
    """One file ``vflo holdout`` wrote: its rows, and the missing values of each column that has any."""

    path: Path
    rows: int
    missing: dict[str, int]


@dataclass(frozen=True)
class Cut:
    """What ``vflo holdout`` wrote, by party; ``pool``: the people the test rows were drawn from (``pool_what``)."""

    files: dict[str, list[CutFile]]
    test_rows: int
    pool: int
    pool_what: str


POOLS = {"aligned": "people every party holds", "active": "the active party's people",
         "active_only": "the active party's people no other party holds"}


def _described(frame: pd.DataFrame, path: Path) -> CutFile:
    missing = frame.isna().sum()
    return CutFile(path=path, rows=len(frame), missing={str(c): int(n) for c, n in missing.items() if n})


def cut_files(
    parties: Sequence[PartyFileSpec], *, label_column: str, out: Path, test: float | int = 0.2,
    test_from: TestFrom = "aligned", seed: int = 0, overwrite: bool = False,
) -> Cut:
    """Write each party's train and serve files and the active party's (the first party's) test file; how many
    rows each holds and which columns have missing values. ``test`` is a share (or a count) of the people
    ``test_from`` names: by default those every party holds."""
    if len(parties) < 2:
        raise ConfigError("vflo split needs the active party's file and at least one other party's")
    names = [p.name for p in parties]
    if len(set(names)) != len(names):
        raise ConfigError(f"party names must be unique, got {names}")
    tables = {p.name: read_table(p.file, party=p.name, id_column=p.id_column) for p in parties}
    active = parties[0]
    # Only the labels matter here (to stratify the test rows); each party encodes its own features later.
    encoding = TableEncoding.fit(tables[active.name], party=active.name, id_column=active.id_column,
                                 label_column=label_column, feature_columns=())
    y = encoding.labels(tables[active.name])
    ids = {p.name: tables[p.name][p.id_column].astype(str).to_numpy() for p in parties}
    for name, values in ids.items():
        if len(np.unique(values)) != len(values):
            raise ConfigError(f"party {name!r}: its ID column repeats IDs; each person must appear once")
    mine = ids[active.name]
    others = [set(ids[p.name].tolist()) for p in parties[1:]]
    if test_from == "aligned":
        keep = np.fromiter((all(v in o for o in others) for v in mine.tolist()), dtype=bool, count=len(mine))
    elif test_from == "active_only":
        keep = np.fromiter((not any(v in o for o in others) for v in mine.tolist()), dtype=bool, count=len(mine))
    else:
        keep = np.ones(len(mine), dtype=bool)
    if not keep.any():
        raise AlignmentError(f"no row of {active.name!r} qualifies as a test row with test_from = {test_from!r}: "
                             "check that the parties' ID columns hold the same IDs")
    test_ids = set(draw_test(mine[keep], y[keep], test, numpy_rng(seed, "split", 0), True, "--test").tolist())
    files: dict[str, list[CutFile]] = {}
    with atomic_dir(out, overwrite=overwrite) as tmp:
        (tmp / ".gitignore").write_text("# party data: never commit it\n*\n")
        for p in parties:
            frame: pd.DataFrame = tables[p.name]
            is_test = frame[p.id_column].astype(str).isin(test_ids).to_numpy()
            parts = {"train": frame[~is_test], "serve": frame[is_test]}
            if p.name == active.name:
                parts["test"] = parts["serve"]
                parts["serve"] = parts["serve"].drop(columns=[label_column])
            files[p.name] = []
            for kind, part in parts.items():
                part.to_csv(tmp / f"{p.name}_{kind}.csv", index=False)
                files[p.name].append(_described(part, out / f"{p.name}_{kind}.csv"))
    return Cut(files=files, test_rows=len(test_ids), pool=int(keep.sum()), pool_what=POOLS[test_from])
