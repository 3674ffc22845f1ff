"""Time the Algorithm 1 fit (issue 5): 21 and 228 measurements, and the robustness study over 21 strides.

Data: the shipped CPU sparsity study (data/measurements/cpu/sparsity.csv, 228 points). Medians over
repeats; run: python benchmarks/fit_speed.py
"""

from timing import median_seconds

from moesd.fit import fit_speedup_model, from_sweep, held_out_errors, robustness_study
from moesd.measurements import load
from moesd.roofline import HARDWARE

REPEATS = 7


if __name__ == "__main__":
    raw, _ = load("sparsity", "cpu")
    frame = from_sweep(raw, num_experts=64)
    rp = HARDWARE["CPU"].ridge_point
    for variant in ("eq4", "printed"):
        small = median_seconds(lambda: fit_speedup_model(frame, rp, variant=variant, stride=11), REPEATS)
        full = median_seconds(lambda: fit_speedup_model(frame, rp, variant=variant), REPEATS)
        study = median_seconds(lambda: robustness_study(frame, rp, variant=variant), 3)
        errors = held_out_errors(fit_speedup_model(frame, rp, variant=variant, stride=11), frame)
        print(f"{variant:8s}: fit of 21 points {small:.3f} s, of 228 points {full:.3f} s, robustness study "
              f"(21 fits) {study:.2f} s; 21-point fit on the 207 held back: MAPE {errors['mape']:.1f} %, "
              f"max error {errors['max_abs_error']:.2f}")
