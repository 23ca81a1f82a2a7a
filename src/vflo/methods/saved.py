"""What a fitted method keeps, declared once, and the one codec that saves and restores it.

A method declares :class:`Saves`: the attributes of the fitted method the active party keeps (``NAME_`` on the
method, the scikit-learn convention) and, per role, the attributes of each party's own :class:`Part` it keeps
(``NAME`` on the part). Each is a :class:`Saved`: a group name in the party's ``state.vflo`` (``NAME`` or
``NAME.*``), a :class:`Kind` that says how its value becomes named arrays and plain values and back, and a line
for docs/models.md, which is generated from these declarations (:func:`models_markdown`).

The codec checks what it reads: a group a declaration needs and the file lacks means a part of another method or
version; a value of another type is refused by name. Nothing is unpickled or evaluated.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from vflo.comm.message import Value
from vflo.errors import MethodError

if TYPE_CHECKING:
    from torch import nn

    from vflo.nn.distill import FittedAutoencoder
    from vflo.nn.estimators import Estimator

__all__ = ["ARRAY", "INTEGER", "NUMBER", "PARTY_NAMES", "TEXT", "WIDTHS", "At", "Built", "Kind", "Part", "Saved",
           "Saves", "autoencoder", "decode", "encode", "estimator", "network"]

State = dict[str, Value]


class Part:
    """A party's own state for one method (its typed attributes), kept in its context: ``ctx.part(Cls)``."""


@dataclass(frozen=True)
class At:
    """Where a saved value is being restored: the method, the party's context or the federation (``where``),
    and the object whose attributes are being set (``target``: the method, or the party's part)."""

    method: Any
    where: Any
    target: Any


class Kind(ABC):
    """How one saved value becomes named arrays and plain values (keys relative to its group; ``""`` is the
    group's own name) and back."""

    @abstractmethod
    def encode(self, value: Any) -> State: ...

    @abstractmethod
    def decode(self, sub: Mapping[str, Value], at: At) -> Any: ...


def _one(sub: Mapping[str, Value]) -> Value:
    if "" not in sub:
        raise MethodError("a saved value is missing: the part was saved by another method or version")
    return sub[""]


class _Int(Kind):
    def encode(self, value: Any) -> State:
        return {"": int(value)}

    def decode(self, sub: Mapping[str, Value], at: At) -> int:
        value = _one(sub)
        if isinstance(value, bool) or not isinstance(value, int | np.integer):
            raise MethodError(f"a saved whole number is {type(value).__name__}: the part is damaged or of another "
                              "version")
        return int(value)


class _Float(Kind):
    def encode(self, value: Any) -> State:
        return {"": float(value)}

    def decode(self, sub: Mapping[str, Value], at: At) -> float:
        value = _one(sub)
        if isinstance(value, bool) or not isinstance(value, int | float | np.number):
            raise MethodError(f"a saved number is {type(value).__name__}: the part is damaged or of another version")
        return float(value)


class _Text(Kind):
    def encode(self, value: Any) -> State:
        return {"": str(value)}

    def decode(self, sub: Mapping[str, Value], at: At) -> str:
        value = _one(sub)
        if not isinstance(value, str):
            raise MethodError(f"a saved text is {type(value).__name__}: the part is damaged or of another version")
        return value


class _Array(Kind):
    def encode(self, value: Any) -> State:
        return {"": np.asarray(value)}

    def decode(self, sub: Mapping[str, Value], at: At) -> np.ndarray:
        value = _one(sub)
        if not isinstance(value, np.ndarray):
            raise MethodError(f"a saved array is {type(value).__name__}: the part is damaged or of another version")
        return value


class _Names(Kind):
    """A list of names (parties, in order), as a string array."""

    def encode(self, value: Any) -> State:
        return {"": np.asarray([str(v) for v in value], dtype=np.str_)}

    def decode(self, sub: Mapping[str, Value], at: At) -> list[str]:
        value = _one(sub)
        if not isinstance(value, np.ndarray) or value.dtype.kind != "U":
            raise MethodError("a saved list of names is not a string array: the part is of another version")
        return [str(v) for v in value.tolist()]


class _Widths(Kind):
    """Each party's width (``{name: int}``), as its names and its widths."""

    def encode(self, value: Any) -> State:
        return {"names": np.asarray(list(value), dtype=np.str_),
                "sizes": np.asarray([int(v) for v in value.values()], dtype=np.int64)}

    def decode(self, sub: Mapping[str, Value], at: At) -> dict[str, int]:
        names, sizes = sub.get("names"), sub.get("sizes")
        if not isinstance(names, np.ndarray) or not isinstance(sizes, np.ndarray) or len(names) != len(sizes):
            raise MethodError("saved widths lack their names or sizes: the part is of another version")
        return {str(k): int(v) for k, v in zip(names.tolist(), sizes.tolist(), strict=True)}


INTEGER: Kind = _Int()
NUMBER: Kind = _Float()
TEXT: Kind = _Text()
ARRAY: Kind = _Array()
PARTY_NAMES: Kind = _Names()
WIDTHS: Kind = _Widths()


