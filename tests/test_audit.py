"""The message audit the README promises: every message of every method, in process, held to its kind's
declaration (who may send it, which fields, what they carry) and checked against the sending party's raw
training and serving features (whole rows, row subsets, single columns, float16, affine rescaling) and labels."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from tests.test_methods import data_for, quick
from vflo.align.engines import AlignmentConfig
from vflo.audit import deployable, handler_infos
from vflo.comm.message import Message
from vflo.data.layout import FederatedData
from vflo.federation.simulation import run_method
from vflo.methods.registry import get_method

ID_FIELDS = ("ids", "train_ids", "val_ids")


@dataclass
class Secrets:
    """What one party must never send: its raw feature rows and columns (training and serving), its labels."""

    X: np.ndarray
    y: np.ndarray | None
    ids: np.ndarray
    z_rows: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.z_rows = _z(self.X) if self.X.shape[1] >= 3 else np.empty((0, self.X.shape[1]))


def _z(rows: np.ndarray) -> np.ndarray:
    """Each row centred and scaled to unit norm: the same for a row and any a * row + b (a > 0)."""
    centred = rows - rows.mean(axis=1, keepdims=True)
    norm = np.linalg.norm(centred, axis=1, keepdims=True)
    return np.divide(centred, norm, out=np.zeros_like(centred), where=norm > 1e-9)


def _near(a: np.ndarray, b: np.ndarray, tol: float) -> np.ndarray:
    """For each row of ``a``, whether some row of ``b`` lies within ``tol`` (max-norm)."""
    out = np.zeros(len(a), dtype=bool)
    for start in range(0, len(a), 256):
        block = a[start:start + 256]
        out[start:start + 256] = (np.abs(block[:, None, :] - b[None, :, :]).max(axis=2) < tol).any(axis=1)
    return out


def _f16(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float64).astype(np.float16)


def leaks(message: Message, secrets: Secrets) -> list[str]:
    """Every way a field of ``message`` holds its sender's raw features or labels.

    Raw values are compared on the float16 grid (a float16 copy matches exactly; a value that is not a copy
    almost never lands on the grid point of one); a rescaled copy a * x + b by the shape of its rows (from 6
    columns on, where shapes tell rows apart) or of whole columns (sorted, either sign)."""
    found = []
    X = secrets.X
    raw_rows = {r.tobytes() for r in _f16(X)}
    raw_columns = [set(_f16(X[:, j]).tolist()) for j in range(X.shape[1])]
    for name, value in message.payload.items():
        if not isinstance(value, np.ndarray) or value.dtype.kind not in "fiu" or value.size == 0:
            continue
        v = value.astype(np.float64)
        if v.ndim == 2 and X.shape[1] and v.shape[1] == X.shape[1] and value.dtype.kind == "f":
            if any(r.tobytes() in raw_rows for r in _f16(v)):
                found.append(f"{name}: a raw feature row")
            elif X.shape[1] >= 6 and np.ptp(v, axis=1).min(initial=np.inf) > 1e-6 and \
                    _near(_z(v), secrets.z_rows, 5e-3).any():
                found.append(f"{name}: a raw feature row, rescaled")
        columns = [v] if v.ndim == 1 else list(v.T) if v.ndim == 2 else []
        for c in columns:
            if len(c) < 8 or np.ptp(c) < 1e-9 or value.dtype.kind != "f":
                continue
            grid = _f16(c).tolist()
            for j in range(X.shape[1]):
                x = X[:, j]
                if all(g in raw_columns[j] for g in grid):
                    found.append(f"{name}: values of raw column {j}")
                    break
                if len(c) == len(x):
                    zc, zx = np.sort(_z(c[None])[0]), _z(x[None])[0]
                    if min(np.abs(zc - np.sort(zx)).max(), np.abs(zc - np.sort(-zx)).max()) < 1e-3:
                        found.append(f"{name}: raw column {j}, rescaled")
                        break
        if secrets.y is not None and v.ndim in (1, 2):
            y = secrets.y.astype(np.float64)
            ids = next((message.payload[f] for f in ID_FIELDS if isinstance(message.payload.get(f), np.ndarray)), None)
            targets = [y]
            if ids is not None and len(ids) and np.isin(ids, secrets.ids).all():
                index = {k: i for i, k in enumerate(secrets.ids.tolist())}
                targets.append(y[[index[k] for k in ids.tolist()]])
            for c in ([v] if v.ndim == 1 else list(v.T)):
                if len(c) >= 8 and any(len(t) == len(c) and np.array_equal(c, t) for t in targets):
                    found.append(f"{name}: the labels")
    return found


def secrets_of(data: FederatedData) -> dict[str, Secrets]:
    out = {}
    for party, train in data.train.items():
        serve = data.serve[party]
        extra = ~np.isin(serve.ids, train.ids)
        X = np.vstack([train.X, serve.X[extra]]).astype(np.float64)
        out[party] = Secrets(X=X, y=train.y, ids=train.ids)
    return out


def audit(name: str, messages: list[Message], data: FederatedData, roles: dict[str, str]) -> list[str]:
    """Every breach of ``name``'s declarations and every leak, as readable lines (empty: all is well)."""
    infos = handler_infos(name)
    delegates = get_method(name)().delegates() if hasattr(get_method(name)(), "delegates") else frozenset()
    secrets = secrets_of(data)
    problems: list[str] = []
    open_requests: list[Message] = []
    for m in messages:
        top = open_requests[-1] if open_requests else None
        is_reply = top is not None and (m.sender, m.receiver, m.kind) == (top.receiver, top.sender, top.kind)
        where = f"{name}: {m.kind} {'reply' if is_reply else 'request'} {m.sender} -> {m.receiver}"
        info = infos.get(m.kind)
        if info is None:
            problems.append(f"{where}: no declaration")
            continue
        if is_reply:
            open_requests.pop()
            if m.error is None and (stray := set(m.payload) - set(info.replies)):
                problems.append(f"{where}: undeclared reply fields {sorted(stray)}")
        else:
            open_requests.append(m)
            if stray := set(m.payload) - set(info.accepts):
                problems.append(f"{where}: undeclared request fields {sorted(stray)}")
            role = roles[m.sender]
            allowed = ("coordinator" in info.senders and role == "active") or role in info.senders or \
                ("delegate" in info.senders and m.sender in delegates)
            if not allowed:
                problems.append(f"{where}: a {role} party may not send it (declared: {info.senders})")
        if m.sender in secrets:
            problems += [f"{where}: {leak}" for leak in leaks(m, secrets[m.sender])]
    return problems


