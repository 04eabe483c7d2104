"""The server's config (``server.*``: limits, queue, deadlines, job store, API key, Ray
Serve autoscaling): frozen dataclasses whose field metadata is the schema
(``options.py``)."""

from __future__ import annotations

from dataclasses import dataclass

from diffserve.config import canonical as c
from diffserve.config import structured as sv
from diffserve.config.manifest_schema import ProvenanceConfig
from diffserve.config.options import opt, section
from diffserve.config.webhooks_schema import WebhooksConfig


@dataclass(frozen=True)
class AutoscalingConfig:
    """Replicas of the Ray Serve front (``diffserve serve --ray-serve``,
    ``diffserve.ray_serve:app``; docs/deploy.md, "Ray Serve"): each replica is a whole
    diffserve engine, and Ray Serve adds or removes replicas to keep the requests in
    flight or queued per replica near ``target_ongoing_requests``. Each key is Ray
    Serve's autoscaling key of the same name. A server without Ray Serve is one process
    with one engine and does not read this section."""

    min_replicas: int = opt(
        1,
        "fewest Ray Serve replicas, each a whole engine (at "
        "least 1: a replica loads its model "
        "before it takes traffic)",
        c.int_normalizer(1),
        kind="int",
    )
    max_replicas: int = opt(
        1,
        "most Ray Serve replicas (at least min_replicas)",
        c.int_normalizer(1),
        kind="int",
    )
    target_ongoing_requests: int = opt(
        2,
        "requests in flight or queued per replica that Ray Serve scales to keep",
        c.int_normalizer(1),
        kind="int",
    )
    upscale_delay_s: float = opt(
        30.0,
        "seconds the load must ask for more replicas before one is added",
        c.float_normalizer(0.0, 86400.0),
        kind="float",
    )
    downscale_delay_s: float = opt(
        600.0,
        "seconds the load must ask for fewer replicas before one is removed",
        c.float_normalizer(0.0, 86400.0),
        kind="float",
    )
    metrics_interval_s: float = opt(
        10.0,
        "seconds between the request-count reports the scaling decisions read",
        c.float_normalizer(0.1, 3600.0),
        kind="float",
    )
    look_back_period_s: float = opt(
        30.0,
        "seconds of reports averaged into one decision (more than metrics_interval_s)",
        c.float_normalizer(0.1, 86400.0),
        kind="float",
    )


@dataclass(frozen=True)
class ServerConfig:
    """Pipeline-wide request limits (never per stage)."""

    max_n: int = opt(4, "most images per request", c.int_normalizer(1), kind="int")
    max_pixels: int = opt(
        1048576,
        "most pixels (height*width) per image",
        c.int_normalizer(256),
        kind="int",
    )
    max_steps: int = opt(
        100, "most denoise steps per request", c.int_normalizer(1), kind="int"
    )
    max_queue: int = opt(
        64,
        "most requests waiting; beyond it requests are rejected (HTTP 429)",
        c.int_normalizer(1),
        kind="int",
    )
    max_body_bytes: int = opt(
        1048576,
        "largest HTTP request body accepted",
        c.int_normalizer(1024),
        kind="int",
    )
    max_upload_bytes: int = opt(
        20971520,
        "largest multipart body of POST /v1/images/edits (images, mask and "
        "fields together; HTTP 413 above)",
        c.int_normalizer(1024),
        kind="int",
    )
    max_prompt_chars: int = opt(
        4000,
        "longest prompt, negative_prompt or user string in characters (HTTP 422)",
        c.int_normalizer(1),
        kind="int",
    )
    batch_deadline_floor_s: int = opt(
        120,
        "seconds any batch may run before its worker counts as hung",
        c.int_normalizer(1),
        kind="int",
    )
    batch_deadline_s_per_mpix_step: float = opt(
        30.0,
        "seconds added to the floor per megapixel x denoise step x image of a batch",
        c.float_normalizer(0.0, 1e6),
        kind="float",
    )
    max_consecutive_failures: int = opt(
        3,
        "failed batches in a row that mark the engine dead (/health 503)",
        c.int_normalizer(1),
        kind="int",
    )
    max_connections: int = opt(
        64,
        "concurrent HTTP connections; more are answered 503 and closed",
        c.int_normalizer(1),
        kind="int",
    )
    body_timeout_s: int = opt(
        10,
        "seconds a client may take to send its request body (HTTP 408 after)",
        c.int_normalizer(1),
        kind="int",
    )
    allowed_hosts: tuple[str, ...] = opt(
        (),
        "Host header values accepted: a list or comma-separated (empty: "
        "any); against DNS rebinding",
        sv.normalize_host_list,
        kind="list",
    )
    expose_config: bool = opt(
        False,
        "/v1/config shows absolute paths and extras values (off: redacted)",
        c.normalize_bool,
        kind="bool",
    )
    # The video job API (docs/api.md#videos): where jobs and their files live, and how
    # long.
    state_dir: str = opt(
        "",
        "directory of the server's own state: the embedded "
        "SQLite job store and, unless "
        "artifact_dir is set, the video files (empty: $XDG_STATE_HOME/diffserve, else "
        "~/.local/state/diffserve)",
        sv.normalize_optional_dir,
    )
    job_store: str = opt(
        "",
        "database of video jobs: sqlite:///PATH or postgresql://USER@HOST:PORT/DB, "
        "shared by "
        "every instance that serves the same jobs (empty: SQLite in state_dir)",
        sv.normalize_job_store_url,
    )
    artifact_dir: str = opt(
        "",
        "directory of finished videos (MP4, thumbnail, sprite sheet), shared by every "
        "instance of one job store (empty: state_dir/videos)",
        sv.normalize_optional_dir,
    )
    video_ttl_s: int = opt(
        86400,
        "seconds a finished video job and its files are kept (0: forever)",
        c.int_normalizer(0),
        kind="int",
    )
    job_lease_s: int = opt(
        30,
        "seconds a video job's lease lasts without a heartbeat; a job whose instance "
        "died is failed or requeued after it",
        c.int_normalizer(2),
        kind="int",
    )
    job_deadline_s: int = opt(
        3600,
        "seconds a video job may run (queue wait on its instance included) before it "
        "fails with deadline_exceeded",
        c.int_normalizer(1),
        kind="int",
    )
    requeue_interrupted: bool = opt(
        False,
        "run a video job interrupted by a restart or a dead instance again "
        "from the start (off: it fails with server_restart)",
        c.normalize_bool,
        kind="bool",
    )
    autoscaling: AutoscalingConfig = section(
        AutoscalingConfig, "Ray Serve replicas (--ray-serve only)", "autoscaling_"
    )
    webhooks: WebhooksConfig = section(
        WebhooksConfig, "signed video job webhooks (docs/webhooks.md)", "webhooks_"
    )
    provenance: ProvenanceConfig = section(
        ProvenanceConfig,
        "signed manifest in every output (docs/provenance.md)",
        "provenance_",
    )
