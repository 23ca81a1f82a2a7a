"""A party's own table on disk: reading it, and turning it into features the same way every time.

A party brings a CSV (optionally gzipped), TSV or Parquet file with an ID column, feature columns and, at
the active party, a label column. :class:`TableEncoding` is what the party learns from its own *training*
file: which columns are features, the categories of each categorical column (one-hot encoded here, at the
owner), and the class names when labels are text. Applied to any later file of the same party (rows to
score, next month's people) it gives the same columns in the same order, so a model trained today can
score tomorrow's rows. It holds names and categories only, never a value of any row.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd

from vflo.data.sql import SqlSource, read_sql
from vflo.errors import DataError, DataFileError, did_you_mean

logger = logging.getLogger(__name__)

Task = Literal["binary", "multiclass", "regression"]
# Integer-valued labels with at most this many distinct values are read as classes, others as a quantity.
MAX_CLASSES_GUESSED = 20
SUFFIXES = ".csv, .csv.gz, .tsv, .tsv.gz, .txt or .parquet"
#: Where a party's rows are: a file (its path), or a table or query of a database (:mod:`vflo.data.sql`).
Source = str | Path | SqlSource


def file_format(path: Path) -> str:
    """What a file's name says it holds: ``"parquet"``, or the separator of its delimited text (``","`` or
    ``"\t"``); ``""`` when it says neither. One rule for every reader of a party's files."""
    name = path.name.lower()
    if name.endswith((".parquet", ".pq")):
        return "parquet"
    if name.endswith((".csv", ".csv.gz", ".tsv", ".tsv.gz", ".txt", ".txt.gz")):
        return "\t" if ".tsv" in name else ","
    return ""


def read_table(source: Source, *, party: str, id_column: str) -> pd.DataFrame:
    """The file (or the database's rows) as a table, its ID column as text (so ``007`` stays ``007`` and matches
    across parties)."""
    if isinstance(source, SqlSource):
        frame = read_sql(source, party=party, id_column=id_column)
        _unique_ids(frame[id_column], party=party, path=source, id_column=id_column)
        return frame
    path = Path(source)
    if not path.is_file():
        raise DataFileError(f"party {party!r}: data file {path} does not exist")
    kind = file_format(path)
    try:
        if kind == "parquet":
            frame = pd.read_parquet(path)
            if id_column in frame.columns:
                frame[id_column] = frame[id_column].astype(str)
        elif kind:
            frame = pd.read_csv(path, sep=kind, dtype={id_column: str}, keep_default_na=True)
        else:
            raise DataFileError(f"party {party!r}: cannot tell the format of {path.name}; use a {SUFFIXES} file")
    except (OSError, ValueError, pd.errors.ParserError) as exc:
        raise DataFileError(f"party {party!r}: could not read {path}: {exc}") from exc
    frame.columns = [str(c) for c in frame.columns]
    if id_column in frame.columns:
        _unique_ids(frame[id_column], party=party, path=path, id_column=id_column)
    return frame


def _unique_ids(ids: pd.Series, *, party: str, path: Path | SqlSource, id_column: str) -> None:
    """Refuse a file that names a person twice, naming the IDs and the file (a party's rows are one per person;
    what checks the rows later knows neither the file nor, for a few, which IDs)."""
    repeated = ids[ids.duplicated()].dropna().unique()
    if len(repeated):
        where = "table" if isinstance(path, SqlSource) else "file"
        how = " (a query: one row per ID, e.g. the latest of each)" if isinstance(path, SqlSource) else ""
        raise DataError(f"party {party!r}: duplicate sample IDs {list(repeated[:5])} ({len(repeated)} in all) in "
                        f"{path} (ID column {id_column!r}); each sample must appear once in a party's {where}: drop "
                        f"or merge the duplicates{how}")


