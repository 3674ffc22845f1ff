"""Time the Algorithm 1 fit: 21 and 228 measurements, and the robustness study over 21 strides.

Data: the 1/8-width CPU sparsity study (data/measurements/cpu-dispatch/sparsity.csv, 228 points) with the ridge
point in tokens of the roofline measured with it (its sidecar). Medians over repeats, after one untimed warm-up; the machine may be shared with
other work, so compare before and after in one session and report medians. Uses only names that
``moesd.model.fit`` has always had, so the same script times an older ``moesd.model.fit`` put in its place.

Run: python benchmarks/fit_speed.py [REPEATS]   (default 21; the studies run REPEATS // 3 times)
"""

import sys

from timing import median_seconds

from moesd.model.diagnostics import held_out_errors, robustness_study
from moesd.model.fit import fit_speedup_model
from moesd.model.measurements import from_sweep
from moesd.measure.studies import load
from moesd.measure.analysis import ridge_tokens_for

if __name__ == "__main__":
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 21
    raw, sidecar = load("sparsity", "cpu-dispatch")
    frame = from_sweep(raw, num_experts=64)
    rp = ridge_tokens_for(sidecar)
    for variant in ("eq4", "printed"):
        small = median_seconds(lambda: fit_speedup_model(frame, rp, variant=variant, stride=11), repeats, warmup=1)
        full = median_seconds(lambda: fit_speedup_model(frame, rp, variant=variant), repeats, warmup=1)
        study = median_seconds(lambda: robustness_study(frame, rp, variant=variant), max(3, repeats // 3), warmup=1)
        result = fit_speedup_model(frame, rp, variant=variant, stride=11)
        errors = held_out_errors(result, frame)
        evaluations = getattr(result, "nfev", "?")
        print(f"{variant:8s}: fit of 21 points {1e3 * small:.1f} ms ({evaluations} evaluations), of 228 points "
              f"{1e3 * full:.1f} ms, robustness study (21 fits) {study:.3f} s; medians of {repeats} "
              f"(study: {max(3, repeats // 3)}); 21-point fit on the 207 held back: MAPE {errors['mape']:.2f} %, "
              f"max error {errors['max_abs_error']:.3f}")
