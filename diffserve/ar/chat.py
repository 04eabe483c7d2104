"""The chat an AR stage sends its LLM: the deploy file's system prompt, then the user's
prompt."""

from __future__ import annotations


def chat_messages(system_prompt: str, user_prompt: str) -> list[dict[str, str]]:
    """OpenAI-style messages for the tokenizer's chat template (no system message when
    the deploy file sets none)."""
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return [*messages, {"role": "user", "content": user_prompt}]


def revised_text(text: str) -> str:
    """The rewrite as the diffusion stages get it: one line, no surrounding blanks (a
    model may end with a newline or wrap the prompt in quotes)."""
    line = " ".join(text.split())
    if len(line) >= 2 and line[0] == line[-1] and line[0] in "\"'":
        line = line[1:-1].strip()
    return line
