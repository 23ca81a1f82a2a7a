"""``vflo split``: cut the parties' own files into training, scoring and test files for a deployment.

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
    """One party's file for ``vflo split``: its name, where the file is, its ID column."""

    name: str
    file: Path
    id_column: str


def cut_files(
    parties: Sequence[PartyFileSpec], *, label_column: str, out: Path, test: float | int = 0.2,
    test_from: TestFrom = "aligned", seed: int = 0, overwrite: bool = False,
) -> dict[str, list[Path]]:
    """Write each party's train and serve files and the active party's (the first party's) test file."""
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
    written: dict[str, list[Path]] = {}
    with atomic_dir(out, overwrite=overwrite) as tmp:
        (tmp / ".gitignore").write_text("# party data: never commit it\n*\n")
        for p in parties:
            frame: pd.DataFrame = tables[p.name]
            is_test = frame[p.id_column].astype(str).isin(test_ids).to_numpy()
            frame[~is_test].to_csv(tmp / f"{p.name}_train.csv", index=False)
            serve = frame[is_test]
            if p.name == active.name:
                serve.to_csv(tmp / f"{p.name}_test.csv", index=False)
                serve = serve.drop(columns=[label_column])
            serve.to_csv(tmp / f"{p.name}_serve.csv", index=False)
            written[p.name] = [out / f"{p.name}_{k}.csv" for k in ("train", "serve")]
        written[active.name].append(out / f"{active.name}_test.csv")
    return written
