"""Running a federation for real: each party its own process (or host), talking gRPC with mutual TLS.

Two files describe a deployment.

``PARTY.toml``, one per party, read by ``vflo party serve``: the party's name and role, the address
it listens on, its data file (never sent anywhere), its TLS folder and its peers (the parties it
accepts messages from and may send to).

``DEPLOY.toml``, read by ``vflo run EXPERIMENT.toml --deploy DEPLOY.toml`` at the active party,
which coordinates: the active party's own settings (the same fields as a PARTY.toml, plus an
optional labelled test file) and the address of every other party.

The same files serve a federation over Flower (vflo.flower): there the addresses are not used, and the
coordinator reaches the others through a ``link`` instead of its own gRPC clients.

The package holds one job per module: :mod:`~vflo.deploy.configs` (the two files), :mod:`~vflo.deploy.party`
(a party's process), :mod:`~vflo.deploy.deployment` (the coordinator's runs and scoring sessions) and
:mod:`~vflo.deploy.export` (a simulated split written out as a deployment).
"""

from vflo.deploy.configs import (
    DataConfig,
    DeployConfig,
    PartyConfig,
    PeerConfig,
    PeerEntry,
    TLSConfig,
    load_deploy_config,
    load_party_config,
)
from vflo.deploy.deployment import AlignedWith, Deployment, held_rows, score_deployed
from vflo.deploy.export import export_federation, own_settings, own_settings_toml, toml_document
from vflo.deploy.party import (
    DeployedStore,
    Link,
    PartyTables,
    RunningParty,
    announce,
    build_node,
    credentials_for,
    load_party_data,
    serve_forever,
    start_party,
    stop_on_signal,
)

__all__ = ["AlignedWith", "DataConfig", "DeployConfig", "DeployedStore", "Deployment", "Link", "PartyConfig",
           "PartyTables", "PeerConfig", "PeerEntry", "RunningParty", "TLSConfig", "announce", "build_node",
           "credentials_for", "export_federation", "held_rows", "load_deploy_config", "load_party_config",
           "load_party_data", "own_settings", "own_settings_toml", "score_deployed", "serve_forever", "start_party",
           "stop_on_signal", "toml_document"]
