"""Train the toy-motion Wan2.1 pipeline on CPU: an AutoencoderKLWan, then a WanTransformer3DModel.

Not shipped yet: the VAE and the text encoder are settled, the transformer is not. The VAE is Wan's layout
(causal 3D convolutions, 8x spatial compression, 16 channels) without temporal compression, and every causal
convolution's taps on earlier frames are zero: each frame is encoded and decoded on its own, so all the motion
is the transformer's. Why: a causal VAE with 4x temporal compression carries caches from one 4-frame chunk to
the next, and trained on short windows it meets states at a clip's later frames it never saw (measured on this
CPU: trained on 5-frame windows it turned frames 5-16 into noise; on 9-frame windows, frames 13-16; on whole
17-frame clips it collapsed to grey).
The per-frame VAE trains as an image VAE on single frames through a one-tap twin of its convolutions (3x less
work) and serves through the unchanged diffusers class: 2300 steps in 7.3 minutes, reconstruction MSE 0.019-0.027
(in [-1, 1]) on every frame of held-out whole clips. The transformer learns flow matching on the latents of whole
clips (17 latent frames, 272 tokens with Wan's 1x2x2 patches), optionally with a batch of single latent frames
(one-frame videos: image-video joint training, ``frame_batch``) after each clip step. The text encoder is the tiny
models' frozen UMT5 with neighbour heads (``text``: without them the object's and the background's colour encode
alike); ``wan_flow`` folds the prompt's padding into one attention bias, exactly; one prompt in ten is dropped to
the empty prompt, so classifier-free guidance has an unconditional branch. CPU training is not bitwise
reproducible across machines.

Measured on a 2-core Intel AMX CPU, scored by the checker on 32 held-out clips (background / object colour /
direction / shape), and not yet good enough to ship (the bars: 90 / 85 / 80 / 60):
- random UMT5, 2500 steps of 16 clips, 1902 s: loss 0.092; blobs, colours swapped, no coherent motion;
- 1x4x4 patches (68 tokens), 6000 steps of 32 clips, 2488 s: loss 0.61, noise;
- neighbour heads, 3000 steps of 16 clips (the defaults), 2103 s: loss 0.071; 100 / 47 / 22 / 16 (guidance 3:
  94 / 53 / 22 / 16): every background right, the object a blob whose colour changes from frame to frame;
- the same with 64 single frames after each of 2400 clip steps, 2160 s: 97 / 62 / 6 / 22 (guidance 3:
  94 / 75 / 3 / 22): the object's colour better, but it stays where it starts;
- the defaults continued for 2600 more steps (3526 s in all, over the budget: is the budget the problem?): loss
  0.059; 100 / 59 / 16 / 16, and the same at 40 sampling steps: more steps bring colour, not shape or motion;
- a VAE with 16x spatial compression (4x4 latents, 68 tokens, a clip step 4x cheaper) collapsed to grey in its
  2300 steps (MSE 0.58 on every frame; on whole frames, 0.39 after 1200 steps).
- a diagnostic, not a recipe: 128 clips of four prompts that differ only in the direction (a red circle on blue),
  400 steps: loss 0.066, the VAE's own reconstructions score 100 / 100 / 100 / 100, the samples 100 / 100 / 19 / 6.
  "left", "right" and "up" at one seed give the same video, and the object's centroid jumps from frame to frame.
  One-step x0 predictions from a training clip follow its track at sigma 0.3-0.6 and lose it by 0.9: at the noise
  levels that set the layout the model has no frame-to-frame structure yet. Wan's only position signal is the
  rotary embedding (relative), so motion has to be learned as "frame t+1 is frame t shifted", ~0.1 token a frame
  here (1.5 px on 16 px tokens).
- the defaults with no cross-axis jitter (the object on the path's centre line; start still jittered), 3000 steps
  of 16 clips, 1225 s in all on 2 idle cores (the transformer at ~4 steps a second): loss 0.070; 97 / 47 / 19 / 9
  (guidance 3: 88 / 44 / 31 / 3): no better than the defaults.
- the four-prompt diagnostic with the object anywhere across its path (cross jitter 20 px), 1500 steps (378 s):
  loss 0.030; 100 / 100 / 19 / 75, and at each of four seeds the four directions draw the same track (guidance 4
  too): the direction word has no effect at all. The cause: with no temporal compression a latent frame moves
  ~0.1 token, a change inside a token's content the transformer has to tie to one word; Wan's own VAE compresses
  time 4x, so its latent frames move 4x as far.
- the fix, measured (scripts not in the package yet): Wan's 4x temporal compression (``temperal_downsample``
  [False, True, True]) initialised from the trained per-frame VAE, every ``time_conv`` set to pass the current frame
  through (identity on its last tap; the upsampling one copies it to both output frames), then 1200 steps at lr
  3e-4 of 4 whole 17-frame clips (32x32 crops), 567 s: held-out whole-clip MSE 0.010-0.012 on every frame (the
  per-frame VAE: 0.016-0.017; from scratch at lr 1e-3 it had collapsed to grey). Clips are 5 latent frames, 80
  tokens, so a transformer step is ~3x cheaper (12.7 steps a second of 16 clips). The four-prompt diagnostic on it,
  1500 steps (118 s): 100 / 100 / 62 / 100 at guidance 1 and 100 / 94 / **100** / 38 at guidance 4; at one seed
  the four directions now draw four tracks. On the whole grammar (2048 clips, 8000 steps of 16 clips, 627 s) not
  yet: loss 0.095; 97 / 53 / 22 / 9 (guidance 3: 91 / 56 / 19 / 13). With 64 first latent frames (the causal
  VAE's image latents, as one-frame videos) after each clip step, 6000 steps (925 s, 1061 s with encoding and
  scoring): loss 0.070; **100 / 56 / 94 / 3** (guidance 3: 78 / 31 / 66 / 25): background and direction above
  their bars; the object's colour and shape are the next problem.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from diffserve.logging import get_logger
from diffserve.zoo.components import MARKER_FILE, component_seed
from diffserve.zoo.publish import build_into
from diffserve.zoo.toy_motion.grammar import FPS, FRAMES, all_scenes, draw_clip
from diffserve.zoo.toy_motion.text import build_text_encoder, encode_prompts
from diffserve.zoo.toy_motion.wan_flow import TextBatch, bias_cross_attention, flow_matching_loss
from diffserve.zoo.toy_shapes.grammar import SIZE
from diffserve.zoo.toy_shapes.loss_curve import write_loss_curve
from diffserve.zoo.wan_specs import SCHEDULER_CONFIG, get_wan_spec, transformer_config

logger = get_logger(__name__)

TOY_KIND = "toy-motion"
TOY_VERSION = 1
DEFAULT_STEPS = 12  # the model's own request default (marker file)

# Wan's VAE layout (8x spatial compression, 16 channels) at 8-32 channels and no temporal compression: a 17x64x64
# clip is 16 x 17 x 8 x 8 latents, 272 transformer tokens with Wan's 1x2x2 patches.
VAE_CONFIG: dict[str, Any] = {"base_dim": 8, "z_dim": 16, "dim_mult": [1, 2, 4, 4], "num_res_blocks": 1,
                              "temperal_downsample": [False, False, False], "scale_factor_temporal": 1}
TRANSFORMER_CONFIG: dict[str, Any] = transformer_config(layers=4, heads=4, head_dim=32, ffn=256)


@dataclass(frozen=True)
class TrainConfig:
    """The training budget (the defaults: the best measured run, not yet a model that animates its prompt)."""

    seed: int = 0
    clips: int = 2048  # procedurally drawn training clips (latents cached once)
    vae_steps: int = 2000  # on 32x32 crops of single frames
    vae_full_steps: int = 300  # then on whole 64x64 frames (half the batch)
    vae_batch: int = 16
    vae_lr: float = 1e-3
    kl_weight: float = 1e-6
    transformer_steps: int = 3000  # each a step on whole clips, then (frame_batch) one on single frames
    transformer_batch: int = 16  # whole clips a step
    frame_batch: int = 0  # single latent frames (images) a step: 0 trains on clips only
    transformer_lr: float = 1e-3
    ema_decay: float = 0.995
    empty_prompt_rate: float = 0.1
    threads: int = 2
    # bfloat16 autocast for the transformer: off, float32 is faster at this width (0.92 s a step of 32 clips
    # against 1.46 s on a 2-core Intel AMX CPU: the matrices are too small for the casts to pay)
    bf16: bool = False


def train_toy_motion(out_dir: Path | str, config: TrainConfig = TrainConfig(), *, force: bool = False) -> Path:
    """Train the toy-motion pipeline and write it (diffusers layout, safetensors) to ``out_dir``, with a loss curve
    (``loss.png``) and the training log (``training.json``) beside the weights."""
    target = Path(out_dir).expanduser().absolute()
    logger.info("training %s (seed %d) into %s", TOY_KIND, config.seed, target)
    return build_into(target, lambda staging: _train_into(staging, config), force=force)


def _train_into(out: Path, config: TrainConfig) -> None:
    import diffusers
    import torch
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler

    from diffserve.zoo.components import save_components, write_json

    torch.set_num_threads(config.threads)
    started = time.perf_counter()
    spec = get_wan_spec("tiny-wan")
    encoder = build_text_encoder(out, spec.text_encoder, config.seed)
    save_components({"text_encoder": lambda: encoder}, out, config.seed)
    UniPCMultistepScheduler(**SCHEDULER_CONFIG).save_pretrained(str(out / "scheduler"))

    scenes = all_scenes()
    rng = random.Random(config.seed)
    labels = [rng.randrange(len(scenes)) for _ in range(config.clips)]
    clips = clips_to_tensor([draw_clip(scenes[i], rng) for i in labels])
    log: dict[str, Any] = {"config": asdict(config)}

    torch.manual_seed(component_seed(config.seed, "vae"))
    vae = AutoencoderKLWan(**VAE_CONFIG)
    zero_earlier_frame_taps(vae)
    with per_frame_twin(vae):
        log["vae_loss"] = _train_vae(vae, clips, config)
        latents = encode_clips(vae, clips)
    log["vae_clip_mse"] = clip_reconstruction_mse(vae, clips_to_tensor([draw_clip(scenes[rng.randrange(len(
        scenes))], rng) for _ in range(16)]))
    logger.info("VAE reconstruction MSE per frame of held-out clips: %s", log["vae_clip_mse"])
    mean = latents.mean(dim=(0, 2, 3, 4))
    std = latents.std(dim=(0, 2, 3, 4))
    vae.register_to_config(latents_mean=[round(v, 6) for v in mean.tolist()],
                           latents_std=[round(v, 6) for v in std.tolist()])
    vae.eval().save_pretrained(str(out / "vae"), safe_serialization=True)
    mean = torch.tensor(vae.config.latents_mean)[None, :, None, None, None]
    std = torch.tensor(vae.config.latents_std)[None, :, None, None, None]
    latents = (latents - mean) / std
    del clips

    text = encode_prompts(out, encoder, [s.prompt for s in scenes] + [""])
    torch.manual_seed(component_seed(config.seed, "transformer"))
    transformer, log["transformer_loss"] = _train_transformer(latents, torch.tensor(labels), text, config)
    transformer.save_pretrained(str(out / "transformer"), safe_serialization=True)

    log["seconds"] = round(time.perf_counter() - started, 1)
    write_json(out / "model_index.json", {**spec.model_index(), "_diffusers_version": diffusers.__version__})
    write_json(out / MARKER_FILE, {
        "builder_version": TOY_VERSION, "kind": TOY_KIND, "seed": config.seed, "pipeline": spec.pipeline,
        "random_weights": False,
        "description": "tiny Wan2.1 trained on CPU to animate 'a {colour} {shape} moving {direction} on a "
                       "{colour} background'",
        "request_defaults": {"num_inference_steps": DEFAULT_STEPS, "guidance_scale": 1.0, "num_frames": FRAMES,
                             "fps": FPS, "height": SIZE, "width": SIZE},
    })
    (out / "training.json").write_text(json.dumps(_summary(log), indent=1) + "\n", encoding="utf-8")
    write_loss_curve(out / "loss.png", log["vae_loss"], log["transformer_loss"])
    logger.info("trained %s in %.0f s", TOY_KIND, log["seconds"])


def clips_to_tensor(clips: list[list[Any]]) -> Any:
    """Clips of PIL frames as uint8 [N, 3, F, H, W]."""
    import numpy as np
    import torch

    array = np.stack([np.stack([np.asarray(frame, dtype=np.uint8) for frame in clip]) for clip in clips])
    return torch.from_numpy(array).permute(0, 4, 1, 2, 3).contiguous()


def _as_input(batch: Any) -> Any:
    return batch.float() / 127.5 - 1.0


def _causal_convs(vae: Any) -> list[Any]:
    """The VAE's causal convolutions that look at earlier frames (temporal kernel above 1)."""
    return [m for m in vae.modules() if type(m).__name__ == "WanCausalConv3d" and m.weight.shape[2] > 1]


