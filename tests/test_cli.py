"""The command line: commands, outputs, exit codes; the README's commands and CI agree."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import REPO
from vflo.cli import main

TINY = """
name = "tiny"
seed = 1
[dataset]
name = "wine"
[scenario]
[[scenario.parties]]
name = "shop"
role = "active"
n_columns = 4
[[scenario.parties]]
name = "bank"
columns = "rest"
[scenario.samples]
active = 150
aligned = 80
[protocol]
name = "aligned_holdout"
test_rows = 20
repeats = 1
[[methods]]
name = "local"
[[methods]]
name = "splitnn"
train = { max_epochs = 2, patience = 0, batch_size = 32 }
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "exp.toml"
    path.write_text(text)
    return path


def test_run_prints_a_table_and_writes_results(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert main(["run", str(_write(tmp_path, TINY)), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "splitnn" in text and "accuracy" in text and "results written to" in text
    assert (out / "results.csv").exists() and (out / "report.md").exists()


def test_scenario_prints_columns_counts_and_overlap(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["scenario", str(_write(tmp_path, TINY))]) == 0
    text = capsys.readouterr().out
    assert "shop (active): 150 samples, 4 columns" in text and "overlap matrix" in text
    assert re.search(r"shop\s+150\s+80", text)


def test_listing_commands(capsys: pytest.CaptureFixture[str], data_dir: Path) -> None:
    assert main(["methods"]) == 0
    assert "splitnn" in capsys.readouterr().out
    assert main(["datasets", "--data-dir", str(data_dir)]) == 0
    text = capsys.readouterr().out
    assert "mimic3_los_standin" in text and "STAND-IN" in text and "credit_default" in text


@pytest.mark.parametrize(("text", "code", "message"), [
    (TINY.replace('name = "local"', 'name = "lokal"'), 2, "unknown method 'lokal' (did you mean 'local'?)"),
    (TINY.replace("repeats = 1", "repeat = 1"), 2, "unknown key 'protocol.repeat'"),
    (TINY.replace("aligned = 80", "aligned = 500"), 2, "asks for 500 rows but only 150 exist"),
    (TINY + "[oops\n", 2, "is not valid TOML"),
    (TINY.replace('name = "wine"', 'name = "credit_default"').replace("n_columns = 4", "n_columns = 5"), 3,
     "UCI_Credit_Card.csv.gz not found"),
])
def test_bad_input_exits_with_its_code_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, code: int, message: str,
) -> None:
    out = tmp_path / "out"
    args = ["run", str(_write(tmp_path, text)), "--out", str(out), "--data-dir", str(tmp_path / "nodata")]
    assert main(args) == code
    assert message in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("extra", [["--fresh"], ["--engine", "rr22"], ["--serve", "new.csv"]])
def test_align_stream_refuses_what_it_does_not_do_before_reading_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str],
) -> None:
    assert main(["align", str(tmp_path / "deploy.toml"), "--stream", *extra]) == 2
    assert "leave out --serve, --engine and --fresh" in capsys.readouterr().err


def test_help_documents_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "exit codes" in capsys.readouterr().out


def _readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    block = re.search(r"```(?:bash|sh)\n(.*?)```", text, re.S)
    assert block, "the README must start with a code block of commands"
    return [line for line in block.group(1).splitlines() if line.strip() and not line.startswith("#")]


def test_readme_starts_with_the_quickstart_and_the_test_command() -> None:
    commands = _readme_commands()
    assert len(commands) == 2
    assert "configs/quickstart.toml" in commands[0] and "pytest" in commands[1]


def test_ci_runs_the_readme_test_command() -> None:
    test_command = _readme_commands()[1]
    assert test_command in (REPO / ".ci" / "run").read_text()


def test_scenario_export_writes_loadable_party_configs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from vflo.deploy import load_deploy_config, load_party_config, load_party_data

    out = tmp_path / "demo"
    assert main(["scenario", str(_write(tmp_path, TINY)), "--export", str(out), "--extra-parties",
                 "server,dealer"]) == 0
    assert "vflo party serve bank.toml" in capsys.readouterr().out
    deploy = load_deploy_config(out / "deploy.toml")
    assert deploy.active.name == "shop" and {p.name for p in deploy.parties} == {"bank", "server", "dealer"}
    assert deploy.test_file is not None and Path(deploy.test_file).is_file()
    bank = load_party_config(out / "bank.toml")
    assert bank.role == "passive" and set(bank.peers) == {"shop", "server", "dealer"} and bank.data is not None
    tables = load_party_data("bank", bank.data)
    train, serve = tables.train, tables.serve
    assert train.n_features == 13 - 4 and serve is not None
    assert load_party_config(out / "server.toml").data is None
    assert (out / "certs" / "bank" / "bank.pem").is_file()


def test_listing_help_and_config_errors_do_not_import_torch(tmp_path: Path) -> None:
    """They answer in well under a second because PyTorch (and scikit-learn) load only when something trains."""
    import subprocess
    import sys

    bad = tmp_path / "bad.toml"
    bad.write_text('[dataset]\nname = "wine"\n[scenario]\n[[scenario.parties]]\nname = "a"\nrole = "active"\n'
                   'n_columns = 4\n[[scenario.parties]]\nname = "b"\ncolumns = "rest"\n[[methods]]\nname = "splitnn"\n'
                   "trian = {}\n")
    script = (
        "import sys\nfrom vflo.cli import main\n"
        f"assert main(['methods']) == 0\nassert main(['run', {str(bad)!r}]) == 2\n"
        "loaded = [m for m in ('torch', 'sklearn') if m in sys.modules]\nassert not loaded, loaded\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "unknown key 'methods.splitnn.trian' (did you mean 'train'?)" in done.stderr
