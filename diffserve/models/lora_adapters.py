"""A model's per-request LoRA adapters: registered at start, kept in memory up to
``max_loras`` (LRU), combined per batch with the batch's scales
(``layers/linear/lora.py`` applies them inside ``Linear``, unmerged).

The family supplies the file reader (a ``LoraReader``): native FLUX maps diffusers'
module names onto its fused layers (``models/flux/lora_file.py``); the generic path
reads them as they are, its denoiser being diffusers' own (``models/generic/lora.py``).
Admission has already checked a request's adapters, so this only loads.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch
from torch import Tensor

from diffserve.config.schema import StageConfig
from diffserve.errors import ConfigError, LoraError, RequestError
from diffserve.layers.linear import lora
from diffserve.layers.linear.module import Linear
from diffserve.types.attestation import LoraAdapterEntry, LoraReport


@dataclass(frozen=True)
class LoraAdapter:
    """One adapter, ready for the slots: layer name -> (A ``[rank, in]``, B ``[out,
    rank]``, scaling folded in)."""

    name: str
    path: str
    layers: Mapping[str, tuple[Tensor, Tensor]]

    @property
    def rank(self) -> int:
        """The widest layer's rank (the slots must be at least this wide)."""
        return max(a.shape[0] for a, _ in self.layers.values())


# (path, (out, in) of every Linear by name, adapter name, max rank, dtype) -> the
# adapter's factors per layer
LoraReader = Callable[
    [str, dict[str, tuple[int, int]], str, int, torch.dtype], LoraAdapter
]
# A request's adapters, ``(name, scale)`` in canonical order; ``()``: the base model.
AdapterSet = tuple[tuple[str, float], ...]
# Combined factors of adapter sets kept for per-row batches (each as large as its
# adapters, on the stage's device): enough for the sets of a few batches in turn.
SET_CACHE_SIZE = 8


