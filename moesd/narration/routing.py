"""Trained routing in words: Fig. 1 judged on trained routers, and the peak moved by popularity routing.
"""

from __future__ import annotations


from moesd.narration.phrases import join, number
from moesd.paper.criteria import UNTESTABLE


_UNTESTABLE = {
    "windows": "measured windows of consecutive tokens (too few sequences)",
    "batches": "batches of sequences (too few sequences per layer)",
    "decode": "decoding: every source routed given text in one pass (a prefill), none generated tokens",
    "paper_models": "the paper's own routers (DeepSeek-V2-Lite-Chat, Qwen1.5-MoE-Chat): no open data of them here",
}


def fig1_summary(judgement) -> str:
    """One line: the Fig. 1 claim's status on trained routers under both readings."""
    return (f"Fig. 1 on trained routers: {judgement.status} (material reading: within "
            f"{100 * (1 - judgement.tolerance):.0f} % of Eq. 8); {judgement.strict_status} (strict: beyond noise)")


def fig1_sentence(judgement) -> str:
    """What the judgement says per part, in words: the skew per model, the windows, and what was not testable."""
    parts = judgement.parts
    skew = parts[(parts["part"] == "skew") & (parts["scope"] != "all")]
    models = "; ".join(f"{row.scope}: {row.material} (worst {number(row.worst_ratio)} of Eq. 8, {row.where})"
                       for row in skew.itertuples())
    windows = parts[parts["part"] == "windows"].iloc[0]
    window_text = (f"windows of consecutive tokens: {windows['material']} (worst {number(windows['worst_ratio'])} of "
                   f"Eq. 8, {windows['where']})" if windows["material"] != UNTESTABLE else "")
    untestable = "; ".join(_UNTESTABLE.get(part, part) for part, _ in judgement.untestable)
    return join(f"Skew alone, per model: {models}", window_text, f"Not testable here: {untestable}")


def popularity_peak_sentence(comparison, predicted_change: float) -> str:
    """The measured change of the target-efficiency peak under popularity routing, its noise, and the prediction."""
    within = abs(comparison.peak_change) <= 3 * comparison.peak_change_se
    return (f"Under popularity routing the peak moved from {number(comparison.uniform_peak['value'])} at B = "
            f"{comparison.uniform_peak['batch_size']} to {number(comparison.popularity_peak['value'])} at B = "
            f"{comparison.popularity_peak['batch_size']}: a change of {comparison.peak_change:+.3f} "
            f"(standard error {comparison.peak_change_se:.3f}, {'within' if within else 'beyond'} three standard "
            f"errors), against {predicted_change:+.3f} predicted")
