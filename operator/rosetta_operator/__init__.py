"""Rosetta's Kubernetes operator: TranslationTraining → ConfigMap + JobSet, status mirrored back.

For scripts and notebooks, the Python client of the `rosetta` cluster verbs:
`from rosetta_operator import Client` (client.py).
"""

from rosetta_contract.strict_model import ConfigError
from rosetta_operator.client import Client
from rosetta_operator.client_errors import (
    ClusterError,
    InvalidArgument,
    RosettaError,
    TrainingEnded,
    TrainingNotFound,
    WaitTimeout,
)
from rosetta_operator.client_results import TrainingList, TrainingStatus, WatchEvent
from rosetta_operator.kube import VerbError

__all__ = ["Client", "ClusterError", "ConfigError", "InvalidArgument", "RosettaError", "TrainingEnded",
           "TrainingList", "TrainingNotFound", "TrainingStatus", "VerbError", "WaitTimeout", "WatchEvent"]
