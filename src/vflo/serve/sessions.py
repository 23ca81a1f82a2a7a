"""How a served model's scoring session is opened: with partners deployed (each serving its saved part over
mutual TLS, reached over channels opened once), or with every party in this process (a simulation, the embedded
default), each partner reading its own rows."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from vflo.align.engines import AlignmentConfig
from vflo.artifacts import PartStore
from vflo.comm.local import LocalTransport
from vflo.data.partydata import PartyData
from vflo.errors import ConfigError
from vflo.federation.coordinator import Coordinator
from vflo.federation.session import Session
from vflo.methods.base import Method
from vflo.scoring import SavedModel
from vflo.serve.live import SESSION_MISSING, LiveModel, ServePolicy

Opened = tuple[Coordinator, Method, Callable[[], None]]
Opener = Callable[[SavedModel, PartyData, ServePolicy], Opened]


def in_process(partner_rows: Mapping[str, str | Path]) -> Opener:
    """Every partner in this process, reading its rows from its file (a simulation)."""

    def opened(model: SavedModel, own: PartyData, policy: ServePolicy) -> Opened:
        from vflo.federation.simulation import party_node

        active = model.card.active
        prepared = {active: model.rows(active, own)}
        for party in [] if model.active_only else model.card_partners():
            if party in partner_rows:
                prepared[party] = model.rows(party, partner_rows[party])
            elif policy.missing != "subset":
                raise ConfigError(f"{model.label} scores together with {party!r}: give its rows under [partners] "
                                  "(or serve it with missing = 'subset', which scores without it)")
        parties = [p for p in model.parties if p.name in prepared or not model.active_only]
        nodes = {p.name: party_node(p, None, prepared.get(p.name), peers=model.parties,
                                    store=PartStore(model.folder, party=p.name, role=p.role)) for p in parties}
        fed, method = model.restore(nodes[active], LocalTransport(nodes), missing=SESSION_MISSING[policy.missing])
        for party in fed.names():
            if party not in prepared and party not in fed.absent:
                fed.mark_absent(party, "no rows to score given", session=True)
        return fed, method, lambda: Session(fed).teardown()

    return opened


def deployed(deploy_path: str | Path) -> Opener:
    """The partners of a deployment (DEPLOY.toml), each serving its saved part (``vflo party serve PARTY.toml
    --save DIR``); the active party's table is matched with theirs by private set intersection once, when the
    session opens (:func:`prepare`), and each batch reuses that."""
    from vflo.deploy import load_deploy_config
    from vflo.deploy.party import start_party

    deploy = load_deploy_config(deploy_path)

    def opened(model: SavedModel, own: PartyData, policy: ServePolicy) -> Opened:
        if deploy.active.name != model.card.active:
            raise ConfigError(f"{model.label} was saved with {model.card.active!r} as the active party, but the "
                              f"deployment's [active] is {deploy.active.name!r}")
        # Each session its own server on a port of its own: the partners never call the active party while they
        # score, and two sessions open at once (an A/B test, or a swap) must not contend for the configured one.
        config = deploy.coordinator_config()
        config = replace(config, listen=f"{config.listen.rpartition(':')[0] or '127.0.0.1'}:0")
        party = start_party(config, data=None, serve=model.rows(model.card.active, own))
        try:
            # Opened within the deployment's own deadline (a partner loads its part); each batch then within the
            # model's: a partner past it is left out of that batch.
            fed, method = model.restore(party.node, party.transport, alignment=AlignmentConfig(method="psi"),
                                        missing=SESSION_MISSING[policy.missing])
        except BaseException:
            party.stop()
            raise
        try:
            prepare(fed, method)
        except BaseException:
            Session(fed).teardown()
            party.stop()
            raise
        transport: Any = party.transport
        if hasattr(transport, "deadline"):
            transport.deadline = policy.deadline_ms / 1000
            # A partner that cannot be reached is left out of the batch at once (and rests), not dialled again
            # and again within the deadline: its retries would hold every request of the batch.
            transport.retries = 0

        def close() -> None:
            try:
                Session(fed).teardown()
            finally:
                party.stop()

        return fed, method, close

    return opened


def prepare(fed: Coordinator, method: Method) -> None:
    """Align the active party's whole table with its partners once, when the session opens, each party keeping
    the intersection in its own alignments folder (a deployed party keeps one unless its config says
    ``alignments = ''``): each batch then reuses it in one small exchange, where a fresh private set intersection
    would cost a partner its whole set every time. A partner learns which of its people the active party may ask
    about, as ``vflo predict`` of the whole table would tell it; which of them it is asked about, batch by batch,
    as it must to answer."""
    partners = method.scoring_parties(fed.parties) or [p.name for p in fed.parties
                                                       if p.role == "passive" and p.name not in fed.absent]
    if partners:
        fed.align(fed.serving.ids, partners, purpose="serve")


def load_live(models: Mapping[str, SavedModel], name: str, *, rows: str, policy: ServePolicy,
              session: Opener | None) -> LiveModel:
    """Model ``name`` of ``models`` made live: its scoring session opened by ``session`` (none for an active-only
    model), the active party's table ``rows`` read once."""
    if name not in models:
        raise ConfigError(f"no saved model {name!r} to serve; saved: {sorted(models)}")
    model = models[name]
    own = model.active.preprocessing.read(rows, party=model.card.active)  # read once, standardised per batch
    fallback = None
    if policy.fallback is not None:
        if policy.fallback not in models:
            raise ConfigError(f"{name}'s fallback {policy.fallback!r} is not saved beside it; saved: {sorted(models)}")
        fallback = models[policy.fallback]
    if model.active_only:  # its session has the active party alone, opened once as any other
        session = in_process({})
    if session is None:
        raise ConfigError(f"{name} scores together with its partners: serve it with a deployment (deploy = "
                          "'DEPLOY.toml' in the serve config) whose partners serve their saved parts")
    fed, method, close = session(model, own, policy)
    return LiveModel(model, fed, method, own, policy=policy, fallback=fallback, close=close)
