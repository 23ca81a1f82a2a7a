"""The one wire format: a small JSON header followed by raw, 8-byte aligned array buffers.

Layout of a frame::

    b"VFLO" | version (u8) | 3 zero bytes | header length (u32 LE) | header (UTF-8 JSON) | pad | buffers

The header names sender, receiver, kind, round, an optional error, and each payload
field: scalars inline; tables of settings (a method's config) inline as JSON objects;
arrays as dtype, shape, offset and length into the buffer area; string arrays as UTF-8
bytes plus int64 lengths. Decoding checks everything
against the frame (magic, version, allowed dtypes, shape x itemsize = length,
bounds, size limit) and never evaluates anything: no pickle, so a frame from the
network cannot run code.
"""

from __future__ import annotations

import json
import math
import struct
from typing import Any

import numpy as np

from vflo.comm.message import Message, MessageError, Table, Value
from vflo.errors import CodecError, PayloadError

MAGIC = b"VFLO"
VERSION = 1
_PREFIX = struct.Struct("<4sB3xI")
ALIGN = 8
DEFAULT_MAX_BYTES = 256 * 1024 * 1024
#: The largest JSON header a frame may have, checked before the header is parsed: parsing JSON costs many times
#: its size in memory (a large header once took a party's memory to gigabytes), and arrays travel outside it.
MAX_HEADER_BYTES = 32 * 1024 * 1024
MAX_RUN_ID = 64

ALLOWED_DTYPES = frozenset({
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64",
})


def _pad(n: int) -> int:
    return (-n) % ALIGN


def _plan_array(arr: np.ndarray, name: str) -> tuple[dict[str, Any], list[bytes | memoryview]]:
    if arr.dtype.kind in {"U", "O"}:
        flat = [str(v) for v in arr.ravel().tolist()]
        try:
            encoded = [s.encode("utf-8") for s in flat]
        except UnicodeEncodeError as exc:
            raise CodecError(f"field {name!r}: a string is not valid Unicode text ({exc.reason})") from exc
        lengths = np.fromiter((len(b) for b in encoded), dtype="<i8", count=len(encoded))
        blob = b"".join(encoded)
        return {"str": True, "shape": list(arr.shape)}, [lengths.tobytes(), blob]
    dtype = arr.dtype.newbyteorder("<") if arr.dtype.byteorder == ">" else arr.dtype
    if dtype.name not in ALLOWED_DTYPES:
        raise CodecError(
            f"field {name!r}: dtype {arr.dtype} cannot be sent; use one of {sorted(ALLOWED_DTYPES)} or strings"
        )
    data = np.ascontiguousarray(arr, dtype=dtype.newbyteorder("<"))
    return {"dtype": dtype.name, "shape": list(arr.shape)}, [data.reshape(-1).view(np.uint8).data]


def encoded_size_limit_error(size: int, limit: int, kind: str) -> CodecError:
    return CodecError(
        f"message {kind!r} is {size} bytes, over the limit of {limit} bytes; raise max_message_bytes "
        "(config [transport]) or send the data in smaller pieces (e.g. block-diagonal masks, batches)"
    )


def encode(message: Message, *, max_bytes: int = DEFAULT_MAX_BYTES) -> bytes:
    """Serialise ``message``; a :class:`CodecError` if a value cannot be sent or the frame is too big."""
    fields: dict[str, Any] = {}
    buffers: list[bytes | memoryview] = []
    offset = 0
    for name, value in message.payload.items():
        if not isinstance(name, str):
            raise CodecError(f"payload keys must be strings, got {name!r}")
        if isinstance(value, bool | np.bool_):
            fields[name] = {"bool": bool(value)}
        elif isinstance(value, int | np.integer):
            fields[name] = {"int": int(value)}
        elif isinstance(value, float | np.floating):
            # float.hex keeps every bit, NaN and infinities included, inside plain JSON.
            fields[name] = {"float": float(value).hex()}
        elif isinstance(value, str):
            fields[name] = {"text": value}
        elif isinstance(value, Table):
            # JSON writes each float as its shortest exact form (infinities included), and reads it back the same.
            fields[name] = {"table": value.plain()}
        elif isinstance(value, np.ndarray):
            meta, parts = _plan_array(value, name)
            spans = []
            for part in parts:
                nbytes = part.nbytes if isinstance(part, memoryview) else len(part)
                spans.append([offset, nbytes])
                buffers.append(part)
                pad = _pad(nbytes)
                if pad:
                    buffers.append(b"\0" * pad)
                offset += nbytes + pad
            meta["spans"] = spans
            fields[name] = meta
        else:
            raise CodecError(
                f"field {name!r} of message {message.kind!r} has type {type(value).__name__}; payload values must "
                "be numpy arrays, int, float, str, bool or a Table of settings"
            )
    header: dict[str, Any] = {
        "sender": message.sender, "receiver": message.receiver, "kind": message.kind,
        "round": int(message.round), "fields": fields,
    }
    if message.run:
        header["run"] = message.run
    if message.error is not None:
        header["error"] = [message.error.type, message.error.message]
    head = json.dumps(header, separators=(",", ":")).encode("utf-8")
    if len(head) > MAX_HEADER_BYTES:  # the receiver would refuse it unread: say so here, naming the kind
        raise CodecError(f"{message.kind!r}: its header (text and settings) is {len(head)} bytes, over the "
                         f"{MAX_HEADER_BYTES}-byte limit; send large data as arrays")
    head_pad = _pad(_PREFIX.size + len(head))
    total = _PREFIX.size + len(head) + head_pad + offset
    if total > max_bytes:
        raise encoded_size_limit_error(total, max_bytes, message.kind)
    # Joined straight into the frame: each array's bytes copied once. Building a bytearray and then bytes of it
    # held the frame twice at once (a large PSI reply briefly took twice its size).
    frame = b"".join([_PREFIX.pack(MAGIC, VERSION, len(head)), head, b"\0" * head_pad, *buffers])
    assert len(frame) == total
    return frame


