"""OpenTelemetry tracing of requests, configured only by the standard ``OTEL_*``
environment variables.

Off unless the environment asks for it (``settings.py``), and then cheap: every hook
first reads one module-level flag (``switch.ON``) and does nothing else while it is
false, so opentelemetry need not even be installed (the ``diffserve[otel]`` extra). On,
one trace per request:

* ``asgi.py``: the HTTP server span, a child of the client's W3C ``traceparent`` when it
  sent one;
* ``spans.py``: the engine side (admission, queue wait, the server's image and video
  encode), the carrier
  that takes the trace context to the workers on ``GenerationRequest.trace_context``,
  and ``current``, which makes it current on the engine's own threads (so their log
  lines name the request's trace);
* ``batch.py``: the worker side, in the worker's own process (mp, Ray) or thread (uni):
  one span per request
  of a batch with its stages (encode, denoise with one event or span per step, decode)
  as children;
* ``provider.py``: the SDK's tracer provider, the OTLP/HTTP exporter and the flush at
  shutdown;
* ``attributes.py``: the ``diffserve.*`` attribute names; ``log_context.py``: trace and
  span ids in log lines.

See docs/deploy.md, "Tracing (OpenTelemetry)".
"""
