"""What a party agrees to run: the methods it consents to, and bounds on their settings.

A party's own config holds its policy (``[policy]`` in PARTY.toml). A ``control.setup`` (or a saved model's
``control.load``) for a method outside it, or with a setting outside its bounds, is refused before anything
runs, and the coordinator's error names the party, the method and the setting. Masks a dealer deals (FedSVD,
VFL-ASP) are refused unless every block has at least ``min_mask_block`` rows (or the whole mask, when smaller) and
every row and column of a block mixes at least ``min_mask_mixing`` inputs, or what a random block of its size
surely does when that is less (``vflo.methods.masks.required_mixing``).

    [policy]
    methods = ["apc_vfl", "rap"]           # nothing else; leave out to agree to any method
    min_mask_block = 64                    # FedSVD/VFL-ASP: the smallest mask block taken from the dealer
    min_mask_mixing = 8.0                  # and how many inputs each row of a block must mix at least
    max_rows = 1000000                     # the most rows (IDs, positions, values) a peer may send or ask for at once
    max_mask_bytes = 1073741824            # the most a dealer draws for one deal (FedSVD, VFL-ASP): 1 GiB
    max_peer_calls = 8                     # a peer's calls this party serves at once (more are refused)
    max_peer_bytes = 536870912             # a peer's message bytes this party holds at once (512 MiB)
    max_arrival_seconds = 300.0            # how long a call's message may take to arrive before it is dropped
    max_peer_requests_per_second = 50.0    # a peer's scoring requests this party answers a second (leave out: any)
    serve_models = ["splitnn"]             # the saved models (labels or model IDs) it opens a scoring session for
    explore = true                         # answer vflo explore: per-bin counts and encrypted label sums
    explore_bins = 10                      # the most bins of each column it releases (equal-frequency)
    min_bin_rows = 50                      # the fewest people in a bin it releases (smaller ones merged)
    explore_answers = 1                    # how many explore requests it answers each peer while it runs
    explore_shared = "count"               # the label holder learns how many people are shared; "ids": who
    select_iv_below = 0.02                 # vflo explore --select: drop its own columns under this IV
    select_missing_above = 0.5             # and those whose values are missing for more than this share
    [policy.require]
    "fedsvd.svd.mask" = "dense"            # a setting that must have this value
    "rap.max_condition" = { max = 10.0 }   # or stay within bounds
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from vflo.comm.bounds import PeerBounds
from vflo.errors import ConfigError, ProtocolError


class PolicyError(ProtocolError):
    """A coordinator asked a party to run what its policy does not allow."""


@dataclass(frozen=True, kw_only=True)
class Policy:
    """``methods``: the methods this party consents to (empty: any); ``require``: a setting by its dotted path
    (``METHOD.FIELD.SUBFIELD``) and the value it must have, or a table with ``min`` and/or ``max``;
    ``min_mask_block`` and ``min_mask_mixing``: what masks from a dealer must reach to be taken
    (``OrthogonalMask.check_strength``); ``alignment``: ``"psi"`` (the default) refuses plain alignment (which
    shows this party the coordinator's IDs and tells the coordinator which of them it holds), training and
    scoring alike; ``"plain"`` accepts it (``"any"``, its older name, too): a weaker choice, named in the config;
    ``psi_protocols``: the PSI library's protocols it runs (engines of :mod:`vflo.align.engines`, ``"unbalanced"``
    included; None, the default: every one vflo registers; vflo's own ECDH always; the names are checked where
    the party's config is read, :func:`vflo.align.engines.check_policy`);
    ``psi_link``: ``HOST:PORT`` where its side of such a PSI listens (port 0: any free one; loopback by default,
    ``0.0.0.0:PORT`` with that port open to the other parties in a deployment);
    ``max_peer_calls``, ``max_peer_bytes`` and ``max_arrival_seconds``: what one peer may hold of this party's gRPC
    server at once (calls in progress, bytes of its messages received and not yet answered) and how long one
    call's message may take to arrive; a call beyond them is refused (or dropped, when late) without touching the
    other peers' calls. A client that is no peer is refused from its certificate before any of its message is
    read (:class:`vflo.comm.grpc_transport.PartyServer`). ``max_peer_bytes`` must hold the largest message a peer
    may send (``max_message_bytes``).
    ``max_peer_requests_per_second``: how many scoring requests (a saved model's session: requests that name people
    by ID) one peer may make a second, a token bucket per peer holding a second's worth (at least one); a request
    over it is refused, naming this key, and so is a kept intersection's reuse that comes first while the bucket is
    empty, so that an active party serving with ``missing = "subset"`` leaves this party out of that batch. None
    (the default): any rate, as nothing in vflo knows the traffic a deployment serves (a bound under it turns
    this party absent for the batches over it); what a peer may hold at once is bounded by ``max_peer_calls``,
    ``max_peer_bytes`` and ``max_rows`` whatever the rate, and every request is recorded with the people it
    names (``asked_log``, :mod:`vflo.party.asked`).
    ``serve_models``: the saved models, by label or model ID, this party opens a scoring session for
    (``control.load``); None (the default): every model it saved; ``[]``: none. A session for another is refused,
    naming it.
    ``explore``: whether it answers ``vflo explore`` (:mod:`vflo.party.explore`): for the people it shares with
    the label holder, per column, each of its own bins' people count and, under the label holder's encryption, the
    label sums, from which the label holder learns each bin's event rate (never a threshold, nor who is in which
    bin); off by default, a disclosure this party names. ``explore_bins``: the most equal-frequency bins of a column
    it releases (2 to 126); ``min_bin_rows``: the fewest people a released bin holds (adjacent bins merged until
    each does; the people missing a value withheld when fewer); ``explore_answers``: how many of a peer's explore
    requests it answers while it runs (1 by default: two answers over people sets that differ by one person would
    show the label holder, from the difference, which bin that person is in). ``explore_shared``: what the label
    holder learns of who it shares with this party: ``"count"`` (the default) how many alone, this party matching
    blinded IDs and learning who itself; ``"ids"`` also lets it explore over people it names after the deployment's
    alignment, which shows both who is shared. ``select_iv_below`` and
    ``select_missing_above``: its own feature selection, when the label holder sends it each of its columns'
    information value and missing share (``vflo explore --select``): it drops its columns under that IV or missing
    for more than that share of the shared people, from its training and serving rows and from the models it saves
    after (0 and 1, the defaults: none); it keeps at least its best column."""

    methods: tuple[str, ...] = ()
    require: dict[str, Any] = field(default_factory=dict)
    min_mask_block: int = 64
    min_mask_mixing: float = 8.0
    alignment: Literal["psi", "plain", "any"] = "psi"
    # Sizes a peer chooses, bounded so that a coordinator (or a stranger with a certificate) cannot make this party
    # allocate or compute without end: rows in one request (IDs to align or score, positions of a batch, rows of
    # a block) and the masks one deal draws (a block mask of m rows in blocks of b costs m x b x 8 bytes).
    max_rows: int = 1_000_000
    max_mask_bytes: int = 1 << 30
    psi_protocols: tuple[str, ...] | None = None
    psi_link: str = "127.0.0.1:0"
    # Bounds per peer on this party's gRPC server, so that one peer (or a stranger with a certificate) cannot hold
    # its memory or its threads: calls at once, message bytes held at once, seconds for a message to arrive.
    max_peer_calls: int = PeerBounds.max_peer_calls
    max_peer_bytes: int = PeerBounds.max_peer_bytes
    max_arrival_seconds: float = PeerBounds.max_arrival_seconds
    # Scoring: how fast one peer may ask (None: any rate), and which saved models it may ask with (None: every one).
    max_peer_requests_per_second: float | None = None
    serve_models: tuple[str, ...] | None = None
    # vflo explore: whether this party answers it, and how coarse what it releases is.
    explore: bool = False
    explore_bins: int = 10
    min_bin_rows: int = 50
    explore_answers: int = 1
    explore_shared: Literal["count", "ids"] = "count"
    select_iv_below: float = 0.0
    select_missing_above: float = 1.0

    def runs_psi(self, protocol: str) -> bool:
        """Whether this party runs the PSI library's ``protocol`` (its ``psi_protocols``; None: every one)."""
        return self.psi_protocols is None or protocol in self.psi_protocols

    @property
    def accepts_plain(self) -> bool:
        """Whether this party answers plain alignment (its config says ``alignment = "plain"``)."""
        return self.alignment in ("plain", "any")

    def psi_link_address(self) -> tuple[str, int]:
        """``psi_link`` as host and port (0: any free port)."""
        host, _, port = str(self.psi_link).rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(f"policy.psi_link = {self.psi_link!r} is not HOST:PORT (PORT 0: any free port)")
        return host, int(port)

    def __post_init__(self) -> None:
        if self.alignment not in ("psi", "plain", "any"):
            raise ConfigError(f"policy.alignment = {self.alignment!r}: give 'psi' (the default: IDs only by private "
                              "set intersection) or 'plain' (this party accepts seeing the coordinator's IDs)")
        self.psi_link_address()
        block, mixing = self.min_mask_block, self.min_mask_mixing
        if not isinstance(block, int) or isinstance(block, bool) or block < 2:
            raise ConfigError(f"policy.min_mask_block must be an integer of at least 2 (a block of one row passes it "
                              f"through up to its sign), got {block!r}; set min_mask_block = 64 or more under "
                              "[policy]")
        for key, least in (("max_rows", 1), ("max_mask_bytes", 1 << 20)):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ConfigError(f"policy.{key} must be an integer of at least {least}, got {value!r}; leave it out "
                                  f"for the default ({getattr(Policy, key)}) or raise it for larger data")
        for key, least in (("max_peer_calls", 1), ("max_peer_bytes", 1 << 20)):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ConfigError(f"policy.{key} must be an integer of at least {least}, got {value!r}; leave it out "
                                  f"for the default ({getattr(Policy, key)})")
        arrival = self.max_arrival_seconds
        if not _is_number(arrival) or arrival <= 0:
            raise ConfigError(f"policy.max_arrival_seconds must be a positive number of seconds, got {arrival!r}; "
                              f"leave it out for the default ({Policy.max_arrival_seconds}) or raise it for slow links")
        rate = self.max_peer_requests_per_second
        if rate is not None and (not _is_number(rate) or rate <= 0):
            raise ConfigError(f"policy.max_peer_requests_per_second must be a positive number of scoring requests a "
                              f"second per peer, got {rate!r}; leave it out to answer at any rate, or give e.g. "
                              "max_peer_requests_per_second = 50.0 under [policy]")
        served = self.serve_models
        if served is not None and (isinstance(served, str) or not all(isinstance(m, str) and m for m in served)):
            raise ConfigError(f"policy.serve_models must be a list of saved model labels or model IDs ([] for none), "
                              f"got {served!r}; e.g. serve_models = [\"credit_v2\"] under [policy], or leave it out "
                              "to serve every model this party saved")
        if not isinstance(self.explore, bool):
            raise ConfigError(f"policy.explore must be true or false, got {self.explore!r}")
        for key, least, most in (("explore_bins", 2, 126), ("min_bin_rows", 1, None), ("explore_answers", 1, None)):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < least or \
                    (most is not None and value > most):
                span = f"from {least} to {most}" if most is not None else f"of at least {least}"
                raise ConfigError(f"policy.{key} must be an integer {span}, got {value!r}; leave it out for the "
                                  f"default ({getattr(Policy, key)})")
        if self.explore_shared not in ("count", "ids"):
            raise ConfigError(f"policy.explore_shared must be \"count\" (the label holder learns how many people "
                              f"this party shares with it) or \"ids\" (also who), got {self.explore_shared!r}")
        if not _is_number(self.select_iv_below) or self.select_iv_below < 0:
            raise ConfigError(f"policy.select_iv_below must be a number of at least 0 (an information value; 0 drops "
                              f"nothing), got {self.select_iv_below!r}; e.g. select_iv_below = 0.02")
        if not _is_number(self.select_missing_above) or not 0 <= self.select_missing_above <= 1:
            raise ConfigError(f"policy.select_missing_above must be a share in [0, 1] (1 drops nothing), got "
                              f"{self.select_missing_above!r}; e.g. select_missing_above = 0.5")
        if not _is_number(mixing) or mixing < 1.0:
            raise ConfigError(f"policy.min_mask_mixing must be a finite number of at least 1.0 (1 turns the mixing "
                              f"check off), got {mixing!r}; set min_mask_mixing = 8.0 or more under [policy]")
        for path, rule in self.require.items():
            if len(path.split(".")) < 2:
                raise ConfigError(f"policy.require: {path!r} must name a method and a setting, e.g. "
                                  "'METHOD.max_condition'")
            if not isinstance(rule, Mapping):
                continue
            if not rule or set(rule) - {"min", "max"}:
                raise ConfigError(f"policy.require.{path}: a table of bounds takes min and/or max, got {dict(rule)}")
            for key, bound in rule.items():
                if not _is_number(bound):
                    raise ConfigError(f"policy.require.{path}: {key} must be a finite number, got {bound!r}; e.g. "
                                      f"{{ {key} = 10.0 }}")
            if "min" in rule and "max" in rule and rule["min"] > rule["max"]:
                raise ConfigError(f"policy.require.{path}: min = {rule['min']} is above max = {rule['max']}, so no "
                                  "value could meet it; swap them or widen the range")

    def check_serving(self, party: str, label: str, model_id: str) -> None:
        """Refuse a scoring session for saved model ``label`` (training ``model_id``) unless ``serve_models`` names
        it (by label or model ID) or is left out."""
        served = self.serve_models
        if served is None or label in served or (model_id and model_id in served):
            return
        serves = f"only {', '.join(served)}" if served else "no saved model"
        raise PolicyError(f"party {party!r} does not open a scoring session for model {label!r} (model ID "
                          f"{model_id or '?'}): its policy serves {serves}; add {label!r} to [policy] serve_models in "
                          "its config if it should")

    @property
    def open(self) -> bool:
        return not self.methods and not self.require

    def describe(self) -> str:
        """One line a party prints at start: what it agrees to run."""
        methods = ", ".join(self.methods) if self.methods else "any method"
        bounds = "; ".join(f"{p} {_rule_text(r)}" for p, r in self.require.items())
        return methods + (f" (requiring {bounds})" if bounds else "")

    def check(self, party: str, method: str, config: str) -> None:
        """Refuse ``method`` with ``config`` (its JSON) unless this policy allows it."""
        if self.methods and method not in self.methods:
            raise PolicyError(f"party {party!r} does not agree to run {method}: its policy allows only "
                              f"{', '.join(self.methods)}; add {method} to [policy] methods in its config if it "
                              "should")
        settings = json.loads(config)
        for path, rule in self.require.items():
            name, *keys = path.split(".")
            if name != method:
                continue
            value: Any = settings
            for key in keys:
                if not isinstance(value, Mapping) or key not in value:
                    raise PolicyError(f"party {party!r}'s policy requires {path} {_rule_text(rule)}, but {method} "
                                      "has no such setting")
                value = value[key]
            if not _meets(value, rule):
                raise PolicyError(f"party {party!r} does not agree to run {method} with {'.'.join(keys)} = "
                                  f"{value!r}: its policy requires {_rule_text(rule)}")


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and \
        (isinstance(value, int) or math.isfinite(value))


def _meets(value: Any, rule: Any) -> bool:
    if not isinstance(rule, Mapping):
        return bool(value == rule)
    if not isinstance(value, int | float) or isinstance(value, bool) or math.isnan(value):
        return False
    return bool(rule.get("min", -math.inf) <= value <= rule.get("max", math.inf))


def _rule_text(rule: Any) -> str:
    if not isinstance(rule, Mapping):
        return f"= {rule!r}"
    return " and ".join(f"{'>=' if k == 'min' else '<='} {v}" for k, v in sorted(rule.items(), reverse=True))
