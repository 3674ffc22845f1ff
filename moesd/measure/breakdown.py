"""Where a decode step's time goes: weight streaming, compute, per-expert dispatch and other overhead.

:func:`step_cost` counts the bytes a decode step of a :mod:`moesd.zoo` shape reads and the FLOPs it
does (Eq. 8's experts, the KV cache); :func:`forward_seconds` times the step as the sweeps' forward
study does; :func:`expert_dispatch_seconds` measures what one activated expert adds to a MoE layer's
call at negligible weights. :func:`decode_step_breakdown` puts them together: it splits a measured
decode step of a scaled model into weight streaming (bytes / measured bandwidth of
:mod:`moesd.measure.hardware`), per-expert dispatch and the rest of the call overhead (both
measured on the same architecture at its narrowest width, :data:`OVERHEAD_WIDTH`, where weights are
negligible), and compute (FLOPs / GEMM FLOP/s measured at the step's tokens per matrix with the
weight in cache).

Calls are timed by :func:`moesd.engine.timing.time_calls`; torch is imported inside the functions
that measure.
"""

from __future__ import annotations

import math
import statistics

import numpy as np
import pandas as pd

from moesd._checks import as_array
from moesd.measure.hardware import (RooflineMeasurement, matmul_seconds, measure_roofline, parse_device,
                                    parse_dtype, torch_threads)
from moesd.engine.timing import check_clock, time_calls
from moesd.theory.experts import expected_active_experts, tokens_per_expert

OVERHEAD_WIDTH = 1 / 256
"""Width factor of the overhead model: every width of a :mod:`moesd.zoo` shape at its floor
(hidden size two per attention head), so weights and FLOPs are negligible and a step is call overhead."""


def _check_statistic(statistic: str) -> str:
    """``statistic`` if it is ``"median"`` or ``"best"``; a ``ValueError`` otherwise."""
    if statistic not in ("median", "best"):
        raise ValueError(f"statistic must be 'median' or 'best', got {statistic!r}")
    return statistic


def _meta_model(model: str, layers: int | None, width: float, top_k: int | None = None):
    """The architecture on the meta device (shapes only, no memory) and its :class:`~moesd.zoo.ModelSpec`."""
    import torch
    from transformers import AutoModelForCausalLM

    from moesd.zoo import get_model

    spec = get_model(model)
    config = spec.hf_config(layers, top_k, width)
    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(config)
    return spec, config, meta


def step_cost(model: str = "qwen2-57b-a14b", batch_sizes=(1, 8, 24, 100), layers: int | None = 4,
              width: float = 1 / 8, context: int = 64, bytes_per_value: float = 4,
              top_k: int | None = None) -> pd.DataFrame:
    """Bytes read and FLOPs of one decode step (one new token per sequence) of a :mod:`moesd.zoo` shape.

    Bytes: every weight except the input embedding (of which only ``B`` rows are read; a tied
    embedding counts once, as the output layer), ``N(B)`` of the ``E`` experts of each MoE layer
    (Eq. 8, uniform routing) and the KV cache of ``context`` tokens per sequence. FLOPs: two per
    weight per token it multiplies (``B`` tokens for the dense weights, ``K`` experts per token) and
    ``4 B context`` per attention head width for scores and values.

    Parameters
    ----------
    model : str
        :data:`moesd.zoo.MODELS` name.
    batch_sizes : sequence of int
        Sequences B, one token each.
    layers, width, top_k
        As in :meth:`moesd.zoo.ModelSpec.config_dict`.
    context : int
        Tokens already in the KV cache of each sequence.
    bytes_per_value : float, default 4
        Bytes per weight and cache value (4 for float32, 2 for bfloat16).

    Returns
    -------
    pandas.DataFrame
        Per batch size: ``batch_size``, ``active_experts`` (per MoE layer, Eq. 8),
        ``tokens_per_expert`` (Eq. 10), ``moe_layers``, ``dense_bytes``, ``expert_bytes``,
        ``cache_bytes``, ``bytes``, ``dense_flops``, ``expert_flops``, ``attention_flops``, ``flops``.
    """
    batch = as_array("batch_sizes", list(batch_sizes), low=1, whole=True).ravel()
    as_array("context", context, low=0, whole=True)
    as_array("bytes_per_value", bytes_per_value, low=0, low_open=True)
    spec, config, meta = _meta_model(model, layers, width, top_k)
    experts = {name: p for name, p in meta.named_parameters() if ".mlp.experts." in name}
    moe_layers = len({name.split(".mlp.experts.")[0] for name in experts})
    embedding = meta.get_input_embeddings().weight
    tied = embedding is meta.get_output_embeddings().weight
    dense = [p for name, p in meta.named_parameters() if name not in experts and (tied or p is not embedding)]
    dense_values = sum(p.numel() for p in dense)
    dense_weights = sum(p.numel() for p in dense if p.dim() == 2)
    E, K = (spec.num_experts, config.num_experts_per_tok) if spec.is_moe else (1, 0)
    values_per_expert = sum(p.numel() for p in experts.values()) / max(moe_layers, 1) / E
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    active = expected_active_experts(batch, E, K) if spec.is_moe else np.zeros_like(batch)
    per_expert = tokens_per_expert(batch, K / E) if spec.is_moe else np.zeros_like(batch)
    cache_values = 2 * config.num_hidden_layers * batch * context * kv_heads * head_dim
    frame = pd.DataFrame({
        "batch_size": batch.astype(int), "active_experts": active, "tokens_per_expert": per_expert,
        "moe_layers": moe_layers,
        "dense_bytes": float(dense_values * bytes_per_value),
        "expert_bytes": active * moe_layers * values_per_expert * bytes_per_value,
        "cache_bytes": cache_values * bytes_per_value,
        "dense_flops": 2.0 * batch * dense_weights,
        "expert_flops": 2.0 * batch * K * moe_layers * values_per_expert,
        "attention_flops": 4.0 * batch * context * heads * head_dim * config.num_hidden_layers,
    })
    frame["bytes"] = frame["dense_bytes"] + frame["expert_bytes"] + frame["cache_bytes"]
    frame["flops"] = frame["dense_flops"] + frame["expert_flops"] + frame["attention_flops"]
    return frame


