"""The active party's side of a deployment: it coordinates runs (a :class:`~vflo.federation.session.Session` over
its gRPC or Flower link) and scoring sessions with saved models."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from vflo.align import kept
from vflo.align.engines import DEPLOYED_ALIGNMENT, AlignmentConfig
from vflo.align.stream import StreamResult, stream_intersect
from vflo.artifacts import CheckpointStore, ModelCard, PartStore, Preprocessing
from vflo.comm.ledger import Ledger
from vflo.comm.message import Message
from vflo.data.datasets import Task, infer_task
from vflo.data.order import in_order
from vflo.data.partydata import PartyData
from vflo.deploy.configs import DeployConfig
from vflo.deploy.party import Link, load_party_data, start_party
from vflo.errors import (
    AddressInUseError,
    AlignmentError,
    ConfigError,
    DataError,
    MethodError,
    RemoteError,
    TransportError,
)
from vflo.federation.coordinator import Aligner, Coordinator
from vflo.federation.session import RunOutput, Session
from vflo.federation.simulation import write_model
from vflo.methods.base import Method
from vflo.nn.train import CheckpointPlan
from vflo.party.node import READY
from vflo.roles import PartyInfo
from vflo.scoring import Missing, SavedModel, combine

logger = logging.getLogger(__name__)


def _refuse_leaks(party: str, leaked: np.ndarray, where: str) -> None:
    if len(leaked):
        raise DataError(
            f"{len(leaked)} test IDs are also in party {party!r}'s {where} (e.g. {leaked[:5].tolist()}): a test row "
            "must be held out of every party's training data, or the scores measure rows it trained on; remove them "
            "from the training files (vflo holdout cuts train, test and serve files that never overlap)")


def _task_of(train: PartyData, test: PartyData | None, deploy: DeployConfig) -> tuple[Task, int | None]:
    y = train.require_labels()
    task = deploy.task if deploy.task is not None else infer_task(y)
    if task == "regression":
        return task, None
    n = deploy.n_classes or int(max(y.max(), test.y.max() if test is not None and test.y is not None else 0)) + 1
    return task, max(n, 2)


@dataclass(frozen=True)
class AlignedWith:
    """One intersection ``vflo align`` ran or reused: with whom, for which rows, how many IDs asked and shared,
    the engine that found them, whether a kept one was reused, the token both parties keep it under."""

    party: str
    purpose: str
    asked: int
    shared: int
    engine: str
    reused: bool = False
    token: str = ""
    note: str = ""


class Deployment:
    """The active party's side of a deployed federation: its node, and its way to every other party (its own
    gRPC server and clients, or a ``link`` such as vflo.flower's transport through a Flower ServerApp)."""

    def __init__(self, deploy: DeployConfig, *, train: PartyData | None = None, test: PartyData | None = None,
                 link: Link | None = None) -> None:
        if link is None:
            deploy.check_grpc()
        active = deploy.active
        preprocessing = None
        if train is None:
            assert active.data is not None
            tables = load_party_data(active.name, active.data, extra=deploy.test_file)
            if tables.train is None:
                raise ConfigError(f"the active party {active.name!r} needs its training file ([active.data] file) to "
                                  "train; to score with a saved model use `vflo predict`")
            train, test, preprocessing = tables.train, tables.test, tables.preprocessing
        self.deploy = deploy
        self.preprocessing = preprocessing or Preprocessing(columns=train.columns)
        self.train = train
        self.test = test
        self.task, self.n_classes = _task_of(train, test, deploy)
        serving = None if test is None else PartyData(party=test.party, ids=test.ids, X=test.X, columns=test.columns)
        config = deploy.coordinator_config()
        self.party = start_party(config, data=train, serve=serving, preprocessing=self.preprocessing, link=link)
        self.parties = deploy.party_infos

    @property
    def data_parties(self) -> tuple[PartyInfo, ...]:
        return tuple(p for p in self.parties if p.holds_data)

    def missing_for(self, method: Method) -> str:
        """What ``method`` needs that the deploy config lacks (a server or dealer), as "NAME needs [...]"; or ""."""
        missing = [f"{p.name} ({p.role})" for p in method.extra_parties(self.data_parties) if p not in self.parties]
        return f"{method.name} needs {missing}" if missing else ""

    def parties_for(self, method: Method) -> tuple[PartyInfo, ...]:
        """The data parties and the data-less parties ``method`` needs: a server or dealer no method of the run
        uses need not be running."""
        needs = self.missing_for(method)
        if needs:
            raise MethodError(f"{needs} in the deploy config's [[parties]]")
        return (*self.data_parties, *method.extra_parties(self.data_parties))

    def preflight(self, methods: list[Method], *, alignment: AlignmentConfig | None = None, save: bool = False,
                  checkpoints: bool = False) -> None:
        """Before anything trains: every party the methods need has the folders ``save`` and ``checkpoints``
        will write to, no test row is in any party's training rows, the active party shares IDs with the
        others, and every party a collaborative method scores with holds the rows to score.

        Each check is an alignment exchange (plain, or PSI as configured), reported apart like any alignment.
        First of all, every method's server or dealer is in the deploy config: a method that needs one
        would otherwise fail only after the methods before it had trained.
        """
        needs = [text for text in map(self.missing_for, methods) if text]
        if needs:
            raise ConfigError("; ".join(needs) + " in the deploy config's [[parties]]: add each as "
                              "[[parties]] name = '...', role = '...' (over vflo's gRPC also address = 'HOST:PORT' "
                              "of its `vflo party serve`; over Flower its `vflo flower party` runs a SuperNode), or "
                              "leave the method out")
        own = self.train
        fed = Aligner(node=self.party.node, transport=self.party.transport, parties=self.data_parties,
                      alignment=alignment or DEPLOYED_ALIGNMENT)
        if save or checkpoints:
            self._check_folders(methods, save=save, checkpoints=checkpoints)
        test_ids = self._test_ids()
        _refuse_leaks(own.party, test_ids[own.contains(test_ids)], "training file")
        passives = self._passives()
        asked = self._asked()
        is_test, is_own = np.isin(asked, test_ids.astype(own.ids.dtype)), np.isin(asked, own.ids)
        shares = False
        for name in passives:
            answer = fed.align(asked, [name])
            held = answer.held.get(name)
            if held is None:  # PSI with mode = 'active': only the shared IDs come back
                held = np.isin(asked, answer.ids)
            _refuse_leaks(name, asked[held & is_test], "training rows")
            shares = shares or bool((held & is_own).any())
        if passives and not shares:
            raise AlignmentError(
                f"the active party {own.party!r} shares no ID with {passives}: its training IDs look like "
                f"{own.ids[:3].tolist()}; check that every party's id_column holds the same IDs in the same format")
        for method in methods:
            for name in method.scoring_parties(self.data_parties):
                if not len(test_ids):
                    continue
                try:
                    held = fed.align(test_ids, [name], purpose="serve").held[name]
                except RemoteError as exc:
                    raise AlignmentError(
                        f"{method.name} scores together with {name!r}, which has no rows to score "
                        f"({exc.remote_message}); give {name!r} a serve_file with the test rows, or leave "
                        f"{method.name} out") from exc
                if not held.all():
                    missing = np.sort(test_ids)[~held]
                    raise AlignmentError(
                        f"{method.name} scores together with {name!r}, which does not hold {len(missing)} of the "
                        f"{len(test_ids)} rows to score (e.g. {missing[:5].tolist()}); add them to its serve_file, or "
                        f"leave {method.name} out")

    def _test_ids(self) -> np.ndarray:
        return np.empty(0, dtype=self.train.ids.dtype) if self.test is None else self.test.ids

    def _passives(self) -> list[str]:
        return [p.name for p in self.data_parties if p.role == "passive"]

    def _asked(self) -> np.ndarray:
        """The one set of IDs a run asks each partner about its training rows (a party answers one set a run):
        the test rows and the active party's own, together."""
        own, test = self.train.ids, self._test_ids()
        if not len(test) and in_order(own, strictly=True):
            return own  # already sorted and distinct: no sorted copy (np.unique's: two more copies of every ID)
        return np.unique(np.concatenate([test.astype(own.dtype), own]))

    def align_ahead(self, alignment: AlignmentConfig, *, serve: np.ndarray | None = None,
                    fresh: bool = False) -> list[AlignedWith]:
        """``vflo align``: the private set intersections a run asks of each partner (its training rows against
        the active party's training and test rows), and a scoring's (``serve``, default the test rows, against
        its rows to score), run now and kept by every party that keeps alignments; a later run or scoring
        reuses them while neither side's people changed (:mod:`vflo.align.kept`). One row per intersection.
        ``fresh``: intersect afresh even where a kept intersection still holds."""
        if alignment.method != "psi" or not alignment.reuse:
            raise ConfigError("vflo align keeps private set intersections: it needs [alignment] method = 'psi' and "
                              "reuse = true")
        if self.party.node.alignments is None:
            raise ConfigError(f"the active party {self.train.party!r} keeps no alignments: its config sets "
                              "alignments = ''; name a folder (alignments = 'DIR' under [active]) to keep them")
        fed = Aligner(node=self.party.node, transport=self.party.transport, parties=self.data_parties,
                      alignment=alignment, reuse_kept=not fresh)
        done: list[AlignedWith] = []
        asks = (("train", self._asked()), ("serve", self._test_ids() if serve is None else serve))
        for name in self._passives():
            for purpose, ids in asks:
                if purpose == "serve" and not len(ids):
                    continue
                try:
                    found = fed.align(ids, [name], purpose=purpose)
                except RemoteError as exc:
                    if purpose == "serve" and exc.error_type == "PartyBoundaryError":
                        done.append(AlignedWith(party=name, purpose=purpose, asked=len(ids), shared=-1,
                                                engine="", note="no rows to score (no serve_file)"))
                        continue
                    raise
                record, reused = fed.kept.get((name, purpose), (None, False))
                done.append(AlignedWith(
                    party=name, purpose=purpose, asked=len(ids), shared=len(found.ids),
                    engine=record.engine if record is not None else fed.alignment_engine, reused=reused,
                    token="" if record is None else record.token,
                    note="" if record is not None else f"not kept: {name} keeps no alignments"))
        return done

    def align_streamed(self, *, mode: str = "both", memory_mb: float = 256.0) -> list[StreamResult]:
        """``vflo align --stream``: the active party's training file intersected with each partner's, both read
        from disk a bucket at a time with each party's working memory under ``memory_mb``
        (:mod:`vflo.align.stream`); every party keeps its own rows' flags in its alignments folder."""
        fed = Aligner(node=self.party.node, transport=self.party.transport, parties=self.data_parties)
        store = kept.store_of(fed)
        own = store.files.get("train") if store is not None else None
        if store is None or own is None:
            raise ConfigError(f"streaming PSI reads the active party {self.train.party!r}'s own file and keeps the "
                              "result in its alignments folder: give [active.data] file and alignments")
        return [stream_intersect(fed, own, name, folder=store.folder, mode=mode, memory_mb=memory_mb)
                for name in self._passives()]

    def _check_folders(self, methods: list[Method], *, save: bool, checkpoints: bool) -> None:
        """Every party the methods need (servers and dealers included) has its model folder (``save``) and its
        checkpoint folder (``checkpoints``): asked once, before anything trains."""
        needed = {p.name: p for m in methods for p in self.parties_for(m) if p.name != self.train.party}
        lacking: list[str] = []
        for name in needed:
            request = Message(sender=self.train.party, receiver=name, kind=READY, round=0,
                              payload={"save": save, "checkpoints": checkpoints})
            reply = self.party.transport.request(request)
            if reply.error is not None:
                lacking.append(f"{name}: {reply.error.message}")
        if lacking:
            what = " and ".join(w for w, on in (("--save", save), ("--checkpoints", checkpoints)) if on)
            raise ConfigError(f"{what} needs a folder at every party the methods use; " + "; ".join(lacking))

    def run(self, method: Method, *, seed: int, alignment: AlignmentConfig | None = None,
            save: tuple[Path, str] | None = None, checkpoint: tuple[Path, CheckpointPlan] | None = None) -> RunOutput:
        """Fit ``method`` over the network and score the test rows; the ledger holds every party's messages.
        ``alignment``: how the shared people are found (None: a deployment's default, private set intersection,
        :data:`~vflo.align.engines.DEPLOYED_ALIGNMENT`).

        With ``save`` (a folder and a label) every party writes its own part in its own folder (the others in
        the folder their configs name) and this party writes its part and the model card here. With
        ``checkpoint`` (this party's folder and a plan), training keeps checkpoints here and every other
        party in the folder its own config names, and may resume from the last one they all hold."""
        if method.simulation_only:
            raise MethodError(f"{method.name} needs the pooled raw data of every party, so it exists only in "
                              "simulation; it cannot run over a deployment")
        parties = self.parties_for(method)
        transport = self.party.transport
        transport.ledger = Ledger()
        fed = Coordinator(node=self.party.node, transport=transport, parties=parties, seed=seed,
                          task=self.task, n_classes=self.n_classes, alignment=alignment or DEPLOYED_ALIGNMENT)
        if checkpoint is not None:
            self.party.node.checkpoints = CheckpointStore(checkpoint[0], party=self.train.party, role="active")
        ids = np.empty(0, dtype=np.int64) if self.test is None else self.test.ids
        return Session(fed).run(method, ids, checkpoint=None if checkpoint is None else checkpoint[1],
                                save=None if save is None else lambda session: self.save(session, method, *save))

    def save(self, session: Session, method: Method, folder: Path, label: str) -> ModelCard:
        """This party's part and the model card in ``folder``; every other party's part in its own folder."""
        own = PartStore(folder, party=self.train.party, role="active", preprocessing=self.preprocessing)
        classes = () if self.preprocessing.encoding is None else self.preprocessing.encoding.classes
        return write_model(session, own, method, folder, label=label, classes=tuple(classes))

    def close(self) -> None:
        self.party.stop()



