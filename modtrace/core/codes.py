"""The small integer codes stored in the database, and their names.

This module is the one definition of kind, phase, status and the speed
probe's work: the recorder
writes the integers, the schema's views turn them into the names listed here,
and analysis reads the integers back.  Changing a value here changes the
on-disk format and needs a migration.
"""

from __future__ import annotations

from enum import IntEnum


class Kind(IntEnum):
    """Whether an event opens or closes a module call in one phase."""

    ENTER = 0
    EXIT = 1


class Phase(IntEnum):
    """Which pass a module call belongs to."""

    FORWARD = 0
    BACKWARD = 1
    RECOMPUTE = 2  # activation-checkpoint recomputation of a forward
    # A module called by backward code other than checkpointing (a custom autograd
    # Function's backward, a backward hook): a call of its own, not a recompute.
    BACKWARD_CALL = 3


class Status(IntEnum):
    """How an event came about; anything but OK explains an unusual close."""

    OK = 0
    ERROR = 1  # the forward raised; the exit was written by an always_call hook
    EARLY_STOP = 2  # checkpoint recompute stopped once it had what it needed
    CLOSED_AT_END_OF_BACKWARD = 3  # no hook signalled the exit; closed when the graph task ended
    NO_ENTER = 4  # an exit whose enter was never seen
    UNLINKED = 5  # a recompute's enter: no forward call of its module to link to, so a call id of its own
    # Both rows of a call inside torch.compile'd code, written after the fact: no hook saw it, and
    # its time is the sum of the kernels inductor generated from the module's code.
    ATTRIBUTED = 6


class ProbeWork(IntEnum):
    """Which fixed work a speed probe timed (``step_speeds.work``): probes of different work do
    not compare, so a history gate adjusts step times only where every run's probes did the same."""

    FORWARD = 1  # the layers forward, without autograd (revisions 0017 and 0018; stored NULL)
    TRAIN = 2  # the same layers forward with autograd, and their backward


# The codes the hooks put in every event tuple, as plain ints: an enum member in a
# tuple pickles as a reference to its class (the writer process is sent batches of
# them) and compares slower than an int.  The tracking modules import these.
KIND_ENTER = int(Kind.ENTER)
KIND_EXIT = int(Kind.EXIT)
PHASE_FORWARD = int(Phase.FORWARD)
PHASE_BACKWARD = int(Phase.BACKWARD)
PHASE_RECOMPUTE = int(Phase.RECOMPUTE)
PHASE_BACKWARD_CALL = int(Phase.BACKWARD_CALL)
STATUS_OK = int(Status.OK)
STATUS_ERROR = int(Status.ERROR)
STATUS_EARLY_STOP = int(Status.EARLY_STOP)
STATUS_CLOSED_AT_END_OF_BACKWARD = int(Status.CLOSED_AT_END_OF_BACKWARD)
STATUS_UNLINKED = int(Status.UNLINKED)
STATUS_ATTRIBUTED = int(Status.ATTRIBUTED)

# What a reader puts in place of a kind, phase, status or tie code too big for
# its one-byte column (a foreign or hand-edited row): analysis reports the row
# as invalid instead of failing to read the run.
OUT_OF_RANGE_CODE = -128
