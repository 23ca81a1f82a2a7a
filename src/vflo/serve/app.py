"""``vflo serve``'s HTTP/JSON API (FastAPI on uvicorn): a prediction for one or more people, with whichever
partners answer in time, in milliseconds.

    POST /v1/models/{name}:predict   {"ids": [...], "features": [{...}, ...]}  ->  each person's scores, class,
                                     model and scored_by; the model that answered (served_by: the model or its
                                     A/B challenger) and its version; the time taken
    GET  /v1/models                  what is served, each model's version and policy
    PUT  /v1/models/{name}           load the model saved under that name (again: a new version, swapped in
                                     without stopping; the old session is closed once no batch uses it)
    DELETE /v1/models/{name}         stop serving it (the requests it holds answered first)
    GET  /healthz                    the process answers
    GET  /readyz                     every served model's session is open and no partner has left it
    GET  /metrics                    Prometheus: requests, latency, batch sizes, fallbacks, partners absent

The same answers over gRPC: :mod:`vflo.serve.grpc_api`. A model saved again is swapped in by :meth:`Served.watch`;
answers scored with every partner may be given again from :mod:`vflo.serve.cache`. Every route but the two probes
needs the serve token (``Authorization: Bearer``), and a swap the admin token
(:mod:`vflo.serve.guard`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections import Counter as Tally
from collections.abc import AsyncIterator, Callable
from typing import Any

import pandas as pd
from fastapi import FastAPI, HTTPException
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, Field

from vflo.errors import VfloError
from vflo.serve.batcher import Batcher
from vflo.serve.cache import AnswerCache
from vflo.serve.guard import Access, Guard
from vflo.serve.live import LiveModel

logger = logging.getLogger(__name__)


class Served:
    """The models a server holds, each with its micro-batcher; ``load(name)`` makes a model live (again)."""

    def __init__(self, load: Callable[[str], LiveModel], names: list[str], *, max_people: int,
                 max_wait: float, on_disk: Callable[[str], str | None] | None = None,
                 admit: Callable[[str, list[str]], None] | None = None) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self._load: Callable[[str], LiveModel] = lambda name: self._wired(name, load(name))
        # Raises where a model may not join those served now (more collaborative models than partners keep).
        self.admit = admit
        self.max_people, self.max_wait = max_people, max_wait
        # The version saved under a name now (its card's model ID; None while it cannot be read): the watcher's.
        self.on_disk = on_disk
        self.registry = CollectorRegistry()
        self.requests = Counter("vflo_requests", "prediction requests answered, by model and outcome",
                                ["model", "outcome"], registry=self.registry)
        self.latency = Histogram("vflo_request_seconds", "time from a request's arrival to its answer",
                                 ["model"], registry=self.registry,
                                 buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0))
        self.batches = Histogram("vflo_batch_people", "people scored together in one batch", ["model"],
                                 registry=self.registry, buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512))
        self.rows = Counter("vflo_rows", "people scored, by model, the model that scored them and who scored "
                            "with it", ["model", "scored_model", "scored_by"], registry=self.registry)
        self.live: dict[str, LiveModel] = {}
        self.batchers: dict[str, Batcher] = {}
        self.swaps = Counter("vflo_swaps", "model versions swapped in without stopping", ["model"],
                             registry=self.registry)
        self.cached = Counter("vflo_cached", "requests answered from the answer cache", ["model"],
                              registry=self.registry)
        self.caches: dict[str, AnswerCache] = {}
        self.absences = Counter("vflo_partner_absent", "partners left out of a batch, by model, partner and why "
                                "(DeliveryTimeoutError: past the deadline; TransportError: unreachable; "
                                "RemoteError: it refused)", ["model", "partner", "why"], registry=self.registry)
        for name in names:
            self.install(name)

    def _wired(self, name: str, live: LiveModel) -> LiveModel:
        """``live`` telling the metrics of each partner it leaves out."""
        def missed(party: str, why: Exception | str) -> None:
            self.absences.labels(name, party, type(why).__name__ if isinstance(why, Exception) else "absent").inc()

        live.on_missed = missed
        return live

    def _batcher(self, name: str, score: Callable[..., Any], id_column: str,
                 ready: asyncio.Event | None = None) -> Batcher:
        return Batcher(score, id_column=id_column, max_people=self.max_people, max_wait=self.max_wait,
                       on_batch=lambda people, _: self.batches.labels(name).observe(people), ready=ready)

    def install(self, name: str) -> LiveModel:
        """Model ``name`` loaded and served (at start, before any request)."""
        return self._serving(name, self._load(name))

    def _serving(self, name: str, live: LiveModel) -> LiveModel:
        self.live[name] = live
        self.batchers[name] = self._batcher(name, live.score_records, live.encoding.id_column)
        if live.policy.cache_seconds > 0:
            self.caches[name] = AnswerCache(seconds=live.policy.cache_seconds, people=live.policy.cache_people)
        logger.info("serving %s version %s (%s)", name, live.version, live.policy)
        return live

    def require(self, name: str) -> None:
        """Refuse a call for a model this server does not serve (404)."""
        if name not in self.live:
            raise ServeError(404, f"no model {name!r} is served here; served: {sorted(self.live)}")

    def route(self, name: str, ids: list[object]) -> str:
        """Which model answers a request for ``name``: its challenger where the request's first person falls in the
        challenger's share (the same person, the same model), else ``name``."""
        policy = self.live[name].policy
        if policy.challenger is None or policy.challenger not in self.live or not ids:  # unloaded: the model alone
            return name
        place = hashlib.blake2b(f"{name}\0{ids[0]}".encode(), digest_size=8).digest()
        return policy.challenger if int.from_bytes(place, "big") / 2**64 < policy.challenger_share else name

    async def answer(self, name: str, ids: list[object], features: list[dict[str, Any]] | None) -> dict[str, Any]:
        """A prediction request answered, as the API gives it (HTTP and gRPC alike); :class:`ServeError` says why
        not, with the HTTP status it maps to."""
        self.require(name)
        started = time.perf_counter()
        label = self.route(name, ids)
        live = self.live[label]
        frame = pd.DataFrame(features) if features else None
        if frame is not None and live.encoding.id_column not in frame:
            self.requests.labels(name, "bad_request").inc()
            raise ServeError(422, f"each entry of 'features' needs the ID column {live.encoding.id_column!r}")
        cache = self.caches.get(label) if frame is None else None
        records = cache.get(live.version, ids) if cache is not None else None
        if records is not None:
            self.cached.labels(name).inc()
        else:
            try:
                live.check(ids, frame)
            except VfloError as exc:
                self.requests.labels(name, "bad_request").inc()
                raise ServeError(422, f"{type(exc).__name__}: {exc}") from exc
            try:
                records = await self.batchers[label].submit(ids, frame)
            except VfloError as exc:  # a partner's failure: the whole batch's, said to each request in it
                self.requests.labels(name, "failed").inc()
                raise ServeError(503, f"{type(exc).__name__}: {exc}") from exc
            if cache is not None:
                everyone = len(live.model.card_partners()) + 1
                cache.put(live.version, records, complete=lambda r: len(r["scored_by"]) == everyone)
        refused = [r for r in records if r.get("error")]
        if refused:
            self.requests.labels(name, "refused").inc()
            raise ServeError(422, f"{len(refused)} of the {len(records)} people asked for cannot be scored (e.g. "
                                  f"{[r['id'] for r in refused[:3]]}): {refused[0]['error']}")
        took = time.perf_counter() - started
        self.requests.labels(name, "ok").inc()
        self.latency.labels(name).observe(took)
        for (model, by), count in Tally((r["model"], "+".join(r["scored_by"])) for r in records).items():
            self.rows.labels(name, model, by).inc(count)
        version = records[0]["version"] if records else live.version  # the version that scored it (one batch)
        return {"model": name, "served_by": label, "version": version,
                "predictions": [{k: v for k, v in r.items() if k != "version"} for r in records],
                "took_ms": round(took * 1000, 3)}

    def listing(self) -> dict[str, Any]:
        """What is served: each model's version and policy."""
        return {"models": [{"name": n, "version": m.version, "method": m.model.card.method,
                            "missing": m.policy.missing, "fallback": m.policy.fallback,
                            "deadline_ms": m.policy.deadline_ms, "challenger": m.policy.challenger,
                            "challenger_share": m.policy.challenger_share,
                            "cache_seconds": m.policy.cache_seconds} for n, m in sorted(self.live.items())]}

    async def watch(self, every: float) -> None:
        """Swap in each model saved again under its name (its card names another version), checking every
        ``every`` seconds; a version that does not load is logged, and the one live keeps answering."""
        if self.on_disk is None:
            return
        while True:
            await asyncio.sleep(every)
            for name in list(self.live):
                saved = await asyncio.get_running_loop().run_in_executor(None, self.on_disk, name)
                if saved is None or saved == self.live[name].version:
                    continue
                logger.info("%s was saved again (version %s): swapping it in", name, saved)
                try:
                    await self.reload(name)
                except Exception:  # the model live before keeps answering; logged by reload
                    continue

    async def reload(self, name: str) -> LiveModel:
        """Model ``name`` loaded again and swapped in without losing a request: new requests queue for the new
        version while the old one answers those it holds; then its session is closed (partners hold one at a
        time) and the new one opened. If that fails, the model is loaded from its folder once more (for the
        requests queued meanwhile) and the failure raised."""
        old_live, old_batcher = self.live[name], self.batchers[name]
        ready, holder = asyncio.Event(), [old_live]
        # Late-bound: the batcher scores with whichever version is live when its first batch runs.
        self.batchers[name] = self._batcher(
            name, lambda ids, features, since: holder[0].score_records(ids, features, since),  # noqa: PLW0108
            old_live.encoding.id_column, ready)
        await old_batcher.drain()
        old_batcher.close()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, old_live.close)
        try:
            live = await loop.run_in_executor(None, self._load, name)
        except Exception:
            logger.exception("%s: the new version could not be loaded; loading the model once more", name)
            holder[0] = self.live[name] = await loop.run_in_executor(None, self._load, name)
            ready.set()
            raise
        holder[0] = self.live[name] = live
        ready.set()
        self.swaps.labels(name).inc()
        logger.info("swapped %s to version %s (was %s)", name, live.version, old_live.version)
        return live

    async def unload(self, name: str) -> None:
        """Model ``name`` no longer served: the requests it holds answered, then its session closed."""
        batcher = self.batchers.pop(name)
        live = self.live.pop(name)
        self.caches.pop(name, None)
        await batcher.drain()
        batcher.close()
        await asyncio.get_running_loop().run_in_executor(None, live.close)
        logger.info("unloaded %s (version %s)", name, live.version)

    async def add(self, name: str) -> LiveModel:
        """Model ``name``, saved but not served, loaded and served (its session opened) without stopping."""
        if self.admit is not None:
            self.admit(name, list(self.live))
        live = await asyncio.get_running_loop().run_in_executor(None, self._load, name)
        return self._serving(name, live)

    def close(self) -> None:
        for batcher in self.batchers.values():
            batcher.close()
        for live in self.live.values():
            live.close()


