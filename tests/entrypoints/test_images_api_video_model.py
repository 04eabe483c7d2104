"""A video model behind the images API: refused with a 400 that names the video API,
before any work, and the server keeps serving (the real engine, in process, warmed up as
a video model warms)."""

from __future__ import annotations

from fastapi.testclient import TestClient

from diffserve.engine.async_engine import AsyncEngine
from diffserve.entrypoints.openai.app import create_app


def test_the_images_api_refuses_a_video_model(tiny_wan22_i2v_dir) -> None:
    # Warmed up first: a video model warms on its shortest clip (one frame),
    # image-to-video on a black image.
    engine = AsyncEngine(
        str(tiny_wan22_i2v_dir),
        env={},
        dtype="float32",
        enforce_eager=True,
        warmup={"enabled": True, "height": 64, "width": 64, "steps": 1},
    )
    try:
        with TestClient(create_app(engine, served_model_name="tiny-wan22-i2v")) as http:
            response = http.post(
                "/v1/images/generations", json={"prompt": "a ball", "size": "64x64"}
            )
            assert response.status_code == 400, response.text
            error = response.json()["error"]
            assert (error["code"], error["param"]) == ("model_makes_videos", "model")
            assert "/v1/videos" in error["message"]
            assert http.get("/health").status_code == 200
            # Refused before the engine saw it (warmup is not counted)
            assert engine.stats()["requests_ok"] == 0
            assert engine.is_ready
    finally:
        engine.shutdown()
