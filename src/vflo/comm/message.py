"""The typed envelope every exchange between parties travels in.

A :class:`Message` carries a small payload of named numpy arrays, scalars and tables of
settings (:class:`Table`), or an error. Handlers declare what they accept with :class:`ArraySpec` / :class:`ScalarSpec`
so a wrong dtype or shape is refused before any protocol code runs.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vflo.errors import PayloadError, ProtocolError, RemoteError
from vflo.schema import to_plain

Scalar = int | float | str | bool
#: How deep a table's tables and lists may nest (a method's config nests three or four levels).
MAX_TABLE_DEPTH = 16


class Table(Mapping[str, Any]):
    """Settings as structure (a method's config, a party's own settings): text keys; values text, numbers, flags,
    None, lists and tables of the same, nested at most :data:`MAX_TABLE_DEPTH` deep. The codec carries it in the
    frame's header and checks it on arrival, so no party parses settings out of a text field. Read-only; its
    ``plain()`` copy is ordinary dicts and lists."""

    def __init__(self, items: Mapping[str, Any] | None = None) -> None:
        self._items = dict(items or {})
        check_table(self._items)

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"Table({self._items!r})"

    def plain(self) -> dict[str, Any]:
        """A deep copy as dicts and lists, for code that changes it."""
        plain: dict[str, Any] = to_plain(self._items)
        return plain


def check_table(value: Mapping[str, Any], depth: int = 0) -> None:
    """A :class:`PayloadError` unless ``value`` is a table a message may carry (see :class:`Table`)."""
    for key, item in value.items():
        if not isinstance(key, str):
            raise PayloadError(f"a table's keys are text, got {key!r}")
        _check_item(item, depth + 1)


def _check_item(item: Any, depth: int) -> None:
    if item is None or isinstance(item, str | bool | int | float):
        return  # JSON carries a float's every bit (its shortest exact form), infinities included
    if depth > MAX_TABLE_DEPTH:
        raise PayloadError(f"a table nests deeper than {MAX_TABLE_DEPTH} levels")
    if isinstance(item, Mapping):
        check_table(item, depth)
        return
    if isinstance(item, list | tuple):
        for v in item:
            _check_item(v, depth + 1)
        return
    raise PayloadError(f"a table holds {type(item).__name__}: settings are text, numbers, flags, lists or tables")


Value = np.ndarray | Scalar | Table
Payload = Mapping[str, Value]

CONTROL_PREFIX = "control."
ALIGN_PREFIX = "align."


@dataclass(frozen=True)
class MessageError:
    """What a party reports instead of a payload when its handler failed."""

    type: str
    message: str


@dataclass(frozen=True)
class Message:
    """One request or reply: who to whom, what kind, in which communication round of which run (``run``: the
    ID the coordinator chose at setup; empty before any run, e.g. alignment checks ahead of training)."""

    sender: str
    receiver: str
    kind: str
    round: int
    payload: Payload = field(default_factory=dict)
    error: MessageError | None = None
    run: str = ""

    @property
    def is_control(self) -> bool:
        """Control messages (setup, teardown) are counted apart from the method's own traffic."""
        return self.kind.startswith(CONTROL_PREFIX)

    def reply(self, payload: Payload) -> Message:
        return Message(sender=self.receiver, receiver=self.sender, kind=self.kind, round=self.round, payload=payload,
                       run=self.run)

    def error_reply(self, exc: BaseException) -> Message:
        return Message(
            sender=self.receiver, receiver=self.sender, kind=self.kind, round=self.round,
            error=MessageError(type=type(exc).__name__, message=str(exc)), run=self.run,
        )

    def unwrap(self) -> Reply:
        """The payload as a typed view, or a :class:`RemoteError` naming the party and message kind that failed."""
        if self.error is not None:
            raise RemoteError(self.sender, self.kind, self.error.type, self.error.message)
        return Reply(self.kind, self.sender, self.payload)


# --- payload specifications ---------------------------------------------------------------------


@dataclass(frozen=True)
class ArraySpec:
    """An expected array field: allowed dtypes and a shape pattern (``None`` = any length)."""

    dtypes: tuple[str, ...]
    shape: tuple[int | None, ...]

    def check(self, kind: str, name: str, value: Value) -> None:
        if not isinstance(value, np.ndarray):
            raise PayloadError(f"message {kind!r}: field {name!r} must be an array, got {type(value).__name__}")
        if value.dtype.name not in self.dtypes and not (value.dtype.kind == "U" and "str" in self.dtypes):
            raise PayloadError(
                f"message {kind!r}: field {name!r} has dtype {value.dtype.name}, expected {' or '.join(self.dtypes)}"
            )
        if value.ndim != len(self.shape) or any(
            want is not None and got != want for got, want in zip(value.shape, self.shape, strict=True)
        ):
            pattern = "(" + ", ".join("n" if s is None else str(s) for s in self.shape) + ")"
            raise PayloadError(
                f"message {kind!r}: field {name!r} has shape {value.shape}, expected {pattern}"
            )


@dataclass(frozen=True)
class ScalarSpec:
    """An expected scalar field of one of the given Python types."""

    types: tuple[type, ...]

    def check(self, kind: str, name: str, value: Value) -> None:
        if isinstance(value, np.ndarray) or not isinstance(value, self.types) or (
            isinstance(value, bool) and bool not in self.types
        ):
            names = " or ".join(t.__name__ for t in self.types)
            raise PayloadError(f"message {kind!r}: field {name!r} must be {names}, got {value!r}")


