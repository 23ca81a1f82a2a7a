"""The parties' own files as a comparison on them varies them (:mod:`vflo.experiments.compare_own`): who holds
whom, where test people come from, which columns each ``dropped`` share leaves out. Its own module, so that the
comparison's results (:class:`vflo.experiments.compare.Comparison`) can carry it without importing the code that
runs own-files comparisons."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from vflo.data.partydata import PartyData
from vflo.data.scenario import can_stratify
from vflo.seeding import numpy_rng


@dataclass(frozen=True, eq=False)
class OwnFiles:
    """The parties' files as the comparison varies them: who holds whom (after the ``rows`` sample), where each
    kind of test people is drawn from and how many, the columns each ``dropped`` share leaves out."""

    active: str
    partners: tuple[str, ...]
    files: dict[str, str]
    people: dict[str, int]
    columns: dict[str, tuple[str, ...]]
    #: party -> the IDs it keeps in the ``rows`` sample (None: every one).
    sample: dict[str, np.ndarray] | None
    #: The active party's people before the sample.
    active_rows: int
    #: kind (``aligned``: every party holds them; ``active_only``) -> the IDs and labels test people come from.
    pools: dict[str, tuple[np.ndarray, np.ndarray]]
    #: kind -> test people of that kind in each repeat.
    tests: dict[str, int]
    #: share -> partner -> the columns it leaves out in ``dropped`` cells.
    dropped: dict[float, dict[str, tuple[str, ...]]]

    @property
    def shared(self) -> int:
        """People every party holds (the real overlap, after the sample)."""
        return len(self.pools["aligned"][0])

    def keep(self, parties: Sequence[PartyData]) -> list[PartyData]:
        """The parties' rows in the ``rows`` sample."""
        if self.sample is None:
            return list(parties)
        return [p.subset(self.sample[p.party]) if p.party in self.sample else p for p in parties]

    def test_people(self, seed: int) -> dict[str, np.ndarray]:
        """Each kind's test people for the repeat whose layout seed is ``seed`` (the same in every cell)."""
        from sklearn.model_selection import train_test_split

        out = {}
        for kind, (ids, y) in self.pools.items():
            n = self.tests[kind]
            if n == 0:
                out[kind] = ids[:0]
                continue
            rng = numpy_rng(seed, "compare test people", kind)
            stratify = y if can_stratify(y, n, len(ids)) else None
            _, test = train_test_split(ids, test_size=n, random_state=int(rng.integers(2**31)), stratify=stratify)
            out[kind] = np.sort(np.asarray(test))
        return out
