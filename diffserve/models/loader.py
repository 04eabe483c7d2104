"""Read safetensors weights (one file or a sharded index) and load them strictly into a
module.

Only safetensors: there is deliberately no pickle (``torch.load``) path, see
docs/security.md.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import nn

from diffserve.errors import ModelLoadError
from diffserve.logging import get_logger

logger = get_logger(__name__)

# Weight files that are pickles (torch.save / legacy checkpoints); named in errors,
# never opened.
_PICKLE_SUFFIXES = frozenset({".bin", ".pt", ".pth", ".ckpt", ".pkl"})

# Where a loaded weight starts in memory. safetensors hands each tensor out at its
# offset in the file (4-byte aligned at worst), and MKL promises the same GEMM result
# only for inputs aligned to 64 bytes (its conditional-numerical-reproducibility rules):
# the same weights read from a folder and from a BFL or ComfyUI file could round
# differently on one CPU. torch's CPU allocator aligns to 64 bytes, so a copy fixes it.
WEIGHT_ALIGNMENT = 64


def aligned(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``, or a copy of it in memory aligned to ``WEIGHT_ALIGNMENT`` bytes where
    it is not (CPU only: accelerator allocators align far more already)."""
    if tensor.device.type != "cpu" or tensor.data_ptr() % WEIGHT_ALIGNMENT == 0:
        return tensor
    return tensor.clone()


def align_weights(module: nn.Module) -> nn.Module:
    """Give every parameter and buffer of ``module`` aligned memory (``aligned``), one
    tensor at a time so the unaligned original is freed before the next copy: a model's
    weights give the same numbers whichever file held them."""
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            tensor.data = aligned(tensor.data)
    return module


def read_config(component_dir: str | Path) -> dict:
    path = Path(component_dir) / "config.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ModelLoadError(f"{path} is missing") from exc
    except json.JSONDecodeError as exc:
        raise ModelLoadError(f"{path} is not valid JSON: {exc}") from exc


def read_safetensors(
    component_dir: str | Path, stem: str = "diffusion_pytorch_model"
) -> dict[str, torch.Tensor]:
    """All tensors of ``<stem>.safetensors`` or of the shards listed in
    ``<stem>.safetensors.index.json``."""
    directory = Path(component_dir)
    single = directory / f"{stem}.safetensors"
    index = directory / f"{stem}.safetensors.index.json"
    if single.is_file():
        return load_file(str(single))
    if not index.is_file():
        # Pickle checkpoints are never read (unpickling runs arbitrary code); say so, so
        # a directory with only a .bin is not mistaken for a missing download.
        pickles = sorted(
            p.name for p in directory.glob("*") if p.suffix in _PICKLE_SUFFIXES
        )
        hint = (
            f" ({', '.join(pickles)} not loaded: pickle weights "
            "are refused, convert to safetensors)"
            if pickles
            else ""
        )
        raise ModelLoadError(
            f"no weights in {directory}: expected {single.name} or {index.name}{hint}"
        )
    weight_map: dict[str, str] = json.loads(index.read_text(encoding="utf-8")).get(
        "weight_map", {}
    )
    tensors: dict[str, torch.Tensor] = {}
    for shard in sorted(set(weight_map.values())):
        path = directory / shard
        if not path.is_file():
            raise ModelLoadError(f"shard {shard} listed in {index} is missing")
        shard_tensors = load_file(str(path))
        twice = sorted(shard_tensors.keys() & tensors.keys())
        if twice:
            raise ModelLoadError(
                f"{path}: {len(twice)} tensors are also in an earlier "
                f"shard ({', '.join(twice[:5])}): "
                "a stale or mixed download? fetch the component again"
            )
        tensors.update(shard_tensors)
    listed = set(weight_map)
    if listed != tensors.keys():
        detail = describe_key_mismatch(
            missing=listed - tensors.keys(), unexpected=tensors.keys() - listed
        )
        raise ModelLoadError(
            f"{index} does not match its shards (missing: listed, "
            "in no shard; unexpected: in a "
            f"shard, not listed): {detail}; a stale or mixed download? "
            "fetch the component again"
        )
    return tensors


# How many keys of each kind a mismatch names: enough to recognise the pattern, short
# enough to stay one line.
KEYS_NAMED = 5
OTHER_MODEL_HINT = "a checkpoint of another model or size?"


