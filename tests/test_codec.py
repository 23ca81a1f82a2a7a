"""The wire format: every payload type round-trips, bad frames are refused with a reason."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from vflo.comm.codec import ALLOWED_DTYPES, decode, encode
from vflo.comm.ledger import Ledger
from vflo.comm.local import LocalTransport
from vflo.comm.message import (
    IDS,
    MAX_TABLE_DEPTH,
    SETTINGS,
    ArraySpec,
    Fields,
    Message,
    MessageError,
    Table,
    check_payload,
    floats,
)
from vflo.errors import CodecError, PayloadError

NUMERIC = sorted(ALLOWED_DTYPES)
arrays = st.sampled_from(NUMERIC).flatmap(
    lambda d: hnp.arrays(np.dtype(d), hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5))
)
string_arrays = hnp.arrays(
    np.dtype("U8"), hnp.array_shapes(min_dims=1, max_dims=2, min_side=0, max_side=4),
    # numpy strips trailing NULs; lone surrogates are not text
    elements=st.text(st.characters(exclude_characters="\x00", exclude_categories=("Cs",)), max_size=8),
)
scalars = st.one_of(
    st.integers(min_value=-(2**62), max_value=2**62), st.floats(allow_nan=True), st.text(max_size=20), st.booleans(),
)
payloads = st.dictionaries(st.text(min_size=1, max_size=10), st.one_of(arrays, string_arrays, scalars), max_size=5)


def _same(a: object, b: object) -> bool:
    if isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray)
        if a.dtype.kind == "U":
            return b.dtype.kind == "U" and a.shape == b.shape and a.tolist() == b.tolist()
        return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")
    if isinstance(a, float) and np.isnan(a):
        return isinstance(b, float) and np.isnan(b)
    return type(a) is type(b) and a == b


@settings(max_examples=150, deadline=None)
@given(payload=payloads, rnd=st.integers(0, 10**6), text=st.text(max_size=30))
def test_round_trip_every_payload_type(payload: dict[str, object], rnd: int, text: str) -> None:
    msg = Message(sender="a", receiver="b", kind=f"k.{text}", round=rnd, payload=payload)  # type: ignore[arg-type]
    back = decode(encode(msg))
    assert (back.sender, back.receiver, back.kind, back.round) == ("a", "b", msg.kind, rnd)
    assert set(back.payload) == set(payload)
    for key, value in payload.items():
        assert _same(value, back.payload[key]), key


@settings(max_examples=50, deadline=None)
@given(payload=payloads)
def test_ledger_bytes_equal_encoded_lengths(payload: dict[str, object]) -> None:
    from vflo.federation.simulation import party_node
    from vflo.roles import PartyInfo

    ledger = Ledger()
    transport = LocalTransport({"b": party_node(PartyInfo("b", "passive"), peers={"a": "active"})}, ledger=ledger)
    msg = Message(sender="a", receiver="b", kind="unknown.kind", round=1, payload=payload)  # type: ignore[arg-type]
    reply = transport.request(msg)
    assert reply.error is not None  # no method installed: the node answers with an error
    request_entry, reply_entry = ledger.entries
    assert request_entry.nbytes == len(encode(msg))
    assert reply_entry.nbytes == len(encode(reply))
    assert ledger.summary().bytes == request_entry.nbytes + reply_entry.nbytes


def test_decoded_arrays_are_writable_copies() -> None:
    original = np.arange(6, dtype=np.float32).reshape(2, 3)
    back = decode(encode(Message("a", "b", "k", 0, {"x": original})))
    x = back.payload["x"]
    assert isinstance(x, np.ndarray)
    x[0, 0] = 99
    assert original[0, 0] == 0


def test_error_messages_round_trip() -> None:
    msg = Message("a", "b", "k", 3, error=MessageError("DataError", "bad row"))
    assert decode(encode(msg)).error == MessageError("DataError", "bad row")


def test_message_over_the_size_limit_is_refused_on_both_sides() -> None:
    msg = Message("a", "b", "big", 0, {"x": np.zeros(1000, dtype=np.float64)})
    with pytest.raises(CodecError, match=r"message 'big' is \d+ bytes, over the limit of 4096 bytes; raise"):
        encode(msg, max_bytes=4096)
    frame = encode(msg)
    with pytest.raises(CodecError, match="over the limit"):
        decode(frame, max_bytes=4096)


def test_unsupported_values_are_refused() -> None:
    with pytest.raises(CodecError, match="not valid Unicode"):
        encode(Message("a", "b", "k", 0, {"x": np.array(["\ud800"])}))
    with pytest.raises(CodecError, match="dtype complex128 cannot be sent"):
        encode(Message("a", "b", "k", 0, {"x": np.zeros(2, dtype=np.complex128)}))
    with pytest.raises(CodecError, match="has type list"):
        encode(Message("a", "b", "k", 0, {"x": [1, 2]}))  # type: ignore[dict-item]


def _forge(header: dict[str, object], body: bytes = b"") -> bytes:
    head = json.dumps(header).encode()
    pad = (-(12 + len(head))) % 8
    return struct.pack("<4sB3xI", b"VFLO", 1, len(head)) + head + b"\0" * pad + body


@pytest.mark.parametrize(("frame", "reason"), [
    (b"VF", "too short"),
    (b"XXXX\x01\0\0\0\0\0\0\0", "magic"),
    (struct.pack("<4sB3xI", b"VFLO", 9, 0), "codec version 9"),
    (struct.pack("<4sB3xI", b"VFLO", 1, 500), "runs past the end"),
    (_forge({"sender": "a"}), "lacks"),
    (_forge({"sender": "a", "receiver": "b", "kind": "k", "round": 0,
             "fields": {"x": {"dtype": "object", "shape": [1], "spans": [[0, 8]]}}}, b"\0" * 8), "never sends"),
    (_forge({"sender": "a", "receiver": "b", "kind": "k", "round": 0,
             "fields": {"x": {"dtype": "float32", "shape": [3], "spans": [[0, 8]]}}}, b"\0" * 8), "needs 12"),
    (_forge({"sender": "a", "receiver": "b", "kind": "k", "round": 0,
             "fields": {"x": {"dtype": "float32", "shape": [2], "spans": [[0, 8]]}}}), "claims 2 elements"),
    (_forge({"sender": "a", "receiver": "b", "kind": "k", "round": 0,
             "fields": {"x": {"dtype": "uint8", "shape": [2], "spans": [[0, 8]]}}}, b"\0" * 4), "past the end"),
    (_forge({"sender": "a", "receiver": "b", "kind": "k", "round": 0,
             "fields": {"x": {"dtype": "float32", "shape": [-1], "spans": [[0, 8]]}}}, b"\0" * 8), "shape"),
])
def test_malformed_frames_are_refused(frame: bytes, reason: str) -> None:
    with pytest.raises(CodecError, match=reason):
        decode(frame)


def test_payload_spec_checks_dtype_shape_and_fields() -> None:
    spec = {"grad": floats(None, 4), "ids": IDS}
    good = {"grad": np.zeros((2, 4), np.float32), "ids": np.array([1, 2])}
    check_payload("k", good, spec)
    with pytest.raises(PayloadError, match="has dtype float64, expected float32 or float16"):
        check_payload("k", {**good, "grad": np.zeros((2, 4))}, spec)
    with pytest.raises(PayloadError, match=r"has shape \(2, 3\), expected \(n, 4\)"):
        check_payload("k", {**good, "grad": np.zeros((2, 3), np.float32)}, spec)
    with pytest.raises(PayloadError, match=r"missing \['ids'\]"):
        check_payload("k", {"grad": good["grad"]}, spec)
    with pytest.raises(PayloadError, match="must be an array"):
        check_payload("k", {**good, "ids": 3}, {"grad": spec["grad"], "ids": ArraySpec(("int64",), (None,))})


def test_a_header_over_its_limit_is_refused_before_it_is_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A peer's 120 MB JSON header took a party to 3.5 GB while parsing: the header's size is checked first."""
    import json as json_module

    from vflo.comm import codec

    monkeypatch.setattr(codec, "MAX_HEADER_BYTES", 1000)
    big = Message(sender="a", receiver="b", kind="k", round=0, payload={"text": "x" * 2000})
    with pytest.raises(CodecError, match="over the 1000-byte limit; send large data as arrays"):
        encode(big)
    monkeypatch.setattr(codec, "MAX_HEADER_BYTES", 10_000)
    frame = encode(big)
    monkeypatch.setattr(codec, "MAX_HEADER_BYTES", 1000)
    parsed: list[object] = []
    monkeypatch.setattr(json_module, "loads", lambda *a, **k: parsed.append(a) or {})  # must never be reached
    with pytest.raises(CodecError, match="refused before parsing"):
        decode(frame)
    assert not parsed


