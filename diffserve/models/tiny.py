"""Build hermetic, random-weight FLUX.1 pipeline directories (``tiny-flux``, ``small-flux``).

The output is a diffusers-layout directory that ``diffusers.FluxPipeline.from_pretrained`` and
diffserve's own loader both read. Every weight comes from a seeded generator and every file is
written deterministically, so the same seed reproduces byte-identical files. Nothing is
downloaded. A build goes into a temporary directory beside the target and is renamed into place
only when complete, so a failed or interrupted build never leaves a half-written model behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from diffserve.errors import ConfigError
from diffserve.logging import get_logger
from diffserve.models.tiny_configs import SCHEDULER_CONFIG, FluxSpec, get_spec

logger = get_logger(__name__)

# Bump when the files a build writes change, so cached demo models are rebuilt.
BUILDER_VERSION = 1
MARKER_FILE = "diffserve_model.json"
DEMO_KIND = "tiny-flux"
DEMO_SEED = 0
TOY_ASSET = "toy-shapes"  # the demo model: diffserve/assets/toy-shapes (trained by diffserve.models.toy_shapes)

# Class names as FLUX.1 checkpoints spell them. "T5TokenizerFast" is what real FLUX repos use; in
# transformers 5 it is an alias of T5Tokenizer and both load our tokenizer.json.
_MODEL_INDEX: dict[str, Any] = {
    "_class_name": "FluxPipeline",
    "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
    "text_encoder": ["transformers", "CLIPTextModel"],
    "text_encoder_2": ["transformers", "T5EncoderModel"],
    "tokenizer": ["transformers", "CLIPTokenizer"],
    "tokenizer_2": ["transformers", "T5TokenizerFast"],
    "transformer": ["diffusers", "FluxTransformer2DModel"],
    "vae": ["diffusers", "AutoencoderKL"],
}


def build_flux_model(kind: str, out_dir: Path | str, *, seed: int = 0, guidance_embeds: bool = False,
                     force: bool = False) -> Path:
    """Write a random-weight FLUX.1 pipeline of ``kind`` to ``out_dir`` and return its path.

    ``guidance_embeds=True`` gives a dev-like (guidance-distilled) transformer; the default is
    schnell-like. An existing non-empty ``out_dir`` is an error unless ``force`` is set, and even
    then only a previous model directory (one with ``model_index.json``) is replaced, so a typo
    cannot delete unrelated data. Raises ConfigError for every bad argument.
    """
    spec = get_spec(kind)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"seed must be a non-negative integer, got {seed!r}", path="seed")
    target = Path(out_dir).expanduser().absolute()
    logger.info("building %s (seed %d, guidance_embeds=%s) in %s", kind, seed, guidance_embeds, target)
    return build_into(target, lambda staging: _write_pipeline(spec, staging, seed=seed,
                                                              guidance_embeds=guidance_embeds), force=force)


def build_into(target: Path, write: Callable[[Path], None], *, force: bool, marker: str = "model_index.json") -> Path:
    """Run ``write(staging)`` in a fresh directory beside ``target``, then publish it atomically as
    ``target``; on any failure nothing is left behind (not even parents this call created). ``force``
    replaces only a directory holding ``marker`` (what such a build writes)."""
    check_target(target, force=force, marker=marker)
    created_parents = _make_parents(target)
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.building-", dir=target.parent))
    except OSError as exc:
        _remove_empty(created_parents)
        raise _unwritable(target, exc) from None
    try:
        write(staging)
        _normalize_permissions(staging)
        _move_into_place(staging, target, force=force, marker=marker)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        _remove_empty(created_parents)
        raise
    return target


def ensure_demo_model(cache_dir: Path | str | None = None) -> Path:
    """Return the demo model: the shipped, trained toy-shapes FLUX.1 (``toy_model_dir``).

    ``cache_dir`` is accepted for compatibility and unused: nothing is built. The random-weight
    tiny-flux of earlier versions is ``ensure_tiny_flux_model``.
    """
    del cache_dir
    path = toy_model_dir()
    logger.info("using %s: the toy-shapes model (draws 'a red circle on a blue background' and the like)", path)
    return path


def toy_model_dir() -> Path:
    """The trained toy-shapes pipeline shipped in the package (``diffserve/assets/toy-shapes``)."""
    path = Path(__file__).resolve().parent.parent / "assets" / TOY_ASSET
    if not (path / "model_index.json").is_file() or not (path / MARKER_FILE).is_file():
        raise ConfigError(f"the shipped toy model is missing from {path}", path="model",
                          hint="reinstall diffserve, or train it: diffserve make-model toy-shapes DIR --train")
    return path


def ensure_tiny_flux_model(cache_dir: Path | str | None = None) -> Path:
    """Return the cached random-weight tiny-flux model, building it on first use.

    Lives in ``<cache_dir>/tiny-flux-seed0`` (default ``~/.cache/diffserve/models``). A cache
    written by a different builder version is rebuilt.
    """
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    target = root / f"{DEMO_KIND}-seed{DEMO_SEED}"
    logger.info("using %s: a random-weight demo model (its images are noise, not art)", target)
    if _is_current_build(target):
        return target
    try:
        # force only to replace a stale cache; a fresh one is never overwritten under a reader.
        return build_flux_model(DEMO_KIND, target, seed=DEMO_SEED, force=target.exists())
    except (ConfigError, OSError):
        # Another process may have finished the same build first; its result is as good as ours.
        if _is_current_build(target):
            return target
        raise


def default_cache_dir() -> Path:
    """Where ensure_tiny_flux_model keeps models when no cache directory is given."""
    return Path.home() / ".cache" / "diffserve" / "models"


def check_target(target: Path, *, force: bool, marker: str = "model_index.json") -> None:
    """Reject a target that a build could not (or must not) replace, before any heavy work."""
    if target.exists() and not target.is_dir():
        raise ConfigError(f"{target} exists and is not a directory", path="DIR",
                          hint="choose a new directory")
    if target.is_dir() and any(target.iterdir()):
        if not force:
            raise ConfigError(f"{target} is not empty", path="DIR",
                              hint="choose an empty directory or pass --force to replace the model in it")
        if not (target / marker).is_file():
            raise ConfigError(f"{target} is not empty and holds no {marker}; refusing to delete it",
                              path="DIR", hint="remove it yourself or choose another directory")
    # The deepest existing ancestor is where the staging directory's parents get created.
    probe = target.parent
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise _unwritable(target, NotADirectoryError(20, "Not a directory"))
    if not os.access(probe, os.W_OK | os.X_OK):
        raise _unwritable(target, PermissionError(13, "Permission denied"))


def component_seed(seed: int, component: str) -> int:
    """Independent per-component seed, so changing one component never shifts another's weights."""
    digest = hashlib.sha256(f"diffserve:{seed}:{component}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _write_pipeline(spec: FluxSpec, out: Path, *, seed: int, guidance_embeds: bool) -> None:
    import diffusers
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxTransformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    from diffserve.models.tiny_tokenizers import (
        CLIP_BOS,
        CLIP_EOS,
        clip_vocab_and_merges,
        write_clip_tokenizer,
        write_t5_tokenizer,
    )

    clip_vocab_size = write_clip_tokenizer(out / "tokenizer")
    t5_vocab_size = write_t5_tokenizer(out / "tokenizer_2")
    clip_vocab, _ = clip_vocab_and_merges()
    FlowMatchEulerDiscreteScheduler(**SCHEDULER_CONFIG).save_pretrained(str(out / "scheduler"))

    clip_config = CLIPTextConfig(
        **spec.clip, vocab_size=clip_vocab_size, bos_token_id=clip_vocab[CLIP_BOS],
        eos_token_id=clip_vocab[CLIP_EOS], pad_token_id=clip_vocab[CLIP_EOS],
    )
    # T5's ids are fixed by the tokenizer layout: <pad>=0, </s>=1; decoding starts from <pad>.
    t5_config = T5Config(**spec.t5, vocab_size=t5_vocab_size, pad_token_id=0, eos_token_id=1,
                         decoder_start_token_id=0)
    factories: dict[str, Callable[[], Any]] = {
        "text_encoder": lambda: CLIPTextModel(clip_config),
        "text_encoder_2": lambda: T5EncoderModel(t5_config),
        "vae": lambda: AutoencoderKL(**spec.vae),
        "transformer": lambda: FluxTransformer2DModel(**spec.transformer_config(guidance_embeds=guidance_embeds)),
    }
    save_components(factories, out, seed)

    _write_json(out / "model_index.json", {**_MODEL_INDEX, "_class_name": spec.pipeline_class,
                                           "_diffusers_version": diffusers.__version__})
    _write_json(out / MARKER_FILE, {
        "builder_version": BUILDER_VERSION,
        "kind": spec.name,
        "description": spec.description,
        "seed": seed,
        "guidance_embeds": guidance_embeds or spec.always_guidance_embeds,
        "random_weights": True,
    })


def save_components(factories: dict[str, Callable[[], Any]], out: Path, seed: int) -> None:
    """Build each component from its own seed (``component_seed``) and save it as safetensors under ``out``."""
    import torch
    from transformers.utils import logging as hf_logging

    # A "Writing model shards" bar per tiny file is noise; restore the caller's setting afterwards.
    bars_were_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    # fork_rng: the caller's global RNG state is untouched however many modules we initialise.
    try:
        with torch.random.fork_rng(devices=[]):
            for name, factory in factories.items():
                torch.manual_seed(component_seed(seed, name))
                with torch.no_grad():
                    module = factory().eval()
                module.save_pretrained(str(out / name), safe_serialization=True)
                del module
    finally:
        if bars_were_on:
            hf_logging.enable_progress_bar()


def _normalize_permissions(root: Path) -> None:
    """mkdtemp makes 0700 and some savers write 0600; give the result ordinary umask permissions."""
    umask = _current_umask()
    root.chmod(0o777 & ~umask)
    for path in root.rglob("*"):
        path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)


