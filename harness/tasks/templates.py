"""Prompt templates: how a question becomes the text the policy is conditioned on."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

TEMPLATES = ("chat", "plain", "qwen_math", "chat_boxed")

# The instruction the Qwen3 base-model runs of both papers append to every question.
QWEN_MATH_SUFFIX = " Please reason step by step, and put your final answer within \\boxed{}."
# What chat_boxed appends to the user turn: an instruct model's cue to end with an answer the grader can find.
BOXED_SUFFIX = " Put your final answer within \\boxed{}."


def render(tokenizer: Any, question: str, template: str = "chat") -> str:
    """``chat``: the tokenizer's chat template with one user turn and the generation prompt; ``chat_boxed``: the
    same with BOXED_SUFFIX after the question (instruct models that are not trained on bare questions);
    ``plain``: question + newline; ``qwen_math``: question + the boxed-answer instruction + newline."""
    if template == "chat_boxed":
        return render(tokenizer, question + BOXED_SUFFIX, "chat")
    if template == "chat":
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                f"template 'chat' needs a tokenizer with a chat_template; {type(tokenizer).__name__} has none "
                "(use 'plain' or 'qwen_math' for base models)"
            )
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
        )
    if template == "plain":
        return question + "\n"
    if template == "qwen_math":
        return question + QWEN_MATH_SUFFIX + "\n"
    raise ValueError(f"unknown prompt template {template!r}; allowed: {', '.join(TEMPLATES)}")


def render_turns(tokenizer: Any, turns: Sequence[tuple[str, str]]) -> str:
    """A multi-turn prompt ((role, content) pairs ending in a user turn) through the chat template, with the
    generation prompt."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"template 'chat' needs a tokenizer with a chat_template; {type(tokenizer).__name__} has none")
    messages = [{"role": role, "content": content} for role, content in turns]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
