"""What a method is: a config dataclass, party-side handlers, a coordinator, a predictor.

A method subclass declares

* ``Config``: a frozen, keyword-only dataclass of hyperparameters (defaults from its paper);
* handlers: functions decorated with :func:`handles` that a party runs when a message of
  that kind arrives; each sees only its own :class:`~vflo.party.node.NodeContext`;
* :meth:`Method.fit`: the coordinator's side, run at the active party through a
  :class:`~vflo.party.port.Federation` (which exposes only that party's data);
* :meth:`Method.predict`: scores for IDs the active party holds; ``inference`` says
  whether that needs the other parties (``collaborative``) or not (``active_only``).

Coordinator-side learned state lives on the instance with a trailing underscore,
as in scikit-learn; party-side state lives in each party's typed part (``ctx.part(Cls)``).
What a fitted model keeps of either is declared in ``saves`` (:mod:`vflo.methods.saved`).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np

from vflo import schema
from vflo.comm.message import Value
from vflo.data.datasets import Task
from vflo.errors import ConfigError, MethodError
from vflo.methods import saved
from vflo.party.handlers import HandlerInfo, HandlerSet, handles, reveals
from vflo.roles import PartyInfo

if TYPE_CHECKING:
    from vflo.party.context import NodeContext
    from vflo.party.port import Federation

__all__ = ["ALL_TASKS", "Claim", "HandlerInfo", "Inference", "Method", "MethodConfig", "State", "handles", "prefixed",
           "reveals",
           "unprefixed"]

# What a fitted model keeps: named arrays and plain values, the kinds the message codec carries.
State = dict[str, Value]


def prefixed(prefix: str, state: Mapping[str, Value]) -> State:
    return {prefix + k: v for k, v in state.items()}


def unprefixed(prefix: str, state: Mapping[str, Value]) -> State:
    return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}


def need(state: Mapping[str, Value], key: str) -> Value:
    """A saved value the method cannot score without; its absence means the part is not this method's."""
    if key not in state:
        raise MethodError(f"a saved model part lacks {key!r}: it was saved by another method or version")
    return state[key]

Inference = Literal["active_only", "collaborative"]
#: A comparison's party layouts (see :meth:`Method.layout_settings`).
Layout = Literal["star", "second_hop", "missing"]
ALL_TASKS: frozenset[Task] = frozenset({"binary", "multiclass", "regression"})


@dataclass(frozen=True, kw_only=True)
class Claim:
    """A claim a comparison's report tests for a method (``vflo compare``): ``method`` (the method's own name
    when empty, or one of its :attr:`Method.variants`) against the method ``against``, on the cells of ``axis``
    at its smallest, largest or nearest-to-half value, scoring ``scored`` people, paired over repeats."""

    text: str
    axis: Literal["aligned", "second_hop", "absent"]
    at: Literal["smallest", "largest", "half"]
    scored: Literal["aligned", "active_only", "missing"]
    against: str
    method: str = ""


@dataclass(frozen=True, kw_only=True)
class MethodConfig:
    """Base of every method's hyperparameters."""


