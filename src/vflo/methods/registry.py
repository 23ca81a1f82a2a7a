"""Methods by name. Adding a method = one module, its tests, one line here.

Entries are import paths so that listing methods or parsing a config does not
import every method's dependencies.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

from vflo.errors import ConfigError, MethodError, unknown_name
from vflo.methods.base import Method

_METHODS: dict[str, str] = {
    "local": "vflo.methods.local:Local",
    "centralized": "vflo.methods.centralized:Centralized",
    "splitnn": "vflo.methods.splitnn:SplitNN",
    "apc_vfl": "vflo.methods.apc_vfl:APCVFL",
    "apc_vfl_aligned": "vflo.methods.apc_vfl:APCVFLAligned",
    "ablation": "vflo.methods.apc_vfl:Ablation",
    "fedsvd": "vflo.methods.fedsvd:FedSVD",
    "vfedtrans": "vflo.methods.vfedtrans:VFedTrans",
    "entity_augmentation": "vflo.methods.entity_augmentation:EntityAugmentation",
    "laser_vfl": "vflo.methods.laser_vfl:LaserVFL",
    "rap": "vflo.methods.rap:RAP",
    "ldp": "vflo.methods.rap:LocalDP",
    "single": "vflo.methods.single:Single",
    "vfl_asp": "vflo.methods.vfl_asp:VFLASP",
    "vfl_asp_student": "vflo.methods.vfl_asp:VFLASPStudent",
    "secureboost": "vflo.methods.secureboost:SecureBoost",
    "pca": "vflo.methods.pca:PCAUpload",
}


def method_names() -> list[str]:
    return sorted(_METHODS)


def methods_where(test: Callable[[type[Method]], bool]) -> list[str]:
    """The names of the registered methods whose class passes ``test`` (read from their tags)."""
    return [name for name in method_names() if test(get_method(name))]


def active_only() -> list[str]:
    """The deployable methods that score from the active party's features alone (fallbacks for the others)."""
    return methods_where(lambda cls: cls.inference == "active_only" and not cls.simulation_only)


def floor() -> str:
    """The method every federated one must beat (the active party alone): the one registered with ``floor``."""
    found = methods_where(lambda cls: cls.floor)
    if len(found) != 1:
        raise MethodError(f"exactly one registered method is the floor (floor = True), found {found}")
    return found[0]


def subset_scorers() -> str:
    """The methods that score a person with whichever partners hold them, as a sentence's list (for messages)."""
    always = methods_where(lambda cls: cls.inference == "collaborative" and cls.any_subset)
    when = [f"{name} with {get_method(name).subset_when}" for name in methods_where(lambda cls: bool(cls.subset_when))]
    return ", ".join([*always, *when])


def checkpointed_tables() -> list[str]:
    """Every training table that keeps checkpoints (``NAME.train``: ``[methods.NAME.train]`` in a config)."""
    return [f"{name}.{table}" for name in method_names() for table in get_method(name).checkpointed]


def scoring_text(cls: type[Method]) -> str:
    """How a method scores a new person, from its tags (``vflo methods``)."""
    if cls.simulation_only:
        return "simulation only (pools raw features)"
    if cls.inference == "active_only":
        return "active party alone"
    if cls.any_subset:
        return "with whoever holds the person"
    if cls.subset_when:
        return f"together; with whoever holds the person when {cls.subset_when}"
    return "together"


def method_for_party(name: str, proposal: Mapping[str, Any], *, own: Mapping[str, Any] | None, role: str,
                     party: str) -> tuple[Method, dict[str, Any]]:
    """What a node installs for a setup: the coordinator's ``proposal`` with the party's own settings
    (:func:`vflo.methods.own_settings.decide`)."""
    from vflo.methods.own_settings import decide

    return decide(get_method(name), proposal, own, role=role, party=party)


def get_method(name: str) -> type[Method]:
    """The method class registered as ``name``."""
    try:
        target = _METHODS[name]
    except KeyError:
        raise ConfigError(unknown_name("method", name, _METHODS)) from None
    module_name, _, attr = target.partition(":")
    cls = getattr(importlib.import_module(module_name), attr)
    if not (isinstance(cls, type) and issubclass(cls, Method)) or cls.name != name:
        raise TypeError(f"registry entry {name!r} -> {target} is not a Method named {name!r}")  # pragma: no cover
    return cls
