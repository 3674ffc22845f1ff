"""Reading shipped measurements, checking what is read, and the quantities the chapters derive from them."""

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from moesd.model.measurements import sigma_adjusted_speedup
from moesd.measure.studies import (
    MeasurementWarning,
    available,
    check_rows,
    load,
    provenance,
    sidecar_summary,
    summarize,
)
from moesd.measure.analysis import (efficiency_landmarks, fitting_frame, forward_speedup, forward_target_efficiency,
                                    mean_activated_experts, pass_time_ratio)
from moesd.paper.routing_study import predicted_peak_change


def test_shipped_studies_load_with_provenance():
    assert ("cpu", "e2e") in available() and ("cpu", "forward") in available("forward")
    frame, sidecar = load("e2e", "cpu")
    assert {"batch_size", "gamma", "speedup", "run"} <= set(frame.columns) and sidecar["complete"]
    line = provenance(sidecar)
    assert "random weights" in line and "synthetic acceptance" in line
    with pytest.raises(FileNotFoundError, match="moesd sweep e2e"):
        load("e2e", "tpu")
    forward = load("forward", "cpu")[1]
    assert provenance(forward).endswith("forward passes; moesd.measure.bench")
    graphs = {**forward, "settings": {**forward["settings"], "cuda_graphs": True}}
    assert provenance(graphs).endswith("forward passes timed as CUDA graph replays; moesd.measure.bench")


def _forward_study():
    """Target passes of 1 and 3 tokens and draft passes of 1, 4 runs with a drift, one draft pass missing."""
    rows = [{"role": role, "batch_size": b, "tokens": s, "run": r,
             "seconds": (base + 0.1 * s * b) * (1 + 0.05 * r) + 0.01 * (r % 2)}
            for b in (1, 4) for r in range(4) for role, base, tokens in (("target", 1.0, (1, 3)), ("draft", 0.1, (1,)))
            for s in tokens]
    return pd.DataFrame([row for row in rows if not (row["role"] == "draft" and row["batch_size"] == 4 and row["run"] == 3)])


def test_forward_speedup_per_repeat_is_eq4_of_each_runs_passes():
    study = _forward_study()
    repeats = forward_speedup(study, {"2": 0.9}, gammas=(2,), per_repeat=True)
    assert list(repeats.columns) == ["run", "batch_size", "gamma", "sigma", "speedup", "verify", "draft"]
    assert len(repeats) == 7  # 2 batch sizes x 4 runs, less the run without a draft pass
    seconds = study.set_index(["role", "tokens", "run", "batch_size"])["seconds"]
    for row in repeats.itertuples():
        t1, tv, td = (seconds[(role, tokens, row.run, row.batch_size)]
                      for role, tokens in (("target", 1), ("target", 3), ("draft", 1)))
        assert (row.verify, row.draft) == pytest.approx((tv / t1, 2 * td / t1))
        assert row.speedup == pytest.approx(0.9 * 3 / (tv / t1 + 2 * td / t1))


def test_forward_speedup_summary_is_the_median_of_the_repeats():
    study = _forward_study()
    repeats = forward_speedup(study, 0.9, gammas=(2,), per_repeat=True)
    table = forward_speedup(study, 0.9, gammas=(2,))
    assert list(table.columns) == ["batch_size", "gamma", "sigma", "speedup", "low", "high", "draft_term", "runs"]
    by = repeats.groupby("batch_size")
    assert table["speedup"].tolist() == pytest.approx(by["speedup"].median().tolist())
    assert table["low"].tolist() == pytest.approx(by["speedup"].quantile(0.25).tolist())
    assert table["high"].tolist() == pytest.approx(by["speedup"].quantile(0.75).tolist())
    assert table["draft_term"].tolist() == pytest.approx(by["draft"].median().tolist())
    assert table["runs"].tolist() == [4, 3] and (table["gamma"] == 2).all() and (table["sigma"] == 0.9).all()


