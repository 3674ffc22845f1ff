"""The predictor's recommendation in words: where SD pays, the error band, the setup and notes of the
report ``moesd predict`` prints.
"""

from __future__ import annotations

import numpy as np
import pandas as pd




def batch_runs(chosen, sizes) -> str:
    """The batch sizes ``chosen`` out of ``sizes`` as unbroken runs: ``B = 1, 4-256`` (``no batch size`` when none
    is chosen)."""
    if not len(chosen):
        return "no batch size"
    sizes = np.asarray(sizes)
    inside = np.isin(sizes, np.asarray(chosen))
    starts = np.flatnonzero(inside & ~np.r_[False, inside[:-1]])
    ends = np.flatnonzero(inside & ~np.r_[inside[1:], False])
    return "B = " + ", ".join(f"{sizes[a]}" if a == b else f"{sizes[a]}-{sizes[b]}" for a, b in zip(starts, ends))


def where_sd_pays(advice, margin: float) -> str:
    """Where SD is on, marginal or off at one acceptance value (a :class:`moesd.predictor.recommend.Advice`),
    and whether the host cost decides it; not judged where nothing fits."""
    sizes = advice.best["batch_size"].to_numpy()
    if not advice.judged:
        return "not judged: nothing fits (the speedups below assume a batch size did)"
    if not len(advice.on) and not len(advice.marginal):
        text = "SD's error band reaches 1 or below at every one of these batch sizes: leave it off"
    else:
        parts = [f"SD pays (the best speedup's error band above {1 + margin:g}) at {len(advice.on)} of {len(sizes)} "
                 "batch sizes"
                 + (f", {batch_runs(advice.on, sizes)}" if len(advice.on) else "")]
        if len(advice.marginal):
            parts.append(f"marginal (the band's low end 1-{1 + margin:g}) at {batch_runs(advice.marginal, sizes)}")
        text = "; ".join(parts)
    if advice.host_decides:
        text += (f" (this depends on the host cost: at --host-ms {advice.other_host_ms:.2g} SD is on at "
                 + batch_runs(advice.on_at_other_host, sizes)
                 + ")")
    return text


def _thinned(best: pd.DataFrame) -> pd.DataFrame:
    """A readable table: the powers of two and the ends, when there are more than 24 rows."""
    if len(best) <= 24:
        return best
    keep = {int(b) for b in best["batch_size"] if b & (b - 1) == 0} | {int(best["batch_size"].iloc[0]),
                                                                       int(best["batch_size"].iloc[-1])}
    return best[best["batch_size"].isin(keep)]


def acceptance_label(advice, length: str | None = None) -> str:
    """``alpha = 0.8``: the acceptance value of an advice; with ``length`` (``--acceptance-length``'s ``L@g``)
    the first draft position's alpha it gave."""
    if length is None:
        return f"{advice.column} = {advice.value:g}"
    return f"alpha = {advice.value:.3f} (the first draft position's, from --acceptance-length {length})"


def peak_edge_phrase(advice) -> str:
    """Where the peak lies at an end of the batch sizes asked for, and which way to look further."""
    if advice.peak_edge is None:
        return ""
    return (f" (at the {advice.peak_edge} batch size asked; try "
            f"{'larger' if advice.peak_edge == 'largest' else 'smaller'} --batch)")


def advice_report(advice, margin: float, length: str | None = None) -> str:
    """One acceptance value's headline and table of the best gamma per batch size (``length``: as
    :func:`acceptance_label` takes it)."""
    shown = _thinned(advice.best)
    table = shown.assign(t_target_1=shown["t_target_1"] * 1e3, t_target_gamma=shown["t_target_gamma"] * 1e3,
                         t_draft=shown["t_draft"] * 1e3)[
        ["batch_size", "gamma", "speedup", "speedup_low", "speedup_high", "sd", "target_efficiency", "draft_term",
         "t_target_1", "t_target_gamma", "t_draft"]].rename(columns={
            "gamma": "best gamma", "speedup_low": "band low", "speedup_high": "band high", "sd": "SD",
            "t_target_1": "T_T(B,1) ms", "t_target_gamma": "T_T(B,g+1) ms", "t_draft": "T_D(B,1) ms"})
    band = (", the paper's x / sqrt(2) band (>= peak / sqrt(2) and > 1) "
            + (f"B = {advice.band[0]}" if advice.band[0] == advice.band[1] else f"B = {advice.band[0]}-{advice.band[1]}")
            if advice.band else "")
    return (f"\n{acceptance_label(advice, length)}: {where_sd_pays(advice, margin)}; peak speedup {advice.peak:.2f}x "
            f"at B = {advice.peak_batch_size}{peak_edge_phrase(advice)}{band}"
            + (" (rows shown: powers of two and the ends)" if len(shown) < len(advice.best) else "") + "\n"
            + table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))


def routing_source_line(name: str) -> str:
    """The line ``moesd predict`` prints for ``--routing-source``: whose routing prices the experts, under what
    licence."""
    from moesd.routing import sources

    info = sources.info(name)
    return (f"routing: the experts of each MoE layer are priced under {name}'s per-layer popularity ({info.checkpoint}, "
            f"{info.licence}; recorded layers mapped onto the target's in turn), tokens drawn independently; default "
            "uniform routing (Eq. 8)")


