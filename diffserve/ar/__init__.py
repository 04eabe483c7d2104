"""Autoregressive (AR) LLM stages on vLLM: the engine each stage replica drives
(``vllm_engine.py``), the chat that turns a user's prompt into the LLM's input
(``chat.py``), the prefill/decode KV handover's files (``kv_handover.py``) and the probe
that vLLM loads into its workers to attest what they run (``probe.py``). Nothing here
imports vLLM at module import: a deployment without an AR stage never loads it."""
