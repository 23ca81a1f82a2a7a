"""A simulated split written out as a deployment: each party's files, PARTY.toml with its own settings, keys kept
apart."""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import tomli_w

from vflo.comm.tls import CA_FOLDER
from vflo.data.partydata import PartyData
from vflo.dp import DEFAULT_BUDGET
from vflo.errors import ConfigError
from vflo.private import private_folder
from vflo.roles import Role

logger = logging.getLogger(__name__)


def toml_document(table: Mapping[str, Any], *, comments: Sequence[str] = ()) -> str:
    """A TOML file: ``comments`` (a line each), then ``table`` as tomli-w writes it (every string escaped, nested
    tables as sections)."""
    return "".join(f"# {line}\n" for line in comments) + tomli_w.dumps(dict(table))


def own_settings(proposals: Sequence[Any], role: Role) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """A party's own side of each of the experiment's ``proposals`` (methods with their configs) as the
    experiment sets it: ``[methods.NAME]`` tables (the first entry of a method where several differ), and a note
    for each entry left out."""
    from vflo.methods.own_settings import party_section

    sections: dict[str, dict[str, Any]] = {}
    notes: list[str] = []
    for method in proposals:
        section = party_section(type(method), role, method.config_json())
        if method.name in sections:
            if sections[method.name] != section:
                notes.append(f"another {method.name} entry of the experiment sets this party's side otherwise: "
                             f"{json.dumps(section)}; a party runs one, the one below")
            continue
        sections[method.name] = section
    return {name: section for name, section in sections.items() if section}, notes


OWN_SIDE = "This party's own side of each method: whatever a coordinator proposes, these run here."


def own_settings_toml(proposals: Sequence[Any], role: Role) -> list[str]:
    """:func:`own_settings` as lines of a PARTY.toml (none where the party has no side of its own to set)."""
    sections, notes = own_settings(proposals, role)
    if not sections:
        return []
    return [*(f"# {line}" for line in (OWN_SIDE, *notes)), *tomli_w.dumps({"methods": sections}).splitlines(), ""]


def export_federation(
    data: Any, directory: Path, *, base_port: int = 50051, extra_roles: dict[str, Role] | None = None,
    tls: bool = True, host: str = "127.0.0.1", methods: Sequence[str] = (), proposals: Sequence[Any] = (),
    seeds: Mapping[str, int] | None = None, addresses: Mapping[str, str] | None = None, overwrite: bool = False,
) -> dict[str, Path]:
    """Write what each party of a simulated split would bring to a real deployment.

    For every data party: ``NAME_train.csv`` (and ``NAME_serve.csv`` with the rows to score); for the
    active party also ``NAME_test.csv`` with the test labels; ``NAME.toml`` for ``vflo party serve``
    (every party but the active one), each listing its peers with their roles and, under ``[policy]``, the
    ``methods`` it agrees to run and, under ``[methods.NAME]``, its own side of each of the experiment's
    ``proposals`` (methods with their configs) as the experiment sets it; ``deploy.toml`` for the active party;
    and, with ``tls``, the keys kept apart:
    ``certs/NAME/`` holds party NAME's ``ca.pem``, ``NAME.pem`` and ``NAME.key`` and nothing else (its config's
    ``[tls] dir``); the CA's certificate and key, with a README, go to a folder beside ``directory``, never inside
    it (:func:`ca_folder`: it belongs offline, never on a party's host). Data is written already standardised, so
    parties do not rescale it. Every party's config carries a privacy budget (:data:`vflo.dp.DEFAULT_BUDGET`), and
    everything is written for its owner only (files 0600, folders 0700).

    ``seeds``: each party's own seed (``seed = ...`` in its config), as the in-process run draws its secrets
    (:func:`vflo.federation.simulation.simulated_seeds`), so the deployment trains to the same numbers; none:
    each party draws from the operating system. ``addresses``: each party's listening address (default ``host``
    at ``base_port`` onwards). Nothing that is already there is replaced unless this export wrote it and it is
    unchanged, and then only with ``overwrite`` (:func:`vflo.deploy.published.publish`); a refused export writes
    nothing.
    """
    from vflo.data.layout import FederatedData
    from vflo.deploy.published import check, publish

    assert isinstance(data, FederatedData)
    if tls:
        _refuse_loose_keys(directory)
    roles: dict[str, Role] = {p.name: p.role for p in data.parties} | (extra_roles or {})
    ports = {name: f"{host}:{base_port + i}" for i, name in enumerate(roles)}
    addresses = {**ports, **(addresses or {})}
    private_folder(directory.resolve().parent)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.resolve().name}.", suffix=".export",
                                    dir=directory.resolve().parent))
    try:
        written = _write(data, staging, roles=roles, addresses=addresses, tls=tls, methods=methods,
                         proposals=proposals, seeds=seeds or {})
        if tls:
            # Both folders are checked before either is written: a refusal leaves everything as it was.
            check(staging, directory, overwrite=overwrite, command=COMMAND, leave=f"certs/{CA_FOLDER}")
            check(staging / "certs" / CA_FOLDER, ca_folder(directory), overwrite=overwrite, command=COMMAND)
            # The CA signs for any party: it leaves the folder the parties' configs and keys are handed out from.
            publish(staging / "certs" / CA_FOLDER, ca_folder(directory), overwrite=overwrite,
                    command=COMMAND)
            shutil.rmtree(staging / "certs" / CA_FOLDER)
        publish(staging, directory, overwrite=overwrite, command=COMMAND)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return {name: directory / path.name for name, path in written.items()}


