"""A party's rows from a SQL database (vflo.data.sql): SQLite and DuckDB give exactly the PartyData, the rows to
score and the scores its CSV file gives; every mistake is refused with the fix; the database is never written."""

from __future__ import annotations

import sqlite3
import sys
from contextlib import closing
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from vflo.artifacts import Part
from vflo.cli import main
from vflo.data.partydata import PartyData
from vflo.data.sql import SqlSource, absolute_url, parse_url
from vflo.deploy import DataConfig, load_party_config, load_party_data
from vflo.deploy.party import DeployedStore
from vflo.errors import ConfigError, DataError, DataFileError
from vflo.scoring import SavedModel

REPO = Path(__file__).resolve().parents[1]
HOSPITAL, LAB = REPO / "examples/data/hospital.csv", REPO / "examples/data/lab.csv"
SCHEMES = ["sqlite", pytest.param("duckdb", marks=pytest.mark.skipif(
    __import__("importlib.util").util.find_spec("duckdb") is None, reason="needs pip install 'vflo[sql]'"))]


def _people(seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A partner's training and serving rows: text IDs with leading zeros, whole numbers, decimals with gaps and a
    text category, the people to score partly new."""
    rng = np.random.default_rng(seed)
    n = 48
    frame = pd.DataFrame({"id": [f"{i:04d}" for i in rng.permutation(90)[:n]], "age": rng.integers(18, 90, n),
                          "income": rng.normal(50, 10, n).round(3), "score": rng.normal(size=n).round(4),
                          "region": rng.choice(["north", "south", "east"], n)})
    frame.loc[rng.choice(n, 6, replace=False), "score"] = np.nan
    return frame.iloc[:36].reset_index(drop=True), frame.iloc[20:].reset_index(drop=True)


def _database(path: Path, scheme: str, tables: dict[str, pd.DataFrame]) -> None:
    """``tables`` written to a new database file of ``scheme``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if scheme == "sqlite":
        with closing(sqlite3.connect(path)) as connection:
            for name, frame in tables.items():
                frame.to_sql(name, connection, index=False)
            connection.commit()
        return
    import duckdb

    connection = duckdb.connect(str(path))
    try:
        for name, frame in tables.items():
            connection.register("frame", frame)
            connection.execute(f"CREATE TABLE {name} AS SELECT * FROM frame")
            connection.unregister("frame")
    finally:
        connection.close()


def _party_toml(path: Path, data: str) -> Path:
    path.write_text(f'name = "lab"\nrole = "passive"\n\n[data]\nid_column = "id"\ncategorical = ["region"]\n'
                    f'impute = "mean"\n{data}')
    return path


def _same(a: PartyData | None, b: PartyData | None) -> None:
    assert a is not None and b is not None
    assert a.ids.tolist() == b.ids.tolist() and a.ids.dtype.kind == b.ids.dtype.kind == "U"
    assert a.columns == b.columns and a.categorical == b.categorical and a.encoding == b.encoding
    assert np.array_equal(a.X, b.X)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_partner_reads_its_database_as_it_reads_the_same_rows_in_csv(tmp_path: Path, scheme: str) -> None:
    train, serve = _people()
    train.to_csv(tmp_path / "train.csv", index=False)
    serve.to_csv(tmp_path / "serve.csv", index=False)
    suffix = "db" if scheme == "sqlite" else "duckdb"
    _database(tmp_path / "store" / f"features.{suffix}", scheme, {"features_train": train, "features": serve})
    from_csv = load_party_config(_party_toml(tmp_path / "csv.toml", 'file = "train.csv"\nserve_file = "serve.csv"\n'))
    # A relative path, from the config's folder; the rows to score by a query (a view of the store, say).
    from_sql = load_party_config(_party_toml(tmp_path / "sql.toml", (
        f'sql = "{scheme}:///store/features.{suffix}"\ntable = "features_train"\n'
        'serve_query = "SELECT id, age, income, score, region FROM features"\n')))
    assert from_sql.data is not None and from_csv.data is not None
    assert from_sql.data.sql == f"{scheme}:///{tmp_path}/store/features.{suffix}"
    csv, sql = load_party_data("lab", from_csv.data), load_party_data("lab", from_sql.data)
    _same(csv.train, sql.train)
    _same(csv.serve, sql.serve)
    assert csv.preprocessing is not None and sql.preprocessing is not None
    assert csv.preprocessing.to_dict() == sql.preprocessing.to_dict()

    # What a deployed partner scores with once a scoring session opens: read with its saved part's encoding.
    part = Part(folder=tmp_path, manifest={"preprocessing": csv.preprocessing.to_dict()}, state={})
    stores = [DeployedStore(tmp_path / "models", party="lab", role="passive", preprocessing=csv.preprocessing,
                            serve_source=c.data.serve_source) for c in (from_csv, from_sql)]
    _same(*(store.serving_rows(part) for store in stores))


@pytest.fixture(scope="module")
def splitnn(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SplitNN of the hospital and the lab, trained briefly and saved."""
    folder = tmp_path_factory.mktemp("sql_models")
    config = folder / "run.toml"
    config.write_text(
        'name = "sql"\nseed = 0\n[scenario]\n[[scenario.parties]]\nname = "hospital"\nrole = "active"\n'
        f'file = "{HOSPITAL}"\nid_column = "pid"\nlabel_column = "outcome"\ncategorical = ["sex", "ward"]\n'
        f'[[scenario.parties]]\nname = "lab"\nfile = "{LAB}"\nid_column = "pid"\nimpute = "median"\n'
        '[protocol]\nname = "repeated_runs"\nruns = 1\ntest_fraction = 0.25\ntest_from = "aligned"\n'
        '[[methods]]\nname = "splitnn"\ntrain = { batch_size = 16, max_epochs = 3 }\n')
    assert main(["run", str(config), "--out", str(folder / "results"), "--save", str(folder / "models")]) == 0
    return folder / "models"


@pytest.mark.parametrize("scheme", SCHEMES)
def test_scores_from_the_partners_database_equal_scores_from_its_file(tmp_path: Path, splitnn: Path,
                                                                      scheme: str) -> None:
    lab = pd.read_csv(LAB, dtype={"pid": str})
    database = tmp_path / f"lab.{scheme}"
    _database(database, scheme, {"lab": lab})
    hospital = pd.read_csv(HOSPITAL, dtype={"pid": str})
    hospital[hospital["pid"].isin(lab["pid"])].to_csv(tmp_path / "both.csv", index=False)  # the people both hold
    model = SavedModel.load(splitnn, "splitnn")
    from_file = model.score({"hospital": tmp_path / "both.csv", "lab": LAB})
    from_sql = model.score({"hospital": tmp_path / "both.csv",
                            "lab": SqlSource(url=f"{scheme}:///{database}", table="lab")})
    assert set(from_file["scored_by"]) == {"hospital+lab"} and len(from_file) > 50
    pd.testing.assert_frame_equal(from_file, from_sql)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_the_database_is_never_written(tmp_path: Path, scheme: str) -> None:
    train, serve = _people(1)
    database = tmp_path / "store" / "features.db"
    _database(database, scheme, {"features_train": train, "features": serve})
    before = (database.read_bytes(), database.stat().st_mtime_ns, sorted(p.name for p in database.parent.iterdir()))
    config = DataConfig(id_column="id", categorical=("region",), impute="mean", sql=f"{scheme}:///{database}",
                        table="features_train", serve_table="features")
    tables = load_party_data("lab", config)
    assert tables.train is not None and tables.serve is not None and len(tables.serve) == len(serve)
    # A query that would change the store is refused, and changes nothing.
    for statement in ("DELETE FROM features", "UPDATE features SET age = 0",
                      "CREATE TABLE other AS SELECT * FROM features"):
        with pytest.raises(DataFileError, match="could not read"):
            load_party_data("lab", DataConfig(id_column="id", sql=f"{scheme}:///{database}", query=statement))
    after = (database.read_bytes(), database.stat().st_mtime_ns, sorted(p.name for p in database.parent.iterdir()))
    assert after == before


def _refusal(tmp_path: Path, scheme: str, data: dict[str, str]) -> str:
    train, _ = _people(2)
    duplicated = pd.concat([train, train.iloc[:3]], ignore_index=True)
    nameless = train.astype({"id": object})
    nameless.loc[4, "id"] = None
    if not (tmp_path / "features.db").exists():
        _database(tmp_path / "features.db", scheme, {"features": train, "twice": duplicated, "nameless": nameless})
    config = DataConfig(id_column="id", sql=f"{scheme}:///{tmp_path / 'features.db'}", **data)
    with pytest.raises(DataError) as caught:
        load_party_data("lab", config)
    return str(caught.value)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_what_the_database_lacks_is_refused_with_the_fix(tmp_path: Path, scheme: str) -> None:
    message = _refusal(tmp_path, scheme, {"table": "featurs"})
    assert "has no table or view 'featurs' (did you mean 'features'?)" in message and "fix table" in message
    message = _refusal(tmp_path, scheme, {"query": "SELECT age, income FROM features"})
    assert "returns no ID column 'id'" in message and "set id_column" in message
    message = _refusal(tmp_path, scheme, {"table": "twice"})
    assert "duplicate sample IDs" in message and "one row per ID" in message
    assert "ID column 'id' has missing values" in _refusal(tmp_path, scheme, {"query": "SELECT id, age FROM nameless"})
    message = _refusal(tmp_path, scheme, {"query": "SELECT * FROM nowhere"})
    assert "could not read" in message and "nowhere" in message
    with pytest.raises(DataFileError, match="does not exist.*relative to the config's folder"):
        load_party_data("lab", DataConfig(id_column="id", sql=f"{scheme}:///{tmp_path / 'absent.db'}",
                                          table="features"))


def test_duckdb_missing_says_which_extra_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "features.duckdb").write_bytes(b"")
    monkeypatch.setitem(sys.modules, "duckdb", None)  # import duckdb raises ImportError
    with pytest.raises(ConfigError, match=r"pip install 'vflo\[sql\]'"):
        load_party_data("lab", DataConfig(id_column="id", sql=f"duckdb:///{tmp_path / 'features.duckdb'}",
                                          table="features"))


@pytest.mark.parametrize(("data", "expected"), [
    ({"sql": "postgresql://db.example/features", "table": "f"}, "vflo reads a SQLite database .* not 'postgresql'"),
    ({"sql": "features.db", "table": "f"}, "is not a database URL"),
    ({"sql": "sqlite://host/features.db", "table": "f"}, "names a host"),
    ({"sql": "sqlite:///:memory:", "table": "f"}, "names no database file"),
    ({"table": "f"}, "name it with sql ="),
    ({"sql": "sqlite:///f.db"}, "say which rows with table"),
    ({"sql": "sqlite:///f.db", "table": "f", "query": "SELECT 1"}, "one of the two"),
    ({"sql": "sqlite:///f.db", "table": "f", "file": "train.csv"}, "from file or from the database"),
    ({"sql": "sqlite:///f.db", "serve_query": "SELECT 1", "serve_file": "s.csv"}, "serve_file or from the database"),
])
def test_a_sql_config_mistake_is_refused_when_the_config_is_read(data: dict[str, str], expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        DataConfig(id_column="id", **data)  # type: ignore[arg-type]


def test_database_urls_follow_sqlalchemy(tmp_path: Path) -> None:
    assert parse_url("sqlite:///store/f.db") == ("sqlite", Path("store/f.db"))
    assert parse_url("duckdb:////srv/f.duckdb") == ("duckdb", Path("/srv/f.duckdb"))
    assert absolute_url("sqlite:///store/f.db", tmp_path) == f"sqlite:///{tmp_path}/store/f.db"
    assert absolute_url("duckdb:////srv/f.duckdb", tmp_path) == "duckdb:////srv/f.duckdb"
    assert absolute_url("mysql://h/f", tmp_path) == "mysql://h/f"  # refused, with the reason, where it is built
    # A table's name is quoted, never run as SQL.
    assert SqlSource(url="sqlite:///f.db", table='x"; DROP TABLE y; --').statement == \
        'SELECT * FROM "x""; DROP TABLE y; --"'


@pytest.mark.parametrize("scheme", SCHEMES)
def test_whole_numbers_with_gaps_read_as_a_files_do(tmp_path: Path, scheme: str) -> None:
    from vflo.data.files import read_table

    (tmp_path / "rows.csv").write_text("id,n,none,t\n7,3,,a\n8,,,\n")
    statements = ["CREATE TABLE rows (id INTEGER, n INTEGER, none INTEGER, t TEXT)",
                  "INSERT INTO rows VALUES (7, 3, NULL, 'a'), (8, NULL, NULL, NULL)"]
    database = tmp_path / "rows.db"
    if scheme == "sqlite":
        with closing(sqlite3.connect(database)) as connection:
            for statement in statements:
                connection.execute(statement)
            connection.commit()
    else:
        import duckdb

        with duckdb.connect(str(database)) as connection:
            for statement in statements:
                connection.execute(statement)
    from_csv = read_table(tmp_path / "rows.csv", party="lab", id_column="id")
    from_sql = read_table(SqlSource(url=f"{scheme}:///{database}", table="rows"), party="lab", id_column="id")
    assert from_sql["id"].tolist() == ["7", "8"]
    pd.testing.assert_frame_equal(from_csv, from_sql)


@pytest.mark.skipif(__import__("importlib.util").util.find_spec("duckdb") is None, reason="needs duckdb")
def test_a_duckdb_view_over_parquet_files_reads_as_the_parquet_file(tmp_path: Path) -> None:
    import duckdb

    train, _ = _people(3)
    train.to_parquet(tmp_path / "export.parquet", index=False)
    with duckdb.connect(str(tmp_path / "store.duckdb")) as connection:
        connection.execute(f"CREATE VIEW people AS SELECT * FROM read_parquet('{tmp_path / 'export.parquet'}')")
    kept = {"id_column": "id", "categorical": ("region",), "impute": "mean"}
    view = load_party_data("lab", DataConfig(sql=f"duckdb:///{tmp_path / 'store.duckdb'}", table="people", **kept))
    _same(view.train, load_party_data("lab", DataConfig(file=str(tmp_path / "export.parquet"), **kept)).train)