def observed(name: str, alignment: AlignmentConfig | None = None) -> tuple[list[Message], FederatedData, dict]:
    data = data_for(name)
    method = quick(name)
    roles = {p.name: p.role for p in (*data.parties, *method.extra_parties(data.parties))}
    seen: list[Message] = []
    run_method(method, data, seed=0, observers=(seen.append,), alignment=alignment)
    return seen, data, roles


def test_the_audit_finds_every_kind_of_leak() -> None:
    """The checks above can fail: a message carrying each kind of leak is caught."""
    _, data, roles = observed("splitnn")
    secrets = secrets_of(data)["pas"]
    X, rng = secrets.X, np.random.default_rng(0)
    rows = rng.permutation(len(X))[:20]
    planted = {
        "a raw feature row": X[rows].astype(np.float32),
        "a raw feature row, rescaled": 3.0 * X[rows] + 1.5,
        "values of raw column": X[rows, 2].astype(np.float16),
        "raw column 1, rescaled": -2.0 * X[:, 1] + 7.0,
    }
    for what, value in planted.items():
        found = leaks(Message("pas", "act", "splitnn.forward", 1, {"acts": value}), secrets)
        assert any(what in f for f in found), (what, found)
    labels = data.train["act"].y
    act = secrets_of(data)["act"]
    ids = data.train["act"].ids[5:25]
    index = {k: i for i, k in enumerate(act.ids.tolist())}
    found = leaks(Message("act", "pas", "splitnn.init", 1, {"train_ids": ids,
                                                            "val_ids": labels[[index[k] for k in ids.tolist()]]}), act)
    assert any("the labels" in f for f in found)
    honest = leaks(Message("pas", "act", "splitnn.forward", 1, {"acts": rng.normal(size=(20, X.shape[1]))}), secrets)
    assert honest == []
    # And the declarations: an undeclared field, a kind nobody declared, a sender outside the declared roles.
    forged = [Message("pas", "act", "split.activations", 1, {"ids": ids}),
              Message("server", "pas", "svd.project", 1, {"ids": ids}),
              Message("act", "pas", "no.such", 1, {})]
    problems = audit("fedsvd", forged, data_for("fedsvd"), {**roles, "server": "server"})
    assert any("may not send it" in p for p in problems) and any("no declaration" in p for p in problems)


def test_the_security_page_shows_the_declarations_of_this_code() -> None:
    from pathlib import Path

    from vflo.audit import markdown

    text = (Path(__file__).resolve().parents[1] / "docs" / "security.md").read_text()
    shown = text[text.index("<!-- messages:begin -->") + len("<!-- messages:begin -->"):
                 text.index("<!-- messages:end -->")].strip()
    assert shown == markdown(), "regenerate the table in docs/security.md: vflo methods --messages --markdown"


def test_every_kind_says_when_it_is_served() -> None:
    from vflo.audit import declarations

    assert all(d.served.strip() for d in declarations())  # @handles requires it; control kinds state it too


@pytest.mark.parametrize("name", [m for m in deployable() if get_method(m).own_settings])
def test_the_audit_holds_on_settings_an_adversary_proposes(name: str) -> None:
    """The coordinator proposes what the issue's attacker picked for every setting a passive party decides
    (a layer as wide as the features, lr 1e-30, no condition bound); the parties' configs set their own side as
    the honest experiment does. Every message still keeps to its declaration and carries nothing raw."""
    from tests.test_own_settings import adversarial

    data = data_for(name)
    honest = quick(name)
    attack = adversarial(name, honest, data.train[data.parties[1].name].n_features)
    roles = {p.name: p.role for p in (*data.parties, *attack.extra_parties(data.parties))}
    seen: list[Message] = []
    run_method(attack, data, seed=0, observers=(seen.append,), party_config=honest)
    assert seen and audit(name, seen, data, roles) == []
