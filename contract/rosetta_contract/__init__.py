"""What the trainer and the operator agree on, importable by both and importing neither.

The TranslationTraining document (its models and its one loader), the resource's API identity and
phases, the exit codes and termination-message format a pod reports with, and the release version.
Torch-free and API-server-free (it only reads the kubernetes client's generated type tables, to check
a pod's free-form fields): the operator image, the trainer image and `rosetta validate` all load it.
"""

__version__ = "0.1.0"
