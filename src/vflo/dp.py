"""Differential privacy for what a party sends: the Gaussian mechanism on rows, and its privacy accounting.

A party clips each row it releases to L2 norm ``clip`` (C) and adds N(0, σ²C²) to every value (σ: the noise
multiplier). Two data sets are neighbours when one person's row differs, so a release has sensitivity 2C
and each release is a Gaussian mechanism with μ = 2/σ in the sense of Gaussian differential privacy
(Dong, Roth & Su, "Gaussian Differential Privacy", JRSS-B 2022). A person whose row is released k times
(once per epoch, or at training and again at scoring) is protected by μ = √k · 2/σ: Gaussian mechanisms
compose exactly under GDP, and with no subsampling to amplify, nothing tighter applies.

**One ε per person, from a maintained accountant.** A person's account holds three kinds of events: Gaussian
releases of their row (their μ² add up), pure-ε releases (Laplace, RAP's local DP) and DP-SGD runs of a network
the party fitted on its own rows (:class:`SampledGaussian`: its noise multiplier, Poisson sampling rate and
steps). Their composition is the privacy loss distribution of Google's ``dp_accounting`` (PLD accounting, with
replace-one neighbours: one person's row changes, their ID does not, as in vertical federated learning where the
partners know who is shared), read at the party's δ (:func:`composed_epsilon`). For Gaussian releases alone it
agrees with the exact μ-GDP conversion (Dong, Roth & Su, Corollary 2.13; :func:`gdp_epsilon`, which the tests
check it against) to the accountant's discretisation.

**What ε covers.** Each released row is a function of that person's row *given the model that computes it*.
Where that model (APC-VFL's encoder, a SplitNN bottom, RAP's projection) was itself fitted on every row without
privacy, replacing one person moves every row's release, not only theirs, and the 2C bound holds only given a
fixed model: ε covers the release given a fixed encoder; the encoder itself was trained without privacy
(:data:`SCOPE_FIXED_MODEL`). Only a release whose mapping does not depend on the other rows (a data-independent
projection, raw features) is covered in full, or one whose model the party trained with DP-SGD
(:class:`DPSGD`, :mod:`vflo.nn.private`): its account then holds the training too (:data:`SCOPE_END_TO_END`).

**Noise a party cannot be asked to repeat.** Noise on rows comes from the party's own secret
(:class:`RowNoise`, keyed by :class:`vflo.seeding.PartySecret`): independent for every person and every row
value, and the same again for the same row, so a second request for a row returns the first release and
averages nothing away. :class:`PrivacyAccount` counts every release a party makes, per person, against the
budget in its own config (``[privacy] epsilon``, ``delta``) and refuses the release that would pass it.

**A budget by default, kept across restarts.** A deployed party without ``[privacy]`` gets
:data:`DEFAULT_BUDGET`; its account is a journal in its own folder (:class:`PrivacyAccount` with ``journal``), so
a restart continues it rather than starting again at zero.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import os
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vflo.errors import ConfigError, DataError, PrivacyBudgetError

logger = logging.getLogger(__name__)

#: What a release's ε covers when the model computing it was fitted, without privacy, on every row.
SCOPE_FIXED_MODEL = "ε covers the release given a fixed encoder; the encoder itself was trained without privacy"
#: What it covers when that model was trained with DP-SGD and its account holds the training.
SCOPE_END_TO_END = ("ε covers everything the party sent: its network's DP-SGD training and every release of its "
                    "outputs, composed per person; not what partners learn from their own data")
#: Pure ε past which the accountant adds it to the rest instead of composing distributions (e^ε overflows a float
#: near 700; at such ε the tighter composition would not change what anyone concludes).
PURE_APART = 50.0
#: The accountant's discretisation of the privacy loss: ε is an upper bound whatever it is (the rounding is
#: pessimistic); coarser than dp_accounting's default 1e-4, which it stays within 1e-3 of (tests/test_dp_sgd.py
#: checks both), it composes a run's many steps in a fraction of the time.
DISCRETISATION = 1e-3


#: A DP-SGD run in an account: (noise multiplier, sampling rate, steps).
Run = tuple[float, float, int]


@dataclass(frozen=True, kw_only=True)
class SampledGaussian:
    """One DP-SGD run as the accountant sees it: ``steps`` steps, each a Gaussian mechanism with
    ``noise_multiplier`` (noise std over the clipping norm) on a batch that holds each person with probability
    ``sample_rate`` (Poisson sampling drawn from the party's own secret)."""

    noise_multiplier: float
    sample_rate: float
    steps: int

    def __post_init__(self) -> None:
        if not self.noise_multiplier > 0 or not 0 < self.sample_rate <= 1 or self.steps < 0:
            raise ConfigError(f"a DP-SGD run needs noise_multiplier > 0, 0 < sample_rate <= 1 and steps >= 0; got "
                              f"{self.noise_multiplier}, {self.sample_rate}, {self.steps}")

    def as_run(self) -> Run:
        return (float(self.noise_multiplier), float(self.sample_rate), int(self.steps))


@dataclass(frozen=True, kw_only=True)
class DPSGD:
    """DP-SGD for a network a party fits on its own rows whose outputs leave it (Abadi et al. 2016, by Opacus):
    each person's gradient clipped to L2 norm ``max_grad_norm``, Gaussian noise of std ``noise_multiplier`` ·
    ``max_grad_norm`` added to each batch's sum, batches drawn by Poisson sampling at ``sample_rate`` from the
    party's own secret, for the training config's ``max_epochs`` (about 1/``sample_rate`` steps each), with no
    early stopping or validation on the private rows. The party's account is charged for the whole run before it
    starts (:class:`SampledGaussian`)."""

    noise_multiplier: float = 1.0
    max_grad_norm: float = 1.0
    sample_rate: float = 0.01

    def __post_init__(self) -> None:
        if not self.noise_multiplier > 0 or not self.max_grad_norm > 0:
            raise ConfigError(f"dp_sgd: noise_multiplier and max_grad_norm must be positive, got "
                              f"{self.noise_multiplier}, {self.max_grad_norm}")
        if not 0 < self.sample_rate <= 1:
            raise ConfigError(f"dp_sgd: sample_rate is each person's chance to be in a batch, in (0, 1]; got "
                              f"{self.sample_rate}")

    def steps(self, epochs: int) -> int:
        """Steps in ``epochs`` epochs: an epoch is 1/``sample_rate`` batches (rounded), at least one."""
        return epochs * max(1, round(1.0 / self.sample_rate))

    def event(self, epochs: int) -> SampledGaussian:
        """What ``epochs`` epochs on the party's own rows alone cost each person."""
        return SampledGaussian(noise_multiplier=self.noise_multiplier, sample_rate=self.sample_rate,
                               steps=self.steps(epochs))

    def within_batches(self, epochs: int) -> SampledGaussian:
        """What ``epochs`` epochs cost each person when the batches are shared (split learning: the coordinator
        names them) and the party draws its rows from each at ``sample_rate``: a person's row is in one named batch
        an epoch, and only the steps of those batches can depend on it."""
        return SampledGaussian(noise_multiplier=self.noise_multiplier, sample_rate=self.sample_rate, steps=epochs)


@dataclass(frozen=True, kw_only=True)
class RandomisedResponse:
    """Label differential privacy by randomised response (Warner 1965; as RR in Ghazi et al., "Deep Learning with
    Label Differential Privacy", NeurIPS 2021): each label is kept with probability e^ε / (e^ε + k - 1) and
    otherwise replaced by one of the other k - 1 classes, uniformly. One person's label changing moves the
    probability of any output by at most e^ε, so the randomised labels are ε-DP for the labels, once; everything
    computed from them afterwards (a network's gradients, every epoch of them) is post-processing and spends
    nothing more. It protects labels only: a value computed from the holder's features as well carries those."""

    epsilon: float

    def __post_init__(self) -> None:
        if not (isinstance(self.epsilon, int | float) and math.isfinite(self.epsilon) and self.epsilon > 0):
            raise ConfigError(f"label_epsilon must be a positive number (ε of randomised response on the labels), "
                              f"got {self.epsilon!r}")

    def keep(self, classes: int) -> float:
        """The probability that a label is kept, with ``classes`` classes."""
        return 1.0 / (1.0 + (classes - 1) * math.exp(-self.epsilon))

    def apply(self, y: np.ndarray, classes: int, rng: np.random.Generator) -> np.ndarray:
        """The labels ``y`` (integers in [0, classes)) randomised: a fresh draw from ``rng`` per label."""
        labels = np.asarray(y)
        if classes < 2 or (not np.issubdtype(labels.dtype, np.integer) and not np.all(labels == np.round(labels))):
            raise DataError("randomised response draws among classes: it needs class labels (classification), not "
                            "a regression target; leave label_epsilon out for regression")
        labels = labels.astype(np.int64)
        flip = rng.random(len(labels)) >= self.keep(classes)
        # One of the other classes, uniformly: a shift of 1 to k-1 places around the classes.
        shifted = (labels + rng.integers(1, classes, size=len(labels))) % classes
        return np.where(flip, shifted, labels)


@dataclass(frozen=True, kw_only=True)
class GaussianNoise:
    """Clip rows to L2 norm ``clip``, add N(0, (noise_multiplier · clip)²); ``delta`` for the ε reported."""

    clip: float = 1.0
    noise_multiplier: float = 1.0
    delta: float = 1e-5

    def __post_init__(self) -> None:
        if not self.clip > 0 or not self.noise_multiplier > 0:
            raise ConfigError(f"noise: clip and noise_multiplier must be positive, got {self.clip}, "
                              f"{self.noise_multiplier}")
        if not 0 < self.delta < 1:
            raise ConfigError(f"noise: delta must be in (0, 1), got {self.delta}")

    def clipped(self, rows: np.ndarray) -> np.ndarray:
        """Each row scaled to L2 norm at most ``clip``, as float64 of shape (n, values)."""
        flat = np.asarray(rows).reshape(len(rows), -1).astype(np.float64)
        norms = np.linalg.norm(flat, axis=1, keepdims=True)
        out: np.ndarray = flat * np.minimum(1.0, self.clip / np.maximum(norms, 1e-12))
        return out

    def release(self, rows: np.ndarray, rng: np.random.Generator, account: PrivacyAccount | None = None,
                ids: np.ndarray | None = None, *, what: str = "rows") -> np.ndarray:
        """The rows as a party sends them: each clipped to norm ``clip``, then fresh noise from ``rng`` (a
        party's own secret stream); same shape and dtype. ``account`` (with the people's ``ids``) is charged
        first, one release each. For rows that may be asked for again, use :meth:`release_rows`."""
        if account is not None:
            if ids is None:
                raise ConfigError(f"a counted release of {what} needs the IDs of the people it describes")
            account.charge(ids, mu=self.mu, what=what)
        X = np.asarray(rows)
        flat = self.clipped(X)
        noisy = flat + rng.normal(0.0, self.noise_multiplier * self.clip, size=flat.shape)
        out: np.ndarray = noisy.reshape(X.shape).astype(X.dtype)
        return out

    def release_rows(self, rows: np.ndarray, ids: np.ndarray, noise: RowNoise,
                     account: PrivacyAccount | None = None, *, what: str = "rows") -> np.ndarray:
        """Rows of people ``ids`` as a party sends them: clipped, then noise keyed by the party's secret, the ID
        and the row, so the same row released again is the same release. ``account`` is charged first (each
        person once per distinct release) and refuses past the party's budget."""
        X = np.asarray(rows)
        flat = self.clipped(X)
        std, prints = noise.normal(ids, flat)
        if account is not None:
            account.charge(ids, prints, mu=self.mu, what=what)
        noisy = flat + self.noise_multiplier * self.clip * std
        out: np.ndarray = noisy.reshape(X.shape).astype(X.dtype)
        return out

    @property
    def mu(self) -> float:
        """μ of one release in Gaussian differential privacy."""
        return 2.0 / self.noise_multiplier

    def epsilon(self, releases: int = 1) -> float:
        """ε at ``delta`` for a person whose row this mechanism released ``releases`` times."""
        return composed_epsilon(releases * self.mu**2, 0.0, (), self.delta)


def _phi(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def composed_epsilon(mu2: float, pure: float, training: Sequence[SampledGaussian | Run], delta: float, *,
                     relation: str = "replace") -> float:
    """The smallest ε at which one person is (ε, ``delta``)-DP after Gaussian releases whose μ² sum to ``mu2``,
    pure-ε releases summing to ``pure`` and the DP-SGD runs ``training``: their privacy loss distributions
    composed by dp_accounting. ``relation``: ``"replace"`` (one person's row changes: vflo's, see the module) or
    ``"add_remove"`` (one person's row is added or removed: Opacus's, for checking against it)."""
    runs = tuple(t.as_run() if isinstance(t, SampledGaussian) else t for t in training)
    return _composed(round(mu2, 12), round(pure, 12), tuple(sorted(runs)), delta, relation)


def _neighbours(relation: str) -> Any:
    """dp_accounting's name for ``relation`` (``"replace"`` or ``"add_remove"``)."""
    from dp_accounting import NeighboringRelation

    return {"replace": NeighboringRelation.REPLACE_ONE, "add_remove": NeighboringRelation.ADD_OR_REMOVE_ONE}[relation]


@functools.lru_cache(maxsize=4096)
def _composed(mu2: float, pure: float, runs: tuple[Run, ...], delta: float,
              relation: str) -> float:
    from dp_accounting.pld import common
    from dp_accounting.pld import privacy_loss_distribution as pld

    if pure > PURE_APART:
        # A loss distribution of e^ε overflows; pure ε-DP composes with the rest at most additively (basic composition).
        return pure + _composed(mu2, 0.0, runs, delta, relation)
    # The loss distribution spans about μ²/2 ± 10μ (releases) or (2/σ)² (a step with little noise): with little
    # noise the default grid would not fit in memory, and ε is then large enough that a coarser one loses nothing.
    scale = max([1.0, mu2 / 2 + 10 * math.sqrt(mu2), *((2.0 / sigma) ** 2 for sigma, _, _ in runs)])
    step = DISCRETISATION * max(1.0, scale / 1000)
    parts = []
    if mu2 > 0:
        # μ = 2/σ for a release of sensitivity 2C under noise σC (replace-one): σ = 2/√(Σμ²).
        parts.append(pld.from_gaussian_mechanism(standard_deviation=2.0 / math.sqrt(mu2),
                                                 neighboring_relation=_neighbours(relation),
                                                 value_discretization_interval=step))
    if pure > 0:
        parts.append(pld.from_privacy_parameters(common.DifferentialPrivacyParameters(epsilon=pure, delta=0.0),
                                                 value_discretization_interval=step))
    parts += [_training(sigma, rate, int(steps), step, relation) for sigma, rate, steps in runs if steps]
    if not parts:
        return 0.0
    total = parts[0]
    for part in parts[1:]:
        total = total.compose(part)
    return float(total.get_epsilon_for_delta(delta))


@functools.lru_cache(maxsize=256)
def _training(sigma: float, rate: float, steps: int, step: float, relation: str) -> Any:
    """A DP-SGD run's privacy loss distribution: the same run is in many people's accounts and many plans, and
    composing its steps is the accountant's slowest work, so it is done once."""
    from dp_accounting.pld import privacy_loss_distribution as pld

    return pld.from_gaussian_mechanism(standard_deviation=sigma, sampling_prob=rate,
                                       neighboring_relation=_neighbours(relation),
                                       value_discretization_interval=step).self_compose(steps)


def gdp_delta(mu: float, epsilon: float) -> float:
    """δ of a μ-GDP mechanism at ``epsilon``: the closed form the tests check the accountant against."""
    from scipy.special import log_ndtr

    # e^ε Φ(x) in log space: with little noise (large μ) ε reaches hundreds, where e^ε alone overflows.
    return _phi(-epsilon / mu + mu / 2) - math.exp(epsilon + float(log_ndtr(-epsilon / mu - mu / 2)))


def gdp_epsilon(mu: float, delta: float) -> float:
    """The smallest ε at which a μ-GDP mechanism is (ε, δ)-DP (bisection on the exact conversion): the closed form
    for Gaussian releases alone, which the tests check :func:`composed_epsilon` against."""
    if mu <= 0:
        return 0.0
    if gdp_delta(mu, 0.0) <= delta:
        return 0.0
    lo, hi = 0.0, 1.0
    while gdp_delta(mu, hi) > delta:
        hi *= 2
        if hi > 1e6:
            return math.inf
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if gdp_delta(mu, mid) > delta else (lo, mid)
    return hi


def laplace_epsilon(per_value: float, values: int) -> float:
    """ε of a row whose ``values`` entries each went through a Laplace mechanism at ``per_value`` (basic
    composition, tight for Laplace)."""
    return per_value * values


_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_GAMMA2 = np.uint64(0xD1B54A32D192ED03)


def _mix64(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser, on arrays of uint64 (wrapping arithmetic)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    out: np.ndarray = z ^ (z >> np.uint64(31))
    return out


class RowNoise:
    """Noise for the rows a party releases, fixed by its secret ``key``, the person's ID and the row's values.

    Each row gets a 256-bit keyed BLAKE2b digest of (ID, row); half of it seeds that row's values (two
    SplitMix64 streams), half is the release's fingerprint for :class:`PrivacyAccount`. Without the key no one
    can recompute a value; rows of different people, or one person's different rows, get independent noise; the
    same row again gets the same noise. One-row releases therefore carry independent noise (keying by the number
    of rows did not), and asking twice returns the first release.
    """

    __slots__ = ("_key",)

    def __init__(self, key: bytes) -> None:
        if len(key) < 16:
            raise ConfigError("RowNoise needs a key of at least 16 secret bytes")
        self._key = bytes(key[:64])

    def __repr__(self) -> str:
        return "RowNoise(<key hidden>)"

    def _digests(self, ids: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, list[bytes]]:
        rows = np.ascontiguousarray(rows, dtype=np.float64)
        if len(ids) != len(rows):
            raise ConfigError(f"RowNoise: {len(ids)} IDs for {len(rows)} rows")
        words = np.empty((len(rows), 2), dtype=np.uint64)
        prints: list[bytes] = []
        key = self._key
        for i, (pid, row) in enumerate(zip(np.asarray(ids).tolist(), rows, strict=True)):
            digest = hashlib.blake2b(str(pid).encode("utf-8") + b"\x00" + row.tobytes(), key=key,
                                     digest_size=32).digest()
            words[i] = np.frombuffer(digest[:16], dtype=np.uint64)
            prints.append(digest[16:])
        return words, prints

    def uniform(self, ids: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, list[bytes]]:
        """Uniforms in (0, 1), one per value of each row, and each row's fingerprint."""
        words, prints = self._digests(ids, rows)
        width = int(np.asarray(rows).reshape(len(rows), -1).shape[1]) if len(rows) else 0
        j = np.arange(1, width + 1, dtype=np.uint64)[None, :]
        z = _mix64(words[:, :1] + j * _GAMMA) ^ _mix64(words[:, 1:] + j * _GAMMA2)
        u: np.ndarray = ((z >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53)
        return u, prints

    def normal(self, ids: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, list[bytes]]:
        """Standard normal values, one per value of each row, and each row's fingerprint."""
        from scipy.special import ndtri

        u, prints = self.uniform(ids, rows)
        return ndtri(u), prints

    def laplace(self, ids: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, list[bytes]]:
        """Standard Laplace values (scale 1), one per value of each row, and each row's fingerprint."""
        u, prints = self.uniform(ids, rows)
        centred = u - 0.5
        return -np.sign(centred) * np.log1p(-2.0 * np.abs(centred)), prints


@dataclass(frozen=True, kw_only=True)
class PrivacyBudget:
    """What a party lets out of each person's privacy over everything it releases: (ε, δ); in its own config
    as ``[privacy] epsilon = ..., delta = ...``.

    ``protect`` (the default for a ``[privacy]`` a party writes): everything the party sends that is derived from
    its rows must be in its account, end to end. At setup it runs a method whose side it can protect, with the
    noise its own settings give or, where they give none, with noise calibrated to the budget (DP-SGD for its
    networks, noised releases); it refuses any other method, naming why. ``protect = false`` bounds only the
    releases a method noises anyway (a weaker choice, named in the config; :data:`DEFAULT_BUDGET`'s)."""

    epsilon: float
    delta: float = 1e-5
    protect: bool = True

    def __post_init__(self) -> None:
        if not (isinstance(self.epsilon, int | float) and math.isfinite(self.epsilon) and self.epsilon > 0):
            raise ConfigError(f"[privacy] epsilon must be a positive number, got {self.epsilon!r}")
        if not 0 < self.delta < 1:
            raise ConfigError(f"[privacy] delta must be in (0, 1), got {self.delta!r}")


#: A deployed party's budget when its config has no ``[privacy]``: ε = 8 at δ = 1e-5 per person, over everything
#: it releases under noise for as long as its account lasts. Why 8: it is the upper end of the per-person ε that
#: published deployments of differential privacy state, and a figure past which the ε-DP guarantee (a
#: likelihood ratio of e^8, about 3,000) no longer bounds anything a reader would call private; what it stops is
#: the unbounded case, a coordinator asking for noisy releases until their noise averages away. A party whose
#: noised method needs more says so in its own config (``[privacy] epsilon = ...``), named and logged. It does not
#: protect (``protect = false``): a party that wants everything it sends covered writes its own ``[privacy]``.
DEFAULT_BUDGET = PrivacyBudget(epsilon=8.0, delta=1e-5, protect=False)


@dataclass(frozen=True, kw_only=True)
class PrivacyPlan:
    """What a party's side of a run will spend of each person's privacy, at most, known before it starts:
    ``releases`` Gaussian releases at ``mu`` each, ``pure_releases`` pure-ε releases at ``epsilon`` each, the
    DP-SGD runs ``training``; ``what`` says it in words for the party's log and its refusal."""

    mu: float = 0.0
    releases: int = 0
    epsilon: float = 0.0
    pure_releases: int = 0
    training: tuple[SampledGaussian, ...] = ()
    what: str = ""

    @property
    def spends(self) -> bool:
        """Whether the plan spends anything: a side that sends nothing derived from its rows plans nothing."""
        return bool(self.releases or self.pure_releases or self.training)


#: The noise scales calibration searches between (see :func:`calibrate`): below the first a DP-SGD step's loss
#: distribution outgrows memory, past the last nothing useful is left of the signal.
CALIBRATION_RANGE = (0.3, 300.0)


def calibrate(fits: Callable[[float], bool], *, steps: int = 14) -> float | None:
    """The smallest noise scale s in :data:`CALIBRATION_RANGE` with ``fits(s)`` (a run at that scale stays within
    the budget; ε falls as s grows), to within a factor of 1.002 (bisection on log s); None if even the largest does
    not fit."""
    low, high = (math.log(x) for x in CALIBRATION_RANGE)
    if not fits(math.exp(high)):
        return None
    if fits(math.exp(low)):
        return math.exp(low)
    for _ in range(steps):
        mid = (low + high) / 2
        low, high = (low, mid) if fits(math.exp(mid)) else (mid, high)
    return math.exp(high)


class PrivacyAccount:
    """Every differentially private release a party makes, per person, and the budget that bounds them.

    Each person's events (Gaussian releases, pure-ε releases, DP-SGD runs over their row) compose into one ε at
    δ by :func:`composed_epsilon`. A release whose fingerprint was counted already is the same release again
    (:class:`RowNoise`) and costs nothing. A charge that would put anyone past the budget is refused whole,
    before anything is sent; :meth:`plan` gives what a set of charges would bring, without making them.

    With ``journal`` (a file in the party's own folder), every charge is appended to it before the release
    leaves, and an account opened on the same file continues where the last one ended: a restarted party does
    not start its people's privacy again at zero. The journal is compacted when opened (one line per group of
    people with the same spending) and written only this user can read (IDs are in it).
    """

    def __init__(self, party: str, budget: PrivacyBudget | None = None, *, journal: Path | None = None) -> None:
        self.party = party
        self.budget = budget
        self._mu2: dict[object, float] = {}
        self._pure: dict[object, float] = {}
        self._runs: dict[object, tuple[Run, ...]] = {}
        self._seen: set[bytes] = set()
        self.releases = 0
        self.journal = journal
        if journal is not None:
            self._open(journal)

    @classmethod
    def read(cls, journal: Path, party: str) -> PrivacyAccount:
        """The account ``journal`` holds, read without touching the file (``vflo party audit``)."""
        if not journal.is_file():
            raise DataError(f"{journal} does not exist: give party {party!r}'s privacy account (privacy_account in its "
                            "config; NAME_privacy.jsonl beside it by default)")
        account = cls(party)
        account._replay(journal)
        return account

    def spending(self, delta: float | None = None) -> list[tuple[float, int]]:
        """Each ε (at ``delta``, or the budget's δ, or 1e-5) the account's people reached, with how many reached it;
        the largest first."""
        d = self._delta(delta)
        counts: dict[float, int] = defaultdict(int)
        for person in self._everyone():
            m, e, r = self._spent(person)
            counts[composed_epsilon(m, e, r, d)] += 1
        return sorted(counts.items(), reverse=True)

    def _open(self, journal: Path) -> None:
        if journal.is_file():
            self._replay(journal)
        journal.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        # Compacted: the same spending in a line per group, written beside and swapped in whole.
        groups: dict[tuple[float, float, tuple[Run, ...]], list[object]] = defaultdict(list)
        for person in self._everyone():
            groups[self._spent(person)].append(person)
        lines = [{"releases": self.releases, "ids": [], "mu2": 0.0, "eps": 0.0,
                  "prints": sorted(p.hex() for p in self._seen)}]
        lines += [{"releases": 0, "ids": people, "mu2": m, "eps": e,
                   **({"sgd": [list(r) for r in runs]} if runs else {})} for (m, e, runs), people in groups.items()]
        fresh = journal.with_name(journal.name + ".new")
        fd = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.writelines(json.dumps(line) + "\n" for line in lines)
        fresh.replace(journal)
        if self.releases:
            logger.info("party %s continues its privacy account (%s): %d releases of %d people so far, ε up to %.3g",
                        self.party, journal, self.releases, self.people, self.epsilon())

    def _everyone(self) -> set[object]:
        return {*self._mu2, *self._pure, *self._runs}

    def _spent(self, person: object) -> tuple[float, float, tuple[Run, ...]]:
        return self._mu2.get(person, 0.0), self._pure.get(person, 0.0), self._runs.get(person, ())

    def _replay(self, journal: Path) -> None:
        texts = journal.read_text(encoding="utf-8").splitlines()
        for number, text in enumerate(texts, start=1):
            if not text.strip():
                continue
            try:
                line = json.loads(text)
                people, mu2, eps = line["ids"], float(line["mu2"]), float(line["eps"])
                prints = [bytes.fromhex(p) for p in line.get("prints", [])]
                releases = int(line["releases"])
                runs = tuple((float(s), float(q), int(n)) for s, q, n in line.get("sgd", []))
            except (ValueError, KeyError, TypeError) as exc:
                # A line cut short by a crash is the last; anything else means the file is not this account's.
                if number == len(texts):
                    logger.warning("party %s's privacy account %s ends in an incomplete line (the process stopped "
                                   "while writing it); it is set aside", self.party, journal)
                    continue
                raise DataError(f"{journal} line {number} is not a privacy account's ({exc}); it is party "
                                f"{self.party!r}'s record of what it released: restore it from a backup rather than "
                                "delete it") from exc
            for person in people:
                self._mu2[person] = self._mu2.get(person, 0.0) + mu2
                self._pure[person] = self._pure.get(person, 0.0) + eps
                if runs:
                    self._runs[person] = tuple(sorted((*self._runs.get(person, ()), *runs)))
            self._seen.update(prints)
            self.releases += releases

    def _record(self, people: list[object], prints: list[bytes], mu2: float, eps: float,
                runs: tuple[Run, ...]) -> None:
        assert self.journal is not None
        line = {"releases": 1, "ids": list(dict.fromkeys(people)), "mu2": mu2, "eps": eps,
                "prints": [p.hex() for p in prints], **({"sgd": [list(r) for r in runs]} if runs else {})}
        fd = os.open(self.journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\n")

    def _after(self, people: Sequence[object], mu: float, epsilon: float,
               runs: tuple[Run, ...]) -> dict[object, tuple[float, float, tuple[Run, ...]]]:
        out = {}
        for p in people:
            m, e, r = self._spent(p)
            out[p] = (m + mu * mu, e + epsilon, tuple(sorted((*r, *runs))) if runs else r)
        return out

    def plan(self, ids: np.ndarray, plan: PrivacyPlan) -> float:
        """The largest ε (at the budget's δ) anyone in ``ids`` would reach after ``plan``; nothing is charged."""
        after = self._after(np.asarray(ids).tolist(), math.sqrt(plan.releases) * plan.mu,
                            plan.pure_releases * plan.epsilon, tuple(t.as_run() for t in plan.training))
        return _largest_epsilon(after.values(), self._delta())

    def check_plan(self, ids: np.ndarray, plan: PrivacyPlan, *, what: str) -> float:
        """The ε ``plan`` brings the people ``ids`` to, if it stays within the budget; a
        :class:`PrivacyBudgetError` with the figures, before anything runs, if it does not."""
        planned = self.plan(ids, plan)
        if self.budget is not None and planned > self.budget.epsilon:
            raise PrivacyBudgetError(
                f"party {self.party!r} refuses {what} at setup: its plan ({plan.what}) would bring its people to "
                f"ε = {planned:.3g} at δ = {self.budget.delta:g} ({self.epsilon():.3g} spent before it), past its "
                f"budget ε = {self.budget.epsilon:g} ([privacy] epsilon in its own config); plan more noise, fewer "
                "epochs or releases, a lower sampling rate, or raise the budget")
        logger.info("party %s plans %s: %s, bringing its people to ε = %.3g at δ = %g (budget %s)", self.party, what,
                    plan.what, planned, self._delta(), "none" if self.budget is None else f"{self.budget.epsilon:g}")
        return planned

    def charge(self, ids: np.ndarray, prints: Sequence[bytes] | None = None, *, mu: float = 0.0,
               epsilon: float = 0.0, training: Sequence[SampledGaussian] = (), what: str = "rows") -> None:
        """Count one release of each person in ``ids`` (skipping rows whose fingerprint was counted), or the
        DP-SGD runs ``training`` over their rows."""
        people = np.asarray(ids).tolist()
        new_prints: list[bytes] = []
        if prints is not None:
            fresh = [i for i, p in enumerate(prints) if p not in self._seen]
            people = [people[i] for i in fresh]
            new_prints = [prints[i] for i in fresh]
        if not people:
            return
        runs = tuple(t.as_run() for t in training)
        after = self._after(people, mu, epsilon, runs)
        if self.budget is not None:
            worst = _largest_epsilon(after.values(), self.budget.delta)
            if worst > self.budget.epsilon:
                raise PrivacyBudgetError(
                    f"party {self.party!r} refuses to release {what}: {len(set(people))} people's privacy would reach "
                    f"ε = {worst:.3g} at δ = {self.budget.delta:g}, past its budget ε = {self.budget.epsilon:g} "
                    "([privacy] epsilon in its own config); release less often, with more noise, or raise the budget")
        if self.journal is not None:  # written before the release leaves: a crash after it still counts it
            self._record(people, new_prints, mu * mu, epsilon, runs)
        for person, (m, e, r) in after.items():
            self._mu2[person], self._pure[person] = m, e
            if r:
                self._runs[person] = r
        if prints is not None:
            self._seen.update(prints)
        self.releases += 1

    def _delta(self, delta: float | None = None) -> float:
        return delta if delta is not None else (self.budget.delta if self.budget is not None else 1e-5)

    def epsilon(self, delta: float | None = None) -> float:
        """The largest ε (at ``delta``, or the budget's δ, or 1e-5) of any person this party released."""
        return _largest_epsilon((self._spent(p) for p in self._everyone()), self._delta(delta))

    @property
    def people(self) -> int:
        return len(self._everyone())


def _largest_epsilon(spent: Iterable[tuple[float, float, tuple[Run, ...]]], delta: float) -> float:
    """The largest ε at ``delta`` of the spendings ``spent`` (one per person); equal spendings are composed once."""
    kinds = {(round(m, 12), round(e, 12), r) for m, e, r in spent}
    return max((composed_epsilon(m, e, r, delta) for m, e, r in kinds), default=0.0)
