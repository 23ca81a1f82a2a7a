"""What a party decides itself: the settings of the computation that runs only at that party.

A coordinator proposes one config for a method; a party does not run it as sent. Each method names, for a role
(``Method.own_settings``), the settings its parties decide alone: the bottom network, encoder, activation, learning
rate of the model only that party holds. It names the settings every party must share
(``Method.shared_settings``): noise, wire precision, a protocol's mode. And it says what the others rely on of a
party's own settings (``Method.agreed``: an output's width). At setup a party runs

* each **own** setting from its own config (``[methods.NAME]`` in PARTY.toml), else the method's default. The
  proposal's value is ignored; where it differs, the party logs it and tells the coordinator what it runs;
* each **shared** setting from its own config where that gives one, and then the proposal must say the same:
  else it refuses, naming both values. Where its config says nothing, it takes the proposal's (noise a coordinator
  asks for only adds to the party's protection, and the ε the results report is that of the noise that ran);
* and refuses, naming both, when what the others rely on (``agreed``) differs between its own settings and
  the proposal.

In simulation one experiment config serves every party: each party's node is handed its section of it
(:func:`party_section`), the same section an export writes into that party's config.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from vflo import schema
from vflo.errors import ConfigError
from vflo.party.policy import PolicyError

if TYPE_CHECKING:
    from vflo.methods.base import Method

logger = logging.getLogger(__name__)

__all__ = ["check_section", "decide", "party_section", "settings_table"]


def _paths(cls: type[Method], role: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    return tuple(cls.own_settings.get(role, ())), tuple(cls.shared_settings.get(role, ()))


def _get(tree: Mapping[str, Any], path: str) -> Any:
    value: Any = tree
    for key in path.split("."):
        value = value[key]
    return value


def _has(tree: Mapping[str, Any], path: str) -> bool:
    value: Any = tree
    for key in path.split("."):
        if not isinstance(value, Mapping) or key not in value:
            return False
        value = value[key]
    return True


def _put(tree: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    node = tree
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = copy.deepcopy(value)


def _leaves(section: Mapping[str, Any], allowed: tuple[str, ...], where: str, role: str,
            prefix: str = "") -> list[str]:
    """The dotted settings ``section`` gives, each one of ``allowed`` (or inside one); anything else refused."""
    out: list[str] = []
    for key, value in section.items():
        path = f"{prefix}{key}"
        if path in allowed or any(path.startswith(a + ".") for a in allowed):
            out.append(path)
        elif isinstance(value, Mapping) and any(a.startswith(path + ".") for a in allowed):
            out.extend(_leaves(value, allowed, where, role, path + "."))
        else:
            article = "an" if role[:1] in "aeiou" else "a"
            raise ConfigError(f"{where}.{path}: {article} {role} party does not decide that setting (the "
                              f"coordinator's experiment config does); its own section may set only "
                              f"{', '.join(allowed) or 'nothing'}: remove it")
    return out


def _own_json(cls: type[Method], section: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The method's defaults with ``section`` over them, validated, as plain JSON values."""
    config = schema.build(cls.Config, section, where=where)
    return dict(json.loads(schema.to_json(config)))


def check_section(cls: type[Method], role: str, section: Mapping[str, Any], *, where: str) -> None:
    """Refuse a party config's ``[methods.NAME]`` that sets what its role does not decide, or a bad value."""
    own, shared = _paths(cls, role)
    if not isinstance(section, Mapping):
        raise ConfigError(f"{where} must be a table of settings, got {type(section).__name__}")
    _leaves(section, own + shared, where, role)
    _own_json(cls, section, where)


def party_section(cls: type[Method], role: str, config_json: str) -> dict[str, Any]:
    """The part of a full config (JSON) that a party in ``role`` decides or shares: what its own config holds
    (nested as TOML writes it; settings that are None left out, as TOML has no null)."""
    own, shared = _paths(cls, role)
    full = json.loads(config_json)
    out: dict[str, Any] = {}
    for path in own + shared:
        if _has(full, path) and _get(full, path) is not None:
            _put(out, path, _get(full, path))
    return out


