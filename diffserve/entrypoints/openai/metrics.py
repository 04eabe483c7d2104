"""Prometheus metrics of one server, in a registry of its own (several apps may live in
one process).

Everything here is observed by the HTTP layer itself: request status and latency, the
engine's per-phase timings and kernel attestation reported in each output, the queue
depth it exposes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from diffserve.engine.stats import BatchStats
from diffserve.entrypoints.openai.model_gauges import ModelGauges, ModelState
from diffserve.types.attestation import CacheEntry

if TYPE_CHECKING:  # pragma: no cover
    pass

LATENCY_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
CONTENT_TYPE = CONTENT_TYPE_LATEST


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.http_requests = Counter(
            "diffserve_http_requests",
            "HTTP requests by endpoint and status code",
            ["endpoint", "status"],
            registry=r,
        )
        self.http_latency = Histogram(
            "diffserve_http_request_duration_seconds",
            "Time from request start to the last response byte",
            ["endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.phase_latency = Histogram(
            "diffserve_request_phase_seconds",
            "Per-request time in each phase (engine timings plus "
            "the server's image encoding)",
            ["phase"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.images = Counter(
            "diffserve_images_generated", "Images returned to clients", registry=r
        )
        self.batch_size = Histogram(
            "diffserve_batch_size",
            "Requests per executed batch, as reported by the engine",
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.batches = Counter(
            "diffserve_batches",
            "Batches executed by the engine, by outcome",
            ["outcome"],
            registry=r,
        )
        self.kernel_calls = Counter(
            "diffserve_kernel_calls",
            "Kernel calls attested by the worker, by kind and backend",
            ["kind", "backend"],
            registry=r,
        )
        self.cache_steps = Counter(
            "diffserve_step_cache_steps",
            "Denoise steps per image and CFG branch, by step-cache backend and "
            "decision (compute or skip)",
            ["backend", "decision"],
            registry=r,
        )
        self.conditioning = {
            name: Counter(
                f"diffserve_conditioning_cache_{name}",
                f"Requests whose texts were a conditioning-cache {outcome}",
                ["replica"],
                registry=r,
            )
            for name, outcome in (("hits", "hit"), ("misses", "miss"))
        }
        self.ar_tokens = Counter(
            "diffserve_ar_tokens",
            "Tokens of the AR stages' vLLM engines (kind: ar), by stage, role and kind "
            "(prompt or output)",
            ["stage", "role", "kind"],
            registry=r,
        )
        self.ar_latency = Histogram(
            "diffserve_ar_stage_seconds",
            "Per request: time in an AR stage's vLLM engine (first_token and total)",
            ["stage", "role", "measure"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.conditioning_evictions = Counter(
            "diffserve_conditioning_cache_evictions",
            "Texts evicted from the conditioning cache (least recently used first)",
            ["replica"],
            registry=r,
        )
        self.conditioning_bytes = Gauge(
            "diffserve_conditioning_cache_bytes",
            "Bytes of encoder outputs in the conditioning cache, as of the "
            "replica's last response",
            ["replica"],
            registry=r,
        )
        self._evictions_seen: dict[str, int] = {}
        self.aborted = Counter(
            "diffserve_requests_aborted",
            "Generation requests aborted because the client went away "
            "(queued, running or being encoded)",
            registry=r,
        )
        self.webhook_deliveries = Counter(
            "diffserve_webhook_deliveries",
            "Webhook delivery attempts by outcome (delivered, retry: failed and due "
            "again, dead: failed for the last time)",
            ["outcome"],
            registry=r,
        )
        self.inflight = Gauge(
            "diffserve_inflight_requests",
            "Generation requests being served",
            registry=r,
        )
        self.queue_depth = Gauge(
            "diffserve_queue_depth",
            "Requests waiting in the engine's queue",
            registry=r,
        )
        self.ready = Gauge(
            "diffserve_engine_ready",
            "1 when the model is loaded and warmed",
            registry=r,
        )
        self.replicas_live = Gauge(
            "diffserve_replicas_live",
            "Engine replicas still serving (below num_replicas: degraded)",
            registry=r,
        )

    def webhook_outcome(self, outcome: str) -> None:
        self.webhook_deliveries.labels(outcome=outcome).inc()

    def bind_models(self, models: Iterable[ModelState]) -> None:
        """Gauges read live from the engines at scrape time: the server's totals (queue
        depth and live replicas summed, ready when every model is) and each model's own
        (label ``model``), with its stages'."""
        models = list(models)
        self.queue_depth.set_function(lambda: sum(m.host.queue_depth() for m in models))
        self.ready.set_function(lambda: float(all(m.host.is_ready for m in models)))
        self.replicas_live.set_function(
            lambda: sum(m.host.replicas_live() for m in models)
        )
        self.registry.register(ModelGauges(models))

    def observe_output(
        self,
        timings_ms: dict[str, float],
        n_images: int,
        cache: list[CacheEntry] | None = None,
    ) -> None:
        """Per request: the engine's phase timings (plus the server's own encode time)
        and the step cache's decisions of each image (``attestation["cache"]``)."""
        for phase, ms in timings_ms.items():
            if isinstance(ms, (int, float)):
                self.phase_latency.labels(phase=phase).observe(ms / 1000.0)
        self.images.inc(n_images)
        for entry in cache or []:
            for branch in (entry, entry.get("negative")):
                if branch:
                    self.cache_steps.labels(
                        backend=entry["backend"], decision="compute"
                    ).inc(branch["computed_steps"])
                    self.cache_steps.labels(
                        backend=entry["backend"], decision="skip"
                    ).inc(branch["skipped_steps"])

    def observe_conditioning(self, attestation: dict[str, Any]) -> None:
        """Per request: its conditioning-cache outcome, and the cache's size and
        evictions after it (cumulative per replica: the counter grows by the difference
        since the replica's last report)."""
        outcome, state = (
            attestation.get("conditioning_cache"),
            attestation.get("conditioning_cache_state"),
        )
        replica = str(attestation.get("replica", 0))
        if outcome in ("hit", "miss"):
            self.conditioning["hits" if outcome == "hit" else "misses"].labels(
                replica=replica
            ).inc()
        if isinstance(state, dict):
            total = int(state.get("evictions_total", 0))
            seen = self._evictions_seen.get(replica, 0)
            if total > seen:
                self.conditioning_evictions.labels(replica=replica).inc(total - seen)
            self._evictions_seen[replica] = max(total, seen)
            self.conditioning_bytes.labels(replica=replica).set(
                int(state.get("bytes", 0))
            )

    def observe_ar(self, attestation: dict[str, Any]) -> None:
        """Per request: each AR stage's tokens in and out and its time to first token
        and total time."""
        for entry in attestation.get("ar") or ():
            stage, role = str(entry.get("stage_id")), str(entry.get("role"))
            for kind in ("prompt", "output"):
                self.ar_tokens.labels(stage=stage, role=role, kind=kind).inc(
                    int(entry.get(f"{kind}_tokens") or 0)
                )
            for measure, key in (
                ("first_token", "first_token_ms"),
                ("total", "total_ms"),
            ):
                if entry.get(key) is not None:
                    self.ar_latency.labels(
                        stage=stage, role=role, measure=measure
                    ).observe(float(entry[key]) / 1000.0)

    def observe_batch(self, stats: BatchStats) -> None:
        """Per executed batch (an engine stats listener, called on the engine thread;
        prometheus_client is thread-safe). Kernel calls are counted per batch, not per
        request, so a batch of several requests is not counted several times."""
        self.batches.labels(outcome=stats.outcome).inc()
        if stats.batch_size:
            self.batch_size.observe(stats.batch_size)
        for kind, backend, calls in kernel_calls(stats.kernels):
            self.kernel_calls.labels(kind=kind, backend=backend).inc(calls)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def kernel_calls(attestation: dict[str, Any]) -> list[tuple[str, str, int]]:
    """``(kind, backend, calls)`` from an attestation's counters snapshot.

    The worker reports ``{"linear": {backend: calls}, "attention": {backend: calls}}``,
    either at the top level or under ``counters`` (per rank lists are summed).
    """
    found: list[tuple[str, str, int]] = []
    sources: list[Any] = [attestation, attestation.get("counters")]
    ranks = attestation.get("ranks")
    if isinstance(ranks, list):
        sources.extend(r.get("counters", r) for r in ranks if isinstance(r, dict))
    for source in sources:
        if not isinstance(source, dict):
            continue
        for kind in ("linear", "attention"):
            per_backend = source.get(kind)
            if not isinstance(per_backend, dict):
                continue
            for backend, calls in per_backend.items():
                if isinstance(calls, int) and not isinstance(calls, bool) and calls > 0:
                    found.append((kind, str(backend), calls))
        if found:
            break
    return found
