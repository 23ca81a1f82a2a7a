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
                      train: PartyData | None = None, test: PartyData | None = None, timeout: float = 60.0,
                      attempts: int = 3) -> T:
    """``job(deployment)``'s result, the deployment's parties reached through Flower's simulation runtime."""

    def main(grid: Grid, connected: Callable[[], None]) -> T:
        deployment = connect(grid, deploy, timeout=timeout, train=train, test=test)
        connected()
        try:
            return job(deployment)
        finally:
            deployment.close()

    return simulate(workers, main, attempts=attempts)


def simulate(workers: Sequence[str], main: Callable[[Grid, Callable[[], None]], T], *, attempts: int = 3) -> T:
    """``main(grid, connected)``'s result, run in a ServerApp of Flower's simulation runtime whose virtual SuperNodes
    forward to ``workers`` (the parties' worker addresses); ``main`` calls ``connected()`` once it found its
    parties.

    Ray gives its node 30 s to register and, on a busy machine starting it for the first time, can miss that;
    Flower then ends the simulation before any SuperNode connected. Such a start is tried again (``attempts``
    in all); a failure after ``main`` said its parties were connected is raised at once.
    """
    for attempt in range(1, attempts + 1):
        results: list[T] = []
        failures: list[BaseException] = []
        connected: list[bool] = []
        server = ServerApp()

        @server.main()
        def _main(grid: Grid, context: Context, results: list[T] = results, failures: list[BaseException] = failures,
                  connected: list[bool] = connected) -> None:
            try:
                results.append(main(grid, lambda: connected.append(True)))
            except BaseException as exc:  # handed back to the caller: Flower would only log it
                failures.append(exc)

        client = make_client_app(partition_workers(dict(enumerate(workers))))
        try:
            run_simulation(server, client, num_supernodes=len(workers),
                           backend_config={"client_resources": {"num_cpus": 1}})
        except RuntimeError:
            if connected or attempt == attempts:
                raise
            # The abandoned ServerApp thread gives up waiting for SuperNodes on its own.
            logger.warning("Flower's simulation runtime did not start (Ray); trying again (%d of %d)", attempt + 1,
                           attempts)
            continue
        if failures:
            raise failures[0]
        if not results:
            raise ProtocolError("Flower's simulation ended before the ServerApp finished; see Flower's log above")
        return results[0]
    raise AssertionError("unreachable")  # pragma: no cover
