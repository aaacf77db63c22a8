"""The papers' token-level claims on a real vocabulary: SmolLM2-135M's rollouts at each rollout precision.

    python -m analysis.real_replay [--out findings/real_model] [--prompts 16] [--group 8]

The tiny model cannot show what happens in a vocabulary's tail (~98% of its mu sits in the top 20 tokens). This study
takes the real model (`make real-model`, docs/real-model.md), samples the same prompts from each rollout copy the
precision table defines (`harness.precision`: fp32, BF16, fp8, W8A8, W4A4 on the HF engine; BF16 on vLLM, the
setting of TRL #6789), and scores every sampled token with the trainer in that precision's training dtype, exactly
as a run's first update sees it (pi = the weights that were synced, so pi - mu is the numerics alone). Per token:

- the log-ratio log pi - log mu of the sampled token and |pi - mu| (the mismatch TRL #6789 and DPPO Fig. 3 report);
- from the full vocabulary (HF engine: the copy's own teacher-forced logits): mu's mass outside its top K (K = 20,
  50), and the TV distance three ways, Binary (sampled token vs the rest), Top-K (K = 20, the sampled token forced
  into the K set as the harness and SRL do) and exact: how much of the full divergence each bound sees (Fig. 11);
- then every objective of the rollout replay (analysis/replay.py) on those tokens, with the advantages the
  harness's default estimator gives their rewards: which tokens each trust region zeroes, their mu and entropy
  (claim 3, Fig. 6).

Two temperatures: T = 1.0, the papers' (this 4-bit copy scores ~1% there, so few groups have an advantage), and
T = 0.2, where it does its sums (docs/real-model.md) and mu is the tempered distribution: logit errors are
multiplied by 1/T = 5 in the log-ratio.
Writes REAL_REPLAY.md, real_replay.json and figures/. About 15 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from analysis.replay import LOW_MU, replay, summary
from harness import precision as precisions
from harness.advantages import compute_advantages
from harness.batch import TrainBatch, build_batch
from harness.divergence import full_tv, topk_tv
from harness.rewards import grade
from harness.rollout import make_engine
from harness.rollout.base import force_sampled_into_topk
from harness.tasks.arith import ArithConfig, make_splits
from harness.tasks.templates import render

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / ".cache" / "real-model" / "smollm2-135m-instruct"


@dataclass(frozen=True)
class Setting:
    """One rollout copy: its engine and precision, and a mechanism-map mismatch model's engine or sampling keys."""

    label: str
    engine: str
    precision: str
    engine_kw: tuple[tuple[str, Any], ...] = ()  # make_engine keywords (rollout.logit_noise)
    sampling: tuple[tuple[str, Any], ...] = ()  # generate keywords (rollout.top_k, rollout.mu)


# Every rollout copy of the precision table that the HF engine runs, vLLM at BF16 (TRL #6789's setting), and two of
# the mechanism map's models at the doses its calibration chose (findings/map/MECHANISM.md): i.i.d. logit noise
# 0.5 (its negative control) and top-5 sampling with mu recorded over the whole vocabulary (its truncation model).
SETTINGS: tuple[Setting, ...] = (
    Setting("fp32", "hf", "fp32"),
    Setting("bf16", "hf", "bf16"),
    Setting("fp8_rollout", "hf", "fp8_rollout"),
    Setting("w8a8_rollout", "hf", "w8a8_rollout"),
    Setting("w4a4_rollout", "hf", "w4a4_rollout"),
    Setting("vllm_bf16", "vllm", "bf16"),
    Setting("noise_0.5", "hf", "fp32", engine_kw=(("logit_noise", 0.5),)),
    Setting("topk5_mu_full", "hf", "fp32", sampling=(("top_k", 5), ("mu", "full"))),
)
TEMPERATURES = (1.0, 0.2)
TV_K = 20  # DPPO's K for Top-K TV
TOPK = (5, 20, 50)  # mass outside the top K: 5, the map's truncation dose; 20, DPPO's; 50 beside it
RATIO_BAND = (0.9, 1.1)  # TRL #6789's band
DELTAS = (0.15, 0.2)  # DPPO-TV's delta in the sanity test and at scale (papers.md)
MIN_CLIPPED = 20  # clipped tokens a setting needs before its clipped set is described
SEED = 6100
FALLBACK = "[0-9]+"  # the model writes "42 + 5 = 47", never a box (docs/real-model.md)
# The field's and the papers' numbers the table stands beside (papers.md; issue 61 quotes TRL #6789).
FIELD = (
    ("TRL #6789: Qwen2.5-0.5B, vLLM sampling vs a BF16 trainer", "0.050", "7.5%", "-"),
    ("TRL #6789: the same, vs an FP32 trainer", "-", "3.7%", "-"),
    ("TRL #6789 comment: BF16 trainer, batch shape alone", "-", "8%", "-"),
    ("DPPO Fig. 3: R1-Distill-1.5B, BF16 training, over ~3,000 steps", "-", "-", "up to ~0.02"),
    ("DPPO Fig. 4: the recompute arm", "-", "-", "~0.03"),
)


