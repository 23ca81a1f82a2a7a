"""What an alignment engine is: a way to find the IDs two parties share, the party's side of it, and when it
cannot run. Each engine's module declares its :class:`Engine`; :mod:`vflo.align.engines` lists them (one line
each), and the configuration, the parties' policies, the nodes and the docs read that list."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from vflo.party.handlers import HandlerSet

if TYPE_CHECKING:
    from vflo.party.port import Aligning, Alignment

#: The coordinator's side: the subset of ``ids`` every party in ``parties`` holds, for ``purpose`` (``"train"`` or
#: ``"serve"``), in ``mode`` (``"both"``: every party learns the intersection; ``"active"``: only the coordinator).
Intersect = Callable[["Aligning", np.ndarray, Sequence[str], str, str], "Alignment"]


def always(fed: Aligning) -> str:
    """An engine every coordinator can run."""
    return ""


@dataclass(frozen=True)
class Engine:
    """One alignment engine: its ``name`` (what ``[alignment] engine`` gives), one line on what it is (``about``),
    whether it is the PSI library's (``library``: a partner runs it only where its ``[policy] psi_protocols``
    names it), the coordinator's side (``intersect``), the party's side (``handlers``, served by every node), and
    why it cannot run for a coordinator (``unavailable``: "" where it can)."""

    name: str
    about: str
    intersect: Intersect
    handlers: HandlerSet
    library: bool = False
    unavailable: Callable[[Aligning], str] = always
