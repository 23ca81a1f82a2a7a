"""PSI by SecretFlow's library (RR22, KKRT, ECDH) over its own link: the same intersection and the same party state
as vflo's own ECDH, its bytes measured where they cross, the partner's policy obeyed, and the fallback."""

from __future__ import annotations

import socket
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import make_dataset
from vflo.align import engines, spu, spu_side
from vflo.align.engines import AlignmentConfig
from vflo.align.ids import check_unique, tagged, tagged_array
from vflo.align.link_relay import LinkRelays, LinkTLS
from vflo.align.linked import closing
from vflo.align.plain import Aligned
from vflo.comm.message import Message
from vflo.comm.pki import create_ca, make_request, sign_request
from vflo.data.scenario import PartySpec, SamplesSpec, ScenarioSpec
from vflo.errors import ConfigError, DataError, ProtocolError, RemoteError
from vflo.federation.session import Session
from vflo.federation.simulation import build_federation, run_method
from vflo.methods.registry import get_method
from vflo.party.policy import Policy

needs_library = pytest.mark.skipif(bool(spu.missing()), reason=spu.missing() or "installed")


def _layout(n_passive: int = 2, seed: int = 4, *, ids: str = "int"):  # type: ignore[no-untyped-def]
    ds = make_dataset(n=400, n_features=6)
    if ids == "text":
        ds = replace(ds, ids=np.asarray([f"person-{v:04d}" for v in ds.ids]))
    parties = (PartySpec(name="a", role="active", n_columns=2),
               *(PartySpec(name=f"p{i}", n_columns=4 // n_passive) for i in range(n_passive)))
    return ScenarioSpec(parties=parties, samples=SamplesSpec(active=300, aligned=120, passive_only=30),
                        unused_columns="drop").build(ds, seed=seed)


@needs_library
@pytest.mark.parametrize(("protocol", "mode", "n_passive"),
                         # Each intersection starts two processes: the modes and the partners in turn with one
                         # protocol, each other protocol once.
                         [("rr22", "both", 2), ("rr22", "active", 1), ("kkrt", "both", 1), ("ecdh", "both", 1)])
def test_the_library_finds_what_vflos_own_psi_finds(protocol: str, mode: str, n_passive: int) -> None:
    layout = _layout(n_passive)
    data = layout.materialize()
    passives = [f"p{i}" for i in range(n_passive)]
    found = {}
    for engine in ("vflo", protocol):
        method = get_method("local")()
        seen: list[Message] = []
        fed, nodes = build_federation(data, method, seed=0, observers=(seen.append,),
                                      alignment=AlignmentConfig(method="psi", mode=mode, engine=engine))  # type: ignore[arg-type]
        Session(fed).start(method)
        alignment = fed.align(data.train["a"].ids, passives)
        assert fed.alignment_engine == engine
        held = {p: nodes[p].context.part(Aligned).held for p in passives}  # type: ignore[union-attr]
        found[engine] = (alignment, held, fed.transport.ledger.entries)
        assert all("ids" not in m.payload for m in seen if m.kind.startswith("align."))
    (mine, mine_held, _), (theirs, theirs_held, entries) = found["vflo"], found[protocol]
    assert np.array_equal(theirs.ids, np.sort(layout.aligned_ids())) and np.array_equal(theirs.ids, mine.ids)
    assert theirs.widths == mine.widths
    for p in passives:
        assert np.array_equal(theirs.held[p], mine.held[p])
        if mode == "both":
            assert np.array_equal(theirs_held[p], mine_held[p])
        else:
            assert theirs_held[p] is None  # the partner learns nothing with mode = 'active'
    # What crossed the library's link is in the ledger, counted where it crossed, one entry per direction.
    linked = [e for e in entries if e.kind == f"align.engine.{protocol}"]
    assert [e.direction for e in linked] == ["request", "reply"] * len(passives)
    assert all(e.nbytes > 0 for e in linked)


@needs_library
def test_text_ids_and_the_partners_held_list_match_vflos_own(capfd: pytest.CaptureFixture[str]) -> None:
    layout = _layout(1, ids="text")
    data = layout.materialize()
    traces, worked = set(Path("/tmp").glob("psi_*.trace")), _library_work()
    for engine in ("vflo", "rr22"):
        method = get_method("local")()
        fed, nodes = build_federation(data, method, seed=0, alignment=AlignmentConfig(method="psi", engine=engine))  # type: ignore[arg-type]
        Session(fed).start(method)
        alignment = fed.align(data.train["a"].ids, ["p0"])
        assert alignment.ids.dtype.kind == "U" and np.array_equal(alignment.ids, np.sort(layout.aligned_ids()))
        assert np.array_equal(nodes["p0"].context.part(Aligned).held, alignment.ids)  # type: ignore[union-attr]
    # The library's log stays out of the party's output; its trace files, and its working folders (which hold the
    # party's sorted IDs), do not stay in the host's /tmp.
    out, err = capfd.readouterr()
    assert "[info]" not in out + err and not set(Path("/tmp").glob("psi_*.trace")) - traces
    assert not _library_work() - worked


def _library_work() -> set[Path]:
    """Folders in /tmp where the library sorted a party's IDs."""
    return {p.parent for p in Path(tempfile.gettempdir()).glob("*/*join_sorted_input*")}


@needs_library
def test_a_method_trains_the_same_on_either_psi() -> None:
    data = _layout(1).materialize()
    runs = [run_method(get_method("splitnn")(train={"max_epochs": 2}), data, seed=0,
                       alignment=AlignmentConfig(method="psi", engine=engine)) for engine in ("vflo", "rr22")]  # type: ignore[arg-type]
    assert np.array_equal(runs[0].scores, runs[1].scores)
    assert runs[0].psi_engine == "vflo" and runs[1].psi_engine == "rr22"


@needs_library
def test_a_partner_runs_only_the_protocols_its_policy_names_and_auto_falls_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engines, "AUTO_LIBRARY_FROM", 0)  # auto asks for the library however few the IDs
    data = _layout(1).materialize()
    for engine, expect in (("rr22", "refused"), ("auto", "vflo")):
        method = get_method("local")()
        seen: list[Message] = []
        fed, nodes = build_federation(data, method, seed=0, observers=(seen.append,),
                                      alignment=AlignmentConfig(method="psi", engine=engine))  # type: ignore[arg-type]
        nodes["p0"].policy = Policy(psi_protocols=("kkrt",))
        Session(fed).start(method)
        if expect == "refused":
            with pytest.raises(RemoteError, match=r"runs PSI by \['kkrt'\] only"):
                fed.align(data.train["a"].ids, ["p0"])
        else:
            alignment = fed.align(data.train["a"].ids, ["p0"])
            assert fed.alignment_engine == "vflo" and len(alignment.ids) == 120
        assert any(m.kind == "align.engine_open" for m in seen)  # asked, and refused


@needs_library
def test_auto_runs_the_library_from_a_size_and_vflos_own_below_it(monkeypatch: pytest.MonkeyPatch) -> None:
    data = _layout(1).materialize()
    ids = data.train["a"].ids
    for threshold, expect in ((len(ids) + 1, "vflo"), (len(ids), "rr22")):
        monkeypatch.setattr(engines, "AUTO_LIBRARY_FROM", threshold)
        method = get_method("local")()
        seen: list[Message] = []
        fed, _ = build_federation(data, method, seed=0, observers=(seen.append,),
                                  alignment=AlignmentConfig(method="psi", engine="auto"))
        Session(fed).start(method)
        assert len(fed.align(ids, ["p0"]).ids) == 120 and fed.alignment_engine == expect
        assert any(m.kind == "align.engine_open" for m in seen) == (expect == "rr22")


def test_without_the_library_a_named_protocol_is_refused_and_auto_uses_vflos_own(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spu, "missing", lambda: f"the PSI library is not installed here: {spu_side.INSTALL}")
    data = _layout(1).materialize()
    for engine in ("rr22", "auto"):
        method = get_method("local")()
        fed, _ = build_federation(data, method, seed=0, alignment=AlignmentConfig(method="psi", engine=engine))  # type: ignore[arg-type]
        Session(fed).start(method)
        if engine == "rr22":
            with pytest.raises(ConfigError, match="pip install --no-deps spu"):
                fed.align(data.train["a"].ids, ["p0"])
        else:
            assert len(fed.align(data.train["a"].ids, ["p0"]).ids) == 120 and fed.alignment_engine == "vflo"


def test_bad_engine_settings_are_refused_with_the_choices() -> None:
    with pytest.raises(ConfigError, match="choose 'vflo', 'auto', 'rr22'"):
        AlignmentConfig(method="psi", engine="rr23")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="psi_protocols names \\['rr23'\\]"):
        engines.check_policy(Policy(psi_protocols=("rr23",)))
    with pytest.raises(ConfigError, match="is not HOST:PORT"):
        Policy(psi_link="7000")


def test_the_relays_count_both_ways_and_refuse_connections_until_the_library_listens(
        caplog: pytest.LogCaptureFixture) -> None:
    """Without TLS (one process, --insecure) the relays carry plain TCP, and say that the link is unauthenticated;
    the inbound one refuses a connection until the library listens on its socket, as the library itself would."""
    with tempfile.TemporaryDirectory(prefix="vflo-psi-") as folder, caplog.at_level("WARNING"):
        relays = LinkRelays(Path(folder), listen=("127.0.0.1", 0), me="act", peer="pas", tls=None)
        with relays:
            assert "INSECURE" in caplog.text and "PSI library's link between 'act' and 'pas'" in caplog.text
            with pytest.raises(ConnectionRefusedError):  # the link dials again
                socket.create_connection(("127.0.0.1", relays.port), timeout=10)
            with socket.socket(socket.AF_UNIX) as library:
                library.bind(relays.library_socket)
                library.listen()
                echo = threading.Thread(target=_echo_twice, args=(library,))
                echo.start()
                client = _connect_when_listening(relays.port)
                with client:
                    client.sendall(b"hello")
                    echoed = b""
                    while len(echoed) < 10:
                        echoed += client.recv(100)
                echo.join(10)
            assert echoed == b"hellohello"
        assert (relays.received, relays.sent, relays.admitted) == (5, 10, 1)


def _echo_twice(library: socket.socket) -> None:
    while True:  # the relay's probe connects first, and closes
        conn, _ = library.accept()
        with conn:
            if data := conn.recv(100):
                conn.sendall(data * 2)
                return


def _connect_when_listening(port: int) -> socket.socket:
    deadline = time.monotonic() + 10
    while True:
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=10)
        except ConnectionRefusedError:
            assert time.monotonic() < deadline
            time.sleep(0.02)


