"""``diffserve models inspect MODEL [--transformer FILE] [--vae FILE] [deploy flags]
[--device-memory 24GiB] [--json]``: what a deployment would load, without loading it
(models/inspect.py).

Exit status: 0, or 3 when ``--device-memory`` is given and the components do not fit in
it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

DOES_NOT_FIT = 3


def register(subparsers: argparse._SubParsersAction) -> None:
    from diffserve.config.cli_args import add_config_arguments

    parser = subparsers.add_parser(
        "models",
        help="inspect what a model deployment would load",
        description="What a deployment would load, without loading it.",
    )
    actions = parser.add_subparsers(
        dest="models_action", metavar="ACTION", required=True
    )
    inspect = actions.add_parser(
        "inspect",
        help="files, hashes, layouts, parameters and device bytes per component",
    )
    inspect.add_argument(
        "model", metavar="MODEL", help="model directory or hub id org/name[@revision]"
    )
    inspect.add_argument(
        "--device-memory",
        default=None,
        metavar="SIZE",
        help="say whether the components fit in this much device "
        "memory (e.g. 24GiB); exit 3 if not",
    )
    inspect.add_argument(
        "--json", action="store_true", help="print machine-readable JSON"
    )
    add_config_arguments(inspect)
    parser.set_defaults(func=run)


def inspect_deployment(args: argparse.Namespace) -> dict[str, Any]:
    from diffserve.config.cli_args import config_kwargs_from_args
    from diffserve.config.resolve import resolve
    from diffserve.errors import ConfigError
    from diffserve.models import inspect as weights
    from diffserve.models.dtype import resolve_dtype
    from diffserve.models.single_file_layout import component_layout
    from diffserve.registry.models import MODEL_FAMILIES

    config = resolve(model=args.model, **config_kwargs_from_args(args))
    assert config.model is not None
    stage = config.stage_for_role("diffusion")
    import torch

    dtype = str(resolve_dtype(stage.dtype, torch.device("cpu"))).removeprefix("torch.")
    root = Path(config.model)
    index = json.loads((root / "model_index.json").read_text(encoding="utf-8"))
    hash_cache = weights.hash_cache_dir()
    components = []
    denoiser = (
        MODEL_FAMILIES[config.model_family].denoiser
        if config.model_family
        else "transformer"
    )

    def quantized(component: str) -> dict[str, Any]:
        """The stage's quantization of ``component`` (the denoiser's ignore list; text
        encoders: all)."""
        if component == denoiser:
            return {
                "quantization": stage.quantization,
                "ignored_layers": stage.quantization_ignored_layers,
            }
        if component.startswith("text_encoder"):
            return {"quantization": stage.text_encoder_quantization}
        return {}

    for name, value in index.items():
        if name.startswith("_") or not (
            isinstance(value, list) and len(value) == 2 and all(value)
        ):
            continue
        single = stage.components.get(name)
        if single is not None and single.endswith(".gguf"):
            report = weights.gguf_report(
                name, Path(single), stage_dtype=dtype, hash_cache=hash_cache
            )
        elif single is not None:
            layout, prefix = component_layout(
                name, list(weights.safetensors_header(single)), single
            )
            report = weights.component_report(
                name,
                [Path(single)],
                source="single file",
                layout=layout,
                stage_dtype=dtype,
                hash_cache=hash_cache,
                prefix=prefix,
                **quantized(name),
            )
        else:
            files = weights.folder_weights(root / name)
            if not files:
                continue  # tokenizers and the scheduler hold no weights
            report = weights.component_report(
                name,
                files,
                source="folder",
                layout="diffusers",
                stage_dtype=dtype,
                hash_cache=hash_cache,
                **quantized(name),
            )
        components.append(weights.as_dict(report))
    total = sum(c["device_bytes"] for c in components)
    doc: dict[str, Any] = {
        "model": config.model,
        "model_source": config.model_source.describe() if config.model_source else None,
        "dtype": dtype,
        "components": components,
        "device_bytes": total,
    }
    if args.device_memory is not None:
        try:
            budget = weights.parse_size(args.device_memory)
        except ValueError as exc:
            raise ConfigError(
                str(exc), path="--device-memory", source="cli", hint="e.g. 24GiB"
            ) from None
        doc.update(device_memory=budget, fits=total <= budget)
    return doc


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def run(args: argparse.Namespace) -> int:
    doc = inspect_deployment(args)
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        source = doc["model_source"] or {}
        hub = (
            f"  (hub {source['repo_id']}@{source['revision']}, commit "
            f"{source['commit']})"
            if source.get("repo_id")
            else ""
        )
        print(f"model: {doc['model']}{hub}\ndtype on the device: {doc['dtype']}")
        print(
            f"{'component':<16}{'source':<13}{'layout':<11}{'parameters':>12} "
            f" {'on device':>11}  "
            f"{'quantized':<17}files"
        )
        for c in doc["components"]:
            files = ", ".join(
                f"{Path(f['path']).name} ({_size(f['bytes'])}, sha256 "
                f"{f['sha256'][:12]})"
                for f in c["files"]
            )
            quant = (
                f"{c['quantization']} x{c['quantized_linears']}"
                if c["quantization"] != "none"
                else "-"
            )
            print(
                f"{c['name']:<16}{c['source']:<13}{c['layout']:<11}"
                f"{c['parameters']:>12,}  "
                f"{_size(c['device_bytes']):>11}  {quant:<17}{files}"
            )
        print(f"total on the device: {_size(doc['device_bytes'])}")
        if "fits" in doc:
            verdict = "fits" if doc["fits"] else "does NOT fit"
            print(f"device memory {_size(doc['device_memory'])}: {verdict}")
    return DOES_NOT_FIT if doc.get("fits") is False else 0
