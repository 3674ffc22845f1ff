"""Can a decode forward of the MoE target be timed as a CUDA graph? A probe for the first GPU call (issue 15).

The forward study times each forward eagerly: on a GPU a small-batch step is then partly kernel-launch
time, which vLLM (the paper's engine) hides with CUDA graphs. A graph needs static shapes and no host
synchronisation inside the forward, hence a ``StaticCache``. This probe builds a 2-layer random-weight
Qwen2-57B-A14B shape, fills a static cache of ``context`` tokens, and for B in (1, 32) and s in (1, 5)
times the forward of s new tokens eagerly and, on CUDA, as a captured graph (medians of 20 forwards or replays,
CUDA events), checks that the graph's logits equal the eager ones, and prints a table or the error
that stopped the capture. On the CPU it runs the eager part and checks the static cache against the
dynamic one (what the forward study uses): the logits must agree.

Run: python3 tools/cuda_graph_probe.py [--device cuda] [--layers 2]
"""

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from transformers import StaticCache  # noqa: E402

from moesd.zoo import get_model  # noqa: E402

CONTEXT = 64
"""Tokens in the cache before the timed forward (the GPU preset's context)."""


def median_ms(step, device: torch.device, repeats: int = 20) -> float:
    """Median milliseconds of ``step()`` (CUDA events on a GPU, a host clock on the CPU)."""
    import time

    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            tick = time.perf_counter()
            step()
            times.append(1e3 * (time.perf_counter() - tick))
    return statistics.median(times)


def rewind(cache) -> None:
    """Set a static cache back to CONTEXT tokens (transformers 5 counts them in a device tensor per layer)."""
    for layer in getattr(cache, "layers", ()):
        if isinstance(getattr(layer, "cumulative_length", None), torch.Tensor):
            layer.cumulative_length.fill_(CONTEXT)


@torch.no_grad()
def probe(model, batch: int, tokens: int, device: torch.device, repeats: int = 20) -> dict:
    """Eager and (on CUDA) graph times of one forward of ``tokens`` tokens per sequence after CONTEXT cached ones."""
    generator = torch.Generator().manual_seed(batch * 10 + tokens)
    vocab = model.config.vocab_size
    prompt = torch.randint(1, vocab, (batch, CONTEXT), generator=generator).to(device)
    new = torch.randint(1, vocab, (batch, tokens), generator=generator).to(device)
    cache = StaticCache(config=model.config, max_cache_len=CONTEXT + tokens)
    model(input_ids=prompt, past_key_values=cache, cache_position=torch.arange(CONTEXT, device=device))
    positions = torch.arange(CONTEXT, CONTEXT + tokens, device=device)

    def forward():  # rewinds the cache and writes the same slots each time: a repeatable step
        rewind(cache)
        return model(input_ids=new, past_key_values=cache, cache_position=positions,
                     position_ids=positions.expand(batch, -1)).logits

    eager_logits = forward()
    row = {"B": batch, "s": tokens, "eager ms": median_ms(forward, device, repeats)}
    dynamic = model(input_ids=torch.cat([prompt, new], dim=1), use_cache=True).logits[:, -tokens:]
    row["static = dynamic cache"] = bool(torch.allclose(eager_logits.float(), dynamic.float(), atol=1e-2, rtol=1e-2))
    if device.type != "cuda":
        return row
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                forward()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            graph_logits = forward()
        graph.replay()
        torch.cuda.synchronize()
        row["graph ms"] = median_ms(graph.replay, device, repeats)
        row["graph = eager"] = bool(torch.equal(graph_logits, eager_logits))
    except Exception as error:  # noqa: BLE001 - the probe's job is to report why capture fails
        row["graph ms"] = None
        row["capture error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--width", type=float, default=1.0, help="width factor (the real shape: 1)")
    parser.add_argument("--repeats", type=int, default=20, help="timed forwards per point (median)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = get_model("qwen2-57b-a14b").random_model(num_layers=args.layers, width=args.width, dtype=dtype,
                                                     device=device)
    print(f"{args.layers} layers of qwen2-57b-a14b (width {args.width:g}, random weights), {dtype}, {device}, "
          f"experts implementation {model.config._experts_implementation}")
    failed = False
    for batch in (1, 32):
        for tokens in (1, 5):
            row = probe(model, batch, tokens, device, args.repeats)
            failed |= not row["static = dynamic cache"] or row.get("graph = eager") is False
            print("  ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()),
                  flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
