"""Scoring with a saved model: next month's people, with the active party alone or with its partners.

:meth:`SavedModel.load` reads the model card and the active party's part (checking both). Where the
method scores from the active party's features alone (``inference = active_only``: local, ablation,
APC-VFL, VFedTrans, VFL-ASP's student) nothing else is needed. Where it scores collaboratively, every
party restores its own saved part (``control.load``) and contributes its share for the rows it holds:
in this process, or over a deployment, where each ``vflo party serve`` loads its part from its own folder.

Rows a partner does not hold cannot be scored by most collaborative methods. ``missing = "refuse"`` (the
default) stops and lists them; ``missing = "active_only"`` scores them with an active-only model saved beside
the collaborative one (``fallback``). ``missing = "subset"`` scores every row with the partners that hold it
and answer: for a method trained to do without partners (``laser_vfl``, ``splitnn`` with ``party_dropout``;
one scoring from the active party alone trivially). A partner that is not there, has no rows to score, or does
not answer within the deadline (deployed) is absent for that batch of rows, or for the session when its saved
part does not load (a party that left). Entity Augmentation, RAP and the others refuse it and say why.

The output's ``model`` column says which model scored each row, and ``scored_by`` which parties did
(``active+partner+...``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd

from vflo.align.engines import AlignmentConfig
from vflo.artifacts import CARD, MANIFEST, ArtifactError, ModelCard, Part, PartStore, read_part
from vflo.comm.local import LocalTransport
from vflo.comm.transport import Transport
from vflo.data.catalog import as_task
from vflo.data.files import Source
from vflo.data.partydata import PartyData
from vflo.errors import AlignmentError, ConfigError
from vflo.federation.coordinator import Coordinator
from vflo.federation.session import Session
from vflo.federation.simulation import held_by_all, party_node
from vflo.methods.base import Method
from vflo.methods.registry import active_only, get_method
from vflo.party.node import Node
from vflo.roles import PartyInfo, as_role

Missing = Literal["refuse", "active_only", "subset"]
#: Rows scored per call of a method's predict (and per message to each partner).
SCORE_BATCH = 100_000
Rows = PartyData | Source


@dataclass(frozen=True, eq=False)
class SavedModel:
    """One saved method: its card and the active party's checked part."""

    folder: Path
    card: ModelCard
    active: Part

    @classmethod
    def load(cls, folder: str | Path, label: str | None = None) -> SavedModel:
        """The model saved under ``folder`` (``label`` picks one of several methods saved there). ``folder`` may
        also be one method's folder (``DIR/LABEL``, with its card) or the active party's own part in it
        (``DIR/LABEL/PARTY``): all a party needs on its own host to score from its own rows."""
        folder = Path(folder)
        if label is None and (folder / CARD).is_file():
            folder, label = folder.parent, folder.name
        elif label is None and (folder / MANIFEST).is_file() and (folder.parent / CARD).is_file():
            folder, label = folder.parent.parent, folder.parent.name
        if label is None:
            labels = sorted(p.parent.name for p in folder.glob(f"*/{CARD}"))
            if len(labels) != 1:
                raise ConfigError(f"{folder} holds {len(labels)} saved methods {labels}: name one (label / --method)"
                                  if labels else f"no model saved under {folder} (no */{CARD})")
            label = labels[0]
        card = ModelCard.read(folder / label)
        part = read_part(folder / label / card.active, party=card.active, model_id=card.model_id, label=label)
        _check_manifest(card, card.active, part.manifest_sha256)
        return cls(folder=folder, card=card, active=part)

    @property
    def label(self) -> str:
        return self.card.label

    @property
    def classes(self) -> tuple[str, ...]:
        return self.card.classes

    @property
    def active_only(self) -> bool:
        return self.card.inference == "active_only"

    def new_method(self) -> Method:
        return get_method(self.card.method).from_config_json(self.card.config)

    @property
    def parties(self) -> tuple[PartyInfo, ...]:
        return tuple(PartyInfo(name, as_role(role)) for name, role in self.card.parties)

    def restore(self, node: Node, transport: Transport, *, alignment: AlignmentConfig | None = None,
                missing: Missing = "refuse") -> tuple[Coordinator, Method]:
        """A federation of the card's parties over ``transport``, with every party's part restored; ``alignment``:
        how the rows to score are matched with the other parties' (plain unless given). With ``missing =
        "subset"``, a partner whose part does not load is absent for the session (see :func:`check_subset`)."""
        parties = (PartyInfo(self.card.active, "active"),) if self.active_only else self.parties
        method = self.new_method()
        if missing == "subset":
            check_subset(self, method)
        fed = Coordinator(node=node, transport=transport, parties=parties, seed=self.card.seed,
                          task=as_task(self.card.task), n_classes=self.card.n_classes, alignment=alignment,
                          whoever_answers=missing == "subset")
        for party, sha in Session(fed).load(method, self.label, self.card.model_id, self.active.state).items():
            _check_manifest(self.card, party, sha)
        return fed, method

    def rows(self, party: str, rows: Rows) -> PartyData:
        """``party``'s rows to score, read and prepared as that party's model expects."""
        if party != self.card.active:
            store = PartStore(self.folder, party=party, role="passive")
            part = read_part(store.folder(self.label), party=party, model_id=self.card.model_id, label=self.label)
            return part.preprocessing.rows(rows, party=party)
        return self.active.preprocessing.rows(rows, party=party)

    def predict(self, rows: Rows | Mapping[str, Rows]) -> np.ndarray:
        """Scores for every row of the active party's ``rows`` (class probabilities, or values), in this process.

        ``rows``: the active party's rows (a file or PartyData), or each party's rows by name where the
        method scores collaboratively."""
        return self.score(rows)[self.score_columns].to_numpy()

    def card_partners(self) -> list[str]:
        """The parties the model was trained with besides the active party, in the card's order."""
        return [name for name, _ in self.card.parties if name != self.card.active]

    @property
    def id_column(self) -> str:
        """The ID column's name in the active party's training file (``id`` where it came from no file); score
        files keep it."""
        encoding = self.active.preprocessing.encoding
        name = encoding.id_column if encoding is not None else "id"
        return "id (row)" if name in (*self.score_columns, "prediction", "model", "scored_by") else name

    @property
    def score_columns(self) -> list[str]:
        if self.card.task == "regression":
            return ["prediction"]
        return list(self.classes) if self.classes else [f"class_{i}" for i in range(self.card.n_classes or 2)]

    def score(self, rows: Rows | Mapping[str, Rows], *, missing: Missing = "refuse",
              fallback: SavedModel | None = None) -> pd.DataFrame:
        """One row per ID of the active party's rows: its scores, which saved model scored it and which parties.

        ``missing``: see the module's text; with ``"subset"``, a partner whose rows are not given is absent."""
        given = dict(rows) if isinstance(rows, Mapping) else {self.card.active: rows}
        if self.card.active not in given:
            raise ConfigError(f"give the active party {self.card.active!r}'s rows to score")
        prepared: dict[str, PartyData] = {}
        gone: dict[str, str] = {}
        for party, r in given.items():
            if party != self.card.active and self.active_only:
                continue
            try:
                prepared[party] = self.rows(party, r)
            except ArtifactError as exc:
                if missing != "subset" or party == self.card.active:
                    raise
                gone[party] = str(exc)  # a partner that left with its part: absent, as one that does not load
        ids = prepared[self.card.active].ids
        nodes = {p.name: party_node(p, None, prepared.get(p.name), peers=self.parties,
                                    store=PartStore(self.folder, party=p.name, role=p.role)) for p in self.parties}
        transport = LocalTransport(nodes)
        fed, method = self.restore(nodes[self.card.active], transport, missing=missing)
        if missing == "subset":
            for p in fed.names():
                if p not in prepared and p not in fed.absent:
                    fed.mark_absent(p, gone.get(p, "no rows to score given"), session=True)
        covered = held_by_all(prepared, method.scoring_parties(fed.parties), ids)
        return combine(self, ids, covered, lambda keep: method.predict_by(fed, keep), missing=missing,
                       fallback=fallback, fallback_rows=given.get(self.card.active))


