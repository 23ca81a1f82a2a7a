"""A simulated split written out as a deployment: each party's files, PARTY.toml with its own settings, keys kept
apart."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from vflo.data.partydata import PartyData
from vflo.roles import Role

logger = logging.getLogger(__name__)


def toml_value(value: object) -> str:
    """``value`` as TOML writes it (a string quoted and escaped, lists and tables inline)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{_toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + " }"
    return str(value)


def _toml_key(key: object) -> str:
    text = str(key)
    return text if text.replace("_", "").replace("-", "").isalnum() and text.isascii() else toml_value(text)


def own_settings_toml(proposals: Sequence[Any], role: Role) -> list[str]:
    """A party's ``[methods.NAME]`` sections for the experiment's ``proposals`` (methods with their configs): its
    own side of each, as the experiment sets it (the first entry of a method where several differ, noted)."""
    from vflo.methods.own_settings import party_section

    sections: dict[str, dict[str, Any]] = {}
    notes: list[str] = []
    for method in proposals:
        section = party_section(type(method), role, method.config_json())
        if method.name in sections:
            if sections[method.name] != section:
                notes.append(f"# another {method.name} entry of the experiment sets this party's side otherwise: "
                             f"{toml_value(section)}; a party runs one, the one below")
            continue
        sections[method.name] = section
    lines: list[str] = ["# This party's own side of each method: whatever a coordinator proposes, these run here.",
                        *notes] if any(sections.values()) else []
    for name, section in sections.items():
        if section:
            lines += [f"[methods.{name}]", *(f"{_toml_key(k)} = {toml_value(v)}" for k, v in section.items()), ""]
    return lines


def export_federation(
    data: Any, directory: Path, *, base_port: int = 50051, extra_roles: dict[str, Role] | None = None,
    tls: bool = True, host: str = "127.0.0.1", methods: Sequence[str] = (), proposals: Sequence[Any] = (),
) -> dict[str, Path]:
    """Write what each party of a simulated split would bring to a real deployment.

    For every data party: ``NAME_train.csv`` (and ``NAME_serve.csv`` with the rows to score); for the
    active party also ``NAME_test.csv`` with the test labels; ``NAME.toml`` for ``vflo party serve``
    (every party but the active one), each listing its peers with their roles and, under ``[policy]``, the
    ``methods`` it agrees to run and, under ``[methods.NAME]``, its own side of each of the experiment's
    ``proposals`` (methods with their configs) as the experiment sets it; ``deploy.toml`` for the active party;
    and, with ``tls``, the keys kept apart:
    ``certs/NAME/`` holds party NAME's ``ca.pem``, ``NAME.pem`` and ``NAME.key`` and nothing else (its config's
    ``[tls] dir``), ``certs/ca/`` the CA's certificate and key with a README (it belongs offline, never on a
    party's host). Data is written already standardised, so parties do not rescale it.
    """
    from vflo.comm.tls import init_certs
    from vflo.data.scenario import FederatedData

    assert isinstance(data, FederatedData)
    directory.mkdir(parents=True, exist_ok=True)
    # Private keys and party data: git must never pick them up, wherever the folder is.
    (directory / ".gitignore").write_text("# written by vflo scenario --export: keys and party data, never commit\n*\n")
    roles: dict[str, Role] = {p.name: p.role for p in data.parties} | (extra_roles or {})
    addresses = {name: f"{host}:{base_port + i}" for i, name in enumerate(roles)}
    if tls:
        certs = directory / "certs"
        # An export before keys were kept apart left them all in certs/: none may stay next to the party folders.
        for stale in ("ca.pem", "ca.key", *(f"{n}.{ext}" for n in roles for ext in ("pem", "key"))):
            (certs / stale).unlink(missing_ok=True)
        init_certs(certs, list(roles), overwrite=True, split=True)
    active = data.active
    written: dict[str, Path] = {}
    for name, role in roles.items():
        lines: list[str] = []
        if name in data.train:
            data.train[name].to_frame("id", "label").to_csv(directory / f"{name}_train.csv", index=False)
            data.serve[name].to_frame("id").to_csv(directory / f"{name}_serve.csv", index=False)
            label = '\nlabel_column = "label"' if name == active else ""
            lines = [f'file = "{name}_train.csv"', 'id_column = "id"' + label, f'serve_file = "{name}_serve.csv"',
                     "standardize = false"]
        tls_lines = ["[tls]", f"dir = {toml_value(f'certs/{name}')}" if tls else "insecure = true"]
        peers = [f"{n} = {{ address = {toml_value(a)}, role = {toml_value(roles[n])} }}" for n, a in addresses.items()
                 if n != name]
        listed = ", ".join(toml_value(m) for m in dict.fromkeys(methods))
        policy = ["[policy]", f"methods = [{listed}]", ""] if methods else []
        if name == active:
            test = PartyData(party=name, ids=data.test_ids, X=data.serve[name].subset(data.test_ids).X,
                             columns=data.serve[name].columns, y=data.test_y)
            test.to_frame("id", "label").to_csv(directory / f"{name}_test.csv", index=False)
            others = [f"[[parties]]\nname = {toml_value(n)}\nrole = {toml_value(r)}\n"
                      f"address = {toml_value(addresses[n])}" for n, r in roles.items() if n != name]
            text = "\n".join([
                "# The active party coordinates: vflo run EXPERIMENT.toml --deploy deploy.toml", "",
                f'test_file = "{name}_test.csv"', "", "[active]", f"name = {toml_value(name)}", 'role = "active"',
                f"listen = {toml_value(addresses[name])}", "", "[active.data]", *lines, "",
                *(["[active.tls]", *tls_lines[1:]]), "", *others, ""])
            path = directory / "deploy.toml"
        else:
            text = "\n".join([
                f"# vflo party serve {name}.toml", f"name = {toml_value(name)}", f"role = {toml_value(role)}",
                f"listen = {toml_value(addresses[name])}",
                "# Its own folders: the parts of models it trains (run --save) and its checkpoints (run --checkpoints)",
                f"models = {toml_value(f'{name}_models')}", f"checkpoints = {toml_value(f'{name}_checkpoints')}", "",
                *(["[data]", *lines, ""] if lines else []), *tls_lines, "", *policy,
                *own_settings_toml(proposals, role), "[peers]", *peers, ""])
            path = directory / f"{name}.toml"
        path.write_text(text)
        written[name] = path
    return written
