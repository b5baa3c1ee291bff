"""Stop signals: SLURM preemption (SIGTERM, submitit's SIGUSR1/2) and Ctrl-C (SIGINT). A run
installs one StopRequest from its start to its record, so that no signal kills it half-way;
the trainer checks it once per step. ablate/train/distributed.py passes the signals a launcher
receives on to its torchrun ranks and asks submitit to requeue a preempted job."""

from __future__ import annotations

import signal
from enum import Enum
from typing import Optional

from ablate.names import Status

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT)


class Phase(Enum):
    """What a stop signal does depends on where the run is (StopRequest)."""

    WAIT = "wait"  # setup, reporting, a launcher waiting for its ranks: recorded only
    STARTUP = "startup"  # data, model, checkpoint load: no step to finish, the run stops at once
    TRAINING = "training"  # checked once per step: the step finishes and a checkpoint is written


class Stopped(BaseException):
    """A stop signal during a run's startup (data, model, checkpoint load). A BaseException, as
    KeyboardInterrupt: code that catches Exception must not swallow it."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class StopRequest:
    """The stop signals a run receives: SIGTERM / SIGUSR1 / SIGUSR2 (SLURM preemption, submitit's
    signal) and SIGINT. Installed for the whole run, so that no signal kills it half-way. What a
    signal does depends on the Phase; at STARTUP it raises Stopped (KeyboardInterrupt for
    SIGINT); while TRAINING a second Ctrl-C stops at once."""

    def __init__(self):
        self.received: list[int] = []  # every stop signal, in order (a launcher passes them on)
        self.signum: Optional[int] = None  # the first one: what stopped the run
        self.phase = Phase.WAIT

    @property
    def status(self) -> Status:
        """What the first signal makes of the run: INTERRUPTED (Ctrl-C) or PREEMPTED."""
        return Status.INTERRUPTED if self.signum == signal.SIGINT else Status.PREEMPTED

    @property
    def reason(self) -> str:
        return f"signal {signal.Signals(self.signum).name}" if self.signum is not None else ""

    def __call__(self, signum, frame):
        again = self.signum is not None
        self.received.append(signum)
        self.signum = self.signum or signum
        if self.phase == Phase.STARTUP:
            self.raise_if_stopped()
        if again and signum == signal.SIGINT and self.phase == Phase.TRAINING:
            raise KeyboardInterrupt  # a second Ctrl-C stops at once

    def raise_if_stopped(self) -> None:
        if self.signum == signal.SIGINT:
            raise KeyboardInterrupt
        if self.signum is not None:
            raise Stopped(self.signum)

    def install(self) -> list:
        old = []
        for sig in STOP_SIGNALS:
            try:
                old.append((sig, signal.signal(sig, self)))
            except ValueError:  # not the main thread (e.g. a joblib worker thread)
                pass
        return old

    @staticmethod
    def restore(old: list) -> None:
        for sig, handler in old:
            signal.signal(sig, handler)