def zero_earlier_frame_taps(vae: Any) -> None:
    """Zero every causal convolution's taps on earlier frames: each output frame then depends on its own input
    frame only (the causal padding puts the current frame on the last tap)."""
    import torch

    with torch.no_grad():
        for conv in _causal_convs(vae):
            conv.weight[:, :, :-1].zero_()


@contextmanager
def per_frame_twin(vae: Any) -> Iterator[None]:
    """Within: each causal convolution keeps only its current-frame tap and pads no earlier frames, so single
    frames (``[N, C, 1, H, W]``) train and encode at a third of the work. Outside again: the full taps, the
    earlier ones zero and the current one as trained. Build an optimizer inside, on the twin's parameters."""
    import torch

    convs = _causal_convs(vae)
    saved = [(conv.weight, conv._padding) for conv in convs]
    for conv in convs:
        conv.weight = torch.nn.Parameter(conv.weight.detach()[:, :, -1:].clone())
        conv._padding = (*conv._padding[:4], 0, 0)
    try:
        yield
    finally:
        with torch.no_grad():
            for conv, (weight, padding) in zip(convs, saved, strict=True):
                weight.zero_()
                weight[:, :, -1:].copy_(conv.weight)
                conv.weight, conv._padding = weight, padding


def _frames_of(clips: Any) -> Any:
    """uint8 [N, 3, F, H, W] clips as [N * F, 3, 1, H, W] single frames."""
    count, channels, frames, height, width = clips.shape
    return clips.permute(0, 2, 1, 3, 4).reshape(count * frames, channels, 1, height, width)


