"""vflo serve: a saved model kept live, scored over HTTP/JSON in micro-batches, each person with the partners that
hold them (or a fallback, or a refusal, as the model's policy says), checked against scoring the same people in
process with vflo.load(...).score."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from vflo.cli import main
from vflo.errors import ConfigError
from vflo.scoring import SavedModel

REPO = Path(__file__).resolve().parents[1]
HOSPITAL, LAB = REPO / "examples/data/hospital.csv", REPO / "examples/data/lab.csv"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("serve")
    assert main(["run", str(REPO / "configs/examples/own_files.toml"), "--quick", "--out", str(folder / "results"),
                 "--save", str(folder / "models")]) == 0
    return folder / "models"


def _config(tmp_path: Path, models: Path, extra: str = "") -> Path:
    path = tmp_path / "serve.toml"
    path.write_text(f'[serve]\nmodels = "{models}"\nrows = "{HOSPITAL}"\nbatch_wait_ms = 5\n\n'
                    f'[partners]\nlab = "{LAB}"\n\n{extra}')
    return path


ADMIN = "admin-" + "a" * 24


def _client(config: Path, access: Any = None) -> Any:
    from fastapi.testclient import TestClient

    from vflo.serve.app import create_app
    from vflo.serve.config import load_serve_config
    from vflo.serve.guard import Access
    from vflo.serve.server import served_from

    access = access or Access.unguarded(admin_token=ADMIN)
    return TestClient(create_app(served_from(load_serve_config(config)), access=access))


def _both() -> tuple[list[str], list[str]]:
    """People the hospital and the lab both hold, and people only the hospital holds."""
    hospital = pd.read_csv(HOSPITAL, dtype={"pid": str})["pid"]
    lab = set(pd.read_csv(LAB, dtype={"pid": str})["pid"])
    return [p for p in hospital if p in lab][:12], [p for p in hospital if p not in lab][:5]


def test_a_served_model_answers_as_scoring_in_process_does(tmp_path: Path, models: Path) -> None:
    shared, only = _both()
    config = _config(tmp_path, models, '[models.splitnn]\nmissing = "fallback"\nfallback = "local"\n\n[models.local]\n')
    with _client(config) as client:
        reply = client.post("/v1/models/splitnn:predict", json={"ids": shared + only})
        assert reply.status_code == 200, reply.text
        body = reply.json()
        model = SavedModel.load(models, "splitnn")
        assert body["version"] == model.card.model_id and body["took_ms"] > 0
        got = {p["id"]: p for p in body["predictions"]}
        assert [p["id"] for p in body["predictions"]] == shared + only  # in the request's order
        # The same people scored in process, every party's rows given, the local model for those the lab lacks.
        expected = model.score({"hospital": HOSPITAL, "lab": LAB}, missing="active_only",
                               fallback=SavedModel.load(models, "local")).set_index("pid")
        for person in shared + only:
            row = expected.loc[person]
            assert got[person]["model"] == row["model"] and "+".join(got[person]["scored_by"]) == row["scored_by"]
            assert np.allclose([got[person]["scores"][c] for c in model.score_columns],
                               row[model.score_columns].to_numpy(float), atol=1e-6)
            assert got[person]["prediction"] == row["prediction"]
        assert {got[p]["model"] for p in only} == {"local"} and {got[p]["model"] for p in shared} == {"splitnn"}
        assert client.get("/healthz").json() == {"status": "ok"}
        assert client.get("/readyz").json()["models"] == ["local", "splitnn"]
        metrics = client.get("/metrics").text
        assert 'vflo_requests_total{model="splitnn",outcome="ok"} 1.0' in metrics
        assert 'vflo_rows_total{model="splitnn",scored_by="hospital",scored_model="local"} 5.0' in metrics
        listed = client.get("/v1/models").json()["models"]
        assert [m["name"] for m in listed] == ["local", "splitnn"] and listed[1]["fallback"] == "local"
        swapped = client.put("/v1/models/splitnn", headers={"Authorization": f"Bearer {ADMIN}"})
        assert swapped.json()["version"] == model.card.model_id  # swapped in, live


def test_a_refusing_model_names_who_cannot_be_scored_and_a_new_person_comes_with_features(tmp_path: Path,
                                                                                          models: Path) -> None:
    shared, only = _both()
    with _client(_config(tmp_path, models, "[models.splitnn]\n[models.local]\n")) as client:
        refused = client.post("/v1/models/splitnn:predict", json={"ids": shared[:2] + only[:1]})
        assert refused.status_code == 422 and "1 of the 3 people asked for cannot be scored" in refused.json()["detail"]
        assert client.post("/v1/models/splitnn:predict", json={"ids": shared[:2]}).status_code == 200
        assert client.post("/v1/models/nothing:predict", json={"ids": ["x"]}).status_code == 404
        unknown = client.post("/v1/models/local:predict", json={"ids": ["P0000"]})
        assert unknown.status_code == 422 and "give their feature values" in unknown.json()["detail"]
        row = pd.read_csv(HOSPITAL, dtype={"pid": str}).drop(columns=["outcome"]).iloc[0].to_dict()
        new = {**row, "pid": "NEW1"}
        reply = client.post("/v1/models/local:predict", json={"ids": ["NEW1", row["pid"]], "features": [new]})
        assert reply.status_code == 200, reply.text
        first, second = reply.json()["predictions"]
        assert first["scores"] == second["scores"]  # the same values as the hospital's own row for that person
        assert client.post("/v1/models/local:predict", json={"ids": []}).status_code == 422


def test_requests_arriving_together_are_scored_in_one_batch() -> None:
    from vflo.serve.batcher import Batcher

    calls: list[list[object]] = []

    def score(ids: list[object], features: pd.DataFrame | None, since: float) -> list[dict[str, Any]]:
        calls.append(ids)
        return [{"id": i, "score": float(str(i)[1:])} for i in ids]

    async def run() -> list[list[dict[str, Any]]]:
        batcher = Batcher(score, id_column="id", max_people=100, max_wait=0.05)
        answers = await asyncio.gather(*(batcher.submit([f"p{i}", f"p{i + 1}"]) for i in range(10)))
        batcher.close()
        return answers

    answers = asyncio.run(run())
    assert len(calls) == 1 and len(calls[0]) == 11  # ten requests, one batch, each person once
    assert [[r["score"] for r in a] for a in answers] == [[float(i), float(i + 1)] for i in range(10)]

    async def capped() -> None:
        batcher = Batcher(score, id_column="id", max_people=4, max_wait=0.05)
        await asyncio.gather(*(batcher.submit([f"q{i}"]) for i in range(10)))
        batcher.close()

    calls.clear()
    asyncio.run(capped())
    assert [len(c) for c in calls] == [4, 4, 2]


def test_a_serve_config_is_checked_before_anything_is_served(tmp_path: Path, models: Path) -> None:
    from vflo.serve.config import load_serve_config
    from vflo.serve.server import served_from

    bad = tmp_path / "bad.toml"
    bad.write_text(f'[serve]\nmodels = "{models}"\nrows = "{HOSPITAL}"\nlisten = "8080"\n')
    with pytest.raises(ConfigError, match="serve.listen is HOST:PORT"):
        load_serve_config(bad)
    with pytest.raises(ConfigError, match="missing = 'fallback' needs fallback"):
        load_serve_config(_config(tmp_path, models, '[models.splitnn]\nmissing = "fallback"\n'))
    with pytest.raises(ConfigError, match=r"\[models\] names \['nope'\], not saved"):
        served_from(load_serve_config(_config(tmp_path, models, "[models.nope]\n")))
    with pytest.raises(ConfigError, match="cannot score a person with only the partners that"):
        served_from(load_serve_config(_config(tmp_path, models, '[models.splitnn]\nmissing = "subset"\n')))


def test_a_refused_person_fails_only_the_request_that_asked_for_them(tmp_path: Path, models: Path) -> None:
    from vflo.serve.config import load_serve_config
    from vflo.serve.server import served_from

    shared, only = _both()
    served = served_from(load_serve_config(_config(tmp_path, models, "[models.splitnn]\n")))
    batches: list[int] = []
    batcher = served.batchers["splitnn"]
    batcher.on_batch = lambda people, _: batches.append(people)

    async def together() -> list[list[dict[str, Any]]]:
        return list(await asyncio.gather(batcher.submit(shared[:3]), batcher.submit(shared[3:5] + only[:1])))

    try:
        good, bad = asyncio.run(together())
    finally:
        served.close()
    assert batches == [6]  # one batch for both requests
    assert not any("error" in r for r in good) and {r["model"] for r in good} == {"splitnn"}
    assert ["error" in r for r in bad] == [False, False, True]


def test_only_the_probes_answer_without_the_token_and_a_swap_needs_the_admin_token(tmp_path: Path,
                                                                                  models: Path) -> None:
    from vflo.serve.config import access_of, load_serve_config

    config = _config(tmp_path, models, "[models.local]\n")
    settings = load_serve_config(config).serve
    assert settings.auth == "token" and settings.token_file == str(tmp_path / "serve.token")
    access = access_of(settings)  # the token written beside the config, its owner's alone
    token_file = tmp_path / "serve.token"
    assert token_file.stat().st_mode & 0o777 == 0o600 and access.token == token_file.read_text().strip()
    assert access_of(settings).token == access.token  # read again, not replaced
    assert access.admin_token is None  # no admin token named: swaps over HTTP are off
    shared, _ = _both()
    with _client(config, access) as client:
        assert client.get("/healthz").status_code == 200 and client.get("/readyz").status_code == 200
        for call in (lambda h: client.post("/v1/models/local:predict", json={"ids": shared[:1]}, headers=h),
                     lambda h: client.get("/metrics", headers=h), lambda h: client.get("/v1/models", headers=h)):
            assert call({}).status_code == 401
            assert call({"Authorization": "Bearer " + "x" * len(access.token)}).status_code == 401
            assert call({"Authorization": f"Bearer {access.token}"}).status_code == 200
        off = client.put("/v1/models/local", headers={"Authorization": f"Bearer {access.token}"})
        assert off.status_code == 403 and "serve.admin_token_file" in off.json()["detail"]
        big = client.post("/v1/models/local:predict", content=b"{" + b" " * (5 << 20) + b"}",
                          headers={"Authorization": f"Bearer {access.token}", "Content-Type": "application/json"})
        assert big.status_code == 413 and "serve.max_request_bytes" in big.json()["detail"]


def test_a_server_reachable_from_elsewhere_needs_tls_and_a_token_file_its_owners_alone(tmp_path: Path,
                                                                                       models: Path) -> None:
    from vflo.serve.config import access_of, load_serve_config

    def config(extra: str) -> Path:
        path = tmp_path / "elsewhere.toml"
        path.write_text(f'[serve]\nmodels = "{models}"\nrows = "{HOSPITAL}"\n{extra}')
        return path

    with pytest.raises(ConfigError, match="reachable from other hosts.*serve.certificate and serve.key"):
        load_serve_config(config('listen = "0.0.0.0:8080"\n'))
    assert load_serve_config(config('listen = "[::1]:8080"\n')).serve.host == "::1"  # loopback
    named = load_serve_config(config('listen = "0.0.0.0:8080"\ninsecure_listen = true\n'))
    assert named.serve.insecure_listen  # the weaker choice, named in the config (and logged at start)
    tls = load_serve_config(config('listen = "0.0.0.0:8080"\ncertificate = "s.pem"\nkey = "s.key"\n'))
    assert tls.serve.certificate == str(tmp_path / "s.pem")
    with pytest.raises(ConfigError, match="auth = 'mtls' needs"):
        load_serve_config(config('auth = "mtls"\n'))
    with pytest.raises(ConfigError, match="serve.auth = 'basic' is not allowed"):
        load_serve_config(config('auth = "basic"\n'))
    shared = tmp_path / "shared.token"
    shared.write_text("s" * 40)
    shared.chmod(0o644)
    with pytest.raises(ConfigError, match="may be read by others.*chmod 600"):
        access_of(load_serve_config(config(f'token_file = "{shared}"\n')).serve)
    shared.chmod(0o600)
    assert access_of(load_serve_config(config(f'token_file = "{shared}"\n')).serve).token == "s" * 40
    assert access_of(load_serve_config(config('auth = "none"\n')).serve).token is None


def test_an_ab_test_sends_each_person_to_the_same_model_in_the_share_asked(tmp_path: Path, models: Path) -> None:
    shared, _ = _both()
    config = _config(tmp_path, models, '[models.splitnn]\nchallenger = "local"\nchallenger_share = 0.4\n')
    with _client(config) as client:
        listed = {m["name"]: m for m in client.get("/v1/models").json()["models"]}
        assert listed["splitnn"]["challenger"] == "local" and "local" in listed  # the challenger served too
        arms = {}
        for person in shared:
            answers = [client.post("/v1/models/splitnn:predict", json={"ids": [person]}).json() for _ in range(2)]
            assert answers[0]["served_by"] == answers[1]["served_by"]  # the same person, the same model
            assert answers[0]["predictions"][0]["model"] == answers[0]["served_by"]
            arms[person] = answers[0]["served_by"]
        assert set(arms.values()) == {"splitnn", "local"}
        metrics = client.get("/metrics").text
        challenged = sum(a == "local" for a in arms.values())
        assert f'vflo_rows_total{{model="splitnn",scored_by="hospital",scored_model="local"}} {2.0 * challenged}' \
            in metrics
        # The challenger unloaded: its share goes back to the model it was tested against.
        assert client.delete("/v1/models/local", headers={"Authorization": f"Bearer {ADMIN}"}).status_code == 200
        after = [client.post("/v1/models/splitnn:predict", json={"ids": [p]}).json()["served_by"] for p in shared]
        assert set(after) == {"splitnn"}
    from vflo.serve.app import Served

    # The share holds over many people (a hash of the model's name and the first ID).
    share = np.mean([Served.route(_StubServed(0.4), "m", [f"P{k}"]) == "c" for k in range(4000)])  # type: ignore[arg-type]
    assert abs(share - 0.4) < 0.03
    with pytest.raises(ConfigError, match="names both challenger"):
        from vflo.serve.live import ServePolicy

        ServePolicy(challenger="local")


class _StubServed:
    """What Served.route reads: model "m" with challenger "c" at ``share``, both served."""

    def __init__(self, share: float) -> None:
        from types import SimpleNamespace

        from vflo.serve.live import ServePolicy

        self.live = {"m": SimpleNamespace(policy=ServePolicy(challenger="c", challenger_share=share)),
                     "c": SimpleNamespace(policy=ServePolicy())}


def test_the_answer_cache_gives_complete_answers_again_within_their_time(tmp_path: Path, models: Path) -> None:
    from vflo.serve.cache import AnswerCache

    now = [0.0]
    cache = AnswerCache(seconds=10, people=2, clock=lambda: now[0])
    full = [{"id": "a", "scored_by": ["h", "l"]}, {"id": "b", "scored_by": ["h", "l"]}, {"id": "c", "scored_by": ["h"]}]
    cache.put("v1", full, complete=lambda r: len(r["scored_by"]) == 2)
    assert cache.get("v1", ["a", "b"]) == full[:2] and cache.get("v1", ["c"]) is None  # scored without the lab
    assert cache.get("v2", ["a"]) is None  # another version starts empty
    cache.put("v1", [{"id": "d", "scored_by": ["h", "l"]}], complete=lambda r: True)
    assert cache.get("v1", ["a"]) is None and cache.get("v1", ["d"]) is not None  # at most two people: a went
    now[0] = 10.5
    assert cache.get("v1", ["d"]) is None  # past its time

    shared, _ = _both()
    config = _config(tmp_path, models, "[models.splitnn]\ncache_seconds = 60\n")
    with _client(config) as client:
        first = client.post("/v1/models/splitnn:predict", json={"ids": shared[:2]}).json()
        again = client.post("/v1/models/splitnn:predict", json={"ids": shared[:2]}).json()
        assert again["predictions"] == first["predictions"]
        row = pd.read_csv(HOSPITAL, dtype={"pid": str}).drop(columns=["outcome"]).set_index("pid").loc[shared[0]]
        given = client.post("/v1/models/splitnn:predict",
                            json={"ids": [shared[0]], "features": [{**row.to_dict(), "pid": shared[0]}]})
        assert given.status_code == 200  # values given with the request: scored, never from the cache
        metrics = client.get("/metrics").text
        assert 'vflo_cached_total{model="splitnn"} 1.0' in metrics
        assert 'vflo_rows_total{model="splitnn",scored_by="hospital+lab",scored_model="splitnn"} 5.0' in metrics


def test_a_model_saved_again_is_swapped_in_by_the_watcher(tmp_path: Path, models: Path) -> None:
    from vflo.serve.config import load_serve_config
    from vflo.serve.server import served_from

    served = served_from(load_serve_config(_config(tmp_path, models, "[models.local]\n")))
    live = served.live["local"]
    saved = {"local": "a-newer-version"}  # what the folder's card says now
    served.on_disk = saved.get
    loads: list[str] = []
    load = served._load

    def counted(name: str) -> Any:
        loads.append(name)
        fresh = load(name)
        saved[name] = fresh.version  # the folder's version, loaded: nothing more to swap
        return fresh

    served._load = counted

    async def watched() -> None:
        task = asyncio.get_running_loop().create_task(served.watch(0.01))
        for _ in range(500):  # bounded: 5 s
            await asyncio.sleep(0.01)
            if loads:
                break
        await asyncio.sleep(0.05)
        task.cancel()

    try:
        asyncio.run(watched())
    finally:
        served.close()
    assert loads == ["local"] and served.live["local"] is not live


def test_the_grpc_api_answers_as_http_does_with_the_same_token(tmp_path: Path, models: Path) -> None:
    import threading

    import grpc

    from vflo.comm.local_ports import free_port
    from vflo.serve.config import load_serve_config
    from vflo.serve.grpc_api import LIST_MODELS, call, start_grpc
    from vflo.serve.guard import Access
    from vflo.serve.server import served_from

    address = f"127.0.0.1:{free_port()}"
    config = load_serve_config(_config(tmp_path, models, "[models.splitnn]\n"))
    config = replace(config, serve=replace(config.serve, grpc_listen=address))
    served = served_from(config)
    access = Access(token="t" * 32)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    stop = start_grpc(served, loop, config.serve, access)
    shared, only = _both()
    try:
        with grpc.insecure_channel(address) as channel:
            answer = call(channel, {"model": "splitnn", "ids": shared[:3]}, token=access.token)
            assert [p["id"] for p in answer["predictions"]] == shared[:3] and answer["version"]
            assert call(channel, {}, token=access.token, method=LIST_MODELS)["models"][0]["name"] == "splitnn"
            for body, token, code in (({"model": "splitnn", "ids": shared[:1]}, None, "UNAUTHENTICATED"),
                                      ({"model": "nope", "ids": shared[:1]}, access.token, "NOT_FOUND"),
                                      ({"model": "splitnn", "ids": only[:1]}, access.token, "INVALID_ARGUMENT"),
                                      ({"model": "splitnn"}, access.token, "INVALID_ARGUMENT")):
                with pytest.raises(grpc.RpcError) as refused:
                    call(channel, body, token=token)
                assert refused.value.code().name == code
        # The same scores as the model gives in process (and so as HTTP gives: one Served answers both).
        here = served.live["splitnn"].score_records(shared[:3])
        assert [p["scores"] for p in here] == [p["scores"] for p in answer["predictions"]]
    finally:
        stop()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
        served.close()


def test_a_deployment_serves_two_collaborative_models_at_most_and_live_rows_carry_their_encoding(
        tmp_path: Path, models: Path) -> None:
    import shutil

    from vflo.data.partydata import PartyData
    from vflo.errors import DataError
    from vflo.serve.config import load_serve_config
    from vflo.serve.live import LiveModel
    from vflo.serve.server import served_from

    # Three collaborative models (a copy of SplitNN's beside SplitNN's and RAP's): more than a deployment's
    # partners keep sessions for, two each.
    more = tmp_path / "models"
    shutil.copytree(models, more)
    shutil.copytree(more / "splitnn", more / "splitnn_b")
    deployed = tmp_path / "deployed.toml"
    deployed.write_text(f'[serve]\nmodels = "{more}"\nrows = "{HOSPITAL}"\ndeploy = "deploy.toml"\n')
    with pytest.raises(ConfigError, match=r"keep 4 scoring sessions open at once.*serve at most 2 of "
                                          r"\[.*'rap', 'splitnn', 'splitnn_b'\]"):
        served_from(load_serve_config(deployed))  # refused from the cards, before any partner is dialled
    served = served_from(load_serve_config(_config(tmp_path, models, "[models.local]\n")))
    try:
        live = served.live["local"]
        bare = PartyData(party=live.rows.party, ids=live.rows.ids, X=live.rows.X, columns=live.rows.columns)
        with pytest.raises(DataError, match="must be read from its file, with the encoding its model was trained"):
            LiveModel(live.model, live.fed, live.method, bare, policy=live.policy)
    finally:
        served.close()


def test_a_batchs_partners_must_answer_within_the_deadline_of_its_oldest_request(tmp_path: Path,
                                                                                models: Path) -> None:
    import time

    from vflo.serve.config import load_serve_config
    from vflo.serve.live import reserve
    from vflo.serve.server import served_from

    served = served_from(load_serve_config(_config(tmp_path, models,
                                                   "[models.splitnn]\ndeadline_ms = 200\n")))
    live = served.live["splitnn"]
    seen: list[float | None] = []

    class Timed:
        """The session's transport, with the absolute time a deployed one bounds each call by."""

        def __init__(self, inner: Any) -> None:
            self.inner, self.until = inner, None

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

        def request_each(self, messages: Any) -> Any:
            seen.append(self.until)
            return self.inner.request_each(messages)

        def request_many(self, messages: Any) -> Any:
            seen.append(self.until)
            return self.inner.request_many(messages)

    shared, _ = _both()
    try:
        live.fed.transport = Timed(live.fed.transport)
        arrived = time.monotonic() - 0.05  # the oldest request of the batch came 50 ms ago
        live.scored(shared[:2], since=arrived)
        assert seen and all(u == pytest.approx(arrived + 0.2 - 0.015) for u in seen)  # RESERVE: over a twentieth
        assert reserve(0.5) == 0.025 and reserve(0.02) == 0.01  # a twentieth of a long one, half of a short one
        assert live.fed.transport.until is None  # each batch its own
        seen.clear()
        live.scored(shared[:2], since=time.monotonic() - 10)  # waited past its deadline: a millisecond left
        assert seen and all(u is not None and u <= time.monotonic() + 0.001 for u in seen)
    finally:
        served.close()


def test_a_model_is_added_and_unloaded_without_stopping_with_the_admin_token(tmp_path: Path, models: Path) -> None:
    shared, _ = _both()
    admin = {"Authorization": f"Bearer {ADMIN}"}
    with _client(_config(tmp_path, models, "[models.local]\n")) as client:
        assert client.post("/v1/models/splitnn:predict", json={"ids": shared[:1]}).status_code == 404
        assert client.put("/v1/models/splitnn").status_code == 401  # an admin call
        added = client.put("/v1/models/splitnn", headers=admin)
        assert added.status_code == 200 and added.json()["version"] == SavedModel.load(models, "splitnn").card.model_id
        assert client.post("/v1/models/splitnn:predict", json={"ids": shared[:1]}).status_code == 200
        assert client.delete("/v1/models/local").status_code == 401
        assert client.delete("/v1/models/local", headers=admin).json() == {"model": "local", "unloaded": True}
        assert client.post("/v1/models/local:predict", json={"ids": shared[:1]}).status_code == 404
        assert [m["name"] for m in client.get("/v1/models").json()["models"]] == ["splitnn"]
        assert client.put("/v1/models/nothing", headers=admin).status_code == 503  # not saved: said why