def test_repeated_ids_are_a_data_error_before_the_partner_starts_on_either_engine() -> None:
    data = _layout(1).materialize()
    ids = data.train["a"].ids
    for engine in ("vflo", "rr22") if not spu.missing() else ("vflo",):
        method = get_method("local")()
        seen: list[Message] = []
        fed, _ = build_federation(data, method, seed=0, observers=(seen.append,),
                                  alignment=AlignmentConfig(method="psi", engine=engine))  # type: ignore[arg-type]
        Session(fed).start(method)
        with pytest.raises(DataError, match="list repeats some: deduplicate"):
            fed.align(np.concatenate([ids, ids[:1]]), ["p0"])
        assert not [m for m in seen if m.kind.startswith("align.")]


def test_ids_are_tagged_by_type_the_same_for_both_engines() -> None:
    assert tagged(np.array([7, 8])) == tagged(np.array([7, 8], dtype=object)) == ["i:7", "i:8"]
    assert tagged(np.array(["7"])) == tagged(np.array(["7"], dtype=object)) == ["s:7"]
    with pytest.raises(DataError, match="repeats some"):
        check_unique(tagged(np.array(["a", "b", "a"])))
    check_unique(tagged(np.array([7, "7"], dtype=object)))  # the int 7 and the text "7" are two people


