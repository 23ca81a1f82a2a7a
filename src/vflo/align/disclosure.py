"""What an alignment revealed, and to whom: one sentence for the log, the results and the report."""

from __future__ import annotations

from collections.abc import Sequence


def revealed(*, method: str, mode: str, engine: str, coordinator: str, partners: Sequence[str]) -> str:
    """One sentence: who learned which IDs by the alignment ``method`` (``"plain"`` or ``"psi"``, by ``engine``,
    in ``mode``) between the ``coordinator`` and ``partners``."""
    if not partners:
        return "no alignment: no partner was asked about any ID"
    others = ", ".join(partners)
    if method == "plain":
        return (f"plain alignment: every ID {coordinator} asked about was sent in the clear to {others}, and "
                f"{coordinator} learned which of them each holds")
    by = "a reused kept intersection" if engine == "reused" else f"private set intersection ({engine or 'vflo'})"
    if mode == "active":
        return (f"{by}: no ID crossed in the clear; {coordinator} learned which of its IDs each of {others} "
                f"holds, and each of {others} learned only how many IDs {coordinator} asked about")
    return (f"{by}: no ID crossed in the clear; {coordinator} and each of {others} learned the IDs they share, "
            "and each learned how many IDs the other holds")