def predict_setup(setup, target: str, draft: str, other_host_ms: float) -> str:
    """The first line of ``moesd predict``: the deployment (a :class:`moesd.predictor.setup.Setup`, its models as
    ``target`` and ``draft`` name them) and what the model prices (the draft's dtype, a tree's candidates and verified
    tokens, the KV cache's dtype, the sampling temperature where not the defaults; the nodes a ``tp`` beyond one node
    spans)."""
    hardware, tp = setup.hardware, setup.tp
    nodes = (f"; --tp {tp} spans {-(-tp // hardware.gpus_per_node)} nodes of {hardware.gpus_per_node} "
             f"{hardware.name} joined by their network" if tp > hardware.gpus_per_node else "")
    parallel = f"ep {setup.ep}" + (", attention data-parallel" if setup.dp_attention else "")
    drafting = ", ".join(part for part in [
        f"{setup.draft_dtype} weights" if setup.draft_dtype not in (None, setup.dtype) else "",
        f"{setup.draft_topk} candidates per position" if setup.draft_topk != 1 else "",
        f"{setup.tree_tokens} tokens verified per sequence" if setup.tree_tokens is not None else ""] if part)
    where = ("(no GPU pass: the drafts are looked up in the context)" if setup.drafting == "free"
             else f"on {setup.draft_gpus} GPU(s)")
    extras = "".join([f", {setup.kv_dtype} KV cache" if setup.kv_dtype else "",
                      f", sampling at temperature {setup.temperature:g}" if setup.temperature else
                      (", greedy verification" if setup.temperature == 0 else "")])
    line = (f"{target} on {tp} x {hardware.name} ({parallel}), draft {draft} {where}"
            + (f" ({drafting})" if drafting else "")
            + f", {setup.dtype}{extras}, context {setup.context} tokens{nodes}; speedup of Eq. 4 predicted by "
            "moesd.predictor.predict ")
    step_ms = None if setup.step_seconds is None else setup.step_seconds * 1e3
    if setup.engine is not None or step_ms is not None:
        return line + ("(roofline at achieved fractions of data-sheet peaks"
                       + (f", {setup.engine.name}'s profile" if setup.engine is not None else "")
                       + (f", a fixed cost per forward pass that makes the plain step at B = {setup.step_batch_size} "
                          f"your measured {step_ms:g} ms" if step_ms is not None else "")
                       + (f", the round at gamma {setup.sd_step_gamma} your measured "
                          f"{setup.sd_step_seconds * 1e3:g} ms" if setup.sd_step_seconds is not None else "") + ")")
    host_ms = setup.host_seconds * 1e3
    return (line + f"(roofline at achieved fractions of data-sheet peaks, host cost {host_ms:g} ms per forward pass"
            + (f"; for a serving engine give --engine-profile and --step-ms, or --host-ms a host cost per forward "
               f"pass, e.g. {other_host_ms:.2g} ms from vLLM v0's own profile, moesd.paper.predictor_check"
               if host_ms == 0 else "") + ")")


def band_line(recommendation, margin: float) -> str:
    """What the error band is (:class:`moesd.predictor.band.ErrorBand`) and how the SD calls use it."""
    band = recommendation.band
    how = {"device": "the GPUs' work only", "profile": "an engine profile without a measured step",
           "anchored": "an engine profile and a measured plain step"}[band.variant]
    return (f"error band: published speedups have come out at {band.low:.2f}x to {band.high:.2f}x of predictions "
            f"made as this one is ({how}; the range over the {band.points} points of {band.sources} sources in "
            f"data/engines/published_speedups.csv, which held for {band.loso_covered} of them when each source was "
            f"left out of the calibration); SD is on only where the band's low end exceeds {1 + margin:g}")


def engine_range(engine: str, recommendation, length: str | None = None) -> str:
    """The sensitivity line: where SD is on at both ends of an engine profile's published cost ranges (``length``:
    as :func:`acceptance_label` takes it); the constants' spread, not the model's error (that is the band)."""
    sizes = recommendation.judged
    lines = [f"\nsensitivity to {engine}'s published cost ranges (moesd.predictor.engine.ENGINES; the constants' "
             "spread, not the model's error):"]
    for advice, low, high in zip(recommendation.advice, *(recommendation.engine_ends[e] for e in ("low", "high"))):
        runs = [batch_runs(on, sizes) for on in (low, high)]
        lines.append(f"  {acceptance_label(advice, length)}: SD is on at {runs[0]} with the costs that favour it, "
                     f"at {runs[1]} with those that disfavour it")
    return "\n".join(lines)


STEP_NOTE = ("note: a measured plain step (--step-ms, at --step-batch sequences) makes the prediction clearly more "
             "accurate against published engine measurements: the book's page \"Appendix: where SD pays, the "
             "audit\", section \"Against serving engines\", scores the profile with and without one")