def _frame_crops(frames: Any, batch: int, crop: int, gen: Any) -> Any:
    """``batch`` random frames, cropped to ``crop`` x ``crop`` at a random place."""
    import torch

    picks = torch.randint(len(frames), (batch,), generator=gen).tolist()
    ys = torch.randint(frames.shape[3] - crop + 1, (batch,), generator=gen).tolist()
    xs = torch.randint(frames.shape[4] - crop + 1, (batch,), generator=gen).tolist()
    return torch.stack([frames[i, :, :, y:y + crop, x:x + crop] for i, y, x in zip(picks, ys, xs, strict=True)])


def _train_vae(vae: Any, clips: Any, config: TrainConfig) -> list[float]:
    """Train (within ``per_frame_twin``) on single frames: 32x32 crops, then whole frames."""
    import torch
    from tqdm.auto import tqdm

    frames = _frames_of(clips)
    total = config.vae_steps + config.vae_full_steps
    optimizer = torch.optim.AdamW(vae.parameters(), lr=config.vae_lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, config.vae_lr, total_steps=total, pct_start=0.05)
    gen = torch.Generator().manual_seed(component_seed(config.seed, "vae-batches"))
    losses: list[float] = []
    vae.train()
    for step in tqdm(range(total), desc="vae", mininterval=2.0):
        full = step >= config.vae_steps
        x = _as_input(_frame_crops(frames, config.vae_batch // 2 if full else config.vae_batch,
                                   SIZE if full else SIZE // 2, gen))
        posterior = vae.encode(x).latent_dist
        recon = vae.decode(posterior.sample(generator=gen)).sample
        loss = torch.nn.functional.mse_loss(recon, x) + config.kl_weight * posterior.kl().mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(vae.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
    return losses


def clip_reconstruction_mse(vae: Any, clips: Any) -> list[float]:
    """Per frame, the mean squared error (in [-1, 1]) of whole held-out clips through the VAE: every frame of a
    17-frame clip, not only those of a training window, must come back."""
    import torch

    vae.eval()
    with torch.no_grad():
        x = _as_input(clips)
        error = (vae.decode(vae.encode(x).latent_dist.mean).sample - x) ** 2
    return [round(float(v), 5) for v in error.mean(dim=(0, 1, 3, 4))]


def encode_clips(vae: Any, clips: Any) -> Any:
    """The latent means of whole clips, [N, 16, 17, 8, 8] for 17x64x64, encoded frame by frame (within
    ``per_frame_twin``: the per-frame VAE makes that the whole clip's encoding)."""
    import torch
    from tqdm.auto import tqdm

    vae.eval()
    count, _, frames, _, _ = clips.shape
    chunk = 8
    with torch.no_grad():
        latents = torch.cat([vae.encode(_as_input(_frames_of(clips[i:i + chunk]))).latent_dist.mean
                             for i in tqdm(range(0, count, chunk), desc="encode", mininterval=2.0)])
    return latents.squeeze(2).unflatten(0, (count, frames)).transpose(1, 2).contiguous()  # [N, C, F, h, w]


def _train_transformer(latents: Any, labels: Any, text: TextBatch, config: TrainConfig) -> tuple[Any, list[float]]:
    import copy

    import torch
    from diffusers import WanTransformer3DModel
    from tqdm.auto import tqdm

    model = WanTransformer3DModel(**TRANSFORMER_CONFIG)
    ema = copy.deepcopy(model).eval().requires_grad_(False)
    processors = bias_cross_attention(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.transformer_lr, weight_decay=0.0)
    steps = config.transformer_steps * (2 if config.frame_batch else 1)  # optimizer steps
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, config.transformer_lr, total_steps=steps,
                                                   pct_start=0.05)
    gen = torch.Generator().manual_seed(component_seed(config.seed, "transformer-batches"))
    empty = len(text.embeds) - 1  # encode_prompts' last row: the empty prompt
    shift = float(SCHEDULER_CONFIG["flow_shift"])
    losses: list[float] = []
    model.train()
    params = list(model.parameters())
    for _ in tqdm(range(config.transformer_steps), desc="transformer", mininterval=2.0):
        for x0, prompts in _clips_then_frames(latents, labels, config, gen):
            prompts[torch.rand(len(prompts), generator=gen) < config.empty_prompt_rate] = empty
            loss = flow_matching_loss(model, processors, x0, text.take(prompts), gen, shift=shift, bf16=config.bf16)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            schedule.step()
            losses.append(loss.item())
            with torch.no_grad():
                for e, p in zip(ema.parameters(), params, strict=True):
                    e.lerp_(p, 1.0 - config.ema_decay)
    return ema, losses


def _clips_then_frames(latents: Any, labels: Any, config: TrainConfig, gen: Any) -> Iterator[tuple[Any, Any]]:
    """One step's batches: whole clips, then (``frame_batch``) single frames of random clips as one-frame videos.
    Why frames: image-video joint training as Wan's own recipe; a frame costs 1/17 of a clip, so the per-frame
    binding of the prompt's colours and shape to the object gets many more examples for the time."""
    import torch

    idx = torch.randint(len(latents), (config.transformer_batch,), generator=gen)
    yield latents[idx], labels[idx].clone()
    if config.frame_batch:
        idx = torch.randint(len(latents), (config.frame_batch,), generator=gen)
        frame = torch.randint(latents.shape[2], (config.frame_batch,), generator=gen)
        yield latents[idx, :, frame].unsqueeze(2), labels[idx].clone()


def _summary(log: dict[str, Any]) -> dict[str, Any]:
    def tail(values: list[float]) -> float:
        last = values[-50:]
        return round(sum(last) / max(len(last), 1), 5)

    return {"config": log["config"], "seconds": log["seconds"], "final_vae_loss": tail(log["vae_loss"]),
            "vae_clip_mse_per_frame": log["vae_clip_mse"], "final_transformer_loss": tail(log["transformer_loss"])}
