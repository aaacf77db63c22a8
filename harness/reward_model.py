"""RLHF with a learned reward (DPPO Fig. 10): a sequence-classification reward model scores (prompt, completion).

The paper scores Gemma-2-9B-It on UltraFeedback and Qwen3-4B-Instruct-2507 on HH-RLHF with
Skywork-Reward-Llama-3.1-8B, an `AutoModelForSequenceClassification` with one output. Here:

- `RewardModel.load(path)` loads any such model (`reward.model_path`); a folder or hub id whose config does not
  name a `*ForSequenceClassification` class with one label is refused in one line naming the key (a causal LM
  would load with a randomly initialised score head and give noise).
- Each sample is formatted as a conversation, the prompt's turns plus the completion as the assistant turn, with
  the reward model's own chat template when it has one (so a policy and a reward model with different
  tokenizers work: the completion goes over as text), else as an HH-style transcript.
- Scoring is batched (`reward.batch_size`), gradient-free, right-padded; the score is the model's output at each
  sequence's last token. Padding uses an id absent from the batch, so a sequence that ends in the tokenizer's
  own pad token (Gemma and Llama reuse EOS-like ids) is still read at its real last token.
- `build_tiny_reward_model(tokenizer)`: a hand-set 1-layer Qwen3ForSequenceClassification on any tokenizer, for
  tests and the CPU minis (`reward.model_path=tiny`). Its score is a known function of the text: with s = +1
  for a token whose text has a digit and -1 otherwise, and m the mean of s over the formatted input, the score is
  `tiny_score(m)`, strictly increasing in m (so more digits score higher), -1 at m = -1 and +1 at m = +1.
- `evaluate_rm`: the mean reward-model score of n samples per held-out prompt (`rm_score` in eval.jsonl).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from harness.rollout.base import EvalSettings, sample_eval

TINY = "tiny"  # reward.model_path value that builds the tiny reward model on the policy's tokenizer
MAX_CONFIG_BYTES = 10_000_000

# The tiny reward model's hand-set weights (build_tiny_reward_model): embedding [C, s, 0, ...] for every token.
_TINY_HIDDEN, _TINY_C = 8, 3.0


def tiny_score(m: float) -> float:
    """The tiny reward model's score for a formatted input whose mean digit sign is m (module docstring).

    Layer 1's uniform attention writes k * m into the residual (k = sqrt(H / (C^2 + 1)), the input norm's scale);
    the final RMSNorm and the score head then give g * k * m / sqrt((C^2 + 1 + (k m)^2) / H), with g chosen so
    that m = +-1 scores +-1."""
    return _tiny_raw(m) / _tiny_raw(1.0)


def _tiny_raw(m: float, eps: float = 1e-6) -> float:
    c2, h = _TINY_C**2, _TINY_HIDDEN
    k = 1.0 / math.sqrt((c2 + 1) / h + eps)  # the input RMSNorm's scale (rsqrt(mean(x^2) + eps))
    return k * m / math.sqrt((c2 + 1 + (k * m) ** 2) / h + eps)


def digit_signs(tokenizer: Any) -> torch.Tensor:
    """[V] +1 for tokens whose decoded text holds a digit, -1 for the rest (special tokens included)."""
    special = set(tokenizer.all_special_ids)
    signs = torch.full((len(tokenizer),), -1.0)
    for i in range(len(tokenizer)):
        if i not in special and any(ch.isdigit() for ch in tokenizer.decode([i])):
            signs[i] = 1.0
    return signs


def build_tiny_reward_model(tokenizer: Any) -> torch.nn.Module:
    """A Qwen3ForSequenceClassification whose score is `tiny_score(mean digit sign)` of its input (docstring)."""
    from transformers import Qwen3Config, Qwen3ForSequenceClassification

    h = _TINY_HIDDEN
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    config = Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=h, intermediate_size=h, num_hidden_layers=1, num_attention_heads=1,
        num_key_value_heads=1, head_dim=h, num_labels=1, pad_token_id=pad, tie_word_embeddings=False,
        rms_norm_eps=1e-6, max_position_embeddings=4096,
    )  # fmt: skip
    model = Qwen3ForSequenceClassification(config)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):  # every RMSNorm scales by 1
                p.fill_(1.0)
        emb = model.model.embed_tokens.weight
        emb[:, 0] = _TINY_C
        emb[:, 1] = digit_signs(tokenizer)
        attn = model.model.layers[0].self_attn  # q = k = 0: every position attends uniformly to its prefix
        attn.v_proj.weight[0, 1] = 1.0  # value = the normalised digit sign
        attn.o_proj.weight[2, 0] = 1.0  # written into residual dim 2: the prefix mean of k * s
        model.score.weight[0, 2] = 1.0 / _tiny_raw(1.0)
    return model.eval()


# ---------------------------------------------------------------- checking and loading


def check_reward_model_path(path: str, key: str = "reward.model_path") -> None:
    """A local folder must hold a sequence-classification model with one label: one-line ValueError naming `key`.
    Hub ids are checked when loaded (`RewardModel.load`), `tiny` is always fine."""
    if path == TINY:
        return
    local = Path(path).expanduser()
    if not local.exists():
        if path.startswith(("/", ".", "~")):
            raise ValueError(f"{key}: {path!r} does not exist (give a reward model folder, a hub id, or tiny)")
        return
    config = local / "config.json"
    if not config.is_file():
        raise ValueError(f"{key}: {path!r} has no config.json, so it is not a Hugging Face model folder")
    import json

    try:
        fields = json.loads(config.read_text(encoding="utf-8")[:MAX_CONFIG_BYTES])
    except ValueError:
        raise ValueError(f"{key}: {path}/config.json is not valid JSON") from None
    _check_fields(fields, path, key)


def _check_fields(fields: dict[str, Any], path: str, key: str) -> None:
    archs = fields.get("architectures") or []
    if not any(str(a).endswith("ForSequenceClassification") for a in archs):
        found = f"a {', '.join(map(str, archs))}" if archs else "a model whose config.json names no architectures"
        raise ValueError(
            f"{key}: {path!r} holds {found}, not a sequence-classification reward model (its config.json must name "
            "a *ForSequenceClassification class, as Skywork-Reward-Llama-3.1-8B's does)"
        )
    labels = fields.get("num_labels", len(fields.get("id2label") or {0: "LABEL_0"}))
    if labels != 1:
        raise ValueError(f"{key}: {path!r} has {labels} output labels; a reward model has one score")


class RewardModel:
    """Scores conversations with a sequence-classification model: batched, no gradient (module docstring)."""

    def __init__(
        self, model: torch.nn.Module, tokenizer: Any, *, batch_size: int = 8, max_length: int | None = None
    ) -> None:
        self.model = model.eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.max_length = max_length
        self.device = next(model.parameters()).device
        self.vocab = int(model.get_input_embeddings().weight.shape[0])
        self.last_truncated = 0

    @classmethod
    def load(
        cls,
        path: str,
        *,
        policy_tokenizer: Any = None,
        dtype: torch.dtype = torch.float32,
        device: str = "cpu",
        batch_size: int = 8,
        max_length: int | None = None,
        key: str = "reward.model_path",
    ) -> RewardModel:
        """`path` a folder or hub id, or `tiny` (built on `policy_tokenizer`). ValueError naming `key` if the
        model is not a one-label sequence classifier or cannot be loaded."""
        if path == TINY:
            if policy_tokenizer is None:
                raise ValueError(f"{key}: tiny needs the policy's tokenizer to build on")
            model = build_tiny_reward_model(policy_tokenizer).to(device=device, dtype=dtype)
            return cls(model, policy_tokenizer, batch_size=batch_size, max_length=max_length)
        check_reward_model_path(path, key)
        from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

        from harness.errors import first_line

        try:
            config = AutoConfig.from_pretrained(path)
            _check_fields({"architectures": config.architectures, "num_labels": config.num_labels}, path, key)
            model = AutoModelForSequenceClassification.from_pretrained(path, dtype=dtype)
            tokenizer = AutoTokenizer.from_pretrained(path)
        except OSError as e:
            raise ValueError(f"{key}: reward model {path!r} could not be loaded: {first_line(e)}") from None
        return cls(model.to(device), tokenizer, batch_size=batch_size, max_length=max_length)

    @classmethod
    def from_config(cls, reward: Any, policy_tokenizer: Any, device: str = "cpu") -> RewardModel:
        """The reward model of a `reward` config group (harness.config.RewardConfig)."""
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[reward.dtype]
        return cls.load(
            reward.model_path,
            policy_tokenizer=policy_tokenizer,
            dtype=dtype,
            device=device,
            batch_size=reward.batch_size,
            max_length=reward.max_length,
        )

    # --- formatting ---
    def encode(self, conversation: Sequence[dict[str, str]]) -> list[int]:
        """Token ids of a conversation (ending in the assistant turn to score), through the reward model's chat
        template when it has one, else as an HH-style transcript; left-cut to `max_length` tokens."""
        tok = self.tokenizer
        if getattr(tok, "chat_template", None):
            text = tok.apply_chat_template(list(conversation), tokenize=False)
            ids = tok(text, add_special_tokens=False)["input_ids"]  # the template wrote BOS itself if it has one
        else:
            ids = tok(transcript(conversation), add_special_tokens=True)["input_ids"]
        if self.max_length is not None and len(ids) > self.max_length:
            self.last_truncated += 1
            ids = ids[-self.max_length :]
        return list(ids)

    # --- scoring ---
    @torch.no_grad()
    def score_ids(self, sequences: Sequence[Sequence[int]]) -> list[float]:
        """One score per token sequence: the model's output at its last token."""
        scores = [0.0] * len(sequences)
        order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))  # similar lengths share a batch
        for start in range(0, len(order), self.batch_size):
            rows = order[start : start + self.batch_size]
            batch = [list(sequences[i]) for i in rows]
            if any(not s for s in batch):
                raise ValueError("reward model: cannot score an empty sequence")
            pad = self._absent_id(batch)
            width = max(len(s) for s in batch)
            ids = torch.full((len(batch), width), pad, dtype=torch.long)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            for r, s in enumerate(batch):
                ids[r, : len(s)] = torch.tensor(s)
                mask[r, : len(s)] = 1
            # The head reads each row at its last token that is not `pad`: pad is in no row, so that is its end.
            self.model.config.pad_token_id = pad
            out = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device)).logits
            for r, i in enumerate(rows):
                scores[i] = float(out[r, 0])
        return scores

    def score(self, conversations: Sequence[Sequence[dict[str, str]]]) -> list[float]:
        return self.score_ids([self.encode(c) for c in conversations])

    def _absent_id(self, batch: list[list[int]]) -> int:
        used = {t for s in batch for t in s}
        first = self.tokenizer.pad_token_id
        if first is not None and first not in used and first < self.vocab:
            return int(first)
        for candidate in range(self.vocab - 1, -1, -1):
            if candidate not in used:
                return candidate
        raise ValueError("reward model: every token id occurs in the batch; lower reward.batch_size")

    def rewards(self, problems: Sequence[Any], completions: Sequence[str]) -> tuple[list[float], dict[str, float]]:
        """Scores of completions[i] as the answer to problems[i] (their `messages`, else the `question` as one
        user turn) -> (rewards, metrics)."""
        self.last_truncated = 0
        scores = self.score([conversation(p, c) for p, c in zip(problems, completions, strict=True)])
        n = max(len(scores), 1)
        return scores, {"reward/rm_input_truncated_frac": self.last_truncated / n}

    def close(self) -> None:
        self.model = None  # type: ignore[assignment]


