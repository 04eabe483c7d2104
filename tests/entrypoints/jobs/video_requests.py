"""The video job bodies the server tests send: the shortest job tiny Wan runs (two
steps, five frames of 64x48), and one that runs until something stops it."""

from __future__ import annotations

from typing import Any

SHORT: dict[str, Any] = {
    "prompt": "a ball",
    "size": "64x48",
    "num_frames": 5,
    "num_inference_steps": 2,
    "seed": 1,
}
LONG: dict[str, Any] = {**SHORT, "num_inference_steps": 100000}