def _refuse_loose_keys(directory: Path) -> None:
    """A CA key, or a key outside its party's own folder, in the folder handed out to parties: an export next to
    it would hand it out with the rest, so it refuses until the key is moved (never deleting it: it is not the
    export's to delete)."""
    if not directory.is_dir():
        return
    loose = sorted({*directory.rglob("ca.key"), *directory.glob("*.key"), *(directory / "certs").glob("*.key")},
                   key=lambda p: (p.name != "ca.key", p))
    if loose:
        raise ConfigError(f"{loose[0]} lies in {directory}, the folder whose files are handed to the parties (an "
                          "export before keys were kept apart, or a `vflo certs init` without --split, left it "
                          "there): move it out (a CA's key offline: it signs for any party), then export again")


def _write(data: Any, directory: Path, *, roles: Mapping[str, Role], addresses: Mapping[str, str], tls: bool,
           methods: Sequence[str], proposals: Sequence[Any], seeds: Mapping[str, int]) -> dict[str, Path]:
    """Every file of the export, into ``directory`` (an empty staging folder)."""
    from vflo.comm.tls import init_certs

    # Private keys and party data: git must never pick them up, wherever the folder is.
    (directory / ".gitignore").write_text("# written by vflo scenario --export: keys and party data, never commit\n*\n")
    if tls:
        init_certs(directory / "certs", list(roles), split=True)
    active = data.active
    written: dict[str, Path] = {}
    for name, role in roles.items():
        data_table: dict[str, Any] = {}
        if name in data.train:
            data.train[name].to_frame("id", "label").to_csv(directory / f"{name}_train.csv", index=False)
            data.serve[name].to_frame("id").to_csv(directory / f"{name}_serve.csv", index=False)
            codes = list(data.train[name].categorical)
            data_table = {"file": f"{name}_train.csv", "id_column": "id",
                          **({"label_column": "label"} if name == active else {}),
                          "serve_file": f"{name}_serve.csv", "standardize": False,
                          **({"category_codes": codes} if codes else {})}
        tls_table: dict[str, Any] = {"dir": f"certs/{name}"} if tls else {"insecure": True}
        seed = {"seed": int(seeds[name])} if name in seeds else {}
        if name == active:
            test = PartyData(party=name, ids=data.test_ids, X=data.serve[name].subset(data.test_ids).X,
                             columns=data.serve[name].columns, y=data.test_y)
            test.to_frame("id", "label").to_csv(directory / f"{name}_test.csv", index=False)
            text = toml_document({
                "test_file": f"{name}_test.csv",
                "active": {"name": name, "role": "active", "listen": addresses[name], **seed, "data": data_table,
                           "tls": tls_table, "privacy": dict(PRIVACY)},
                "parties": [{"name": n, "role": r, "address": addresses[n]} for n, r in roles.items() if n != name],
            }, comments=["The active party coordinates: vflo run EXPERIMENT.toml --deploy deploy.toml",
                         *(SEED_NOTE if seed else ())])
            path = directory / "deploy.toml"
        else:
            sections, notes = own_settings(proposals, role)
            document: dict[str, Any] = {
                "name": name, "role": role, "listen": addresses[name], **seed, "models": f"{name}_models",
                "checkpoints": f"{name}_checkpoints", **({"data": data_table} if data_table else {}), "tls": tls_table,
                "privacy": dict(PRIVACY),
                **({"policy": {"methods": list(dict.fromkeys(methods))}} if methods else {}),
                **({"methods": sections} if sections else {}),
                "peers": {n: {"address": a, "role": roles[n]} for n, a in addresses.items() if n != name}}
            text = toml_document(document, comments=[
                f"vflo party serve {name}.toml",
                "Its own folders: the parts of models it trains (run --save) and its checkpoints (run --checkpoints).",
                *(SEED_NOTE if seed else ()),
                *([OWN_SIDE, *notes] if sections else [])])
            path = directory / f"{name}.toml"
        path.write_text(text)
        written[name] = path
    return written


COMMAND = "vflo scenario --export"

#: What an exported config says above the seed it carries.
SEED_NOTE = ("seed: the secret seed the in-process run gave this party (derived from the experiment's seed), so this",
             "deployment trains to the same numbers. Anyone who knows the experiment's seed can derive it: delete the",
             "line before a deployment on real data, and the party draws its secrets from the operating system.")


#: The budget every exported party's config carries (``[privacy]``): the default a deployed party gets anyway,
#: written out so that it can be seen and changed where it holds; ``protect = false`` says, where it can be changed,
#: that it bounds only what a method noises anyway (the exported run is the simulated one, noise and all).
PRIVACY = {"epsilon": DEFAULT_BUDGET.epsilon, "delta": DEFAULT_BUDGET.delta, "protect": DEFAULT_BUDGET.protect}


def ca_folder(directory: Path) -> Path:
    """Where an export of ``directory`` puts the federation's CA: the folder beside it named ``NAME-ca``."""
    return directory.resolve().parent / f"{directory.resolve().name}-ca"
