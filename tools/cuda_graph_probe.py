"""Can a decode forward of the MoE target be timed as a CUDA graph? A probe run before a GPU's forward studies.

The forward study times each forward eagerly: on a GPU a small-batch step is then partly kernel-launch
time, which vLLM (the paper's engine) hides with CUDA graphs. A graph needs static shapes and no host
synchronisation inside the forward, hence a ``StaticCache`` (what ``moesd sweep forward --cuda-graphs``
times with :func:`moesd.engine.static_cache.static_step`). This probe builds a 2-layer random-weight
Qwen2-57B-A14B shape, fills a cache of 64 tokens, and for B in (1, 32) and s in (1, 5) times the
forward of s new tokens over the dynamic cache (what the eager forward study times), over a rewound
static cache, and on CUDA as a graph replay (medians of 20, CUDA events); it prints the largest
differences of their logits, or the first error of a failed capture. On CUDA it then captures the
forward again under uniform routing (:mod:`moesd.measure.router_control`, the studies' default), whose
experts are drawn inside the graph, and checks that two replays draw different experts. It exits 1
if the logits disagree, a capture failed or replays repeat their draws. Last, :func:`sd_probe` checks
the end-to-end engine over static caches replayed as graphs (``moesd sweep e2e --cuda-graphs``)
against the same engine run eagerly. On the CPU it runs the eager forwards and the eager engine.

Run: python3 tools/cuda_graph_probe.py [--device cuda] [--layers 2]
"""

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from moesd.engine.timing import Timer  # noqa: E402
from moesd.measure.router_control import RoutingControl, distinct_experts  # noqa: E402
from moesd.engine.sd import SpeculativeDecoder, generate_autoregressive  # noqa: E402
from moesd.engine.static_cache import (GraphStep, StaticCaches, filled_cache, rewind, static_forward,  # noqa: E402
                                        static_step)
from moesd.zoo import get_model, noisy_copy  # noqa: E402

CONTEXT = 64
"""Tokens in the cache before the timed forward (the GPU preset's context)."""
TOLERANCE = {torch.float32: 1e-3, torch.bfloat16: 0.25}
"""Largest difference of logits (random weights: logits of order 1 to 10) taken as the same forward."""


def median_ms(step, timer: Timer, repeats: int, before=None) -> float:
    """Median milliseconds of ``step()`` over ``repeats`` calls, each after an untimed ``before()``."""
    times = []
    for _ in range(repeats):
        if before is not None:
            before()
        times.append(timer(step))
    return 1e3 * statistics.median(times)


def root_cause(error: BaseException) -> str:
    """The first error of a chain: a failed capture raises again on leaving ``torch.cuda.graph``."""
    while error.__context__ is not None:
        error = error.__context__
    return f"{type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}"


@torch.no_grad()
def probe(model, batch: int, tokens: int, device: torch.device, repeats: int = 20) -> dict:
    """Times of one forward of ``tokens`` tokens per sequence after CONTEXT cached ones: over the dynamic
    cache (what the eager forward study times), over a rewound static cache, and (on CUDA) as a graph replay."""
    vocab = model.config.vocab_size
    new = torch.randint(1, vocab, (batch, tokens), generator=torch.Generator().manual_seed(tokens)).to(device)
    positions = torch.arange(CONTEXT, CONTEXT + tokens, device=device).expand(batch, -1)
    dynamic = filled_cache(model, batch, CONTEXT, str(device))

    def dynamic_step():
        logits = model(input_ids=new, past_key_values=dynamic, use_cache=True, position_ids=positions).logits
        dynamic.crop(-tokens)
        return logits

    cache = filled_cache(model, batch, CONTEXT, str(device), static_tokens=tokens)
    static_logits = static_step(model, cache, new, CONTEXT)
    difference = (static_logits.float() - dynamic_step().float()).abs().max().item()
    timer = Timer(str(device))
    row = {"B": batch, "s": tokens, "dynamic ms": median_ms(dynamic_step, timer, repeats),
           "static ms": median_ms(lambda: static_forward(model, cache, new, CONTEXT), timer, repeats,
                                  before=lambda: rewind(cache, CONTEXT)),
           "static - dynamic logits": difference}
    if device.type != "cuda":
        return row
    try:
        step = GraphStep(model, cache, new, CONTEXT)
        row["graph ms"] = median_ms(step.replay, timer, repeats, before=step.prepare)  # as the forward study times it
        row["graph - static logits"] = (step.logits.float() - static_logits.float()).abs().max().item()
    except Exception as error:  # noqa: BLE001 - the probe's job is to report why capture fails
        row["graph ms"] = None
        row["capture error"] = root_cause(error)
        return row
    try:  # uniform routing (the studies' default) draws its experts inside the graph: each replay afresh?
        with RoutingControl(model, "uniform") as control:
            step = GraphStep(model, cache, new, CONTEXT)
            routed, draws = control.forwards[-1], []
            for _ in range(2):
                step.prepare()
                step.replay()
                draws.append(torch.cat([ids.flatten() for ids in routed]).clone())
            row["uniform graph ms"] = median_ms(step.replay, timer, repeats, before=step.prepare)
            row["uniform experts"] = distinct_experts(routed, control.num_experts)
            row["uniform redraws"] = not torch.equal(*draws)
    except Exception as error:  # noqa: BLE001
        row["capture error"] = "uniform routing: " + root_cause(error)
    return row