@pytest.mark.parametrize("ids", [
    ["person-1", "b", "", "a longer one", "x,y", 'q"uote'],  # texts of every width, an empty one, CSV specials
    ["abc\x00d", "z"],  # a NUL inside a text is kept
    [f"u{i:05d}" for i in range(1000)],
    ["é", "plain"],  # not ASCII: tagged by the general path
])
def test_text_ids_tagged_straight_from_numpy_equal_the_tagging_both_engines_share(ids: list[str]) -> None:
    array = np.array(ids)
    assert tagged_array(array).to_pylist() == tagged(array)


def test_sorted_ids_are_checked_by_their_neighbours_and_others_by_a_hash() -> None:
    for ids in (np.array([1, 2, 2, 3]), np.array(["a", "b", "b"]), np.array([3, 1, 3]), np.array(["b", "a", "b"])):
        with pytest.raises(DataError, match="repeats some"):
            check_unique(tagged_array(ids), ids=ids)
    for ids in (np.arange(5), np.array(["a", "b", "c"]), np.array([3, 1, 2])):
        check_unique(tagged_array(ids), ids=ids)


def test_a_side_never_run_ends_its_child_and_a_refused_list_leaves_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each side's child starts with its preparation (to load the library meanwhile) and waits for its order.
    started: list[Any] = []
    start = spu.start_child
    monkeypatch.setattr(spu, "start_child", lambda *a: started.append(start(*a)) or started[-1])
    with spu.prepare(np.arange(5)) as prepared:
        folder = prepared.folder
        assert started[0].poll() is None  # waiting for an order that never comes
    assert started[0].wait(timeout=10) == 0 and not folder.exists()
    with pytest.raises(DataError, match="repeats some"):
        spu.prepare(np.array([4, 4]))
    assert started[1].wait(timeout=10) == 0
    with pytest.raises(ProtocolError, match="serve one run"):
        prepared.take_child()


