"""Small causal language models for the autoregressive prompt-rewrite stage (what vLLM
runs before diffusion).

``specs`` holds the shapes (Qwen3 and Qwen3-MoE, sized for vLLM's CPU backend) and the
chat template; ``build`` writes the random ``tiny-qwen3`` / ``tiny-qwen3-moe``
directories (Hugging Face causal-LM layout, byte-identical per seed) and finds the
shipped ``toy-prompter`` (``diffserve/assets/toy-prompter``); ``prompt_grammar`` is the
toy prompter's task, the rule that expands a short prompt into the toy-shapes /
toy-motion grammar; ``decode`` its chat input and greedy decoding with transformers;
``train`` its CPU trainer. Heavy imports live inside functions.
"""