def _check_manifest(card: ModelCard, party: str, sha: str) -> None:
    recorded = card.manifests.get(party)
    if recorded is not None and recorded != sha:
        raise ArtifactError(f"party {party!r}'s saved part is not the one this model was saved with (its manifest "
                            "changed since): restore the original part, or save the model again")


def check_subset(model: SavedModel, method: Method) -> None:
    """Refuse ``missing = "subset"`` for a method that cannot score a person without some partner, saying why."""
    why = method.subset_refusal()
    if why:
        raise ConfigError(f"{model.label} cannot score a person with only the partners that hold them (missing = "
                          f"'subset'): {why}")


@dataclass(frozen=True)
class Scored:
    """Rows scored, as arrays: ``values`` (one column per score), which saved model scored each row (``source``;
    ``error`` where it was refused) and which parties (``scored_by``, the names joined by ``+``)."""

    ids: np.ndarray
    values: np.ndarray
    source: np.ndarray
    scored_by: np.ndarray
    error: np.ndarray | None = None

    def predictions(self, model: SavedModel) -> np.ndarray | None:
        """The class each row is given (None for regression)."""
        if model.card.task == "regression":
            return None
        best = np.argmax(np.nan_to_num(self.values, nan=-np.inf), axis=1)
        classes: np.ndarray = np.asarray(model.score_columns, dtype=object)[best]
        return classes

    def frame(self, model: SavedModel) -> pd.DataFrame:
        """As ``vflo predict`` writes it: the ID column, the scores, the class, ``model`` and ``scored_by``."""
        columns = model.score_columns
        table: dict[str, Any] = {model.id_column: self.ids,
                                 **{name: self.values[:, i] for i, name in enumerate(columns)}}
        classes = self.predictions(model)
        if classes is not None:  # the class each row is given, beside the probabilities
            table["prediction"] = classes
        table["model"] = self.source
        table["scored_by"] = self.scored_by
        if self.error is not None:
            table["error"] = self.error
        return pd.DataFrame(table)  # built at once: a column set at a time costs more than a few rows' scoring


