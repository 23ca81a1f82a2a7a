"""A party's own side of a method comes from its own config: a coordinator proposes, the party decides (issue 24).

Tried as the issue's malicious coordinator: it proposes the passive party's bottom network, encoder, activation
and learning rate (a linear layer as wide as the features, lr 1e-30) so that what the party sends inverts to its
rows. The party runs its own settings instead, says which, and refuses where a shared setting or something the
others rely on differs from its own."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import own_sections
from tests.test_methods import data_for, quick
from vflo import schema
from vflo.audit import settings_markdown
from vflo.comm.message import Message, Table
from vflo.deploy import PartyConfig, export_federation, load_party_config, own_settings_toml
from vflo.errors import ConfigError, RemoteError
from vflo.federation.session import Session
from vflo.federation.simulation import build_federation, run_method
from vflo.methods.base import Method
from vflo.methods.own_settings import check_section, decide, party_section
from vflo.methods.registry import get_method, method_names
from vflo.party.node import parties_payload
from vflo.party.policy import PolicyError

SPLITNN_ATTACK = {"passive_bottom": [100], "activation": "leaky_relu", "train": {"lr": 1e-30}}


def proposal(name: str, **changes: object) -> dict[str, Any]:
    config = get_method(name)().config_table()
    for path, value in changes.items():
        node = config
        *parents, last = path.split("__")
        for key in parents:
            node = node[key]
        node[last] = value
    return config


def test_a_proposal_cannot_choose_a_passive_partys_bottom_network() -> None:
    cls = get_method("splitnn")
    method, differs = decide(cls, proposal("splitnn", passive_bottom=[100], activation="leaky_relu", train__lr=1e-30),
                             None, role="passive", party="lab")
    config = method.config  # type: ignore[attr-defined]
    assert (config.passive_bottom, config.activation, config.train.lr) == ((64, 64), "relu", 1e-3)
    assert differs == {"passive_bottom": [64, 64], "activation": "relu", "train.lr": 0.001}
    # What is not the party's to decide (the active party's top network, the joint loop) stays as proposed.
    method, _ = decide(cls, proposal("splitnn", top=[7], train__max_epochs=3), None, role="passive", party="lab")
    assert (method.config.top, method.config.train.max_epochs) == ((7,), 3)  # type: ignore[attr-defined]
    # The party's own config wins over both the proposal and the defaults.
    method, differs = decide(cls, proposal("splitnn", passive_bottom=[100]), {"passive_bottom": [32, 16]},
                             role="passive", party="lab")
    assert method.config.passive_bottom == (32, 16) and differs == {"passive_bottom": [32, 16]}  # type: ignore
    # The active party runs what it proposes: the proposal is its own config.
    method, differs = decide(cls, proposal("splitnn", passive_bottom=[100]), None, role="active", party="hospital")
    assert method.config.passive_bottom == (100,) and differs == {}  # type: ignore[attr-defined]


def test_a_shared_setting_the_party_sets_must_be_proposed_as_it_is_else_the_proposal_is_taken() -> None:
    cls = get_method("splitnn")
    noise = {"noise_multiplier": 1.0, "clip": 1.0}
    with pytest.raises(PolicyError, match=r"party 'lab' runs splitnn only with activation_noise = \{.*\} .*but the "
                                          r"coordinator proposes null: refused"):
        decide(cls, proposal("splitnn"), {"activation_noise": noise}, role="passive", party="lab")
    method, _ = decide(cls, proposal("splitnn", activation_noise=noise), {"activation_noise": noise},
                       role="passive", party="lab")
    assert method.config.activation_noise is not None  # type: ignore[attr-defined]
    # Unset at the party: the proposal's noise runs (it only adds protection; the reported ε is of what ran).
    method, differs = decide(cls, proposal("splitnn", activation_noise=noise), None, role="passive", party="lab")
    assert method.config.activation_noise.noise_multiplier == 1.0 and differs == {}  # type: ignore[attr-defined]
    # A guest that keeps its IDs blinded refuses a run that would send them in the clear.
    with pytest.raises(PolicyError, match=r"ids = \"blinded\".*proposes \"clear\""):
        decide(get_method("entity_augmentation"), proposal("entity_augmentation"), {"ids": "blinded"},
               role="passive", party="g1")


def test_what_the_others_rely_on_must_agree_naming_both() -> None:
    """APC-VFL: the issue's latent as wide as the features (25) with lr 1e-30. The encoder and its training are
    the party's; the latent's width is what the active party relies on, so a proposal that differs is refused."""
    cls = get_method("apc_vfl")
    with pytest.raises(PolicyError, match=r"party 'lab''s own apc_vfl settings give the latent width "
                                          r"\(passive_encoder's last\) = 256, but the coordinator's proposal needs 25"):
        decide(cls, proposal("apc_vfl", passive_encoder=[25], train__lr=1e-30), None, role="passive", party="lab")
    method, differs = decide(cls, proposal("apc_vfl", passive_encoder=[256], train__lr=1e-30), None,
                             role="passive", party="lab")
    assert method.config.passive_encoder == (128, 256) and method.config.train.lr == 1e-3  # type: ignore
    assert set(differs) == {"passive_encoder", "train"}


def test_a_partys_config_may_set_only_its_own_side() -> None:
    base = {"name": "lab", "role": "passive", "data": {"file": "x.csv", "id_column": "id"}}
    own = {"splitnn": {"passive_bottom": [32], "train": {"lr": 0.01}}}
    config = schema.build(PartyConfig, {**base, "methods": own})
    assert config.methods["splitnn"]["train"] == {"lr": 0.01}
    for methods, error in [({"splitnn": {"top": [3]}}, r"methods.splitnn.top: a passive party does not decide"),
                           ({"splitnn": {"train": {"max_epochs": 3}}}, r"methods.splitnn.train.max_epochs"),
                           ({"nope": {}}, r"unknown method 'nope'"),
                           ({"splitnn": {"passive_bottom": "x"}}, r"passive_bottom must be a list of int"),
                           ({"apc_vfl": {"train": {"lr": -1}}}, r"train.lr must be positive")]:
        with pytest.raises(ConfigError, match=error):
            schema.build(PartyConfig, {**base, "methods": methods})
    with pytest.raises(ConfigError, match=r"an active party does not decide"):
        check_section(get_method("splitnn"), "active", {"passive_bottom": [3]}, where="methods.splitnn")


def adversarial(name: str, honest: Method, n_features: int) -> Method:
    """``honest`` with every setting a passive party decides replaced by what the issue's attacker picked: a
    layer as wide as the features, no nonlinearity to speak of, no learning, no condition bound."""
    config = json.loads(honest.config_json())
    for path in type(honest).own_settings["passive"]:
        *parents, last = path.split(".")
        node = config
        for key in parents:
            node = node[key]
        node[last] = _attack_value(last, node[last], n_features)
        if last == "passive_bottom" and honest.agreed("passive"):  # the cut width is agreed: a layer before it
            node[last] = [n_features, json.loads(honest.config_json())["passive_bottom"][-1]]
    return type(honest).from_config_json(json.dumps(config))


def _attack_value(setting: str, value: Any, width: int) -> Any:
    choices: dict[str, Any] = {
        "passive_bottom": [width], "embedding_encoder": [width], "guest": [f"linear {width}"],
        "passive_encoder": [value[-1]] if isinstance(value, list) else value,  # the latent's width is agreed
        "activation": "leaky_relu", "embedding_activation": "leaky_relu", "lr": 1e-30,
        "max_condition": float("inf"), "one_feature_pseudo": False, "embedding_weight": 0.0, "reduction": "mean",
        "overcomplete": False, "unseen": "other", "weight_decay": 0.0, "guest_layers": {},
        "lr_schedule": "cosine", "lr_final": 0.0,  # a partner's rate annealed to nothing
        "n_bins": 126, "workers": 64,  # a passive asked to start 63 helper processes
        "dp_sgd": None, "activation_noise": None, "embedding_dp_sgd": None}  # trained and released without privacy
    if setting in ("train", "embedding_train"):
        return {**value, "lr": 1e-30}
    if setting in choices:
        return choices[setting]
    # A setting of a method this list does not know: the adversary's generic pick, as much as it can ask for.
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return width
    if isinstance(value, float):
        return 0.0 if value else 1.0
    raise AssertionError(f"say what an adversary proposes for {setting!r} = {value!r} in _attack_value")


@pytest.mark.parametrize("name", [m for m in method_names() if get_method(m).own_settings])
def test_a_coordinator_that_proposes_other_settings_changes_nothing_at_the_parties(name: str) -> None:
    """In process: the parties' own sections come from the honest config, the coordinator proposes the
    adversary's own-side values; every passive node runs its own and says it did."""
    data = data_for(name)
    honest = quick(name)
    cls = type(honest)
    attack = adversarial(name, honest, data.train[data.parties[1].name].n_features)
    assert party_section(cls, "passive", attack.config_json()) != party_section(cls, "passive", honest.config_json())
    fed, nodes = build_federation(data, attack, seed=1, party_config=honest)
    session = Session(fed)
    session.start(attack)
    for party in fed.names("passive"):
        ran = nodes[party].method.config_json()  # type: ignore[union-attr]
        assert party_section(cls, "passive", ran) == party_section(cls, "passive", honest.config_json())
        assert session.party_settings[party]  # each said what it ran instead
    session.teardown()