def forward_seconds(model, batch_size: int, tokens_per_sequence: int = 1, context: int = 64,
                    repeats: int = 7, seed: int = 0, clock: str = "wall") -> list[float]:
    """Seconds of each of ``repeats`` forwards of ``tokens_per_sequence`` new tokens for ``batch_size`` sequences.

    The timing of the sweeps' forward study: a KV cache of ``context`` tokens is filled first; every
    timed forward extends it and is cropped off again; one untimed forward comes first.
    """
    import torch

    device = next(model.parameters()).device
    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        prompt = torch.randint(1, vocab, (batch_size, context), generator=generator).to(device)
        cache = model(input_ids=prompt, use_cache=True).past_key_values
        new = torch.randint(1, vocab, (batch_size, tokens_per_sequence), generator=generator).to(device)
        positions = torch.arange(context, context + tokens_per_sequence, device=device).expand(batch_size, -1)

        return time_calls(lambda: model(input_ids=new, position_ids=positions, past_key_values=cache, use_cache=True),
                           repeats, device, after=lambda: cache.crop(-tokens_per_sequence),  # a negative count
                           clock=clock)


def expert_dispatch_seconds(model: str = "qwen2-57b-a14b", dtype: str = "float32", device: str = "cpu",
                            repeats: int = 7, width: float = OVERHEAD_WIDTH, statistic: str = "median",
                            clock: str = "wall") -> dict:
    """Seconds one activated expert adds to a MoE layer's call, at negligible weights.

    Times the routed-experts module of one layer of ``model`` at ``width`` (every width at its floor:
    the weights fit in the first cache levels and the FLOPs are negligible) with routing built to
    activate exactly ``n`` of the ``E`` experts, for ``n = K, 2K, ..., E``, and fits the medians
    (``statistic="best"``: the fastest of the repeats) by a line: its slope is the per-expert
    dispatch cost (the loop's indexing, two matrix products, activation, scaling and scatter of one
    expert), its intercept the call's fixed cost.

    Returns
    -------
    dict
        ``per_expert_seconds`` (slope), ``fixed_seconds`` (intercept) and ``table``
        (a DataFrame of ``experts``, ``median_seconds`` and ``best_seconds``).
    """
    import torch

    from moesd.zoo import get_model

    spec = get_model(model)
    if not spec.is_moe:
        raise ValueError(f"model must be a MoE architecture; {model} is dense")
    device = parse_device(device)
    net = spec.random_model(1, None, width, dtype=parse_dtype(dtype), device=device)
    experts = next(module for name, module in net.named_modules() if name.endswith("mlp.experts"))
    E, K = spec.num_experts, spec.top_k
    tokens = E
    hidden = torch.randn(tokens, net.config.hidden_size, dtype=net.dtype, device=device)
    weights = torch.full((tokens, K), 1.0 / K, dtype=net.dtype, device=device)
    rows = []
    with torch.no_grad():
        for n in range(K, E + 1, K):
            index = (torch.arange(tokens)[:, None] * K + torch.arange(K)[None, :]) % n
            index = index.to(device)
            seconds = time_calls(lambda: experts(hidden, index, weights), repeats, device, clock=clock)
            rows.append({"experts": n, "median_seconds": statistics.median(seconds), "best_seconds": min(seconds)})
    table = pd.DataFrame(rows)
    slope, intercept = np.polyfit(table["experts"], table[f"{_check_statistic(statistic)}_seconds"], 1)
    return {"per_expert_seconds": float(slope), "fixed_seconds": float(intercept), "table": table}