def combine(model: SavedModel, ids: np.ndarray, covered: np.ndarray,
            score: Callable[[np.ndarray], tuple[np.ndarray, dict[str, np.ndarray]]], *, missing: Missing,
            fallback: SavedModel | None, fallback_rows: Rows | None) -> pd.DataFrame:
    """:func:`score_rows` as the table ``vflo predict`` writes."""
    return score_rows(model, ids, covered, score, missing=missing, fallback=fallback,
                      fallback_rows=fallback_rows).frame(model)


def score_rows(model: SavedModel, ids: np.ndarray, covered: np.ndarray,
               score: Callable[[np.ndarray], tuple[np.ndarray, dict[str, np.ndarray]]], *, missing: Missing,
               fallback: SavedModel | None, fallback_rows: Rows | None) -> Scored:
    """Scores of the covered rows from ``model`` (``score``: values, and which rows each partner scored), and of
    the others from ``fallback`` or a refusal; which model and which parties scored each row."""
    columns = model.score_columns
    active = model.card.active
    values = np.full((len(ids), len(columns)), np.nan)
    source = np.full(len(ids), model.label, dtype=object)
    scored_by = np.full(len(ids), active, dtype=object)
    if (~covered).any():
        lacking = ids[~covered]
        if missing == "refuse":
            raise AlignmentError(
                f"{model.label} scores together with its partners, who do not hold {len(lacking)} of the {len(ids)} "
                f"rows to score (e.g. {lacking[:5].tolist()}); score only rows every party holds, or score them "
                "with an active-only model saved beside it (vflo predict ... --missing active_only --fallback "
                "LABEL; in Python, missing='active_only', fallback=...)")
        if fallback is None or not fallback.active_only:
            raise ConfigError("missing = 'active_only' needs a fallback: an active-only model "
                              f"({', '.join(active_only())}) saved beside this one, named with --fallback")
        if fallback.score_columns != columns:
            raise ConfigError(f"the fallback {fallback.label} scores {fallback.score_columns}, not {columns}")
        assert fallback_rows is not None
        scored = fallback.score(fallback_rows).set_index(fallback.id_column)
        values[~covered] = scored.loc[lacking, columns].to_numpy()
        source[~covered] = fallback.label
    if covered.any():
        # In batches: each message to a partner and each network pass stays bounded however many rows come.
        keep = np.flatnonzero(covered)
        for i in range(0, len(keep), SCORE_BATCH):
            rows = keep[i:i + SCORE_BATCH]
            part, by = score(ids[rows])
            part = np.asarray(part)
            values[rows] = part.reshape(len(part), -1)
            for party in model.card_partners():
                if party in by:
                    scored_by[rows[by[party]]] += f"+{party}"
    return Scored(ids=ids, values=values, source=source, scored_by=scored_by)
