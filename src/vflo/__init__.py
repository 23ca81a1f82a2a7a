"""vflo: vertical federated learning for parties whose records only partly overlap.

The public names are loaded on first use, so ``import vflo`` (and the command line's help) stays fast
and does not import PyTorch until something trains.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from vflo.version import __version__

if TYPE_CHECKING:
    from vflo.align.engines import AlignmentConfig
    from vflo.api import FittedModel, SavedModel, evaluate, fit, load, run_experiment, split
    from vflo.data.datasets import Dataset, load_dataset
    from vflo.data.layout import FederatedData, Layout
    from vflo.data.partydata import PartyData
    from vflo.data.scenario import PartySpec, SamplesSpec, ScenarioSpec
    from vflo.errors import VfloError
    from vflo.explorer.run import explore
    from vflo.methods.registry import method_names

_EXPORTS = {
    "Dataset": "vflo.data.datasets", "load_dataset": "vflo.data.datasets", "PartyData": "vflo.data.partydata",
    "FederatedData": "vflo.data.layout", "Layout": "vflo.data.layout", "PartySpec": "vflo.data.scenario",
    "SamplesSpec": "vflo.data.scenario", "ScenarioSpec": "vflo.data.scenario", "VfloError": "vflo.errors",
    "FittedModel": "vflo.api", "evaluate": "vflo.api", "fit": "vflo.api", "run_experiment": "vflo.api",
    "hold_out": "vflo.api", "split": "vflo.api", "method_names": "vflo.methods.registry", "load": "vflo.api",
    "SavedModel": "vflo.api", "AlignmentConfig": "vflo.federation.coordinator", "explore": "vflo.explorer.run",
}

__all__ = [
    "AlignmentConfig", "Dataset", "FederatedData", "FittedModel", "Layout", "PartyData", "PartySpec", "SamplesSpec",
    "SavedModel", "ScenarioSpec", "VfloError", "__version__", "evaluate", "explore", "fit", "hold_out", "load",
    "load_dataset",
    "method_names", "run_experiment", "split",
]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'vflo' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