class ColumnFile:
    """A Parquet file read a column at a time, as :class:`TableEncoding` asks for them: what a party holds while
    its file is encoded is one column and the encoded matrix, never the whole table (ten million rows of text IDs
    and a dozen columns are gigabytes as a table). It answers what a table does there: ``columns``, ``len``, and
    ``file[name]``, a column as :func:`read_table` gives it (the ID column as text)."""

    def __init__(self, path: Path, *, party: str, id_column: str) -> None:
        import pyarrow.parquet as pq

        self.path, self.party, self.id_column = path, party, id_column
        try:
            self._file = pq.ParquetFile(path)
        except (OSError, ValueError) as exc:
            raise DataFileError(f"party {party!r}: could not read {path}: {exc}") from exc
        self.columns = pd.Index([str(c) for c in self._file.schema_arrow.names])
        self._rows = int(self._file.metadata.num_rows)
        self._last: tuple[str, pd.Series] | None = None

    def __len__(self) -> int:
        return self._rows

    def __getitem__(self, name: str) -> pd.Series:
        if self._last is not None and self._last[0] == name:  # encoding asks for a column several times in a row
            return self._last[1]
        if name not in self.columns:
            raise KeyError(name)
        try:
            column = self._file.read(columns=[name]).column(0).to_pandas()
        except (OSError, ValueError) as exc:
            raise DataFileError(f"party {self.party!r}: could not read column {name!r} of {self.path}: {exc}") from exc
        if name == self.id_column:
            column = column.astype(str)
        column.name = name
        self._last = (name, column)
        series: pd.Series = column
        return series

    def id_values(self) -> np.ndarray | None:
        """The ID column as NumPy text straight from the file when it is ASCII text there (most ID columns): no
        Python string per ID on the way, whose memory (many times that of their text) the process keeps after they
        are freed. None otherwise (numbers, other text: ``file[id_column]`` reads them as before)."""
        import pyarrow as pa

        try:
            column = self._file.read(columns=[self.id_column]).column(0).combine_chunks()
        except (OSError, ValueError) as exc:
            raise DataFileError(f"party {self.party!r}: could not read column {self.id_column!r} of {self.path}: "
                                f"{exc}") from exc
        if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)) or column.null_count:
            return None
        return ascii_text(column)


#: A party's table: in memory, or a Parquet file read a column at a time.
Table = pd.DataFrame | ColumnFile

#: Rows :func:`ascii_text` places at a time (its index arrays take 16 bytes per character of them).
TEXT_BLOCK = 1 << 20


def ascii_text(column: Any) -> np.ndarray | None:
    """An Arrow string array (no nulls) as a NumPy fixed-width text array, or None when some character is not
    ASCII. Each block of rows is placed by index arrays over its bytes; the result takes 4 bytes per character
    of the longest text, what NumPy's text arrays take."""
    import pyarrow as pa

    n = len(column)
    width = np.int64 if pa.types.is_large_string(column.type) else np.int32
    offsets = np.frombuffer(column.buffers()[1], dtype=width)[column.offset : column.offset + n + 1].astype(np.int64)
    data = column.buffers()[2]
    raw = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, np.uint8)
    raw = raw[offsets[0] : offsets[-1]] if n else raw[:0]
    if raw.size and int(raw.max()) >= 128:
        return None
    offsets -= offsets[0]
    lengths = np.diff(offsets)
    longest = max(1, int(lengths.max()) if n else 1)
    out = np.zeros((n, longest), dtype=np.uint32)
    for start in range(0, n, TEXT_BLOCK):
        stop = min(start + TEXT_BLOCK, n)
        first, last = offsets[start], offsets[stop]
        sizes = lengths[start:stop]
        row = np.repeat(np.arange(start, stop), sizes)
        col = np.arange(first, last) - np.repeat(offsets[start:stop], sizes)
        out[row, col] = raw[first:last]
    return out.view(f"<U{longest}").ravel()


