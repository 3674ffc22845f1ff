"""Time the theory functions on a 10^6-point grid (median of repeats).

Run: python benchmarks/theory_grid.py
"""

import numpy as np
from timing import median_seconds

import moesd

REPEATS = 21
N = 1_000_000


def main() -> None:
    rng = np.random.default_rng(0)
    t = rng.uniform(1, 1000, N)
    rho = rng.uniform(1e-3, 1, N)
    K = rng.integers(1, 65, N)
    alpha = rng.uniform(0, 1, N)
    cases = {
        "expected_active_experts(t, 64, K)": (moesd.expected_active_experts, t, 64, K),
        "tokens_per_expert(t, rho)": (moesd.tokens_per_expert, t, rho),
        "full_activation_threshold(rho)": (moesd.full_activation_threshold, rho),
        "tokens_per_expert_derivative(t, rho)": (moesd.tokens_per_expert_derivative, t, rho),
        "appendix_b_f(rho, t)": (moesd.appendix_b_f, rho, t),
        "sigma(alpha, 4)": (moesd.sigma, alpha, 4),
        "alpha_from_sigma(sigma, 4)": (moesd.alpha_from_sigma, moesd.sigma(alpha, 4), 4),
        "G(t, 150, 1.01)": (moesd.G, t, 150.0, 1.01),
    }
    print(f"{N:,} points, median of {REPEATS} repeats")
    for name, (function, *args) in cases.items():
        print(f"{name:40s} {median_seconds(lambda: function(*args), REPEATS, warmup=1) * 1e3:8.1f} ms")


if __name__ == "__main__":
    main()