def test_the_outbound_relay_says_when_the_peers_relay_listens() -> None:
    with socket.socket() as target, tempfile.TemporaryDirectory(prefix="vflo-psi-") as folder:
        target.bind(("127.0.0.1", 0))
        with LinkRelays(Path(folder), listen=("127.0.0.1", 0), me="act", peer="pas", tls=None) as relays:
            relays.connect("127.0.0.1", target.getsockname()[1])
            assert not relays.wait_listening(0.2)  # nothing listens there yet: the relay refuses too
            with socket.socket(socket.AF_UNIX) as library, pytest.raises(ConnectionRefusedError):
                library.connect(relays.dial_socket)
            target.listen()
            assert relays.wait_listening(10)
            with socket.socket(socket.AF_UNIX) as library:
                library.connect(relays.dial_socket)


def test_the_librarys_side_listens_and_dials_only_on_unix_sockets_in_its_own_folder() -> None:
    for own, peer in (("127.0.0.1:7000", "unix:{f}/p.sock"), ("unix:{f}/l.sock", "127.0.0.1:7001"),
                      ("unix:/tmp/l.sock", "unix:{f}/p.sock"), ("unix:{f}/../l.sock", "unix:{f}/p.sock")):
        with spu.prepare(np.arange(5)) as prepared:
            side = spu.Side(rank=0, own=own.format(f=prepared.folder), peer=peer.format(f=prepared.folder),
                            protocol="rr22", broadcast=True)
            with pytest.raises(ConfigError, match="may only use a Unix socket in its own folder"):
                side.run(prepared)


