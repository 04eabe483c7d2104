"""The KV handover of a prefill/decode pair: the connector's settings both engines
share, and its files.

vLLM's ``ExampleConnector`` (the CPU one) writes each prompt's KV, layer by layer, as
safetensors files in a folder named by a hash of the prompt's token ids (full blocks
only); the decode engine finds that folder and loads the KV instead of recomputing it.
The pair gets a private temporary folder unless the deploy file names one
(``kv_connector_extra_config.shared_storage_path``); in its own folder a prompt's files
are removed once its decode has loaded them, so that folder holds only requests in
flight (a named folder is left as vLLM leaves it). Other connectors (NIXL, LMCache,
Mooncake on CUDA) keep their own state: their settings pass through as written.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from diffserve.config.ar_schema import ArStageConfig
from diffserve.logging import get_logger

logger = get_logger(__name__)

EXAMPLE_CONNECTOR = "ExampleConnector"


class KvHandover:
    """The connector settings of one prefill/decode pair (``prefill`` is the pair's
    first stage)."""

    def __init__(self, prefill: ArStageConfig) -> None:
        extra: dict[str, Any] = dict(prefill.kv_connector_extra_config)
        self.connector = prefill.kv_connector
        self._owned: str | None = None
        if self.connector == EXAMPLE_CONNECTOR and "shared_storage_path" not in extra:
            self._owned = tempfile.mkdtemp(
                prefix=f"diffserve-kv-stage{prefill.stage_id}-"
            )
            extra["shared_storage_path"] = self._owned
        self.extra_config: Mapping[str, Any] = extra

    @property
    def folder(self) -> Path | None:
        """ExampleConnector's storage folder (None for other connectors)."""
        path = (
            self.extra_config.get("shared_storage_path")
            if self.connector == EXAMPLE_CONNECTOR
            else None
        )
        return Path(path) if path else None

    def files_of(self, prompt_token_ids: list[int], block_size: int) -> Path | None:
        """The folder ExampleConnector keeps this prompt's KV in (its own naming: the
        full blocks' token ids)."""
        if self.folder is None:
            return None
        import torch
        from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import (
            align_to_block_size,
        )
        from vllm.utils.hashing import safe_hash

        stored = align_to_block_size(len(prompt_token_ids) - 1, block_size)
        digest = safe_hash(
            torch.tensor(prompt_token_ids)[:stored].numpy().tobytes(),
            usedforsecurity=False,
        )
        return self.folder / digest.hexdigest()

    def release(self, prompt_token_ids: list[int], block_size: int) -> None:
        """The decode engine loaded this prompt's KV: drop its files (in diffserve's own
        folder only: a folder the deploy file names may be shared with other instances,
        and what it holds is theirs too)."""
        if self._owned is None:
            return
        folder = self.files_of(prompt_token_ids, block_size)
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)

    def close(self) -> None:
        if self._owned is not None:
            shutil.rmtree(self._owned, ignore_errors=True)
            self._owned = None