def test_fields_read_each_field_as_declared_and_say_when_a_handler_disagrees() -> None:
    fields = Fields("k", {"ids": np.asarray(["a", "b"]), "n": 3, "x": 2.5, "on": True, "purpose": "serve"})
    assert fields.names("ids") == ["a", "b"] and fields.integer("n") == 3 and fields.number("x") == 2.5
    assert fields.flag("on") is True and fields.text("purpose") == "serve" and dict(fields)["n"] == 3
    with pytest.raises(TypeError, match="k: field 'n' is int, read as an array: its declaration and its handler"):
        fields.array("n")
    with pytest.raises(TypeError, match="field 'on' is bool, read as an integer"):
        fields.integer("on")  # a flag is not a count, though Python's bool is an int



def _frame_with_table(table: object) -> bytes:
    """A frame whose one field claims to be a table holding ``table`` (as a peer could write it)."""
    good = encode(Message("a", "b", "control.setup", 0, {"config": Table({"x": 1})}))
    head_len = struct.unpack_from("<4sB3xI", good, 0)[2]
    header = json.loads(good[12:12 + head_len])
    header["fields"]["config"] = {"table": table}
    head = json.dumps(header).encode()
    return struct.pack("<4sB3xI", b"VFLO", 1, len(head)) + head + b"\0" * ((-(12 + len(head))) % 8)