def decode(frame: bytes | bytearray | memoryview, *, max_bytes: int = DEFAULT_MAX_BYTES) -> Message:
    """Parse and check a frame; every problem is a :class:`CodecError` that says what was wrong."""
    try:
        return _decode(frame, max_bytes)
    except CodecError:
        raise
    except (ValueError, TypeError, OverflowError, MemoryError, RecursionError) as exc:
        # Every check below should catch a bad frame first; this keeps a case they miss a codec error too.
        raise CodecError(f"malformed frame: {type(exc).__name__}: {exc}") from exc


def _decode(frame: bytes | bytearray | memoryview, max_bytes: int) -> Message:
    size = len(frame)
    if size > max_bytes:
        raise encoded_size_limit_error(size, max_bytes, "<incoming>")
    if size < _PREFIX.size:
        raise CodecError(f"frame of {size} bytes is too short to be a vflo message")
    magic, version, head_len = _PREFIX.unpack_from(frame, 0)
    if magic != MAGIC:
        raise CodecError("frame does not start with the vflo magic bytes; the peer is not speaking vflo")
    if version != VERSION:
        raise CodecError(f"frame has codec version {version}, this vflo reads version {VERSION}; upgrade both sides")
    if head_len > MAX_HEADER_BYTES:
        raise CodecError(f"frame header of {head_len} bytes is over the {MAX_HEADER_BYTES}-byte limit; refused "
                         "before parsing (arrays travel outside the header; long text does not belong in a message)")
    head_end = _PREFIX.size + head_len
    if head_end > size:
        raise CodecError("frame header runs past the end of the frame")
    # One copy of the frame so decoded arrays are writable and share nothing with the sender.
    body = bytearray(frame)
    try:
        header = json.loads(bytes(body[_PREFIX.size : head_end]).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CodecError(f"frame header is not valid JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise CodecError("frame header must be a JSON object")
    base = head_end + _pad(head_end)
    area = memoryview(body)[base:]
    try:
        sender, receiver, kind = header["sender"], header["receiver"], header["kind"]
        rnd = header["round"]
        fields = header["fields"]
    except KeyError as exc:
        raise CodecError(f"frame header lacks {exc}") from exc
    if not all(isinstance(v, str) for v in (sender, receiver, kind)):
        raise CodecError("frame header: sender, receiver and kind must be text")
    if not isinstance(rnd, int) or isinstance(rnd, bool) or rnd < 0 or not isinstance(fields, dict):
        raise CodecError("frame header has a malformed round or fields entry")
    run = header.get("run", "")
    if not isinstance(run, str) or len(run) > MAX_RUN_ID:
        raise CodecError(f"frame header has a malformed run ID (text of at most {MAX_RUN_ID} characters)")
    payload: dict[str, Value] = {}
    for name, meta in fields.items():
        payload[name] = _decode_field(kind, name, meta, area)
    error = None
    if "error" in header:
        err = header["error"]
        if not (isinstance(err, list) and len(err) == 2):
            raise CodecError("frame header has a malformed error entry")
        error = MessageError(type=str(err[0]), message=str(err[1]))
    return Message(sender=sender, receiver=receiver, kind=kind, round=rnd, payload=payload, error=error, run=run)


def _span(kind: str, name: str, meta: dict[str, Any], i: int, area: memoryview) -> memoryview:
    try:
        start, length = meta["spans"][i]
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise CodecError(f"message {kind!r}: field {name!r} has a malformed buffer span") from exc
    if not (isinstance(start, int) and isinstance(length, int)) or start < 0 or length < 0:
        raise CodecError(f"message {kind!r}: field {name!r} has a malformed buffer span")
    if start + length > len(area):
        raise CodecError(f"message {kind!r}: field {name!r} points past the end of the frame")
    return area[start : start + length]


MAX_DIMS = 32
MAX_DIM = 1 << 40  # far above any real dimension, far below what would overflow an allocation's size


def _shape(kind: str, name: str, meta: dict[str, Any], area: memoryview) -> tuple[tuple[int, ...], int]:
    """The field's shape and element count, checked in Python integers before anything is allocated: no more
    elements than the frame has bytes, and no absurd dimension even in an array of zero elements."""
    shape = meta.get("shape")
    if not isinstance(shape, list) or len(shape) > MAX_DIMS or \
            not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s <= MAX_DIM for s in shape):
        raise CodecError(f"message {kind!r}: field {name!r} has a malformed shape {str(shape)[:80]}")
    count = math.prod(shape)
    if count > len(area):
        raise CodecError(f"message {kind!r}: field {name!r} claims {count} elements in a frame of {len(area)} bytes")
    return tuple(shape), count


def _decode_field(kind: str, name: str, meta: Any, area: memoryview) -> Value:
    if not isinstance(meta, dict) or not meta:
        raise CodecError(f"message {kind!r}: field {name!r} is malformed")
    if "bool" in meta:
        if not isinstance(meta["bool"], bool):
            raise CodecError(f"message {kind!r}: field {name!r} is not a boolean")
        return meta["bool"]
    if "int" in meta:
        if not isinstance(meta["int"], int) or isinstance(meta["int"], bool):
            raise CodecError(f"message {kind!r}: field {name!r} is not an integer")
        return int(meta["int"])
    if "float" in meta:
        try:
            return float.fromhex(meta["float"])
        except (TypeError, ValueError, OverflowError) as exc:
            raise CodecError(f"message {kind!r}: field {name!r} is not a float") from exc
    if "text" in meta:
        if not isinstance(meta["text"], str):
            raise CodecError(f"message {kind!r}: field {name!r} is not text")
        return meta["text"]
    if "table" in meta:
        try:
            table = meta["table"]
            if not isinstance(table, dict):
                raise ValueError("not a table")
            return Table(table)  # checked: text keys, settings only, nesting bounded
        except (ValueError, PayloadError) as exc:
            raise CodecError(f"message {kind!r}: field {name!r} is not a table of settings: {exc}") from exc
    shape, count = _shape(kind, name, meta, area)
    if meta.get("str") is True:
        lengths_buf = _span(kind, name, meta, 0, area)
        blob = bytes(_span(kind, name, meta, 1, area))
        if len(lengths_buf) != 8 * count:
            raise CodecError(f"message {kind!r}: field {name!r} has {len(lengths_buf) // 8} strings for shape {shape}")
        lengths = np.frombuffer(lengths_buf, dtype="<i8")
        if np.any(lengths < 0) or int(lengths.sum()) != len(blob):
            raise CodecError(f"message {kind!r}: field {name!r} string lengths do not match its bytes")
        ends = np.cumsum(lengths)
        try:
            strings = [blob[e - n : e].decode("utf-8") for e, n in zip(ends.tolist(), lengths.tolist(), strict=True)]
        except UnicodeDecodeError as exc:
            raise CodecError(f"message {kind!r}: field {name!r} is not valid UTF-8") from exc
        return np.asarray(strings, dtype=str).reshape(shape) if strings else np.empty(shape, dtype="<U1")
    dtype_name = meta.get("dtype")
    if not isinstance(dtype_name, str) or dtype_name not in ALLOWED_DTYPES:
        raise CodecError(f"message {kind!r}: field {name!r} has dtype {dtype_name!r}, which vflo never sends")
    dtype = np.dtype(dtype_name).newbyteorder("<")
    buf = _span(kind, name, meta, 0, area)
    if len(buf) != count * dtype.itemsize:
        raise CodecError(
            f"message {kind!r}: field {name!r} has {len(buf)} bytes but shape {shape} of {dtype_name} needs "
            f"{count * dtype.itemsize}"
        )
    arr = np.frombuffer(buf, dtype=dtype, count=count).reshape(shape)
    return arr.astype(dtype.newbyteorder("="), copy=False)
