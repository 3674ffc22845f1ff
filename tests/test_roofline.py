"""Eq. 1 (ridge points, arithmetic intensity, time floors, compute-bound token counts), Eq. 11 (G) and the
rejection kernel's traffic."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from moesd.predictor.kernels import Efficiency, rejection_time
from moesd.theory.experts import tokens_per_expert
from moesd.theory.growth import G
from moesd.theory.roofline import (
    HARDWARE,
    Hardware,
    arithmetic_intensity,
    compute_bound_tokens,
    ffn_cost,
    ffn_target_efficiency,
    ridge_point,
    time_floor,
)


def test_ridge_points_of_the_specification():
    """MOESD.md Eq. 1 remark: A800 ~ 153, H800 ~ 295, L40 ~ 210, H200 ~ 206."""
    assert ridge_point("A800") == pytest.approx(153, abs=0.5)
    assert ridge_point("H800") == pytest.approx(295, abs=0.5)
    assert ridge_point("L40") == pytest.approx(210, abs=0.6)
    assert ridge_point(HARDWARE["H200"]) == pytest.approx(206, abs=0.5)


def test_every_record_cites_its_source():
    required = {"A800", "H800", "H100", "H200", "H20", "A100", "L40", "B200", "MI300X", "CPU"}
    assert required <= set(HARDWARE)
    for hw in HARDWARE.values():
        assert len(hw.source) > 20 and hw.peak_flops > 0 and hw.memory_bandwidth > 0


#: Dense bf16 tensor peak (TFLOP/s) and memory bandwidth (TB/s) as the vendors' data sheets print them,
#: typed here independently of moesd.theory.roofline (dense: half the "with sparsity" figure).
DATA_SHEETS = {"A800": (312, 2.039), "A100": (312, 2.039), "H800": (989.5, 3.35), "H100": (989.5, 3.35),
               "H200": (989.5, 4.8), "H20": (148, 4.0), "L40": (181.05, 0.864), "B200": (2250, 8.0),
               "MI300X": (1307.4, 5.3)}


@pytest.mark.parametrize("name", sorted(DATA_SHEETS))
def test_every_gpu_record_has_its_data_sheets_peaks(name):
    flops, bandwidth = DATA_SHEETS[name]
    hw = HARDWARE[name]
    assert hw.peak_flops == pytest.approx(flops * 1e12, rel=1e-3)
    assert hw.memory_bandwidth == pytest.approx(bandwidth * 1e12, rel=1e-3)
    assert ridge_point(name) == pytest.approx(flops / bandwidth, rel=1e-3)


def test_unknown_hardware():
    with pytest.raises(ValueError, match="hardware must be one of"):
        ridge_point("TPU")


def test_ffn_cost_by_hand():
    # Dense SwiGLU, d = 2, d_ff = 3, one token: 2 x 18 FLOP; (18 weights + 2 x 2 activations) x 2 bytes.
    flops, traffic = ffn_cost(1, 2, 3)
    assert flops == 36 and traffic == 44
    assert arithmetic_intensity(flops, traffic) == pytest.approx(36 / 44)


def test_expert_intensity_is_tokens_per_expert():
    """With weights dominating traffic, a layer of experts has AI = T_exp (bf16)."""
    t = np.array([1.0, 8.0, 64.0, 400.0])
    intensity = arithmetic_intensity(*ffn_cost(t, 100_000, 100_000, E=64, K=8))
    np.testing.assert_allclose(intensity, tokens_per_expert(t, 8 / 64), rtol=1e-3)


def test_time_floor_switches_at_the_ridge_point():
    hw = HARDWARE["H100"]
    memory_bound = time_floor(1.0, 1e9, hw)
    assert memory_bound == pytest.approx(1e9 / hw.memory_bandwidth)
    compute_bound = time_floor(1e15, 1.0, hw)
    assert compute_bound == pytest.approx(1e15 / hw.peak_flops)


def test_sparse_experts_turn_compute_bound_later():
    hw = HARDWARE["H100"]
    dense = compute_bound_tokens(hw, 3584, 8 * 2560)
    moe = compute_bound_tokens(hw, 3584, 2560, E=64, K=8)
    assert dense >= hw.ridge_point  # activations only lower the intensity
    assert moe > 7 * dense  # T_exp ~ rho t for large t: rho = 1/8
    assert compute_bound_tokens(hw, 3584, 2560, E=64, K=8, max_tokens=100) is None


def test_compute_bound_tokens_by_hand():
    """H100 (RP = 989.5 / 3.35 = 295.37 FLOP/byte), d = 3584, bf16. Dense SwiGLU of w = 3 d 20480 weights:
    AI = 2 w t / (2 (w + 2 t d)) >= RP from t = RP w / (w - 2 RP d) = 298.24, so 299 tokens. 64 experts of
    w = 3 d 2560, K = 8, all activated long before: AI = 8 t / (64 + 16 t d / w) >= RP from
    t = 64 RP / (8 - 16 RP d / w) = 2559.88, so 2560 tokens."""
    hw = HARDWARE["H100"]
    rp, d = 989.5 / 3.35, 3584
    dense_w, expert_w = 3 * d * 20480, 3 * d * 2560
    assert np.ceil(rp * dense_w / (dense_w - 2 * rp * d)) == 299
    assert np.ceil(64 * rp / (8 - 16 * rp * d / expert_w)) == 2560
    assert compute_bound_tokens(hw, d, 20480) == 299
    assert compute_bound_tokens(hw, d, 2560, E=64, K=8) == 2560


def test_rejection_reads_the_targets_and_the_drafts_distributions():
    """B = 4 sequences, gamma = 3, V = 32000: the target's 4 distributions and the draft's 3 per sequence,
    4 x 7 x 32000 fp32 values = 3,584,000 bytes at H100's 3.35 TB/s (fraction 1, no kernel cost), then 3
    kernels of 2 us, 7 us each without CUDA graphs."""
    ideal = Efficiency(bandwidth_fraction=1.0, kernel_seconds=0.0)
    assert rejection_time("H100", 4, 3, 32000, ideal) == pytest.approx(3_584_000 / 3.35e12, rel=1e-12)
    assert rejection_time("H100", 4, 3, 32000, Efficiency(bandwidth_fraction=1.0)) == pytest.approx(
        3_584_000 / 3.35e12 + 3 * 2e-6, rel=1e-12)
    assert rejection_time("H100", 4, 3, 32000, Efficiency(bandwidth_fraction=1.0), cuda_graphs=False) == \
        pytest.approx(3_584_000 / 3.35e12 + 3 * 7e-6, rel=1e-12)


def test_ffn_target_efficiency_limits():
    hw = HARDWARE["H100"]
    dense = ffn_target_efficiency(np.array([1, 10_000]), 4, hw, 3584, 20480)
    assert dense[0] == pytest.approx(1.0, abs=1e-3)  # memory-bound: four tokens cost one
    assert dense[1] == pytest.approx(0.25, rel=1e-9)  # compute-bound: four times the work
    # One token loads K experts, four tokens N(4): verification costs N(4) / K more.
    moe = ffn_target_efficiency(1, 4, hw, 3584, 2560, E=64, K=8)
    assert moe == pytest.approx(8 / 26.484, rel=1e-3)


def test_g_by_hand():
    assert G(0, 10, 1.5) == 1.0
    assert G(3, 10, 2.0) == pytest.approx(8.0)
    # Above the transition: 2^2 (1 + ln 2 (5 - 2))
    assert G(5, 2, 2.0) == pytest.approx(4 * (1 + np.log(2) * 3))
    np.testing.assert_allclose(G(np.array([0, 5, 500]), 50, 1.0), 1.0)


@given(st.floats(0.5, 300), st.floats(1.0001, 2.0))
def test_g_and_its_slope_are_continuous(lam_rp, s):
    """Both one-sided difference quotients at lam_rp equal the slope ln(s) s**lam_rp."""
    h = 1e-6 * lam_rp
    left, mid, right = G([lam_rp - h, lam_rp, lam_rp + h], lam_rp, s)
    slope = np.log(s) * s**lam_rp
    assert (mid - left) / h == pytest.approx(slope, rel=1e-3)
    assert (right - mid) / h == pytest.approx(slope, rel=1e-3)


@given(st.floats(0, 1000), st.floats(0, 100), st.floats(0.5, 300), st.floats(1, 2))
def test_g_non_decreasing(t, dt, lam_rp, s):
    assert G(t + dt, lam_rp, s) >= G(t, lam_rp, s) * (1 - 1e-12)


@pytest.mark.parametrize("call, name", [
    (lambda: G(-1, 10, 1.5), "t"),
    (lambda: G(1, 0, 1.5), "lam_rp"),
    (lambda: G(1, 10, 0.9), "s"),
    (lambda: G(1, 10, np.nan), "s"),
    (lambda: ffn_cost(4, 0, 10), "d_model"),
    (lambda: ffn_cost(4, 10, 10.5), "d_ff"),
    (lambda: ffn_cost(4, 10, 10, E=4, K=8), "K"),
    (lambda: ffn_cost(-4, 10, 10), "tokens"),
    (lambda: arithmetic_intensity(1, 0), "traffic"),
    (lambda: time_floor(-1, 1, HARDWARE["H100"]), "flops"),
])
def test_bad_input_names_the_argument(call, name):
    with pytest.raises(ValueError, match=rf"^{name} "):
        call()


def test_records_stored_before_the_new_fields_still_load():
    """A sidecar written with the first five fields only (older sweeps) gives the defaults for the rest."""
    old = {"name": "X", "peak_flops": 1e12, "memory_bandwidth": 1e11, "memory_bytes": 1e9, "source": "test"}
    record = Hardware.from_dict(old)
    assert record.interconnect_bandwidth == 0 and record.bandwidth_fraction == record.flops_fraction == 1
    assert record.fp8_flops is None and record.fp32_flops is None
    assert Hardware.from_dict(HARDWARE["H800"].as_dict()) == HARDWARE["H800"]


def test_interconnects_of_the_specification():
    """NVLink capped at 400 GB/s on A800/H800, 900 GB/s on H100/H200/H20, PCIe on L40 (both directions)."""
    link = {name: hw.interconnect_bandwidth / 1e9 for name, hw in HARDWARE.items()}
    assert link["A800"] == link["H800"] == 400 and link["H100"] == link["H200"] == link["H20"] == 900
    assert link["L40"] == 64 and "PCIe" in HARDWARE["L40"].interconnect and link["CPU"] == 0
    assert link["A100"] == 600 and link["B200"] == 1800


def test_every_gpu_record_names_the_gpus_its_link_joins():
    """Eight per node (HGX boards, the MI300X platform, an L40 server), 72 in a GB200 or GB300 NVL72 rack's NVLink
    domain; a record without a link has one, as does an old sidecar's record, so tensor parallelism needs a record
    that says how far its link reaches."""
    for name, hw in HARDWARE.items():
        if name == "CPU":
            assert hw.gpus_per_node == 1 and not hw.interconnect_bandwidth
            continue
        per_node = 72 if name in ("GB200", "GB300") else 8
        assert hw.gpus_per_node == per_node and f"{per_node} GPUs" in hw.interconnect, name
    old = {"name": "X", "peak_flops": 1e12, "memory_bandwidth": 1e11, "memory_bytes": 1e9, "source": "test"}
    assert Hardware.from_dict(old).gpus_per_node == 1


def test_every_gpu_record_cites_its_link_and_achieved_fractions():
    for name, hw in HARDWARE.items():
        if name == "CPU":
            continue
        assert hw.interconnect and hw.efficiency_source and hw.interconnect_latency > 0
        assert 0.4 < hw.bandwidth_fraction <= 1 and 0.4 < hw.flops_fraction <= 1
        assert hw.fp32_flops is None or hw.fp32_flops < hw.peak_flops
        # fp8 twice bf16: the L40S data sheet's dense figures, 733 and 362.05 TFLOPS, are 1.2 % off that
        assert hw.fp8_flops is None or hw.fp8_flops == pytest.approx(2 * hw.peak_flops, rel=0.015)


def test_a_tree_rejection_reads_each_verified_and_each_drafted_distribution():
    bare = Efficiency(kernel_seconds=0.0, launch_seconds=0.0)
    chain = rejection_time("H100", 4, 3, 32000, bare)
    tree = rejection_time("H100", 4, 3, 32000, bare, verified=16)  # 16 target and 15 draft distributions
    assert tree / chain == pytest.approx((2 * 16 - 1) / (2 * 3 + 1))
    assert rejection_time("H100", 4, 3, 32000, bare, verified=4) == pytest.approx(chain)