@dataclass
class Scored:
    """One setting's response tokens (mask > 0), flattened, and the replay batch of the same rollout."""

    logp: np.ndarray  # trainer log pi of the sampled token
    mu_logp: np.ndarray  # the engine's recorded log mu of the sampled token
    entropy: np.ndarray  # the trainer's entropy at the token
    full: dict[str, np.ndarray] | None  # HF only: mass outside top-K, binary / top-K / full TV, teacher-forced mu
    batch: dict[str, Any]  # analysis.replay's inputs
    reward_mean: float
    seconds: float


def prompts_and_answers(tokenizer: Any, n: int) -> tuple[list[list[int]], list[str]]:
    """The first n training `add` problems in the chat_boxed template (docs/real-model.md's task)."""
    problems = make_splits(ArithConfig(kinds=("add",)))[0][:n]
    texts = [render(tokenizer, p.question, "chat_boxed") for p in problems]
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    return [list(x) for x in ids], [p.answer for p in problems]


def response_logits(model: torch.nn.Module, b: TrainBatch, temperature: float, autocast: torch.dtype | None, rows: int):
    """Yield (row slice, [r, T, V] float32 log-softmax(logits / T)) at the response positions, a few rows at a time
    so no [B, T, V] tensor of the whole batch exists (49,152 columns)."""
    p, t = b.prompt_len, b.response_ids.shape[1]
    for i in range(0, len(b), rows):
        sl = slice(i, i + rows)
        with torch.no_grad(), torch.autocast("cpu", dtype=autocast, enabled=autocast is not None):
            logits = model(
                input_ids=b.input_ids[sl], attention_mask=b.attention_mask[sl], position_ids=b.position_ids[sl],
                use_cache=False,
            ).logits[:, p - 1 : p + t - 1]  # fmt: skip
        yield sl, torch.log_softmax(logits.float() / temperature, -1)


