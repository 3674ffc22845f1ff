"""Algorithm 1: hand-worked values, the Jacobian, scale invariance, parameter recovery, bounds, the old
implementation's answers on the shipped data, diagnostics and bad input."""

import numpy as np
import pandas as pd
import pytest
from scipy.optimize import least_squares

from moesd.model.algorithm1 import (PARAMETERS, TIME_PARAMETERS, SpeedupInputs, SpeedupParams, compute_speedup,
                                    stage_times, target_time)
from moesd.model.bounds import parameter_bounds
from moesd.model.diagnostics import (best_model_variant, compare_stage_times, decode_step_ratio, fitted_stage_times,
                                     held_out_errors, model_variant_errors, residual_table, rms, robustness_study)
from moesd.model.fit import SOLVERS, FitResult, fit_speedup_model
from moesd.model.measurements import from_sweep, mean_over_repeats
from moesd.model.samples import (PAPER_CURVES, PAPER_STRIDES, missing_batch_sizes, spread_sample, stride_coverage,
                                 stride_sample)
from moesd.theory.growth import G, unchecked_G

BATCH_SIZES = (1, 2, 4, *range(8, 61, 4), 80, 100)
TRUE = dict(bias=1e-2, k1=2e-4, k2=2e-4, k3=5e-4, draft_bias=6e-4, draft_k=2e-5, reject_bias=2e-4, reject_k=2e-6,
            lam=0.5, s=1.02)
HAND = dict(bias=1.0, k1=0.5, k2=0.1, k3=0.2, draft_bias=0.3, draft_k=0.1, reject_bias=0.05, reject_k=0.01,
            lam=0.5, s=1.0)


def test_hand_worked_values():
    """s = 1 makes G = 1: ar = 1 + 0.5 + 0.1 N(2) + 0.2 with N(2) = 3, verify uses N(6) = 3.9375."""
    times = stage_times(HAND, B=2, gamma=3, K=2, E=4, rp=100)
    assert times["ar"] == pytest.approx(2.0) and times["verify"] == pytest.approx(2.09375)
    assert times["draft"] == pytest.approx(0.4) and times["reject"] == pytest.approx(0.07)
    assert compute_speedup(HAND, 2, 3, 2, 4, 0.8, 100, "eq4") == pytest.approx(6.4 / (1.2 + 2.09375 + 0.07))
    assert compute_speedup(HAND, 2, 3, 2, 4, 0.8, 100, "printed") == pytest.approx(6.4 / (0.4 + 2.0 + 2.09375 + 0.07))
    # gamma + 1 = 4 verified tokens per sequence: N(8) = 4 (1 - 1/2**8) = 3.984375.
    times = stage_times(HAND, B=2, gamma=3, K=2, E=4, rp=100, verify_tokens="gamma+1")
    assert times["verify"] == pytest.approx(1.7 + 0.1 * 3.984375)


def test_dense_limit_by_hand():
    """K = E: every forward activates all E experts and each expert sees every token, so the expert terms
    are a constant k2 E and k3 G(tokens). With s = 1.1 and the transition at lam RP = 50 tokens (G = 1.1**t),
    B = 2, gamma = 3: ar = 1 + 0.5 x 1.21 + 0.1 E + 0.2 x 1.21, verify = 1 + 0.7 x 1.1**6 + 0.1 E,
    draft = 0.3 + 0.1 x 1.21, reject = 0.07. E = K = 1 is a dense FFN: the same with 0.1 x 1."""
    params = {**HAND, "s": 1.1}
    for experts in (4, 1):
        ar, verify = 1 + 0.7 * 1.21 + 0.1 * experts, 1 + 0.7 * 1.1**6 + 0.1 * experts
        times = stage_times(params, B=2, gamma=3, K=experts, E=experts, rp=100)
        assert times["ar"] == pytest.approx(ar, rel=1e-12) and times["verify"] == pytest.approx(verify, rel=1e-12)
        assert compute_speedup(params, 2, 3, experts, experts, 0.8, 100, "eq4") == pytest.approx(
            0.8 * 4 * ar / (3 * 0.421 + verify + 0.07), rel=1e-12)


def test_named_parameters():
    params = SpeedupParams(**TRUE)
    assert params.vector().tolist() == [TRUE[name] for name in PARAMETERS]
    assert SpeedupParams.from_vector(params.vector()) == params and params.as_dict() == TRUE
    relative = params.relative()
    assert relative.bias == 1 and relative.k2 == pytest.approx(TRUE["k2"] / TRUE["bias"]) and relative.s == TRUE["s"]


def reference_speedup(p, B, g, K, E, sigma, rp, variant):
    """The digest's sketch of Algorithm 1, written independently of moesd.model.fit."""
    bias, k1, k2, k3, db, dk, rb, rk, lam, s = p

    def growth(t, L):
        t = np.asarray(t, float)
        return np.where(t <= L, s ** np.minimum(t, L), s ** L * (1 + np.log(s) * (t - L)))

    L = lam * rp
    n_ar, n_sd = E * (1 - ((E - K) / E) ** B), E * (1 - ((E - K) / E) ** (B * g))
    ar = bias + k1 * growth(B, L) + k2 * n_ar + k3 * growth(B * K / n_ar, L)
    ver = bias + k1 * growth(B * g, L) + k2 * n_sd + k3 * growth(B * g * K / n_sd, L)
    dr, rej = db + dk * growth(B, L), rb + rk * B
    den = (dr + ar + ver + rej) if variant == "printed" else (g * dr + ver + rej)
    return sigma * (g + 1) * ar / den


@pytest.mark.parametrize("variant", ["eq4", "printed"])
def test_matches_the_reference_sketch_across_the_roofline(variant):
    B, g, K = np.meshgrid(np.array(BATCH_SIZES, float), [2.0, 4.0], [1.0, 8.0, 32.0])
    vector = [TRUE[name] for name in PARAMETERS]
    for rp in (20.0, 300.0):  # transition below and above the batch sizes
        ours = compute_speedup(TRUE, B, g, K, 64, 0.9, rp, variant)
        assert ours == pytest.approx(reference_speedup(vector, B, g, K, 64, 0.9, rp, variant), rel=1e-12)


