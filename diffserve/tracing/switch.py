"""The one flag every tracing hook reads first: the fast path when tracing is off is
this attribute check.

``ON`` turns true only in a process whose ``provider.start_tracing`` found the
environment asking for traces and the SDK installed (the server at startup, each mp
worker and Ray actor when it starts); nothing else sets it. ``STEP_SPANS``:
``DIFFSERVE_TRACE_STEPS=1``, a child span per denoise step instead of one span event.
"""

from __future__ import annotations

ON = False
STEP_SPANS = False