def open_table(source: Source, *, party: str, id_column: str) -> Table:
    """The party's file for encoding: a Parquet file a column at a time (:class:`ColumnFile`), any other file or a
    database's rows as :func:`read_table` reads them."""
    if isinstance(source, SqlSource):
        return read_table(source, party=party, id_column=id_column)
    path = Path(source)
    if path.is_file() and file_format(path) == "parquet":
        return ColumnFile(path, party=party, id_column=id_column)
    return read_table(path, party=party, id_column=id_column)


def _require_columns(frame: Table, names: Sequence[str], *, party: str, what: str, fix: str) -> None:
    absent = [c for c in names if c not in frame.columns]
    if absent:
        shown = repr(absent[0]) if len(absent) == 1 else str(absent)
        raise DataError(f"party {party!r}: {what} {shown} not in the table{did_you_mean(absent[0], frame.columns)} "
                        f"(its columns: {list(frame.columns)[:12]}{' ...' if len(frame.columns) > 12 else ''}); "
                        f"{fix}")


def _is_integer_valued(values: pd.Series) -> bool:
    numbers = pd.to_numeric(values, errors="coerce")
    return bool(numbers.notna().all() and np.all(np.asarray(numbers) == np.round(np.asarray(numbers))))


# How a party fills missing values at the owner: a rule over its training rows, or a number (None: it refuses them).
Impute = Literal["mean", "median", "most_frequent"] | float | None
IMPUTE_RULES = ("mean", "median", "most_frequent")

#: Where a party's ``impute`` is written, by where its settings are: a deployed party's own config (the active
#: party's: its table in deploy.toml), an experiment config's entry for the party, or the call that reads its table.
IMPUTE_PLACES = {
    "party": "under [data] in the party's own config, NAME.toml (what `vflo party serve` reads)",
    "active": "under [active.data] in the active party's deploy config, deploy.toml",
    "experiment": "in the party's [[scenario.parties]] entry of the experiment config",
    "api": "in the call that reads its table (vflo.PartyData.from_file or from_frame)",
}
ImputePlace = Literal["party", "active", "experiment", "api"]


class MissingValuesError(DataError):
    """A numerical column has missing values and its party fills none (it has no ``impute``). The fix is written
    where the party's settings are, which only the caller that read them knows: a deployed party's config (what
    this module assumes: ``"active"`` for the label holder, ``"party"`` otherwise), an experiment config or a call
    (:meth:`placed`). Like any :class:`DataError` it can be made from a message alone (a caller adding the file's
    name keeps the class)."""

    def __init__(self, message: str, *, party: str = "", column: str = "", count: int = 0) -> None:
        super().__init__(message)
        self.party, self.column, self.count = party, column, count

    @classmethod
    def of(cls, party: str, column: str, count: int, place: ImputePlace) -> MissingValuesError:
        true = "True" if place == "api" else "true"  # a keyword argument, or a key of a TOML table
        return cls(f"party {party!r}: column {column!r} has {count} missing values; fill them here, at their owner: "
                   f"impute = 'mean' (or 'median', 'most_frequent', a number) {IMPUTE_PLACES[place]}, optionally "
                   f"with missing_indicator = {true}; or leave the column out (drop_columns = [{column!r}] there)",
                   party=party, column=column, count=count)

    def placed(self, place: ImputePlace) -> MissingValuesError:
        """The same refusal, its fix written for settings kept in ``place`` (itself when made from a message)."""
        return self if not self.column else self.of(self.party, self.column, self.count, place)