def test_a_setup_over_the_wire_runs_the_partys_own_and_says_so() -> None:
    data = data_for("splitnn")
    method = quick("splitnn")
    fed, nodes = build_federation(data, method, seed=0)
    nodes["pas"].settings = {"splitnn": {"passive_bottom": [16]}}
    setup = {"method": "splitnn", "config": Table(proposal("splitnn", **{"passive_bottom": [100], "train__lr": 1e-30})),
             "seed": 0, **parties_payload(fed.parties), "save": False}
    reply = fed.transport.request(Message(sender="act", receiver="pas", kind="control.setup", round=0,
                                          payload=setup, run="r1"))
    assert reply.error is None
    assert dict(reply.payload["own"]) == {"passive_bottom": [16], "train.lr": 0.001}  # type: ignore[arg-type]  # a Table
    # The width the active party's top network will see is the party's own.
    ids = data.train["pas"].ids[:8]
    init = fed.transport.request(Message(sender="act", receiver="pas", kind="splitnn.init", round=1,
                                         payload={"train_ids": ids[2:], "val_ids": ids[:2]}, run="r1"))
    assert init.payload["width"] == 16


def test_a_saved_part_is_loaded_with_the_settings_it_was_trained_with(tmp_path: Path) -> None:
    """The lab trained with its own bottom network (not the proposal's); the model card holds the proposal, the
    lab's part its own settings: loading puts the two together and scores as the trained model did."""
    import vflo
    from tests.test_artifacts import raw_rows

    data = data_for("splitnn")
    proposed = get_method("splitnn")(passive_bottom=[100], train={"max_epochs": 2, "batch_size": 64})
    own = get_method("splitnn")(passive_bottom=[16], train={"max_epochs": 2, "batch_size": 64})
    out = run_method(proposed, data, seed=0, save=(tmp_path, "m"), party_config=own)
    assert out.party_settings == {"pas": {"passive_bottom": [16]}}  # what the results record of the lab's run
    scores = vflo.load(tmp_path, "m").predict(raw_rows(data))
    assert np.allclose(scores, out.scores)