class LoraAdapters:
    """The adapters of one transformer: ``max_loras`` of them kept in memory (least
    recently used evicted), and the batch's combination installed on the layers they
    target (``activate``), or one combination per row (``activate_rows``)."""

    def __init__(
        self, transformer: torch.nn.Module, stage: StageConfig, reader: LoraReader
    ) -> None:
        weight = next(transformer.parameters())
        self.state = lora.LoraState()
        self.dtype = weight.dtype
        self.reader = reader
        self.linears = {
            name: m for name, m in transformer.named_modules() if isinstance(m, Linear)
        }
        self.shapes = {
            name: (m.out_features, m.in_features) for name, m in self.linears.items()
        }
        self.registered = dict(stage.lora_modules)
        self.max_rank = stage.max_lora_rank
        self.capacity = stage.max_loras
        self.lora_dir = stage.lora_dir
        # Layers that carry factors (a zero pair when a batch skips them)
        self.patched: set[str] = set()
        # Least recently used first.
        self.resident: OrderedDict[str, LoraAdapter] = OrderedDict()
        # Per-row batches: each adapter set's combined factors as its layers run them
        # (least recently used first).
        self.combined: OrderedDict[AdapterSet, dict[str, lora.LoraPair]] = OrderedDict()
        # What the layers hold now, so that the runner may ask before every step and
        # the same rows install nothing: the set ``activate`` installed (``None``:
        # none active), or the per-row slots (sets in slot order; they stay on the
        # layers through ``deactivate``, until ``activate`` replaces them).
        self.installed_set: AdapterSet | None = None
        self.installed_slots: tuple[AdapterSet, ...] | None = None
        # A compiled stage gets per-row batches in the stacked form, which its graphs
        # do not specialize on (``layers/linear/lora.py``).
        self.stacked = not stage.enforce_eager
        # The stage's device (where the layers keep their factors).
        self.device = next(
            (m.backend.device for m in self.linears.values()), weight.device
        )
        # Registered adapters are checked now, so a bad file fails the start, not a
        # request.
        for name, path in self.registered.items():
            try:
                adapter = self._read(name, path)
            except LoraError as exc:
                raise ConfigError(
                    str(exc), path=f"lora_modules.{name}", hint=exc.hint
                ) from None
            if len(self.resident) < self.capacity:
                self.resident[name] = adapter

    @torch.inference_mode()
    def activate(self, loras: tuple[tuple[str, float], ...]) -> None:
        """Install the batch's adapters (``(name, scale)`` in canonical order) on the
        layers they target."""
        if not loras:
            self.deactivate()
            return
        self.installed_set, self.installed_slots = None, None
        adapters = [(self._adapter(name), scale) for name, scale in loras]
        targets = set().union(*(adapter.layers for adapter, _ in adapters))
        for name in sorted(targets | self.patched):
            self.linears[name].set_lora(self.state, *_combine(adapters, name))
        self.patched |= targets
        self.state.set_rows(None)
        self.state.adapters = loras
        self.state.active = True
        self.installed_set = loras

    @torch.inference_mode()
    def activate_rows(self, row_sets: Sequence[AdapterSet]) -> None:
        """Install one adapter set per row of the next forwards (dim 0 of every
        Linear's input; ``()``: the base model for that row). All rows alike: exactly
        ``activate(that set)``. Otherwise each distinct set's combined factors are
        built as ``activate`` builds them for that set alone, so a row's delta comes
        from the same tensors as its request's alone. Nothing is rebuilt or installed
        again while the layers hold what is asked (equal ``row_sets``; or the same
        sets with rows added or reordered: only the row layout changes)."""
        key = tuple(row_sets)
        if not key:
            raise ValueError("activate_rows needs one adapter set per row (no rows)")
        sets = list(dict.fromkeys(key))
        if len(sets) == 1:
            if sets[0] != self.installed_set or not sets[0]:
                self.activate(sets[0])
            return
        # Sorted: the slots do not depend on the rows' order.
        slots = tuple(sorted(s for s in sets if s))
        if slots != self.installed_slots:
            self._install_slots(slots)
        index = {s: slot for slot, s in enumerate(slots)}
        rows = tuple(index.get(s, lora.BASE_ROW) for s in key)
        self.installed_set = None
        if self.state.active and self.state.rows == rows:
            return
        # Stacked slot 0 is the base model's zero pair.
        row_index = (
            torch.tensor([r + 1 for r in rows], device=self.device)
            if self.stacked
            else None
        )
        self.state.set_rows(rows, row_index)
        # Attested per request (``describe``), not per batch.
        self.state.adapters = ()
        self.state.active = True

    def _install_slots(self, slots: tuple[AdapterSet, ...]) -> None:
        """Each set's pair (a zero pair where it does not target a patched layer) on
        every patched layer, in slot order."""
        built = [self._combined(s) for s in slots]
        targets = set().union(*built)
        for name in sorted(targets | self.patched):
            layer = self.linears[name]
            pairs = tuple(factors.get(name) for factors in built)
            if self.stacked:
                layer.set_lora_stacked(self.state, pairs)
            else:
                layer.set_lora_rows(self.state, pairs)
        self.patched |= targets
        self.installed_slots = slots

    def deactivate(self) -> None:
        self.state.active = False
        self.state.adapters = ()
        self.state.set_rows(None)
        self.installed_set = None

    def _combined(self, loras: AdapterSet) -> dict[str, lora.LoraPair]:
        """``loras``' combined factors per layer it targets, converted as the layers
        run them (cached per set)."""
        if loras in self.combined:
            self.combined.move_to_end(loras)
            for name, _ in loras:  # used: as recent as when read
                self.resident.move_to_end(name)
            return self.combined[loras]
        adapters = [(self._adapter(name), scale) for name, scale in loras]
        targets = set().union(*(adapter.layers for adapter, _ in adapters))
        factors = {
            name: self.linears[name].lora_factors(*_combine(adapters, name))
            for name in sorted(targets)
        }
        # Kept only while all its adapters are resident (their eviction drops it).
        if all(name in self.resident for name, _ in loras):
            self.combined[loras] = factors
            while len(self.combined) > SET_CACHE_SIZE:
                self.combined.popitem(last=False)
        return factors

    def _forget(self, name: str) -> None:
        """Drop the cached combinations that use adapter ``name`` (evicted or read
        again)."""
        for loras in [s for s in self.combined if any(n == name for n, _ in s)]:
            del self.combined[loras]

    def _adapter(self, name: str) -> LoraAdapter:
        if name in self.resident:
            self.resident.move_to_end(name)
            return self.resident[name]
        try:
            adapter = self._read(name, self.registered.get(name, name))
        except LoraError as exc:  # changed on disk since admission
            raise RequestError(str(exc), param="loras") from None
        self._forget(name)
        if len(self.resident) >= self.capacity:
            self._forget(self.resident.popitem(last=False)[0])
        self.resident[name] = adapter
        return adapter

    def _read(self, name: str, path: str) -> LoraAdapter:
        return self.reader(path, self.shapes, name, self.max_rank, self.dtype)

    def describe(self, loras: tuple[tuple[str, float], ...]) -> LoraReport:
        """The attestation's ``lora`` entry: adapters (paths relative to lora_dir) and
        scales applied."""

        def shown(name: str) -> str:
            return (
                os.path.relpath(name, self.lora_dir)
                if self.lora_dir and os.path.isabs(name)
                else name
            )

        return LoraReport(
            adapters=[LoraAdapterEntry(name=shown(n), scale=s) for n, s in loras]
        )

    def patched_in(self, block: torch.nn.Module) -> int:
        """Linear layers of ``block`` that add a delta while adapters are active
        (compiled blocks' tally)."""
        return sum(
            1
            for m in block.modules()
            if isinstance(m, Linear) and m.lora_state is not None
        )


