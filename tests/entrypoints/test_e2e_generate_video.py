"""``diffserve generate`` on a video model, as a user runs it: an H.264 MP4 that decodes back (PyAV) to the
requested frames and size with the request's metadata in its tags, or one PNG per frame."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image
from test_e2e_generate_cli import run_cli

from diffserve.entrypoints.cli import main
from diffserve.entrypoints.openai.video_encoding import read_mp4

pytestmark = pytest.mark.e2e


def test_generate_writes_an_mp4_and_frames(tiny_wan22_dir, tmp_path) -> None:
    out = tmp_path / "ball.mp4"
    common = ("--seed", 3, "--steps", 2, "--size", "64x48", "--num-frames", 9, "--fps", 8, "--enforce-eager",
              "--dtype", "float32", "--no-progress")
    proc = run_cli("generate", tiny_wan22_dir, "a red ball", "-o", out, *common)
    assert proc.returncode == 0, proc.stderr[-3000:]
    frames, tags, fps = read_mp4(out.read_bytes())
    assert frames.shape == (9, 48, 64, 3) and fps == 8
    assert (tags["seed"], tags["prompt"], tags["steps"], tags["num_frames"], tags["fps"]) == \
        ("3", "a red ball", "2", "9", "8")
    assert tags["config_fingerprint"] and tags["model"] == str(tiny_wan22_dir)
    assert "wrote" in proc.stdout and "9 frames of 64x48 at 8 fps, seed 3" in proc.stdout

    # The same request as PNG frames (the CLI in this process: the MP4 run above proved the real process):
    # lossless, and the MP4 is their H.264 encoding (close, not equal).
    assert main(["generate", str(tiny_wan22_dir), "a red ball", "-o", f"{tmp_path / 'frames'}/",
                 *map(str, common)]) == 0
    pngs = sorted((tmp_path / "frames").glob("frame-*.png"))
    assert len(pngs) == 9 and Image.open(pngs[0]).text["seed"] == "3"
    lossless = np.stack([np.asarray(Image.open(p).convert("RGB")) for p in pngs])
    assert np.abs(lossless.astype(int) - frames.astype(int)).mean() < 8  # crf 18 H.264 of the same frames


@pytest.mark.parametrize(("output", "needle"), [("ball.png", "a video model writes .mp4 or DIR/")])
def test_a_video_model_refuses_image_outputs(tiny_wan_dir, tmp_path, output, needle) -> None:
    proc = run_cli("generate", tiny_wan_dir, "a ball", "-o", tmp_path / output, "--num-frames", 5)
    assert proc.returncode != 0 and needle in proc.stderr, proc.stderr[-2000:]
    body = proc.stderr.strip().splitlines()[-1]
    assert "output" in body and not (tmp_path / output).exists()

