"""How one batch ended, for the consecutive-failure streak and the stats listeners."""

from __future__ import annotations

from enum import Enum


class Outcome(str, Enum):
    """A batch's end. A ``str`` so that stats and logs compare and print it as its value
    (``"ok"``)."""

    OK = "ok"  # every request got its output (resets the failure streak)
    # the model or worker failed (counts towards server.max_consecutive_failures)
    ERROR = "error"
    # the model refused the request (RequestError): the client's fault, not counted
    REJECTED = "rejected"
    ABORTED = "aborted"  # every request in it was aborted
    DEAD = "dead"  # its replica was lost (worker died or hung)
    EMPTY = "empty"  # nothing left to run (all aborted or finished before it started)

    def __str__(self) -> str:
        return self.value