@dataclass(frozen=True)
class Built(Kind):
    """An object kept as named arrays (``save``) and rebuilt by the method (``load``, given those arrays and
    where it is restored)."""

    save: Callable[[Any], State]
    load: Callable[[Mapping[str, Value], At], Any]

    def encode(self, value: Any) -> State:
        return self.save(value)

    def decode(self, sub: Mapping[str, Value], at: At) -> Any:
        return self.load(sub, at)


def network(build: Callable[[At], nn.Module]) -> Built:
    """A torch network: its parameters and buffers; restored into the network ``build`` makes (from the config
    and the values restored before it), in evaluation mode."""

    def save(net: nn.Module) -> State:
        from vflo.nn.train import module_state
        return dict(module_state(net))

    def load(sub: Mapping[str, Value], at: At) -> nn.Module:
        from vflo.nn.train import load_module_state
        net = build(at)
        load_module_state(net, sub)
        net.eval()
        return net

    return Built(save, load)


def autoencoder(hidden: Callable[[At], tuple[int, ...]], activation: Callable[[At], str]) -> Built:
    """A fitted autoencoder (:class:`~vflo.nn.distill.FittedAutoencoder`) of the layer widths ``hidden`` and the
    ``activation`` the config gives."""

    def save(ae: FittedAutoencoder) -> State:
        return dict(ae.state(""))

    def load(sub: Mapping[str, Value], at: At) -> FittedAutoencoder:
        from vflo.nn.distill import FittedAutoencoder
        return FittedAutoencoder.from_state(sub, "", hidden(at), activation=activation(at))

    return Built(save, load)


def estimator(make: Callable[[At], Estimator]) -> Built:
    """A fitted estimator (:mod:`vflo.nn.estimators`), restored into the one ``make`` builds."""

    def save(est: Estimator) -> State:
        return dict(est.get_state())

    def load(sub: Mapping[str, Value], at: At) -> Estimator:
        return make(at).set_state(sub)

    return Built(save, load)


@dataclass(frozen=True)
class Saved:
    """One saved value: its group name in ``state.vflo``, its kind, what it is (for docs/models.md), and whether
    a part may lack it (``optional``: a value that is ``None`` is not saved and restores as ``None``)."""

    name: str
    kind: Kind
    about: str = ""
    optional: bool = False
    #: The attribute that holds it, where that is not the name (``NAME_`` on a method, ``NAME`` on a part).
    attr: str = ""
    #: The part that holds it, where that is not the method's :attr:`Saves.part` (a method built of two
    #: protocols, each with its own part).
    part: type[Part] | None = None


@dataclass(frozen=True)
class Saves:
    """What a fitted method keeps: ``model``, the method's attributes (``NAME_``) the active party keeps;
    ``parts``, per role, the attributes of the party's own ``part`` (``NAME``). A role absent from ``parts``
    keeps nothing but its release key."""

    model: tuple[Saved, ...] = ()
    part: type[Part] | None = None
    parts: Mapping[str, tuple[Saved, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if any(s.part is None for saved in self.parts.values() for s in saved) and self.part is None:
            raise MethodError("Saves: parts are declared without the Part class that holds them")
        for role, saved in {"model": self.model, **self.parts,
                            "the active party": self.model + self.of("active")}.items():
            names = [s.name for s in saved]
            if len(set(names)) != len(names) or any("." in n for n in names):
                raise MethodError(f"Saves: a name is declared twice, or holds a dot, for {role}: {names}")

    def of(self, role: str) -> tuple[Saved, ...]:
        return self.parts.get(role, ())


def _attr(saved: Saved, model: bool) -> str:
    if saved.attr:
        return saved.attr
    return saved.name + "_" if model else saved.name


def encode(declared: Sequence[Saved], of: Callable[[Saved], Any], *, model: bool) -> State:
    """The named values of the declared attributes (the method's ``NAME_`` when ``model``, else the part's
    ``NAME``; ``of`` gives the object that holds each), each under its group name."""
    out: State = {}
    for saved in declared:
        value = getattr(of(saved), _attr(saved, model), None)
        if value is None:
            if saved.optional:
                continue
            raise MethodError(f"{saved.name} is not fitted: save a model after it has been trained")
        for key, item in saved.kind.encode(value).items():
            out[saved.name + ("." + key if key else "")] = item
    return out


def decode(declared: Sequence[Saved], state: Mapping[str, Value], of: Callable[[Saved], Any], *, method: Any,
           where: Any, model: bool) -> None:
    """Set the declared attributes from ``state``, in declaration order (a later value may be built from an
    earlier one, such as a network from its input width)."""
    for saved in declared:
        target = of(saved)
        sub = {"" if k == saved.name else k[len(saved.name) + 1:]: v for k, v in state.items()
               if k == saved.name or k.startswith(saved.name + ".")}
        if not sub:
            if not saved.optional:
                raise MethodError(f"a saved model part lacks {saved.name!r}: it was saved by another method or "
                                  "version")
            setattr(target, _attr(saved, model), None)
            continue
        try:
            value = saved.kind.decode(sub, At(method, where, target))
        except MethodError as exc:
            raise MethodError(f"saved {saved.name!r}: {exc}") from exc
        setattr(target, _attr(saved, model), value)


def unclaimed(declared: Sequence[Saved], state: Mapping[str, Value]) -> list[str]:
    """Keys of ``state`` no declaration reads (a part of another method or version)."""
    names = {s.name for s in declared}
    return sorted(k for k in state if k.split(".")[0] not in names)