@dataclass(frozen=True)
class TableSpec:
    """An expected table of settings (:class:`Table`)."""

    def check(self, kind: str, name: str, value: Value) -> None:
        if not isinstance(value, Table):
            raise PayloadError(f"message {kind!r}: field {name!r} must be a table of settings, got "
                               f"{type(value).__name__}")


FieldSpec = ArraySpec | ScalarSpec | TableSpec

IDS = ArraySpec(("int64", "str"), (None,))
#: Party names, as a list (never JSON inside a string).
NAMES = ArraySpec(("str",), (None,))
#: One count per element of another field (a width per party).
COUNTS = ArraySpec(("int64",), (None,))
INT = ScalarSpec((int,))
FLOAT = ScalarSpec((float, int))
STR = ScalarSpec((str,))
BOOL = ScalarSpec((bool,))
#: A table of settings (a method's config, a party's own settings), never JSON inside a string.
SETTINGS = TableSpec()


def floats(*shape: int | None) -> ArraySpec:
    return ArraySpec(("float32", "float16"), tuple(shape))


class Fields(Mapping[str, Value]):
    """A request's payload as its handler declared it, once checked against that declaration
    (:func:`check_payload`): each field read with the type it was declared with, no casts at the handler.

    A reader of the wrong type is a bug in the handler (its declaration says otherwise), reported as such."""

    def __init__(self, kind: str, payload: Payload) -> None:
        self.kind = kind
        self._payload = payload

    def __getitem__(self, name: str) -> Value:
        return self._payload[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._payload)

    def __len__(self) -> int:
        return len(self._payload)

    def _get(self, name: str, types: tuple[type, ...], what: str) -> Any:
        value = self._payload[name]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise TypeError(f"{self.kind}: field {name!r} is {type(value).__name__}, read as {what}: its declaration "
                            "and its handler disagree")
        return value

    def array(self, name: str) -> np.ndarray:
        """An array field (IDs, selectors, rows, bytes)."""
        value: np.ndarray = self._get(name, (np.ndarray,), "an array")
        return value

    def names(self, name: str) -> list[str]:
        """An array of strings (party names), as a list."""
        return [str(v) for v in self.array(name).tolist()]

    def integer(self, name: str) -> int:
        return int(self._get(name, (int,), "an integer"))

    def number(self, name: str) -> float:
        return float(self._get(name, (int, float), "a number"))

    def text(self, name: str) -> str:
        return str(self._get(name, (str,), "text"))

    def flag(self, name: str) -> bool:
        return bool(self._get(name, (bool,), "a flag"))

    def table(self, name: str) -> dict[str, Any]:
        """A table of settings, as a copy of plain dicts and lists."""
        value: Table = self._get(name, (Table,), "a table")
        return value.plain()


class Reply(Fields):
    """A reply's payload, read with the type its reader expects. A field that is missing or of another type is the
    replying party's doing, not a bug here: a :class:`ProtocolError` that names the party, the kind and the field.
    """

    def __init__(self, kind: str, sender: str, payload: Payload) -> None:
        super().__init__(kind, payload)
        self.sender = sender

    def _get(self, name: str, types: tuple[type, ...], what: str) -> Any:
        if name not in self._payload:
            raise ProtocolError(f"party {self.sender!r} answered {self.kind} without {name!r}")
        value = self._payload[name]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise ProtocolError(f"party {self.sender!r} answered {self.kind} with {name!r} of type "
                                f"{type(value).__name__}, not {what}")
        return value

    def names(self, name: str) -> list[str]:
        value = self.array(name)
        if value.dtype.kind != "U":
            raise ProtocolError(f"party {self.sender!r} answered {self.kind} with {name!r} that is not a list of names")
        return [str(v) for v in value.tolist()]


def check_payload(kind: str, payload: Payload, spec: Mapping[str, FieldSpec]) -> None:
    """Raise :class:`PayloadError` unless ``payload`` has exactly the fields of ``spec``."""
    missing = [k for k in spec if k not in payload]
    extra = [k for k in payload if k not in spec]
    if missing or extra:
        raise PayloadError(
            f"message {kind!r}: fields do not match (missing {missing}, unexpected {extra}); "
            "the two parties run different vflo versions or methods"
        )
    for name, fs in spec.items():
        fs.check(kind, name, payload[name])


def expect_rows(reply: Payload, field: str, *, party: str, rows: int, width: int | None = None,
                what: str = "rows") -> np.ndarray:
    """A reply's float matrix of ``rows`` rows (and ``width`` columns where given), as float32.

    The one check every coordinator applies to what a party sends back (activations, latents,
    projections), so a party that answers with the wrong shape is named the same way everywhere.
    """
    value = reply.get(field)
    expected = f"({rows}, {'n' if width is None else width})"
    if not isinstance(value, np.ndarray) or value.dtype.kind != "f" or value.ndim != 2 or value.shape[0] != rows \
            or (width is not None and value.shape[1] != width):
        got = f"shape {value.shape} of {value.dtype}" if isinstance(value, np.ndarray) else type(value).__name__
        raise ProtocolError(f"party {party!r} sent {what} ({field!r}) as {got}, expected {expected} floats")
    return value.astype(np.float32, copy=False)
