"""A party's helper processes import nothing from the folder the party runs in, nor from PYTHONPATH, and run only
the calls vflo's modules register where they define them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from vflo.align import psi
from vflo.helpers import Helper, HelperError, call, isolated_command, registration

PLANT = """import pathlib
pathlib.Path({marker!r}).write_text("ran")
raise SystemExit("a planted module ran")
"""


@pytest.fixture()
def planted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working folder and a PYTHONPATH folder, each with a ``pickle.py`` and an ``operator.py`` that leave a
    mark when imported; the test runs from the first."""
    marker = tmp_path / "marker"
    for folder in (tmp_path / "work", tmp_path / "path"):
        folder.mkdir()
        for name in ("pickle", "operator", "vflo_planted"):
            (folder / f"{name}.py").write_text(PLANT.format(marker=str(marker)))
    monkeypatch.chdir(tmp_path / "work")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "path"))
    return marker


def test_a_helper_runs_its_call_without_running_a_planted_module(planted: Path) -> None:
    helper = Helper()
    try:
        # A stateless call that unpickles its arguments and pickles its result in the helper.
        assert helper.call(psi.hash_blind_chunk, bytes(range(1, 33)), b"salt", ["a", "b"]) is not None
    finally:
        helper.close()
    assert not planted.exists(), "a module planted in the working folder or on PYTHONPATH ran in a helper"


def test_the_isolated_command_puts_neither_the_folder_nor_pythonpath_on_the_path(planted: Path) -> None:
    import subprocess

    code = "import json, sys; print(json.dumps(sys.path)); print(sys.flags.isolated)"
    out = subprocess.run(isolated_command(code), capture_output=True, text=True, check=True, timeout=60,
                         env=dict(os.environ)).stdout.splitlines()
    path = json.loads(out[0])
    assert out[1] == "1"
    assert str(Path.cwd()) not in path and "" not in path
    assert not any(p.endswith("path") and Path(p, "vflo_planted.py").exists() for p in path)
    assert not planted.exists()


def test_the_psi_librarys_child_imports_nothing_planted(planted: Path, tmp_path: Path) -> None:
    from vflo.align import spu

    if spu.missing():
        pytest.skip(spu.missing())
    side = tmp_path / "side"
    side.mkdir(mode=0o700)
    for name in ("json", "threading"):  # what the child imports first
        (Path(os.environ["PYTHONPATH"]) / f"{name}.py").write_text(PLANT.format(marker=str(planted)))
    child = spu.start_child(side, side / "library.log")
    assert child.stdin is not None
    child.stdin.close()  # no order: it loads the library and leaves
    assert child.wait(timeout=60) == 0, (side / "library.log").read_text()
    assert not planted.exists()


def test_a_helper_refuses_what_no_module_registered_and_runs_nothing_of_it(tmp_path: Path) -> None:
    made = tmp_path / "made-by-an-unregistered-call"
    helper = Helper()
    try:
        # A vflo function that exists but is no helper call: its module is imported, the function refused.
        with pytest.raises(HelperError, match="vflo.private registers no helper call named 'private_folder'"):
            helper.call(("vflo.private", "private_folder"), made)
        # A registered name asked of a module that did not register it.
        with pytest.raises(HelperError, match="vflo.private registers no helper call named 'psi.blind'"):
            helper.call(("vflo.private", "psi.blind"), psi.new_key(), bytes(32))
        # Outside vflo: never imported.
        with pytest.raises(HelperError, match="vflo's registered calls only"):
            helper.call(("os", "system"), f"touch {made}")
        # The helper still serves its registered calls.
        points = bytes(range(1, 33))
        assert helper.call(psi.blind_chunk, psi.new_key(), points) is not None
    finally:
        helper.close()
    assert not made.exists()


def test_an_unregistered_function_is_refused_before_it_is_sent_and_a_name_is_registered_once() -> None:
    def not_a_call(x: int) -> int:
        return x

    helper = Helper()
    try:
        with pytest.raises(HelperError, match="not a helper call: register it with @vflo.helpers.call"):
            helper.call(not_a_call, 1)
    finally:
        helper.close()
    assert registration(psi.blind_chunk).target == ("vflo.align.psi", "psi.blind")
    with pytest.raises(HelperError, match="'psi.blind' is registered by vflo.align.psi.blind_chunk and again"):
        call("psi.blind")(not_a_call)