def test_growth_is_eq_11():
    """Eq. 11 by hand at L = lam RP = 50, s = 1.05: below L, 1.05**10 = 1.628895; above it,
    1.05**50 (1 + ln 1.05 x 50) = 11.46740 x 3.439511 = 39.44222. Then the unchecked G the fit calls
    agrees with the checked one everywhere."""
    assert unchecked_G(np.array([10.0, 100.0]), 50.0, 1.05) == pytest.approx([1.628895, 39.44222], rel=1e-6)
    _, d_transition, _ = unchecked_G(np.array([100.0]), 50.0, 1.05, derivatives=True)
    assert d_transition[0] == pytest.approx(1.05**50 * np.log(1.05)**2 * 50, rel=1e-12)  # s**L (ln s)**2 (t - L)
    t = np.array([0.0, 1.0, 2.5, 10.0, 10.000001, 37.0, 400.0])
    for transition, s in ((10.0, 1.0), (10.0, 1.3), (3.7, 2.0)):
        np.testing.assert_allclose(unchecked_G(t, transition, s), G(t, transition, s), rtol=1e-15)


@pytest.mark.parametrize("variant", ["eq4", "printed"])
@pytest.mark.parametrize("verify_tokens", ["gamma", "gamma+1"])
@pytest.mark.parametrize("lam, lam_step, tolerance", [(0.61, 1e-5, 1e-8), (0.6, 1e-7, 1e-7)])
def test_jacobian_matches_finite_differences(variant, verify_tokens, lam, lam_step, tolerance):
    """Central differences in every parameter, relative to each column's size. With rp = 20 the
    transition lam RP (12.2, then exactly 12) sits among the token counts, so both branches of Eq. 11
    and the transition itself are exercised; at a token count equal to the transition G'' jumps and
    central differences are only first-order accurate in lam, hence the smaller step there."""
    B = np.array([1, 2, 3, 4, 6, 8, 12, 16, 24, 40, 60, 100.0])
    inputs = SpeedupInputs.build(np.tile(B, 2), np.repeat([2, 4], len(B)), 8, 64, 0.9, 20.0, verify_tokens)
    p = np.array([1e-2, 2e-4, 2e-4, 5e-4, 6e-4, 2e-5, 2e-4, 2e-6, lam, 1.05])
    analytic = inputs.jacobian(p, variant)
    numeric = np.empty_like(analytic)
    for j in range(len(p)):
        step = (lam_step if PARAMETERS[j] == "lam" else 1e-5) * p[j]
        up, down = p.copy(), p.copy()
        up[j] += step
        down[j] -= step
        numeric[:, j] = (inputs.speedup(up, variant) - inputs.speedup(down, variant)) / (2 * step)
    scale = np.abs(numeric).max(axis=0)  # per parameter: the columns differ by orders of magnitude
    assert np.all(scale > 0)
    assert np.all(np.abs(analytic - numeric).max(axis=0) / scale < tolerance)


def test_speedup_ignores_the_time_scale():
    """The non-identifiability: all eight time-like parameters times c leave every speedup unchanged."""
    scaled = {k: v * 7.3 if k in TIME_PARAMETERS else v for k, v in TRUE.items()}
    B = np.array(BATCH_SIZES, float)
    assert compute_speedup(scaled, B, 3, 8, 64, 0.9, 200) == pytest.approx(compute_speedup(TRUE, B, 3, 8, 64, 0.9, 200))
    assert target_time(scaled, B, 8, 64, 200) == pytest.approx(7.3 * target_time(TRUE, B, 8, 64, 200))


def synthetic(noise=0.005, seed=0, variant="eq4", verify_tokens="gamma", truth=TRUE):
    frame = pd.DataFrame([dict(B=b, gamma=g, K=k, E=64, sigma=0.9) for k in (1, 2, 4, 8, 16, 32) for g in (2, 4)
                          for b in BATCH_SIZES])
    clean = compute_speedup(truth, frame.B, frame.gamma, frame.K, frame.E, frame.sigma, 200, variant, verify_tokens)
    return frame.assign(speedup=clean * (1 + noise * np.random.default_rng(seed).standard_normal(len(frame)))), clean


@pytest.mark.parametrize("variant", ["eq4", "printed"])
def test_recovers_known_parameters_up_to_scale(variant):
    frame, clean = synthetic(variant=variant)
    result = fit_speedup_model(frame, 200, variant=variant)
    assert result.status > 0 and result.nfev > 0 and isinstance(result.message, str)
    assert len(result.fitted) == 228 and result.mse < 4e-4
    assert np.abs(result.predict(frame) - clean).max() < 0.03
    relative = result.relative_params()
    truth = {k: TRUE[k] / TRUE["bias"] if k in TIME_PARAMETERS else TRUE[k] for k in PARAMETERS}
    # In the printed form the draft time is one term among ar + verify + draft: it is less well determined.
    names = ("k1", "k2", "k3", "draft_bias", "lam", "s") if variant == "eq4" else ("k2", "k3", "lam", "s")
    for name in names:
        assert relative[name] == pytest.approx(truth[name], rel=0.15), name


@pytest.mark.parametrize("verify_tokens", ["gamma", "gamma+1"])
def test_noise_free_speedups_are_recovered_exactly(verify_tokens):
    frame, clean = synthetic(noise=0, verify_tokens=verify_tokens)
    result = fit_speedup_model(frame, 200, stride=11, verify_tokens=verify_tokens)
    assert result.predict(frame) == pytest.approx(clean, rel=1e-8)
    assert result.params["bias"] == 1.0  # the free time scale is reported with bias at its start value


