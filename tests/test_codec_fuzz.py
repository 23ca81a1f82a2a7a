"""Malformed frames, made by mutating real frames of every message kind every method sends: decoding either
gives a message or raises CodecError, nothing else (no ValueError, OverflowError or allocation of a claimed
size); and over gRPC a malformed frame is answered with a protocol error that names the party."""

from __future__ import annotations

import contextlib
import json
import struct
from functools import cache

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.test_methods import data_for, quick
from vflo.align.engines import AlignmentConfig
from vflo.comm.codec import _PREFIX, _decode, decode, encode
from vflo.comm.message import Message
from vflo.errors import CodecError
from vflo.federation.simulation import run_method
from vflo.methods.registry import get_method, method_names


@cache
def real_frames() -> tuple[bytes, ...]:
    """One request and one reply frame of every message kind of every deployable method, as they crossed."""
    frames: dict[tuple[str, bool], bytes] = {}
    for name in method_names():
        if get_method(name).simulation_only:
            continue

        def keep(message: Message) -> None:
            key = (message.kind, bool(message.payload) and "acts" in message.payload)
            if key not in frames and len(encode(message)) < 200_000:
                frames[key] = encode(message)

        run_method(quick(name), data_for(name), seed=0, observers=(keep,))
    run_method(quick("splitnn"), data_for("splitnn"), seed=0, observers=(keep,),
               alignment=AlignmentConfig(method="psi"))
    return tuple(frames.values())


def header_of(frame: bytes) -> dict[str, object]:
    _, _, n = _PREFIX.unpack_from(frame, 0)
    return json.loads(frame[_PREFIX.size:_PREFIX.size + n])  # type: ignore[no-any-return]


def with_header(frame: bytes, header: dict[str, object]) -> bytes:
    """``frame`` with its header replaced, buffers kept in place (aligned as the codec expects)."""
    _, _, n = _PREFIX.unpack_from(frame, 0)
    old_base = _PREFIX.size + n + (-(_PREFIX.size + n)) % 8
    head = json.dumps(header).encode()
    base = _PREFIX.size + len(head) + (-(_PREFIX.size + len(head))) % 8
    out = bytearray(base) + frame[old_base:]
    struct.pack_into("<4sB3xI", out, 0, b"VFLO", 1, len(head))
    out[_PREFIX.size:_PREFIX.size + len(head)] = head
    return bytes(out)


def decodes_or_refuses(frame: bytes) -> None:
    """The checks themselves must catch it: the decoder's last-resort conversion of other errors is off."""
    with contextlib.suppress(CodecError):
        _decode(frame, 1 << 24)


def test_there_are_frames_of_every_kind() -> None:
    kinds = {decode(f).kind for f in real_frames()}
    assert {"control.setup", "split.backward", "svd.masks", "rap.train", "align.psi", "ea.forward"} <= kinds


WEIRD = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
                  st.floats(allow_nan=True), st.text(max_size=5),
                  st.lists(st.integers(min_value=-(2**64), max_value=2**64), max_size=6),
                  st.dictionaries(st.text(max_size=4), st.integers(), max_size=2))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_mutated_headers_only_raise_codec_errors(data: st.DataObject) -> None:
    frame = data.draw(st.sampled_from(real_frames()))
    header = header_of(frame)
    fields = header["fields"]
    assert isinstance(fields, dict)
    target = data.draw(st.sampled_from(["round", "sender", "kind", "field", "field_key", "error"]))
    if target == "field" and fields:
        name = data.draw(st.sampled_from(sorted(fields)))
        meta = dict(fields[name])
        key = data.draw(st.sampled_from([*sorted(meta), "shape", "dtype", "spans", "str", "int"]))
        meta[key] = data.draw(WEIRD)
        fields[name] = meta
    elif target == "field_key" and fields:
        name = data.draw(st.sampled_from(sorted(fields)))
        fields[name] = data.draw(WEIRD)
    else:
        header[target] = data.draw(WEIRD)
    decodes_or_refuses(with_header(frame, header))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_mutated_bytes_only_raise_codec_errors(data: st.DataObject) -> None:
    frame = bytearray(data.draw(st.sampled_from(real_frames())))
    how = data.draw(st.sampled_from(["flip", "truncate", "insert", "shape"]))
    if how == "flip":
        for _ in range(data.draw(st.integers(1, 8))):
            frame[data.draw(st.integers(0, len(frame) - 1))] = data.draw(st.integers(0, 255))
    elif how == "truncate":
        frame = frame[: data.draw(st.integers(0, len(frame) - 1))]
    elif how == "insert":
        at = data.draw(st.integers(0, len(frame)))
        frame[at:at] = data.draw(st.binary(min_size=1, max_size=16))
    else:  # huge or negative dimensions, the overflow the issue found
        header = header_of(bytes(frame))
        arrays = [n for n, m in header["fields"].items() if "shape" in m]  # type: ignore[union-attr]
        if not arrays:
            return
        name = data.draw(st.sampled_from(arrays))
        header["fields"][name]["shape"] = data.draw(  # type: ignore[index]
            st.lists(st.integers(min_value=-5, max_value=2**66), min_size=0, max_size=40))
        frame = bytearray(with_header(bytes(frame), header))
    decodes_or_refuses(bytes(frame))


@pytest.mark.parametrize(("shape", "why"), [
    ([2**62, 2**62], "malformed shape"), ([0, 2**63], "malformed shape"), ([-1, 4], "malformed shape"),
    ([3, 10**6], "claims"), ([True, 2], "malformed shape"),
])
def test_crafted_shapes_are_refused_before_allocation(shape: list[object], why: str) -> None:
    frame = encode(Message("a", "b", "k", 1, {"x": np.zeros((2, 2), np.float32)}))
    header = header_of(frame)
    header["fields"]["x"]["shape"] = shape  # type: ignore[index]
    with pytest.raises(CodecError, match=why):
        decode(with_header(frame, header))


@pytest.mark.parametrize("bad", [{"round": True}, {"round": -1}, {"sender": 5}, {"round": 1.5}])
def test_header_values_of_the_wrong_type_are_refused(bad: dict[str, object]) -> None:
    frame = encode(Message("a", "b", "k", 1, {"n": 1}))
    with pytest.raises(CodecError, match="malformed round|must be text"):
        decode(with_header(frame, {**header_of(frame), **bad}))
    flag = header_of(frame)
    flag["fields"] = {"n": {"int": True}}
    with pytest.raises(CodecError, match="not an integer"):
        decode(with_header(frame, flag))
