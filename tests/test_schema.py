from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import pytest

from vflo import schema
from vflo.errors import ConfigError, did_you_mean


@dataclass(frozen=True, kw_only=True)
class Inner:
    lr: float = 0.1
    sizes: tuple[int, ...] = (1,)


@dataclass(frozen=True, kw_only=True)
class Outer:
    name: str
    mode: Literal["a", "b"] = "a"
    count: int | float = 1
    inner: Inner = field(default_factory=Inner)
    maybe: int | None = None


def test_build_converts_lists_tables_and_keeps_int_vs_float() -> None:
    out = schema.build(Outer, {"name": "x", "count": 3, "inner": {"lr": 1, "sizes": [4, 5]}})
    assert out.inner == Inner(lr=1.0, sizes=(4, 5))
    assert out.count == 3 and isinstance(out.count, int)
    assert schema.build(Outer, {"name": "x", "count": 0.5}).count == 0.5


def test_unknown_key_names_the_path_and_suggests() -> None:
    with pytest.raises(ConfigError, match=r"unknown key 'inner.lrr' \(did you mean 'lr'\?\)"):
        schema.build(Outer, {"name": "x", "inner": {"lrr": 1}})


def test_wrong_types_and_literals_are_explained() -> None:
    with pytest.raises(ConfigError, match="inner.sizes\\[1\\] must be an integer"):
        schema.build(Outer, {"name": "x", "inner": {"sizes": [1, "two"]}})
    with pytest.raises(ConfigError, match="mode = 'c' is not allowed; choose one of 'a' or 'b'"):
        schema.build(Outer, {"name": "x", "mode": "c"})
    with pytest.raises(ConfigError, match="missing required key"):
        schema.build(Outer, {})
    with pytest.raises(ConfigError, match="lr must be a number, got True"):
        schema.build(Inner, {"lr": True})


def test_round_trip_through_plain_values() -> None:
    out = schema.build(Outer, {"name": "x", "inner": {"sizes": [2]}})
    assert schema.build(Outer, schema.to_plain(out)) == out


def test_did_you_mean() -> None:
    assert did_you_mean("splitn", ["splitnn", "local"]) == " (did you mean 'splitnn'?)"
    assert did_you_mean("zzz", ["splitnn"]) == ""