def conversation(problem: Any, completion: str) -> list[dict[str, str]]:
    """The prompt's turns (a problem's `messages`, else its question as one user turn) plus the completion."""
    turns = getattr(problem, "messages", None) or (("user", problem.question),)
    return [*({"role": r, "content": c} for r, c in turns), {"role": "assistant", "content": completion}]


def transcript(turns: Sequence[dict[str, str]]) -> str:
    """HH-RLHF's plain format: "\\n\\nHuman: ...\\n\\nAssistant: ..." (system turns as "System:")."""
    names = {"user": "Human", "assistant": "Assistant", "system": "System"}
    return "".join(f"\n\n{names.get(t['role'], t['role'].capitalize())}: {t['content']}" for t in turns)


# ---------------------------------------------------------------- evaluation


def evaluate_rm(
    engine: Any,
    prompt_ids: Sequence[list[int]],
    problems: Sequence[Any],
    scorer: RewardModel,
    s: EvalSettings,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Sample n completions per held-out prompt and score them with the reward model -> (record, samples).

    record: {"rm_score" (mean over all samples), "rm_score_std", "n_problems", "response_len_mean",
    "truncated_frac", "prompt_truncated_frac", "problems": [{"id", "kind", "n", "rm_score"}]}."""
    ro, n_cut = sample_eval(engine, prompt_ids, s)
    n = s.n
    rows = [problems[int(g)] for g in ro.group]
    scores, metrics = scorer.rewards(rows, ro.texts)
    per_problem: dict[int, list[float]] = {}
    for g, score in zip(ro.group.tolist(), scores, strict=True):
        per_problem.setdefault(g, []).append(score)
    record: dict[str, Any] = {
        "rm_score": sum(scores) / len(scores),
        "rm_score_std": statistics.pstdev(scores) if len(scores) > 1 else 0.0,
        "n_problems": len(problems),
        "response_len_mean": float(ro.mask.sum(1).float().mean()),
        "truncated_frac": float((~ro.finished).float().mean()),
        "prompt_truncated_frac": n_cut / max(len(problems), 1),
        "rm_input_truncated_frac": metrics["reward/rm_input_truncated_frac"],
        "problems": [
            {"id": p.id, "kind": p.kind, "n": n, "rm_score": sum(per_problem[i]) / len(per_problem[i])}
            for i, p in enumerate(problems)
        ],
    }
    samples = [
        {
            "id": rows[i].id,
            "question": rows[i].question,
            "completion": ro.texts[i],
            "rm_score": scores[i],
        }
        for i in range(0, len(ro.texts), max(1, n))[: s.samples_to_keep]
    ]
    return record, samples
