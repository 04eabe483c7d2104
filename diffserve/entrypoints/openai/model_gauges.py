"""The gauges read at scrape time from each served model's engine (readiness, replicas
live, queue depth, heartbeat, per-stage state, the scheduler's budget and lanes), for
routers and autoscalers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:  # pragma: no cover
    from diffserve.engine.load import ScheduleLoad
    from diffserve.entrypoints.engine_host import EngineHost

# The scheduler's families: gauges, and the joins counter.
Family = GaugeMetricFamily | CounterMetricFamily


class ModelState(Protocol):
    """What the gauges read of a served model (``served.ServedModel``)."""

    name: str
    host: EngineHost


class ModelGauges(Collector):
    """Per model (label ``model``), read at scrape time: whether it is ready, the
    requests waiting for it and its live and configured replicas; per stage of its
    topology (labels ``model``, ``stage``, ``role``) the same, so a router or an
    autoscaler sees which model, and which of its stages, is the bottleneck; and the
    denoising scheduler's step-token budget, its use, its joins and per lane (label
    ``lane``, a latent shape) what waits: where a new request of a shape would queue."""

    def __init__(self, models: list[ModelState]) -> None:
        self.models = models

    def describe(self) -> list[Metric]:
        return [
            *self._model_families().values(),
            *self._stage_families().values(),
            *self._replica_families().values(),
            *self._schedule_families().values(),
        ]

    def collect(self) -> list[Metric]:
        per_model, per_stage, per_replica, schedule = (
            self._model_families(),
            self._stage_families(),
            self._replica_families(),
            self._schedule_families(),
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
            self._add_schedule(schedule, model.name, load.schedule)
        return [
            *per_model.values(),
            *per_stage.values(),
            *per_replica.values(),
            *schedule.values(),
        ]

    @staticmethod
    def _add_schedule(
        families: dict[str, Family], model: str, schedule: ScheduleLoad
    ) -> None:
        values = {
            "max_step_tokens": schedule.max_step_tokens,
            "max_batch_size": schedule.max_batch_size,
            "step_tokens_running": schedule.step_tokens_running,
            "joins": schedule.joins,
        }
        for key, value in values.items():
            families[key].add_metric([model], float(value))
        for lane in schedule.lanes:
            labels = [model, lane.lane]
            families["lane_waiting"].add_metric(labels, float(lane.waiting))
            families["lane_token_steps"].add_metric(labels, float(lane.token_steps))
            families["lane_oldest_wait"].add_metric(labels, lane.oldest_wait_s)

    @staticmethod
    def _schedule_families() -> dict[str, Family]:
        labels, lanes = ["model"], ["model", "lane"]
        return {
            "max_step_tokens": GaugeMetricFamily(
                "diffserve_model_max_step_tokens",
                "The step-token budget of one batch of this model "
                "(max_step_tokens as resolved; 0: no token cap)",
                labels=labels,
            ),
            "max_batch_size": GaugeMetricFamily(
                "diffserve_model_max_batch_size",
                "Most requests in one batch of this model",
                labels=labels,
            ),
            "step_tokens_running": GaugeMetricFamily(
                "diffserve_model_step_tokens_running",
                "Latent tokens a denoising step of this model's running requests "
                "runs (images x tokens per image x latent frames), all replicas",
                labels=labels,
            ),
            "joins": CounterMetricFamily(
                "diffserve_model_step_joins",
                "Requests that joined a running step-level batch of this model",
                labels=labels,
            ),
            "lane_waiting": GaugeMetricFamily(
                "diffserve_lane_waiting_requests",
                "Requests waiting in this lane (latent shape HxW, HxWxF for clips)",
                labels=lanes,
            ),
            "lane_token_steps": GaugeMetricFamily(
                "diffserve_lane_waiting_token_steps",
                "The cost model's work waiting in this lane: tokens x steps",
                labels=lanes,
            ),
            "lane_oldest_wait": GaugeMetricFamily(
                "diffserve_lane_oldest_wait_seconds",
                "Seconds the oldest request waiting in this lane has waited",
                labels=lanes,
            ),
        }

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