def test_stride_sample_and_held_out_errors():
    frame, _ = synthetic()
    sample = stride_sample(frame.sample(frac=1, random_state=1), 11)  # order is restored before sampling
    assert len(sample) == 21 and sample.iloc[0].to_dict()["B"] == 1 and sample.iloc[0]["K"] == 1
    result = fit_speedup_model(frame, 200, stride=11)
    errors = held_out_errors(result, frame)
    assert errors["points"] == 228 - 21 and errors["mape"] < 3 and errors["max_abs_error"] < 0.2


def test_held_back_rows_are_found_by_index_not_by_value():
    """Two rows with the same values: only the one fitted is excluded (matching values dropped both)."""
    frame, _ = synthetic()
    frame = pd.concat([frame, frame.iloc[[0]]], ignore_index=True)  # row 228 repeats row 0, which stride 11 fits
    result = fit_speedup_model(frame, 200, stride=11)
    assert 0 in result.fitted.index and 228 not in result.fitted.index
    assert held_out_errors(result, frame)["points"] == len(frame) - len(result.fitted)
    with pytest.raises(ValueError, match="fitted on"):
        held_out_errors(result, frame.assign(speedup=frame["speedup"] * 1.1))
    with pytest.raises(ValueError, match="unique"):
        fit_speedup_model(pd.concat([frame, frame]), 200, stride=11)


def test_robustness_study_rows():
    frame, _ = synthetic()
    study = robustness_study(frame, 200, strides=[25, 19, 11, 1])
    assert study["m"].tolist() == [10, 12, 21, 228]
    assert study.loc[study["stride"] == 19, "batch_sizes"].item() == "1"  # stride 19 = one B per block
    assert np.isnan(study.loc[study["stride"] == 1, "mape"].item())  # nothing held back
    assert (study["status"] > 0).all() and set(study["solver"]) <= set(SOLVERS)
    for row in study.itertuples():  # Table 3's MSE: over every measurement, not only the fitted ones
        assert row.mse == pytest.approx(np.mean((row.result.predict(frame) - frame["speedup"]) ** 2), rel=1e-12)
        fitted = frame.loc[row.result.fitted.index]
        assert row.mse_fitted == pytest.approx(np.mean((row.result.predict(fitted) - fitted["speedup"]) ** 2), rel=1e-12)
    one = study.set_index("stride").loc[1]
    assert one["mse"] == pytest.approx(one["mse_fitted"], rel=1e-12)


def test_robustness_study_with_sizes_fits_spread_samples():
    """A 48-point design (8 curves x 6 batch sizes): sizes give samples of every m, whole strides only a few."""
    frame = synthetic()[0]
    frame = frame[frame["K"].isin([1, 2, 4, 8]) & frame["B"].isin([1, 4, 8, 16, 32, 100])].reset_index(drop=True)
    study = robustness_study(frame, 200, sizes=[10, 12, 21, 48])
    assert study["m"].tolist() == [10, 12, 21, 48]
    assert study["stride"].tolist() == pytest.approx([4.8, 4.0, 48 / 21, 1.0])
    assert study.set_index("m").loc[12, "batch_sizes"] == "1 8 32"  # stride 4 meets every other B of 6
    assert study.set_index("m").loc[21, "batch_sizes"] == "1 4 8 16 32 100"
    assert np.isnan(study.set_index("m").loc[48, "mape"])  # nothing held back
    for row in study.itertuples():
        assert row.result.fitted.index.equals(spread_sample(frame, row.m).index)
    with pytest.raises(ValueError, match="sets m itself"):
        robustness_study(frame, 200, sizes=[12], m=12)


#: Qwen2-57B-A14B per MoE layer, from its config (d 3584; 28 query and 4 KV heads of 128 with q, k, v biases;
#: 64 routed experts; a shared expert of 20480 with a one-output gate; two RMSNorms), typed here by hand.
QWEN2_57B_D, QWEN2_VOCAB = 3584, 151936
QWEN2_57B_LAYER = ((3584 * 3584 + 3584) + 2 * (3584 * 512 + 512) + 3584 * 3584  # q, k, v, o
                   + 3584 * 64 + 3 * 3584 * 20480 + 3584 + 2 * 3584)  # router, shared expert and gate, norms


def test_fit_respects_bounds_from_model_and_hardware():
    """bias reads the dense part less the untied input embedding (its B rows are gathered; the LM head is
    read whole), k2 one routed expert of each of the 28 layers (3 x 3584 x 2560 values), draft_bias all of
    Qwen2-0.5B (tied: its table is its head), each at H200's 4.8 TB/s, 2 bytes per weight."""
    from moesd.zoo import get_model

    pytest.importorskip("torch")
    target, draft = get_model("qwen2-57b-a14b"), get_model("qwen2-0.5b")
    lower, upper = parameter_bounds(target, "H200", draft, t_reject=1e-3)
    seconds = 2 / 4.8e12
    read = 28 * QWEN2_57B_LAYER + QWEN2_57B_D + QWEN2_VOCAB * QWEN2_57B_D  # layers, final norm, LM head
    assert read == 7_539_105_280
    assert target.parameter_counts()["dense"] - read == QWEN2_VOCAB * QWEN2_57B_D  # all but the input table
    assert lower[0] == pytest.approx(read * seconds, rel=1e-12) and upper[0] == pytest.approx(5 * lower[0])
    assert lower[2] == pytest.approx(28 * 3 * 3584 * 2560 * seconds, rel=1e-12)
    assert lower[4] == pytest.approx(draft.parameter_counts()["total"] * seconds, rel=1e-12)
    assert upper[6] == upper[7] == 1e-3 and (lower[8], upper[8], lower[9], upper[9]) == (0.2, 1.0, 1.0, 2.0)
    frame, _ = synthetic()
    result = fit_speedup_model(frame, 200, model=target, hardware="H200", draft=draft, t_reject=1e-3)
    values = np.array([result.params[name] for name in PARAMETERS])
    assert np.all(values >= lower - 1e-15) and np.all(values <= upper + 1e-15)