def score(
    policy: torch.nn.Module, engine: Any, setting: Setting, temperature: float, n_prompts: int, group: int
) -> Scored:
    start = time.perf_counter()
    kind, precision = setting.engine, setting.precision
    prompts, answers = prompts_and_answers(engine.tokenizer, n_prompts)
    ro = engine.generate(
        prompts, n=group, max_new_tokens=32, topk=1, temperature=temperature, seed=SEED, **dict(setting.sampling)
    )
    graded = grade(
        ro.texts, [a for a in answers for _ in range(group)], ro.finished.tolist(), fallback_pattern=FALLBACK
    )
    rewards = torch.tensor(graded.rewards, dtype=torch.float32)
    adv, _ = compute_advantages(rewards, ro.group)
    b = build_batch(ro, adv, engine.pad_id, topk=1)
    autocast = precisions.get(precision).train_autocast
    logp, entropy = torch.zeros_like(b.mask), torch.zeros_like(b.mask)
    cols: dict[str, list[torch.Tensor]] = {k: [] for k in ("tf_mu_logp", "binary_tv", "topk_tv", "full_tv")}
    cols |= {f"outside_top{k}": [] for k in TOPK}
    # The copy's full distributions, teacher-forced: the HF engine's model; not vLLM's (it returns log-probs of the
    # sampled tokens only), and not the logit-noise model's (its noise is drawn in the sampler, not in the model).
    copy = engine.model if kind == "hf" and not setting.engine_kw else None
    mu_rows = response_logits(copy, b, temperature, None, 4) if copy is not None else None
    for sl, lp in response_logits(policy, b, temperature, autocast, 4):
        ids = b.response_ids[sl].unsqueeze(-1)
        logp[sl] = lp.gather(-1, ids).squeeze(-1)
        entropy[sl] = -(lp.exp() * lp).sum(-1)
        if mu_rows is None:
            continue
        _, lq = next(mu_rows)
        keep = b.mask[sl].bool()
        tf_mu = lq.gather(-1, ids).squeeze(-1)
        top = lq.topk(max(TOPK), -1)
        for k in TOPK:
            cols[f"outside_top{k}"].append((1 - top.values[..., :k].exp().sum(-1))[keep])
        k_ids, k_mu = force_sampled_into_topk(top.indices[..., :TV_K], top.values[..., :TV_K], ids.squeeze(-1), tf_mu)
        cols["topk_tv"].append(topk_tv(lp.gather(-1, k_ids), k_mu)[keep])
        cols["full_tv"].append(full_tv(lp, lq)[keep])
        # from the teacher-forced mu, as the exact TV, so the two bounds and the TV compare the same distributions
        cols["binary_tv"].append((logp[sl].exp() - tf_mu.exp()).abs()[keep])
        cols["tf_mu_logp"].append(tf_mu[keep])
    keep = b.mask.bool()
    full = {k: torch.cat(v).double().numpy() for k, v in cols.items()} if copy is not None else None
    batch = {
        "logp": logp, "behavior_logp": b.behavior_logp, "advantages": b.advantages, "mask": b.mask,
        "entropy": entropy, "old_logp": logp.clone(),  # the first update: pi_old is the synced weights, pi
    }  # fmt: skip
    return Scored(
        logp=logp[keep].double().numpy(), mu_logp=b.behavior_logp[keep].double().numpy(),
        entropy=entropy[keep].double().numpy(), full=full, batch=batch, reward_mean=float(rewards.mean()),
        seconds=time.perf_counter() - start,
    )  # fmt: skip


def mismatch_row(s: Scored) -> dict[str, Any]:
    """The sampled tokens' mismatch, as TRL #6789 and DPPO Fig. 3 report it, and where it sits in mu."""
    log_ratio = s.logp - s.mu_logp
    ratio, pi, mu = np.exp(log_ratio), np.exp(s.logp), np.exp(s.mu_logp)
    outside = (ratio < RATIO_BAND[0]) | (ratio > RATIO_BAND[1])
    low = mu < LOW_MU
    row: dict[str, Any] = {
        "tokens": len(ratio), "reward_mean": s.reward_mean, "seconds": round(s.seconds, 1),
        "log_ratio_sd": float(log_ratio.std()), "log_ratio_mean": float(log_ratio.mean()),
        "outside_band": float(outside.mean()), "abs_diff_mean": float(np.abs(pi - mu).mean()),
        "abs_diff_max": float(np.abs(pi - mu).max()), "low_mu_frac": float(low.mean()),
        "outside_band_low_mu": _share(outside, low), "outside_band_high_mu": _share(outside, ~low),
        "low_mu_among_outside": float(low[outside].mean()) if outside.any() else math.nan,
        "entropy_mean": float(s.entropy.mean()),
    }  # fmt: skip
    if s.full is not None:
        f = s.full
        row |= {f"outside_top{k}_mean": float(f[f"outside_top{k}"].mean()) for k in TOPK}
        row |= {f"outside_top{k}_p99": float(np.quantile(f[f"outside_top{k}"], 0.99)) for k in TOPK}
        row |= {
            "tv_full_mean": float(f["full_tv"].mean()), "tv_binary_mean": float(f["binary_tv"].mean()),
            "tv_topk_mean": float(f["topk_tv"].mean()),
            "binary_share_of_full": _quotient(f["binary_tv"].sum(), f["full_tv"].sum()),
            "topk_share_of_full": _quotient(f["topk_tv"].sum(), f["full_tv"].sum()),
            # the recorded mu against the copy's own teacher-forced mu: KV-cached decoding vs one forward
            "tf_mu_max_abs_diff": float(np.abs(np.exp(f["tf_mu_logp"]) - mu).max()),
        }  # fmt: skip
        for d in DELTAS:
            b, k, full = f["binary_tv"] > d, f["topk_tv"] > d, f["full_tv"] > d
            row[f"over_{d}"] = {"binary": int(b.sum()), "topk": int(k.sum()), "full": int(full.sum()),
                                "binary_topk_disagree": int((b != k).sum())}  # fmt: skip
    return row