@dataclass(frozen=True)
class TableEncoding:
    """How one party turns a table of its own into features (and labels); fitted on its training file."""

    party: str
    id_column: str
    columns: tuple[str, ...]
    categories: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    label_column: str | None = None
    task: Task | None = None
    classes: tuple[str, ...] = ()
    # Missing values, filled here at the owner with statistics of its training rows (``impute`` when fitted): the
    # value each column's gaps get (a category's name for a categorical column), kept so that rows scored
    # later are filled alike; ``indicators``: columns that also get a 0/1 column ``NAME=missing``.
    fills: Mapping[str, float | str] = field(default_factory=dict)
    indicators: tuple[str, ...] = ()
    # Numerical columns that already hold whole-number category codes (an exported party's one-hot columns): kept
    # as they are, and marked categorical for the methods that treat categories apart (RAP's projections).
    codes: tuple[str, ...] = ()

    @classmethod
    def fit(
        cls, frame: Table, *, party: str, id_column: str, label_column: str | None = None,
        feature_columns: Sequence[str] | None = None, drop_columns: Sequence[str] = (),
        categorical: Sequence[str] = (), task: Task | None = None, impute: Impute = None,
        missing_indicator: bool = False, category_codes: Sequence[str] = (),
    ) -> TableEncoding:
        """Learn the feature columns, categories and classes from ``frame`` (the party's training rows); with
        ``impute``, how each column's missing values are filled (``"mean"``, ``"median"``, ``"most_frequent"`` or
        a number; a categorical column's with its most frequent category), and with ``missing_indicator`` a 0/1
        column for each column that has gaps in ``frame``."""
        _require_columns(frame, [id_column], party=party, what="ID column",
                         fix="set id_column to the column that holds the sample IDs")
        if label_column is not None:
            _require_columns(frame, [label_column], party=party, what="label column",
                             fix="the active party must bring its labels: add the column or fix label_column")
        _require_columns(frame, list(drop_columns), party=party, what="drop_columns",
                         fix="list only columns the file has")
        _require_columns(frame, list(categorical), party=party, what="categorical columns",
                         fix="list only columns the file has")
        reserved = {id_column, label_column, *drop_columns}
        if feature_columns is None:
            columns = [c for c in frame.columns if c not in reserved]
        else:
            _require_columns(frame, list(feature_columns), party=party, what="feature columns",
                             fix="list only columns the file has")
            clash = [c for c in feature_columns if c in reserved]
            if clash:
                raise DataError(f"party {party!r}: {clash} are listed as features but are the ID or label column, or "
                                "dropped; take them out of feature_columns")
            columns = list(feature_columns)
        loose = [c for c in categorical if c not in columns]
        if loose:
            raise DataError(f"party {party!r}: categorical columns {loose} are not among its feature columns")
        categories: dict[str, tuple[str, ...]] = {}
        for c in categorical:
            seen = sorted({str(v) for v in frame[c].dropna()})
            if len(seen) < 2:
                raise DataError(f"party {party!r}: categorical column {c!r} has {len(seen)} distinct value(s); it "
                                f"carries no information: drop it (drop_columns = [{c!r}])")
            categories[c] = tuple(seen)
        text = [c for c in columns if c not in categories and not pd.api.types.is_numeric_dtype(frame[c])
                and len(frame)]
        if text:
            raise DataError(
                f"party {party!r}: columns {text} hold text; list them under categorical = [...] to one-hot encode "
                "them, or leave them out with drop_columns = [...] (or feature_columns = [...])")
        label_task: Task | None = None
        classes: tuple[str, ...] = ()
        if label_column is not None:
            label_task, classes = _label_kind(frame[label_column], party=party, column=label_column, task=task)
        elif task is not None:
            raise DataError(f"party {party!r}: task is set but there is no label_column; only the active party "
                            "(the label holder) says what its labels are")
        fills = _fills(frame, columns, categories, impute, party=party) if impute is not None else {}
        indicators = tuple(c for c in columns if missing_indicator and bool(frame[c].isna().any()))
        coded = [c for c in category_codes if c not in columns or c in categories]
        if coded:
            raise DataError(f"party {party!r}: category_codes {coded} must be numerical feature columns of the file "
                            "(not the ID, the label, a dropped column or one listed under categorical)")
        return cls(party=party, id_column=id_column, columns=tuple(columns), categories=categories,
                   label_column=label_column, task=label_task, classes=classes, fills=fills, indicators=indicators,
                   codes=tuple(category_codes))

    # -- applying it ---------------------------------------------------------------------------------

    @property
    def feature_names(self) -> tuple[str, ...]:
        """Encoded feature columns: numerical columns as they are, ``name=category`` for each category."""
        names: list[str] = []
        for c in self.columns:
            names += [f"{c}={v}" for v in self.categories[c]] if c in self.categories else [c]
            if c in self.indicators:
                names.append(f"{c}=missing")
        return tuple(names)

    @property
    def one_hot_names(self) -> tuple[str, ...]:
        return tuple(f"{c}={v}" for c in self.columns if c in self.categories for v in self.categories[c])

    @property
    def categorical_names(self) -> tuple[str, ...]:
        """Encoded columns that hold categories: each one-hot column, and the columns of ``codes``."""
        return (*self.one_hot_names, *self.codes)

    def features(self, frame: Table) -> np.ndarray:
        """The encoded feature matrix of ``frame`` (float32); a category never seen in training is all zeros."""
        _require_columns(frame, list(self.columns), party=self.party, what="feature columns",
                         fix="every file of a party must have the columns its training file had")
        # Filled column by column into a column-major matrix: each column a contiguous write.
        # float32, what a party's features are (each value rounded once, as from float64 later): half the memory.
        out = np.empty((len(self.feature_names), len(frame)), dtype=np.float32)
        at = 0
        for c in self.columns:
            gaps = frame[c].isna().to_numpy()
            column = frame[c] if not gaps.any() or c not in self.fills else frame[c].fillna(self.fills[c])
            if c in self.categories:
                known = self.categories[c]
                values = column.astype(str).to_numpy()
                unseen = sorted(set(np.unique(values).tolist()) - set(known))
                if unseen:
                    logger.warning("party %s: column %r has categories %s not seen in training; their one-hot "
                                   "columns are all zero", self.party, c, unseen[:5])
                for v in known:
                    out[at] = values == v
                    at += 1
            else:
                if gaps.any() and c not in self.fills:
                    raise MissingValuesError.of(self.party, c, int(gaps.sum()),
                                                "active" if self.label_column is not None else "party")
                try:
                    out[at] = pd.to_numeric(column).to_numpy(dtype=np.float64)
                except (TypeError, ValueError) as exc:
                    raise DataError(f"party {self.party!r}: column {c!r} holds text where its training file had "
                                    f"numbers ({exc})") from exc
                at += 1
            if c in self.indicators:
                out[at] = gaps
                at += 1
        result: np.ndarray = out.T
        return result

    def labels(self, frame: Table) -> np.ndarray:
        """Class codes 0..C-1 (in the order of :attr:`classes`) or float targets."""
        assert self.label_column is not None
        _require_columns(frame, [self.label_column], party=self.party, what="label column",
                         fix="a labelled file needs the label column its training file had")
        values = frame[self.label_column]
        if values.isna().any():
            raise DataError(f"party {self.party!r}: label column {self.label_column!r} has "
                            f"{int(values.isna().sum())} missing values; drop those rows or fill them")
        if self.task == "regression":
            return pd.to_numeric(values).to_numpy(dtype=np.float64)
        index = {name: i for i, name in enumerate(self.classes)}
        names = [_class_name(v) for v in values.tolist()]
        unknown = sorted(set(names) - set(index))
        if unknown:
            raise DataError(f"party {self.party!r}: labels {unknown[:5]} were not among the training labels "
                            f"{list(self.classes)}")
        return np.asarray([index[n] for n in names], dtype=np.int64)

    def arrays(self, frame: Table, *, labelled: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """IDs, encoded features and labels (or None) of a table of the party's own
        (:meth:`vflo.data.partydata.PartyData.encoded` makes them the party's rows)."""
        _require_columns(frame, [self.id_column], party=self.party, what="ID column",
                         fix="every file of a party must carry its ID column")
        ids = frame.id_values() if isinstance(frame, ColumnFile) else None
        if ids is None:
            if frame[self.id_column].isna().any():
                raise DataError(f"party {self.party!r}: ID column {self.id_column!r} has missing values")
            ids = frame[self.id_column].to_numpy()
        y = self.labels(frame) if labelled and self.label_column is not None else None
        return ids, self.features(frame), y

    # -- as plain data (results, model artifacts) ---------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {"party": self.party, "id_column": self.id_column, "columns": list(self.columns),
                "categories": {k: list(v) for k, v in self.categories.items()}, "label_column": self.label_column,
                "task": self.task, "classes": list(self.classes), "fills": dict(self.fills),
                "indicators": list(self.indicators), **({"codes": list(self.codes)} if self.codes else {})}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> TableEncoding:
        try:
            return cls(party=str(raw["party"]), id_column=str(raw["id_column"]),
                       columns=tuple(str(c) for c in raw["columns"]),
                       categories={str(k): tuple(str(v) for v in vs) for k, vs in raw["categories"].items()},
                       label_column=None if raw["label_column"] is None else str(raw["label_column"]),
                       task=raw["task"], classes=tuple(str(c) for c in raw["classes"]),
                       fills={str(k): v for k, v in raw.get("fills", {}).items()},
                       indicators=tuple(str(c) for c in raw.get("indicators", ())),
                       codes=tuple(str(c) for c in raw.get("codes", ())))
        except (KeyError, TypeError, AttributeError) as exc:
            raise DataError(f"a table encoding is malformed: {exc}") from exc


