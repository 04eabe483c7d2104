"""``diffserve generate`` on a video model (the CLI's ``main`` in this process; a real
``diffserve generate`` process is test_e2e_generate_cli.py's): an H.264 MP4 that decodes
back (PyAV) to the requested frames and size with the request's metadata in its tags, or
one PNG per frame."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from diffserve.entrypoints.cli import main
from diffserve.entrypoints.video_encoding import read_mp4

pytestmark = pytest.mark.e2e


def test_generate_writes_an_mp4_and_frames(tiny_wan22_dir, tmp_path, capsys) -> None:
    out = tmp_path / "ball.mp4"
    common = (
        "--seed",
        3,
        "--steps",
        2,
        "--size",
        "64x48",
        "--num-frames",
        9,
        "--fps",
        8,
        "--enforce-eager",
        "--dtype",
        "float32",
        "--no-progress",
    )
    # In this process (a real `diffserve generate` process is
    # test_e2e_generate_cli.py's): the video writers.
    assert (
        main(
            [
                "generate",
                str(tiny_wan22_dir),
                "a red ball",
                "-o",
                str(out),
                *map(str, common),
            ]
        )
        == 0
    )
    frames, tags, fps = read_mp4(out.read_bytes())
    assert frames.shape == (9, 48, 64, 3) and fps == 8
    assert (
        tags["seed"],
        tags["prompt"],
        tags["steps"],
        tags["num_frames"],
        tags["fps"],
    ) == ("3", "a red ball", "2", "9", "8")
    assert tags["config_fingerprint"] and tags["model"] == str(tiny_wan22_dir)
    assert "9 frames of 64x48 at 8 fps, seed 3" in capsys.readouterr().out

    # The same request as PNG frames: lossless, and the MP4 is their H.264 encoding
    # (close, not equal).
    assert (
        main(
            [
                "generate",
                str(tiny_wan22_dir),
                "a red ball",
                "-o",
                f"{tmp_path / 'frames'}/",
                *map(str, common),
            ]
        )
        == 0
    )
    pngs = sorted((tmp_path / "frames").glob("frame-*.png"))
    assert len(pngs) == 9 and Image.open(pngs[0]).text["seed"] == "3"
    lossless = np.stack([np.asarray(Image.open(p).convert("RGB")) for p in pngs])
    # Crf 18 H.264 of the same frames.
    assert np.abs(lossless.astype(int) - frames.astype(int)).mean() < 8


def test_a_video_model_refuses_image_outputs(tiny_wan_dir, tmp_path, capsys) -> None:
    code = main(
        [
            "generate",
            str(tiny_wan_dir),
            "a ball",
            "-o",
            str(tmp_path / "ball.png"),
            "--num-frames",
            "5",
        ]
    )
    error = capsys.readouterr().err
    assert (
        code == 1 and "output" in error and "a video model writes .mp4 or DIR/" in error
    ), error
    assert not (tmp_path / "ball.png").exists()
