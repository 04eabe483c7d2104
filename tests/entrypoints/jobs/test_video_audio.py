"""Video models on the generic path over raw HTTP (``/v1/videos``) and from the CLI:
LTX-2 draws a video with its sound (an AAC track in every MP4, ``audio.wav`` beside PNG
frames), HunyuanVideo-1.5 a silent one (no audio track). One real ``diffserve serve`` of
both tiny models (a deploy file's ``models:`` list); each file read back with PyAV or
the stdlib's ``wave``, not the server's own readers."""

from __future__ import annotations

import io
import time
import wave
from typing import Any

import av
import httpx
import numpy as np
import pytest
from PIL import Image
from test_e2e_generate_cli import run_in_process

pytestmark = pytest.mark.e2e

LTX2, HUNYUAN = "tiny-ltx2", "tiny-hunyuan-video-15"
# LTX-2's clips: 8k+1 frames, sizes multiples of 32 (64x64 the smallest that runs), 24
# fps and 24 kHz stereo sound by default.
LTX2_REQUEST = {
    "model": LTX2,
    "prompt": "a drum beating in a red room",
    "size": "64x64",
    "num_frames": 9,
    "num_inference_steps": 2,
    "seed": 3,
}
# HunyuanVideo-1.5's: 4k+1 frames, multiples of 16; its text window is cut to 32 tokens
# by the deploy file (its joint sequence is what costs on a CPU).
HUNYUAN_REQUEST = {
    "model": HUNYUAN,
    "prompt": "a paper boat on a pond",
    "size": "32x32",
    "num_frames": 5,
    "num_inference_steps": 2,
    "seed": 4,
}
SAMPLE_RATE = 24000
SECONDS = 9 / 24
# AAC's priming and last-frame padding (a few hundred to ~2000 samples) and the
# pipeline's own rounding of the audio latent's length.
SECONDS_TOLERANCE = 0.15


@pytest.fixture(scope="module")
def server(
    server_launcher,
    write_deploy,
    tmp_path_factory,
    tiny_ltx2_dir,
    tiny_hunyuan_video15_dir,
):
    common = (
        "    distributed_executor_backend: uni\n    dtype: float32\n"
        "    enforce_eager: true\n    warmup: {enabled: false}\n"
    )
    deploy = write_deploy(
        f"models:\n  - model: {tiny_ltx2_dir}\n    name: {LTX2}\n{common}"
        f"  - model: {tiny_hunyuan_video15_dir}\n    name: {HUNYUAN}\n{common}"
        "    request_defaults: {max_sequence_length: 32}\n"
    )
    with server_launcher(
        "--deploy-config", deploy, "--state-dir", tmp_path_factory.mktemp("state")
    ) as proc:
        yield proc


@pytest.fixture(scope="module")
def http(server) -> httpx.Client:
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client


