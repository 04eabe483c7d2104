"""The gauges read at scrape time from each served model's engine (readiness, replicas
live, queue depth, heartbeat, per-stage state), for routers and autoscalers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:  # pragma: no cover
    from diffserve.entrypoints.engine_host import EngineHost


class ModelState(Protocol):
    """What the gauges read of a served model (``served.ServedModel``)."""

    name: str
    host: EngineHost


class ModelGauges(Collector):
    """Per model (label ``model``), read at scrape time: whether it is ready, the
    requests waiting for it and its live and configured replicas; per stage of its
    topology (labels ``model``, ``stage``, ``role``) the same, so a router or an
    autoscaler sees which model, and which of its stages, is the bottleneck."""

    def __init__(self, models: list[ModelState]) -> None:
        self.models = models

    def describe(self) -> list[GaugeMetricFamily]:
        return [
            *self._model_families().values(),
            *self._stage_families().values(),
            *self._replica_families().values(),
        ]

    def collect(self) -> list[GaugeMetricFamily]:
        per_model, per_stage, per_replica = (
            self._model_families(),
            self._stage_families(),
            self._replica_families(),
        )
        for model in self.models:
            host = model.host
            replicas = host.replicas()
            load = host.load()
            # One snapshot of the scheduler for the queue, the running requests and
            # their work, so a scrape agrees with itself (in_flight = running + queued,
            # the model's work = its replicas' + the queue's).
            values = {
                "ready": float(host.is_ready),
                "queue_depth": float(load.queue_depth),
                "replicas_live": host.replicas_live(),
                "replicas": float(replicas[1]) if replicas else 0.0,
                "requests_running": float(load.running),
                "requests_in_flight": float(load.in_flight),
                "outstanding_work": load.outstanding_work,
            }
            for key, family in per_model.items():
                family.add_metric([model.name], values[key])
            for replica in load.replicas:
                labels = [model.name, str(replica.replica)]
                per_replica["live"].add_metric(labels, float(replica.live))
                per_replica["requests_running"].add_metric(
                    labels, float(replica.running)
                )
                per_replica["outstanding_work"].add_metric(
                    labels, replica.outstanding_work
                )
            for stage in host.stages() or []:
                labels = [model.name, str(stage["stage_id"]), str(stage["role"])]
                for key, family in per_stage.items():
                    family.add_metric(labels, float(stage[key]))
        return [*per_model.values(), *per_stage.values(), *per_replica.values()]

    @staticmethod
    def _model_families() -> dict[str, GaugeMetricFamily]:
        labels = ["model"]
        return {
            "ready": GaugeMetricFamily(
                "diffserve_model_ready",
                "1 when this model is loaded and warmed",
                labels=labels,
            ),
            "queue_depth": GaugeMetricFamily(
                "diffserve_model_queue_depth",
                "Requests waiting for this model",
                labels=labels,
            ),
            "replicas_live": GaugeMetricFamily(
                "diffserve_model_replicas_live",
                "This model's replicas still serving",
                labels=labels,
            ),
            "replicas": GaugeMetricFamily(
                "diffserve_model_replicas",
                "This model's configured replicas",
                labels=labels,
            ),
            "requests_running": GaugeMetricFamily(
                "diffserve_model_requests_running",
                "This model's requests running on a replica",
                labels=labels,
            ),
            "requests_in_flight": GaugeMetricFamily(
                "diffserve_model_requests_in_flight",
                "This model's requests accepted and not finished (waiting + running)",
                labels=labels,
            ),
            "outstanding_work": GaugeMetricFamily(
                "diffserve_model_outstanding_work",
                "Estimated work this model has still to do, in "
                "steps x megapixels x images (x frames for video): "
                "waiting requests whole, running ones "
                "their steps not yet done",
                labels=labels,
            ),
        }

    @staticmethod
    def _replica_families() -> dict[str, GaugeMetricFamily]:
        labels = ["model", "replica"]
        return {
            "live": GaugeMetricFamily(
                "diffserve_replica_live",
                "1 while this replica of the model's denoising stage serves",
                labels=labels,
            ),
            "requests_running": GaugeMetricFamily(
                "diffserve_replica_requests_running",
                "Requests running on this replica",
                labels=labels,
            ),
            "outstanding_work": GaugeMetricFamily(
                "diffserve_replica_outstanding_work",
                "Estimated work left "
                "of the requests running on this replica (steps x megapixels "
                "x images x frames)",
                labels=labels,
            ),
        }

    @staticmethod
    def _stage_families() -> dict[str, GaugeMetricFamily]:
        labels = ["model", "stage", "role"]
        return {
            "queue_depth": GaugeMetricFamily(
                "diffserve_stage_queue_depth",
                "Requests waiting for this stage's replicas",
                labels=labels,
            ),
            "replicas_live": GaugeMetricFamily(
                "diffserve_stage_replicas_live",
                "This stage's replicas still serving",
                labels=labels,
            ),
            "replicas": GaugeMetricFamily(
                "diffserve_stage_replicas",
                "This stage's configured replicas",
                labels=labels,
            ),
        }