def test_forward_target_efficiency():
    forward = pd.DataFrame([{"role": "target", "batch_size": b, "tokens": s, "run": r,
                             "seconds": (1 + 0.1 * s * b) * (1 + 0.01 * r)}
                            for b in (1, 4) for s in (1, 3) for r in range(3)])
    table = forward_target_efficiency(forward, gammas=(2,))
    assert table["efficiency"].tolist() == pytest.approx([1.1 / 1.3, 1.4 / 2.2])
    assert (table["low"] <= table["efficiency"]).all() and (table["efficiency"] <= table["high"]).all()
    with pytest.raises(ValueError, match="4 tokens"):
        forward_target_efficiency(forward, gammas=(3,))


def test_forward_target_efficiency_pairs_the_passes_of_each_repeat():
    # Run 1 ran slow throughout (both passes x 10); run 2 timed its 1-token pass slow only. Per-repeat ratios
    # are 0.5, 0.5 and 4: the median is 0.5. Medians taken over repeats separately would give 10 / 2.5 = 4.
    seconds = {(0, 1): 1.0, (0, 3): 2.0, (1, 1): 10.0, (1, 3): 20.0, (2, 1): 10.0, (2, 3): 2.5}
    forward = pd.DataFrame([{"role": "target", "batch_size": 8, "run": r, "tokens": s, "seconds": v}
                            for (r, s), v in seconds.items()])
    row = forward_target_efficiency(forward, gammas=(2,)).iloc[0]
    assert row["efficiency"] == pytest.approx(0.5) and row["runs"] == 3


def test_sigma_adjustment():
    frame = pd.DataFrame({"K": [8, 8, 2, 2], "gamma": [2, 2, 2, 2], "sigma": [0.9, 0.9, 0.6, 0.6],
                          "speedup": [2.0, 1.0, 1.2, 0.6]})
    assert sigma_adjusted_speedup(frame).tolist() == pytest.approx([2.0, 1.0, 1.8, 0.9])
    with pytest.raises(ValueError, match="K = 4"):
        sigma_adjusted_speedup(frame, reference_k=4)
    assert np.isfinite(sigma_adjusted_speedup(frame)).all()


def test_ridge_point_comes_from_the_sidecars_measured_roofline():
    from moesd.measure.analysis import ridge_point_for
    from moesd.theory.roofline import HARDWARE

    record = HARDWARE["H200"].as_dict()
    assert ridge_point_for({"hardware": record}) == pytest.approx(989.5e12 / 4.8e12)
    with pytest.raises(ValueError, match="no measured roofline"):
        ridge_point_for({"device": "AMD EPYC"})
    with pytest.raises(ValueError, match="unknown Hardware field"):
        ridge_point_for({"hardware": {**record, "colour": "green"}})


def e2e_rows(**changes):
    row = {"run": 0, "batch_size": 4, "gamma": 2, "num_experts_per_tok": 8, "sigma_target": 0.95, "alpha": 0.949,
           "t_ar": 0.02, "t_sd": 0.012, "t_target_1": 0.019, "t_target_gamma": 0.025, "t_draft": 0.002,
           "t_reject": 0.0005, "sigma": 0.95, "speedup": 1.6}
    return pd.DataFrame([row, {**row, "run": 1, **changes}])


@pytest.mark.parametrize("changes, message", [
    (dict(speedup=2.95), "line 3 (run=1, batch_size=4, gamma=2, num_experts_per_tok=8): speedup = 2.95 exceeds "
                         "sigma (gamma + 1) = 2.85 by more than 2%"),
    (dict(t_draft=0.0), "line 3 (run=1, batch_size=4, gamma=2, num_experts_per_tok=8): t_draft = 0 s is not > 0"),
    (dict(t_sd=-1.0), "t_sd = -1 s is not > 0"),
    (dict(sigma=0.3), "sigma = 0.3 lies outside [1/(gamma+1), 1]"),
    (dict(sigma=1.2), "sigma = 1.2 lies outside"),
    (dict(t_ar=np.nan), "line 3 (run=1, batch_size=4, gamma=2, num_experts_per_tok=8): t_ar is empty"),
])
def test_check_rows_names_the_line_and_field(changes, message):
    assert check_rows(e2e_rows()) == []
    problems = check_rows(e2e_rows(**changes))
    assert any(message in problem for problem in problems), problems


