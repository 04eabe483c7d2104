"""What a generic family's registry entry adds around diffusers' call of its pipeline
(``GenericPath``): a guider that holds the guidance scale and an attribute that holds
the text window (HunyuanVideo-1.5), the scheduler's step as the step hook where
``__call__`` has no callback, a VAE that decodes one sample at a time, the prefix KV
cache counted (Qwen-Image-2.1) and the text encodings through the conditioning cache.
One object, so the pipeline's batch loop stays the same for every family."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from diffserve.models.generic.prefix_cache import PrefixKvCounter
from diffserve.models.generic.step_hooks import SchedulerStepHook
from diffserve.models.generic.text_cache import CachedPromptEncoder
from diffserve.registry.family import ModelFamily
from diffserve.types.attestation import Attestation
from diffserve.types.request import GenerationRequest

STEP_CALLBACKS = frozenset({"callback_on_step_end", "callback"})


class PipelineExtras:
    def __init__(
        self,
        pipe: Any,
        family: ModelFamily,
        call_params: frozenset[str],
        text_cache: CachedPromptEncoder | None = None,
    ) -> None:
        generic = family.generic
        self.pipe = pipe
        self.guider = generic.guider
        # Pipelines with a step callback get it in their call (call_args.py).
        self.step_hook = (
            None if STEP_CALLBACKS & call_params else SchedulerStepHook(pipe)
        )
        if generic.vae_slicing:
            pipe.vae.enable_slicing()
        self.prefix = (
            PrefixKvCounter(getattr(pipe, family.denoiser), generic.prefix_kv_cache)
            if generic.prefix_kv_cache
            else None
        )
        self.text_cache = text_cache
        self.text_window = generic.text_window_attribute

    def call(
        self,
        batch: list[GenerationRequest],
        kwargs: dict[str, Any],
        on_step: Callable[..., Any],
    ) -> Any:
        """diffusers' pipeline called with ``kwargs`` for ``batch``."""
        scale = batch[0].guidance_scale
        if self.guider and scale is not None:
            # The guider is a component: the batch's own scale, set on the compute
            # thread that runs every batch. A scale of 1 or less is no CFG, as on every
            # other family (diffusers' guider turns CFG off at exactly 1.0 only: at 0 it
            # would run both branches and return the unconditional one).
            self.pipe.guider = self.pipe.guider.new(guidance_scale=max(1.0, scale))
        window = batch[0].max_sequence_length
        if self.text_window is not None and window:
            setattr(self.pipe, self.text_window, window)
        if self.text_cache is not None:
            self.text_cache.start([r for r in batch for _ in range(r.n)])
        if self.prefix is not None:
            self.prefix.start()
        if self.step_hook is not None:
            return self.step_hook.run(on_step, lambda: self.pipe(**kwargs))
        return self.pipe(**kwargs)

    def attest(self, request: GenerationRequest) -> Attestation:
        """The request's entries: ``prefix_kv_cache`` (the batch's forwards) and its
        ``conditioning_cache``."""
        attestation = Attestation()
        if self.prefix is not None:
            attestation["prefix_kv_cache"] = self.prefix.attest()
        if self.text_cache is not None:
            attestation.update(self.text_cache.attest(request.request_id))
        return attestation