def describe_key_mismatch(
    missing: Iterable[str] = (),
    unexpected: Iterable[str] = (),
    wrong_shape: Iterable[tuple[str, Sequence[int], Sequence[int]]] = (),
) -> str:
    """The one wording of a weights/module key mismatch, wherever one is found: "missing
    1 key: a; unexpected 3 keys: a, b, c; wrong shape in 1 key: k (found (3,), expected
    (4,))", each kind's count and its first ``KEYS_NAMED`` keys (sorted), or "" when
    nothing is wrong. ``wrong_shape``: (key, found, expected)."""
    shapes = sorted(
        {(key, tuple(found), tuple(want)) for key, found, want in wrong_shape}
    )
    kinds = (
        ("missing", sorted(set(missing))),
        ("unexpected", sorted(set(unexpected))),
        (
            "wrong shape in",
            [f"{key} (found {found}, expected {want})" for key, found, want in shapes],
        ),
    )
    return "; ".join(f"{kind} {_keys(keys)}" for kind, keys in kinds if keys)


def _keys(keys: list[str]) -> str:
    """ "3 keys: a, b, c" (the first ``KEYS_NAMED``, then how many more)."""
    more = f", ... ({len(keys) - KEYS_NAMED} more)" if len(keys) > KEYS_NAMED else ""
    return (
        f"{len(keys)} key{'s' if len(keys) > 1 else ''}: "
        f"{', '.join(keys[:KEYS_NAMED])}{more}"
    )


def check_key_match(
    source: str,
    target: str,
    *,
    missing: Collection[str] = (),
    unexpected: Collection[str] = (),
    wrong_shape: Collection[tuple[str, Sequence[int], Sequence[int]]] = (),
    hint: str = OTHER_MODEL_HINT,
) -> None:
    """A ``ModelLoadError`` "SOURCE: weights do not match TARGET:
    <describe_key_mismatch> (HINT)" when any key is missing, unexpected or of the wrong
    shape; nothing otherwise."""
    detail = describe_key_mismatch(missing, unexpected, wrong_shape)
    if detail:
        raise ModelLoadError(
            f"{source}: weights do not match {target}: {detail} ({hint})"
        )


def load_strict(
    module: nn.Module,
    state_dict: dict[str, torch.Tensor],
    *,
    dtype: torch.dtype,
    device: torch.device | str,
    source: str = "",
    keep_float32: Callable[[str], bool] | None = None,
    file_key: Callable[[str], str] | None = None,
    dropped: Collection[str] = (),
) -> None:
    """Load (by assignment, so a meta-device module gets real tensors) and fail on any
    key or shape mismatch, naming ``source`` (the file or folder the weights came from)
    and the offending keys. Keys for which ``keep_float32`` is true load as float32
    whatever ``dtype`` is (a family's precision-critical parameters).

    Where ``state_dict`` was converted from another layout, ``file_key`` names a module
    key as the file does (so an error names what the user can find in the file) and
    ``dropped`` lists the file's keys the conversion had no place for (reported as
    unexpected)."""
    name = file_key or (lambda key: key)
    expected = module.state_dict()
    missing, unexpected = (
        expected.keys() - state_dict.keys(),
        state_dict.keys() - expected.keys(),
    )
    wrong = [
        (name(key), tuple(state_dict[key].shape), tuple(want.shape))
        for key, want in expected.items()
        if key in state_dict and state_dict[key].shape != want.shape
    ]
    check_key_match(
        source or "weights",
        type(module).__name__,
        missing={name(k) for k in missing},
        unexpected={name(k) for k in unexpected} | set(dropped),
        wrong_shape=wrong,
    )
    where = f"{source}: " if source else ""
    not_float = [
        key
        for key, want in expected.items()
        if want.is_floating_point() and not state_dict[key].is_floating_point()
    ]
    if not_float:
        raise ModelLoadError(
            f"{where}{len(not_float)} tensors are stored as integers "
            "where the model has floating "
            "point weights: "
            + ", ".join(f"{name(k)} ({state_dict[k].dtype})" for k in not_float[:5])
            + " "
            "(a quantized checkpoint in another format?)"
        )
    # In place, so an uncast copy is freed as soon as its cast exists.
    for key in list(state_dict):
        wanted = (
            torch.float32 if keep_float32 is not None and keep_float32(key) else dtype
        )
        state_dict[key] = aligned(state_dict[key].to(device=device, dtype=wanted))
    module.load_state_dict(state_dict, strict=True, assign=True)


# What other checkpoints' keys look like, so a file of the wrong kind is named, not just
# refused.
_LOOKS_LIKE = (
    ("a FLUX transformer", ("double_blocks.", "single_transformer_blocks.")),
    (
        "an SDXL / SD1.x UNet",
        ("input_blocks.", "middle_block.", "down_blocks.", "mid_block."),
    ),
    ("an SD3 MMDiT", ("joint_blocks.", "x_embedder.proj.")),
    (
        "a VAE",
        ("encoder.down.", "decoder.up.", "encoder.down_blocks.", "decoder.up_blocks."),
    ),
    (
        "a text encoder",
        ("text_model.", "encoder.block.", "shared.weight", "encoder.layer."),
    ),
    ("a LoRA adapter", ("lora_A", "lora_B", "lora_down", "lora_up")),
)