def test_check_rows_allows_timing_noise_and_empty_optional_cells():
    assert check_rows(e2e_rows(speedup=2.85 * 1.019, num_experts_per_tok=np.nan, sigma_target=np.nan)) == []


def test_load_warns_with_file_and_line(tmp_path):
    folder = tmp_path / "cpu"
    folder.mkdir()
    e2e_rows(speedup=3.5).to_csv(folder / "e2e.csv", index=False)
    (folder / "e2e.json").write_text(json.dumps({"complete": True}))
    with pytest.warns(MeasurementWarning, match=r"cpu/e2e.csv: line 3 .*speedup = 3.5 exceeds"):
        frame, sidecar = load("e2e", "cpu", directory=tmp_path)
    assert len(frame) == 2 and available(directory=tmp_path) == [("cpu", "e2e")]
    (folder / "e2e.json").write_text("{not json")
    with pytest.raises(ValueError, match="cannot be read as a result file"):
        load("e2e", "cpu", directory=tmp_path)


def test_fitting_frame_takes_e_from_the_sidecar():
    rows = e2e_rows()
    frame = fitting_frame(rows, {"settings": {"target": "qwen2-57b-a14b"}})
    assert list(frame.columns) == ["B", "gamma", "K", "E", "sigma", "speedup"] and (frame["E"] == 64).all()
    assert (fitting_frame(rows, {"settings": {"target": "qwen3-30b-a3b"}})["E"] == 128).all()
    assert (fitting_frame(rows, {"settings": {"target": "mixtral-8x7b"}})["E"] == 8).all()
    with pytest.raises(ValueError, match="opt-30b is dense"):
        fitting_frame(rows, {"settings": {"target": "opt-30b"}})
    with pytest.raises(ValueError, match="e2e, sparsity or settings study"):
        fitting_frame(rows.drop(columns="sigma"), {"settings": {"target": "qwen2-57b-a14b"}})
    with pytest.raises(ValueError, match="names no target"):
        fitting_frame(rows, {})