def decide(cls: type[Method], proposal: Mapping[str, Any], own_section: Mapping[str, Any] | None, *, role: str,
           party: str) -> tuple[Method, dict[str, Any]]:
    """The method this party runs for the coordinator's ``proposal`` (its config, as a table), given its own config's
    section; with the own settings it runs where they differ from the proposal (path -> its value)."""
    own, shared = _paths(cls, role)
    proposed = cls.from_config(proposal)
    if not own and not shared:
        return proposed, {}
    where = f"party {party!r}'s [methods.{cls.name}]"
    # Only what this role decides or shares is read (a party's config was checked for anything else when loaded;
    # a saved part's full config gives its own side).
    section: dict[str, Any] = {}
    given = [p for p in own + shared if own_section is not None and _has(own_section, p)]
    for path in given:
        _put(section, path, _get(own_section or {}, path))
    mine = _own_json(cls, section, where)
    asked = proposed.config_table()  # every setting spelled out, as the party's own are
    effective = copy.deepcopy(asked)
    differs: dict[str, Any] = {}
    for path in own:
        value = _get(mine, path)
        if not _has(asked, path) or _get(asked, path) != value:
            differs[path] = value
        _put(effective, path, value)
    for path in shared:
        if any(g == path or g.startswith(path + ".") for g in given) and _get(mine, path) != _get(asked, path):
            raise PolicyError(
                f"party {party!r} runs {cls.name} only with {path} = {_show(_get(mine, path))} (its own config's "
                f"[methods.{cls.name}]), but the coordinator proposes {_show(_get(asked, path))}: refused; set the "
                f"experiment's methods.{cls.name}.{path} to the party's value, or the party changes its config")
    method = cls.from_config(effective)
    theirs, ours = proposed.agreed(role), method.agreed(role)
    for key in sorted(set(theirs) | set(ours)):
        if theirs.get(key) != ours.get(key):
            raise PolicyError(
                f"party {party!r}'s own {cls.name} settings give {key} = {_show(ours.get(key))}, but the "
                f"coordinator's proposal needs {_show(theirs.get(key))}: refused; the other parties rely on it. Set "
                f"it under [methods.{cls.name}] in {party!r}'s config, or propose {_show(ours.get(key))}")
    for path, value in differs.items():
        logger.info("party %s runs %s with its own %s = %s (the coordinator proposed %s)", party, cls.name, path,
                    _show(value), _show(_get(asked, path)) if _has(asked, path) else "nothing")
    return method, differs


def _show(value: Any) -> str:
    return json.dumps(value)


def _default(value: Any) -> str:
    if isinstance(value, Mapping) and "lr" in value:  # a training table: what tells one from another
        return f"lr {value['lr']}, batch {value.get('batch_size')}, up to {value.get('max_epochs')} epochs"
    return _show(value)


def settings_table(methods: Iterable[type[Method]]) -> str:
    """Markdown: for each of ``methods``, the settings a passive party decides and those it shares, with defaults
    (docs/security.md carries it for every registered method, ``vflo.audit.settings_markdown()``; a test keeps
    the two equal)."""
    rows = ["| method | decided by the party (default) | shared: the party's value if it sets one, else the "
            "proposal's (default) | others rely on |", "|---|---|---|---|"]
    for cls in methods:
        name = cls.name
        own, shared = _paths(cls, "passive")
        if not own and not shared:
            continue
        defaults = json.loads(schema.to_json(cls.Config()))
        cells = [", ".join(f"`{p}` ({_default(_get(defaults, p))})" for p in paths) or "none"
                 for paths in (own, shared)]
        relied = ", ".join(sorted(cls().agreed("passive"))) or "none"
        rows.append(f"| {name} | {cells[0]} | {cells[1]} | {relied} |")
    return "\n".join(rows) + "\n"
