"""Where a CPU decode step's time goes, and which preset scale a 15-minute study allows.

(a) the measured roofline of this machine (``moesd.measure.hardware.measure_roofline``, float32, torch's threads);
(b) ``decode_step_breakdown`` of each scale option's target (Qwen2-57B-A14B shape) and draft (Qwen2-0.5B
    shape) at B = 1, 8, 24, 100: weight streaming at STREAM bandwidth, the matrix products as the kernels
    run them, compute with weights in cache, per-expert dispatch, other call overhead;
(c) the duration of the e2e study (19 batch sizes x gamma 2, 3, 4 x 3 repeats) and of the sparsity study
    (x K = 1, 2, 4, 8, 16, 32, gamma 2, 4, 1 repeat) under the steady-state protocol (32 timed
    AR steps and 32 timed SD rounds per point, warm-up and model building not counted), priced by
    ``moesd.measure.sweeps.estimate_seconds`` from step times measured at B = 1, 8, 24, 48, 100 and
    interpolated linearly over the 19 batch sizes. The sparsity study takes the K = 8 step times for every
    K, or with ``--sparsity-k`` the step times measured at each K.

An option is ``LAYERS:DRAFT_LAYERS:WIDTH_DIVISOR`` (the preset is 4:3:8). Medians of ``--repeats`` timings;
on a shared machine the numbers are noisy, and 2-thread timings on an oversubscribed machine suffer
OpenMP stalls of a scheduler time slice per parallel region: re-run on a quiet one, or take
``--threads 1 --cpu-clock`` (the thread's CPU time leaves out the time it waits for a core).
The prefills are extrapolated from the step times, as ``estimate_seconds`` does.

Run: python benchmarks/decode_step.py [--options 4:3:8 1:1:7] [--threads 1 --cpu-clock] [--sparsity-k]
"""

import argparse
import json
import statistics
import time

import numpy as np
import pandas as pd
import torch

from moesd.measure.breakdown import decode_step_breakdown, expert_dispatch_seconds, forward_seconds
from moesd.measure.hardware import measure_roofline
from moesd.measure.sweeps import SweepConfig, estimate_seconds
from moesd.predictor.predict import PAPER_BATCH_SIZES
from moesd.zoo import get_model

TARGET, DRAFT, CONTEXT = "qwen2-57b-a14b", "qwen2-0.5b", 64
BREAKDOWN_BATCHES = (1, 8, 24, 100)
STUDY_BATCHES = (1, 8, 24, 48, 100)
SPARSITY_KS = (1, 2, 4, 8, 16, 32)


def step_table(model, layers, width, batches, tokens, repeats, statistic, clock, top_k=None):
    """Median (or best) forward seconds per (batch size, tokens per sequence) of one model."""
    net = get_model(model).random_model(layers, top_k, width)
    pick = min if statistic == "best" else statistics.median
    rows = [{"batch_size": b, "tokens_per_sequence": s, "seconds": pick(forward_seconds(net, b, s, CONTEXT, repeats, clock=clock))}
            for b in batches for s in tokens]
    return pd.DataFrame(rows)


def price_list(targets, drafts, top_k=None):
    """A forward study's rows (``role``, ``batch_size``, ``tokens``, ``seconds``) at the paper's 19 batch sizes,
    linear in B between the measured ones, for ``moesd.measure.sweeps.estimate_seconds``."""
    rows = []
    for role, table in (("target", targets), ("draft", drafts)):
        for s, part in table.groupby("tokens_per_sequence"):
            part = part.sort_values("batch_size")
            rows += [{"role": role, "batch_size": b, "tokens": s, "num_experts_per_tok": top_k,
                      "seconds": float(np.interp(b, part["batch_size"], part["seconds"]))} for b in PAPER_BATCH_SIZES]
    return pd.DataFrame(rows)


def study_minutes(prices, layers, draft_layers, width, top_ks=None, gammas=(2, 3, 4), repeats=3):
    """Minutes of the e2e study (or, with ``top_ks``, the sparsity study) at these step times."""
    config = SweepConfig("sparsity" if top_ks else "e2e", TARGET, DRAFT, layers=layers, draft_layers=draft_layers,
                         width=width, top_ks=top_ks, gammas=gammas, context=CONTEXT, rounds=32, warmup_rounds=0,
                         repeats=repeats, warmup=0)
    estimate = estimate_seconds(config, prices, build_seconds=0.0)
    return (estimate["timed"] + estimate["prefill"]) / 60


