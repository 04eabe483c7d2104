"""What a deployment would load, without loading it: per component the weight files
(sizes, sha256), the layout of a single file, the parameter count and stored dtypes, and
the bytes it takes at the stage's dtype.

Only safetensors headers are read for shapes and dtypes (8 bytes of length, then JSON);
hashing reads the files once and remembers the digest by path, size and modification
time (under ``DIFFSERVE_CACHE_DIR``).
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from diffserve.errors import ModelLoadError

# Bytes per element of safetensors dtypes, and of the stage dtypes a component is cast
# to.
_ELEMENT_BYTES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
}
STAGE_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
_UNITS = {
    "": 1,
    "b": 1,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
}


@dataclass
class WeightFile:
    path: str
    bytes: int
    sha256: str


@dataclass
class ComponentReport:
    name: str
    source: str  # "folder" | "single file"
    layout: str  # diffusers | bfl | comfyui | ldm
    files: list[WeightFile] = field(default_factory=list)
    parameters: int = 0
    stored_dtypes: dict[str, int] = field(default_factory=dict)  # dtype -> parameters
    # at the stage's dtype (floating tensors cast; others as stored), quantized as
    # configured
    device_bytes: int = 0
    # the method its Linear weights are quantized with (quantization settings)
    quantization: str = "none"
    # Linear weights counted at the method's bytes (data + per-row scale)
    quantized_linears: int = 0


def parse_size(text: str) -> int:
    """``24GiB``, ``500MB``, ``1024`` -> bytes."""
    number = text.strip().lower().rstrip("s")
    unit = "".join(c for c in number if c.isalpha())
    try:
        value = float(number[: len(number) - len(unit)])
    except ValueError:
        value = -1.0
    if unit not in _UNITS or value < 0:
        raise ValueError(f"{text!r} is not a size (write e.g. 24GiB, 500MB)")
    return int(value * _UNITS[unit])


def safetensors_header(path: str | Path) -> dict[str, Any]:
    """The tensor table of a safetensors file: name -> {dtype, shape, data_offsets}."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise ModelLoadError(
                f"{path}: not a safetensors file (shorter than its header)"
            )
        (length,) = struct.unpack("<Q", raw)
        if length > 100 * 2**20:
            raise ModelLoadError(
                f"{path}: not a safetensors file (header length {length})"
            )
        header = json.loads(f.read(length))
    header.pop("__metadata__", None)
    end = max((t["data_offsets"][1] for t in header.values()), default=0)
    if 8 + length + end > os.path.getsize(path):
        raise ModelLoadError(
            f"{path}: truncated ({os.path.getsize(path)} bytes, "
            f"its header needs {8 + length + end}); "
            "fetch it again"
        )
    return header


def file_sha256(path: str | Path, cache_dir: Path | None) -> str:
    """sha256 of a file, remembered by (real path, size, mtime) so a multi-GB checkpoint
    is hashed once."""
    real = Path(path).resolve()
    stat = real.stat()
    key = hashlib.sha256(
        f"{real}|{stat.st_size}|{stat.st_mtime_ns}".encode()
    ).hexdigest()[:32]
    memo = cache_dir / f"{key}.sha256" if cache_dir is not None else None
    if memo is not None and memo.is_file():
        return memo.read_text().strip()
    digest = hashlib.sha256()
    with open(real, "rb") as f:
        for chunk in iter(lambda: f.read(2**22), b""):
            digest.update(chunk)
    value = digest.hexdigest()
    if memo is not None:
        try:
            memo.parent.mkdir(parents=True, exist_ok=True)
            memo.write_text(value)
        except OSError:
            pass  # an unwritable cache only costs the next run a re-hash
    return value


# Per output row of a quantized Linear weight: a float32 scale (and int8's zero point),
# as torchao stores them.
_ROW_BYTES = {"int8": 5, "int8_weight_only": 5, "fp8": 4, "fp8_weight_only": 4}
# 2-D weights that are embedding tables, not Linear layers (never quantized).
_EMBEDDINGS = ("embedding", "embed_tokens", "shared")


