"""Flower's simulation runtime with vflo's parties: every SuperNode virtual, every party's worker real.

The ServerApp runs ``job`` on the active party's :class:`~vflo.deploy.Deployment` over a Flower grid, and
each virtual SuperNode's ClientApp forwards to one of ``workers`` (addresses of :class:`PartyWorker`\\ s
started by the caller). Used by the tests and benchmarks to check that a method gives the same numbers over
Flower as in one process; a real federation uses ``flwr run`` (see :mod:`vflo.flower.apps`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TypeVar

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp
from flwr.simulation import run_simulation

from vflo.data.partydata import PartyData
from vflo.deploy import DeployConfig, Deployment
from vflo.errors import ProtocolError
from vflo.flower.adapter import make_client_app, partition_workers
from vflo.flower.apps import connect

logger = logging.getLogger(__name__)
T = TypeVar("T")


def run_in_simulation(deploy: DeployConfig, workers: Sequence[str], job: Callable[[Deployment], T], *,
                      train: PartyData | None = None, test: PartyData | None = None, timeout: float = 120.0) -> T:
    """``job(deployment)``'s result, the deployment's parties reached through Flower's simulation runtime."""
    results: list[T] = []
    failures: list[BaseException] = []
    started: list[bool] = []
    server = ServerApp()

    @server.main()
    def _main(grid: Grid, context: Context) -> None:
        started.append(True)
        try:
            deployment = connect(grid, deploy, timeout=timeout, train=train, test=test)
            try:
                results.append(job(deployment))
            finally:
                deployment.close()
        except BaseException as exc:  # handed back to the caller: Flower would only log it
            failures.append(exc)

    client = make_client_app(partition_workers(dict(enumerate(workers))))
    for attempt in (1, 2):
        try:
            run_simulation(server, client, num_supernodes=len(workers),
                           backend_config={"client_resources": {"num_cpus": 1}})
            break
        except RuntimeError:
            # Ray gives its node 30 s to register, which a loaded machine can miss; nothing ran yet, so try again.
            if started or attempt == 2:
                raise
            logger.warning("Flower's simulation runtime did not start (Ray); trying once more")
    if failures:
        raise failures[0]
    if not results:
        raise ProtocolError("Flower's simulation ended before the ServerApp finished; see Flower's log above")
    return results[0]