def option(text):
    layers, draft_layers, divisor = (int(v) for v in text.split(":"))
    return layers, draft_layers, divisor


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--options", type=option, nargs="+", default=[(4, 3, 8)])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--best", action="store_true", help="fastest repeat instead of the median")
    parser.add_argument("--cpu-clock", action="store_true",
                        help="time in the thread's CPU time (with --threads 1, on a shared machine)")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's, the sweeps' count)")
    parser.add_argument("--sparsity-k", action="store_true", help="time every K of the sparsity study")
    parser.add_argument("--no-study", action="store_true", help="breakdowns only")
    parser.add_argument("--json", help="write every table to this file")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    start = time.time()
    clock = "cpu" if args.cpu_clock else "wall"
    roofline = measure_roofline(clock=clock)
    hw = roofline.hardware
    print(f"{hw.name}: {hw.peak_flops / 1e9:.1f} GFLOP/s, {hw.memory_bandwidth / 1e9:.1f} GB/s, "
          f"ridge point {hw.ridge_point:.2f} FLOP/byte (shared machine)")
    print(roofline.gemm.assign(gflops=roofline.gemm["flop_per_s"] / 1e9)[["tokens", "gflops"]].T.to_string())
    statistic = "best" if args.best else "median"
    dispatch = expert_dispatch_seconds(TARGET, repeats=args.repeats, statistic=statistic, clock=clock)
    print(f"expert dispatch: {dispatch['per_expert_seconds'] * 1e6:.1f} us per activated expert "
          f"(fixed {dispatch['fixed_seconds'] * 1e6:.0f} us per MoE call)")
    results = {"roofline": roofline.sidecar_entries(), "dispatch": {**dispatch, "table": dispatch["table"].to_dict("records")},
               "options": []}
    columns = ["batch_size", "active_experts", "bytes", "measured_s", "streaming_s", "matmul_s", "compute_s",
               "dispatch_s", "other_overhead_s", "residual_s"]
    for layers, draft_layers, divisor in args.options:
        width = 1 / divisor
        label = f"{layers} layers, widths / {divisor} (draft {draft_layers} layers)"
        target = decode_step_breakdown(TARGET, layers, width, BREAKDOWN_BATCHES, CONTEXT, repeats=args.repeats,
                                       roofline=roofline, dispatch=dispatch, statistic=statistic,
                                       clock=clock)
        draft = decode_step_breakdown(DRAFT, draft_layers, width, BREAKDOWN_BATCHES, CONTEXT, repeats=args.repeats,
                                      roofline=roofline, statistic=statistic, clock=clock)
        for role, frame in (("target", target), ("draft", draft)):
            shown = frame[columns].copy()
            for column in columns[3:]:
                shown[column] = shown[column] * 1e3
            shown["bytes"] = shown["bytes"] / 2 ** 20
            shown["streaming %"] = 100 * frame["streaming_share"]
            shown["matmul %"] = 100 * frame["matmul_share"]
            shown["overhead %"] = 100 * (frame["dispatch_share"] + frame["other_overhead_share"])
            print(f"\n{role}, {label} (ms, MiB):")
            print(shown.to_string(index=False, float_format=lambda v: f"{v:.3g}"))
        entry = {"layers": layers, "draft_layers": draft_layers, "width": width,
                 "target": target.to_dict("records"), "draft": draft.to_dict("records")}
        counts = get_model(TARGET).parameter_counts(layers, None, width)
        draft_counts = get_model(DRAFT).parameter_counts(draft_layers, None, width)
        entry["draft_share_of_active"] = draft_counts["active"] / counts["active"]
        print(f"draft / target active parameters: {100 * entry['draft_share_of_active']:.1f} %")
        if not args.no_study:
            targets = step_table(TARGET, layers, width, STUDY_BATCHES, (1, 3, 4, 5), args.repeats, statistic, clock)
            drafts = step_table(DRAFT, draft_layers, width, STUDY_BATCHES, (1, 2), args.repeats, statistic, clock)
            prices = price_list(targets, drafts)
            entry["e2e_minutes"] = study_minutes(prices, layers, draft_layers, width)
            entry["sparsity_minutes_k8"] = study_minutes(prices.drop(columns="num_experts_per_tok"), layers,
                                                         draft_layers, width, SPARSITY_KS, (2, 4), 1)
            entry["step_table"] = targets.to_dict("records")
            entry["draft_step_table"] = drafts.to_dict("records")
            print(f"e2e study ~ {entry['e2e_minutes']:.1f} min; sparsity study with K = 8 step times for every K "
                  f"~ {entry['sparsity_minutes_k8']:.1f} min")
            if args.sparsity_k:
                per_k = pd.concat([price_list(step_table(TARGET, layers, width, STUDY_BATCHES, (1, 3, 5), args.repeats,
                                                         statistic, clock, top_k=k), drafts, top_k=k)
                                   for k in SPARSITY_KS], ignore_index=True)
                entry["sparsity_minutes"] = study_minutes(per_k, layers, draft_layers, width, SPARSITY_KS, (2, 4), 1)
                print(f"sparsity study (step times per K) ~ {entry['sparsity_minutes']:.1f} min")
        results["options"].append(entry)
    print(f"\nbenchmark took {time.time() - start:.0f} s on {torch.get_num_threads()} threads")
    if args.json:
        with open(args.json, "w") as file:
            json.dump(results, file, indent=1, default=float)


if __name__ == "__main__":
    main()