def _share(hit: np.ndarray, among: np.ndarray) -> float:
    return float(hit[among].mean()) if among.any() else math.nan


def _quotient(a: float, b: float) -> float:
    return float(a / b) if b > 0 else math.nan


def study(n_prompts: int, group: int, settings=SETTINGS, temperatures=TEMPERATURES) -> tuple[dict, dict]:
    """Every (setting, temperature): the mismatch row and the objective replay. Returns (doc, scored) ."""
    from transformers import AutoModelForCausalLM

    if not (MODEL / "model.safetensors").exists():
        raise SystemExit(f"error: {MODEL.relative_to(ROOT)} is not built yet; build it with make real-model")
    torch.manual_seed(SEED)
    policy = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32).eval()
    rows, scored = [], {}
    for setting in settings:
        label, kind, precision = setting.label, setting.engine, setting.precision
        threads = {"cpu_threads": torch.get_num_threads()} if kind == "vllm" else {}
        engine = make_engine(kind, str(MODEL), precision, seed=SEED, max_model_len=1024, device="cpu", max_topk=1,
                             **threads, **dict(setting.engine_kw))  # fmt: skip
        try:
            for temperature in temperatures:
                s = score(policy, engine, setting, temperature, n_prompts, group)
                scored[(label, temperature)] = s
                rep = summary(replay([s.batch]))
                rows.append({
                    "setting": label, "copy": describe(setting), "engine": kind, "precision": precision,
                    "temperature": temperature,
                    **mismatch_row(s), "replay": rep,
                })  # fmt: skip
                print(f"real_replay: {label} T={temperature}: {rows[-1]['tokens']} tokens, "
                      f"log-ratio s.d. {rows[-1]['log_ratio_sd']:.4f}, {s.seconds:.0f} s", flush=True)  # fmt: skip
        finally:
            engine.close()
    doc = {"model": str(MODEL.relative_to(ROOT)), "prompts": n_prompts, "group": group, "seed": SEED, "rows": rows}
    return doc, scored


REPLAYED = ("grpo", "relax_both", "dppo_tv", "dppo_kl", "mask_neg", "gspo")  # the trust regions the table shows


def report(out: Path, tokens: Path) -> None:
    """REAL_REPLAY.md and figures/ from real_replay.json and the token cache."""
    doc = json.loads((out / "real_replay.json").read_text(encoding="utf-8"))
    arrays = dict(np.load(tokens)) if tokens.exists() else {}
    figures = draw(doc, arrays, out / "figures") if arrays else sorted(
        str(f) for f in (out / "figures").glob("*.png"))  # fmt: skip
    (out / "REAL_REPLAY.md").write_text(markdown(doc, [Path(f).name for f in figures]), encoding="utf-8")
    print(f"real_replay: {out / 'REAL_REPLAY.md'} ({len(doc['rows'])} settings x temperatures)")