@torch.no_grad()
def sd_probe(device: torch.device, layers: int, width: float = 0.25) -> dict:
    """Does speculative decoding over static caches replayed as CUDA graphs (what ``moesd sweep e2e
    --cuda-graphs`` runs) emit what the same engine emits eagerly, and record fresh expert draws?

    A ``layers``-layer Qwen2-57B-A14B shape at ``width`` with a noisy copy as draft (real, ragged
    greedy acceptance), 8 prompts of 16 tokens, 12 new tokens at gamma 2 and 4: the graph runs must
    equal the eager static runs token for token (the same kernels on the same inputs); the share
    of tokens equal to the dynamic-cache greedy decoding is printed (bf16 kernels of other shapes
    may break near-ties). Then under uniform routing, the last two verifications' recorded expert
    ids must differ (each replay draws afresh and is recorded).
    """
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    target = get_model("qwen2-57b-a14b").random_model(num_layers=layers, width=width, dtype=dtype, device=device)
    draft = noisy_copy(target, 0.06)
    ids = torch.randint(1, target.config.vocab_size, (8, 16), generator=torch.Generator().manual_seed(3)).to(device)
    reference = generate_autoregressive(target, ids, max_new_tokens=12).sequences
    row = {}
    for gamma in (2, 4):
        decoder = SpeculativeDecoder(target, draft, gamma)
        runs = {graphs: decoder.generate(ids, max_new_tokens=12, static_caches=StaticCaches(16 + 11 * (gamma + 1) + 1,
                                                                                             graphs))
                for graphs in ([False, True] if device.type == "cuda" else [False])}
        eager = runs[False]
        row[f"gamma {gamma} graph = eager"] = torch.equal(runs.get(True, eager).sequences, eager.sequences)
        row[f"gamma {gamma} equal to AR"] = float((eager.sequences == reference).float().mean())
        row[f"gamma {gamma} acceptance"] = eager.stats.acceptance_rate
    with RoutingControl(target, "uniform", keep=2) as control:
        SpeculativeDecoder(target, draft, 2).generate(ids, max_new_tokens=12, static_caches=StaticCaches(
            16 + 11 * 3 + 1, device.type == "cuda", routing=control))
        last = [torch.stack(list(forward)) for forward in control.forwards]
        row["uniform redraws"] = not torch.equal(*last)
        row["uniform experts"] = distinct_experts(last[-1], control.num_experts)
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
            scale = TOLERANCE[dtype]
            failed |= not row["static - dynamic logits"] <= scale or "capture error" in row \
                or not row.get("graph - static logits", 0.0) <= scale or not row.get("uniform redraws", True)
            print("  ".join(f"{k} {v:.1e}" if "logits" in k else f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                            for k, v in row.items()),
                  flush=True)
    row = sd_probe(device, args.layers)
    print("SD over static caches: " + "  ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                                               for k, v in row.items()), flush=True)
    failed |= not all(value for key, value in row.items() if "graph = eager" in key or "redraws" in key)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
