"""Configs, protocols, the runner and its outputs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.conftest import make_dataset, two_party_spec
from vflo.errors import ConfigError, DataFileError, ScenarioError
from vflo.experiments.config import parse_config, set_path
from vflo.experiments.output import write_results
from vflo.experiments.protocols import ActiveCV, AlignedHoldout, Holdout, RepeatedRuns, parse_protocol
from vflo.experiments.report import summarize, t_halfwidth
from vflo.experiments.runner import run_experiment


def tiny_config(**overrides: object) -> dict[str, object]:
    raw: dict[str, object] = {
        "name": "tiny",
        "seed": 3,
        "dataset": {"name": "wine"},
        "scenario": {
            "parties": [{"name": "shop", "role": "active", "n_columns": 4}, {"name": "bank", "columns": "rest"}],
            "samples": {"active": 150, "aligned": 80},
            "sweep": {"samples.aligned": [40, 80]},
        },
        "protocol": {"name": "aligned_holdout", "test_rows": 20, "repeats": 2, "train_scope": "all"},
        "methods": [
            {"name": "local"},
            {"name": "splitnn", "train": {"lr": 0.01, "batch_size": 32, "max_epochs": 4, "patience": 0}},
            {"name": "centralized"},
        ],
    }
    raw.update(overrides)
    return raw


# -- config ------------------------------------------------------------------------------------------


def test_config_builds_variants_from_the_sweep() -> None:
    cfg = parse_config(tiny_config())
    assert [v.label for v in cfg.variants] == ["aligned=40", "aligned=80"]
    assert cfg.variants[0].spec.samples.aligned == 40
    assert cfg.protocol == AlignedHoldout(test_rows=20, repeats=2, train_scope="all")
    assert [m.label for m in cfg.methods] == ["local", "splitnn", "centralized"]
    assert cfg.metric == "accuracy"


@pytest.mark.parametrize(("change", "message"), [
    ({"protcol": {}}, r"unknown key 'protcol' \(did you mean 'protocol'\?\)"),
    ({"dataset": {"name": "wines"}}, r"unknown dataset 'wines' \(did you mean 'wine'\?\)"),
    ({"methods": [{"name": "splitn"}]}, r"unknown method 'splitn' \(did you mean 'splitnn'\?\)"),
    ({"methods": [{"name": "splitnn", "trian": {}}]}, r"unknown key 'methods.splitnn.trian' \(did you mean 'train'"),
    ({"methods": [{"name": "local", "model": "svm"}]}, r"methods.local: model 'svm' is neither auto, logistic, "),
    ({"methods": [{"name": "local"}, {"name": "local"}]}, "method labels must be unique"),
    ({"methods": []}, "at least one"),
    ({"protocol": {"name": "holdot"}}, r"unknown protocol 'holdot' \(did you mean 'holdout'\?\)"),
    ({"protocol": {"name": "holdout", "folds": 3}}, r"unknown key 'protocol.folds'"),
    ({"report": {"metric": "f1_binary"}}, "metric for a multiclass task"),
    ({"seed": -1}, "seed must be a non-negative integer"),
])
def test_config_errors_name_the_problem(change: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(tiny_config(**change))


def test_unknown_key_inside_the_scenario_and_a_bad_sweep_path() -> None:
    raw = tiny_config()
    raw["scenario"]["samples"]["alinged"] = 3  # type: ignore[index]
    with pytest.raises(ConfigError, match=r"unknown key 'scenario.samples.alinged' \(did you mean 'aligned'\?\)"):
        parse_config(raw)
    raw = tiny_config()
    raw["scenario"]["sweep"] = {"parties.shoop.n_columns": [2, 3]}  # type: ignore[index]
    with pytest.raises(ConfigError, match=r"no entry 'shoop' \(did you mean 'shop'\?\)"):
        parse_config(raw)


def test_sweeping_a_party_columns_by_name() -> None:
    raw = tiny_config()
    raw["scenario"]["sweep"] = {"parties.shop.n_columns": [2, 5]}  # type: ignore[index]
    cfg = parse_config(raw)
    assert [v.spec.parties[0].n_columns for v in cfg.variants] == [2, 5]


def test_quick_overrides() -> None:
    cfg = parse_config(tiny_config(quick={"protocol.repeats": 1, "methods.splitnn.train.max_epochs": 1}), quick=True)
    assert cfg.protocol.repetitions() == 1 and cfg.methods[1].config.train.max_epochs == 1
    assert parse_config(tiny_config(), quick=True).protocol.repetitions() == 1


def test_set_path_creates_missing_keys_and_selects_by_name() -> None:
    raw: dict[str, object] = {"methods": [{"name": "a"}, {"name": "b", "label": "bee"}]}
    set_path(raw, "methods.bee.train.lr", 0.5)
    assert raw["methods"][1]["train"] == {"lr": 0.5}  # type: ignore[index]
    with pytest.raises(ConfigError, match="no entry 'c'"):
        set_path(raw, "methods.c.x", 1)
    # A name shared with a labelled entry names the unlabelled one, wherever it stands.
    two: dict[str, object] = {"methods": [{"name": "splitnn", "label": "plug"}, {"name": "splitnn"}]}
    set_path(two, "methods.splitnn.n", 3)
    set_path(two, "methods.plug.n", 4)
    assert [m.get("n") for m in two["methods"]] == [4, 3]  # type: ignore[attr-defined]
    both: dict[str, object] = {"methods": [{"name": "splitnn", "label": "x"}, {"name": "splitnn", "label": "y"}]}
    with pytest.raises(ConfigError, match="2 entries are 'splitnn': name one by its label"):
        set_path(both, "methods.splitnn.n", 1)


# -- protocols -------------------------------------------------------------------------------------------


def test_protocol_parsing_and_defaults() -> None:
    assert parse_protocol({"name": "repeated_runs"}) == RepeatedRuns(runs=20)
    assert parse_protocol({"name": "active_cv", "folds": 5}).repetitions() == 5
    with pytest.raises(ConfigError, match="folds must be at least 2"):
        parse_protocol({"name": "active_cv", "folds": 1})


def test_protocol_splits() -> None:
    ds = make_dataset(n=300)
    layout = two_party_spec(active=200, aligned=100, passive_only=50).build(ds, seed=0)
    rng = np.random.default_rng(0)
    aligned = set(layout.aligned_ids().tolist())
    (split,) = AlignedHoldout(test_rows=30).splits(layout, rng)
    assert len(split.test_ids) == 30 and set(split.test_ids.tolist()) <= aligned and split.train_scope == "aligned"
    (split,) = Holdout(test_fraction=0.25).splits(layout, rng)
    assert len(split.test_ids) == 50 and set(split.test_ids.tolist()) <= set(layout.ids("act").tolist())
    folds = ActiveCV(folds=4).splits(layout, rng)
    all_test = np.concatenate([f.test_ids for f in folds])
    assert len(folds) == 4 and sorted(all_test.tolist()) == sorted(layout.ids("act").tolist())
    with pytest.raises(ScenarioError, match="asks for 101 test rows out of 100"):
        AlignedHoldout(test_rows=101).splits(layout, rng)
    (split,) = AlignedHoldout(test_rows=1.0).splits(layout, rng)
    assert sorted(split.test_ids.tolist()) == sorted(aligned)


def test_stratified_holdout_keeps_class_balance() -> None:
    ds = make_dataset(n=400)
    layout = two_party_spec(active=400, aligned=400).build(ds, seed=0)
    (split,) = Holdout(test_fraction=0.25).splits(layout, np.random.default_rng(0))
    y = pd.Series(ds.y, index=ds.ids)
    assert abs(y.loc[split.test_ids].mean() - y.mean()) < 0.02


def test_t_interval() -> None:
    assert np.isnan(t_halfwidth([1.0]))
    assert t_halfwidth([1.0, 2.0, 3.0]) == pytest.approx(2.4841, rel=1e-3)


# -- runner and outputs ---------------------------------------------------------------------------------


def test_run_writes_every_output_and_is_deterministic(tmp_path: Path) -> None:
    cfg = parse_config(tiny_config())
    first = run_experiment(cfg)
    second = run_experiment(cfg)
    drop = ["fit_seconds", "predict_seconds", "wall_seconds"]
    a, b = pd.DataFrame(first.rows).drop(columns=drop), pd.DataFrame(second.rows).drop(columns=drop)
    pd.testing.assert_frame_equal(a, b)
    assert len(a) == 2 * 2 * 3
    required = {"method", "aligned", "accuracy", "f1_micro", "f1_macro", "f1_weighted", "comm_bytes",
                "comm_rounds", "wall_seconds", "samples.aligned"}
    assert required <= set(first.rows[0])
    # communication comes from the ledger: nothing for local and centralized, real traffic for splitnn
    assert (a[a.method == "local"].comm_bytes == 0).all() and (a[a.method == "splitnn"].comm_bytes > 0).all()
    # training and scoring traffic are told apart: SplitNN scores in one round
    splitnn = a[a.method == "splitnn"]
    assert (splitnn.predict_rounds == 1).all() and (splitnn.fit_rounds == splitnn.comm_rounds - 1).all()
    assert (splitnn.fit_bytes + splitnn.predict_bytes == splitnn.comm_bytes).all()
    out = write_results(first, tmp_path / "out")
    names = {p.name for p in out.iterdir()}
    assert {"results.csv", "results.json", "report.md", "summary.csv", "metric_vs_x.png", "bytes_vs_x.png"} <= names
    report = (out / "report.md").read_text()
    assert "centralized (oracle)" in report and "splitnn.forward" in report
    data = json.loads((out / "results.json").read_text())
    assert data["dataset"]["standin"] is False and len(data["rows"]) == 12
    summary = summarize(first)
    assert list(summary.repeats) == [2] * 6


def test_a_failure_leaves_no_output_folder(tmp_path: Path) -> None:
    cfg = parse_config(tiny_config(dataset={"name": "credit_default"}, scenario={
        "parties": [{"name": "a", "role": "active", "n_columns": 4}, {"name": "b", "columns": "rest"}]}))
    out = tmp_path / "out"
    with pytest.raises(DataFileError):
        result = run_experiment(cfg, data_dir=str(tmp_path / "empty"))
        write_results(result, out)
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_atomic_write_cleans_up_after_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from vflo.experiments import output

    result = run_experiment(parse_config(tiny_config(quick={}), quick=True))

    def broken(*_args: object) -> None:
        raise RuntimeError("disk full")

    monkeypatch.setattr(output, "write_plots", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        write_results(result, tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_an_existing_output_folder_is_kept_unless_overwrite(tmp_path: Path) -> None:
    result = run_experiment(parse_config(tiny_config(quick={}), quick=True))
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(ConfigError, match="not empty"):
        write_results(result, out)
    assert (out / "keep.txt").exists()
    # --overwrite replaces only what vflo wrote there: a file of the user's is never deleted.
    with pytest.raises(ConfigError, match=r"also holds \['keep.txt'\], which vflo did not write"):
        write_results(result, out, overwrite=True)
    (out / "keep.txt").unlink()
    write_results(result, out)
    write_results(result, out, overwrite=True)  # its own outputs: replaced
    assert (out / "report.md").exists()


def test_standin_results_say_so(tmp_path: Path) -> None:
    raw = tiny_config(dataset={"name": "mimic3_los_standin"})
    raw["scenario"] = {
        "parties": [{"name": "a", "role": "active", "columns": ["Age", "NumCalouts"]},
                    {"name": "b", "columns": "rest"}],
        "samples": {"total": 600, "active": 500, "aligned": 200},
    }
    raw["methods"] = [{"name": "local"}]
    result = run_experiment(parse_config(raw))
    assert all(r["standin"] for r in result.rows)
    out = write_results(result, tmp_path / "o")
    assert "Stand-in data" in (out / "report.md").read_text()


def test_transductive_cv_fits_the_representation_once_and_cross_validates_the_classifier() -> None:
    raw = tiny_config(protocol={"name": "active_cv", "folds": 3, "repeats": 1, "transductive": True})
    raw["methods"] = [{"name": "local"}, {"name": "apc_vfl", "train": {"max_epochs": 2, "patience": 0}}]
    raw["scenario"]["sweep"] = {}  # type: ignore[index]
    result = run_experiment(parse_config(raw))
    rows = pd.DataFrame(result.rows)
    assert sorted(rows.fold.unique()) == [0, 1, 2] and set(rows.method) == {"local", "apc_vfl"}
    apc = rows[rows.method == "apc_vfl"]
    assert (apc.comm_rounds == 1).all() and apc.comm_bytes.nunique() == 1
    assert rows.groupby("method").n_test.sum().tolist() == [150, 150]  # every active row scored once


def test_transductive_cv_refuses_methods_without_a_representation() -> None:
    raw = tiny_config(protocol={"name": "active_cv", "folds": 3, "repeats": 1, "transductive": True})
    raw["methods"] = [{"name": "splitnn"}]
    with pytest.raises(ConfigError, match=r"transductive protocol .* \['splitnn'\] have none"):
        parse_config(raw)


def test_party_counts_and_zipped_sweeps() -> None:
    raw = tiny_config()
    raw["scenario"] = {
        "parties": [{"name": "shop", "role": "active", "columns": []},
                    {"name": "solo", "n_columns": 1, "count": 1}, {"name": "client", "share": 1.0, "count": 3}],
        "zip": {"parties.solo.count": [1, 2], "parties.client.count": [3, 2]},
        "sweep": {"samples.aligned": [0.5, 1.0]},
    }
    raw["protocol"] = {"name": "holdout", "test_from": "aligned"}
    cfg = parse_config(raw)
    assert [v.label for v in cfg.variants] == [
        "aligned=0.5, solo.count=1, client.count=3", "aligned=0.5, solo.count=2, client.count=2",
        "aligned=1.0, solo.count=1, client.count=3", "aligned=1.0, solo.count=2, client.count=2"]
    spec = cfg.variants[1].spec
    assert [p.name for p in spec.parties] == ["shop", "solo1", "solo2", "client1", "client2"]
    from vflo.data.datasets import load_dataset

    layout = spec.build(load_dataset("wine"), seed=0)
    assert [len(layout.columns[p.name]) for p in spec.parties] == [0, 1, 1, 6, 5]
    raw["scenario"]["zip"] = {"parties.solo.count": [1, 2], "parties.client.count": [3]}
    with pytest.raises(ConfigError, match="same length"):
        parse_config(raw)


def test_named_blocks_sweep_and_test_rows_only_the_active_party_holds() -> None:
    raw = tiny_config()
    raw["scenario"] = {
        "parties": [{"name": "p2", "n_columns": 4}, {"name": "p1", "n_columns": 4},
                    {"name": "a", "role": "active", "columns": "rest"}],
        "samples": {"layout": "blocks", "blocks": [
            {"name": "p1_p2", "parties": ["p1", "p2"], "rows": 40},
            {"name": "p1_a", "parties": ["p1", "a"], "rows": 40},
            {"parties": ["a"], "rows": 30}]},
        "zip": {"samples.blocks.p1_p2.rows": [60, 20], "samples.blocks.p1_a.rows": [20, 60]},
    }
    raw["protocol"] = {"name": "repeated_runs", "runs": 1, "test_fraction": 0.5, "test_from": "active_only"}
    cfg = parse_config(raw)
    assert [v.label for v in cfg.variants] == ["p1_p2.rows=60, p1_a.rows=20", "p1_p2.rows=20, p1_a.rows=60"]
    from vflo.data.datasets import load_dataset

    layout = cfg.variants[1].spec.build(load_dataset("wine"), seed=0)
    assert len(np.intersect1d(layout.ids("p1"), layout.ids("a"))) == 60
    (split,) = cfg.protocol.splits(layout, np.random.default_rng(0))
    alone = np.setdiff1d(layout.ids("a"), layout.ids("p1"))
    assert len(split.test_ids) == 15 and set(split.test_ids.tolist()) <= set(alone.tolist())
    raw["scenario"]["samples"]["blocks"] = raw["scenario"]["samples"]["blocks"][:2]
    raw["scenario"].pop("zip")
    layout = parse_config(raw).variants[0].spec.build(load_dataset("wine"), seed=0)
    with pytest.raises(ScenarioError, match="every row of the active party is also held"):
        parse_config(raw).protocol.splits(layout, np.random.default_rng(0))


def test_a_fixed_split_keeps_the_rows_and_varies_only_the_seeds() -> None:
    # Local's logistic regression ignores its seed, so equal scores mean equal rows.
    raw = tiny_config(protocol={"name": "repeated_runs", "runs": 3, "test_fraction": 0.2, "test_from": "aligned",
                                "fixed_split": True}, methods=[{"name": "local"}])
    raw["scenario"] = {k: v for k, v in raw["scenario"].items() if k != "sweep"}  # type: ignore[union-attr]
    fixed = pd.DataFrame(run_experiment(parse_config(raw)).rows)
    assert fixed.seed.nunique() == 3 and fixed.f1_macro.nunique() == 1
    raw["protocol"]["fixed_split"] = False  # type: ignore[index]
    drawn = pd.DataFrame(run_experiment(parse_config(raw)).rows)
    assert drawn.f1_macro.nunique() > 1
    # the fixed split is the first run's
    assert fixed.iloc[0].f1_macro == drawn.iloc[0].f1_macro and list(fixed.seed) == list(drawn.seed)


def test_local_on_aligned_rows_only() -> None:
    from vflo.federation.simulation import run_method
    from vflo.methods.registry import get_method

    ds = make_dataset(n=300)
    layout = two_party_spec(active=300, aligned=120).build(ds, seed=0)
    data = layout.materialize(test_ids=np.sort(layout.aligned_ids())[:20])
    method = get_method("local")(rows="aligned")
    out = run_method(method, data, seed=0)
    assert method.n_train_ == 100 and out.ledger.summary().bytes == 0 and out.ledger.summary().align_bytes > 0
    everything = get_method("local")()
    run_method(everything, data, seed=0)
    assert everything.n_train_ == 280


def test_every_compare_config_parses() -> None:
    import tomllib

    from vflo.experiments.compare import cells, load_compare

    folder = Path(__file__).resolve().parents[1] / "configs" / "compare"
    configs = sorted(folder.glob("*.toml"))
    assert {c.stem for c in configs} >= {"breast_cancer", "wine", "digits", "credit", "handwritten", "mnist5000",
                                         "diabetes"}
    for config in configs:
        base, settings = load_compare(tomllib.loads(config.read_text()))
        assert base["dataset"]["name"] and cells(settings)
        _, quick = load_compare(tomllib.loads(config.read_text()), quick=True)
        assert quick.repeats >= 3 and len(cells(quick)) < len(cells(settings))
