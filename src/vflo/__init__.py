"""vflo: vertical federated learning for parties whose records only partly overlap."""

from vflo.data.datasets import Dataset, load_dataset
from vflo.data.partydata import PartyData
from vflo.data.scenario import FederatedData, Layout, PartySpec, SamplesSpec, ScenarioSpec
from vflo.errors import VfloError
from vflo.version import __version__

__all__ = [
    "Dataset",
    "FederatedData",
    "Layout",
    "PartyData",
    "PartySpec",
    "SamplesSpec",
    "ScenarioSpec",
    "VfloError",
    "__version__",
    "load_dataset",
]
