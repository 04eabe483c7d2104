"""``diffserve generate [MODEL] PROMPT -o out.png``: one request, no server, with a
progress bar.

Images are written with the same encoder as the server (PNGs carry prompt, seed, steps
and config fingerprint); the seed of every image is printed so any of them can be
regenerated alone. A video model's output is an H.264 MP4 (``-o out.mp4``, the same
metadata in its tags) or one PNG per frame (``-o DIR/``).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from diffserve.entrypoints.commands.generate_args import add_generate_parser
from diffserve.logging import get_logger

if TYPE_CHECKING:
    from diffserve.config.resolved import ResolvedConfig
    from diffserve.provenance.keys import Signing
    from diffserve.types.request import GenerationRequest, RequestOutput

logger = get_logger(__name__)

FORMATS = {".png": "png", ".jpg": "jpeg", ".jpeg": "jpeg", ".webp": "webp"}
VIDEO_FORMATS = {".mp4": "mp4"}


def register(subparsers: argparse._SubParsersAction) -> None:
    add_generate_parser(subparsers).set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import asyncio

    from diffserve.errors import RequestError

    if len(args.words) > 2:
        raise RequestError(
            f"expected [MODEL] PROMPT, got {len(args.words)} words; quote the prompt",
            param="prompt",
        )
    model, prompt = (None, args.words[0]) if len(args.words) == 1 else args.words
    fmt = None
    if args.output is not None:
        output = Path(args.output)
        if args.output.endswith(("/", "\\")) or output.is_dir():
            fmt = "frames"
        else:
            fmt = FORMATS.get(output.suffix.lower()) or VIDEO_FORMATS.get(
                output.suffix.lower()
            )
        if fmt is None:
            raise RequestError(
                f"output {output} must "
                f"end in one of {', '.join([*FORMATS, *VIDEO_FORMATS])} "
                "(or "
                "be a directory, DIR/, for a video's frames)",
                param="output",
            )
    return asyncio.run(_generate(args, model, prompt, args.output, fmt))


async def _generate(
    args: argparse.Namespace,
    model: str | None,
    prompt: str,
    output_arg: str | None,
    fmt: str | None,
) -> int:
    import asyncio

    from tqdm import tqdm

    from diffserve.config.cli_args import config_kwargs_from_args
    from diffserve.config.resolve import resolve
    from diffserve.engine.async_engine import AsyncEngine
    from diffserve.engine.client import AsyncEngineClient
    from diffserve.entrypoints.openai.encoding import encode_all
    from diffserve.entrypoints.request_fields import to_request
    from diffserve.errors import RequestError
    from diffserve.registry.models import makes_videos
    from diffserve.types.request import ProgressEvent, RequestOutput

    # The arguments as the request names them (request_fields.to_request: the one mapper
    # of every API).
    kwargs: dict[str, Any] = {
        "prompt": prompt,
        "n": args.n,
        "seed": args.seed,
        "size": args.size,
        "negative_prompt": args.negative_prompt,
        "num_inference_steps": args.steps,
        "guidance_scale": args.guidance_scale,
        "max_sequence_length": args.max_sequence_length,
        "num_frames": args.num_frames,
        "fps": args.fps,
        "rewrite_prompt": False if args.no_rewrite else None,
    }
    if args.config_cache_threshold is not None:
        # One request: the config flag --cache-threshold is also this request's
        # cache_threshold, so it is checked like an HTTP request's (bounded by
        # cache.max_threshold, refused without a cache backend).
        kwargs["cache_threshold"] = _number(
            args.config_cache_threshold, "cache_threshold"
        )
    files = _lora_choices(args.lora or [], kwargs)
    _edit_inputs(args, kwargs)
    # Built (and so validated) before anything loads: a bad argument fails in
    # milliseconds.
    request = to_request(kwargs)
    config_kwargs = config_kwargs_from_args(args)
    if files:  # files given to --lora are registered for this one run
        overrides = config_kwargs.get("overrides") or {}
        overrides["lora_modules"] = ",".join(
            filter(None, [overrides.get("lora_modules", ""), *files])
        )
        config_kwargs["overrides"] = overrides
    config = resolve(model=model, **config_kwargs)
    if config.model is None:  # neither MODEL nor the deploy file's model:
        from diffserve.zoo.demo import ensure_demo_model

        model = str(ensure_demo_model())
        logger.warning(
            "no MODEL given: using the toy-shapes demo model at "
            "%s (a tiny model trained to draw "
            "'a {colour} {shape} on a {colour} background', 64x64)",
            model,
        )
        config = resolve(model=model, **config_kwargs)
    for warning in config.warnings:
        logger.warning("config: %s", warning)
    video = makes_videos(config.model)
    fmt = fmt or ("mp4" if video else "png")
    output = Path(output_arg or ("out.mp4" if video else "out.png"))
    if video != (fmt in ("mp4", "frames")):
        wanted = (
            "a video model writes .mp4 or DIR/"
            if video
            else "an image model writes " + ", ".join(FORMATS)
        )
        raise RequestError(f"output {output}: {wanted}", param="output")
    # Construction loads the model (and warms up): blocking work, kept off the event
    # loop.
    engine: AsyncEngineClient = await asyncio.to_thread(AsyncEngine.from_config, config)
    try:
        output_obj: RequestOutput | None = None
        with tqdm(
            total=request.num_inference_steps,
            desc="denoise",
            unit="step",
            disable=args.no_progress,
        ) as bar:
            async for event in engine.generate(request):
                if isinstance(event, ProgressEvent):
                    bar.total = event.total_steps
                    bar.update(event.step - bar.n)
                elif isinstance(event, RequestOutput):
                    output_obj = event
    finally:
        await asyncio.to_thread(engine.shutdown)
    if output_obj is None:
        raise RuntimeError("the engine finished without an output")
    if output_obj.revised_prompt is not None:
        print(f"revised prompt: {output_obj.revised_prompt}")
    metadata = {
        "prompt": prompt,
        "steps": str(output_obj.num_inference_steps or request.num_inference_steps),
        "guidance_scale": str(output_obj.guidance_scale),
        "config_fingerprint": output_obj.config_fingerprint,
        "size": f"{output_obj.width}x{output_obj.height}",
    }
    signing = _signing(config, request, output_obj)
    if output_obj.videos:
        await asyncio.to_thread(
            _write_videos,
            output_obj,
            output,
            fmt,
            {**metadata, "model": str(config.model)},
            signing,
        )
        return 0
    blobs = await asyncio.to_thread(
        encode_all, output_obj.images, output_obj.seeds, fmt, None, metadata, signing
    )
    paths = output_paths(output, len(blobs))
    for path, blob, seed in zip(paths, blobs, output_obj.seeds, strict=True):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(blob)
        print(f"wrote {path} ({output_obj.width}x{output_obj.height}, seed {seed})")
    for i, entry in enumerate(output_obj.attestation.get("cache", [])):
        if entry["backend"] != "none":
            print(
                f"step cache image {i}: {entry['backend']} threshold "
                f"{entry['threshold']:g}, skipped "
                f"{entry['skipped_steps']} "
                f"of {entry['computed_steps'] + entry['skipped_steps']} "
                "steps"
            )
    print(
        f"config fingerprint {output_obj.config_fingerprint}; timings ms "
        + ", ".join(f"{k}={v:.0f}" for k, v in output_obj.timings.items())
    )
    return 0


def _number(text: str, param: str) -> float:
    from diffserve.errors import RequestError

    try:
        return float(text)
    except ValueError:
        raise RequestError(
            f"--{param.replace('_', '-')} {text!r} is not a number", param=param
        ) from None


def _edit_inputs(args: argparse.Namespace, kwargs: dict[str, Any]) -> None:
    """``--image``/``--mask``/``--strength`` -> the request's ``images``, ``mask`` (255
    = repaint) and ``strength``, decoded with the server's checks and mask convention
    (``openai/uploads.py``)."""
    from diffserve.errors import RequestError

    if args.image:
        from diffserve.entrypoints.openai.uploads import MAX_SIDE, read_edit_files

        kwargs["images"], kwargs["mask"] = read_edit_files(
            args.image, args.mask, max_pixels=MAX_SIDE * MAX_SIDE
        )
    elif args.mask is not None:
        raise RequestError("--mask needs --image (the image to edit)", param="mask")
    if args.strength is not None:
        kwargs["strength"] = args.strength


def output_paths(output: Path, n: int) -> list[Path]:
    """``out.png`` for one image; ``out-0.png``, ``out-1.png``, ... for several."""
    if n == 1:
        return [output]
    return [output.with_name(f"{output.stem}-{i}{output.suffix}") for i in range(n)]


def _lora_choices(values: list[str], kwargs: dict[str, Any]) -> list[str]:
    """``--lora NAME_OR_FILE[:SCALE]`` -> the request's ``loras``; returns ``name=path``
    for the files given, which this run registers under their file name."""
    loras, files = [], []
    for value in values:
        target, _, scale_text = (
            value.rpartition(":") if ":" in value else (value, "", "1")
        )
        try:
            scale = float(scale_text)
        except ValueError:
            raise SystemExit(
                f"diffserve generate: error: --lora {value!r}: SCALE must be a number"
            ) from None
        path = Path(target).expanduser()
        if path.suffix == ".safetensors" or path.is_dir() or path.is_file():
            name = path.stem if path.suffix else path.name
            files.append(f"{name}={path}")
            target = name
        loras.append((target, scale))
    if loras:
        kwargs["loras"] = tuple(loras)
    return files


def _signing(
    config: ResolvedConfig, request: GenerationRequest, output_obj: RequestOutput
) -> Signing | None:
    """What signs the files (``server.provenance``: the same key as a server on this
    machine's state_dir), or None when provenance is off."""
    from diffserve import __version__
    from diffserve.entrypoints.provenance_keys import signer_for
    from diffserve.provenance.facts import from_output
    from diffserve.provenance.keys import Signing

    signer = signer_for(config.server)
    if signer is None:
        return None
    generation = from_output(
        output_obj,
        model=str(config.model),
        prompt=request.prompt,
        seed=0,  # each output's own
        negative_prompt=request.negative_prompt,
        edit=bool(request.images),
    )
    return Signing(signer, generation, __version__)


def _write_videos(
    output_obj: Any,
    output: Path,
    fmt: str,
    metadata: dict[str, str],
    signing: Signing | None = None,
) -> None:
    """Each video as an MP4 (``out.mp4``; ``out-0.mp4``... for several; signed with
    ``signing``) or its frames as PNGs (``DIR/``; ``DIR/0/``... for several), with the
    seed, frames and fps beside the request's metadata."""
    from diffserve.entrypoints.video_encoding import encode_mp4, write_frames, write_wav
    from diffserve.provenance.video import sign_mp4

    n = len(output_obj.videos)
    audios = output_obj.audios or [None] * n
    rate = output_obj.audio_sample_rate
    for index, (video, audio, seed) in enumerate(
        zip(output_obj.videos, audios, output_obj.seeds, strict=True)
    ):
        tags = {
            **metadata,
            "seed": str(seed),
            "num_frames": str(output_obj.num_frames),
            "fps": str(output_obj.fps),
        }
        if fmt == "frames":
            target = output / str(index) if n > 1 else output
            write_frames(target, video, tags)
            if audio is not None:  # the sound beside the frames
                write_wav(target / "audio.wav", audio, rate)
        else:
            target = output_paths(output, n)[index]
            target.parent.mkdir(parents=True, exist_ok=True)
            data = encode_mp4(
                video, output_obj.fps, tags, audio=audio, sample_rate=rate
            )
            if signing is not None:
                data = sign_mp4(
                    data,
                    signing.for_seed(seed),
                    {
                        "width": output_obj.width,
                        "height": output_obj.height,
                        "frames": output_obj.num_frames,
                        "fps": output_obj.fps,
                        "audio": audio is not None,
                    },
                )
            target.write_bytes(data)
        sound = f", audio at {rate} Hz" if audio is not None else ""
        print(
            f"wrote {target} ({output_obj.num_frames} frames of "
            f"{output_obj.width}x{output_obj.height} at "
            f"{output_obj.fps} fps{sound}, seed {seed})"
        )
