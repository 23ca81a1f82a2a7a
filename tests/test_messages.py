"""Messages a newcomer meets, each reproduced as the user meets it, naming the problem and the way out (issue 45,
item 8): where ``impute`` goes, a duplicate ID in ``vflo holdout``, the wrong config given to ``party serve``, a
wrong ``[tls] dir``, global flags after the command, a revoked key signed again, a partner gone mid-run, and
``vflo align --help``'s ``auto``."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from vflo.cli import build_parser, main
from vflo.errors import ConfigError, DataError, PartyBoundaryError, TransportError


def _files(folder: Path, *, seed: int = 0, gaps: bool = True, duplicate: bool = False) -> tuple[Path, Path]:
    """A hospital's file (labels, two columns) and a lab's (two columns, one with gaps), 60 shared people."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    ids = [f"P{i:03d}" for i in range(80)]
    hospital = pd.DataFrame({"pid": ids[:70], "age": rng.normal(50, 10, 70).round(1),
                             "bmi": rng.normal(25, 3, 70).round(1),
                             "outcome": rng.choice(["recovered", "readmitted"], 70)})
    lab = pd.DataFrame({"pid": ids[10:], "crp": rng.normal(size=70).round(3), "ldl": rng.normal(size=70).round(3)})
    if gaps:
        lab.loc[lab.index % 9 == 0, "crp"] = None
    if duplicate:
        lab = pd.concat([lab, lab.iloc[[4, 30]]], ignore_index=True)
    paths = folder / "hospital.csv", folder / "lab.csv"
    hospital.to_csv(paths[0], index=False)
    lab.to_csv(paths[1], index=False)
    return paths


def _deployment(tmp_path: Path, *, impute: bool = False, active_gaps: bool = False) -> tuple[Path, Path]:
    """The lab's own config (lab.toml, filling its gaps where ``impute``) and the hospital's deploy config
    (deploy.toml), over the files of :func:`_files` (the hospital's with gaps too where ``active_gaps``); TLS folders
    that do not exist yet."""
    hospital, _ = _files(tmp_path / "data")
    if active_gaps:
        frame = pd.read_csv(hospital)
        frame.loc[frame.index % 7 == 0, "bmi"] = None
        frame.to_csv(hospital, index=False)
    (tmp_path / "lab.toml").write_text(
        'name = "lab"\nlisten = "127.0.0.1:0"\n[data]\nfile = "data/lab.csv"\nid_column = "pid"\n'
        + ('impute = "median"\n' if impute else "")
        + '[tls]\ndir = "lab-tls"\n[peers]\nhospital = { address = "127.0.0.1:1", role = "active" }\n')
    (tmp_path / "deploy.toml").write_text(
        'test_file = "data/hospital.csv"\n[active]\nname = "hospital"\n[active.data]\nfile = "data/hospital.csv"\n'
        'id_column = "pid"\nlabel_column = "outcome"\n[active.tls]\ndir = "hospital-tls"\n'
        '[[parties]]\nname = "lab"\naddress = "127.0.0.1:1"\n')
    return tmp_path / "lab.toml", tmp_path / "deploy.toml"


def _experiment(path: Path, methods: str = '[[methods]]\nname = "local"\n', *, impute: bool = False) -> Path:
    """An experiment config over the files of :func:`_files` in ``path``'s folder."""
    path.write_text(
        'name = "own"\nseed = 0\n[scenario]\n[[scenario.parties]]\nname = "hospital"\nrole = "active"\n'
        'file = "data/hospital.csv"\nid_column = "pid"\nlabel_column = "outcome"\n'
        '[[scenario.parties]]\nname = "lab"\nfile = "data/lab.csv"\nid_column = "pid"\n'
        + ('impute = "median"\n' if impute else "") + methods)
    return path


# -- 1. where impute goes --------------------------------------------------------------------------------------