"""What ``moesd predict --engine-profile`` without ``--step-ms`` notes."""


def predict_notes(recommendation, setup) -> list:
    """Notes on the draft (an EAGLE-3 head's own vocabulary; a head priced on GPUs of its own; the n-gram drafter's
    zero draft cost), on sampling at a temperature, and :data:`STEP_NOTE` for an engine profile without a measured
    step."""
    notes = [STEP_NOTE] if setup.engine is not None and setup.step_seconds is None else []
    if setup.temperature:
        notes.append("note: at a temperature above 0 give the acceptance measured at that temperature (rejection "
                     "sampling accepts fewer drafts than greedy verification); the plain step and the round pay "
                     "the sampling kernels over the vocabulary (moesd.predictor.kernels.sampling_time)")
    if setup.drafting == "free":
        notes.append("note: the n-gram drafter looks its drafts up in the context on the host: its draft cost is "
                     "priced at zero, and its acceptance is the text's (give the one measured on your workload)")
    if not recommendation.draft_head:
        return notes
    target_vocab, draft_vocab = recommendation.vocabularies
    parts = []
    if draft_vocab != target_vocab:
        parts.append(f"the draft is an EAGLE-3 head; its {draft_vocab}-token vocabulary maps onto the target's "
                     f"{target_vocab} tokens")
    if setup.drafting != "free" and setup.draft_gpus < setup.tp:
        parts.append(f"engines run a draft head on the target's GPUs: --draft-tp {setup.tp} prices that, --draft-tp "
                     f"{setup.draft_gpus} prices it on {setup.draft_gpus} GPU(s) of its own")
    return ([f"note: {'; '.join(parts)}"] if parts else []) + notes


def memory_lines(recommendation, batch_sizes) -> list:
    """What does not fit, with the changes that make more of ``batch_sizes`` fit
    (:class:`moesd.predictor.recommend.Shortfall`), and which batch sizes the advice covers."""
    batch = np.asarray(batch_sizes)
    hardware = recommendation.hardware
    lines = []
    for short in recommendation.shortfalls:
        flag, dtype = ("--tp", "--dtype") if short.role == "target" else ("--draft-tp", "--draft-dtype")
        remedies = ([f"{flag} {' or '.join(map(str, short.more_gpus))}"] if short.more_gpus else []) \
            + ([f"--dp-attention at --tp {' or '.join(map(str, short.dp_attention_gpus))}"]
               if short.dp_attention_gpus else []) \
            + ([f"{dtype} {' or '.join(short.smaller_dtypes)}"] if short.smaller_dtypes else []) \
            + (["a shorter --context"] if short.shorter_context else [])
        lines.append(f"does not fit: the {short.role}'s weights and KV cache"
                     + (" (with the draft head's on the same GPUs)" if short.holds_draft else "")
                     + f" need {short.largest_bytes / 1e9:.0f} GB per GPU at B = {batch.max()}"
                     + (f" ({short.smallest_bytes / 1e9:.0f} GB at B = {batch.min()})" if len(batch) > 1 else "")
                     + f" on {short.gpus} GPU(s); one {hardware.name} holds {short.capacity_bytes / 1e9:.0f} GB"
                     + (f" (try {'; '.join(remedies)})." if remedies else
                        "; no other GPU count, dtype or context moesd prices makes more of them fit."))
    fits = recommendation.fits
    if not fits.all():
        lines.append(f"Only B <= {batch[fits].max()} fits ({fits.sum()} of {len(batch)} batch sizes; activations and "
                     "the engine's workspace not counted); the summary below covers those." if fits.any()
                     else "No batch size fits; the numbers below assume one did.")
    return lines


def sd_legend(margin: float) -> str:
    """The last paragraph of ``moesd predict``: what on, marginal and off mean and what the table's terms are."""
    return (f"\nSD: on where the low end of the best gamma's error band (band low) exceeds {1 + margin:g}, marginal "
            f"where it exceeds 1 by less (a margin of {100 * margin:g} %), else off: off unless the band is above 1. "
            "draft_term: gamma T_D(B,1) / T_T(B,1), the draft's "
            "share of Eq. 4's denominator; target_efficiency: T_T(B,1) / T_T(B,gamma+1), where T_T(B,g+1) is the "
            "verification pass (of a tree's verified tokens for a tree).")


def shape_columns(shape, batch_sizes: int) -> dict:
    """The columns the tables of *Where SD pays* show for a :class:`moesd.predictor.predict.SpeedupShape` of a
    prediction over ``batch_sizes`` batch sizes (of which those that fit memory are the shape's)."""
    return {
        "B that fit": f"{shape.batch_sizes} of {batch_sizes}, up to {shape.largest_batch_size}",
        "speedup at B = 1": shape.at_one,
        "lowest before peak": shape.lowest_before_peak,
        "at B": shape.lowest_before_peak_at,
        "peak speedup": shape.peak,
        "B at peak": shape.peak_at,
        "best gamma at peak": shape.peak_gamma,
        "B range >= peak/sqrt(2), > 1": "none" if shape.band_low is None else f"{shape.band_low}-{shape.band_high}",
    }
