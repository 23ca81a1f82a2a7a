"""Training from disk: matrices kept in files beyond a party's limit, read a batch at a time, with the numbers of
training in memory; Parquet files read a column at a time; standardisation in blocks."""

from __future__ import annotations

import gc
import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.test_apc_vfl import QUICK, _data
from vflo import spill
from vflo.data import preprocessing
from vflo.data.files import ColumnFile, open_table, read_table
from vflo.data.partydata import PartyData
from vflo.deploy.configs import load_party_config
from vflo.errors import ConfigError, DataError, DataFileError
from vflo.federation.simulation import run_method
from vflo.methods.registry import get_method
from vflo.nn import train as train_module
from vflo.nn.distill import fit_autoencoder
from vflo.nn.train import TrainConfig
from vflo.seeding import torch_generator
from vflo.spill import DiskRows, RowSink, Slotted, SpillConfig


@pytest.fixture
def limit(tmp_path: Path) -> Iterator[callable]:  # type: ignore[valid-type]
    """Set the process's [spill] for one test (files under tmp_path), and put the default back."""
    before = spill.current()

    def use(limit_mb: int) -> Path:
        folder = tmp_path / "spill"
        spill.configure(SpillConfig(limit_mb=limit_mb, folder=str(folder)))
        return folder

    yield use
    spill.configure(before)


