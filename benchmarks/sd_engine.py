"""Speed of the SD engine: against HF assisted generation, its overhead, and the KV growth of its windows.

(a) tokens/s of ``SpeculativeDecoder`` at batch 1 against Hugging Face assisted generation (greedy,
    constant ``gamma`` draft tokens) on the same tiny random-weight models and prompts; throughput at
    batch 8 and 32, where assisted generation refuses to run;
(b) the engine's per-round overhead outside the model forwards, as a fraction of a round, at batch 8
    with the scaled Qwen2-57B-A14B-shaped target of the CPU preset (synthetic acceptance 0.9);
(c) the KV effect of the steady-state protocol: the e2e preset's SD window (gamma = 4) attends over
    longer caches than its AR window. The preset's target times T_T(B, 1) and T_T(B, 5) over caches
    of the two windows' mean KV lengths, the two contexts alternating pass by pass; the ratio is how
    much slower SD's forwards run than they would at the AR window's context.

Random weights: the draft is a perturbed copy of the target so that greedy acceptance is real but
partial. Figures are medians over repeats. Run: python benchmarks/sd_engine.py [a] [b] [c]
"""

import statistics
import sys
import time

import pandas as pd
import torch
from timing import median_seconds

import moesd.engine.sd as sd
from moesd.measure.bench import build_models
from moesd.measure.presets import preset
from moesd.engine.sd import SpeculativeDecoder
from moesd.zoo import get_model, noisy_copy

REPEATS, TOKENS, GAMMA = 5, 48, 3


def against_assisted() -> None:
    target = get_model("qwen2-57b-a14b").random_model(num_layers=2, width=1 / 16)
    draft = noisy_copy(target, 0.05)
    ids = torch.randint(1, target.config.vocab_size, (1, 32), generator=torch.Generator().manual_seed(0))
    calls = []
    hook = target.register_forward_pre_hook(lambda module, args: calls.append(1))

    def assisted():
        return target.generate(input_ids=ids, attention_mask=torch.ones_like(ids), assistant_model=draft,
                               max_new_tokens=TOKENS, do_sample=False, num_assistant_tokens=GAMMA,
                               num_assistant_tokens_schedule="constant", pad_token_id=0)

    assisted()
    hook.remove()
    # HF stops drafting early when the draft's confidence is low (assistant_confidence_threshold), so it may
    # draft fewer than GAMMA tokens a round: compare with moesd at gamma 1 and at GAMMA.
    print(f"(a) batch 1, {TOKENS} tokens: HF assisted (num_assistant_tokens={GAMMA}) ran {len(calls) - 1} "
          f"verification rounds, {TOKENS / (len(calls) - 1):.2f} tokens a round")
    hf = median_seconds(assisted, REPEATS, warmup=1)
    print(f"    HF assisted {TOKENS / hf:.0f} tokens/s")
    for gamma in (1, GAMMA):
        decoder = SpeculativeDecoder(target, draft, gamma)
        ours = median_seconds(lambda: decoder.generate(ids, max_new_tokens=TOKENS), REPEATS, warmup=1)
        stats = decoder.generate(ids, max_new_tokens=TOKENS).stats
        print(f"    moesd gamma {gamma}: {TOKENS / ours:.0f} tokens/s ({stats.rounds} rounds, acceptance "
              f"{stats.acceptance_rate:.2f}); time relative to HF {ours / hf:.2f}")
    decoder = SpeculativeDecoder(target, draft, GAMMA)
    for batch in (8, 32):
        prompts = torch.randint(1, target.config.vocab_size, (batch, 32), generator=torch.Generator().manual_seed(1))
        seconds = median_seconds(lambda: decoder.generate(prompts, max_new_tokens=TOKENS), REPEATS, warmup=1)
        print(f"    batch {batch}, gamma {GAMMA}: moesd {batch * TOKENS / seconds:.0f} tokens/s "
              f"(HF assisted: batch 1 only)")


def overhead() -> None:
    target, draft = build_models(preset("e2e"))
    decoder = SpeculativeDecoder(target, draft, GAMMA)
    ids = torch.randint(1, target.config.vocab_size, (8, 64), generator=torch.Generator().manual_seed(2))
    inside = []
    forward = sd._CachedModel.forward

    def timed_forward(*args):
        tick = time.perf_counter()
        result = forward(*args)
        inside.append(time.perf_counter() - tick)
        return result

    sd._CachedModel.forward = timed_forward
    fractions = []
    try:
        for _ in range(REPEATS):
            inside.clear()
            stats = decoder.generate(ids, max_new_tokens=TOKENS, synthetic_acceptance=0.9, seed=0).stats
            prefill = sum(inside[:2])  # the target's and the draft's prefill
            fractions.append((stats.t_rounds - (sum(inside) - prefill)) / stats.t_rounds)
    finally:
        sd._CachedModel.forward = forward
    print(f"(b) batch 8, gamma {GAMMA}, scaled Qwen2-57B-A14B (CPU preset): engine overhead outside the forwards "
          f"{100 * statistics.median(fractions):.1f} % of a round (median of {REPEATS})")


@torch.no_grad()
def kv_growth(batch_sizes=(1, 8, 24, 60, 100), gamma=4, repeats=15) -> None:
    e2e = preset("e2e")
    middle = e2e.warmup_rounds + e2e.rounds / 2  # rounds before the middle of the window
    contexts = {"AR": round(e2e.context + middle + 1), "SD": round(e2e.context + (middle + 1) * (gamma + 1))}
    target, _ = build_models(preset("forward"))
    rows = []
    for batch in batch_sizes:
        caches = {window: target(input_ids=torch.randint(1, 100, (batch, context)), use_cache=True).past_key_values
                  for window, context in contexts.items()}
        for tokens in (1, gamma + 1):
            new = torch.randint(1, 100, (batch, tokens))
            times = {window: [] for window in contexts}
            for repeat in range(repeats + 1):  # the two contexts alternate, so drift hits both alike
                for window, context in contexts.items():
                    positions = torch.arange(context, context + tokens).expand(batch, -1)
                    tick = time.perf_counter()
                    target(input_ids=new, position_ids=positions, past_key_values=caches[window], use_cache=True)
                    if repeat:  # the first pass of each is a warm-up
                        times[window].append(time.perf_counter() - tick)
                    caches[window].crop(-tokens)
            rows.append({"B": batch, "s": tokens, "ratio": statistics.median(times["SD"]) / statistics.median(times["AR"])})
    table = pd.DataFrame(rows).pivot(index="s", columns="B", values="ratio")
    print(f"(c) T_T(B, s) at the SD window's mean KV ({contexts['SD']} slots, gamma {gamma}) over T_T at the AR "
          f"window's ({contexts['AR']} slots), CPU preset target, medians of {repeats} alternating passes:")
    print(table.round(3).to_string())


if __name__ == "__main__":
    torch.manual_seed(0)
    parts = sys.argv[1:] or ["a", "b", "c"]
    for part, function in (("a", against_assisted), ("b", overhead), ("c", kv_growth)):
        if part in parts:
            function()
