"""How a trainer pod tells the operator why it stopped: exit codes and the termination message."""

# sysexits.h EX_DATAERR: "the input data was incorrect in some way". The JobSet's pod failure policy
# turns it into a failed training without restarts (render.py).
DATA_INVALID_EXIT = 65
# The operator matches this prefix in a pod's termination message (status.py).
TERMINATION_PREFIX = "DataInvalid: "
TERMINATION_LOG_ENV = "ROSETTA_TERMINATION_LOG"
DEFAULT_TERMINATION_LOG = "/dev/termination-log"
# The kubelet keeps at most 4096 bytes of a termination message.
MAX_TERMINATION_MESSAGE = 4096
