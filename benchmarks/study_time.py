"""Estimated wall time of every CPU preset study, from the shipped quiet-machine step times.

Nothing is timed here: ``moesd.measure.sweeps.estimate_seconds`` prices every forward a preset runs at the
median T_T(B, s) and T_D(B, s) that the shipped studies measured on an otherwise idle 2-core
machine (``data/measurements/cpu/forward.csv`` and ``dense_forward.csv``). The sparsity study needs
T_T at every K: its target times come from the shipped sparsity study's stage times
(``t_target_1``, ``t_target_gamma`` per K, gamma and B), its draft times from the forward study;
where a preset keeps other layers than those measurements (their sidecars say how many), times are
scaled by the ratio of layers (a rough rule: per-layer work dominates and the depth-scaled
vocabulary shrinks with the layers too). Building the models is an assumption (``BUILD_SECONDS``).

Run: python benchmarks/study_time.py
"""

import pandas as pd

from moesd.measure.presets import preset
from moesd.measure.studies import load
from moesd.measure.sweeps import STUDIES, estimate_seconds

BUILD_SECONDS = 20.0
"""Seconds to build a one-layer real-width random-weight target and its draft (bf16; the forward study's first
point, which also fills 38 caches, took about a minute)."""
BUDGET_SECONDS = 15 * 60


def sparsity_step_times() -> pd.DataFrame:
    """Target T_T(B, 1) and T_T(B, gamma + 1) per K from the sparsity study; draft times from the forward study."""
    sparsity, _ = load("sparsity")
    forward, _ = load("forward")
    target = pd.concat([
        sparsity.assign(tokens=1, seconds=sparsity["t_target_1"]),
        sparsity.assign(tokens=sparsity["gamma"] + 1, seconds=sparsity["t_target_gamma"]),
    ]).assign(role="target")[["role", "batch_size", "tokens", "num_experts_per_tok", "seconds"]]
    draft = forward[forward["role"] == "draft"].drop(columns="num_experts_per_tok")
    draft = pd.concat([draft.assign(num_experts_per_tok=k) for k in sorted(sparsity["num_experts_per_tok"].unique())])
    return pd.concat([target, draft[target.columns]], ignore_index=True)


def main() -> None:
    loaded = {study: load(study) for study in ("forward", "dense_forward")}
    forward = {study: rows for study, (rows, _) in loaded.items()}
    measured = {study: sidecar["settings"] for study, (_, sidecar) in loaded.items()}
    rows = []
    for study in STUDIES:
        config = preset(study)
        dense = study in ("dense", "dense_forward")
        source = "dense_forward" if dense else "forward"
        times = sparsity_step_times() if study == "sparsity" else forward[source]
        estimate = estimate_seconds(config, times, build_seconds=BUILD_SECONDS,
                                    target_scale=config.layers / measured[source]["layers"],
                                    draft_scale=config.draft_layers / measured[source]["draft_layers"])
        points = len(config.top_k_values) * len(config.batch_sizes) * config.repeats
        rows.append({"study": study, "layers": f"{config.layers}/{config.draft_layers}", "points x repeats": points,
                     "rounds": config.rounds, **{k: round(v) for k, v in estimate.items()},
                     "minutes": round(estimate["total"] / 60, 1),
                     "fits 15 min": estimate["total"] <= BUDGET_SECONDS})
    print(pd.DataFrame(rows).set_index("study").to_string())


if __name__ == "__main__":
    main()