def verdicts(doc: dict[str, Any]) -> list[str]:
    """What each token-level measurement says on this model, computed from the rows by the rule in its comment.
    The study has no preregistered margin: these lines summarise measurements, they decide no claim."""
    rows = [r for r in doc["rows"] if r["setting"] != "w4a4_rollout"]  # the broken copy is reported apart
    lines = []
    # Top-K vs Binary (claim 6, Figs 11/19): each bound's share of the exact TV, per temperature, and the tokens
    # that Top-K puts beyond delta while Binary does not (Binary <= Top-K per token, so there are no others).
    for temperature in TEMPERATURES:
        hf = [r for r in rows if r["temperature"] == temperature and r.get("tv_full_mean", 0) > 0]
        if not hf:
            continue
        over = sum(r["over_0.15"]["full"] for r in hf)
        only_topk = sum(r["over_0.15"]["binary_topk_disagree"] for r in hf)
        lines.append(
            f"- **Binary vs Top-K (claim 6), T = {temperature}.** Of the exact TV between trainer and copy, Top-K "
            f"(K = 20) sees {_span([r['topk_share_of_full'] for r in hf])} and Binary "
            f"{_span([r['binary_share_of_full'] for r in hf])} ({', '.join(r['setting'] for r in hf)}); mu leaves "
            f"{_span([r['outside_top20_mean'] for r in hf], pct=False)} of its mass outside its top 20 on average. "
            f"Of the {over} tokens whose exact TV exceeds delta = 0.15, Top-K puts {only_topk} more beyond delta "
            "than Binary does. Per token the two divergences differ; whether the runs differ is Fig. 11's "
            "question, which this does not test."
        )
    # Where the mismatch sits (Fig. 3's low-probability tokens): the share outside [0.9, 1.1] is higher among
    # tokens with mu < 0.1 than among the rest.
    tested = [r for r in rows if r["outside_band"] > 0 and r["low_mu_frac"] > 0]
    if tested:
        more = [r for r in tested if r["outside_band_low_mu"] > r["outside_band_high_mu"]]
        parts = [
            f"{r['setting']} T={r['temperature']}: {_pct(r['outside_band_low_mu'])} vs "
            f"{_pct(r['outside_band_high_mu'])}"
            for r in tested
        ]
        lines.append(
            f"- **The mismatch sits on low-probability tokens: higher for mu < 0.1 in {len(more)} of {len(tested)} "
            f"settings with a mismatch.** Share with pi/mu outside [0.9, 1.1], mu < 0.1 vs mu >= 0.1: "
            f"{'; '.join(parts)}."
        )
    # Claim 3 (Fig. 6): in each setting where GRPO's clip zeroes >= 20 tokens with an advantage, do the clipped
    # tokens have a larger share with mu < 0.1 and a higher mean entropy than all tokens with an advantage?
    clipped = [(r, r["replay"]["claim3"]) for r in rows if r["replay"]["claim3"]["grpo_clipped"] >= MIN_CLIPPED]
    both = [
        (r, c) for r, c in clipped
        if c["clipped_low_mu_frac"] > c["all_low_mu_frac"] and c["clipped_entropy_mean"] > c["all_entropy_mean"]
    ]  # fmt: skip
    if clipped:
        parts = [
            f"{r['setting']} T={r['temperature']}: {c['grpo_clipped']} clipped, mean mu {c['clipped_mu_mean']:.2f} "
            f"vs {c['all_mu_mean']:.2f}, mu < 0.1 {_pct(c['clipped_low_mu_frac'])} vs {_pct(c['all_low_mu_frac'])}, "
            f"entropy {c['clipped_entropy_mean']:.2f} vs {c['all_entropy_mean']:.2f}"
            for r, c in clipped
        ]
        lines.append(
            f"- **Clipped tokens have low mu and high entropy (claim 3): both hold in {len(both)} of {len(clipped)} "
            f"settings where GRPO's clip zeroes at least {MIN_CLIPPED} tokens.** At the first update pi is off mu "
            f"by the numerics alone, so these are the tokens the mismatch pushes out of [0.8, 1.28]: "
            f"{'; '.join(parts)}."
        )
    # Truncated sampling (the map's truncation model; TRL #6789): the sampled distribution differs from the
    # recorded mu by the mass outside the top k, which the sampled token's ratio cannot show.
    for r in rows:
        if r["setting"] == "topk5_mu_full" and "outside_top5_mean" in r:
            lines.append(
                f"- **Truncated sampling (the map's top-5 dose), T = {r['temperature']}.** The sampled token's ratio "
                f"shows a log-ratio s.d. of {r['log_ratio_sd']:.2g} (mu is recorded over the whole vocabulary), but "
                f"the distribution sampled from leaves out {r['outside_top5_mean']:.3f} of mu's mass on average "
                f"(p99 {r['outside_top5_p99']:.3f}): the TV between what is sampled and what is recorded."
            )
    broken = [r for r in doc["rows"] if r["setting"] == "w4a4_rollout"]
    if broken:
        lines.append(
            "- **W4A4 breaks this model.** Its copy's samples get a mean log pi - log mu of "
            + ", ".join(f"{r['log_ratio_mean']:.1f} at T = {r['temperature']}" for r in broken)
            + " and earn no reward: a copy this far from the trainer is outside any trust region's question."
        )
    return lines


