"""A party's model folder keeps every training's part side by side; nothing it did not write is replaced or pruned."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from vflo.artifacts import MANIFEST, ArtifactError, PartStore, write_part
from vflo.errors import ConfigError
from vflo.shelf import ModelShelf, list_parts, prune


def _save(store: PartStore, model_id: str, value: float, label: str = "splitnn") -> None:
    store.save(label=label, method="splitnn", config="{}", model_id=model_id, state={"w": np.array([value])})


def test_two_trainings_live_side_by_side_and_each_loads_by_its_id(tmp_path: Path) -> None:
    shelf = ModelShelf(tmp_path, party="lab", role="passive")
    _save(shelf, "aaaa1111", 1.0)
    _save(shelf, "bbbb2222", 2.0)
    assert (tmp_path / "splitnn" / "aaaa1111" / "lab" / MANIFEST).is_file()
    assert float(np.asarray(shelf.load(label="splitnn", model_id="aaaa1111").state["w"])[0]) == 1.0
    assert float(np.asarray(shelf.load(label="splitnn", model_id="bbbb2222").state["w"])[0]) == 2.0
    with pytest.raises(ArtifactError, match=r"holds no part of 'splitnn' from training cccc.*it holds aaaa1111, "
                                            r"bbbb2222.*start the party with the folder it saved into"):
        shelf.load(label="splitnn", model_id="cccc3333")


def test_a_part_saved_in_the_flat_layout_before_is_still_read(tmp_path: Path) -> None:
    _save(PartStore(tmp_path, party="lab", role="passive"), "old00000", 3.0)
    shelf = ModelShelf(tmp_path, party="lab", role="passive")
    assert float(np.asarray(shelf.load(label="splitnn", model_id="old00000").state["w"])[0]) == 3.0
    with pytest.raises(ArtifactError, match="holds no part of 'splitnn' from training new"):
        shelf.load(label="splitnn", model_id="new00000")


def test_a_party_never_saves_over_a_folder_it_did_not_write(tmp_path: Path) -> None:
    hand_made = tmp_path / "splitnn" / "lab"
    hand_made.mkdir(parents=True)
    (hand_made / "notes.txt").write_text("mine")
    store = PartStore(tmp_path, party="lab", role="passive")
    with pytest.raises(ArtifactError, match=r"will not save its part over .*notes.txt.*which vflo did not write"):
        _save(store, "aaaa1111", 1.0)
    assert (hand_made / "notes.txt").read_text() == "mine"
    other = tmp_path / "rap" / "lab"
    write_part(other, party="hospital", role="active", method="rap", label="rap", config="{}", model_id="x1",
               state={"w": np.array([0.0])}, preprocessing=None)
    with pytest.raises(ArtifactError, match="it holds party 'hospital''s part"):
        _save(store, "aaaa1111", 1.0, label="rap")
    # its own earlier part there is replaced whole (a folder saved by one run: the same party, saving again)
    _save(store, "aaaa1111", 1.0, label="local")
    _save(store, "bbbb2222", 2.0, label="local")
    assert store.load(label="local", model_id="bbbb2222").manifest["model_id"] == "bbbb2222"


def test_models_list_and_prune_keep_the_newest_and_touch_nothing_foreign(tmp_path: Path) -> None:
    shelf = ModelShelf(tmp_path, party="lab", role="passive")
    for i, model_id in enumerate(("aaaa1111", "bbbb2222", "cccc3333")):
        _save(shelf, model_id, float(i))
        manifest = tmp_path / "splitnn" / model_id / "lab" / MANIFEST
        raw = json.loads(manifest.read_text())
        raw["created"] = f"2026-01-0{i + 1}T00:00:00+00:00"  # saved a day apart
        manifest.write_text(json.dumps(raw))
    _save(shelf, "dddd4444", 9.0, label="apc_vfl")
    entries = list_parts(tmp_path)
    assert [(e.label, e.model_id) for e in entries] == [("apc_vfl", "dddd4444"), ("splitnn", "aaaa1111"),
                                                        ("splitnn", "bbbb2222"), ("splitnn", "cccc3333")]
    assert [e.model_id for e in prune(tmp_path, keep=1, dry_run=True)] == ["aaaa1111", "bbbb2222"]
    assert len(list_parts(tmp_path)) == 4
    (tmp_path / "splitnn" / "aaaa1111" / "lab" / "mine.txt").write_text("kept")
    removed = prune(tmp_path, keep=1)
    assert [e.model_id for e in removed] == ["bbbb2222"]
    assert not (tmp_path / "splitnn" / "bbbb2222").exists()
    assert (tmp_path / "splitnn" / "aaaa1111" / "lab" / "mine.txt").read_text() == "kept"
    assert shelf.load(label="splitnn", model_id="cccc3333").manifest["model_id"] == "cccc3333"
    with pytest.raises(ConfigError, match="at least 1"):
        prune(tmp_path, keep=0)


def test_the_models_command_lists_and_prunes_a_partys_folder(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    from vflo.cli import main

    shelf = ModelShelf(tmp_path / "lab_models", party="lab", role="passive")
    for model_id in ("aaaa1111", "bbbb2222"):
        _save(shelf, model_id, 1.0)
        time.sleep(1.1)  # `created` is kept to the second
    config = tmp_path / "lab.toml"
    config.write_text('name = "lab"\nrole = "passive"\nlisten = "127.0.0.1:1"\nmodels = "lab_models"\n'
                      '[data]\nfile = "lab.csv"\nid_column = "id"\n[tls]\ninsecure = true\n'
                      '[peers.hospital]\naddress = "127.0.0.1:2"\nrole = "active"\n')
    assert main(["models", "list", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "aaaa1111" in out and "bbbb2222" in out
    assert main(["models", "prune", "--config", str(config), "--keep", "1"]) == 0
    assert "removed 1 part(s)" in capsys.readouterr().out
    assert [e.model_id for e in list_parts(tmp_path / "lab_models")] == ["bbbb2222"]
    assert main(["models", "list", str(tmp_path / "nowhere")]) == 2
    assert "does not exist" in capsys.readouterr().err