def test_summarize_and_the_read_side_need_no_torch():
    frame = pd.DataFrame({"b": [1, 1, 1, 2], "v": [1.0, 2.0, 3.0, 5.0]})
    table = summarize(frame, ["b"], "v")
    assert table["median"].tolist() == [2.0, 5.0] and table["q25"].tolist() == [1.5, 5.0]
    assert table["runs"].tolist() == [3, 1]
    code = ("import sys; from moesd.measure.studies import load, summarize; "
            "from moesd.measure.analysis import fitting_frame; "
            "load('forward'); print('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"


def test_appendix_c2_bounds_count_the_measured_models():
    """The volume bounds of the shipped sparsity study: the cut models' parameters over the measured bandwidth."""
    from moesd.measure.studies import load
    from moesd.measure.analysis import measuring_hardware
    from moesd.model.bounds import appendix_c2_bounds
    from moesd.model.algorithm1 import PARAMETERS
    from moesd.zoo import get_model

    rows, sidecar = load("sparsity", "cpu-dispatch")  # cut in width, vocabulary with it, float32
    lower, upper = appendix_c2_bounds(rows, sidecar)
    settings = sidecar["settings"]
    target = get_model(settings["target"]).parameter_counts(num_layers=settings["layers"], width=settings["width"])
    seconds = 4 / measuring_hardware(sidecar).memory_bandwidth  # float32 weights
    built = get_model(settings["target"]).config_dict(settings["layers"], width=settings["width"])
    read = target["dense"] - built["vocab_size"] * built["hidden_size"]  # a decode step gathers B rows of the input table
    bound = dict(zip(PARAMETERS, zip(lower, upper)))
    assert bound["bias"] == pytest.approx((read * seconds, 5 * read * seconds))
    assert bound["k2"][0] == pytest.approx(target["experts"] / 64 * seconds)  # one of Qwen2-57B's 64 experts
    assert bound["reject_k"] == (0, rows["t_reject"].max())
    assert bound["lam"] == (0.2, 1.0)
    whole = get_model(settings["target"]).parameter_counts()
    assert whole["dense"] * seconds > 10 * bound["bias"][1]  # the whole model's bounds would not fit the cut one


def test_appendix_c2_bounds_count_the_cut_vocabulary_and_the_dtype():
    """The real-width study cuts the vocabulary by the depth factor and runs bf16: the bias bound counts both."""
    from moesd.measure.studies import load
    from moesd.measure.analysis import measuring_hardware
    from moesd.model.bounds import appendix_c2_bounds
    from moesd.model.algorithm1 import PARAMETERS
    from moesd.zoo import get_model

    rows, sidecar = load("sparsity", "cpu")
    settings = sidecar["settings"]
    assert settings["dtype"] == "bfloat16" and settings["vocab_size"] < get_model(settings["target"]).config["vocab_size"]
    bound = dict(zip(PARAMETERS, zip(*appendix_c2_bounds(rows, sidecar))))
    full = get_model(settings["target"]).parameter_counts(num_layers=settings["layers"])
    seconds = 2 / measuring_hardware(sidecar).memory_bandwidth  # bf16
    hidden = get_model(settings["target"]).config["hidden_size"]
    vocab = get_model(settings["target"]).config["vocab_size"]
    # the input table is gathered, not read, and the cut vocabulary shrinks the LM head
    unread = vocab * hidden + (vocab - settings["vocab_size"]) * hidden
    assert bound["bias"][0] == pytest.approx((full["dense"] - unread) * seconds, rel=1e-6)


def test_appendix_c2_bounds_count_target_and_draft_layers_apart():
    """The e2e study cuts the target to 4 layers and the draft to 3: each bound counts its own model's layers."""
    from moesd.measure.studies import load
    from moesd.measure.analysis import measuring_hardware
    from moesd.model.bounds import appendix_c2_bounds
    from moesd.model.algorithm1 import PARAMETERS
    from moesd.zoo import get_model

    rows, sidecar = load("e2e", "cpu-dispatch")
    settings = sidecar["settings"]
    assert settings["layers"] != settings["draft_layers"]
    bound = dict(zip(PARAMETERS, zip(*appendix_c2_bounds(rows, sidecar))))
    seconds = 4 / measuring_hardware(sidecar).memory_bandwidth
    target = get_model(settings["target"]).parameter_counts(num_layers=settings["layers"], width=settings["width"])
    draft = get_model(settings["draft"]).parameter_counts(num_layers=settings["draft_layers"], width=settings["width"])
    built = get_model(settings["target"]).config_dict(settings["layers"], width=settings["width"])
    read = target["dense"] - built["vocab_size"] * built["hidden_size"]  # the input table is gathered, not read
    assert bound["bias"][0] == pytest.approx(read * seconds)
    assert bound["draft_bias"] == pytest.approx((draft["total"] * seconds, 5 * draft["total"] * seconds))
    assert bound["reject_bias"] == (0, rows["t_reject"].max())


def test_fit_takes_bounds_or_a_model_not_both():
    from moesd.model.fit import fit_speedup_model
    from moesd.measure.studies import load
    from moesd.measure.analysis import fitting_frame, ridge_tokens_for

    rows, sidecar = load("sparsity", "cpu")
    frame = fitting_frame(rows, sidecar)
    with pytest.raises(ValueError, match="not both"):
        fit_speedup_model(frame, ridge_tokens_for(sidecar), hardware="H100", bounds=(np.zeros(10), np.ones(10)))
    with pytest.raises(ValueError, match="lower <= upper"):
        fit_speedup_model(frame, ridge_tokens_for(sidecar), bounds=(np.ones(10), np.zeros(10)))


def test_the_fit_reader_takes_what_it_is_allowed_to(tmp_path):
    """An unfinished sweep with a speedup above Eq. 4's ceiling: refused by default, read when both are allowed."""
    from moesd.model.measurements import read_result_file

    rows = pd.DataFrame({"run": 0, "batch_size": [1, 2], "gamma": 2, "num_experts_per_tok": 2, "sigma": 0.9,
                         "speedup": [1.5, 3.0]})
    rows.to_csv(tmp_path / "e2e.csv", index=False)
    (tmp_path / "e2e.json").write_text(json.dumps({"complete": False}))
    with pytest.raises(ValueError, match="complete: false"):
        read_result_file(tmp_path / "e2e.csv")
    with pytest.raises(ValueError, match="line 3 .*exceeds Eq. 4's ceiling"):
        read_result_file(tmp_path / "e2e.csv", allow_incomplete=True)
    read, sidecar = read_result_file(tmp_path / "e2e.csv", allow_incomplete=True, allow_above_ceiling=True)
    assert len(read) == 2 and sidecar == {"complete": False}


def test_a_cut_last_line_is_dropped_by_every_reader(tmp_path):
    from moesd.measure.studies import read_rows

    (tmp_path / "e2e.csv").write_text("run,speedup\n0,1.5\n1,1.4")
    with pytest.warns(MeasurementWarning, match="e2e.csv: dropped line 3, cut mid-line"):
        assert read_rows(tmp_path / "e2e.csv")["run"].tolist() == [0]


def test_efficiency_landmarks_read_each_curve_by_hand():
    curve = pd.DataFrame({"batch_size": [1, 8, 100] * 2, "gamma": [2] * 3 + [4] * 3,
                          "efficiency": [0.5, 0.9, 0.7, 0.4, 0.8, 0.3]})
    table = efficiency_landmarks({"MoE (a model)": curve, "dense (another)": curve.assign(efficiency=1.0)})
    assert list(table.index) == [("MoE", 2), ("MoE", 4), ("dense", 2), ("dense", 4)]
    assert table.loc[("MoE", 2)].tolist() == [0.5, 0.9, 8, 0.7] and table.loc[("MoE", 4), "B = 100"] == 0.3
    assert table.loc[("dense", 4), "peak at B"] == 1  # a flat curve peaks at its first batch size


def test_mean_activated_experts_average_the_passes_of_one_width():
    rows = pd.DataFrame({"batch_size": [1, 1, 8, 1], "tokens": [1, 1, 1, 5], "activated_experts": [8, 10, 40, 30]})
    assert mean_activated_experts(rows, 1).to_dict() == {1: 9.0, 8: 40.0}
    assert mean_activated_experts(rows, 5).to_dict() == {1: 30.0}


def test_predicted_peak_change_compares_the_two_peaks_wherever_they_lie():
    table = pd.DataFrame({"uniform": [0.5, 0.9, 0.6], "popularity": [0.95, 0.7, 0.5]})
    assert predicted_peak_change(table) == pytest.approx(0.05)


def test_pass_time_ratio_is_taken_within_each_repeat():
    # the draft's pass left out; the ratio within each repeat, then the median
    rows = pd.DataFrame({"run": [0, 0, 1, 1, 0], "role": ["target"] * 4 + ["draft"], "batch_size": [1] * 5,
                         "tokens": [1, 5, 1, 5, 5], "seconds": [1.0, 3.0, 2.0, 6.0, 100.0]})
    assert pass_time_ratio(rows, 5) == 3.0
    assert pass_time_ratio(rows.assign(seconds=[1.0, 2.0, 2.0, 8.0, 1.0]), 5) == 3.0  # median of 2 and 4


def test_sidecar_summary_reads_every_setting_the_table_shows():
    _, meta = load("e2e")
    summary = sidecar_summary(meta)
    assert summary["timed rounds"] == meta["settings"]["rounds"] and summary["rows"] == meta["rows"]
    assert summary["target / draft"] == f"{meta['settings']['target']} / {meta['settings']['draft']}"
    assert sidecar_summary({**meta, "load_average": None})["load average at start (1 min)"] is None