def _current_umask() -> int:
    # /proc avoids os.umask's set-and-restore, which would briefly change it for other threads.
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _move_into_place(staging: Path, target: Path, *, force: bool, marker: str) -> None:
    """Atomically publish ``staging`` as ``target``; a replaced model is moved aside, then deleted."""
    old: Path | None = None
    if target.is_dir():
        if any(target.iterdir()):
            check_target(target, force=force, marker=marker)  # re-checked: something may have appeared meanwhile
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
            os.replace(target, old / "model")
        else:
            target.rmdir()
    try:
        os.rename(staging, target)
    except OSError as exc:
        if target.is_dir() and any(target.iterdir()):  # another build published here meanwhile
            raise ConfigError(f"{target} is not empty", path="DIR", hint="another build wrote it") from exc
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _make_parents(target: Path) -> list[Path]:
    """Create missing parents of ``target``; returns those created (deepest first) for cleanup."""
    missing = []
    probe = target.parent
    while not probe.exists():
        missing.append(probe)
        probe = probe.parent
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        _remove_empty(missing)
        raise _unwritable(target, exc) from None
    return missing


def _remove_empty(dirs: list[Path]) -> None:
    for path in dirs:  # deepest first
        try:
            path.rmdir()
        except OSError:
            break


def _unwritable(target: Path, exc: OSError) -> ConfigError:
    reason = exc.strerror or str(exc)
    return ConfigError(f"cannot write {target}: {reason}", path="DIR", hint="choose a writable directory")


def _is_current_build(target: Path) -> bool:
    try:
        marker = json.loads((target / MARKER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(marker, dict) and marker.get("builder_version") == BUILDER_VERSION \
        and (target / "model_index.json").is_file()
