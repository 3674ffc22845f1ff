"""The measured roofline (moesd.measure.hardware), the clocks (moesd.engine.timing) and the decode-step breakdown
(moesd.measure.breakdown): counting, record structure, sidecar round trips, the CLI.

Timings are never asserted: only structure, the FLOP and byte accounting, and invariants that hold
for any timing (best >= median throughput, peak = best of the curve, ridge = peak / bandwidth).
"""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from moesd.engine import timing  # noqa: E402
from moesd.measure import breakdown, hardware  # noqa: E402
from moesd.cli import main  # noqa: E402
from moesd.theory.experts import expected_active_experts  # noqa: E402
from moesd.measure.analysis import ridge_point_for
from moesd.theory.roofline import Hardware  # noqa: E402
from moesd.zoo import get_model  # noqa: E402


@pytest.fixture(scope="module")
def quick():
    return hardware.measure_roofline(quick=True, threads=1)


def test_stream_bytes_count_as_stream_does():
    assert hardware.stream_bytes("copy", 1000) == 2000
    assert hardware.stream_bytes("triad", [1, 8]).tolist() == [3, 24]
    with pytest.raises(ValueError, match="kernel must be one of copy, triad"):
        hardware.stream_bytes("scale", 8)
    with pytest.raises(ValueError, match="array_bytes"):
        hardware.stream_bytes("copy", -1)


def test_gemm_flops_is_two_m_n_k():
    assert hardware.gemm_flops(3, 5, 7) == 2 * 3 * 5 * 7
    assert hardware.gemm_flops([1, 2, 4], 3584, 2560).tolist() == [2 * m * 3584 * 2560 for m in (1, 2, 4)]
    with pytest.raises(ValueError, match="in_features must be a whole number"):
        hardware.gemm_flops(1, 2.5, 3)


def test_streaming_bandwidth_counts_bytes_of_a_known_array():
    table = hardware.streaming_bandwidth(array_bytes=4 * 2 ** 20, repeats=2).set_index("kernel")
    assert (table["array_bytes"] == 4 * 2 ** 20).all()
    assert table.loc["copy", "bytes_counted"] == 2 * 4 * 2 ** 20
    assert table.loc["triad", "bytes_counted"] == 3 * 4 * 2 ** 20
    assert np.allclose(table["bandwidth"], table["bytes_counted"] / table["best_seconds"])
    assert (table["bandwidth"] >= table["median_bandwidth"]).all() and (table["median_bandwidth"] > 0).all()


def test_gemm_curve_reports_flops_per_second():
    curve = hardware.gemm_curve((1, 3), in_features=32, out_features=16, repeats=2)
    assert curve["tokens"].tolist() == [1, 3]
    assert curve["flops"].tolist() == [2 * 1 * 32 * 16, 2 * 3 * 32 * 16]
    assert np.allclose(curve["flop_per_s"], curve["flops"] / curve["best_seconds"])
    assert (curve["flop_per_s"] >= curve["median_flop_per_s"]).all() and (curve["median_flop_per_s"] > 0).all()
    assert np.allclose(curve["weight_bandwidth"], 4 * 32 * 16 / curve["best_seconds"])
    assert curve["arithmetic_intensity"].tolist() == pytest.approx(
        [2 * m * 32 * 16 / (4 * (32 * 16 + m * 48)) for m in (1, 3)])


def test_measured_record_is_the_best_of_its_curves(quick):
    hw = quick.hardware
    assert hw.peak_flops == quick.gemm["flop_per_s"].max() > 0
    assert hw.memory_bandwidth == quick.bandwidth["bandwidth"].max() > 0
    assert quick.ridge_point == pytest.approx(hw.peak_flops / hw.memory_bandwidth)
    assert hw.memory_bytes > 2 ** 30
    assert "(1 threads, float32), measured" in hw.name and "(quick)" in hw.source
    assert quick.settings["threads"] == 1 and quick.settings["dtype"] == "float32"


def test_record_round_trips_through_a_sidecar(quick):
    entries = json.loads(json.dumps(quick.sidecar_entries()))  # what a sweep writes and a chapter reads
    assert Hardware.from_dict(entries["hardware"]) == quick.hardware
    assert ridge_point_for(entries) == pytest.approx(quick.ridge_point)
    back = hardware.RooflineMeasurement.from_sidecar(entries)
    assert back.hardware == quick.hardware and back.settings == quick.settings
    assert back.gemm.equals(quick.gemm) and back.bandwidth.equals(quick.bandwidth)
    with pytest.raises(ValueError, match="no measured roofline"):
        hardware.RooflineMeasurement.from_sidecar({"hardware": entries["hardware"]})


def test_thread_cpu_time_clock(quick):
    measured = hardware.measure_roofline(quick=True, threads=1, clock="cpu")
    assert measured.settings["clock"] == "cpu" and "thread CPU time" in measured.hardware.source
    assert measured.hardware.peak_flops > 0 and measured.hardware.memory_bandwidth > 0
    assert quick.settings["clock"] == "wall"