def test_tensor_parallelism_splits_each_models_volume():
    """On tp GPUs each reads 1/tp of the target's dense part and of every expert at once; the draft runs on its
    own draft_tp GPUs. tp = 2 halves the target's bounds and leaves the draft's; draft_tp = 4 quarters the
    draft's only."""
    from moesd.zoo import get_model

    pytest.importorskip("torch")
    target, draft = get_model("qwen2-57b-a14b"), get_model("qwen2-0.5b")
    one = parameter_bounds(target, "H200", draft)
    two = parameter_bounds(target, "H200", draft, tp=2)
    assert two[0][[0, 2]] == pytest.approx(one[0][[0, 2]] / 2, rel=1e-12)
    assert two[1][[0, 2]] == pytest.approx(one[1][[0, 2]] / 2, rel=1e-12)
    assert two[0][4] == one[0][4] and two[1][4] == one[1][4]
    split_draft = parameter_bounds(target, "H200", draft, draft_tp=4)[0]
    assert split_draft[4] == pytest.approx(one[0][4] / 4, rel=1e-12) and split_draft[0] == one[0][0]
    result = fit_speedup_model(synthetic()[0], 200, model=target, hardware="H200", draft=draft, tp=2)
    assert np.array_equal(result.lower, two[0]) and np.array_equal(result.upper, two[1])
    for call, match in ((lambda: parameter_bounds(tp=2), "tp and draft_tp apply"),
                        (lambda: parameter_bounds(target, "H200", tp=0), "tp must"),
                        (lambda: parameter_bounds(target, "H200", draft_tp=1.5), "draft_tp must"),
                        (lambda: fit_speedup_model(synthetic()[0], 200, tp=2, bounds=one), "not both")):
        with pytest.raises(ValueError, match=match):
            call()


def test_bounds_count_a_cut_vocabulary():
    """A sweep cuts the vocabulary (151936 -> 5440 tokens for one of Qwen2-57B's 28 layers). Qwen2-57B is
    untied: its input table is never read, so of the cut only the LM head's columns move its bound; Qwen2-0.5B
    is tied, its one table is the head and loses the rows; the experts' volume is unchanged."""
    from moesd.zoo import get_model

    pytest.importorskip("torch")
    target, draft = get_model("qwen2-57b-a14b"), get_model("qwen2-0.5b")
    whole = parameter_bounds(target, "H200", draft, layers=1, draft_layers=1)[0]
    cut = parameter_bounds(target, "H200", draft, layers=1, draft_layers=1, vocab_size=5440)[0]
    seconds, dropped = 2 / 4.8e12, 151936 - 5440
    assert whole[0] - cut[0] == pytest.approx(dropped * 3584 * seconds)
    assert whole[4] - cut[4] == pytest.approx(dropped * 896 * seconds)
    # One layer, the final norm and a head of 5440 x 3584: by hand.
    assert cut[0] == pytest.approx((QWEN2_57B_LAYER + 3584 + 5440 * 3584) * seconds, rel=1e-12)
    assert cut[2] == whole[2] and cut[4] > 0
    with pytest.raises(ValueError, match="vocab_size applies"):
        parameter_bounds(vocab_size=5440)


@pytest.mark.parametrize("variant, overhead", [("eq4", (3 * 0.4 + 0.07) / 2.0), ("printed", (0.4 + 2.0 + 0.07) / 2.0)])
def test_compare_stage_times_takes_each_variants_overhead(variant, overhead):
    """A hand-made fit of HAND (s = 1, G = 1) at B = 2, gamma = 3, K = 2, E = 4: ar = 2, draft = 0.4, reject = 0.07
    (test_hand_worked_values). Its overhead is its denominator less verify: 3 x 0.4 + 0.07 under Eq. 4,
    0.4 + 2 + 0.07 as line 11 prints it. The measured one is a round's, 3 x 0.1 + 0.02 over 1, for both."""
    lower, upper = parameter_bounds()
    result = FitResult(SpeedupParams(**HAND), variant, 100.0, 0.0, np.zeros(0), 0.0, pd.DataFrame(), "gamma",
                       lower, upper, 1, "hand-made", 0, 0)
    measured = pd.DataFrame({"B": [2], "gamma": [3], "K": [2], "E": [4], "t_draft": [0.1], "t_reject": [0.02],
                             "t_target_1": [1.0]})
    row = compare_stage_times(result, measured).iloc[0]
    assert row["overhead_fitted"] == pytest.approx(overhead, rel=1e-12)
    assert row["overhead_measured"] == pytest.approx(0.32, rel=1e-12)
    assert row["draft_fitted"] == pytest.approx(0.2) and row["reject_fitted"] == pytest.approx(0.035)


def test_on_bounds_names_the_parameters_at_a_bound():
    truth = {**TRUE, "lam": 1.0, "reject_k": 0.0}
    frame, _ = synthetic(noise=0, truth=truth)
    result = fit_speedup_model(frame, 200, stride=11)
    assert result.on_bounds() == {"reject_k": "lower", "lam": "upper"}
    assert fit_speedup_model(synthetic(noise=0)[0], 200, stride=11).on_bounds() == {}


def test_residual_table_is_tidy():
    frame, _ = synthetic()
    result = fit_speedup_model(frame, 200, stride=11)
    table = residual_table(result, frame)
    assert len(table) == 228 and table["fitted"].sum() == 21
    assert table["residual"].to_numpy() == pytest.approx(table["predicted"] - table["measured"])
    assert table.loc[result.fitted.index, "residual"].to_numpy() == pytest.approx(result.residuals, abs=1e-12)
    assert table[["K", "gamma", "B"]].equals(table[["K", "gamma", "B"]].sort_values(["K", "gamma", "B"]))


