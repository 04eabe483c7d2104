"""What made one output: the ``diffserve.generation`` assertion of its manifest.

Only facts that a request fixes go in: two identical requests must give byte-identical
files (Ed25519 signatures are deterministic), so nothing from the clock, the request id,
the worker's pid, the batch it joined or the caches it hit. The kernels are the backend
names the attestation counted, not the counts (a conditioning-cache hit skips the text
encoders' calls; a batch shares its counters).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# The attestation's per-call counters whose backend names are "the kernels attested".
KERNEL_KINDS = ("linear", "attention")


@dataclass(frozen=True)
class Generation:
    """One output's facts; ``prompt`` and ``negative_prompt`` are only ever stored as
    their sha256 (a manifest travels with the file, the prompt may be private)."""

    model: str
    config_fingerprint: str
    seed: int
    prompt: str
    weights_fingerprint: str = ""
    negative_prompt: str | None = None
    revised_prompt: str | None = None
    steps: int = 0
    guidance_scale: float | None = None
    edit: bool = False
    kernels: dict[str, list[str]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def assertion(self, output: Mapping[str, Any]) -> dict[str, Any]:
        """The assertion's data; ``output`` describes the file (kind, format, size)."""
        data: dict[str, Any] = {
            "model": self.model,
            "weights_fingerprint": self.weights_fingerprint,
            "config_fingerprint": self.config_fingerprint,
            "seed": self.seed,
            "prompt_sha256": sha256_text(self.prompt),
            "steps": self.steps,
            "kernels": self.kernels,
            "output": dict(output),
            **self.extra,
        }
        if self.guidance_scale is not None:
            data["guidance_scale"] = self.guidance_scale
        if self.negative_prompt:
            data["negative_prompt_sha256"] = sha256_text(self.negative_prompt)
        if self.revised_prompt is not None:
            # The AR stage's rewrite is shown whole: it is what the model drew.
            data["revised_prompt"] = self.revised_prompt
        return data


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def from_output(
    output: Any,
    *,
    model: str,
    prompt: str,
    seed: int,
    negative_prompt: str | None = None,
    edit: bool = False,
) -> Generation:
    """The facts of one image or video of a ``RequestOutput``."""
    attestation: Mapping[str, Any] = output.attestation or {}
    extra: dict[str, Any] = {}
    source = attestation.get("model_source")
    if source:
        extra["model_source"] = dict(source)
    lora = attestation.get("lora")
    if lora:
        extra["lora"] = lora.get("adapters", [])
    quantization = attestation.get("quantization")
    if quantization:
        extra["quantization"] = {
            name: report.get("method", "") for name, report in quantization.items()
        }
    return Generation(
        model=model,
        config_fingerprint=output.config_fingerprint,
        seed=int(seed),
        prompt=prompt,
        weights_fingerprint=str(attestation.get("weights_fingerprint", "")),
        negative_prompt=negative_prompt,
        revised_prompt=output.revised_prompt,
        steps=int(output.num_inference_steps or 0),
        guidance_scale=output.guidance_scale,
        edit=edit,
        kernels=kernels_of(attestation),
        extra=extra,
    )


def kernels_of(attestation: Mapping[str, Any]) -> dict[str, list[str]]:
    """The backends each kind of kernel ran on (names with at least one call)."""
    found = {}
    for kind in KERNEL_KINDS:
        counts = attestation.get(kind)
        if isinstance(counts, Mapping):
            names = sorted(name for name, calls in counts.items() if calls)
            if names:
                found[kind] = names
    return found