def test_the_cpu_clock_reads_thread_time_and_the_wall_clock_perf_counter(monkeypatch):
    """Stub clocks that advance by different steps per read: each setting must time with its own clock."""
    import itertools

    thread, wall = itertools.count(0, 0.5), itertools.count(0, 7.0)
    monkeypatch.setattr(timing.time, "thread_time", lambda: next(thread))
    monkeypatch.setattr(timing.time, "perf_counter", lambda: next(wall))
    cpu = torch.device("cpu")
    with hardware.torch_threads(1):  # thread CPU time is one thread's: the clock requires one torch thread
        assert timing.time_calls(lambda: None, 3, cpu, clock="cpu") == [0.5, 0.5, 0.5]
    assert timing.time_calls(lambda: None, 3, cpu, clock="wall") == [7.0, 7.0, 7.0]


def test_threads_are_restored():
    before = torch.get_num_threads()
    hardware.gemm_curve((1,), 8, 8, repeats=1)
    with hardware.torch_threads(1) as used:
        assert used == 1 == torch.get_num_threads()
    assert torch.get_num_threads() == before


@pytest.mark.parametrize("changes, match", [
    ({"device": "tpu"}, "device must be 'cpu' or 'cuda'"),
    ({"dtype": "int8"}, "dtype must be a torch floating-point type"),
    ({"threads": 0}, "threads must be a whole number >= 1"),
    ({"clock": "sundial"}, "clock must be 'wall' or 'cpu'"),
    ({"clock": "cpu", "threads": 2}, "needs device 'cpu' and one torch thread"),
])
def test_bad_arguments_fail_before_measuring(changes, match):
    with pytest.raises(ValueError, match=match):
        hardware.measure_roofline(**{"quick": True, **changes})


@pytest.mark.real_roofline
def test_a_sweep_measures_once_per_process(monkeypatch, quick):
    calls = []
    monkeypatch.setattr(hardware, "measure_roofline", lambda *args: calls.append(args) or quick)
    hardware._measured_once.cache_clear()
    try:
        first = hardware.measured_roofline("cpu", "float32", 1)
        assert hardware.measured_roofline("cpu", "float32", 1) is first and len(calls) == 1
        hardware.measured_roofline("cpu", "bfloat16", 1)
        assert calls == [("cpu", "float32", 1), ("cpu", "bfloat16", 1)]
    finally:
        hardware._measured_once.cache_clear()


def test_sweep_sidecar_holds_the_measured_roofline(monkeypatch, quick):
    from moesd.measure import result_file
    from moesd.measure.presets import preset

    monkeypatch.setattr(result_file, "measured_roofline", lambda device, dtype: quick)
    sidecar = result_file.environment(preset("forward", "cpu"))
    assert ridge_point_for(sidecar) == pytest.approx(quick.ridge_point)
    assert sidecar["roofline_measurement"]["settings"]["dtype"] == "float32"


def _linear_values(config, layers):
    """Plain-Python count of one Qwen2-MoE decoder stack's non-expert values, from its config."""
    d, heads, kv = config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"]
    head = d // heads
    attention = 2 * (d * d + d) + 2 * (kv * head * d + kv * head)  # q, o (o without bias) / k, v
    attention -= d  # o_proj has no bias
    shared = 3 * d * config["shared_expert_intermediate_size"] + d  # gate, up, down + shared_expert_gate
    router = config["num_experts"] * d
    norms = 2 * d
    return layers * (attention + shared + router + norms) + d + config["vocab_size"] * d  # final norm, lm_head


def test_step_cost_counts_bytes_by_hand():
    spec = get_model("qwen2-57b-a14b")
    config = spec.config_dict(2, None, 1 / 8)
    cost = breakdown.step_cost("qwen2-57b-a14b", [1, 8], layers=2, width=1 / 8, context=10, bytes_per_value=4)
    expert_values = 3 * config["hidden_size"] * config["moe_intermediate_size"]
    head = config["hidden_size"] // config["num_attention_heads"]
    assert cost["dense_bytes"].tolist() == [4 * _linear_values(config, 2)] * 2
    assert cost["expert_bytes"].tolist() == pytest.approx(
        [4 * 2 * expected_active_experts(b, 64, 8) * expert_values for b in (1, 8)])
    assert cost["expert_bytes"][0] == 4 * 2 * 8 * expert_values  # one token: exactly K experts per layer
    assert cost["cache_bytes"].tolist() == [4 * 2 * 2 * b * 10 * config["num_key_value_heads"] * head for b in (1, 8)]
    assert cost["expert_flops"].tolist() == [2 * b * 8 * 2 * expert_values for b in (1, 8)]
    assert cost["tokens_per_expert"][0] == pytest.approx(1.0)


def test_step_cost_of_a_dense_tied_model_counts_the_embedding_once():
    spec = get_model("qwen2-0.5b")
    config = spec.config_dict(3, None, 1 / 8)
    cost = breakdown.step_cost("qwen2-0.5b", [1, 100], layers=3, width=1 / 8, bytes_per_value=2)
    assert (cost["expert_bytes"] == 0).all() and (cost["active_experts"] == 0).all()
    values = spec.parameter_counts(3, None, 1 / 8)["total"]  # the tied embedding is one parameter
    assert cost["dense_bytes"][0] == 2 * values
    assert config["tie_word_embeddings"]