def _rss_bytes() -> int:
    """The process's resident memory, file pages it maps included."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def test_a_matrix_within_the_limit_stays_in_memory_and_beyond_it_goes_to_a_file(limit) -> None:  # type: ignore[no-untyped-def]
    folder = limit(1)
    rng = np.random.default_rng(0)
    small = rng.standard_normal((100, 8)).astype(np.float32)
    sink = RowSink(100, 8, np.float32)
    sink.write(small[:60])
    sink.write(small[60:])
    kept = sink.finish()
    assert isinstance(kept, np.ndarray) and np.array_equal(kept, small)

    big = rng.standard_normal((70_000, 8)).astype(np.float32)  # 2.2 MB, over 1 MB
    sink = RowSink(len(big), 8, np.float32, what="a test matrix")
    for start in range(0, len(big), 30_000):
        sink.write(big[start:start + 30_000])
    rows = sink.finish()
    assert isinstance(rows, DiskRows) and rows.shape == big.shape and len(rows) == len(big)
    files = list(folder.iterdir())
    assert len(files) == 1 and files[0].stat().st_size == big.nbytes
    positions = rng.permutation(len(big))[:500]
    assert np.array_equal(rows.take(positions), big[positions])
    assert np.array_equal(rows[123:4567], big[123:4567])
    assert np.array_equal(rows[positions], big[positions])
    with pytest.raises(ConfigError, match="kept on disk.*model = 'mlp'"):
        np.asarray(rows)
    del rows
    gc.collect()
    assert not list(folder.iterdir())  # the file goes with its matrix


def test_a_sink_refuses_rows_that_do_not_continue_it_and_an_abandoned_one_leaves_no_file(limit) -> None:  # type: ignore[no-untyped-def]
    folder = limit(0)
    sink = RowSink(10, 3, np.float32)
    with pytest.raises(ValueError, match="does not continue"):
        sink.write(np.zeros((4, 2), dtype=np.float32))
    sink.write(np.zeros((4, 3), dtype=np.float32))
    with pytest.raises(ValueError, match="4 of 10 rows"):
        sink.finish()
    del sink
    gc.collect()
    assert not list(folder.iterdir())


def test_a_spill_folder_that_cannot_be_written_and_a_truncated_file_say_so(limit, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the folder should be")
    spill.configure(SpillConfig(limit_mb=0, folder=str(blocker / "spill")))
    with pytest.raises(ConfigError, match=r"cannot keep the test rows .* on disk in .*set \[spill\] folder"):
        RowSink(10, 3, np.float32, what="the test rows")
    limit(0)
    sink = RowSink(10, 3, np.float32)
    sink.write(np.ones((10, 3), dtype=np.float32))
    rows = sink.finish()
    assert isinstance(rows, DiskRows)
    with rows.path.open("r+b") as f:
        f.truncate(12 * 5)
    assert np.array_equal(rows[0:5], np.ones((5, 3), dtype=np.float32))
    with pytest.raises(OSError, match="ended early"):
        rows[0:10]


def test_a_file_that_is_not_parquet_is_refused_with_its_name(tmp_path: Path) -> None:
    path = tmp_path / "bank.parquet"
    path.write_text("id,x\n1,2\n")
    with pytest.raises(DataFileError, match=r"party 'bank': could not read .*bank.parquet"):
        PartyData.from_file(path, party="bank", id_column="id")


def test_reading_a_matrix_on_disk_keeps_resident_memory_bounded(limit) -> None:  # type: ignore[no-untyped-def]
    limit(0)
    rows, width = 262_144, 256  # 256 MB of float32, in the kernel's page cache once written
    sink = RowSink(rows, width, np.float32)
    for start in range(0, rows, 16_384):
        sink.write(np.arange(start, start + 16_384, dtype=np.float32)[:, None].repeat(width, axis=1))
    matrix = sink.finish()
    assert isinstance(matrix, DiskRows)
    before = peak = _rss_bytes()
    # Every row once, in random batches as training reads them (a memory map would bring the whole file in).
    for batch in np.array_split(np.random.default_rng(0).permutation(rows), 64):
        got = matrix.take(batch)
        assert np.array_equal(got[:, 0], batch) and np.array_equal(got[:, -1], batch)
        peak = max(peak, _rss_bytes())
    assert peak - before < 48 << 20
    assert np.array_equal(matrix[rows - 5:rows + 9][:, 3], np.arange(rows - 5, rows))
    assert np.array_equal(matrix.take(np.array([7, 7, 3, 8])[:, None].reshape(-1))[:, 0], [7, 7, 3, 8])
    with pytest.raises(IndexError, match="outside"):
        matrix.take(np.array([rows]))


def _apc(classifier: dict[str, object] | None = None) -> object:
    mlp = {"model": "mlp", "hidden": [], "train": {"max_epochs": 2, "batch_size": 32, "patience": 0}}
    return get_method("apc_vfl")(train={**QUICK, "validation_fraction": 0.2}, classifier=classifier or mlp)


def test_apc_vfl_with_every_matrix_on_disk_scores_as_in_memory(limit, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    data = _data(n=400, aligned=200)
    limit(-1)
    in_memory = run_method(_apc(), data, seed=0).scores
    folder = limit(0)
    with caplog.at_level(logging.INFO, logger="vflo.spill"):
        on_disk = run_method(_apc(), data, seed=0).scores
    kept = " ".join(r.getMessage() for r in caplog.records)
    for what in ("pas's latents", "the joint autoencoder's input", "the teacher's latents", "the student's latents"):
        assert f"keeping {what}" in kept
    assert np.array_equal(in_memory, on_disk)
    gc.collect()
    assert not list(folder.iterdir())


def test_a_classifier_that_needs_every_row_in_memory_says_what_to_do(limit) -> None:  # type: ignore[no-untyped-def]
    limit(0)
    with pytest.raises(ConfigError, match=r"kept on disk .*limit_mb = 0.*model = 'mlp'"):
        run_method(_apc({"model": "logistic"}), _data(), seed=0)


def test_a_target_for_some_rows_trains_as_a_full_height_target_with_a_mask() -> None:
    rng = np.random.default_rng(1)
    X = rng.standard_normal((300, 5)).astype(np.float32)
    rows = np.sort(rng.choice(300, 120, replace=False))
    target = rng.standard_normal((120, 6)).astype(np.float32)
    full = np.zeros((300, 6), dtype=np.float32)
    full[rows] = target
    mask = np.zeros(300, dtype=bool)
    mask[rows] = True
    config = TrainConfig(max_epochs=3, batch_size=32, patience=0)

    def fitted(**kw: object) -> np.ndarray:
        model = fit_autoencoder(X, (8, 6), activation="selu", train=config, generator=torch_generator(0, "t"),
                                rng=np.random.default_rng(0), weight=0.5, **kw)  # type: ignore[arg-type]
        return model.encode(X)

    assert np.array_equal(fitted(target=full, target_mask=mask), fitted(target=target, target_rows=rows))
    with pytest.raises(ConfigError, match=r"shape \(120, 6\), expected \(300, 6\)"):
        fitted(target=target)
    assert np.array_equal(Slotted(target, np.where(mask, np.cumsum(mask) - 1, -1)).take(np.arange(300)), full)


def test_validation_a_block_at_a_time_gives_the_loss_of_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    X = torch.randn(1000, 4, generator=torch.Generator().manual_seed(0))
    model = torch.nn.Linear(4, 1)

    def loss(module: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return (module(batch["x"]) ** 2).mean()

    config = TrainConfig(validation_fraction=0.3)
    whole = train_module.ModuleTrainer(model, loss, {"x": X}, config=config, rng=np.random.default_rng(0))
    monkeypatch.setattr(train_module, "VALIDATION_BLOCK", 7)
    blocks = train_module.ModuleTrainer(model, loss, {"x": X}, config=config, rng=np.random.default_rng(0))
    assert whole.val_tensors is not None and blocks.val_tensors is None
    one, many = whole.validation_loss(), blocks.validation_loss()
    assert one is not None and many is not None and many == pytest.approx(one, rel=1e-6)


def test_a_parquet_file_read_a_column_at_a_time_is_the_table_read_whole(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    n = 500
    frame = pd.DataFrame({
        "pid": [f"{i:05d}" for i in range(n)],
        "age": rng.integers(20, 80, n).astype(float),
        "city": rng.choice(["Oslo", "Lima", "Pune"], n),
        "income": rng.normal(50, 10, n),
        "outcome": rng.choice(["yes", "no"], n),
    })
    frame.loc[::7, "income"] = np.nan
    frame.loc[::11, "city"] = None
    path = tmp_path / "bank.parquet"
    frame.to_parquet(path)
    table = open_table(path, party="bank", id_column="pid")
    assert isinstance(table, ColumnFile) and len(table) == n and list(table.columns) == list(frame.columns)
    kwargs = {"party": "bank", "id_column": "pid", "label_column": "outcome", "categorical": ["city"],
              "impute": "median", "missing_indicator": True}
    by_column = PartyData.from_file(path, **kwargs)  # type: ignore[arg-type]
    whole = PartyData.from_frame(read_table(path, party="bank", id_column="pid"), **kwargs)  # type: ignore[arg-type]
    assert by_column.columns == whole.columns and by_column.encoding == whole.encoding
    assert np.array_equal(by_column.ids, whole.ids) and by_column.ids[0] == "00000"
    assert np.array_equal(by_column.X, whole.X) and np.array_equal(by_column.y, whole.y)
    with pytest.raises(KeyError):
        table["nope"]


def test_standardising_in_blocks_matches_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    X = (np.random.default_rng(3).standard_normal((10_001, 5)) * [1, 10, 100, 1e-3, 0] + 7).astype(np.float32)
    whole = preprocessing.Standardizer.fit(X)
    monkeypatch.setattr(preprocessing, "MOMENT_ROWS", 999)
    blocks = preprocessing.Standardizer.fit(X)
    assert np.allclose(blocks.mean_, whole.mean_, rtol=1e-12, atol=1e-12)
    assert np.allclose(blocks.scale_, whole.scale_, rtol=1e-10)


def test_a_party_config_sets_its_spill(tmp_path: Path) -> None:
    path = tmp_path / "shop.toml"
    path.write_text('name = "shop"\nrole = "passive"\nlisten = "127.0.0.1:0"\n\n[data]\nfile = "shop.csv"\n'
                    'id_column = "id"\n\n[spill]\nlimit_mb = 512\nfolder = "scratch"\n')
    assert load_party_config(path).spill == SpillConfig(limit_mb=512, folder=str(tmp_path / "scratch"))
    with pytest.raises(ConfigError, match="limit_mb must be -1"):
        SpillConfig(limit_mb=-5)


def test_text_ids_come_straight_from_the_file_as_the_table_reads_them(tmp_path: Path) -> None:
    # ASCII text without a Python string per ID; other text, numbers and gaps by the table's path, as before.
    for ids in (["p-1", "b", "a longer id"], ["é", "a", "b"], [7, 8, 9]):
        path = tmp_path / "ids.parquet"
        pd.DataFrame({"pid": ids, "x": [1.0, 2.0, 3.0]}).to_parquet(path)
        by_column = PartyData.from_file(path, party="bank", id_column="pid")
        whole = PartyData.from_frame(read_table(path, party="bank", id_column="pid"), party="bank", id_column="pid")
        assert by_column.ids.tolist() == whole.ids.tolist() == [str(i) for i in ids]
    pd.DataFrame({"pid": ["a", None, "c"], "x": [1.0, 2.0, 3.0]}).to_parquet(path)
    with pytest.raises(DataError, match="missing values"):
        PartyData.from_file(path, party="bank", id_column="pid")


def test_ascii_text_places_every_block_of_rows() -> None:
    import pyarrow as pa

    from vflo.data import files

    column = pa.array([f"u{i}" * (i % 3) for i in range(50)])[7:]  # a slice, empty texts, widths 0 to 6
    old = files.TEXT_BLOCK
    files.TEXT_BLOCK = 4
    try:
        text = files.ascii_text(column)
    finally:
        files.TEXT_BLOCK = old
    assert text is not None and text.tolist() == column.to_pylist()
    assert files.ascii_text(pa.array(["é"])) is None



def test_two_parties_in_one_process_each_keep_matrices_by_their_own_spill_setting(tmp_path: Path) -> None:
    """Two fake parties, as in simulation: each handles its messages under its own [spill], one inside the other's
    handler (a call in one process) and both at once from two threads; outside them the process's default holds."""
    import threading

    default = spill.current()
    own = {"a": SpillConfig(limit_mb=0, folder=str(tmp_path / "a")), "b": SpillConfig(limit_mb=-1)}
    seen: dict[str, list[tuple[int, bool]]] = {"a": [], "b": []}
    both_inside = threading.Barrier(2, timeout=30)

    def handle(party: str, *, then: str | None = None, wait: bool = False) -> None:
        with spill.using(own[party]):
            sink = RowSink(4, 3, np.float32, what=f"{party}'s rows")
            sink.write(np.ones((4, 3), dtype=np.float32))
            if wait:
                both_inside.wait()
            if then is not None:
                handle(then)
            seen[party].append((spill.current().limit_mb, isinstance(sink.finish(), DiskRows)))

    handle("a", then="b")
    assert seen == {"a": [(0, True)], "b": [(-1, False)]} and spill.current() is default
    threads = [threading.Thread(target=handle, args=(p,), kwargs={"wait": True}) for p in own]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert seen == {"a": [(0, True)] * 2, "b": [(-1, False)] * 2} and spill.current() is default
    assert not (tmp_path / "b").exists()  # b keeps every matrix in memory; a's files went with its matrices
    with spill.using(None):
        assert spill.current() is default
