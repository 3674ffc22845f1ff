"""Time moesd.predictor.predict: a 10^4-point predict_sd grid and the `moesd predict` command (medians of repeats).

Run: python benchmarks/predict_speed.py
"""

import subprocess
import sys
from pathlib import Path

import numpy as np
from timing import median_seconds

from moesd.predictor.predict import predict_sd
from moesd.predictor.setup import Setup

REPEATS = 11
COMMAND = ["-m", "moesd.cli", "predict", "--target", "deepseek-v3", "--draft", "deepseek-v3-mtp", "--hardware",
           "H200", "--tp", "8", "--dtype", "fp8", "--gamma", "1-5", "--sigma", "0.8", "--batch", "1-256"]


def main() -> None:
    setup = Setup("deepseek-v3", "deepseek-v3-mtp", "H200", tp=8, context=512)
    grid = median_seconds(lambda: predict_sd(setup, np.arange(1, 2001), np.arange(1, 6), 0.8), REPEATS, warmup=1)
    print(f"predict_sd, 2,000 batch sizes x 5 gammas = 10^4 rows: {1e3 * grid:.1f} ms (median of {REPEATS})")
    root = Path(__file__).resolve().parents[1]
    command = median_seconds(lambda: subprocess.run([sys.executable, *COMMAND], cwd=root, check=True,
                                                    capture_output=True), 5, warmup=1)
    print(f"moesd predict (DeepSeek-V3 on 8 x H200, B 1-256, gamma 1-5), whole process: {command:.2f} s "
          "(median of 5)")


if __name__ == "__main__":
    main()