def _span(values: list[float], pct: bool = True) -> str:
    fmt = _pct if pct else (lambda x: f"{x:.2g}")
    lo, hi = fmt(min(values)), fmt(max(values))
    return lo if lo == hi else f"{lo}-{hi}"


def _pct(x: float) -> str:
    return "-" if not np.isfinite(x) else f"{x:.1%}"


def markdown(doc: dict[str, Any], figures: list[str]) -> str:
    rows = doc["rows"]
    lines = [
        "# The papers' token-level claims on a real vocabulary: SmolLM2-135M",
        "",
        f"Made by `make real-model-replay` (analysis/real_replay.py) in {doc.get('minutes', '?')} min on 2 cores: "
        f"the first {doc['prompts']} training `add` problems, {doc['group']} samples each, 32 new tokens at most, "
        f"seed {doc['seed']}, from each rollout copy; every sampled token scored by the trainer in the precision's "
        "training dtype with the weights the copy was made from, as a run's first update sees it. The model, the "
        "task and what they cost: docs/real-model.md.",
        "",
        "## What the measurements say",
        "",
        *verdicts(doc),
        "",
        "## The mismatch of the sampled token, beside the field's",
        "",
        "log pi - log mu of every response token; *outside* is the share with pi/mu outside [0.9, 1.1] (TRL #6789's "
        "band); |pi - mu| as DPPO Fig. 3 plots it.",
        "",
        "| setting (copy / trainer) | T | tokens | reward | log-ratio s.d. | mean | outside [0.9, 1.1] "
        r"| mean \|pi - mu\| | max \|pi - mu\| |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['setting']} ({r['copy']}) | {r['temperature']} | {r['tokens']} | {r['reward_mean']:.3f} "
            f"| {r['log_ratio_sd']:.3g} "
            f"| {r['log_ratio_mean']:.2g} | {_pct(r['outside_band'])} | {r['abs_diff_mean']:.3g} "
            f"| {r['abs_diff_max']:.3g} |"
        )
    for name, sd, outside, diff in FIELD:
        lines.append(f"| {name} | 1.0 | | | {sd} | | {outside} | {diff} | |")
    lines += [
        "",
        "## Where it sits: low-probability tokens",
        "",
        "| setting | T | tokens with mu < 0.1 | outside the band, mu < 0.1 | outside, mu >= 0.1 "
        "| mu < 0.1 among the tokens outside |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['setting']} | {r['temperature']} | {_pct(r['low_mu_frac'])} | {_pct(r['outside_band_low_mu'])} "
            f"| {_pct(r['outside_band_high_mu'])} | {_pct(r['low_mu_among_outside'])} |"
        )
    lines += [
        "",
        "## The vocabulary's tail, and what Binary and Top-K see of the exact TV (HF engine)",
        "",
        "mu's mass outside its top K at each response token; the TV distance between the trainer's and the copy's "
        "full distributions (the copy teacher-forced on the same tokens), and its two lower bounds: Binary (sampled "
        "token vs the rest) and Top-K (K = 20, the sampled token forced into the set). *Share* is the bound's sum "
        "over the exact TV's sum.",
        "",
        "| setting | T | mass outside top 5: mean / p99 | top 20 | top 50 | exact TV mean "
        "| Binary share | Top-K share | tokens over 0.15: exact / Binary / Top-K | Binary vs Top-K masks disagree "
        "| recorded vs teacher-forced mu, max |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "tv_full_mean" not in r:
            continue
        o = r["over_0.15"]
        lines.append(
            f"| {r['setting']} | {r['temperature']} | "
            + " | ".join(f"{r[f'outside_top{k}_mean']:.2g} / {r[f'outside_top{k}_p99']:.2g}" for k in TOPK)
            + f" | {r['tv_full_mean']:.3g} "
            f"| {_pct(r['binary_share_of_full'])} | {_pct(r['topk_share_of_full'])} "
            f"| {o['full']} / {o['binary']} / {o['topk']} | {o['binary_topk_disagree']} "
            f"| {r['tf_mu_max_abs_diff']:.2g} |"
        )
    lines += [
        "",
        "## Every trust region on the same tokens (the rollout replay's objectives)",
        "",
        "The tokens with a non-zero advantage (the harness's default estimator on the graded rewards); a token is "
        "*zeroed* when the objective's gradient weight on it is 0. pi_old is pi here (the first update), so the "
        "objectives anchored on it see a ratio of 1.",
        "",
        "| setting | T | tokens with A != 0 | "
        + " | ".join(f"{o} zeroed" for o in REPLAYED)
        + " | GRPO-clipped: mean mu / mu < 0.1 / entropy (all tokens) |",
        "|---|---|---|" + "---|" * len(REPLAYED) + "---|",
    ]
    for r in rows:
        rep = r["replay"]
        by = {o["objective"]: o for o in rep["objectives"]}
        c3 = rep["claim3"]
        clip = (f"{c3['clipped_mu_mean']:.3f} / {_pct(c3['clipped_low_mu_frac'])} / {c3['clipped_entropy_mean']:.2f} "
                f"({c3['all_mu_mean']:.3f} / {_pct(c3['all_low_mu_frac'])} / {c3['all_entropy_mean']:.2f})"
                if c3["grpo_clipped"] else "-")  # fmt: skip
        cells = [str(by[o].get("zeroed", "-")) for o in REPLAYED]
        lines.append(f"| {r['setting']} | {r['temperature']} | {rep['tokens']} | " + " | ".join(cells) + f" | {clip} |")
    lines += ["", *[f"![{f}](figures/{f})" for f in figures], ""]
    return "\n".join(lines)


def describe(setting: Setting) -> str:
    """The rollout copy and the trainer, as the tables name them."""
    spec = precisions.get(setting.precision)
    copy = {"w8a8_rollout": "W8A8", "w4a4_rollout": "W4A4", "fp8_rollout": "fp8 e4m3"}.get(
        setting.precision, "BF16" if spec.rollout_dtype == torch.bfloat16 else "FP32"
    )
    extra = {"logit_noise": "logit noise {}", "top_k": "top-{} sampling", "mu": "mu over the {} vocabulary"}
    parts = [extra[k].format(v) for k, v in (*setting.engine_kw, *setting.sampling)]
    engine = "vLLM" if setting.engine == "vllm" else "HF"
    trainer = "BF16" if spec.train_autocast is not None else "FP32"
    return f"{engine} {', '.join([copy, *parts])} / {trainer}"


def draw(doc: dict[str, Any], arrays: dict[str, np.ndarray], out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    keys = [(r["setting"], r["temperature"]) for r in doc["rows"]]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2))
    bins = np.linspace(0, 1, 11)
    for ax, temperature in zip(axes[:2], TEMPERATURES, strict=True):
        for label, t in keys:
            if t != temperature or label == "w4a4_rollout":
                continue
            lp, lq = arrays[f"{label}@{t}/logp"], arrays[f"{label}@{t}/mu_logp"]
            mu, diff = np.exp(lq), np.abs(np.exp(lp) - np.exp(lq))
            idx = np.clip(np.digitize(mu, bins) - 1, 0, len(bins) - 2)
            means = [diff[idx == i].mean() if (idx == i).any() else np.nan for i in range(len(bins) - 1)]
            ax.plot((bins[:-1] + bins[1:]) / 2, means, marker="o", ms=3, label=label)
        ax.set_yscale("log")
        ax.set_xlabel("mu of the sampled token")
        ax.set_ylabel("mean |pi - mu|")
        ax.set_title(f"where the mismatch sits, T = {temperature}")
        ax.legend(fontsize=7)
    ax = axes[2]
    for label, t in keys:
        if f"{label}@{t}/outside_top20" not in arrays or label == "w4a4_rollout" or t != 1.0:
            continue
        for k, style in zip(TOPK, ("-", "--", ":"), strict=True):
            tail = np.sort(arrays[f"{label}@{t}/outside_top{k}"])
            ax.plot(np.clip(tail, 1e-12, None), np.linspace(0, 1, len(tail)), style, label=f"{label}, K={k}")
    ax.set_xscale("log")
    ax.set_xlabel("mu's mass outside its top K (T = 1.0)")
    ax.set_ylabel("share of tokens at most")
    ax.set_title("the tail Top-K leaves out")
    ax.legend(fontsize=7)
    fig.tight_layout()
    paths = [out / "mismatch.png"]
    fig.savefig(paths[0], dpi=110)
    plt.close(fig)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, bound, name in zip(axes, ("binary_tv", "topk_tv"), ("Binary", "Top-K (K = 20)"), strict=True):
        for label, t in keys:
            if (
                f"{label}@{t}/full_tv" not in arrays
                or label == "w4a4_rollout"
                or not arrays[f"{label}@{t}/full_tv"].any()
            ):
                continue  # no full distributions, the broken copy, or one forward on both sides (TV 0)
            ax.scatter(arrays[f"{label}@{t}/full_tv"], arrays[f"{label}@{t}/{bound}"], s=3, alpha=0.4,
                       label=f"{label} T={t}")  # fmt: skip
        ax.plot([1e-7, 1], [1e-7, 1], color="grey", lw=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(1e-6, 1)
        ax.set_ylim(1e-7, 1)
        ax.set_xlabel("exact TV (full vocabulary)")
        ax.set_ylabel(f"{name} TV")
        ax.set_title(f"{name} against the exact TV, per token")
        ax.legend(fontsize=7, markerscale=3)
    fig.tight_layout()
    paths.append(out / "tv_bounds.png")
    fig.savefig(paths[1], dpi=110)
    plt.close(fig)
    return [str(p) for p in paths]


def save_tokens(scored: dict, path: Path) -> None:
    """The per-token arrays the figures draw, for `--report-only` (a cache under runs/, not committed)."""
    arrays = {}
    for (label, temperature), s in scored.items():
        key = f"{label}@{temperature}"
        arrays |= {f"{key}/logp": s.logp, f"{key}/mu_logp": s.mu_logp, f"{key}/entropy": s.entropy}
        arrays |= {f"{key}/{k}": v for k, v in (s.full or {}).items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, **arrays)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m analysis.real_replay", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT / "findings" / "real_model")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--report-only", action="store_true", help="redraw REAL_REPLAY.md and figures from the last run")
    args = p.parse_args(argv)
    tokens = args.out / "runs" / "tokens.npz"
    if not args.report_only:
        start = time.perf_counter()
        doc, scored = study(args.prompts, args.group)
        doc["minutes"] = round((time.perf_counter() - start) / 60, 1)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "real_replay.json").write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
        save_tokens(scored, tokens)
    report(args.out, tokens)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