def component_report(
    name: str,
    files: list[Path],
    *,
    source: str,
    layout: str,
    stage_dtype: str,
    hash_cache: Path | None,
    prefix: str = "",
    quantization: str = "none",
    ignored_layers: tuple[str, ...] = (),
) -> ComponentReport:
    """Sizes, hashes and parameter counts of ``files`` (only tensors under ``prefix``
    count). With a ``quantization`` method, every 2-D floating ``*.weight`` whose module
    no ``ignored_layers`` pattern names (and that is no embedding table) counts one byte
    per value plus its per-row scale, as ``layers/linear/quantized.py`` stores it: an
    estimate by the file's own module names."""
    from diffserve.layers.linear.quantized import ignored

    report = ComponentReport(
        name=name, source=source, layout=layout, quantization=quantization
    )
    cast = STAGE_DTYPE_BYTES.get(stage_dtype, 4)
    for path in files:
        report.files.append(
            WeightFile(str(path), path.stat().st_size, file_sha256(path, hash_cache))
        )
        for key, tensor in safetensors_header(path).items():
            if not key.startswith(prefix):
                continue
            count = 1
            for dim in tensor["shape"]:
                count *= dim
            report.parameters += count
            report.stored_dtypes[tensor["dtype"]] = (
                report.stored_dtypes.get(tensor["dtype"], 0) + count
            )
            floating = tensor["dtype"] in ("F64", "F32", "F16", "BF16")
            module = key[len(prefix) :].removesuffix(".weight")
            if (
                quantization != "none"
                and floating
                and len(tensor["shape"]) == 2
                and key.endswith(".weight")
                and not module.endswith(_EMBEDDINGS)
                and not ignored(module, ignored_layers)
            ):
                report.device_bytes += (
                    count + tensor["shape"][0] * _ROW_BYTES[quantization]
                )
                report.quantized_linears += 1
                continue
            report.device_bytes += count * (
                cast if floating else _ELEMENT_BYTES.get(tensor["dtype"], 4)
            )
    return report


def folder_weights(folder: Path) -> list[Path]:
    """The safetensors a diffusers component folder loads: its one file, or the shards
    its index lists."""
    indexes = sorted(folder.glob("*.safetensors.index.json"))
    if indexes:
        shards = sorted(
            set(
                json.loads(indexes[0].read_text(encoding="utf-8"))
                .get("weight_map", {})
                .values()
            )
        )
        return [folder / shard for shard in shards]
    return sorted(p for p in folder.glob("*.safetensors") if p.name.count(".") == 1)


def as_dict(report: ComponentReport) -> dict[str, Any]:
    return asdict(report)


def hash_cache_dir(environ: dict[str, str] | None = None) -> Path:
    """Where file digests are remembered: ``$DIFFSERVE_CACHE_DIR/hashes`` (default
    ``~/.cache/diffserve``)."""
    env = os.environ if environ is None else environ
    return (
        Path(env.get("DIFFSERVE_CACHE_DIR") or Path.home() / ".cache" / "diffserve")
        / "hashes"
    )


def weight_files(
    model_dir: str | Path, components: dict[str, str] | None = None
) -> dict[str, list[Path]]:
    """component -> the weight files a load reads: the single file ``components`` names,
    else its folder's."""
    root = Path(model_dir)
    index = json.loads((root / "model_index.json").read_text(encoding="utf-8"))
    chosen = dict(components or {})
    files: dict[str, list[Path]] = {}
    for name, value in sorted(index.items()):
        if name.startswith("_") or not (
            isinstance(value, list) and len(value) == 2 and all(value)
        ):
            continue
        found = [Path(chosen[name])] if name in chosen else folder_weights(root / name)
        if found:
            files[name] = found
    return files


def weights_fingerprint(
    model_dir: str | Path, components: dict[str, str] | None = None
) -> str:
    """A hash of what was loaded: per component, each weight file's name, size and
    sha256 (16 hex digits)."""
    cache = hash_cache_dir()
    rows = [
        f"{name}/{path.name}:{path.stat().st_size}:{file_sha256(path, cache)}"
        for name, paths in weight_files(model_dir, components).items()
        for path in paths
    ]
    return hashlib.sha256("\n".join(rows).encode()).hexdigest()[:16]


def gguf_report(
    name: str, path: Path, *, stage_dtype: str, hash_cache: Path | None
) -> ComponentReport:
    """A GGUF transformer: its packed tensors stay packed on the device
    (layers/linear/gguf.py)."""
    import gguf

    report = ComponentReport(name=name, source="single file", layout="gguf")
    report.files.append(
        WeightFile(str(path), path.stat().st_size, file_sha256(path, hash_cache))
    )
    cast = STAGE_DTYPE_BYTES.get(stage_dtype, 4)
    for tensor in gguf.GGUFReader(str(path)).tensors:
        count = int(tensor.n_elements)
        kind = tensor.tensor_type.name
        report.parameters += count
        report.stored_dtypes[kind] = report.stored_dtypes.get(kind, 0) + count
        # Models/gguf_file.py keeps these as the file has them.
        packed = len(tensor.shape) == 2 and kind != "F32"
        report.device_bytes += int(tensor.n_bytes) if packed else count * cast
    return report