def test_a_socket_path_too_long_for_a_unix_socket_is_refused_with_what_to_do(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    with pytest.raises(ConfigError, match="more than the 107 a Unix socket's path may have: point TMPDIR"):
        LinkRelays(deep, listen=("127.0.0.1", 0), me="act", peer="pas", tls=None)


@needs_library
def test_a_side_that_fails_says_why_with_the_end_of_the_librarys_log() -> None:
    prepared = spu.prepare(np.arange(10))
    (prepared.folder / "l.sock").mkdir()  # where the library would listen: it cannot
    side = spu.Side(rank=0, own=f"unix:{prepared.folder}/l.sock", peer=f"unix:{prepared.folder}/p.sock",
                    protocol="rr22", broadcast=True, timeout_s=20)
    with pytest.raises(ProtocolError, match=r"(?s)ended with exit status 1 before its result.*ReceiverLoopBrpc"):
        side.run(prepared)


def test_a_side_that_never_ends_is_stopped_and_the_error_says_what_to_check(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spu, "missing", lambda: "")
    # A child that never ends, as a side whose peer never came (a closed port), stopped past its timeout.
    monkeypatch.setattr(spu, "CHILD", "import sys, time; print('waiting for the other side', flush=True); "
                                      "time.sleep(120)")
    monkeypatch.setattr(spu, "CHILD_GRACE_S", 0.0)
    started = time.monotonic()
    with spu.prepare(np.arange(5)) as prepared:
        folder = prepared.folder
        side = spu.Side(rank=0, own=f"unix:{folder}/l.sock", peer=f"unix:{folder}/p.sock", protocol="rr22",
                        broadcast=True, timeout_s=2)
        with pytest.raises(ProtocolError, match=r"(?s)did not end within 2 s.*psi_link.*engine = 'vflo'.*"
                                                r"waiting for the other side"):
            side.run(prepared)
    assert time.monotonic() - started < 30
    assert not folder.exists()  # its folder (its IDs, its log) removed all the same


def test_a_side_whose_library_aborts_after_writing_its_result_keeps_the_result(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    def aborts_after_the_result(prepared: spu.Prepared, order: dict[str, object], timeout_s: float) -> int:
        prepared.result.write_text("id\ni:2\ni:5\n")
        prepared.done.write_text("2")
        return -6  # SIGABRT in the link's teardown, after the result

    monkeypatch.setattr(spu, "missing", lambda: "")
    monkeypatch.setattr(spu, "_run_child", aborts_after_the_result)
    prepared = spu.prepare(np.arange(7))
    side = spu.Side(rank=0, own=f"unix:{prepared.folder}/l.sock", peer=f"unix:{prepared.folder}/p.sock",
                    protocol="rr22", broadcast=True)
    with caplog.at_level("WARNING", logger="vflo.align.spu"):
        assert side.run(prepared).tolist() == [False, False, True, False, False, True, False]
    assert "exited with status -6 after writing its result" in caplog.text


@needs_library
def test_both_sides_meet_over_mutual_tls_through_the_relays_whichever_starts_first(tmp_path: Path) -> None:
    """The partner starts first and dials through the relays before the active side listens (as in a deployment).
    With the relays' sockets behind Nagle's algorithm, the link's messages stalled until the timeout; a run takes
    about 4 s here (the early side is refused until the other listens, and its link dials again after 3 s), so
    the link's 10 s wait for a message fails only a stall."""
    names = ("act", "pas")
    create_ca(tmp_path / "ca", list(names))
    tls = {}
    for party in names:
        key, csr = make_request(tmp_path / party, party, hosts=["127.0.0.1"])
        sign_request(tmp_path / "ca", csr)
        tls[party] = LinkTLS(str(tmp_path / party / f"{party}.pem"), str(key), str(tmp_path / "ca" / "ca.pem"))
    for _ in range(2):
        mine_ids, theirs_ids = spu.prepare(np.arange(100, 400)), spu.prepare(np.arange(0, 300))
        with LinkRelays(mine_ids.folder, listen=("127.0.0.1", 0), me="act", peer="pas", tls=tls["act"],
                        parties=names) as inbound:
            outbound = LinkRelays(theirs_ids.folder, listen=("127.0.0.1", 0), me="pas", peer="act",
                                  tls=tls["pas"], parties=names)
            outbound.connect("127.0.0.1", inbound.port)
            partner = spu.Side(rank=1, own=outbound.own, peer=outbound.to_peer, protocol="rr22", broadcast=True,
                               timeout_s=10)
            running = spu.Running(closing(outbound, lambda side=partner, ids=theirs_ids: side.run(ids)))  # type: ignore[misc]
            time.sleep(0.3)
            inbound.connect("127.0.0.1", outbound.port)
            assert inbound.wait_listening(30)
            active = spu.Side(rank=0, own=inbound.own, peer=inbound.to_peer, protocol="rr22", broadcast=True,
                              timeout_s=10)
            mine = active.run(mine_ids)
            theirs = running.join(60)
        assert mine.sum() == theirs.sum() == 200 and mine[:200].all() and theirs[100:].all()
        # What one party's relays sent, the other's received, but for what a library still sent after the other
        # side's had closed (its goodbye, carried TRAILING_S at most: on a loaded machine it can miss that): a few
        # hundred bytes at most, never a message the run needed. Nothing was refused.
        for sent, got in ((inbound.sent, outbound.received), (outbound.sent, inbound.received)):
            assert 0 < got <= sent and sent - got < 4096, (sent, got)
        assert inbound.refused == outbound.refused == 0
