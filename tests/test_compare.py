"""vflo compare's pieces: test people fixed before the overlap varies, every seed method with a cell, ties and
claims decided by one paired test, one look per method."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tests.conftest import make_dataset
from vflo.data.scenario import BlockSpec, PartySpec, SamplesSpec, ScenarioSpec
from vflo.errors import ConfigError, ScenarioError
from vflo.experiments.compare import (
    Cell,
    CompareSettings,
    Comparison,
    applicable,
    cannot_run,
    cells,
    column_split,
    compare,
    experiment_tables,
    held_out_people,
    load_compare,
    paired,
    paired_p,
    summary,
    which_method,
)
from vflo.experiments.compare_privacy import privacy_cells, privacy_sentences, privacy_table
from vflo.experiments.compare_report import claims
from vflo.experiments.config import parse_config
from vflo.experiments.protocols import AlignedHoldout, RepeatedRuns
from vflo.experiments.runner import run_experiment
from vflo.experiments.styles import method_style
from vflo.methods.registry import method_names

FAST = {"batch_size": 64, "max_epochs": 3, "patience": 0}
BASE = {"name": "t", "seed": 4, "dataset": {"name": "breast_cancer"}}


def _layout(cell: Cell, settings: CompareSettings, seed: int) -> object:
    from vflo.data.datasets import load_dataset

    dataset = load_dataset("breast_cancer")
    columns = column_split(dataset, cell.split, cell.passives, settings.active_share, 4)
    methods, _ = applicable(settings, "binary", cell)
    config = parse_config(experiment_tables(BASE, settings, cell, columns, methods, len(dataset.ids)))
    return config.layout(config.variants[0], seed, dataset)


def test_the_test_people_are_the_same_in_every_cell_and_repeat() -> None:
    settings = CompareSettings(aligned=(0.01, 1.0), passives=(1, 2), splits=("random",), second_hop=(0.5,),
                               methods=("local",))
    assert held_out_people(settings, 569) == 57 and held_out_people(settings, 178) == 35  # wine: at most 20 % each
    seen: dict[str, set[tuple[object, ...]]] = {"aligned": set(), "active_only": set()}
    shared_train = []
    for cell in (Cell("aligned", 0.01, "aligned", 1, "random"), Cell("aligned", 1.0, "aligned", 1, "random"),
                 Cell("passives", 2, "aligned", 2, "random"), Cell("second_hop", 0.5, "aligned", 2, "random")):
        for seed in (1, 2):
            layout = _layout(cell, settings, seed)
            for kind, found in seen.items():
                held = layout.held_out(kind)  # type: ignore[attr-defined]
                assert len(held) == 57
                found.add(tuple(held.tolist()))
            data = layout.materialize(test_ids=layout.held_out("aligned"))  # type: ignore[attr-defined]
            # No test person is trained on by anyone, whichever kind is scored.
            unseen = set(layout.held_out_ids().tolist())  # type: ignore[attr-defined]
            assert all(not unseen & set(d.ids.tolist()) for d in data.train.values())
            if cell.axis == "aligned":
                shared_train.append(len(np.intersect1d(data.train["active"].ids, data.train["passive1"].ids)))
    assert len(seen["aligned"]) == 1 and len(seen["active_only"]) == 1
    # The overlap varies among the 455 training people only: 1 % and 100 % of them.
    assert shared_train == [5, 5, 455, 455]


def test_a_second_hop_cell_has_a_party_that_shares_no_one_with_the_active_party() -> None:
    settings = CompareSettings(aligned=(0.5,), passives=(1,), splits=("random",), second_hop=(0.5,))
    layout = _layout(Cell("second_hop", 0.5, "aligned", 2, "random"), settings, 1)
    ids = {p: set(layout.ids(p).tolist()) for p in ("active", "passive1", "passive2")}  # type: ignore[attr-defined]
    own = (569 - 2 * 57) // 2
    assert len(ids["active"]) == own + 2 * 57 and not ids["active"] & ids["passive2"]
    assert len(ids["passive1"] & ids["passive2"]) == round(0.5 * own)
    run, skipped = applicable(settings, "binary", Cell("second_hop", 0.5, "aligned", 2, "random"))
    assert run["splitnn"]["partners"] == ["passive1"] and run["vfl_asp"]["second_hop"] == "passive2"
    assert "apc_vfl" in skipped and "centralized" in skipped
    star, why = applicable(settings, "binary", Cell("aligned", 0.5, "aligned", 1, "random"))
    assert "entity_augmentation" in star and "second-hop party" in why["vfl_asp"]


def test_every_seed_method_has_cells() -> None:
    tiny = {"train": FAST}
    asp = {"train": FAST, "student_train": FAST, "embedding_train": FAST}
    raw = {**BASE, "compare": {
        "aligned": [0.1], "base_aligned": 0.1, "passives": [1], "splits": ["random"], "second_hop": [1.0],
        "repeats": 1, "p_miss": [],
        "absent": [],
        "methods": ["local", "apc_vfl", "entity_augmentation", "rap", "vfl_asp", "vfl_asp_student", "splitnn"],
        "settings": {"apc_vfl": tiny, "entity_augmentation": tiny, "splitnn": tiny, "vfl_asp": asp,
                     "vfl_asp_student": asp}}}
    result = compare(raw)
    rows = result.rows
    assert (rows["status"] == "ok").all(), rows[rows["status"] != "ok"][["method", "error"]]
    ran = {(m, a, s) for m, a, s in zip(rows["method"], rows["axis"], rows["scored"], strict=True)}
    assert {("entity_augmentation", "aligned", "aligned"), ("apc_vfl", "aligned", "active_only"),
            ("vfl_asp", "second_hop", "aligned"), ("vfl_asp_student", "second_hop", "active_only"),
            ("splitnn", "second_hop", "aligned")} <= ran
    assert set(rows["n_test"]) == {57}
    assert result.second_hop_settings["splitnn"] == {"partners": ["passive1"]}


def _rows(values: dict[str, list[float]], *, oracle: tuple[str, ...] = ()) -> pd.DataFrame:
    return pd.DataFrame([{"method": m, "repeat": r, "fold": 0, "accuracy": v, "status": "ok", "axis": "aligned",
                          "value": "0.5", "scored": "aligned", "fit_bytes": 0, "fit_rounds": 0, "wall_seconds": 0.1,
                          "simulation_only": m in oracle, "inference": "active_only", "n_test": 60}
                         for m, vs in values.items() for r, v in enumerate(vs)])


def test_ties_and_claims_come_from_one_paired_test() -> None:
    assert paired_p(np.array([0.9, 0.8, 0.7]), np.array([0.9, 0.8, 0.7])) == 1.0
    # Always 0.1 ahead: the repeats give no spread to test by (on fixed test people, one row can be all of it).
    assert np.isnan(paired_p(np.array([0.9, 0.8, 0.7]), np.array([0.8, 0.7, 0.6])))
    rows = _rows({"apc_vfl": [0.90, 0.80, 0.85, 0.88], "local": [0.80, 0.71, 0.74, 0.79],
                  "splitnn": [0.91, 0.75, 0.87, 0.80], "centralized": [0.99, 0.99, 0.99, 0.99]},
                 oracle=("centralized",))
    comparison = Comparison(name="t", dataset=None, task="binary", metric="accuracy", rows=rows,  # type: ignore[arg-type]
                            skipped={}, seconds=1.0, settings=CompareSettings())
    best = which_method(comparison, summary(comparison)).iloc[0]
    # apc_vfl is ahead of local in every repeat (p < 0.05); splitnn's spread leaves it a tie; the oracle is no
    # candidate, however high.
    assert best["best"] == "apc_vfl" and best["ties"] == "splitnn"
    test = paired(rows, "accuracy", {"axis": "aligned", "value": "0.5", "scored": "aligned"}, "apc_vfl", "local")
    assert test is not None and test.runs == 4 and test.p < 0.05 and test.verdict(True) == "ahead of"
    assert test.verdict(False) == "behind"
    # A claim line says what the same test says, with its numbers.
    rows.loc[rows["method"] == "apc_vfl", "scored"] = "active_only"
    rows.loc[rows["method"] == "local", "scored"] = "active_only"
    # Cells of an axis whose values are not shares (the column split's) sit beside them in a real comparison.
    by_split = rows.assign(axis="split", value="importance")
    lines = claims(Comparison(name="t", dataset=None, task="binary", metric="accuracy",  # type: ignore[arg-type]
                              rows=pd.concat([rows, by_split], ignore_index=True), skipped={}, seconds=1.0,
                              settings=CompareSettings()))
    apc = next(line for line in lines if line.startswith("APC-VFL's claim"))
    assert f"p = {test.p:.3g}" in apc and "apc_vfl ahead of local" in apc
    constant = _rows({"apc_vfl": [0.9, 0.9, 0.9], "local": [0.8, 0.8, 0.8]})
    same = paired(constant, "accuracy", {"axis": "aligned"}, "apc_vfl", "local")
    assert same is not None and same.verdict(True) == "not clearly different from"
    assert "no spread to test by" in same.sentence("accuracy", True)
    one = _rows({"apc_vfl": [0.9], "local": [0.8]})
    one_test = paired(one, "accuracy", {"axis": "aligned"}, "apc_vfl", "local")
    assert one_test is not None and "too few to tell" in one_test.sentence("accuracy", True)
    assert one_test.verdict(True) == "not clearly different from"


def test_every_method_has_its_own_look() -> None:
    looks = [method_style(m) for m in method_names()]
    assert len(set(looks)) == len(looks) >= 12
    assert len({c for c, _ in looks}) == len(looks) and len({m for _, m in looks}) == len(looks)
    assert method_style("splitnn") == method_style("splitnn")


def test_held_out_test_people_in_a_scenario() -> None:
    ds = make_dataset(n=400, n_features=6)
    spec = ScenarioSpec(parties=(PartySpec(name="a", role="active", n_columns=2), PartySpec(name="p", share=1.0)),
                        samples=SamplesSpec(aligned=0.1, test_aligned=40, test_active_only=0.1, test_seed=9))
    layout = spec.build(ds, seed=1)
    assert len(layout.held_out("aligned")) == 40 and len(layout.held_out("active_only")) == 40
    assert len(layout.held_out("active")) == 80
    # Stratified: both classes in the usual proportion.
    y = ds.y[np.searchsorted(ds.ids, layout.held_out("aligned"))]
    assert abs(y.mean() - ds.y.mean()) < 0.1
    split = RepeatedRuns(test_from="active_only", test_fraction=0.5).splits(layout, np.random.default_rng(0))[0]
    assert np.array_equal(split.test_ids, layout.held_out("active_only"))  # all of them, not a fraction
    with pytest.raises(ConfigError, match="draws its own test rows"):
        AlignedHoldout().splits(layout, np.random.default_rng(0))
    blocks = ScenarioSpec(parties=spec.parties, samples=SamplesSpec(layout="blocks", blocks=(
        BlockSpec(parties=("a", "p"), rows=30, test=True), BlockSpec(parties=("a", "p"), rows=100),
        BlockSpec(parties=("a",), rows=100)))).build(ds, seed=1)
    assert len(blocks.held_out("aligned")) == 30 and len(blocks.held_out("active_only")) == 0
    with pytest.raises(ScenarioError, match="holds out no such test people"):
        RepeatedRuns(test_from="active_only").splits(blocks, np.random.default_rng(0))
    with pytest.raises(ConfigError, match="mark test blocks with test = true"):
        SamplesSpec(layout="blocks", blocks=(BlockSpec(parties=("a",), rows=3),), test_aligned=3)
    with pytest.raises(ScenarioError, match="leave rows to train on"):
        ScenarioSpec(parties=spec.parties, samples=SamplesSpec(test_aligned=200, test_active_only=200)).build(ds, 0)


def test_without_held_out_people_the_layout_is_unchanged() -> None:
    """Same seeds, same numbers: a scenario that holds no test people out deals its rows as before."""
    ds = make_dataset(n=300, n_features=6)
    spec = ScenarioSpec(parties=(PartySpec(name="a", role="active", n_columns=2), PartySpec(name="p", share=1.0)),
                        samples=SamplesSpec(aligned=0.3))
    layout = spec.build(ds, seed=5)
    pool = np.random.default_rng(np.random.SeedSequence([5, 0x5CE]).spawn(3)[1]).permutation(300)
    assert set(layout.rows["p"].tolist()) == set(pool[:90].tolist())


def test_compare_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="second_hop"):
        CompareSettings(second_hop=(1.5,))
    with pytest.raises(ConfigError, match="test_fraction"):
        CompareSettings(test_fraction=0.6)


def test_a_compare_run_experiment_scores_the_held_out_people() -> None:
    settings = CompareSettings(aligned=(0.05,), repeats=2, methods=("local",))
    from vflo.data.datasets import load_dataset

    dataset = load_dataset("breast_cancer")
    cell = Cell("aligned", 0.05, "active_only", 1, "random")
    columns = column_split(dataset, "random", 1, 0.3, 4)
    methods, _ = applicable(settings, "binary", cell)
    result = run_experiment(parse_config(experiment_tables(BASE, settings, cell, columns, methods, 569)))
    assert [r["n_test"] for r in result.rows] == [57, 57] and [r["aligned"] for r in result.rows] == [23, 23]


def test_missing_partner_cells_run_whoever_can_score_there() -> None:
    settings = CompareSettings(p_miss=(0.1,), absent=(0.5,))
    cell = Cell("absent", 0.5, "missing", 4, "random")
    run, skipped = applicable(settings, "binary", cell)
    assert next(iter(run)) == "local" and run["splitnn"]["fallback"] == "local"
    assert run["plugvfl"] == {"name": "splitnn", "party_dropout": 0.5, "label": "plugvfl"}
    assert {"apc_vfl", "laser_vfl", "ablation", "vfedtrans"} <= set(run)
    assert "every partner holds" in skipped["rap"] and "second-hop" in skipped["vfl_asp"]
    # Without Local, SplitNN has no one to score the people a partner lacks.
    alone, why = applicable(CompareSettings(methods=("splitnn", "laser_vfl")), "binary", cell)
    assert set(alone) == {"plugvfl", "laser_vfl"}
    assert "lacks with local, which is not in this comparison" in why["splitnn"]
    layout = _layout(cell, settings, 1)
    test = layout.held_out("active")  # type: ignore[attr-defined]
    assert len(test) == 114
    holders = sum(np.isin(test, layout.ids(f"passive{i}")) for i in range(1, 5))  # type: ignore[attr-defined]
    assert (holders == 2).all()
    with pytest.raises(ConfigError, match="p_miss"):
        CompareSettings(p_miss=(1.0,))
    with pytest.raises(ConfigError, match="missing_variants"):
        CompareSettings(missing_variants={"x": {"party_dropout": 0.5}})


def test_a_comparison_with_partners_missing() -> None:
    tiny = {"train": FAST}
    raw = {**BASE, "compare": {
        "aligned": [0.5], "passives": [1], "splits": ["random"], "second_hop": [], "scored": ["aligned"],
        "p_miss": [], "absent": [0.5], "repeats": 1, "methods": ["local", "splitnn", "apc_vfl", "laser_vfl"],
        "settings": {"splitnn": tiny, "apc_vfl": tiny, "laser_vfl": tiny}}}
    result = compare(raw)
    rows = result.rows
    assert (rows["status"] == "ok").all(), rows[rows["status"] != "ok"][["method", "error"]]
    missing = rows[rows["scored"] == "missing"]
    assert set(missing["method"]) == {"local", "splitnn", "plugvfl", "apc_vfl", "laser_vfl"}
    assert set(missing["n_test"]) == {114}
    # Every test person lacks two of four partners: SplitNN's fallback scores them all.
    assert missing.set_index("method").loc["splitnn", "fallback_rows"] == 114
    from vflo.experiments.compare_report import render_html, render_markdown

    text = render_markdown(result, summary(result))
    page = render_html(result, summary(result))
    assert "share of the partners a test person lacks" in page and "id='plot-metric_missing'" in page
    assert "share of the partners a test person lacks" in text and "Missing-partner cells" in text
    assert any(line.startswith("LASER-VFL's claim") for line in claims(result))


def test_the_privacy_axis_runs_the_methods_that_protect_their_partners_within_the_budget() -> None:
    tiny = {"train": FAST}
    raw = {**BASE, "compare": {
        "aligned": [0.5], "passives": [1], "splits": ["random"], "second_hop": [], "scored": ["aligned"],
        "p_miss": [], "absent": [], "epsilons": [4.0], "repeats": 1,
        "methods": ["local", "splitnn", "apc_vfl", "fedsvd", "centralized"],
        "settings": {"splitnn": tiny, "apc_vfl": tiny}}}
    result = compare(raw)
    rows = result.rows
    private = rows[rows["axis"] == "epsilon"]
    assert set(private["method"]) == {"local", "splitnn", "apc_vfl"}
    assert (private["status"] == "ok").all(), private[private["status"] != "ok"][["method", "error"]]
    spent = {m: private[private["method"] == m].iloc[0]["epsilon_account_passive1"] for m in ("splitnn", "apc_vfl")}
    # APC-VFL spends what it plans; SplitNN's plan counts releases a person may get (training and validation each
    # epoch, and scoring) that none of these people got all of.
    assert 3.9 < spent["apc_vfl"] <= 4.0 and 0 < spent["splitnn"] <= 4.0
    assert all("passive1:" in scope for scope in private[private["method"] != "local"]["epsilon_scope"])
    assert "cannot protect what a passive party sends" in result.skipped["fedsvd (aligned)"]
    assert "pools every party's raw features" in result.skipped["centralized (aligned)"]
    from vflo.experiments.compare_report import render_markdown

    text = render_markdown(result, summary(result))
    assert "ε per person at each passive party, end to end" in text
    # The label holder randomises its labels at the same ε where a method sends what they shape (SplitNN).
    split = private[private["method"] == "splitnn"].iloc[0]
    assert split["epsilon_account_active"] == pytest.approx(4.0, rel=1e-3) and split["epsilon_labels"] == 4.0
    assert "epsilon_account_active" not in private or \
        private[private["method"] == "apc_vfl"]["epsilon_account_active"].isna().all()
    # The privacy cells and the base cell are attacked; other cells are not.
    base = rows[(rows["axis"] == "aligned") & (rows["value"].astype(str) == "0.5")]
    for part in (private, base):
        ran = part[part["method"].isin(["splitnn", "apc_vfl"])]
        assert ran["attack_r2"].notna().all() and ran["attack_leaks"].isin([0.0, 1.0]).all()
    unprotected = base[base["method"] == "splitnn"].iloc[0]
    assert unprotected["label_leaks"] == 1.0 and unprotected["label_auc"] > 0.9  # the gradients' direction
    assert private[private["method"] == "local"]["attack_leaks"].eq(0.0).all()  # it sends nothing
    assert "## Which method at each privacy level" in text and "At ε = 4 per party, scoring aligned people" in text
    assert "Without a budget (ε = ∞)" in text and "leaks labels" in text
    from vflo.experiments.compare_report import render_html

    assert "id='plot-privacy_aligned'" in render_html(result, summary(result))  # the privacy-utility plot
    # Entity Augmentation's guests protect what they send beside a label-only host; beside a host that walks
    # everyone, a guest's releases have no bound it can plan: skipped, saying so.
    why = cannot_run("entity_augmentation", "binary", Cell("epsilon", 4.0, "aligned", 1, "random"))
    assert isinstance(why, str) and "label-only host" in why
    with pytest.raises(ConfigError, match="compare.epsilons"):
        CompareSettings(epsilons=(0.0,))


def test_the_privacy_axis_runs_in_the_second_hop_layout_where_a_method_needs_a_second_hop() -> None:
    tiny = {"train": FAST}
    raw = {**BASE, "compare": {
        "aligned": [0.5], "passives": [1], "splits": ["random"], "second_hop": [1.0], "base_second_hop": 0.5,
        "scored": ["aligned"], "p_miss": [], "absent": [], "epsilons": [4.0], "repeats": 1,
        "methods": ["local", "vfl_asp"],
        "settings": {"vfl_asp": {**tiny, "student_train": FAST, "embedding_train": FAST}}}}
    settings = load_compare(raw)[1]
    plan = cells(settings)
    # The base second-hop share joins the second-hop axis (it is ε = ∞ for the second-hop ε cells).
    assert [c.value for c in plan if c.axis == "second_hop"] == [0.5, 1.0]
    assert [(c.value, c.layout) for c in plan if c.axis == "epsilon_hop"] == [(4.0, "second_hop")]
    result = compare(raw)
    rows = result.rows
    hop = rows[rows["axis"] == "epsilon_hop"]
    assert set(hop["method"]) == {"local", "vfl_asp"} and (hop["status"] == "ok").all()
    asp = hop[hop["method"] == "vfl_asp"].iloc[0]
    # Both hops protect their side within the budget, and the label holder randomises its labels at it.
    for party in ("passive1", "passive2", "active"):
        assert 0 < asp[f"epsilon_account_{party}"] <= 4.0 + 1e-6, party
    base = rows[(rows["axis"] == "second_hop") & (rows["value"].astype(str) == "0.5")]
    other = rows[(rows["axis"] == "second_hop") & (rows["value"].astype(str) == "1.0")]
    assert base[base["method"] == "vfl_asp"]["attack_r2"].notna().all()  # ε = ∞ of this layout: attacked
    assert "attack_r2" not in other or other["attack_r2"].isna().all()  # another second-hop cell: not
    found = privacy_cells(result)
    assert {(c.layout, c.epsilon, c.method) for c in found} == {
        ("second_hop", e, m) for e in ("∞", "4") for m in ("local", "vfl_asp")}
    # The star ε cell ran Local alone (VFL-ASP needs a second hop): nothing to read against it there.
    assert "needs a second-hop party" in result.skipped["vfl_asp (aligned)"]
    said = privacy_sentences(result, found)
    assert any(line.startswith("At ε = 4 per party, scoring aligned people with a second-hop party") for line in said)
    table = privacy_table(result, found)[1]
    assert {row[1] for row in table} == {"aligned (second hop)"}
    with pytest.raises(ConfigError, match="base_second_hop"):
        CompareSettings(base_second_hop=0.0)


def test_what_did_not_run_is_a_short_table_one_row_per_reason_and_cells() -> None:
    from vflo.experiments.compare_report import not_run

    hop = "the second-hop party shares none"
    skipped = {"ablation (aligned, second hop)": hop, "ablation (active_only, second hop)": hop,
               "apc_vfl (aligned, second hop)": hop, "apc_vfl (active_only, second hop)": hop,
               "fedsvd (aligned, second hop)": hop, "rap (active_only)": "scores together with its partners",
               "splitnn (active_only)": "scores together with its partners", "ldp": "no budget"}
    assert not_run(skipped) == [
        ["ldp", "every cell", "no budget"],
        ["rap, splitnn", "active_only", "scores together with its partners"],
        ["ablation, apc_vfl", "active_only, second hop; aligned, second hop", hop],
        ["fedsvd", "aligned, second hop", hop],
    ]
