"""A saved model kept loaded for online scoring: its scoring session open at every partner for as long as it is
served, the active party's own feature table in memory, and one call that scores a batch of people.

A batch is scored as ``vflo predict`` scores rows (:func:`vflo.scoring.combine`): with the partners that hold
each person and answer within the deadline where the method can do without some (``missing = "subset"``), with an
active-only model saved beside it for the people the partners cannot score (``"fallback"``), or refused with the
reason (``"refuse"``). People the active party does not hold can be scored from feature values the request
carries, read with the encoding the model was trained with.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pandas as pd

from vflo.data.partydata import PartyData
from vflo.errors import ConfigError, DataError, RemoteError, TransportError
from vflo.federation.coordinator import Coordinator
from vflo.methods.base import Method
from vflo.scoring import SavedModel, Scored, score_rows

logger = logging.getLogger(__name__)

#: What a model does with people its partners cannot score in time: the any-subset rule, a fallback, a refusal.
Missing = Literal["subset", "fallback", "refuse"]
#: How a policy's ``missing`` reads for a scoring session and :func:`vflo.scoring.combine` (the fallback model scores
#: the people the partners cannot).
SESSION_MISSING: dict[str, Literal["subset", "active_only", "refuse"]] = {
    "subset": "subset", "fallback": "active_only", "refuse": "refuse"}
#: The ``model`` of a person a refusing model did not score.
REFUSED = "(refused)"
#: Seconds a partner that missed its deadline is left out of the next batches before it is asked again.
RESTING = 1.0
#: Seconds of a request's deadline kept for what follows a partner that did not answer in time (the other
#: partners' turns, scoring without it, the answer's way back, and the batch queued behind it; measured by python -m
#: benchmarks.serving, docs/deploy.md), at least; a twentieth of a longer deadline, at most half of a short one.
RESERVE = 0.015


def reserve(deadline: float) -> float:
    """Seconds of a ``deadline`` (seconds) kept for what follows a partner that did not answer in time."""
    return min(max(RESERVE, deadline / 20), deadline / 2)


@dataclass(frozen=True, kw_only=True)
class ServePolicy:
    """How one served model answers (``[models.NAME]`` in the serve config).

    ``missing``: ``"subset"`` scores each person with the partners that hold them and answer within the deadline
    (a model trained to do without partners: LASER-VFL, SecureBoost, SplitNN with party dropout); ``"fallback"``
    scores the people the partners cannot with the active-only model ``fallback`` saved beside it; ``"refuse"``
    answers those people with an error. ``deadline_ms``: how long a partner may take to answer a batch (a request
    may ask for less).

    ``challenger`` and ``challenger_share``: another saved model (a new version, or another method) answering
    that share of the requests for this one, an A/B test: a request goes to it when its first person's place
    (a hash of the model's name and the ID) falls in the share, so a person keeps seeing the same one.
    ``cache_seconds``: how long a person's answer, scored with every partner, is given again without asking the
    partners (0, the default: never); ``cache_people``: the most people it keeps (the oldest go first). A
    request that brings its own feature values is never answered from the cache."""

    missing: Missing = "refuse"
    fallback: str | None = None
    deadline_ms: float = 100.0
    challenger: str | None = None
    challenger_share: float = 0.0
    cache_seconds: float = 0.0
    cache_people: int = 100_000

    def __post_init__(self) -> None:
        if self.missing not in ("subset", "fallback", "refuse"):
            raise ConfigError(f"missing must be 'subset', 'fallback' or 'refuse', got {self.missing!r}")
        if (self.missing == "fallback") != (self.fallback is not None):
            raise ConfigError("missing = 'fallback' needs fallback = 'LABEL' (an active-only model saved beside it), "
                              "and fallback is read only with missing = 'fallback'")
        if not self.deadline_ms > 0:
            raise ConfigError(f"deadline_ms must be a positive number of milliseconds, got {self.deadline_ms}")
        if (self.challenger is None) != (self.challenger_share == 0):
            raise ConfigError("an A/B test names both challenger = 'LABEL' (a model saved beside this one) and "
                              "challenger_share, the share of requests it answers (between 0 and 1)")
        if not 0 <= self.challenger_share < 1:
            raise ConfigError(f"challenger_share is the share of requests the challenger answers, at least 0 and "
                              f"below 1, got {self.challenger_share}")
        if self.cache_seconds < 0 or self.cache_people < 1:
            raise ConfigError(f"cache_seconds must be 0 (no cache) or more, and cache_people at least 1; got "
                              f"{self.cache_seconds} and {self.cache_people}")


class LiveModel:
    """One saved model, restored once into a scoring session (``fed``, ``method``) that stays open; ``rows``: the
    active party's own feature table as read from its file (encoded with the model's encoding, not standardised);
    ``close``: ends the session."""

    def __init__(self, model: SavedModel, fed: Coordinator, method: Method, rows: PartyData, *,
                 policy: ServePolicy, fallback: SavedModel | None = None,
                 close: Callable[[], None] | None = None) -> None:
        if policy.missing == "subset" and not model.active_only:
            why = model.new_method().subset_refusal()
            if why:
                raise ConfigError(f"{model.label} cannot score a person with only the partners that answer "
                                  f"(missing = 'subset'): {why}")
        if fallback is not None and not fallback.active_only:
            raise ConfigError(f"the fallback {fallback.label} scores together with partners; a fallback must be an "
                              "active-only model (it scores when the partners cannot)")
        if rows.encoding is None:  # read from its file (Preprocessing.read), so with the model's encoding
            raise DataError(f"{model.label}: the active party's rows to serve must be read from its file, with the "
                            "encoding its model was trained with")
        self.model, self.fed, self.method, self.rows = model, fed, method, rows
        self.encoding = rows.encoding
        self.policy, self.fallback = policy, fallback
        self._close = close
        # One batch at a time: the session's messages to a partner are in order, and its rows are swapped per batch.
        self._lock = threading.Lock()
        # A partner that missed its deadline rests: the next batches leave it out at once (it would hold each one a
        # whole deadline) until RESTING seconds have passed, when a batch asks it again.
        self.resting: dict[str, float] = {}
        # Told of each partner left out of a batch, and why (a server's metrics).
        self.on_missed: Callable[[str, Exception | str], None] | None = None
        fed.on_absent = self._missed

    def _missed(self, party: str, why: Exception | str) -> None:
        if self.on_missed is not None:
            self.on_missed(party, why)
        # Late, unreachable (a dialled party that is down costs each batch its retries) or refusing (over its
        # rate): each would cost the next batches the same, so it rests.
        if self.policy.missing == "subset" and isinstance(why, TransportError | RemoteError):
            self.resting[party] = time.monotonic() + RESTING

    @property
    def name(self) -> str:
        return self.model.label

    @property
    def version(self) -> str:
        """The model's identity: its card's model ID (a model saved again is a new version)."""
        return str(self.model.card.model_id)

    def score(self, ids: Sequence[object], features: pd.DataFrame | None = None) -> pd.DataFrame:
        """One row per ID: its scores, the class, which model scored it (``model``) and with whom (``scored_by``).
        ``features``: the active party's values for people not in its table (its training file's columns and ID
        column, one row each)."""
        return self.scored(ids, features).frame(self.model)

    def scored(self, ids: Sequence[object], features: pd.DataFrame | None = None, *,
               since: float | None = None) -> Scored:
        """:meth:`score` as arrays (:class:`vflo.scoring.Scored`): what a server turns into its answers. ``since``:
        when the batch's oldest request arrived (time.monotonic): its partners must answer within the model's
        deadline from then, less :func:`reserve` of it (the deadline is the request's, its wait for a turn
        included)."""
        raw = self._raw_rows(ids, features)
        with self._lock:
            fed, method = self.fed, self.method
            now = time.monotonic()
            rest = [p for p, until in self.resting.items() if until > now and p not in fed.absent]
            for party in rest:  # out of this batch only
                fed.absent[party] = "missed its deadline a moment ago; asked again after a rest"
            transport: Any = fed.transport
            timed = since is not None and hasattr(transport, "until")
            if timed:
                assert since is not None
                deadline = self.policy.deadline_ms / 1000
                transport.until = max(since + deadline - reserve(deadline), now + 0.001)
            try:
                return self._score(fed, method, raw)
            finally:
                if timed:
                    transport.until = None
                for party in rest:
                    fed.absent.pop(party, None)

    def _score(self, fed: Coordinator, method: Method, raw: PartyData) -> Scored:
        """One batch scored with the session (under the lock)."""
        missing = SESSION_MISSING[self.policy.missing]
        fed.ctx.serving = rows = self.model.rows(self.model.card.active, raw)
        covered = np.ones(len(rows.ids), dtype=bool)
        if missing != "subset":
            from vflo.deploy.deployment import held_rows

            for name in method.scoring_parties(fed.parties):
                covered &= held_rows(fed, rows.ids, name, method.name)
        if missing == "refuse" and not covered.all():
            # Refused person by person: the other requests of the batch are answered.
            return self._refusing(rows.ids, covered, lambda keep: method.predict_by(fed, keep))
        # The fallback reads the same raw rows, prepared as it was trained.
        return score_rows(self.model, rows.ids, covered, lambda keep: method.predict_by(fed, keep),
                          missing=missing, fallback=self.fallback, fallback_rows=raw)

    def score_records(self, ids: Sequence[object], features: pd.DataFrame | None = None,
                      since: float | None = None) -> list[dict[str, Any]]:
        """:meth:`score` as JSON records (:func:`records`), made where the batch is scored."""
        return records(self.scored(ids, features, since=since), self.model, version=self.version)

    def _refusing(self, ids: np.ndarray, covered: np.ndarray,
                  score: Callable[[np.ndarray], tuple[np.ndarray, dict[str, np.ndarray]]]) -> Scored:
        """The covered people scored, the others with ``REFUSED`` as their model and the reason."""
        model = self.model
        values = np.full((len(ids), len(model.score_columns)), np.nan)
        source = np.full(len(ids), REFUSED, dtype=object)
        scored_by = np.full(len(ids), "", dtype=object)
        if covered.any():
            part = score_rows(model, ids[covered], np.ones(int(covered.sum()), dtype=bool), score, missing="refuse",
                              fallback=None, fallback_rows=None)
            values[covered], source[covered], scored_by[covered] = part.values, part.source, part.scored_by
        error = np.where(covered, "", f"{model.label} scores together with its partners, who do not hold this "
                         "person; serve it with missing = 'fallback' (an active-only model saved beside it) to score "
                         "such people").astype(object)
        return Scored(ids=ids, values=values, source=source, scored_by=scored_by, error=error)

    def check(self, ids: Sequence[object], features: pd.DataFrame | None) -> None:
        """Refuse a request whose people the active party neither holds nor was given values for (before it joins
        a batch, so that it fails alone)."""
        if features is not None:
            self._raw_rows(ids, features)
            return
        # Only whether each is held: the rows themselves are read once, for the whole batch.
        wanted = self._wanted(ids)
        _refuse_lacking(wanted[~self.rows.contains(wanted)])

    def _wanted(self, ids: Sequence[object]) -> np.ndarray:
        """The IDs asked for, as an array of the active party's own ID type."""
        return np.asarray(list(ids), dtype=self.rows.ids.dtype) if len(ids) else self.rows.ids[:0]

    def _raw_rows(self, ids: Sequence[object], features: pd.DataFrame | None) -> PartyData:
        """The active party's rows for ``ids`` as read from its file (encoded, not yet standardised): from its
        table, or from ``features`` for people not in it."""
        wanted = self._wanted(ids)
        held = self.rows.contains(wanted)
        given = None
        if features is not None and len(features):
            frame = features.copy()
            frame[self.encoding.id_column] = frame[self.encoding.id_column].astype(self.rows.ids.dtype)
            given = PartyData.encoded(frame, self.encoding, labelled=False)
        lacking = wanted[~held]
        if given is not None:
            lacking = lacking[~given.contains(lacking)]
        _refuse_lacking(lacking)
        if given is None:
            return self.rows.subset(wanted)
        mine, theirs = self.rows.subset(wanted[held]), given.subset(wanted[~held])
        stacked = PartyData(party=mine.party, ids=np.concatenate([mine.ids, theirs.ids]),
                            X=np.vstack([mine.X, theirs.X]), columns=mine.columns, categorical=mine.categorical,
                            encoding=mine.encoding)
        return stacked.subset(wanted)

    def close(self) -> None:
        """End the scoring session at every partner."""
        if self._close is not None:
            self._close()


def _refuse_lacking(lacking: np.ndarray) -> None:
    if len(lacking):
        raise DataError(f"the active party holds no row of {len(lacking)} of the people asked for (e.g. "
                        f"{lacking[:3].tolist()}): give their feature values in the request's 'features'")


def records(scored: Scored, model: SavedModel, *, version: str) -> list[dict[str, Any]]:
    """A scored batch as JSON records: each person's ID, scores by class, the class, who scored it, the model's
    version (and the reason, for a person refused)."""
    columns = model.score_columns
    classes = scored.predictions(model)
    values = scored.values.tolist()
    out = []
    for k, person in enumerate(scored.ids.tolist()):
        record: dict[str, Any] = {"id": person,
                                  "scores": {c: None if math.isnan(v) else v
                                             for c, v in zip(columns, values[k], strict=True)},
                                  "model": str(scored.source[k]), "scored_by": str(scored.scored_by[k]).split("+")}
        if classes is not None:
            record["prediction"] = _plain(classes[k])
        if scored.error is not None and scored.error[k]:
            record["error"] = str(scored.error[k])
        record["version"] = version
        out.append(record)
    return out


def _plain(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value

