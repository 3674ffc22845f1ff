"""Speed of the SD engine: against Hugging Face assisted generation, its overhead, and the KV growth of its windows.

Run on an otherwise idle machine, one torch thread:
``OMP_NUM_THREADS=1 flock /tmp/moesd-cpu.lock python benchmarks/sd_engine.py [a] [b] [c]``

(a) tokens/s (32-token prompts, 48 new tokens per sequence, greedy) of ``SpeculativeDecoder`` at batch 1, 8 and 32
    (gamma 3; gamma 1 too at batch 1) beside Hugging Face assisted generation at batch 1 (it refuses larger batches),
    on the same tiny random-weight models and prompts. HF drafts in two ways: exactly ``GAMMA`` tokens a round, as
    the engine does, and its default way, up to ``GAMMA`` tokens but stopping when the draft's top probability falls
    below 0.4 (on these random weights it stops after one token in most rounds, so it compares with the engine at
    gamma 1). transformers reads ``num_assistant_tokens`` and ``assistant_confidence_threshold`` from the *draft's*
    generation config: passed to ``target.generate`` they are ignored (HF then drafts up to 20 tokens). Every point
    yields the target's greedy tokens (checked before timing). Each repeat runs every point once in a shuffled order
    (interleaved repeats); figures are medians over ``REPEATS`` repeats.
(b) the engine's time outside the model forwards (forward hooks on the two models time the forwards), as a share of
    a generation: the tiny pair at batch 1, 8 and 32, and the scaled Qwen2-57B-A14B-shaped target of the CPU preset
    at batch 8 (synthetic acceptance 0.9).
(c) the KV effect of the steady-state protocol: the e2e preset's SD window (gamma = 4) attends over
    longer caches than its AR window. The preset's target times T_T(B, 1) and T_T(B, 5) over caches
    of the two windows' mean KV lengths, the two contexts alternating pass by pass; the ratio is how
    much slower SD's forwards run than they would at the AR window's context.

Why an earlier version of (a) printed HF assisted at ~5 tokens/s where a side-by-side timing gave ~132: it timed HF's
five calls in one stretch and the engine's in later stretches, with torch's default threads (2 on the project's
2-core machine). A 2-thread process on a machine whose other core is busy waits at every parallel operation for
its preempted thread: measured here with one core kept busy, HF assisted fell to 4 tokens/s and the engine to 2
(36 and 27 with one thread), so load that came or went between the stretches became a 20x error in the ratio.
(a) now pins one thread, interleaves the points and prints the load; it also sets HF's drafting where HF reads it.

Random weights: the draft is a perturbed copy of the target so that greedy acceptance is real but partial.
"""

import statistics
import sys
import time

import pandas as pd
import torch
from timing import interleaved_seconds, machine_state

from moesd.engine.sd import SpeculativeDecoder
from moesd.measure.bench import build_models
from moesd.measure.presets import preset
from moesd.zoo import get_model, noisy_copy

REPEATS, TOKENS, GAMMA, PROMPT = 11, 48, 3, 32


def tiny_pair():
    """The 2-layer Qwen2-57B-A14B-shaped random target (widths / 16) and its perturbed copy as the draft."""
    target = get_model("qwen2-57b-a14b").random_model(num_layers=2, width=1 / 16)
    return target, noisy_copy(target, 0.05)


def prompts(vocab: int, batch: int) -> torch.Tensor:
    return torch.randint(1, vocab, (batch, PROMPT), generator=torch.Generator().manual_seed(batch))


def assisted(target, draft, ids, threshold: float):
    """HF assisted generation drafting up to GAMMA tokens a round, stopping below ``threshold`` (0: never)."""
    draft.generation_config.num_assistant_tokens = GAMMA
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = threshold
    return target.generate(input_ids=ids, attention_mask=torch.ones_like(ids), assistant_model=draft,
                           max_new_tokens=TOKENS, do_sample=False, pad_token_id=0)