def looks_like(keys: list[str]) -> str:
    """ "keys look like an SD3 MMDiT" (or the first keys, when they look like nothing
    known)."""
    guess = next(
        (
            what
            for what, marks in _LOOKS_LIKE
            if any(m in k for k in keys for m in marks)
        ),
        None,
    )
    return (
        f"keys look like {guess}"
        if guess
        else f"unrecognised keys ({', '.join(sorted(keys)[:5])}, ...)"
    )


def read_checkpoint(path: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of a single ``.safetensors`` file; other formats are refused
    (pickles are never read)."""
    from safetensors import SafetensorError

    file = Path(path)
    if file.suffix != ".safetensors":
        raise ModelLoadError(
            f"{file}: only .safetensors single files are read here "
            "(pickle checkpoints are "
            "refused: convert them to safetensors)"
        )
    if not file.is_file():
        raise ModelLoadError(f"{file}: no such file")
    try:
        return load_file(str(file))
    except (SafetensorError, OSError, ValueError) as exc:
        raise ModelLoadError(
            f"{file}: not a readable safetensors file ({exc}); a truncated download? "
            "fetch it again"
        ) from None


def check_loading_info(
    source: str,
    target: str,
    info: Any,
    *,
    file_key: Callable[[str], str] | None = None,
    hint: str = OTHER_MODEL_HINT,
) -> None:
    """``check_key_match`` on what transformers' or diffusers' ``output_loading_info``
    reports as missing, unexpected or of the wrong shape (what they would only warn
    about); ``file_key`` names a key as the file does."""
    name = file_key or (lambda key: key)
    items = list(info.get("mismatched_keys") or ())
    # Both libraries report a wrong shape as (key, checkpoint shape, model shape).
    shaped = [i for i in items if isinstance(i, (tuple, list)) and len(i) == 3]
    check_key_match(
        source,
        target,
        hint=hint,
        missing={name(str(k)) for k in info.get("missing_keys") or ()},
        unexpected={name(str(k)) for k in info.get("unexpected_keys") or ()},
        wrong_shape=[
            (name(str(key)), tuple(found), tuple(want)) for key, found, want in shaped
        ],
    )
    # A library version that lists bare keys: named all the same.
    if len(shaped) != len(items):
        bare = {
            name(str(i))
            for i in items
            if not (isinstance(i, (tuple, list)) and len(i) == 3)
        }
        raise ModelLoadError(
            f"{source}: weights do not match {target}: wrong shape "
            f"in {_keys(sorted(bare))} ({hint})"
        )


def strict_from_pretrained(cls: Any, folder: str | Path, **kwargs: Any) -> Any:
    """``cls.from_pretrained(folder)`` (transformers' or diffusers'), refusing what they
    only warn about: a missing weight (they initialize it randomly), an unexpected one,
    or one of the wrong shape."""
    # ignore_mismatched_sizes: a wrong shape lands in the loading info (refused below,
    # naming the key) instead of an error that points at a log table.
    model, info = cls.from_pretrained(
        str(folder),
        use_safetensors=True,
        output_loading_info=True,
        ignore_mismatched_sizes=True,
        **kwargs,
    )
    check_loading_info(
        str(folder),
        cls.__name__,
        info,
        hint="a stale or partial download, or a checkpoint of another "
        "model? fetch the component again",
    )
    return align_weights(model)


def strict_model_components(root: str | Path, dtype: torch.dtype) -> dict[str, Any]:
    """Every neural-network component ``model_index.json`` lists (diffusers
    ``ModelMixin`` or transformers ``PreTrainedModel``), each loaded by
    ``strict_from_pretrained``: a pipeline's ``from_pretrained`` given these loads only
    the tokenizers and the scheduler itself, and cannot patch a broken weight file."""
    import importlib

    from diffusers import ModelMixin
    from transformers import PreTrainedModel

    index_path = Path(root) / "model_index.json"
    try:
        index = json.loads(index_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot read {index_path}: {exc}") from None
    loaded: dict[str, Any] = {}
    for name, value in index.items():
        if name.startswith("_") or not (
            isinstance(value, list) and len(value) == 2 and all(value)
        ):
            continue
        library, class_name = value
        if library not in ("diffusers", "transformers"):
            continue
        cls = getattr(importlib.import_module(library), class_name, None)
        if isinstance(cls, type) and issubclass(cls, ModelMixin):
            loaded[name] = strict_from_pretrained(
                cls, Path(root) / name, torch_dtype=dtype
            )
        elif isinstance(cls, type) and issubclass(cls, PreTrainedModel):
            loaded[name] = strict_from_pretrained(cls, Path(root) / name, dtype=dtype)
    return loaded
