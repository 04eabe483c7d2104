"""The native FLUX transformer (reference shape: embed, double blocks, single blocks,
final layer)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from diffserve.errors import ModelLoadError
from diffserve.layers.kernels import KernelSet
from diffserve.layers.linear.gguf import QuantizedWeight, install
from diffserve.layers.linear.module import Linear
from diffserve.layers.traced_tally import CountedCompiler, compile_counted
from diffserve.layers.ulysses import UlyssesAttention
from diffserve.logging import get_logger
from diffserve.models.flux.blocks import (
    DoubleStreamBlock,
    LastLayer,
    SingleStreamBlock,
    modulate,
)
from diffserve.models.flux.checkpoint_layouts import file_key_names, native_state_dict
from diffserve.models.flux.embeddings import MLPEmbedder, rope, timestep_embedding
from diffserve.models.flux.params import FluxParams
from diffserve.models.flux.weights import convert_diffusers_state_dict
from diffserve.models.gguf_file import read_gguf
from diffserve.models.loader import (
    load_strict,
    read_checkpoint,
    read_config,
    read_safetensors,
)

if TYPE_CHECKING:  # pragma: no cover
    from diffserve.models.lora_adapters import LoraAdapters

logger = get_logger(__name__)


class FluxTransformer(nn.Module):
    """Flow-matching transformer on packed 2x2 latent patches, built from
    ``diffserve.layers``."""

    def __init__(self, params: FluxParams, kernels: KernelSet) -> None:
        super().__init__()
        self.params = params
        self.kernels = kernels
        self.counters = kernels.counters
        h = params.hidden_size
        self.img_in = kernels.make_linear(params.in_channels, h)
        self.time_in = MLPEmbedder(256, h, kernels)
        self.vector_in = MLPEmbedder(params.vec_in_dim, h, kernels)
        self.guidance_in = (
            MLPEmbedder(256, h, kernels) if params.guidance_embed else None
        )
        self.txt_in = kernels.make_linear(params.context_in_dim, h)
        self.double_blocks = nn.ModuleList(
            DoubleStreamBlock(
                h, params.num_heads, params.mlp_ratio, params.qkv_bias, kernels
            )
            for _ in range(params.depth)
        )
        self.single_blocks = nn.ModuleList(
            SingleStreamBlock(h, params.num_heads, params.mlp_ratio, kernels)
            for _ in range(params.depth_single_blocks)
        )
        self.final_layer = LastLayer(h, params.out_channels, kernels)
        # Set by compile_blocks(): each block's compiler, which counts the block's
        # calls from its traced graph (layers/traced_tally.py).
        self.compilers: list[CountedCompiler] = []
        # The per-request LoRA adapters of this transformer (set by the pipeline that
        # loads them).
        self.lora_adapters: LoraAdapters | None = None

    def rope(self, txt_ids: Tensor, img_ids: Tensor) -> Tensor:
        """Rotation table for the joint (text then image) sequence; compute once per
        request."""
        return rope(
            torch.cat((txt_ids, img_ids), dim=0),
            self.params.axes_dim,
            self.params.theta,
        )

    def forward(
        self,
        img: Tensor,
        img_ids: Tensor | None,
        txt: Tensor,
        txt_ids: Tensor | None,
        timesteps: Tensor,
        y: Tensor,
        guidance: Tensor | None = None,
        pe: Tensor | None = None,
    ) -> Tensor:
        """``img`` [B, L_img, in_channels], ``txt`` [B, L_txt, context_in_dim],
        ``timesteps`` [B] in [0, 1], ``y`` [B, vec_in_dim]; ``pe`` from ``rope()`` (else
        built from the ids). Returns the velocity."""
        if img.ndim != 3 or txt.ndim != 3:
            raise ValueError(
                f"img and txt must be [B, L, C], got {tuple(img.shape)} "
                f"and {tuple(txt.shape)}"
            )
        self.counters.count_forward()
        if pe is None:
            if txt_ids is None or img_ids is None:
                raise ValueError("forward needs pe, or txt_ids and img_ids to build it")
            pe = self.rope(txt_ids, img_ids)

        img, txt, vec = self.embed(img, txt, timesteps, y, guidance)
        return self.head(self.blocks(img, txt, vec, pe), vec)

    # The pieces of ``forward``, in its order: the step cache
    # (models/flux/step_cache.py) runs them apart and must stay bit-identical to the
    # fused call when it computes every block.
    def embed(
        self,
        img: Tensor,
        txt: Tensor,
        timesteps: Tensor,
        y: Tensor,
        guidance: Tensor | None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Token embeddings of the image and text streams and the modulation vector
        ``vec``."""
        # timesteps are scaled in the model dtype, as the reference and diffusers do
        img = self.img_in(img)
        vec = self.time_in(
            timestep_embedding(timesteps.to(img.dtype) * 1000, 256).to(img.dtype)
        )
        if self.guidance_in is not None:
            if guidance is None:
                raise ValueError(
                    "this model is guidance-distilled and needs a guidance value"
                )
            vec = vec + self.guidance_in(
                timestep_embedding(guidance.to(img.dtype) * 1000, 256).to(img.dtype)
            )
        vec = vec + self.vector_in(y)
        return img, self.txt_in(txt), vec

    def first_block(
        self, img: Tensor, txt: Tensor, vec: Tensor, pe: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Double block 0 alone (First-Block Cache's probe); ``blocks(..., start=1)``
        continues from it."""
        self._count_lora(self.double_blocks[0])
        return self.double_blocks[0](img, txt, vec, pe)

    def modulated_input(self, img: Tensor, vec: Tensor) -> Tensor:
        """Block 0's timestep-modulated image input (TeaCache's probe; block 0
        recomputes it if it runs)."""
        block = self.double_blocks[0]
        assert isinstance(block, DoubleStreamBlock)
        mod, _ = block.img_mod(vec)
        return modulate(img, mod)

    def blocks(
        self, img: Tensor, txt: Tensor, vec: Tensor, pe: Tensor, start: int = 0
    ) -> Tensor:
        """Double blocks from ``start``, then every single block; returns the image
        tokens."""
        for block in self.double_blocks[start:]:
            self._count_lora(block)
            img, txt = block(img, txt, vec, pe)

        x = torch.cat((txt, img), dim=1)
        for block in self.single_blocks:
            self._count_lora(block)
            x = block(x, vec, pe, txt.shape[1])
        return x[:, txt.shape[1] :]

    def head(self, img: Tensor, vec: Tensor) -> Tensor:
        """The final modulated projection to the velocity."""
        return self.final_layer(img, vec)

    def _count_lora(self, block: nn.Module) -> None:
        """A compiled block's LoRA deltas (its modules cannot count them)."""
        adapters = self.lora_adapters
        if self.compilers and adapters is not None and adapters.state.active:
            self.counters.count_lora(adapters.patched_in(block))

    def shard_sequence(self, group: Any, counters: Any) -> None:
        """Ulysses sequence parallelism over ``group``: from now on ``forward`` takes
        this rank's image shard (and the matching rows of ``pe``) and every block's
        attention exchanges heads for tokens (``layers/ulysses.py``); the wrapped
        Attention still counts its call. Call before compiling."""
        for block in (*self.double_blocks, *self.single_blocks):
            block.attn = UlyssesAttention(block.attn, group, counters)

    def fuse_single_blocks(self) -> None:
        """Every single block's merged first projection and split output projection
        (``SingleStreamBlock.fuse_projections``); before quantizing or compiling."""
        for block in self.single_blocks:
            assert isinstance(block, SingleStreamBlock)
            block.fuse_projections()

    def compile_blocks(self, mode: str | None = None, dynamic: bool = True) -> None:
        """``torch.compile`` every block as one graph each (a graph break fails),
        lazily: the first forward pays the compile cost. Each block counts its calls
        from what was traced (``layers/traced_tally.py``). ``mode``: inductor's
        (``max-autotune-no-cudagraphs`` on GPUs); ``dynamic``: one graph for every
        sequence length, else one per shape (what autotuning wants)."""
        self.compilers = compile_counted(
            [*self.double_blocks, *self.single_blocks],
            self.counters,
            mode=mode,
            dynamic=dynamic,
        )
        logger.info(
            "transformer blocks will be compiled on first use (mode %s, %s shapes)",
            mode or "default",
            "dynamic" if dynamic else "static",
        )

    def traced_ops(self) -> dict[str, int]:
        """The kernel operators the compiled blocks captured, summed over the graphs
        traced so far (empty: eager)."""
        ops: dict[str, int] = {}
        for compiler in self.compilers:
            for tally in compiler.tallies:
                for name, calls in tally.ops.items():
                    ops[name] = ops.get(name, 0) + calls
        return ops


def load_flux_transformer(
    transformer_dir: str | Path,
    kernels: KernelSet,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    weights_file: str | None = None,
) -> FluxTransformer:
    """Build the native transformer for a diffusers-format ``transformer/`` directory on
    ``kernels`` (the stage's backends, see ``layers.kernels.build_kernel_set``) and load
    its weights: the directory's, or those of ``weights_file`` (one file in the
    diffusers, BFL or ComfyUI layout; the config stays the folder's)."""
    params = FluxParams.from_diffusers_config(read_config(transformer_dir))
    if weights_file is None:
        source, layout = str(transformer_dir), "diffusers"
        state_dict = convert_diffusers_state_dict(
            read_safetensors(transformer_dir), params, source
        )
    else:
        source = weights_file
        tensors = (
            read_gguf(weights_file)
            if weights_file.endswith(".gguf")
            else read_checkpoint(weights_file)
        )
        state_dict, layout = native_state_dict(tensors, params, weights_file)
    # Built on the meta device: no memory is touched until the real weights are
    # assigned.
    with torch.device("meta"):
        model = FluxTransformer(params, kernels)
    install_packed(model, state_dict, dtype=dtype, device=device, source=source)
    load_strict(
        model,
        state_dict,
        dtype=dtype,
        device=device,
        source=source,
        file_key=file_key_names(layout, params),
    )
    logger.info(
        "loaded FLUX transformer from %s (%s layout; %d double, "
        "%d single blocks) with kernels %s",
        source,
        layout,
        params.depth,
        params.depth_single_blocks,
        kernels.describe(),
    )
    return model.eval().requires_grad_(False)


def install_packed(
    model: nn.Module,
    state_dict: dict[str, Any],
    *,
    dtype: torch.dtype,
    device: torch.device | str,
    source: str,
) -> None:
    """Move the packed GGUF weights of ``state_dict`` into their ``Linear`` layers
    (which then dequantize per call, counted as ``gguf_<type>``); the dense rest stays
    for ``load_strict``."""
    for key in [k for k, v in state_dict.items() if isinstance(v, QuantizedWeight)]:
        layer = (
            model.get_submodule(key.removesuffix(".weight"))
            if key.endswith(".weight")
            else None
        )
        if not isinstance(layer, Linear):
            raise ModelLoadError(
                f"{source}: {key} is block-quantized but is not a Linear layer's weight"
            )
        try:
            install(layer, state_dict.pop(key).to(device=device, dtype=dtype))
        except ValueError as exc:
            raise ModelLoadError(
                f"{source}: {key}: {exc} (a checkpoint of another model size?)"
            ) from None