def against_assisted() -> None:
    target, draft = tiny_pair()
    one = prompts(target.config.vocab_size, 1)
    points = {  # name -> (batch, call)
        f"HF assisted, {GAMMA} drafts a round": (1, lambda: assisted(target, draft, one, 0.0)),
        f"HF assisted, default drafting (up to {GAMMA}, stops below 0.4)": (1, lambda: assisted(target, draft, one, 0.4)),
        "moesd gamma 1": (1, lambda: SpeculativeDecoder(target, draft, 1).generate(one, max_new_tokens=TOKENS)),
    }
    for batch in (1, 8, 32):
        ids = prompts(target.config.vocab_size, batch)
        points[f"moesd gamma {GAMMA}, batch {batch}"] = (
            batch, lambda ids=ids: SpeculativeDecoder(target, draft, GAMMA).generate(ids, max_new_tokens=TOKENS))
    greedy = {batch: target.generate(input_ids=prompts(target.config.vocab_size, batch), max_new_tokens=TOKENS,
                                     do_sample=False, pad_token_id=0) for batch in (1, 8, 32)}
    for name, (batch, call) in points.items():
        output = call()
        if not torch.equal(getattr(output, "sequences", output), greedy[batch]):
            raise RuntimeError(f"{name} does not give the target's greedy tokens")
    before = machine_state()
    wall, cpu = interleaved_seconds({name: call for name, (_, call) in points.items()}, REPEATS)
    rows = [{"point": name, "batch": batch, "tokens/s": batch * TOKENS / statistics.median(wall[name]),
             "slowest/fastest": max(wall[name]) / min(wall[name]),
             "tokens/s of CPU time": batch * TOKENS / statistics.median(cpu[name])} for name, (batch, _) in points.items()]
    table = pd.DataFrame(rows).set_index("point")
    for column in ("tokens/s", "tokens/s of CPU time"):
        table[f"{column} / HF's ({GAMMA} drafts)"] = table[column] / table.loc[f"HF assisted, {GAMMA} drafts a round",
                                                                                column]
    print(f"(a) {TOKENS} new tokens per sequence, {PROMPT}-token prompts, greedy, medians of {REPEATS} interleaved "
          f"repeats (wall clock; and the thread's CPU time, which a shared machine's other processes do not "
          f"lengthen); before: {before}; after: {machine_state()}")
    with pd.option_context("display.width", 250):
        print(table.round(2).to_string())


def _forward_seconds(models, call) -> tuple[float, float]:
    """Seconds of ``call()`` and of the forwards of ``models`` inside it (timed by forward hooks)."""
    inside = []
    handles = [hook for model in models for hook in (
        model.register_forward_pre_hook(lambda module, args: inside.append(-time.perf_counter())),
        model.register_forward_hook(lambda module, args, output: inside.__setitem__(-1, inside[-1] + time.perf_counter())))]
    try:
        tick = time.perf_counter()
        call()
        return time.perf_counter() - tick, sum(inside)
    finally:
        for handle in handles:
            handle.remove()


def overhead() -> None:
    tiny = tiny_pair()
    cases = [(f"tiny pair, batch {batch}, gamma {GAMMA}", tiny, prompts(tiny[0].config.vocab_size, batch), {})
             for batch in (1, 8, 32)]
    e2e = build_models(preset("e2e"))
    ids = torch.randint(1, e2e[0].config.vocab_size, (8, 64), generator=torch.Generator().manual_seed(2))
    cases.append(("CPU preset's scaled Qwen2-57B-A14B, batch 8, synthetic 0.9", e2e, ids,
                  {"synthetic_acceptance": 0.9, "seed": 0}))
    print(f"(b) the engine's time outside the model forwards, share of a generation (median of {REPEATS}); "
          f"{machine_state()}")
    for name, (target, draft), ids, options in cases:
        decoder = SpeculativeDecoder(target, draft, GAMMA)
        run = lambda: decoder.generate(ids, max_new_tokens=TOKENS, **options)  # noqa: E731
        run()
        shares = [(total - forwards) / total for total, forwards in
                  (_forward_seconds((target, draft), run) for _ in range(REPEATS))]
        print(f"    {name}: {100 * statistics.median(shares):.1f} %")


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
    torch.set_num_threads(1)
    parts = sys.argv[1:] or ["a", "b", "c"]
    for part, function in (("a", against_assisted), ("b", overhead), ("c", kv_growth)):
        if part in parts:
            function()
