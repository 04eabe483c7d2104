"""The minimal diffusers script that ``diffserve generate`` is compared with at cold
start: load the pipeline, make one image, save it. Usage: python diffusers_generate.py
MODEL PROMPT OUT STEPS SIZE SEED"""

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from diffusers import FluxPipeline  # noqa: E402


def main() -> None:
    model, prompt, out, steps, size, seed = sys.argv[1:7]
    pipe = FluxPipeline.from_pretrained(model, torch_dtype=torch.float32)
    image = pipe(
        prompt,
        height=int(size),
        width=int(size),
        num_inference_steps=int(steps),
        guidance_scale=3.5,
        max_sequence_length=512,
        generator=torch.Generator("cpu").manual_seed(int(seed)),
    ).images[0]
    image.save(out)


if __name__ == "__main__":
    main()
