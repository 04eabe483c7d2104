"""The Qwen-Image families (MMDiT denoisers conditioned by a Qwen vision-language
encoder), served on the generic path: Qwen-Image, its Edit and Edit-Plus twins, and
Qwen-Image-2.1."""

from __future__ import annotations

from dataclasses import replace

from diffserve.registry.family import (
    GENERIC_LORA_CHECK,
    GENERIC_PIPELINE,
    MMDIT_ROLES,
    FamilyDefaults,
    Features,
    GenericPath,
    ModelFamily,
)

QWEN_IMAGE_FAMILIES: tuple[ModelFamily, ...] = (
    # Qwen-Image (MMDiT, a Qwen2.5-VL text encoder): every block's joint text-image
    # attention, masked where a batch's prompts differ in length; true CFG (two
    # forwards a step) at 4.0 over 50 steps, 1024 px, text up to 1024 tokens, as its
    # __call__ (negative prompt " " when a request names none, as the model card).
    # Qwen-Image-Edit and -Edit-Plus (2509: several reference images, one through
    # the edits API) have the same entry plus their edits: the same transformer; the
    # input image is read by the Qwen2.5-VL encoder and its latents join the image
    # tokens (a reference edit, as FLUX.1 Kontext's).
    *(
        ModelFamily(
            name,
            GENERIC_PIPELINE,
            "single",
            ("joint_block",),
            implementation="generic",
            defaults=FamilyDefaults(50, 4.0, max_sequence_length=1024),
            generic=replace(
                MMDIT_ROLES,
                masked_roles=("joint_block",),
                cfg_argument="true_cfg_scale",
                cfg_negative_prompt=" ",
            ),
            features=Features(
                edits=edits,
                lora_check=GENERIC_LORA_CHECK,
                quantization_ignored_layers=(
                    "img_in",
                    "txt_in",
                    "time_text_embed",
                    "*.img_mod",
                    "*.txt_mod",
                    "norm_out",
                    "proj_out",
                ),
            ),
        )
        for name, edits in (
            ("QwenImagePipeline", ()),
            ("QwenImageEditPipeline", ("reference",)),
            ("QwenImageEditPlusPipeline", ("reference",)),
        )
    ),
    # Qwen-Image-2.1: one block-causal single-stream DiT over [text, image] (a Qwen3-VL
    # encoder; every call masked where a batch's prompts differ in length) with a prefix
    # KV cache: step 1 fills each block's text keys and values, every later step reads
    # them (counted per request: ``prefix_kv_cache``). Its VAE draws an alpha channel:
    # RGBA images. Sampled without guidance at 40 steps as its __call__ (true CFG when a
    # request asks for a scale above 1: negative prompt " " then); its text encodings
    # go through the conditioning cache.
    ModelFamily(
        "QwenImage21Pipeline",
        GENERIC_PIPELINE,
        "single",
        ("joint_block",),
        implementation="generic",
        defaults=FamilyDefaults(40, 1.0, max_sequence_length=1024, height=1024),
        generic=GenericPath(
            size_multiple=32,
            role_patterns=(("transformer_blocks.", "joint_block"),),
            masked_roles=("joint_block",),
            cfg_argument="true_cfg_scale",
            cfg_negative_prompt=" ",
            prefix_kv_cache="kv_cache_mode",
            prompt_encoder="_get_qwen_prompt_embeds",
        ),
        features=Features(
            output_extras=("alpha",),
            quantization_ignored_layers=(
                "img_in",
                "txt_in.*",
                "time_text_embed.*",
                "modulation.*",
                "norm_out.*",
                "proj_out",
            ),
        ),
    ),
)