def _step_matmuls(seconds: dict, dense_shapes, expert_shapes, batch_size: int, tokens_per_expert: float,
                  experts: float, call: dict) -> float:
    """Seconds of a step's matrix products, net of the call cost: dense weights at M = B, experts at M = T_exp."""
    total = sum(seconds[out, inp, batch_size] - call[batch_size] for out, inp in dense_shapes)
    if experts:
        low, high = max(1, math.floor(tokens_per_expert)), max(1, math.ceil(tokens_per_expert))
        for out, inp in expert_shapes:
            at = [seconds[out, inp, low] - call[low], seconds[out, inp, high] - call[high]]
            total += experts * float(np.interp(tokens_per_expert, [low, high + (high == low)], at))
    return total


def decode_step_breakdown(model: str = "qwen2-57b-a14b", layers: int | None = 1, width: float = 1.0,
                          batch_sizes=(1, 8, 24, 100), context: int = 64, dtype: str = "bfloat16",
                          device: str = "cpu", threads: int | None = None, repeats: int = 7,
                          roofline: RooflineMeasurement | None = None, dispatch: dict | None = None,
                          statistic: str = "median", clock: str = "wall", seed: int = 0) -> pd.DataFrame:
    """Where a measured decode step of a scaled model goes: weights, compute, dispatch, other overhead.

    For each batch size ``B`` (one new token per sequence over a KV cache of ``context`` tokens):

    * ``measured_s``: median (or best) step time of ``model`` at ``layers`` and ``width`` (random weights,
      the sweeps' experts implementation);
    * ``streaming_s``: :func:`step_cost`'s bytes (dense weights, ``N(B)`` experts per MoE layer by
      Eq. 8, KV cache) over the measured STREAM bandwidth: the floor weight streaming sets;
    * ``compute_s``: the step's matrix products timed one by one with the weight in cache (dense
      weights at ``M = B``, each of the ``N(B)`` experts at ``M = T_exp(B)`` of Eq. 10, interpolated
      between whole M): FLOPs over the GEMM FLOP/s measured at the relevant M;
    * ``matmul_s``: the same products with every weight read from memory, as in the step: weight
      streaming and compute as the kernels achieve them (a matrix-vector product reads its weight
      slower than STREAM copies);
    * ``dispatch_s``: :func:`expert_dispatch_seconds` per expert x ``N(B)`` x MoE layers;
    * ``other_overhead_s``: the step of the same architecture at :data:`OVERHEAD_WIDTH` (weights
      negligible) minus its expert dispatch: every other call's fixed cost;
    * ``residual_s = measured - (matmul + dispatch + other overhead)``.

    The products' times are net of the cost of a call (a 2 x 2 weight at the same M), which the
    overhead parts already hold. Shares are of ``measured_s``; streaming and compute overlap
    inside ``matmul_s``, so their shares need not add up.

    Parameters
    ----------
    model, layers, width : as in :meth:`moesd.zoo.ModelSpec.random_model`
        Default: the CPU preset's target (Qwen2-57B-A14B shape, one layer at real width, in bf16).
    batch_sizes : sequence of int
    context : int
    dtype, device : str
    threads : int, optional
        torch threads (default: as they are).
    repeats : int
        Timed repeats of every timing.
    roofline : moesd.measure.hardware.RooflineMeasurement, optional
        Measured roofline for the bandwidth (default: :func:`moesd.measure.hardware.measure_roofline` now).
    dispatch : dict, optional
        A :func:`expert_dispatch_seconds` result to reuse (default: measured now, for MoE models).
    statistic : str, default "median"
        Each timing's median over the repeats, or ``"best"``: the fastest repeat (on a shared
        machine, interference only ever adds time).
    clock : str, default "wall"
        ``"cpu"``: every timing in the thread's CPU time (one torch thread on a shared CPU).
    seed : int

    Returns
    -------
    pandas.DataFrame
        :func:`step_cost`'s columns plus ``model``, ``layers``, ``width``, ``measured_s``,
        ``streaming_s``, ``compute_s``, ``matmul_s``, ``dispatch_s``, ``other_overhead_s``,
        ``residual_s`` and the shares ``streaming_share``, ``compute_share``, ``matmul_share``,
        ``dispatch_share``, ``other_overhead_share``, ``residual_share``.
    """
    import torch

    from moesd.zoo import get_model

    parse_device(device)
    torch_dtype = parse_dtype(dtype)
    pick = {"median": statistics.median, "best": min}[_check_statistic(statistic)]
    spec = get_model(model)
    bytes_per_value = torch.tensor([], dtype=torch_dtype).element_size()
    cost = step_cost(model, batch_sizes, layers, width, context, bytes_per_value)
    batch = [int(b) for b in cost["batch_size"]]
    _, _, meta = _meta_model(model, layers, width)
    embedding = meta.get_input_embeddings().weight
    dense_shapes = [tuple(p.shape) for name, p in meta.named_parameters()
                    if p.dim() == 2 and ".mlp.experts." not in name and p is not embedding]
    dense_shapes += [] if embedding is not meta.get_output_embeddings().weight else [tuple(embedding.shape)]
    expert_names = [name for name, _ in meta.named_parameters() if ".mlp.experts." in name]
    first_layer = expert_names[0].split(".mlp.experts.")[0] + ".mlp.experts." if expert_names else None
    expert_shapes = [tuple(p.shape[1:]) for name, p in meta.named_parameters()
                     if first_layer and name.startswith(first_layer)]
    expert_tokens = {max(1, f(t)) for t in cost["tokens_per_expert"] for f in (math.floor, math.ceil)}
    with torch_threads(threads):
        check_clock(clock, device)
        roofline = roofline or measure_roofline(device, dtype, clock=clock)
        if spec.is_moe and dispatch is None:
            dispatch = expert_dispatch_seconds(model, dtype, device, repeats, statistic=statistic, clock=clock)
        per_expert = dispatch["per_expert_seconds"] if spec.is_moe else 0.0
        step = {}
        for scale in (width, OVERHEAD_WIDTH):
            net = spec.random_model(layers, None, scale, seed=seed, dtype=torch_dtype, device=device)
            for b in batch:
                step[scale, b] = pick(forward_seconds(net, b, 1, context, repeats, seed, clock))
            del net
        all_tokens = set(batch) | expert_tokens
        call = matmul_seconds([(2, 2)], all_tokens, dtype, device, repeats, False, statistic, clock)
        call = {m: call[2, 2, m] for m in all_tokens}
        products = {}
        for from_memory in (False, True):
            products[from_memory] = matmul_seconds(dense_shapes, batch, dtype, device, repeats, from_memory,
                                                    statistic, clock)
            products[from_memory].update(matmul_seconds(expert_shapes, expert_tokens, dtype, device, repeats,
                                                         from_memory, statistic, clock))
    rows = []
    for _, row in cost.iterrows():
        b = int(row["batch_size"])
        experts = row["active_experts"] * row["moe_layers"]
        compute, matmul = (_step_matmuls(products[cold], dense_shapes, expert_shapes, b, row["tokens_per_expert"],
                                         experts, call) for cold in (False, True))
        dispatch_s = per_expert * experts
        other = step[OVERHEAD_WIDTH, b] - dispatch_s
        rows.append({"model": model, "layers": layers, "width": width, "measured_s": step[width, b],
                     "streaming_s": row["bytes"] / roofline.hardware.memory_bandwidth, "compute_s": compute,
                     "matmul_s": matmul, "dispatch_s": dispatch_s, "other_overhead_s": other,
                     "residual_s": step[width, b] - matmul - dispatch_s - other})
    frame = pd.concat([cost, pd.DataFrame(rows)], axis=1)
    for part in ("streaming", "compute", "matmul", "dispatch", "other_overhead", "residual"):
        frame[f"{part}_share"] = frame[f"{part}_s"] / frame["measured_s"]
    return frame