def test_dispatch_and_breakdown_structure(quick, monkeypatch):
    # No cache to defeat: each product reuses one weight instead of copies filling 4x the last-level cache.
    monkeypatch.setattr(hardware, "last_level_cache_bytes", lambda device="cpu": None)
    dispatch = breakdown.expert_dispatch_seconds(repeats=1)
    assert dispatch["table"]["experts"].tolist() == list(range(8, 65, 8))
    assert {"per_expert_seconds", "fixed_seconds"} <= set(dispatch)
    frame = breakdown.decode_step_breakdown(layers=1, width=1 / 32, batch_sizes=(1, 3), context=8, repeats=1,
                                            roofline=quick, dispatch=dispatch, threads=1)
    assert frame["batch_size"].tolist() == [1, 3] and (frame["measured_s"] > 0).all()
    parts = frame["matmul_s"] + frame["dispatch_s"] + frame["other_overhead_s"] + frame["residual_s"]
    assert np.allclose(parts, frame["measured_s"])
    assert np.allclose(frame["streaming_s"], frame["bytes"] / quick.hardware.memory_bandwidth)
    assert np.allclose(frame["dispatch_s"], dispatch["per_expert_seconds"] * frame["active_experts"])
    assert np.allclose(frame["streaming_share"], frame["streaming_s"] / frame["measured_s"])
    with pytest.raises(ValueError, match="dense"):
        breakdown.expert_dispatch_seconds("qwen2-0.5b")
    with pytest.raises(ValueError, match="statistic must be 'median' or 'best'"):
        breakdown.decode_step_breakdown(statistic="mean")


def test_breakdown_by_hand_with_stubbed_timers(quick, monkeypatch):
    """Stubbed timers, counts by hand. One Qwen2-MoE layer has 10 dense weight matrices (q, k, v, o, router,
    the shared expert's gate, up and down, its sigmoid gate, the LM head; the embedding is a lookup) and
    stores each expert as 2 (fused gate-up, down). Every product costs 5 us from memory and 2 us from
    cache, as much as an empty call: compute is 0 net of the call, the products read from memory cost
    (10 + 2 N(B)) x 3 us with N(B) from Eq. 8. Steps: 1 ms x B at the measured width, 0.1 ms x B at the
    overhead width; 4 us per activated expert of dispatch."""
    def step(net, batch_size, tokens, context, repeats, seed, clock):
        return [(1e-3 if net.config.hidden_size > 64 else 1e-4) * batch_size]

    def products(shapes, tokens, dtype, device, repeats, from_memory, statistic, clock):
        return {(out, inp, m): 5e-6 if from_memory else 2e-6 for out, inp in shapes for m in tokens}

    monkeypatch.setattr(breakdown, "forward_seconds", step)
    monkeypatch.setattr(breakdown, "matmul_seconds", products)
    frame = breakdown.decode_step_breakdown(layers=1, width=1 / 32, batch_sizes=(1, 3, 16), context=8, repeats=1,
                                            roofline=quick, dispatch={"per_expert_seconds": 4e-6}, threads=1)
    batch = np.array([1, 3, 16])
    experts = expected_active_experts(batch, 64, 8)
    assert frame["active_experts"].to_numpy() == pytest.approx(experts)
    assert frame["measured_s"].to_numpy() == pytest.approx(1e-3 * batch)
    assert frame["compute_s"].to_numpy() == pytest.approx(0.0, abs=1e-15)
    assert frame["matmul_s"].to_numpy() == pytest.approx((10 + 2 * experts) * 3e-6)
    assert frame["dispatch_s"].to_numpy() == pytest.approx(4e-6 * experts)
    assert frame["other_overhead_s"].to_numpy() == pytest.approx(1e-4 * batch - 4e-6 * experts)
    assert frame["residual_s"].to_numpy() == pytest.approx(9e-4 * batch - (10 + 2 * experts) * 3e-6)


def test_cli_measures_and_writes_json(tmp_path, monkeypatch, capsys, quick):
    monkeypatch.setattr(hardware, "measure_roofline", lambda device, dtype, threads: quick)
    path = tmp_path / "hw.json"
    assert main(["hardware", "--measure", "--threads", "1", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "H200" in out and "measured here: " + quick.hardware.name in out and "best GFLOP/s" in out
    assert ridge_point_for(json.loads(path.read_text())) == pytest.approx(quick.ridge_point)


@pytest.mark.parametrize("argv, message", [
    (["hardware", "--threads", "2"], "--threads applies only with --measure"),
    (["hardware", "--measure", "--threads", "0"], "--threads must be >= 1"),
    (["hardware", "--measure", "--json", "/no/such/folder/hw.json"], "--json: folder"),
    (["hardware", "--measure", "--dtype", "int8"], "argument --dtype: invalid choice"),
])
def test_cli_bad_arguments_exit_2_before_work(argv, message, monkeypatch, capsys):
    monkeypatch.setattr(hardware, "measure_roofline", lambda *args: pytest.fail("measured despite a bad argument"))
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err