def _fills(frame: Table, columns: Sequence[str], categories: Mapping[str, tuple[str, ...]], impute: Impute, *,
           party: str) -> dict[str, float | str]:
    """What each column's missing values become, from the training rows: a numerical column's mean, median, most
    frequent value or the number given; a categorical column's most frequent category."""
    if isinstance(impute, str) and impute not in IMPUTE_RULES:
        raise DataError(f"party {party!r}: impute = {impute!r}; choose one of {list(IMPUTE_RULES)} or a number")
    fills: dict[str, float | str] = {}
    for c in columns:
        known = frame[c].dropna()
        if c in categories:
            if len(known):
                fills[c] = str(known.astype(str).mode().iloc[0])
            continue
        if not isinstance(impute, str):
            fills[c] = float(impute)  # type: ignore[arg-type]  # a number here: every text rule returned above
            continue
        if not len(known):
            raise DataError(f"party {party!r}: column {c!r} has no value in the training file to impute from; drop "
                            f"it (drop_columns = [{c!r}])")
        values = pd.to_numeric(known)
        fills[c] = float(values.mean() if impute == "mean" else values.median() if impute == "median"
                         else values.mode().iloc[0])
    return fills


def _class_name(value: object) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _label_kind(values: pd.Series, *, party: str, column: str, task: Task | None) -> tuple[Task, tuple[str, ...]]:
    """The task the labels describe (unless ``task`` says it) and, for classes, their names in code order."""
    if values.isna().any():
        raise DataError(f"party {party!r}: label column {column!r} has {int(values.isna().sum())} missing values; "
                        "drop those rows or fill them")
    numeric = pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values)
    distinct = values.nunique()
    if task is None:
        if not numeric or (_is_integer_valued(values) and distinct <= MAX_CLASSES_GUESSED):
            task = "binary" if distinct <= 2 else "multiclass"
        else:
            task = "regression"
        logger.info("party %s: labels in %r read as a %s task (%d distinct values); set task to change it", party,
                    column, task, distinct)
    if task == "regression":
        if not numeric:
            raise DataError(f"party {party!r}: task = 'regression' but label column {column!r} holds text")
        return task, ()
    if distinct < 2:
        raise DataError(f"party {party!r}: label column {column!r} has a single value; a classifier needs two "
                        "classes or more")
    if task == "binary" and distinct > 2:
        raise DataError(f"party {party!r}: task = 'binary' but label column {column!r} has {distinct} classes; "
                        "use task = 'multiclass'")
    unique = values.unique().tolist()
    order = sorted(unique, key=lambda v: (0, float(v)) if numeric else (1, str(v)))
    return task, tuple(_class_name(v) for v in order)