def _combine(
    adapters: list[tuple[LoraAdapter, float]], name: str
) -> tuple[Tensor | None, Tensor | None]:
    """Layer ``name``'s pair for ``adapters`` (each ``A`` stacked, each ``B`` times its
    scale side by side, in the set's order); ``None``s: none of them targets it."""
    parts = [
        (adapter.layers[name], scale)
        for adapter, scale in adapters
        if name in adapter.layers
    ]
    if not parts:
        return None, None
    a = torch.cat([a for (a, _), _ in parts])
    b = torch.cat([b * scale for (_, b), scale in parts], dim=1)
    return a, b


def read_lora_tensors(path: Path) -> tuple[dict[str, Tensor], dict[str, str]]:
    """A LoRA file's tensors and metadata (a directory: diffusers'
    ``pytorch_lora_weights.safetensors`` in it)."""
    from safetensors import SafetensorError, safe_open

    if path.is_dir():  # a directory as diffusers writes it
        path = path / "pytorch_lora_weights.safetensors"
    if not path.is_file():
        raise LoraError(
            f"{path}: no such file",
            hint="check the path (the file must exist on the server)",
        )
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            return {k: handle.get_tensor(k) for k in handle.keys()}, metadata  # noqa: SIM118
    except (SafetensorError, OSError, ValueError) as exc:
        raise LoraError(
            f"{path}: not a safetensors file ({exc})",
            hint="LoRA files must be .safetensors (pickles are never loaded)",
        ) from None


def peft_scaling(metadata: Mapping[str, str]) -> float | None:
    """``lora_alpha / r`` from diffusers' ``lora_adapter_metadata`` (transformer entry),
    if the file has it."""
    try:
        config = json.loads(metadata.get("lora_adapter_metadata", "{}"))
    except ValueError:
        return None
    config = config.get("transformer", config) if isinstance(config, dict) else {}
    alpha, rank = config.get("lora_alpha"), config.get("r")
    return float(alpha) / float(rank) if alpha and rank else None


# (path, model directory, max rank): raises LoraError unless the file's adapter fits the
# model
LoraFileCheck = Callable[[str, str, int], None]


def check_adapters(
    loras: tuple[tuple[str, float], ...],
    stage: StageConfig,
    model_dir: str | Path,
    check_file: LoraFileCheck,
) -> tuple[tuple[str, float], ...]:
    """Admission's check of a request's adapters against the deployment: known names,
    files only inside ``lora_dir`` that fit this model (``check_file``, once per file
    and modification time), scales within ``max_lora_scale``, at most ``max_loras``.
    Returns them in canonical form (registered names as is, paths absolute; sorted), or
    raises ``RequestError(param="loras")``."""
    if len(loras) > stage.max_loras:
        raise RequestError(
            f"{len(loras)} adapters in one request; this deployment combines at most "
            f"{stage.max_loras} (max_loras)",
            param="loras",
        )
    registered = stage.lora_modules
    out = []
    for name, scale in loras:
        if abs(scale) > stage.max_lora_scale:
            raise RequestError(
                f"loras scale {scale} of {name!r} is outside +-{stage.max_lora_scale} "
                "(max_lora_scale)",
                param="loras",
            )
        out.append(
            (
                name
                if name in registered
                else _allowed_path(name, stage, registered, model_dir, check_file),
                scale,
            )
        )
    return tuple(sorted(out))


def _allowed_path(
    name: str,
    stage: StageConfig,
    registered: Mapping[str, str],
    model_dir: str | Path,
    check_file: LoraFileCheck,
) -> str:
    known = ", ".join(sorted(registered)) or "none"
    if not stage.lora_dir:
        raise RequestError(
            f"unknown LoRA adapter {name!r} (registered: {known}; "
            "loading by path is off: no "
            "lora_dir)",
            param="loras",
        )
    root = os.path.realpath(stage.lora_dir)
    path = os.path.realpath(os.path.join(root, name))
    if os.path.commonpath([root, path]) != root:
        raise RequestError(
            f"LoRA path {name!r} is outside the allowed directory (lora_dir)",
            param="loras",
        )
    try:
        _checked(
            check_file,
            path,
            os.path.getmtime(path),
            str(model_dir),
            stage.max_lora_rank,
        )
    except (OSError, LoraError) as exc:
        raise RequestError(
            f"LoRA {name!r}: {exc}"
            if isinstance(exc, LoraError)
            else f"unknown LoRA adapter {name!r} (registered: {known}; "
            "no such file in lora_dir)",
            param="loras",
        ) from None
    return path


@lru_cache(maxsize=64)
def _checked(
    check_file: LoraFileCheck, path: str, mtime: float, model_dir: str, max_rank: int
) -> None:
    """Each file is read once per (path, mtime) and model."""
    check_file(path, model_dir, max_rank)