def create(http: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    answer = http.post("/v1/videos", json=body)
    assert answer.status_code == 200, answer.text
    video = answer.json()
    assert video["status"] == "queued", video
    return video


def completed(http: httpx.Client, body: dict[str, Any], timeout: float = 240) -> bytes:
    """Create a job of ``body``, poll it to ``completed`` and download its MP4."""
    video_id = create(http, body)["id"]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        video = http.get(f"/v1/videos/{video_id}").json()
        if video["status"] in ("completed", "failed"):
            break
        time.sleep(0.1)
    else:
        raise TimeoutError(f"{video_id} still {video['status']} after {timeout} s")
    assert video["status"] == "completed", video["error"]
    answer = http.get(f"/v1/videos/{video_id}/content")
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "video/mp4"
    return answer.content


def check_refused(answer: httpx.Response, param: str) -> None:
    """A 400 with OpenAI's error body, ``param`` naming the field at fault."""
    assert answer.status_code == 400, answer.text
    body = answer.json()
    assert set(body) == {"error"} and set(body["error"]) == {
        "message",
        "type",
        "param",
        "code",
    }, body
    assert body["error"]["param"] == param, body
    assert param in body["error"]["message"], body


def streams(data: bytes) -> tuple[np.ndarray, np.ndarray | None, int, int]:
    """An MP4 read with PyAV: its frames (F, H, W, 3), its audio (channels, n) or None,
    the audio's rate and channel count (0 without audio). Exactly one video stream and
    at most one audio stream."""
    with av.open(io.BytesIO(data)) as container:
        assert len(container.streams.video) == 1, container.streams
        assert len(container.streams.audio) <= 1, container.streams
        assert len(container.streams) == len(container.streams.video) + len(
            container.streams.audio
        ), container.streams
        frames = np.stack(
            [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
        )
    with av.open(io.BytesIO(data)) as container:
        if not container.streams.audio:
            return frames, None, 0, 0
        stream = container.streams.audio[0]
        rate, channels = stream.rate, stream.codec_context.layout.nb_channels
        chunks = [frame.to_ndarray() for frame in container.decode(audio=0)]
    return frames, np.concatenate(chunks, axis=1), rate, channels


def check_sound(samples: np.ndarray, rate: int, channels: int) -> None:
    """Stereo at 24 kHz, as long as the clip, finite and not silent."""
    assert (rate, channels) == (SAMPLE_RATE, 2)
    assert samples.shape[0] == 2, samples.shape
    assert samples.shape[1] / rate == pytest.approx(SECONDS, abs=SECONDS_TOLERANCE)
    assert np.isfinite(samples).all()
    assert float(np.sqrt(np.mean(np.square(samples, dtype=np.float64)))) > 1e-4


def test_ltx2_video_over_http_carries_its_audio_track(http) -> None:
    frames, samples, rate, channels = streams(completed(http, LTX2_REQUEST))
    assert frames.shape == (9, 64, 64, 3)
    assert samples is not None, "the LTX-2 MP4 has no audio stream"
    check_sound(samples, rate, channels)


def test_hunyuan_video_15_over_http_is_silent_and_checks_its_frames(
    http, server
) -> None:
    frames, samples, _, _ = streams(completed(http, HUNYUAN_REQUEST))
    assert frames.shape == (5, 32, 32, 3)
    assert samples is None, "a model without sound got an audio stream"
    # Its clips are 4k+1 frames: 6 is refused when the job is created, and serving goes
    # on.
    check_refused(
        http.post("/v1/videos", json={**HUNYUAN_REQUEST, "num_frames": 6}), "num_frames"
    )
    assert httpx.get(server.url + "/ready", timeout=10).status_code == 200
    again = streams(completed(http, {**HUNYUAN_REQUEST, "seed": 5}))[0]
    assert again.shape == (5, 32, 32, 3)


def test_ltx2_frames_not_8k_plus_1_are_a_400(http) -> None:
    check_refused(
        http.post("/v1/videos", json={**LTX2_REQUEST, "num_frames": 10}), "num_frames"
    )


def test_generate_cli_writes_ltx2_sound_into_the_mp4_and_a_wav(
    tiny_ltx2_dir, tmp_path, capsys
) -> None:
    common = (
        "--size",
        "64x64",
        "--num-frames",
        "9",
        "--steps",
        "2",
        "--seed",
        "3",
        "--dtype",
        "float32",
        "--enforce-eager",
        "--no-progress",
    )
    out = tmp_path / "drum.mp4"
    done = run_in_process(
        capsys, "generate", tiny_ltx2_dir, "a drum", "-o", out, *common
    )
    assert done.returncode == 0, done.stderr
    frames, samples, rate, channels = streams(out.read_bytes())
    assert frames.shape == (9, 64, 64, 3)
    assert samples is not None, "generate's MP4 has no audio stream"
    check_sound(samples, rate, channels)

    # As frames: one PNG each and the sound as a WAV beside them.
    directory = tmp_path / "frames"
    done = run_in_process(
        capsys, "generate", tiny_ltx2_dir, "a drum", "-o", f"{directory}/", *common
    )
    assert done.returncode == 0, done.stderr
    pngs = sorted(directory.glob("*.png"))
    assert len(pngs) == 9 and Image.open(pngs[0]).size == (64, 64)
    with wave.open(str(directory / "audio.wav"), "rb") as sound:
        assert (sound.getnchannels(), sound.getframerate()) == (2, SAMPLE_RATE)
        assert sound.getnframes() / SAMPLE_RATE == pytest.approx(
            SECONDS, abs=SECONDS_TOLERANCE
        )
        sound_frames = sound.getnframes()
        pcm = np.frombuffer(sound.readframes(sound_frames), dtype="<i2")
    # 16-bit PCM, interleaved: finite by construction; not silent.
    assert pcm.size == 2 * sound_frames
    assert float(np.sqrt(np.mean(np.square(pcm / 32767.0)))) > 1e-4