def test_compare_stage_times_on_exact_data():
    """Speedups and stage times from the same parameters: the fitted ratios are the measured ones,
    whatever the measured times' absolute scale (here seconds x 3.7)."""
    frame, _ = synthetic(noise=0)
    result = fit_speedup_model(frame, 200, stride=11)
    times = stage_times(TRUE, frame["B"], frame["gamma"], frame["K"], 64, 200)
    measured = pd.DataFrame({"batch_size": frame["B"], "gamma": frame["gamma"], "num_experts_per_tok": frame["K"],
                             "t_draft": 3.7 * times["draft"], "t_reject": 3.7 * times["reject"],
                             "t_target_1": 3.7 * times["ar"], "t_target_gamma": 3.7 * times["verify"]})
    table = compare_stage_times(result, measured, num_experts=64)
    for stage in ("draft", "reject", "verify", "overhead"):
        assert table[f"{stage}_fitted"].to_numpy() == pytest.approx(table[f"{stage}_measured"].to_numpy(), rel=1e-5)
    assert table["overhead_measured"].to_numpy() == pytest.approx(
        (frame["gamma"].to_numpy() * np.asarray(times["draft"]) + np.asarray(times["reject"])) / np.asarray(times["ar"]))
    assert table["reject_measured"].iloc[0] == pytest.approx(
        (TRUE["reject_bias"] + TRUE["reject_k"]) / target_time(TRUE, 1, 1, 64, 200))
    with pytest.raises(ValueError, match="num_experts"):
        compare_stage_times(result, measured)


@pytest.mark.parametrize("verify_tokens, variant", [("gamma", "eq4"), ("gamma+1", "eq4"), ("gamma+1", "printed")])
def test_model_variant_comparison_finds_the_generating_variant(verify_tokens, variant):
    frame, _ = synthetic(noise=0, variant=variant, verify_tokens=verify_tokens)
    errors = model_variant_errors(frame, 200, begins=[0, 5])
    assert len(errors) == 4 and (errors["folds"] == 2).all()
    best = best_model_variant(errors)
    assert (best["verify_tokens"], best["variant"]) == (verify_tokens, variant)
    assert best["value"] < 1e-12 < best["runner_up_value"]
    assert errors.loc[(verify_tokens, variant), "wins"] == 2


def test_model_variant_errors_over_spread_samples():
    """With m, the folds are the spread samples at every begin below n / m: 228 / 21 gives 11 folds."""
    frame, _ = synthetic(noise=0, verify_tokens="gamma+1")
    errors = model_variant_errors(frame, 200, stride=None, m=21, begins=[0, 4])
    assert (errors["folds"] == 2).all()
    assert best_model_variant(errors)["verify_tokens"] == "gamma+1"
    with pytest.raises(ValueError, match="either stride or m"):
        model_variant_errors(frame, 200, m=21)  # stride keeps its default 11
    with pytest.raises(ValueError, match="either stride or m"):
        model_variant_errors(frame, 200, stride=None)


def test_mean_over_repeats_gives_one_point_per_b_gamma_k():
    rows = pd.DataFrame([{"run": r, "batch_size": b, "gamma": g, "num_experts_per_tok": k, "seed": 7 * r + b,
                          "speedup": 1.0 + r + b / 100, "sigma": 0.9, "t_draft": 0.01 * (r + 1)}
                         for r in range(3) for b in (1, 4) for g in (2, 4) for k in (1, 8)])
    points = mean_over_repeats(rows.sample(frac=1, random_state=0))
    assert len(points) == 8 and (points["runs"] == 3).all() and points.index.equals(pd.RangeIndex(8))
    assert "run" not in points and "seed" not in points
    assert points["speedup"].to_numpy() == pytest.approx(2.0 + points["batch_size"].to_numpy() / 100)
    assert points["t_draft"].to_numpy() == pytest.approx(0.02)
    assert points["speedup_se"].to_numpy() == pytest.approx(1 / np.sqrt(3))  # runs 0, 1, 2: sd 1 over sqrt 3
    assert mean_over_repeats(rows[rows["run"] == 0])["speedup_se"].isna().all()
    assert points[["batch_size", "gamma", "num_experts_per_tok"]].equals(
        points[["batch_size", "gamma", "num_experts_per_tok"]].sort_values(["batch_size", "gamma",
                                                                             "num_experts_per_tok"]))
    with pytest.raises(ValueError, match="lack the column"):
        mean_over_repeats(rows.drop(columns="gamma"))


