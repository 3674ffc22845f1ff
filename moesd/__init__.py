"""moesd: reproduce and extend *MoESD: Unveil Speculative Decoding's Potential for Accelerating Sparse MoE*.

The theory (:mod:`moesd.theory.experts`, :mod:`moesd.theory.speedup`, :mod:`moesd.theory.roofline`) is pure numpy;
importing ``moesd`` never imports torch. Measurement modules import torch when they are used.
The speedup of Eq. 4 is ``moesd.theory.speedup.speedup``: ``moesd.theory.speedup`` is the module.
"""

from moesd.theory.experts import (
    appendix_b_f,
    expected_active_experts,
    expected_active_experts_from_popularity,
    full_activation_threshold,
    tokens_per_expert,
    tokens_per_expert_derivative,
)
from moesd.theory.growth import G
from moesd.theory.roofline import HARDWARE, Hardware, ridge_point
from moesd.theory.speedup import (
    alpha_from_sigma,
    expected_tokens_per_round,
    leviathan_speedup,
    min_target_efficiency,
    sd_time,
    sigma,
    speedup_terms,
    target_efficiency,
)

__version__ = "0.1.0"

__all__ = [
    "G", "HARDWARE", "Hardware", "alpha_from_sigma", "appendix_b_f", "expected_active_experts",
    "expected_active_experts_from_popularity", "expected_tokens_per_round",
    "full_activation_threshold", "leviathan_speedup", "min_target_efficiency", "ridge_point",
    "sd_time", "sigma", "speedup_terms", "target_efficiency", "tokens_per_expert",
    "tokens_per_expert_derivative",
]
