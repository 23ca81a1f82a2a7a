"""A party's table from a SQL database instead of a file, so a partner can sit in front of its feature store.

Two databases, each a file on the party's own host: SQLite through Python's ``sqlite3`` (no extra package), and
DuckDB (``pip install 'vflo[sql]'``), whose queries can themselves read Parquet and CSV files
(``SELECT * FROM read_parquet('features/*.parquet')``). A party names the database in its own config with a URL
in SQLAlchemy's form, ``sqlite:///PATH`` or ``duckdb:///PATH`` (three slashes, then a path relative to the
config's folder; four for an absolute one), and the rows with a ``table`` or a ``query``.

The rows a query returns mean what a file's rows mean: one per person, the ID column (read as text, as a file's
is) and feature columns; they go through the same checks and the same :class:`~vflo.data.files.TableEncoding`.
The database is only read: SQLite is opened with ``mode=ro`` and ``query_only`` on, DuckDB with
``read_only=True``, so neither the file nor the store behind it is ever written by vflo. The table is read whole
each time the party reads its rows (at start, and when a scoring session opens), as a file is.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterable
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pandas as pd

from vflo.errors import ConfigError, DataError, DataFileError, did_you_mean

logger = logging.getLogger(__name__)

#: The databases a party's ``sql`` may name, by URL scheme, with what each file is.
SCHEMES = {"sqlite": "SQLite database (.db, .sqlite)", "duckdb": "DuckDB database (.duckdb)"}
HOW = "write sql = \"sqlite:///PATH\" or \"duckdb:///PATH\" (a path relative to the config's folder after three " \
      "slashes, an absolute one after four)"


def parse_url(url: str) -> tuple[str, Path]:
    """The scheme and the file of a database URL (``sqlite:///features.db``), or a :class:`ConfigError` that says
    how to write one."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ConfigError(f"sql = {url!r} is not a database URL; {HOW}")
    if scheme.lower() not in SCHEMES:
        raise ConfigError(f"sql = {url!r}: vflo reads a {SCHEMES['sqlite']} or a {SCHEMES['duckdb']}, not "
                          f"{scheme!r}; {HOW}. A database behind a server: export the features to one of these, or "
                          "to a Parquet file a DuckDB query reads")
    # A host between '//' and the path would be a server: these databases are files on the party's own host.
    if not rest.startswith("/"):
        raise ConfigError(f"sql = {url!r} names a host ({rest.partition('/')[0]!r}); these databases are local files: "
                          f"{HOW}")
    path = rest[1:]
    if not path or path == ":memory:":
        raise ConfigError(f"sql = {url!r} names no database file; {HOW}")
    return scheme.lower(), Path(path)


def absolute_url(url: str, base: Path) -> str:
    """``url`` with a relative path made absolute from ``base`` (the config's folder); an unreadable URL as it is,
    for :class:`SqlSource` to refuse with the reason."""
    try:
        scheme, path = parse_url(url)
    except ConfigError:
        return url
    return url if path.is_absolute() else f"{scheme}:///{(base / path).absolute()}"


def quoted(name: str) -> str:
    """A table name as an SQL identifier (quotes doubled): a name, never a piece of SQL."""
    return '"' + name.replace('"', '""') + '"'


@dataclass(frozen=True, kw_only=True)
class SqlSource:
    """Where a party's rows are in a database: ``url`` (``sqlite:///PATH`` or ``duckdb:///PATH``, its path absolute
    once a config is read) and either ``table`` (every row and column of a table or view) or ``query`` (a
    ``SELECT`` that returns the ID column and the feature columns)."""

    url: str
    table: str | None = None
    query: str | None = None

    def __post_init__(self) -> None:
        parse_url(self.url)
        if (self.table is None) == (self.query is None):
            raise ConfigError(f"sql = {self.url!r}: say which rows with table = 'NAME' or query = 'SELECT ...' "
                              "(one of the two)")
        if not (self.table or self.query or "").strip():
            raise ConfigError(f"sql = {self.url!r}: the table name or query is empty")

    @property
    def scheme(self) -> str:
        return parse_url(self.url)[0]

    @property
    def path(self) -> Path:
        return parse_url(self.url)[1]

    @property
    def statement(self) -> str:
        return self.query if self.query is not None else f"SELECT * FROM {quoted(str(self.table))}"

    def __str__(self) -> str:
        return f"{self.url} ({'table ' + repr(self.table) if self.table is not None else 'query'})"


def read_sql(source: SqlSource, *, party: str, id_column: str) -> pd.DataFrame:
    """The rows ``source`` names as a table, its ID column as text (missing IDs left missing, for the checks that
    refuse them), read without writing to the database."""
    path = source.path
    if not path.is_file():
        raise DataFileError(f"party {party!r}: database file {path} does not exist (sql = {source.url!r}); give "
                            f"the path of its {SCHEMES[source.scheme]}, relative to the config's folder")
    reader = _read_sqlite if source.scheme == "sqlite" else _read_duckdb
    frame = reader(source, party)
    frame.columns = [str(c) for c in frame.columns]
    if id_column not in frame.columns:
        raise DataError(f"party {party!r}: {source} returns no ID column {id_column!r}"
                        f"{did_you_mean(id_column, frame.columns)} (its columns: {list(frame.columns)[:12]}); set "
                        "id_column under [data] to the column that holds the IDs, or have the query return it")
    ids = frame[id_column]
    frame[id_column] = ids.astype(str).where(ids.notna())  # the type read_csv gives dtype=str
    logger.info("party %s: read %d rows and %d columns from %s", party, len(frame), frame.shape[1], source)
    return frame


def _require_table(source: SqlSource, party: str, names: Iterable[str]) -> None:
    """Refuse a ``table`` the database does not hold, naming those it does (SQL's own error names neither)."""
    known = sorted(str(n) for n in names)
    if str(source.table).lower() not in {n.lower() for n in known}:
        raise DataFileError(f"party {party!r}: {source.path} has no table or view {source.table!r}"
                            f"{did_you_mean(str(source.table), known)} (it has {known[:12]}); fix table under [data], "
                            "or give query = 'SELECT ...'")


def _read_sqlite(source: SqlSource, party: str) -> pd.DataFrame:
    # mode=ro: SQLite opens the file read-only (and never creates it); query_only refuses any statement that would
    # write, to this file or to one a query attaches.
    uri = f"file:{quote(str(source.path))}?mode=ro"
    try:
        with closing(sqlite3.connect(uri, uri=True)) as connection:
            connection.execute("PRAGMA query_only = ON")
            if source.table is not None:
                _require_table(source, party, (r[0] for r in connection.execute(
                    "SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")))
            cursor = connection.execute(source.statement)
            if cursor.description is None:
                raise DataFileError(f"party {party!r}: the query of {source} returns no rows; give a SELECT")
            columns = [d[0] for d in cursor.description]
            return _frame(cursor.fetchall(), columns)
    except sqlite3.Error as exc:
        raise DataFileError(f"party {party!r}: could not read {source}: {exc}") from exc


def _frame(rows: list[tuple[Any, ...]], columns: list[str]) -> pd.DataFrame:
    return as_file_types(pd.DataFrame.from_records(rows, columns=columns, coerce_float=True))


def as_file_types(frame: pd.DataFrame) -> pd.DataFrame:
    """A database's columns typed as pandas types a file's: whole numbers with gaps as floats with NaN (DuckDB
    gives pandas' nullable integers, with ``<NA>``), a column of nothing but NULLs as floats, not Python objects."""
    for name in frame.columns:
        column = frame[name]
        if isinstance(column.dtype, pd.api.extensions.ExtensionDtype) and pd.api.types.is_numeric_dtype(column):
            frame[name] = column.to_numpy(dtype="float64", na_value=float("nan")) if column.isna().any() \
                else column.to_numpy(dtype="float64" if pd.api.types.is_float_dtype(column) else "int64")
        elif column.dtype == object and column.isna().all():
            frame[name] = column.astype("float64")
    return frame


def _duckdb(party: str, source: SqlSource) -> Any:
    try:
        import duckdb
    except ImportError as exc:
        raise ConfigError(f"party {party!r}: sql = {source.url!r} needs DuckDB's Python package: "
                          "pip install 'vflo[sql]' (or pip install duckdb)") from exc
    return duckdb


def _read_duckdb(source: SqlSource, party: str) -> pd.DataFrame:
    duckdb = _duckdb(party, source)
    try:
        # read_only: DuckDB never writes the file. No extension is fetched from the network while the party reads
        # its rows (DuckDB would download one to read, say, a SQLite file given as a DuckDB one).
        connection = duckdb.connect(str(source.path), read_only=True,
                                    config={"autoinstall_known_extensions": False})
    except duckdb.Error as exc:
        raise DataFileError(f"party {party!r}: could not open {source.path} as a DuckDB database, read-only ({exc}); "
                            "give a DuckDB file (a SQLite one: sql = \"sqlite:///...\"), and note DuckDB opens a "
                            "file read-only only while no process holds it open for writing") from exc
    try:
        if source.table is not None:
            _require_table(source, party, (r[0] for r in connection.execute(
                "SELECT table_name FROM information_schema.tables").fetchall()))
        result = connection.execute(source.statement)
        if result.description is None:
            raise DataFileError(f"party {party!r}: the query of {source} returns no rows; give a SELECT")
        return as_file_types(result.df())
    except duckdb.Error as exc:
        raise DataFileError(f"party {party!r}: could not read {source}: {exc}") from exc
    finally:
        connection.close()