def test_spread_sample_is_the_stride_sample_where_the_stride_is_whole():
    frame, _ = synthetic()
    shuffled = frame.sample(frac=1, random_state=2)
    for m, stride in ((228, 1), (114, 2), (76, 3), (57, 4), (19, 12)):
        for begin in (0, stride - 1):
            assert spread_sample(shuffled, m, begin).index.equals(stride_sample(shuffled, stride, begin).index)
    sample = spread_sample(frame, 21)  # a fractional stride 228 / 21: rows floor(i 228 / 21)
    ordered = frame.sort_values(["K", "gamma", "B"], kind="stable")
    assert sample.index.equals(ordered.index[[i * 228 // 21 for i in range(21)]])
    assert fit_speedup_model(frame, 200, m=21).fitted.index.equals(sample.index)
    for call, match in ((lambda: spread_sample(frame, 0), "m must be"), (lambda: spread_sample(frame, 229), "m must be"),
                        (lambda: spread_sample(frame, 21, begin=11), "begin must lie below"),
                        (lambda: fit_speedup_model(frame, 200, stride=11, m=21), "not both")):
        with pytest.raises(ValueError, match=match):
            call()


def test_stride_coverage_is_table_3s_coverage_column():
    """The batch sizes of the paper's design covered by each stride, without a frame: the same as stride_sample's."""
    from moesd.predictor.predict import PAPER_BATCH_SIZES

    frame, _ = synthetic()
    coverage = stride_coverage(PAPER_BATCH_SIZES, PAPER_CURVES)
    assert coverage.index.tolist() == list(PAPER_STRIDES)
    for stride, covered in coverage.items():
        assert covered == " ".join(str(int(b)) for b in sorted(stride_sample(frame, stride)["B"].unique()))
    assert coverage[20] == " ".join(str(b) for b in PAPER_BATCH_SIZES if b <= 40)  # Table 3's m = 12: B <= 40 only
    assert stride_coverage([1, 4, 8, 16, 32, 100], 8, strides=[4, 5]).tolist() == ["1 8 32", "1 4 8 16 32 100"]


# The fit as it was before the analytic Jacobian (commit 1fcb01f): finite differences, 10 free parameters,
# scipy's default tolerances. Kept here, not in the package, to check the new fit's answers against it.
OLD_START = np.array([1.0, 1e-3, 1 / 64, 1e-2, 1 / 30, 1e-4, 1e-3, 1e-5, 0.6, 1.01])


def old_fit_predictions(frame, rp, variant, stride):
    data = stride_sample(frame, stride)
    columns = [data[c].to_numpy(float) for c in ("B", "gamma", "K", "E", "sigma")]
    measured = data["speedup"].to_numpy(float)
    lower, upper = parameter_bounds()
    solution = least_squares(lambda p: reference_speedup(p, *columns, rp, variant) - measured, OLD_START,
                             bounds=(lower, upper), method="trf", x_scale="jac")
    all_columns = [frame[c].to_numpy(float) for c in ("B", "gamma", "K", "E", "sigma")]
    return reference_speedup(solution.x, *all_columns, rp, variant), 2 * solution.cost / len(data)


@pytest.mark.parametrize("variant", ["eq4", "printed"])
def test_same_answers_as_the_old_fit_on_the_shipped_data(variant):
    """Predictions on all 228 shipped CPU points of the 21-point fit, old against new.

    The two ends lie on a flat floor of the MSE, where the old solver (finite-difference Jacobian, ftol
    1e-8) stops short. On the steady-state re-measurement (lam and s on their bounds) the largest
    relative difference is 1.2e-5 (eq4; the new MSE lower by 1.4e-6 relative) and 4.1e-6 (printed); on
    the data before it, 1.0e-6 and 1.9e-6. The new fit must be at least as good and agree to 5e-5.
    """
    from moesd.measure.studies import load

    raw, _ = load("sparsity", "cpu-dispatch")  # the float32 study these numbers describe
    frame = from_sweep(raw, num_experts=64)
    old, old_mse = old_fit_predictions(frame, 10.0, variant, 11)
    new = fit_speedup_model(frame, 10.0, variant=variant, stride=11)
    assert new.mse <= old_mse * (1 + 1e-10)
    assert new.predict(frame) == pytest.approx(old, rel=5e-5)


def shipped_sparsity():
    """The shipped 1/8-width float32 CPU sparsity study (one repeat of 228 points, cpu-dispatch/) as a fitting
    frame, with the ridge point in tokens of its sidecar: the data the solver tests below were written on."""
    from moesd.measure.studies import load
    from moesd.measure.analysis import ridge_tokens_for

    raw, sidecar = load("sparsity", "cpu-dispatch")
    return from_sweep(raw, num_experts=64), ridge_tokens_for(sidecar)


def trf_alone(frame, rp, stride, variant, max_nfev=None):
    """least_squares(trf) on a stride sample with the fit's options and start, as the fit ran before L-BFGS-B
    took over from it: the solution, and a function of parameters giving the predictions on every row."""
    from moesd.model.fit import TOLERANCE, initial_guess

    data = stride_sample(frame, stride)
    inputs = SpeedupInputs.build(*(data[c].to_numpy(float) for c in ("B", "gamma", "K", "E", "sigma")), rp)
    everything = SpeedupInputs.build(*(frame[c].to_numpy(float) for c in ("B", "gamma", "K", "E", "sigma")), rp)
    measured = data["speedup"].to_numpy(float)
    lower, upper = parameter_bounds()
    solution = least_squares(lambda p: inputs.speedup(p, variant) - measured, initial_guess(1.0, lower, upper),
                             jac=lambda p: inputs.jacobian(p, variant), bounds=(lower, upper), method="trf",
                             x_scale="jac", ftol=TOLERANCE, xtol=TOLERANCE, gtol=TOLERANCE, max_nfev=max_nfev)
    return solution, lambda p: everything.speedup(p, variant)


def test_a_fit_trf_finishes_within_its_share_is_trf_alone():
    """Printed denominator, stride 10: trf converges within TRF_EVALUATIONS evaluations: nothing else runs."""
    from moesd.model.fit import TRF_EVALUATIONS

    frame, rp = shipped_sparsity()
    result = fit_speedup_model(frame, rp, variant="printed", stride=10)
    solution, predict = trf_alone(frame, rp, 10, "printed")
    assert solution.status > 0 and solution.nfev <= TRF_EVALUATIONS
    assert result.solver == "trf" and result.nfev == solution.nfev and result.status == solution.status
    assert result.predict(frame) == pytest.approx(predict(solution.x), rel=1e-12, abs=0)


def test_a_crawling_fit_reaches_the_floor_trf_reaches_slowly():
    """Eq. 4, stride 20: trf alone crawls along a flat valley (s climbing to 2) for 496 evaluations before its
    tests pass; after TRF_EVALUATIONS, L-BFGS-B carries it there, and trf, restarted, converges at the same floor."""
    from moesd.model.fit import TRF_EVALUATIONS

    frame, rp = shipped_sparsity()
    result = fit_speedup_model(frame, rp, stride=20)
    solution, predict = trf_alone(frame, rp, 20, "eq4")
    assert solution.status > 0 and solution.nfev > 3 * TRF_EVALUATIONS
    assert result.solver == SOLVERS[1] and result.status > 0 and result.nfev < solution.nfev
    assert "L-BFGS-B after" in result.message and result.njev > TRF_EVALUATIONS // 2
    assert result.params["s"] == pytest.approx(2.0) and solution.x[9] == pytest.approx(2.0)
    assert result.mse <= 2 * solution.cost / len(result.fitted) * (1 + 1e-12)
    assert result.predict(frame) == pytest.approx(predict(solution.x), rel=1e-6, abs=0)


def test_a_fit_trf_leaves_unconverged_converges():
    """Eq. 4, stride 13: trf alone stops at its limit of 1000 evaluations unconverged (it needs about 6500);
    the fit converges, with a lower MSE."""
    frame, rp = shipped_sparsity()
    result = fit_speedup_model(frame, rp, stride=13)
    solution, _ = trf_alone(frame, rp, 13, "eq4")
    assert solution.status == 0  # stopped at scipy's default limit, 100 evaluations per parameter
    assert result.status > 0 and result.nfev < solution.nfev
    assert result.mse < 2 * solution.cost / len(result.fitted)


@pytest.mark.parametrize("change, match", [
    (lambda f: f.drop(columns="sigma"), "lack the column"), (lambda f: f.assign(B=np.nan), "NaN"),
    (lambda f: f.assign(B=0), "B and gamma"), (lambda f: f.assign(sigma=0.1), "sigma"),
    (lambda f: f.assign(sigma=1.2), "sigma"), (lambda f: f.assign(K=65), "K must"),
    (lambda f: f.assign(speedup=-1.0), "speedup"), (lambda f: f.head(9), "cannot determine"),
    (lambda f: f.assign(speedup=f["speedup"].astype(object).where(f.index != 3, "n/a")), "'n/a' \\(row 3\\)")])
def test_bad_frames_raise(change, match):
    frame, _ = synthetic()
    with pytest.raises(ValueError, match=match):
        fit_speedup_model(change(frame), 200)


@pytest.mark.parametrize("call, match", [
    (lambda: compute_speedup(TRUE, 1, 2, 8, 64, 0.9, 200, "line11"), "variant"),
    (lambda: compute_speedup([1, 2, 3], 1, 2, 8, 64, 0.9, 200), "10 values"),
    (lambda: compute_speedup({"bias": 1}, 1, 2, 8, 64, 0.9, 200), "lacks"),
    (lambda: compute_speedup("fast", 1, 2, 8, 64, 0.9, 200), "params must be SpeedupParams"),
    (lambda: compute_speedup(TRUE, 1, 2, 8, 64, 5, 200), "sigma must be .*<= 1"),
    (lambda: compute_speedup(TRUE, 1, 2, 8, 64, -1, 200), "sigma must be in"),
    (lambda: compute_speedup(TRUE, 1, 4, 8, 64, 0.19, 200), "sigma must be in"),
    (lambda: compute_speedup(TRUE, 0.5, 2, 8, 64, 0.9, 200), "B must be .*>= 1"),
    (lambda: compute_speedup(TRUE, 1, 2.5, 8, 64, 0.9, 200), "gamma must be a whole"),
    (lambda: compute_speedup(TRUE, 1, 2, 80, 64, 0.9, 200), "K must be <= E"),
    (lambda: compute_speedup(TRUE, 1, 2, 8, 64, 0.9, 0), "rp must be .*> 0"),
    (lambda: compute_speedup(TRUE, 1, 2, 8, 64, 0.9, 200, verify_tokens="gamma+2"), "verify_tokens"),
    (lambda: compute_speedup(TRUE, 1, 2, 8, 64, 0.9, 200, verify_tokens=0), "verify_tokens must be .*>= 1"),
    (lambda: compute_speedup({**TRUE, "s": 0.9}, 1, 2, 8, 64, 0.9, 200), "s must be"),
    (lambda: compute_speedup({**TRUE, "lam": 0}, 1, 2, 8, 64, 0.9, 200), "lam must be"),
    (lambda: compute_speedup({**TRUE, "k2": -1e-3}, 1, 2, 8, 64, 0.9, 200), "k2 must be"),
    (lambda: target_time(TRUE, 0, 8, 64, 200), "tokens must be .*>= 1"),
    (lambda: stage_times(TRUE, 4, 0, 8, 64, 200), "gamma must be .*>= 1"),
    (lambda: parameter_bounds(hardware="H200"), "together"),
    (lambda: parameter_bounds(t_reject=-1), "t_reject"),
    (lambda: stride_sample(synthetic()[0], 0), "stride must be .*>= 1"),
    (lambda: stride_sample(synthetic()[0], 11, begin=-1), "begin"),
    (lambda: fit_speedup_model(synthetic()[0], 200, stride=0), "stride must be .*>= 1"),
    (lambda: fit_speedup_model(synthetic()[0], 200, begin=3), "begin applies only"),
    (lambda: fit_speedup_model(synthetic()[0], 200, verify_tokens="gamma+2"), "verify_tokens"),
    (lambda: fit_speedup_model(synthetic()[0], -1), "rp must be .*> 0"),
    (lambda: fit_speedup_model(synthetic()[0], 200, x0=[1, 2]), "10 values"),
    (lambda: SpeedupInputs.build(np.ones((2, 2)), 2, 8, 64, 0.9, 200).jacobian(TRUE), "one-dimensional"),
    (lambda: best_model_variant(pd.DataFrame({"mse": [1.0]}), metric="r2"), "metric"),
    (lambda: best_model_variant(pd.DataFrame({"mape": [1.0]})), "errors must be"),
    (lambda: from_sweep(pd.DataFrame({"batch_size": [1]}), 64), "rows lack the column"),
    (lambda: model_variant_errors(synthetic()[0], 200, variant="eq4"), "sets variant itself"),
])
def test_bad_arguments_raise(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_stride_samples_cover_the_batch_sizes_of_table_3():
    """Sorting by K, gamma, B and taking df[::stride] reproduces the paper's coverage column."""
    from moesd.paper_tables import paper_table

    frame, _ = synthetic()
    for row in paper_table("table_3").itertuples():
        sample = stride_sample(frame, row.stride)
        assert len(sample) == row.m
        covered = sorted(sample["B"].unique())
        special = {"1–40 only": [b for b in BATCH_SIZES if b <= 40],
                   "1, then 24–100": [1] + [b for b in BATCH_SIZES if b >= 24],
                   "all 19 except 20": [b for b in BATCH_SIZES if b != 20], "all 19": list(BATCH_SIZES)}
        if row.batch_sizes_covered in special:
            assert covered == special[row.batch_sizes_covered], row.m
        else:
            assert covered == [int(b) for b in row.batch_sizes_covered.split(", ")], row.m


def test_ridge_point_in_tokens_is_the_ridge_point_times_bytes_over_two():
    """A GEMM over t tokens with weights of b bytes does 2 t / b FLOP per weight byte: it reaches the ridge
    point RP (FLOP/byte) at RP b / 2 tokens, RP itself for bf16 and 2 RP for float32."""
    from moesd.measure.studies import load
    from moesd.measure.analysis import ridge_point_for, ridge_tokens_for
    from moesd.theory.roofline import HARDWARE

    record = HARDWARE["H200"].as_dict()
    rp = 989.5e12 / 4.8e12
    assert ridge_tokens_for({"hardware": record, "settings": {"dtype": "bfloat16"}}) == pytest.approx(rp)
    assert ridge_tokens_for({"hardware": record, "settings": {"dtype": "float32"}}) == pytest.approx(2 * rp)
    _, sidecar = load("sparsity", "cpu-dispatch")  # a float32 study
    tokens = ridge_tokens_for(sidecar)
    assert tokens == pytest.approx(2 * sidecar["hardware"]["peak_flops"] / sidecar["hardware"]["memory_bandwidth"])
    # The sweep's own GEMM records (float32, activations counted too): intensity 2 t / 4 while weights dominate.
    for row in sidecar["roofline_measurement"]["gemm"]:
        if row["tokens"] <= 8:
            assert row["arithmetic_intensity"] == pytest.approx(2 * row["tokens"] / 4, rel=0.01)
    assert 2 * tokens / 4 == pytest.approx(ridge_point_for(sidecar))
    with pytest.raises(ValueError, match="no dtype"):
        ridge_tokens_for({"hardware": record})
    with pytest.raises(ValueError, match="two dtypes"):
        ridge_tokens_for({"hardware": record, "settings": {"dtype": "float32"},
                          "roofline_measurement": {"settings": {"dtype": "bfloat16"}}})
    with pytest.raises(ValueError, match="dtype must be one of"):
        ridge_tokens_for({"hardware": record, "settings": {"dtype": "int4"}})
    with pytest.raises(ValueError, match="no measured roofline"):
        ridge_tokens_for({"settings": {"dtype": "float32"}})


def test_printed_variant_never_exceeds_its_ceiling():
    """Line 11's denominator holds ar + verify with verify >= ar, so no parameters reach sigma (gamma + 1) / 2."""
    from moesd.model.algorithm1 import compute_speedup, printed_variant_ceiling

    rng = np.random.default_rng(7)
    B = np.array([1, 2, 4, 8, 16, 32, 64, 100] * 3)
    gamma = np.repeat([1, 2, 4], 8)
    sigma = np.repeat([0.6, 0.9, 1.0], 8)
    ceiling = printed_variant_ceiling(sigma, gamma)
    highest = 0.0
    for _ in range(300):
        times = rng.lognormal(-4, 2, 8) * (rng.random(8) < 0.8)  # some terms exactly zero
        params = [*np.maximum(times, [0, 1e-12, 0, 0, 0, 0, 0, 0]), rng.uniform(0.2, 1), rng.uniform(1, 2)]
        ratio = compute_speedup(params, B, gamma, K=8, E=64, sigma=sigma, rp=rng.uniform(1, 300),
                                variant="printed") / ceiling
        assert (ratio <= 1 + 1e-12).all()
        highest = max(highest, ratio.max())
    assert highest > 0.9  # the bound is approached (draft and reject near zero, verify near ar), not loose


def test_printed_variant_ceiling_against_the_papers_peak():
    """Table 2's 2.29x (sigma 0.90, gamma 4) lies above the printed variant's ceiling of 2.25."""
    from moesd.model.algorithm1 import printed_variant_ceiling

    assert printed_variant_ceiling(0.90, 4) == pytest.approx(2.25)
    assert printed_variant_ceiling([0.9, 1.0], [1, 3]).tolist() == pytest.approx([0.9, 2.0])
    with pytest.raises(ValueError, match="gamma"):
        printed_variant_ceiling(0.9, 0)


def test_fitted_stage_times_and_the_decode_ratio_of_the_hand_fit():
    """HAND at B = 2, gamma = 3, K = 2, E = 4 (s = 1, G = 1): ar = 2, draft = 0.4, reject = 0.07
    (test_hand_worked_values); a measured decode step of 3 s is 1.5 of the fitted one."""
    lower, upper = parameter_bounds()
    result = FitResult(SpeedupParams(**HAND), "eq4", 100.0, 0.0, np.zeros(0), 0.0, pd.DataFrame(), "gamma",
                       lower, upper, 1, "hand-made", 0, 0)
    points = pd.DataFrame({"batch_size": [2, 2], "gamma": [3, 3], "num_experts_per_tok": [2, 2],
                           "t_target_1": [3.0, 2.0]})
    times = fitted_stage_times(result, points, 4, 100.0)
    np.testing.assert_allclose(times["ar"], [2.0, 2.0])
    np.testing.assert_allclose(times["draft"], [0.4, 0.4])
    np.testing.assert_allclose(decode_step_ratio(result, points, 4, 100.0), [1.5, 1.0])


def test_rms_and_the_batch_sizes_a_sample_leaves_out():
    assert rms([3.0, -4.0]) == pytest.approx(12.5 ** 0.5) and rms(np.array([2.0])) == 2.0
    assert missing_batch_sizes("1 4 16 100", [1, 2, 4, 8, 16, 100]) == [2, 8]
    assert missing_batch_sizes("1 10", [1, 10]) == [] and missing_batch_sizes("10", [1]) == [1]  # whole numbers
