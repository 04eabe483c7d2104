"""The one serving loop of the native families (``loop.NativeRunner``) and the hooks a
family writes."""

from diffserve.models.runner.branches import check_ulysses_heads
from diffserve.models.runner.hooks import Decoded, Prepared, Schedule
from diffserve.models.runner.loop import NativeRunner
from diffserve.models.runner.rows import LiveRows

__all__ = [
    "Decoded",
    "LiveRows",
    "NativeRunner",
    "Prepared",
    "Schedule",
    "check_ulysses_heads",
]
