"""The TranslationTraining resource's identity on the API server and the phases its status moves through."""

GROUP = "rosetta.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "TranslationTraining"
PLURAL = "translationtrainings"


class Phase:
    PENDING = "Pending"
    QUEUED = "Queued"          # Kueue keeps the JobSet suspended until it admits the whole gang
    RUNNING = "Running"
    SUSPENDED = "Suspended"
    RESTARTING = "Restarting"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"

    TERMINAL = frozenset({SUCCEEDED, FAILED})


# In the order Phase declares them, the order a training usually meets them (the CRD's enum, the
# operator's phase gauge).
PHASES = tuple(value for name, value in vars(Phase).items() if name.isupper() and isinstance(value, str))
