"""The alignment engines, one line each, and how a run chooses among them.

A new engine is its module (the coordinator's side, the party's handlers, when it cannot run: an
:class:`~vflo.align.engine.Engine`) and one line in :data:`ENGINES`. The configuration (``[alignment] engine``),
a party's policy (``[policy] psi_protocols``), every node's handlers, ``vflo methods --messages`` and the docs read
this list; ``tests/test_engines.py`` runs the same checks over every entry.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

from vflo.align import linked, psi, unbalanced
from vflo.align.engine import Engine
from vflo.errors import ConfigError, RemoteError
from vflo.party.handlers import HandlerSet
from vflo.party.policy import Policy

if TYPE_CHECKING:
    from vflo.party.port import Aligning, Alignment

logger = logging.getLogger(__name__)

#: Every engine by name: vflo's own ECDH first (what ``auto`` falls back to), then the PSI library's.
ENGINES: dict[str, Engine] = {e.name: e for e in (
    psi.ENGINE,
    *linked.ENGINES,
    unbalanced.ENGINE,
)}
#: What ``auto`` runs where it can: the library's fastest balanced protocol; vflo's own ECDH otherwise.
AUTO_LIBRARY, AUTO_FALLBACK = "rr22", "vflo"
#: With ``engine = "auto"``, the PSI library runs from this many IDs at the active party: below it, its fixed cost
#: (a process per side, its link's redial when one side starts first) is more than vflo's own ECDH spends on all the
#: IDs (`python -m benchmarks.psi_engines` times both at several sizes).
AUTO_LIBRARY_FROM = 20_000


def library_engines() -> tuple[str, ...]:
    """The engines a partner runs only where its ``[policy] psi_protocols`` names them (the PSI library's)."""
    return tuple(name for name, e in ENGINES.items() if e.library)


def handler_sets() -> tuple[HandlerSet, ...]:
    """Each engine's party side, once."""
    seen: dict[int, HandlerSet] = {}
    for e in ENGINES.values():
        seen.setdefault(id(e.handlers), e.handlers)
    return tuple(seen.values())


def check_policy(policy: Policy, *, where: str = "policy") -> Policy:
    """``policy`` if every protocol its ``psi_protocols`` names is a registered library engine."""
    if policy.psi_protocols is not None:
        known = library_engines()
        if unknown := sorted(set(policy.psi_protocols) - set(known)):
            raise ConfigError(f"{where}.psi_protocols names {unknown}: give some of {', '.join(map(repr, known))}")
    return policy


@dataclass(frozen=True, kw_only=True)
class AlignmentConfig:
    """How shared IDs are found: ``plain`` (the coordinator's IDs are revealed to the other parties) or
    ``psi`` (private set intersection; ``mode = 'both'``: each party learns the intersection, ``'active'``:
    only the active party does). ``engine``, for PSI: one of :data:`ENGINES` (``'vflo'``: vflo's own ECDH over
    its messages; ``'rr22'``, ``'kkrt'``, ``'ecdh'``, ``'unbalanced'``: SecretFlow's PSI library over its own link,
    :mod:`vflo.align.spu`), or ``'auto'``: RR22 where the library is installed at both ends, the partner's policy
    takes it and the active party holds at least :data:`AUTO_LIBRARY_FROM` IDs, vflo's ECDH otherwise (the same
    intersection either way; the run's log and ledger say which ran)."""

    method: Literal["plain", "psi"] = "plain"
    mode: Literal["both", "active"] = "both"
    engine: str = "vflo"
    #: With PSI, where the parties keep their intersections (a deployed party's ``alignments`` folder): reuse a
    #: kept one that covers the IDs asked about while neither side's people changed (:mod:`vflo.align.kept`), and
    #: keep each fresh one. False: intersect afresh and keep nothing.
    reuse: bool = True

    def __post_init__(self) -> None:
        choices = (AUTO_FALLBACK, "auto", *(name for name in ENGINES if name != AUTO_FALLBACK))
        if self.engine not in choices:
            raise ConfigError(f"alignment.engine = {self.engine!r}: choose {', '.join(map(repr, choices[:-1]))} or "
                              f"{choices[-1]!r}")


#: A deployment's alignment where its config says nothing: private set intersection, by the engine that suits the
#: sizes (vflo's ECDH or the PSI library's RR22). Plain alignment sends the active party's IDs to every partner: a
#: deployment runs it only where its config asks and every partner's policy accepts it. (In one process, where no ID
#: leaves the process, :class:`AlignmentConfig`'s own default, plain, stays.)
DEPLOYED_ALIGNMENT = AlignmentConfig(method="psi", engine="auto")


def intersect(fed: Aligning, config: AlignmentConfig, ids: np.ndarray, parties: Sequence[str], *,
              purpose: str) -> tuple[Alignment, str]:
    """The private set intersection ``config`` asks for, and the engine that ran it. A named engine that cannot
    run is a :class:`ConfigError` saying why; ``auto`` falls back to vflo's own ECDH, and says why in the log."""
    name = config.engine if parties else AUTO_FALLBACK
    if name == "auto":
        library = ENGINES[AUTO_LIBRARY]
        why = library.unavailable(fed)
        if not why and len(ids) < AUTO_LIBRARY_FROM:
            why = (f"{len(ids)} IDs, fewer than {AUTO_LIBRARY_FROM:,}: the library's fixed cost (two processes, its "
                   "link's redial) outweighs vflo's own ECDH")
        if not why:
            try:
                return library.intersect(fed, ids, parties, purpose, config.mode), library.name
            except RemoteError as exc:
                if exc.error_type != "RefusedError":
                    raise
                why = str(exc)
        logger.info("PSI by vflo's own ECDH: %s", why)
        name = AUTO_FALLBACK
    engine = ENGINES[name]
    if why := engine.unavailable(fed):
        raise ConfigError(why)
    return engine.intersect(fed, ids, parties, purpose, config.mode), engine.name