def test_blank_values_in_an_experiment_config_point_to_its_scenario_parties_entry(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    _files(tmp_path / "data")
    config = _experiment(tmp_path / "own.toml")
    assert main(["run", str(config), "--out", str(tmp_path / "out")]) == DataError.exit_code
    err = capsys.readouterr().err
    assert "party 'lab': column 'crp' has 8 missing values" in err
    assert "impute = 'mean'" in err and "[[scenario.parties]] entry of the experiment config" in err
    assert "[data]" not in err  # an experiment config has no such table


def test_blank_values_at_a_deployed_party_point_to_its_own_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    lab, deploy = _deployment(tmp_path, active_gaps=True)
    # The passive party: its own NAME.toml's [data] table.
    assert main(["party", "serve", str(lab), "--insecure"]) == DataError.exit_code
    err = capsys.readouterr().err
    assert "party 'lab': column 'crp' has 8 missing values" in err and "lab.csv" in err
    assert "impute = 'mean'" in err and "under [data] in the party's own config, NAME.toml" in err
    assert "[[scenario.parties]]" not in err
    # The active party: its table in deploy.toml.
    _experiment(tmp_path / "own.toml", impute=True)
    assert main(["run", str(tmp_path / "own.toml"), "--deploy", str(deploy), "--insecure",
                 "--out", str(tmp_path / "out")]) == DataError.exit_code
    err = capsys.readouterr().err
    assert "party 'hospital': column 'bmi' has 10 missing values" in err
    assert "under [active.data] in the active party's deploy config, deploy.toml" in err


def test_blank_values_read_through_the_api_point_to_the_call(tmp_path: Path) -> None:
    import vflo

    _, lab = _files(tmp_path)
    with pytest.raises(DataError, match=r"column 'crp' has 8 missing values.*impute = 'mean'.* in the call that "
                                        r"reads its table \(vflo.PartyData.from_file or from_frame\)"):
        vflo.PartyData.from_file(lab, party="lab", id_column="pid")


# -- 2. a duplicate ID in vflo holdout ---------------------------------------------------------------------------


def test_holdout_names_a_duplicate_id_and_its_file_with_the_data_exit_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    hospital, lab = _files(tmp_path / "in", gaps=False, duplicate=True)
    code = main(["holdout", str(hospital), str(lab), "--parties", "hospital,lab", "--id-column", "pid",
                 "--label-column", "outcome", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == DataError.exit_code == 3
    assert "duplicate sample IDs ['P014', 'P040'] (2 in all)" in err and str(lab) in err
    assert "drop or merge the duplicates" in err
    assert not (tmp_path / "out").exists()


# -- 3. the active party's deploy config given to party serve ------------------------------------------------------


def test_party_serve_given_the_deploy_config_says_which_config_it_takes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    lab, deploy = _deployment(tmp_path)
    assert main(["party", "serve", str(deploy)]) == ConfigError.exit_code
    err = capsys.readouterr().err
    assert "unknown key" not in err
    assert f"{deploy} is the active party's deploy config" in err
    assert f"`vflo run CONFIG --deploy {deploy}`" in err
    assert "`vflo party serve` (and `vflo flower party`) takes a passive party's own config, NAME.toml" in err
    # And the other way round: a party's own config given to --deploy.
    _experiment(tmp_path / "own.toml")
    assert main(["run", str(tmp_path / "own.toml"), "--deploy", str(lab)]) == ConfigError.exit_code
    err = capsys.readouterr().err
    assert f"{lab} is a party's own config (name = 'lab'): it is for `vflo party serve {lab}`" in err
    assert "`--deploy` takes the active party's deploy config" in err


# -- 4. a wrong [tls] dir -----------------------------------------------------------------------------------------


def _before_the_demo(err: str) -> None:
    """The real way (each party's own key, signed by the CA) is named, and ``certs init`` only as the demo."""
    for command in ("vflo certs request DIR --party lab", "vflo certs sign CA_DIR DIR/lab.csr", "vflo certs ca"):
        assert command in err, command
    assert err.count("certs init") == 1
    assert "Only for a demo on one machine: `vflo certs init" in err
    assert err.index("vflo certs request") < err.index("certs init")


def test_a_wrong_tls_dir_points_to_each_party_making_its_own_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    lab, _ = _deployment(tmp_path, impute=True)
    assert main(["party", "serve", str(lab)]) == ConfigError.exit_code
    err = capsys.readouterr().err
    assert f"TLS files ['{tmp_path}/lab-tls/ca.pem'" in err
    assert f"[tls] dir '{tmp_path}/lab-tls' does not exist" in err
    _before_the_demo(err)
    # The CA's folder given as the party's: said so.
    assert main(["certs", "ca", str(tmp_path / "ca"), "--parties", "hospital,lab"]) == 0
    lab.write_text(lab.read_text().replace('dir = "lab-tls"', 'dir = "ca"'))
    capsys.readouterr()
    assert main(["party", "serve", str(lab)]) == ConfigError.exit_code
    err = capsys.readouterr().err
    assert f"[tls] dir '{tmp_path}/ca' is the CA's folder (it holds ca.key" in err
    _before_the_demo(err)
    # A party's own key whose certificate has not come back: sign it.
    assert main(["certs", "request", str(tmp_path / "lab-tls"), "--party", "lab"]) == 0
    lab.write_text(lab.read_text().replace('dir = "ca"', 'dir = "lab-tls"'))
    capsys.readouterr()
    assert main(["party", "serve", str(lab)]) == ConfigError.exit_code
    err = capsys.readouterr().err
    assert f"holds lab.key, but not yet what the CA signs for it: sign its request at the CA (`vflo certs sign " \
           f"CA_DIR {tmp_path}/lab-tls/lab.csr`)" in err


def test_a_config_without_a_tls_dir_points_to_each_party_making_its_own_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    _, deploy = _deployment(tmp_path)
    deploy.write_text(deploy.read_text().replace('[active.tls]\ndir = "hospital-tls"\n', ""))
    _experiment(tmp_path / "own.toml", impute=True)
    assert main(["run", str(tmp_path / "own.toml"), "--deploy", str(deploy)]) == ConfigError.exit_code
    err = capsys.readouterr().err
    assert "party 'hospital': give [tls] dir, the folder with its ca.pem, hospital.pem and hospital.key" in err
    assert "vflo certs request DIR --party hospital" in err and "or insecure = true" in err
    assert err.count("certs init") == 1 and "Only for a demo on one machine: `vflo certs init" in err


# -- 5. global flags after the command ----------------------------------------------------------------------------


def _leaves(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    """Every (sub)command's parser, by the words that reach it (an alias once)."""
    out = [(path, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            seen: set[int] = set()
            for name, sub in action.choices.items():
                if id(sub) not in seen:
                    seen.add(id(sub))
                    out += _leaves(sub, (*path, name))
    return out


def test_verbose_and_quiet_work_after_the_command_as_the_readme_writes_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    # README's synopsis: vflo run CONFIG.toml [...] [-v]. A config error, so nothing runs: argparse would exit 2 too,
    # but by SystemExit, and with "unrecognized arguments".
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\n[dataset]\nname = "wine"\n[protcol]\n')
    assert main(["run", str(bad), "-v"]) == ConfigError.exit_code
    err = capsys.readouterr().err
    assert "unrecognized arguments" not in err and "unknown key 'protcol'" in err
    assert logging.getLogger().level == logging.INFO
    for argv, level in ((["run", str(bad), "-q"], logging.ERROR), (["-v", "run", str(bad), "-v"], logging.DEBUG),
                        (["-v", "run", str(bad)], logging.INFO), (["run", str(bad), "-v", "-q"], logging.WARNING),
                        (["run", str(bad)], logging.WARNING)):
        assert main(argv) == ConfigError.exit_code
        assert logging.getLogger().level == level, argv
    # Every (sub)command takes them after its name, and --threads too; the value given last wins.
    parser = build_parser()
    for path, sub in _leaves(parser):
        if not path:
            continue
        for flag in ("-v", "--verbose", "-q", "--quiet", "--threads"):
            assert flag in sub._option_string_actions, (path, flag)
    args = parser.parse_args(["--threads", "2", "certs", "-v", "sign", "CA", "REQ", "-vv", "--threads", "3", "-q"])
    from vflo.cli.common import merge_global_flags

    merged = merge_global_flags(args)
    assert (merged.verbose, merged.quiet, merged.threads) == (3, 1, 3)
    assert not [k for k in vars(merged) if "_after_" in k]


# -- 6. a revoked key signed again ---------------------------------------------------------------------------------


def test_a_revoked_key_is_refused_with_how_to_proceed_and_a_new_key_is_signed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    ca, lab = tmp_path / "ca", tmp_path / "lab-tls"
    assert main(["certs", "ca", str(ca), "--parties", "hospital,lab"]) == 0
    assert main(["certs", "request", str(lab), "--party", "lab"]) == 0
    assert main(["certs", "sign", str(ca), str(lab / "lab.csr")]) == 0
    assert main(["certs", "revoke", str(ca), "lab"]) == 0
    assert "lab makes a new key (`vflo certs request NEW_DIR --party lab`)" in capsys.readouterr().out
    assert main(["certs", "sign", str(ca), str(lab / "lab.csr")]) == ConfigError.exit_code
    err = capsys.readouterr().err
    assert "asks for a certificate for a key the CA revoked" in err and "a revoked key stays revoked" in err
    assert "Make a new key and request at the party (`vflo certs request DIR --party lab` into a new folder)" in err
    # The way out it names: a new key, in a new folder, for the same party (its certificate was revoked, not its
    # name).
    assert main(["certs", "request", str(tmp_path / "lab-tls2"), "--party", "lab"]) == 0
    assert main(["certs", "sign", str(ca), str(tmp_path / "lab-tls2" / "lab.csr")]) == 0


def test_a_revoked_key_is_refused_where_the_cas_record_predates_key_fingerprints(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    from vflo.comm.pki import create_ca, issued, make_request, revoke, sign_request

    ca = tmp_path / "ca"
    create_ca(ca, ["hospital", "lab"])
    _, csr = make_request(tmp_path / "lab-tls", "lab")
    sign_request(ca, csr)
    revoke(ca, "lab")
    records = issued(ca)
    for r in records:
        del r["key"]  # as a CA folder from before vflo recorded keys keeps them
    (ca / "issued.json").write_text(json.dumps(records))
    # Signed again in the party's folder, beside the revoked certificate: that certificate's key is the request's.
    with pytest.raises(ConfigError, match=r"a key the CA revoked .*Make a new key"):
        sign_request(ca, csr)
    # Elsewhere the CA cannot tell: it says so.
    with caplog.at_level(logging.WARNING, logger="vflo.comm.pki"):
        sign_request(ca, csr, out=tmp_path / "elsewhere")
    assert "keeps no key" in caplog.text and "Sign only a request made with a new key" in caplog.text


# -- 7. a partner gone mid-run -------------------------------------------------------------------------------------


class _GoneDeployment:
    """Stands in for vflo.deploy.Deployment: a partner answers nothing from the first training call on, with the
    error vflo's gRPC transport raises then (or ``error``)."""

    error: Exception = TransportError("party 'lab' at 127.0.0.1:50161 could not be reached for 'splitnn.forward': "
                                      "nothing listens there (gRPC: UNAVAILABLE: connection refused)")

    def __init__(self, deploy: Any, **_: Any) -> None:
        from vflo.data.partydata import PartyData
        from vflo.roles import PartyInfo

        self.data_parties = (PartyInfo("hospital", "active"), PartyInfo("lab", "passive"))

        rng = np.random.default_rng(0)
        self.deploy = deploy
        self.train = PartyData(party="hospital", ids=np.arange(40).astype(str), X=rng.normal(size=(40, 2)),
                               columns=("a", "b"), y=np.arange(40) % 2)
        self.test = self.train
        self.task, self.preprocessing, self.parties = "binary", None, deploy.party_infos

    def preflight(self, *_: Any, **__: Any) -> None:
        pass

    def run(self, *_: Any, **__: Any) -> Any:
        raise self.error

    def close(self) -> None:
        pass


SPLITNN = '[[methods]]\nname = "splitnn"\ntrain = { max_epochs = 20, checkpoint_every = 5 }\n'


def test_a_partner_gone_mid_run_says_how_to_resume(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    import vflo.deploy

    _, deploy = _deployment(tmp_path)
    config = _experiment(tmp_path / "own.toml", SPLITNN)
    monkeypatch.setattr(vflo.deploy, "Deployment", _GoneDeployment)
    run = ["run", str(config), "--deploy", str(deploy), "--insecure", "--out", str(tmp_path / "out")]
    # Checkpoints on: resume, with the same command and --resume.
    assert main([*run, "--checkpoints", str(tmp_path / "ck")]) == TransportError.exit_code
    err = capsys.readouterr().err
    assert "party 'lab' at 127.0.0.1:50161 could not be reached" in err
    assert (f"once every party is serving again, resume from the last checkpoint every party holds (the same model "
            f"as a run never stopped): vflo run {config} --deploy {deploy} --insecure --out {tmp_path / 'out'} "
            f"--checkpoints {tmp_path / 'ck'} --resume") in err
    row = json.loads((tmp_path / "out" / "results.json").read_text())["failures"][0]
    assert row["error"].endswith(f"--checkpoints {tmp_path / 'ck'} --resume")
    # No --checkpoints: it cannot be resumed, and it says how to make it resumable.
    assert main([*run, "--overwrite"]) == TransportError.exit_code
    err = capsys.readouterr().err
    assert "this run kept no checkpoints, so it cannot be resumed" in err and "--resume" in err
    assert "add --checkpoints DIR" in err and "set checkpoint_every" not in err
    # Neither checkpoint_every nor --checkpoints: both named.
    _experiment(config, '[[methods]]\nname = "splitnn"\ntrain = { max_epochs = 20 }\n')
    assert main([*run, "--overwrite"]) == TransportError.exit_code
    err = capsys.readouterr().err
    assert "set checkpoint_every = N in splitnn's train table" in err and "add --checkpoints DIR" in err


def test_a_partner_refused_for_its_certificate_gets_no_resume_advice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    import vflo.deploy

    _, deploy = _deployment(tmp_path)
    config = _experiment(tmp_path / "own.toml", SPLITNN)
    refused = TransportError("party 'lab' at 127.0.0.1:50161 is refused: its certificate was revoked")
    refused.__cause__ = PartyBoundaryError("its certificate was revoked by the federation's CA")
    monkeypatch.setattr(_GoneDeployment, "error", refused)
    monkeypatch.setattr(vflo.deploy, "Deployment", _GoneDeployment)
    assert main(["run", str(config), "--deploy", str(deploy), "--insecure", "--out", str(tmp_path / "out"),
                 "--checkpoints", str(tmp_path / "ck")]) == TransportError.exit_code
    err = capsys.readouterr().err
    assert "is refused" in err and "--resume" not in err and "serving again" not in err


# -- 8. vflo align --help's auto ----------------------------------------------------------------------------------


def test_align_help_states_the_threshold_auto_uses(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    from vflo.align import engines

    def shown() -> str:
        with pytest.raises(SystemExit) as done:
            main(["align", "--help"])
        assert done.value.code == 0
        return " ".join(capsys.readouterr().out.split())

    assert f"at least {engines.AUTO_LIBRARY_FROM:,} IDs" in shown()
    monkeypatch.setattr(engines, "AUTO_LIBRARY_FROM", 12_345)  # the constant's value, not a copy of it
    text = shown()
    assert "the PSI library's RR22 where the active party asks about at least 12,345 IDs" in text
    assert "vflo's own ECDH otherwise" in text
