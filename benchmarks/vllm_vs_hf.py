"""A tiny e2e sweep through vLLM and through moesd's own engine on the same models, and their result files compared.

Run in .venv-vllm (``make vllm``): ``.venv-vllm/bin/python benchmarks/vllm_vs_hf.py [OUT_DIR] [--quick]``.
Saves the tiny random-weight pair of ``moesd.measure.vllm_engine.save_tiny_models`` in ``OUT_DIR/models``, runs
``moesd sweep e2e`` with ``--engine vllm`` and ``--engine hf`` (real greedy acceptance, B = 1, 4, 16, gamma = 2, 3,
two repeats; ``--quick``: B = 1, gamma = 2, one repeat) into ``OUT_DIR/vllm`` and ``OUT_DIR/hf``, and prints both
files side by side: the columns, the columns vLLM leaves empty, sigma (which must agree: same models, prompts and
rounds under greedy acceptance) and the times, as medians over repeats.
"""

import subprocess
import sys
from pathlib import Path

import pandas as pd

from moesd.measure import studies as measurements
from moesd.measure.vllm_engine import save_tiny_models

KEYS = ["run", "batch_size", "gamma"]
SHOWN = ["t_ar", "t_sd", "sigma", "speedup"]


def main(out_dir: Path, quick: bool) -> None:
    paths = save_tiny_models(out_dir / "models")
    points = ["--batch-sizes", "1", "--gammas", "2", "--repeats", "1"] if quick else \
        ["--batch-sizes", "1", "4", "16", "--gammas", "2", "3", "--repeats", "2"]
    for engine in ("vllm", "hf"):
        subprocess.run([sys.executable, "-m", "moesd.cli", "sweep", "e2e", "--engine", engine, "--weights",
                        "pretrained", "--target", "qwen3-30b-a3b", "--draft", "qwen3-0.6b", "--target-path",
                        paths["target"], "--draft-path", paths["draft"], "--sigma", "real", *points,
                        "--out-dir", str(out_dir / engine), "--overwrite"], check=True)
    (vllm, sidecar), (hf, _) = (measurements.load("e2e", engine, out_dir) for engine in ("vllm", "hf"))
    print(f"same columns: {list(vllm.columns) == list(hf.columns)}; vLLM {sidecar['vllm']} leaves empty: "
          f"{', '.join(c for c in vllm if vllm[c].isna().all() and hf[c].notna().all())}")
    both = vllm[KEYS + SHOWN].merge(hf[KEYS + SHOWN], on=KEYS, suffixes=("_vllm", "_hf"))
    print(f"sigma equal in all {len(both)} rows: {bool((both['sigma_vllm'] == both['sigma_hf']).all())}")
    medians = both.groupby(["batch_size", "gamma"])[[f"{c}_{e}" for c in SHOWN for e in ("vllm", "hf")]].median()
    with pd.option_context("display.width", 200):
        print(medians.to_string(float_format=lambda v: f"{v:.4g}"))


if __name__ == "__main__":
    arguments = [a for a in sys.argv[1:] if a != "--quick"]
    main(Path(arguments[0] if arguments else "runs/vllm_vs_hf"), "--quick" in sys.argv[1:])
