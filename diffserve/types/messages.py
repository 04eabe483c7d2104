"""The typed messages between an executor and its workers (the same objects for uni and
mp).

Commands flow parent -> worker, replies worker -> parent. Both executors speak exactly
this protocol over a ``Channel`` (``channel.py``), so timeouts, errors and cancellation
mean the same thing whether the worker is a thread in this process or a spawned process.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # pragma: no cover
    from diffserve.types.capabilities import PipelineCapabilities
    from diffserve.types.memory import ComponentWeights
    from diffserve.types.request import GenerationRequest

CommandKind = Literal["execute", "join", "rpc", "cancel", "shutdown"]
ReplyKind = Literal[
    "ready", "init_failed", "step", "partial", "result", "error", "cancelled"
]


@dataclass
class Command:
    """One instruction to a worker. ``call_id`` pairs it with its reply (and a cancel
    with its execute)."""

    kind: CommandKind
    call_id: int = 0
    # rpc: a method name on the worker or its extension, or a picklable callable(worker,
    # *a, **kw).
    method: Any = None
    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    # execute: the requests of one batch, seeds already assigned by the engine. join:
    # requests of the same batch key that join the running execute ``call_id`` at its
    # next step boundary (step-level batching); a join for a batch that already ended is
    # dropped, and the engine runs them later.
    batch: list[GenerationRequest] | None = None


@dataclass
class Reply:
    """One answer from a worker. ``error`` replies carry the remote type, message and
    traceback text."""

    kind: ReplyKind
    call_id: int
    rank: int
    value: Any = None
    step: int = 0
    total_steps: int = 0
    # step: (request_id, steps done) per request of a step-level batch (empty: all at
    # ``step``). partial: ``value`` holds the results of requests that finished while
    # the batch goes on.
    progress: tuple[tuple[str, int], ...] = ()
    # step: the partial images decoded after it (``types.results.Preview``).
    previews: tuple[Any, ...] = ()
    error_type: str = ""
    message: str = ""
    traceback: str = ""
    # For RequestError raised inside the worker (e.g. a size the model cannot make): the
    # bad field.
    param: str | None = None


@dataclass(frozen=True)
class WorkerInfo:
    """The value of a ``ready`` reply: who the worker is and what its pipeline can serve
    (``None``: no model loaded, the worker serves RPCs only)."""

    pid: int
    device: str
    capabilities: PipelineCapabilities | None
    # What each loaded component's weights take on its device (models/memory.py), by
    # component name.
    weights: dict[str, ComponentWeights] = field(default_factory=dict)