def test_a_table_of_settings_travels_as_structure_every_number_exact() -> None:
    settings_ = {"lr": 0.1 + 0.2, "layers": [64, 32], "limit": float("inf"), "none": None, "on": True,
                 "nested": {"train": {"epochs": 3, "names": ["a", "b"], "rate": 1e-300}}}
    out = decode(encode(Message("a", "b", "control.setup", 0, {"config": Table(settings_)}))).payload["config"]
    assert isinstance(out, Table) and out.plain() == settings_
    assert Fields("control.setup", {"config": out}).table("config")["lr"] == 0.1 + 0.2  # every bit
    check_payload("control.setup", {"config": out}, {"config": SETTINGS})
    with pytest.raises(PayloadError, match="table of settings"):
        check_payload("control.setup", {"config": "{}"}, {"config": SETTINGS})  # JSON text is not a table


def test_a_table_that_is_not_settings_is_refused_at_both_ends() -> None:
    with pytest.raises(PayloadError, match="settings are text"):
        Table({"x": object()})
    deep: dict[str, object] = {}
    node = deep
    for _ in range(MAX_TABLE_DEPTH + 2):
        node["d"] = {}
        node = node["d"]  # type: ignore[assignment]  # one level further down
    with pytest.raises(PayloadError, match="nests deeper"):
        Table(deep)
    for table in ([1, 2], "{}", deep):
        with pytest.raises(CodecError, match="is not a table of settings"):
            decode(_frame_with_table(table))


def test_a_ledger_crosses_as_columns_and_a_malformed_one_is_refused() -> None:
    ledger = Ledger()
    ledger.record(round=3, sender="a", receiver="b", kind="k", direction="request", nbytes=10)
    ledger.record(round=3, sender="b", receiver="a", kind="k", direction="reply", nbytes=4, reply_to=0)
    columns = Ledger.to_columns(ledger.entries)
    sent = decode(encode(Message("b", "a", "control.ledger", 3, columns))).payload
    assert Ledger.from_columns(sent) == list(ledger.entries)
    with pytest.raises(ValueError, match="differ in length"):
        Ledger.from_columns({**columns, "ledger.kind": np.asarray(["k"])})
    with pytest.raises(ValueError, match="'request' or 'reply'"):
        Ledger.from_columns({**columns, "ledger.direction": np.asarray(["request", "sideways"])})