class ServeError(VfloError):
    """A request the server does not answer, with the HTTP status it maps to."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status, self.detail = status, detail


class PredictRequest(BaseModel):
    """A prediction request: the people to score (at most 10,000), and the active party's feature values for
    people not in its table (each with its ID column; at most 10,000)."""

    ids: list[int | str] = Field(min_length=1, max_length=10_000)
    features: list[dict[str, Any]] | None = Field(default=None, max_length=10_000)


def create_app(served: Served, *, access: Access, watch_seconds: float = 0.0,
               on_start: Callable[[asyncio.AbstractEventLoop], Callable[[], None]] | None = None) -> FastAPI:
    """The FastAPI application over ``served``, its calls checked by ``access`` (:class:`vflo.serve.guard.Guard`);
    ``watch_seconds``: how often the models folder is checked for models saved again (0: never); ``on_start``:
    called with the server's event loop once it runs (the gRPC API starts there), returning what stops it."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        watcher = asyncio.get_running_loop().create_task(served.watch(watch_seconds)) if watch_seconds > 0 else None
        stop = on_start(asyncio.get_running_loop()) if on_start is not None else None
        try:
            yield
        finally:
            if watcher is not None:
                watcher.cancel()
            if stop is not None:
                stop()

    app = FastAPI(title="vflo serve", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.add_middleware(Guard, access=access)

    @app.post("/v1/models/{name}:predict")
    async def predict(name: str, request: PredictRequest) -> dict[str, Any]:
        try:
            return await served.answer(name, list(request.ids), request.features)
        except ServeError as exc:
            raise HTTPException(exc.status, exc.detail) from exc

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return served.listing()

    @app.put("/v1/models/{name}")
    async def reload(name: str) -> dict[str, Any]:
        try:
            live = await (served.reload(name) if name in served.live else served.add(name))
        except VfloError as exc:
            raise HTTPException(503, f"{name} was not loaded: {exc}") from exc
        return {"model": name, "version": live.version}

    @app.delete("/v1/models/{name}")
    async def unload(name: str) -> dict[str, Any]:
        try:
            served.require(name)
        except ServeError as exc:
            raise HTTPException(exc.status, exc.detail) from exc
        await served.unload(name)
        return {"model": name, "unloaded": True}

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> dict[str, Any]:
        absent = {n: sorted(m.fed.absent) for n, m in served.live.items() if m.fed is not None and m.fed.absent}
        if absent:
            raise HTTPException(503, f"partners left the scoring session: {absent}")
        return {"status": "ready", "models": sorted(served.live)}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return PlainTextResponse(generate_latest(served.registry).decode(), media_type=CONTENT_TYPE_LATEST)

    return app
