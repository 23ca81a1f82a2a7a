"""One error hierarchy for everything vflo raises on purpose.

Every message says what was wrong and how to fix it. The command line maps each
family to its own exit code (see :data:`EXIT_CODES`), so scripts can tell a bad
config from a missing file from a party that stopped answering.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class VfloError(Exception):
    """Root of every error vflo raises deliberately."""

    exit_code: int = 1


class ConfigError(VfloError, ValueError):
    """A configuration, argument or hyperparameter is invalid."""

    exit_code = 2


class DataError(VfloError, ValueError):
    """Input data is unusable: duplicate IDs, NaN, non-numeric columns, missing labels."""

    exit_code = 3


class DataFileError(DataError):
    """A data file is missing or fails its checksum."""

    exit_code = 3


class AlignmentError(DataError):
    """The parties' IDs do not overlap as the run needs (no shared ID at all, or rows to score a party lacks)."""

    exit_code = 3


class ScenarioError(ConfigError):
    """A scenario cannot be built from the dataset as asked (too many rows, overlapping columns)."""

    exit_code = 2


class CodecError(VfloError):
    """A message could not be encoded or decoded: too large, malformed, wrong dtype or shape."""

    exit_code = 4


class PayloadError(CodecError):
    """A message's fields do not match what its handler accepts (missing field, wrong dtype or shape)."""


class ProtocolError(VfloError):
    """A party broke the protocol: unknown message kind, unexpected payload, wrong order."""

    exit_code = 4


class RefusedError(ProtocolError):
    """A party refused a message: the sender may not ask it that (its own config says who may ask what)."""


class PrivacyBudgetError(RefusedError):
    """A party refused a release that would spend more of its people's privacy than its own budget allows."""


class RemoteError(ProtocolError):
    """A party answered a request with an error."""

    def __init__(self, party: str, kind: str, error_type: str, message: str) -> None:
        self.party = party
        self.kind = kind
        self.error_type = error_type
        self.remote_message = message
        # A remote party's bad config or data is still a config or data problem: keep its exit code.
        self.exit_code = _exit_code_of(error_type, ProtocolError.exit_code)
        super().__init__(f"party {party!r} failed on {kind!r}: {error_type}: {message}")


class TransportError(ProtocolError):
    """A message could not be delivered or answered in time."""


class AddressInUseError(TransportError):
    """A party could not listen on its address (taken by another process, or not valid)."""


class DeliveryTimeoutError(TransportError):
    """A party did not answer a request within its deadline."""

    def __init__(self, party: str, kind: str, seconds: float | None = None) -> None:
        self.party = party
        self.kind = kind
        within = f" within {seconds:g} s" if seconds is not None else ""
        super().__init__(
            f"party {party!r} did not answer {kind!r}{within}; check that it is running and reachable, or raise "
            "its deadline"
        )


class PartyBoundaryError(ProtocolError):
    """Code running as one party asked for something only another party holds."""


class MethodError(VfloError):
    """A method cannot run on this scenario (e.g. collaborative inference on rows a party lacks)."""

    exit_code = 5


def _exit_code_of(error_type: str, default: int) -> int:
    stack: list[type[VfloError]] = [VfloError]
    while stack:
        cls = stack.pop()
        if cls.__name__ == error_type:
            return cls.exit_code
        stack.extend(cls.__subclasses__())
    return default


EXIT_CODES: dict[int, str] = {
    0: "success",
    1: "unexpected internal error (a bug: please report it with the traceback)",
    2: "invalid configuration, argument or scenario",
    3: "invalid input data, or a data file missing or failing its checksum",
    4: "communication or protocol failure between parties",
    5: "a method cannot run on this scenario",
    130: "interrupted",
}


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """A ' (did you mean 'x'?)' hint, or '' when nothing is close."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def unknown_name(what: str, name: str, choices: Iterable[str]) -> str:
    """Message for an unknown name with a hint and the list of valid names."""
    options = sorted(choices)
    return f"unknown {what} {name!r}{did_you_mean(name, options)}; choose one of: {', '.join(options)}"