def score_deployed(deploy: DeployConfig, model: SavedModel, rows: str | Path, *, missing: Missing = "refuse",
                   fallback: SavedModel | None = None, deadline: float | None = None,
                   link: Link | None = None) -> pd.DataFrame:
    """Score the active party's ``rows`` with a saved model over a deployment: every party loads its own saved
    part (``vflo party serve ... --save DIR``) and scores the rows of its ``serve_file`` it holds.

    ``missing = "subset"``: each row is scored by the partners that hold it and answer; ``deadline`` (seconds,
    default the deploy config's) bounds each request, retries included, and a partner past it is absent for
    that batch (one that cannot load its part, for the session). The output's ``scored_by`` says who scored.
    ``link``: the other parties reached some other way than vflo's gRPC (Flower), as for :class:`Deployment`."""
    active = deploy.active
    if active.name != model.card.active:
        raise ConfigError(f"the model was saved with {model.card.active!r} as the active party, but deploy.toml's "
                          f"[active] is {active.name!r}")
    if deadline is not None and not deadline > 0:
        raise ConfigError(f"the deadline is a number of seconds > 0, got {deadline}")
    if deadline is not None and missing != "subset":
        raise ConfigError("a deadline applies to scoring with whoever answers: give --missing subset with it")
    serving = model.rows(active.name, rows)
    config = deploy.coordinator_config()
    if deadline is not None:
        config = replace(config, deadline=deadline)
    try:
        party = start_party(config, data=None, serve=serving, link=link)
    except AddressInUseError as exc:
        raise TransportError(f"{exc}. If `vflo run --deploy` is training at {active.name!r} now, it holds that "
                             "address, and the other parties serve one run at a time: they refuse a scoring session "
                             "while a training run goes on. Score when the run has ended") from exc
    try:
        # The rows to score are matched with each partner's by private set intersection: a partner learns which of
        # its own people are scored, never the IDs of people it does not hold (plain alignment sent them all).
        fed, method = model.restore(party.node, party.transport, alignment=AlignmentConfig(method="psi"),
                                    missing=missing)
        covered = np.ones(len(serving.ids), dtype=bool)
        for name in method.scoring_parties(fed.parties):
            covered &= held_rows(fed, serving.ids, name, method.name)
        frame = combine(model, serving.ids, covered, lambda keep: method.predict_by(fed, keep), missing=missing,
                        fallback=fallback, fallback_rows=rows)
        Session(fed).teardown()
        return frame
    finally:
        party.stop()


def held_rows(fed: Coordinator, ids: np.ndarray, party: str, method: str) -> np.ndarray:
    """Which of ``ids`` (in their order) ``party`` holds among its rows to score: one alignment exchange."""
    try:
        alignment = fed.align(ids, [party], purpose="serve")
    except RemoteError as exc:
        raise AlignmentError(f"{method} scores together with {party!r}, which has no rows to score "
                             f"({exc.remote_message}); give it a serve_file with the people to score") from exc
    order = np.argsort(ids, kind="stable")
    held = np.zeros(len(ids), dtype=bool)
    held[order] = alignment.held[party]
    return held
