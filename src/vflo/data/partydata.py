"""`PartyData`: the one table a party ever sees.

A party brings sample IDs, a float feature matrix with column names and, if it
is the active party, labels. Everything is validated on construction so that
later code can trust it: IDs unique, features finite floats, labels aligned.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from vflo.data.files import MissingValuesError, Source, Table, TableEncoding, open_table
from vflo.data.order import in_order, positions_in
from vflo.errors import DataError

IdArray = np.ndarray


#: From this many text IDs, a party's rows are checked unique without a hash index, built when first needed.
INDEX_LATER_FROM = 100_000


def _unique_text(ids: np.ndarray) -> bool:
    """Whether text IDs are distinct: by neighbours where they are sorted (most files), else by Arrow's hash of
    their UTF-8 bytes (no Python string per ID)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if in_order(ids, strictly=True):
        return True
    return int(pc.count_distinct(pa.array(ids, type=pa.string())).as_py()) == len(ids)


def _as_id_array(ids: Sequence[Any] | np.ndarray) -> np.ndarray:
    arr = np.asarray(ids)
    if arr.ndim != 1:
        raise DataError(f"sample IDs must be one-dimensional, got shape {arr.shape}")
    if arr.size == 0 and arr.dtype.kind not in "iuU":
        return np.empty(0, dtype=np.int64)
    if arr.dtype.kind in "iu":
        return arr.astype(np.int64, copy=False)
    if arr.dtype.kind == "U":
        return arr
    if arr.dtype.kind == "O":
        try:
            return arr.astype(str)  # str() of each ID, in numpy's loop
        except (TypeError, ValueError) as exc:  # pragma: no cover - str() of numpy scalars does not fail
            raise DataError(f"sample IDs must be integers or strings: {exc}") from exc
    if arr.dtype.kind == "f" and arr.size and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)):
        return arr.astype(np.int64)
    raise DataError(
        f"sample IDs must be integers or strings, got dtype {arr.dtype}; "
        "convert the ID column to int or str before building PartyData"
    )