def test_an_export_writes_each_partys_own_side_and_a_party_serves_it(tmp_path: Path) -> None:
    data = data_for("splitnn")
    proposals = [get_method("splitnn")(passive_bottom=[16, 8], train={"lr": 0.01, "max_epochs": 3}),
                 get_method("apc_vfl")(train={"max_epochs": 2}), get_method("splitnn")(passive_bottom=[4])]
    written = export_federation(data, tmp_path, tls=False, methods=["splitnn", "apc_vfl"], proposals=proposals)
    text = written["pas"].read_text()
    assert "another splitnn entry of the experiment sets this party's side otherwise" in text
    sections = tomllib.loads(text)["methods"]
    assert sections["splitnn"] == {"passive_bottom": [16, 8], "activation": "relu",
                                   "train": {"lr": 0.01, "weight_decay": 0.0, "lr_schedule": "constant",
                                             "lr_final": 0.1}, "payload_dtype": "float32"}
    assert sections["apc_vfl"]["train"]["max_epochs"] == 2
    config = load_party_config(written["pas"])
    assert config.methods == sections
    assert own_settings_toml([], "passive") == []
    assert own_sections(proposals)["splitnn"]["passive_bottom"] == [16, 8]


def test_the_security_page_lists_what_a_party_decides() -> None:
    page = (Path(__file__).resolve().parents[1] / "docs" / "security.md").read_text()
    assert settings_markdown() in page, "regenerate the table: python -c 'from vflo.audit import " \
                                        "settings_markdown; print(settings_markdown())'"


def test_a_refusal_reaches_the_coordinator_naming_both() -> None:
    data = data_for("apc_vfl")
    method = get_method("apc_vfl")(passive_encoder=[4], train={"max_epochs": 1})
    fed, nodes = build_federation(data, method, seed=0)
    nodes["pas"].settings = {}
    with pytest.raises(RemoteError, match=r"gives? the latent width .* = 256, but the coordinator's proposal needs 4"):
        Session(fed).start(method)


def test_the_report_says_which_values_ran_at_which_party() -> None:
    from vflo.experiments.report import own_settings_section

    rows = [{"status": "ok", "method": "splitnn", "party_settings": json.dumps({"lab": {"passive_bottom": [8]}})},
            {"status": "ok", "method": "splitnn", "party_settings": json.dumps({"lab": {"passive_bottom": [8]}})},
            {"status": "ok", "method": "local"}]
    section = "\n".join(own_settings_section(rows))
    assert "## Settings a party ran as its own" in section
    assert section.count('| splitnn | lab | `{"passive_bottom": [8]}` |') == 1
    assert own_settings_section(rows[2:]) == []
