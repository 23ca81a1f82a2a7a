"""Build frozen dataclasses from plain mappings (TOML tables, JSON), checking every key.

One place decides what a config may say: unknown keys are errors with a
"did you mean" hint, values are checked against the field's type, lists become
tuples, nested tables become nested dataclasses. The error names the dotted
path of the offending key so the user can find it in the file.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

from vflo.errors import ConfigError, did_you_mean

T = TypeVar("T")


def build(cls: type[T], mapping: Mapping[str, Any] | None, where: str = "") -> T:
    """An instance of dataclass ``cls`` from ``mapping``; a :class:`ConfigError` names what is wrong."""
    if mapping is None:
        mapping = {}
    if isinstance(mapping, cls):
        return mapping
    if not isinstance(mapping, Mapping):
        raise ConfigError(f"{where or cls.__name__} must be a table of settings, got {type(mapping).__name__}")
    if not dataclasses.is_dataclass(cls):  # pragma: no cover - programming error
        raise TypeError(f"{cls!r} is not a dataclass")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init and not f.name.startswith("_")}
    kwargs: dict[str, Any] = {}
    for key, value in mapping.items():
        path = f"{where}.{key}" if where else key
        if key not in fields:
            raise ConfigError(
                f"unknown key {path!r}{did_you_mean(key, fields)}; valid keys here: {', '.join(sorted(fields))}"
            )
        kwargs[key] = coerce(hints[key], value, path)
    missing = [
        n for n, f in fields.items()
        if n not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ConfigError(f"{where or cls.__name__}: missing required key(s) {missing}")
    try:
        return cls(**kwargs)
    except ConfigError as exc:
        if where and not str(exc).startswith(where):
            raise ConfigError(f"{where}: {exc}") from exc
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where or cls.__name__}: {exc}") from exc


def _describe(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return " or ".join(repr(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_describe(a) for a in get_args(tp))
    if origin is tuple:
        return f"a list of {_describe(get_args(tp)[0])}"
    if dataclasses.is_dataclass(tp):
        return "a table"
    return getattr(tp, "__name__", str(tp))


def _literal(tp: Any, value: Any, path: str) -> Any:
    if value in get_args(tp) and type(value) in {type(a) for a in get_args(tp)}:
        return value
    options = [str(a) for a in get_args(tp)]
    raise ConfigError(
        f"{path} = {value!r} is not allowed{did_you_mean(str(value), options)}; choose one of {_describe(tp)}"
    )


def _union(tp: Any, value: Any, path: str) -> Any:
    args = get_args(tp)
    if value is None and type(None) in args:
        return None
    # A table for an optional table: its own error (an unknown key, with a hint) says more than "must be a table".
    tables = [a for a in args if dataclasses.is_dataclass(a)]
    if isinstance(value, Mapping) and len(tables) == 1:
        return coerce(tables[0], value, path)
    # Try exact-type matches first so 3 stays an int in int | float.
    for arg in sorted(args, key=lambda a: 0 if a is type(value) else 1):
        if arg is type(None):
            continue
        try:
            return coerce(arg, value, path)
        except ConfigError:
            continue
    raise ConfigError(f"{path} = {value!r} must be {_describe(tp)}")


def _tuple(tp: Any, value: Any, path: str) -> Any:
    if not isinstance(value, list | tuple):
        raise ConfigError(f"{path} must be {_describe(tp)}, got {value!r}")
    args = get_args(tp)
    if len(args) == 2 and args[1] is Ellipsis:
        return tuple(coerce(args[0], v, f"{path}[{i}]") for i, v in enumerate(value))
    if len(args) != len(value):
        raise ConfigError(f"{path} must have {len(args)} entries, got {len(value)}")
    return tuple(coerce(a, v, f"{path}[{i}]") for i, (a, v) in enumerate(zip(args, value, strict=True)))


def _mapping(tp: Any, value: Any, path: str) -> Any:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{path} must be a table, got {value!r}")
    args = get_args(tp)
    if args:
        return {str(k): coerce(args[1], v, f"{path}.{k}") for k, v in value.items()}
    return dict(value)


def _scalar(kind: type, text: str) -> Callable[[Any, Any, str], Any]:
    """A converter that accepts values of ``kind`` (never a bool where a number is meant)."""

    def convert(_tp: Any, value: Any, path: str) -> Any:
        accepted: tuple[type, ...] = (int, float) if kind is float else (kind,)
        if isinstance(value, accepted) and (kind is bool or not isinstance(value, bool)):
            return float(value) if isinstance(value, int | float) and kind is float else value
        raise ConfigError(f"{path} must be {text}, got {value!r}")

    return convert


# (does this converter handle the type?, the converter): the first that matches converts.
_CONVERTERS: tuple[tuple[Callable[[Any, Any], bool], Callable[[Any, Any, str], Any]], ...] = (
    (lambda tp, origin: origin is Literal, _literal),
    (lambda tp, origin: origin in (Union, types.UnionType), _union),
    (lambda tp, origin: origin is tuple, _tuple),
    (lambda tp, origin: origin in (dict, Mapping) or tp in (dict, Mapping), _mapping),
    (lambda tp, origin: dataclasses.is_dataclass(tp) and isinstance(tp, type), build),
    (lambda tp, origin: tp is bool, _scalar(bool, "true or false")),
    (lambda tp, origin: tp is int, _scalar(int, "an integer")),
    (lambda tp, origin: tp is float, _scalar(float, "a number")),
    (lambda tp, origin: tp is str, _scalar(str, "a string")),
)


def coerce(tp: Any, value: Any, path: str) -> Any:
    """Check ``value`` against type ``tp`` and convert lists to tuples and tables to dataclasses."""
    if tp is Any:
        return value
    origin = get_origin(tp)
    for handles_type, convert in _CONVERTERS:
        if handles_type(tp, origin):
            return convert(tp, value, path)
    if isinstance(tp, type) and isinstance(value, tp):
        return value
    raise ConfigError(f"{path} = {value!r} must be {_describe(tp)}")  # pragma: no cover


def to_plain(obj: Any) -> Any:
    """A dataclass as JSON-ready dicts and lists (the inverse of :func:`build`)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {
            f.name: to_plain(getattr(obj, f.name))
            for f in dataclasses.fields(obj) if f.init and not f.name.startswith("_")
        }
    if isinstance(obj, tuple | list):
        return [to_plain(v) for v in obj]
    if isinstance(obj, Mapping):
        return {str(k): to_plain(v) for k, v in obj.items()}
    return obj


def to_json(obj: Any) -> str:
    return json.dumps(to_plain(obj), sort_keys=True)
