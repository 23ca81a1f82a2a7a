"""The coordinator's side: the federation a method drives (:mod:`~vflo.federation.coordinator`), the session that
runs it (:mod:`~vflo.federation.session`) and the in-process simulation (:mod:`~vflo.federation.simulation`).
What each party runs is :mod:`vflo.party`."""
