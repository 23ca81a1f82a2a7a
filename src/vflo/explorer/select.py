"""``[select]`` in an experiment config: before each run trains, every partner drops its weak columns by its own
thresholds, as ``vflo explore --select`` has a deployed partner do (:func:`vflo.explorer.run.explore` over the
run's training people, the held-out people never explored; then :meth:`vflo.data.layout.FederatedData.without`).
Every method of the run trains and scores on the columns kept, the pooled baselines too, and a model saved from
the run reads its parties' full files without the dropped columns."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from vflo.data.layout import FederatedData
from vflo.errors import ConfigError
from vflo.explorer.run import explore
from vflo.trees.crypto import SCHEMES, Scheme

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class SelectSettings:
    """``[select]``: each partner drops its columns under information value ``iv_below`` or missing for more
    than ``missing_above`` of the people it shares (its policy's ``select_iv_below`` and
    ``select_missing_above``), never every one; explored with at most ``bins`` bins of ``min_bin_rows`` people
    (``explore_bins``, ``min_bin_rows``), the labels under ``scheme`` (``"ou"``, ``"paillier"``; ``"plaintext"``
    for quick rehearsals only)."""

    iv_below: float = 0.0
    missing_above: float = 1.0
    bins: int = 10
    min_bin_rows: int = 50
    scheme: Scheme = "ou"
    key_size: int = 2048

    def __post_init__(self) -> None:
        if not isinstance(self.iv_below, (int, float)) or self.iv_below < 0:
            raise ConfigError(f"select.iv_below must be an information value of at least 0, got {self.iv_below!r}; "
                              "e.g. iv_below = 0.02")
        if not isinstance(self.missing_above, (int, float)) or not 0 <= self.missing_above <= 1:
            raise ConfigError(f"select.missing_above must be a share in [0, 1], got {self.missing_above!r}; e.g. "
                              "missing_above = 0.5")
        if self.iv_below == 0 and self.missing_above == 1:
            raise ConfigError("[select] drops nothing with iv_below = 0 and missing_above = 1: give either, e.g. "
                              "iv_below = 0.02, or leave [select] out")
        if self.scheme not in SCHEMES:
            raise ConfigError(f"select.scheme must be one of {list(SCHEMES)}, got {self.scheme!r}")
        if not isinstance(self.bins, int) or not 2 <= self.bins <= 126:
            raise ConfigError(f"select.bins must be an integer from 2 to 126, got {self.bins!r}")
        if not isinstance(self.min_bin_rows, int) or self.min_bin_rows < 1:
            raise ConfigError(f"select.min_bin_rows must be an integer of at least 1, got {self.min_bin_rows!r}")


def selected(data: FederatedData, settings: SelectSettings) -> FederatedData:
    """``data`` with each partner's weak columns dropped, by exploring its training people privately."""
    parties = [data.train[p.name] for p in data.parties if p.name in data.train]
    found = explore(parties, task=data.task, classes=tuple(data.classes), bins=settings.bins,
                    min_bin_rows=settings.min_bin_rows, scheme=settings.scheme, key_size=settings.key_size,
                    select_iv_below=settings.iv_below, select_missing_above=settings.missing_above)
    for party, columns in found.dropped.items():
        logger.info("%s drops %d of its columns by [select]: %s", party, len(columns), ", ".join(columns) or "none")
    return data.without(found.dropped)