class Method(HandlerSet, ABC):
    """Base class of every federated algorithm and baseline."""

    name: ClassVar[str]
    Config: ClassVar[type[MethodConfig]] = MethodConfig
    summary: ClassVar[str] = ""
    paper: ClassVar[str] = ""
    inference: ClassVar[Inference] = "active_only"
    #: A collaborative method that scores a person with whichever partners hold them (none required), so it
    #: scores people only the active party holds too.
    any_subset: ClassVar[bool] = False
    simulation_only: ClassVar[bool] = False
    #: The floor every federated method must beat: the active party alone on its own rows, sending nothing, so it
    #: spends no privacy and leaks nothing (one method carries it: comparisons read their privacy cells against it).
    floor: ClassVar[bool] = False
    tasks: ClassVar[frozenset[Task]] = ALL_TASKS
    #: The config's training settings whose loops keep checkpoints at every party and resume from them
    #: (long multi-round training); ``checkpoint_every`` anywhere else is refused.
    checkpointed: ClassVar[tuple[str, ...]] = ()
    #: Per role, the settings (dotted paths into ``Config``) a party decides alone, from its own config's
    #: ``[methods.NAME]`` or the defaults, whatever the coordinator proposes; and those it shares, where its
    #: own value, if it gives one, must equal the proposal's (:mod:`vflo.methods.own_settings`).
    own_settings: ClassVar[Mapping[str, tuple[str, ...]]] = {}
    shared_settings: ClassVar[Mapping[str, tuple[str, ...]]] = {}

    # -- tags: what the rest of vflo (comparison, scoring, CLI, audit, the common test suite) reads of a method,
    # -- so that nothing outside its module needs its name ---------------------------------------------------
    #: Settings that keep a test run short (the common test suite, the e2e equivalence tests).
    quick: ClassVar[Mapping[str, Any]] = {}
    #: Runs with an active party that holds labels and no columns of its own (its paper's layout).
    label_only_active: ClassVar[bool] = False
    #: For a method whose ``subset_refusal`` depends on its settings: the settings that let it score with whoever
    #: holds a person (e.g. "party_dropout > 0"). Not inherited.
    subset_when: ClassVar[str] = ""
    #: Named variants a comparison runs beside the method in its missing-partner cells: label -> settings.
    #: Not inherited.
    variants: ClassVar[Mapping[str, Mapping[str, Any]]] = {}
    #: The claims of its paper a comparison's report tests. Not inherited.
    claims: ClassVar[tuple[Claim, ...]] = ()
    #: What the fitted method keeps, at each party (saved and restored by :mod:`vflo.methods.saved`, listed in
    #: docs/models.md).
    saves: ClassVar[saved.Saves] = saved.Saves()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # A subclass is another method: its paper's claims, variants and scoring conditions are its own to state.
        for tag, empty in (("subset_when", ""), ("variants", {}), ("claims", ())):
            if tag not in vars(cls):
                setattr(cls, tag, empty)

    def __init__(self, config: MethodConfig | None = None, **overrides: Any) -> None:
        if config is None:
            config = schema.build(self.Config, overrides, where=f"methods.{self.name}")
        elif overrides:
            raise ConfigError("pass either a config object or keyword overrides, not both")
        if not isinstance(config, self.Config):
            raise ConfigError(f"{self.name} needs a {self.Config.__name__}, got {type(config).__name__}")
        for f in fields(config):
            if getattr(getattr(config, f.name), "checkpoint_every", 0) and f.name not in self.checkpointed:
                raise ConfigError(
                    f"methods.{self.name}.{f.name}.checkpoint_every: this training keeps no checkpoints (it is "
                    "short or one exchange): remove the setting (vflo methods lists the trainings that keep them)")
        self.config = config

    # -- what a party runs -----------------------------------------------------------------------

    def check_parties(self, parties: tuple[PartyInfo, ...]) -> None:
        """Refuse, before anything trains, settings that name parties the run does not have: a
        :class:`ConfigError` that names the parties it does have and a fix open to the user. Nothing to check
        for a method that names no party in its settings."""

    def scoring_parties(self, parties: tuple[PartyInfo, ...]) -> list[str]:
        """The parties whose rows a prediction needs besides the active party's: none for a method that
        scores from the active party alone, the passive parties it trains with otherwise."""
        if self.inference == "active_only":
            return []
        return [p.name for p in parties if p.role == "passive"]

    def subset_refusal(self) -> str:
        """Why this method cannot score a person with only the partners that hold them and answer
        (``missing = "subset"``), or "" when it can: a method scoring from the active party alone, and one
        trained to do without any partner, can."""
        if self.inference == "active_only" or self.any_subset:
            return ""
        return ("its prediction reads every partner's share of a person, and it was never trained without one, so "
                "a person a partner lacks has no score of it")

    def predict_by(self, fed: Federation, ids: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """:meth:`predict`, and for each partner that took part which of ``ids`` it scored (every one, for a
        method that scores with every partner it needs; a method that scores with whoever holds a person says
        whom)."""
        return self.predict(fed, ids), {p: np.ones(len(ids), dtype=bool) for p in self.scoring_parties(fed.parties)}

    #: Why a method that trains with every passive party on people they share with the active party cannot
    #: run where one partner shares no one with it.
    NO_SECOND_HOP: ClassVar[str] = ("trains with every passive party on people it shares with the active party; "
                                    "the second-hop party shares none")

    #: Why a method that scores only people every partner holds does not run where partners are missing.
    NO_MISSING: ClassVar[str] = ("scores only people every partner holds; where partners are missing, SplitNN stands "
                                 "for such methods, with Local scoring the people a partner lacks")

    @classmethod
    def layout_settings(cls, layout: Layout, *, first_hop: str = "", second_hop: str = "") -> dict[str, Any] | str:
        """The settings this method runs with in a comparison's party layout, or why it cannot run there.
        ``'star'``: every passive party shares people with the active party; ``'second_hop'``: ``first_hop``
        shares people with the active party and with ``second_hop``, which shares none with the active party;
        ``'missing'``: the active party holds everyone and each partner lacks some people, in training and at
        scoring (a method scoring from the active party alone, or with whoever holds a person, runs there)."""
        if layout == "missing":
            return {} if cls.inference == "active_only" or cls.any_subset else cls.NO_MISSING
        return {} if layout == "star" else cls.NO_SECOND_HOP

    @classmethod
    def private_settings(cls, epsilon: float) -> dict[str, Any]:
        """The shared settings this method runs with where every party protects what it sends at ``epsilon``
        per person (a comparison's privacy cells): the label holder's randomised response, where the method has
        one. A partner calibrates its own side at its setup, so its settings are not here."""
        return {"label_epsilon": float(epsilon)} if any(f.name == "label_epsilon" for f in fields(cls.Config)) else {}

    @classmethod
    def private_refusal(cls, layout: Layout) -> str:
        """Why this method cannot run in a comparison's privacy cell of ``layout`` although each side can be
        protected ("" where it can)."""
        return ""

    def extra_parties(self, parties: tuple[PartyInfo, ...]) -> tuple[PartyInfo, ...]:
        """Data-less parties (server, dealer) this method needs beside the data holders."""
        return ()

    def agreed(self, role: str) -> dict[str, Any]:
        """What the other parties rely on of a party's own settings in ``role`` (a width they receive): a party
        whose own settings give other values than the proposal's refuses at setup."""
        return {}

    def config_json(self) -> str:
        """The config as JSON text (a model card, a run's key, a log line)."""
        return schema.to_json(self.config)

    def config_table(self) -> dict[str, Any]:
        """The config as plain dicts and lists: what a setup carries (as a :class:`~vflo.comm.message.Table`)."""
        plain: dict[str, Any] = schema.to_plain(self.config)
        return plain

    @classmethod
    def from_config(cls, raw: Mapping[str, Any]) -> Method:
        """The method with the config ``raw`` (a table, as :meth:`config_table` gives), checked as any config is."""
        return cls(schema.build(cls.Config, dict(raw), where=f"methods.{cls.name}"))

    @classmethod
    def from_config_json(cls, text: str) -> Method:
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{cls.name}: config is not valid JSON: {exc}") from exc
        if not isinstance(raw, dict):
            raise ConfigError(f"{cls.name}: config is not a table")
        return cls.from_config(raw)

    # -- the coordinator -------------------------------------------------------------------------

    def check_task(self, task: Task) -> None:
        if task not in self.tasks:
            raise MethodError(
                f"{self.name} supports {sorted(self.tasks)} tasks, not {task!r}; pick another method or dataset"
            )

    @abstractmethod
    def fit(self, fed: Federation) -> None:
        """Train, driving every exchange through ``fed``."""

    @abstractmethod
    def predict(self, fed: Federation, ids: np.ndarray) -> np.ndarray:
        """Class probabilities (n, C) or regression values (n,) for ``ids`` held by the active party."""

    def summary_stats(self) -> dict[str, float]:
        """Method-specific facts for the results table (e.g. how many entities were used)."""
        return {}

    def epsilon_scope(self) -> str:
        """What the ε figures in :meth:`summary_stats` cover and what they do not (empty: no ε reported)."""
        return ""

    def epsilon_columns(self, stats: Mapping[str, float]) -> dict[str, str]:
        """The results columns that go with ``stats`` (its summary stats): where they report an ε, what it covers."""
        return {"epsilon_scope": self.epsilon_scope()} if any(k.startswith("epsilon") for k in stats) else {}

    # -- saving and loading a fitted model: what ``saves`` declares, through one codec ------------------------

    def coordinator_state(self, fed: Federation) -> State:
        """What the active party keeps of the fitted model: enough, with the other parties' parts, to score."""
        if self.simulation_only:
            raise MethodError(f"{self.name} is an oracle baseline that pools every party's raw features: it exists "
                              "only in simulation, so there is no deployable model to save")
        return {**saved.encode(self.saves.model, lambda _: self, model=True),
                **saved.encode(self.saves.of("active"), self._part_of(fed.ctx), model=False)}

    def load_coordinator_state(self, fed: Federation, state: Mapping[str, Value]) -> None:
        """Restore what :meth:`coordinator_state` returned, on a federation of the same parties."""
        self._refuse_unclaimed(self.saves.model + self.saves.of("active"), state)
        saved.decode(self.saves.model, state, lambda _: self, method=self, where=fed, model=True)
        saved.decode(self.saves.of("active"), state, self._part_of(fed.ctx), method=self, where=fed.ctx,
                     model=False)

    def party_state(self, ctx: NodeContext) -> State:
        """What another party keeps of the fitted model: its own part only."""
        return saved.encode(self.saves.of(ctx.info.role), self._part_of(ctx), model=False)

    def load_party_state(self, ctx: NodeContext, state: Mapping[str, Value]) -> None:
        """Restore what :meth:`party_state` returned, at that party."""
        declared = self.saves.of(ctx.info.role)
        self._refuse_unclaimed(declared, state)
        saved.decode(declared, state, self._part_of(ctx), method=self, where=ctx, model=False)

    def _part_of(self, ctx: NodeContext) -> Callable[[saved.Saved], Any]:
        def part(declared: saved.Saved) -> Any:
            kind = declared.part or self.saves.part
            assert kind is not None  # Saves checks that every part value has its class
            return ctx.part(kind)
        return part

    def _refuse_unclaimed(self, declared: tuple[saved.Saved, ...], state: Mapping[str, Value]) -> None:
        extra = saved.unclaimed(declared, state)
        if extra:
            raise MethodError(f"a saved {self.name} part holds {extra[:4]}, which {self.name} does not keep: it was "
                              "saved by another method or version")