@dataclass(frozen=True, eq=False)
class PartyData:
    """One party's samples.

    Attributes:
        party: the owning party's name.
        ids: unique sample IDs (int64 or str), one per row.
        X: float32 feature matrix of shape (n, len(columns)); a label-only party has zero columns.
        columns: feature names, unique, disjoint from every other party's.
        y: labels (int64 class indices or float64 targets) or ``None`` for a passive party.
        categorical: the columns that hold category codes (0, 1, 2, ...) rather than quantities;
            they are not standardised, and methods that care (RAP) one-hot encode them.
        encoding: how the table was read from the party's file (:class:`~vflo.data.files.TableEncoding`:
            feature columns, categories, class names), where it came from one; names only, no values.
    """

    party: str
    ids: np.ndarray
    X: np.ndarray
    columns: tuple[str, ...]
    y: np.ndarray | None = None
    categorical: tuple[str, ...] = ()
    encoding: Any = field(default=None, compare=False)
    _index: pd.Index | None = field(init=False, repr=False, compare=False)
    _cursor: int = field(init=False, repr=False, compare=False, default=0)

    def __post_init__(self) -> None:
        ids = _as_id_array(self.ids)
        if ids is self.ids:  # our own read-only copy, not the caller's array
            ids = ids.copy()
        X = np.asarray(self.X)
        if X.ndim != 2:
            raise DataError(f"party {self.party!r}: features must be a 2-D matrix, got shape {X.shape}")
        if X.dtype.kind not in "fiub":
            raise DataError(
                f"party {self.party!r}: features must be numeric, got dtype {X.dtype}; "
                "encode categorical columns as numbers first"
            )
        X = np.ascontiguousarray(X, dtype=np.float32)
        if X.shape[0] != ids.shape[0]:
            raise DataError(
                f"party {self.party!r}: {ids.shape[0]} IDs but {X.shape[0]} feature rows; "
                "every row needs exactly one ID"
            )
        columns = tuple(str(c) for c in self.columns)
        if len(columns) != X.shape[1]:
            raise DataError(
                f"party {self.party!r}: {len(columns)} column names for {X.shape[1]} feature columns"
            )
        if len(set(columns)) != len(columns):
            dupes = sorted({c for c in columns if columns.count(c) > 1})
            raise DataError(f"party {self.party!r}: column names repeated: {dupes}; rename them")
        # A hash index checks uniqueness and later finds rows by ID. Of many text IDs it is a Python string each
        # (many times the bytes of their text, which the process keeps), so those are checked without one and
        # indexed on first use.
        index = None if ids.dtype.kind == "U" and len(ids) >= INDEX_LATER_FROM else pd.Index(ids)
        if not (_unique_text(ids) if index is None else index.is_unique):
            index = pd.Index(ids)  # the repeated IDs, by name (and the last word where Arrow's check said so)
            if not index.is_unique:
                repeated = index[index.duplicated()].unique()
                raise DataError(
                    f"party {self.party!r}: duplicate sample IDs {repeated[:5].tolist()} ({len(repeated)} in all); "
                    "each sample must appear once: drop or merge the duplicates"
                )
        if not np.all(np.isfinite(X)):
            bad_rows, bad_cols = np.nonzero(~np.isfinite(X))
            where = sorted({columns[c] for c in bad_cols})[:5]
            raise DataError(
                f"party {self.party!r}: {bad_rows.size} NaN or infinite feature values "
                f"(columns {where}); impute or drop them before federating"
            )
        y = self.y
        if y is not None:
            y = np.asarray(y)
            if y.ndim != 1 or y.shape[0] != ids.shape[0]:
                raise DataError(
                    f"party {self.party!r}: labels must be one per row, got shape {y.shape} "
                    f"for {ids.shape[0]} rows"
                )
            if y.dtype.kind in "iub":
                y = y.astype(np.int64)
            elif y.dtype.kind == "f":
                if not np.all(np.isfinite(y)):
                    raise DataError(f"party {self.party!r}: labels contain NaN or infinite values")
                y = y.astype(np.float64)
            else:
                raise DataError(
                    f"party {self.party!r}: labels must be numeric, got dtype {y.dtype}; "
                    "encode class names as integers 0..C-1"
                )
            y.setflags(write=False)
        ids.setflags(write=False)
        X.setflags(write=False)
        categorical = tuple(str(c) for c in self.categorical)
        unknown = [c for c in categorical if c not in columns]
        if unknown:
            raise DataError(f"party {self.party!r}: categorical columns {unknown} are not among its columns")
        for c in categorical:
            values = X[:, columns.index(c)]
            if np.any(values != np.round(values)) or np.any(values < 0):
                raise DataError(
                    f"party {self.party!r}: categorical column {c!r} must hold category codes 0, 1, 2, ...; "
                    "encode the categories as whole numbers"
                )
        object.__setattr__(self, "categorical", categorical)
        object.__setattr__(self, "ids", ids)
        object.__setattr__(self, "X", X)
        object.__setattr__(self, "columns", columns)
        object.__setattr__(self, "y", y)
        object.__setattr__(self, "_index", index)
        object.__setattr__(self, "_cursor", 0)

    def _next_run(self, wanted: np.ndarray) -> np.ndarray | None:
        """Positions of ``wanted`` when they are this party's next rows in order (scoring a file batch after
        batch), found by comparing arrays instead of hashing every ID."""
        start = self._cursor if self._cursor + len(wanted) <= len(self.ids) else 0
        for at in dict.fromkeys((start, 0)):
            stop = at + len(wanted)
            if stop <= len(self.ids) and wanted.dtype.kind == self.ids.dtype.kind and \
                    np.array_equal(self.ids[at:stop], wanted):
                object.__setattr__(self, "_cursor", stop)
                return np.arange(at, stop, dtype=np.int64)
        return None

    def _lookup(self, ids: np.ndarray) -> np.ndarray:
        """Row position of each of ``ids`` (-1 where this party holds none), by a hash index built on first use:
        many row sets are only read, never looked up."""
        index = self._index
        if index is None:
            index = pd.Index(self.ids)
            object.__setattr__(self, "_index", index)
        if ids.dtype.kind != self.ids.dtype.kind:  # an int ID never matches a text one, as in a dict
            return np.full(len(ids), -1, dtype=np.int64)
        return positions_in(index, ids)

    def with_features(self, X: np.ndarray) -> PartyData:
        """The same rows with features ``X`` of the same shape (a transform of these), without validating the
        IDs again."""
        X = np.ascontiguousarray(X, dtype=np.float32)
        if X.shape != self.X.shape or not np.all(np.isfinite(X)):
            raise DataError(f"party {self.party!r}: transformed features must keep shape {self.X.shape} and be "
                            "finite")
        return self._rows(slice(None), X=X)

    def without(self, columns: Sequence[str]) -> PartyData:
        """The same rows without ``columns`` (its own, by name; a name it lacks is refused)."""
        unknown = [c for c in columns if c not in self.columns]
        if unknown:
            raise DataError(f"party {self.party!r} has no columns {unknown} to drop")
        gone = set(columns)
        keep = [j for j, c in enumerate(self.columns) if c not in gone]
        kept = tuple(self.columns[j] for j in keep)
        return PartyData(party=self.party, ids=self.ids, X=np.ascontiguousarray(self.X[:, keep]), columns=kept,
                         y=self.y, categorical=tuple(c for c in self.categorical if c in kept), encoding=self.encoding)

    # -- basic facts -------------------------------------------------------------------------

    @property
    def n_samples(self) -> int:
        return int(self.ids.shape[0])

    @property
    def n_features(self) -> int:
        return int(self.X.shape[1])

    @property
    def has_labels(self) -> bool:
        return self.y is not None

    def __len__(self) -> int:
        return self.n_samples

    def __repr__(self) -> str:
        lab = ", labelled" if self.has_labels else ""
        return f"PartyData({self.party!r}, {self.n_samples} samples x {self.n_features} features{lab})"

    # -- lookup ------------------------------------------------------------------------------

    def positions(self, ids: Sequence[Any] | np.ndarray) -> np.ndarray:
        """Row positions of ``ids``; a :class:`DataError` names IDs this party does not hold."""
        wanted = _as_id_array(ids)
        run = self._next_run(wanted)
        if run is not None:
            return run
        pos = self._lookup(wanted)
        if (pos < 0).any():
            missing = wanted[pos < 0].tolist()
            raise DataError(
                f"party {self.party!r} holds no sample with ID {missing[:5]!r} "
                f"({len(missing)} of {wanted.shape[0]} requested IDs missing)"
            )
        return pos

    def contains(self, ids: Sequence[Any] | np.ndarray) -> np.ndarray:
        """Boolean mask: which of ``ids`` this party holds."""
        result: np.ndarray = self._lookup(_as_id_array(ids)) >= 0
        return result

    def subset(self, ids: Sequence[Any] | np.ndarray) -> PartyData:
        """The rows for ``ids``, in that order."""
        pos = self.positions(ids)
        if len(np.unique(pos)) != len(pos):
            seen = pd.Series(self.ids[pos])
            raise DataError(f"party {self.party!r}: duplicate sample IDs {seen[seen.duplicated()].tolist()[:5]} "
                            "requested; each sample must appear once")
        return self._rows(pos)

    def _rows(self, pos: np.ndarray | slice, X: np.ndarray | None = None) -> PartyData:
        """Rows at positions ``pos`` (distinct), without validating again what this party's rows already passed."""
        out = object.__new__(PartyData)
        y = None if self.y is None else self.y[pos]
        for name, value in (("party", self.party), ("ids", self.ids[pos]), ("X", self.X[pos] if X is None else X),
                            ("columns", self.columns), ("y", y), ("categorical", self.categorical),
                            ("encoding", self.encoding), ("_index", None), ("_cursor", 0)):
            if isinstance(value, np.ndarray):
                value.setflags(write=False)
            object.__setattr__(out, name, value)
        return out

    def require_labels(self) -> np.ndarray:
        if self.y is None:
            raise DataError(
                f"party {self.party!r} has no labels, but this step needs the active party's labels; "
                "give the active party a label column (label_column=...)"
            )
        return self.y

    def to_frame(self, id_column: str = "id", label_column: str = "label") -> pd.DataFrame:
        frame = pd.DataFrame(self.X, columns=list(self.columns))
        frame.insert(0, id_column, self.ids)
        if self.y is not None:
            frame[label_column] = self.y
        return frame

    # -- constructors from what a real party brings ----------------------------------------------

    @classmethod
    def from_frame(
        cls,
        frame: Table,
        *,
        party: str,
        id_column: str,
        label_column: str | None = None,
        feature_columns: Sequence[str] | None = None,
        drop_columns: Sequence[str] = (),
        categorical: Sequence[str] = (),
        task: str | None = None,
        impute: str | float | None = None,
        missing_indicator: bool = False,
    ) -> PartyData:
        """Build from a table with an ID column, feature columns and optionally a label column.

        ``categorical`` columns (text or numbers) are one-hot encoded here, one column per category seen;
        text labels become class codes 0..C-1 in sorted order, their names kept in ``encoding.classes``.
        ``impute`` fills missing values here (``"mean"``, ``"median"``, ``"most_frequent"`` or a number, from
        these rows; ``encoding`` keeps the fills for rows scored later); ``missing_indicator`` adds a 0/1
        column per column with gaps.
        """
        encoding = TableEncoding.fit(frame, party=party, id_column=id_column, label_column=label_column,
                                     feature_columns=feature_columns, drop_columns=drop_columns,
                                     categorical=categorical, task=task,  # type: ignore[arg-type]  # checked by TableEncoding.fit
                                     impute=impute, missing_indicator=missing_indicator)  # type: ignore[arg-type]  # checked by fit
        try:
            return cls.encoded(frame, encoding)
        except MissingValuesError as exc:  # its fix is an argument of this call, not a config's key
            raise exc.placed("api") from None

    @classmethod
    def encoded(cls, frame: Table, encoding: TableEncoding, *, labelled: bool = True) -> PartyData:
        """The party's rows from a table of its own, read as ``encoding`` says (columns, categories, fills)."""
        ids, X, y = encoding.arrays(frame, labelled=labelled)
        return cls(party=encoding.party, ids=ids, X=X, columns=encoding.feature_names, y=y,
                   categorical=encoding.categorical_names, encoding=encoding)

    @classmethod
    def from_file(
        cls,
        path: Source,
        *,
        party: str,
        id_column: str,
        label_column: str | None = None,
        feature_columns: Sequence[str] | None = None,
        drop_columns: Sequence[str] = (),
        categorical: Sequence[str] = (),
        task: str | None = None,
        impute: str | float | None = None,
        missing_indicator: bool = False,
    ) -> PartyData:
        """Read a CSV (optionally gzipped), TSV or Parquet file, or a database's rows (a
        :class:`~vflo.data.sql.SqlSource`); IDs are read as text (``impute``: as :meth:`from_frame`)."""
        frame = open_table(path, party=party, id_column=id_column)
        return cls.from_frame(frame, party=party, id_column=id_column, label_column=label_column,
                              feature_columns=feature_columns, drop_columns=drop_columns, categorical=categorical,
                              task=task, impute=impute, missing_indicator=missing_indicator)
