"""Is a study in the paper's regime: the bytes a step reads, the streaming share, the regime check's design."""

import json

import numpy as np
import pandas as pd
import pytest

from moesd._checks import UsageError
from moesd.measure.regime import (RegimeCheck, StreamingShare, measured_streaming_share, step_bytes, streaming_share,
                                  study_sidecar, target_step_seconds)
from moesd.zoo import depth_scaled_vocab, get_model


def sidecar(model="qwen2-57b-a14b", dtype="bfloat16", layers=1, bandwidth=20e9, **settings):
    values = study_sidecar(model, dtype, layers, bandwidth=bandwidth)
    values["settings"].update(settings)
    return values


def test_depth_scaled_vocab_cuts_by_the_depth_factor():
    qwen = get_model("qwen2-57b-a14b")
    assert depth_scaled_vocab("qwen2-57b-a14b", qwen.num_layers) >= qwen.config["vocab_size"]
    one = depth_scaled_vocab("qwen2-57b-a14b", 1)
    assert one % 64 == 0 and one - 64 < qwen.config["vocab_size"] / qwen.num_layers <= one
    assert depth_scaled_vocab("opt-30b", 1) == 64 * int(np.ceil(50272 / 48 / 64))
    with pytest.raises(ValueError, match=r"layers must be a whole number in \[1, 28\]"):
        depth_scaled_vocab("qwen2-57b-a14b", 29)


def test_step_bytes_count_the_weights_a_b1_step_reads_by_hand():
    """One Qwen2-57B-A14B layer at B = 1 reads its attention, router, shared expert, K of E experts, LM head."""
    config = get_model("qwen2-57b-a14b").config
    d, f, shared = config["hidden_size"], config["moe_intermediate_size"], config["shared_expert_intermediate_size"]
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    head = d // heads
    vocab = depth_scaled_vocab("qwen2-57b-a14b", 1)
    attention = d * heads * head + 2 * d * kv * head + heads * head * d + (heads + 2 * kv) * head  # q, k, v (bias), o
    expected = 2 * (attention + config["num_experts"] * d + 3 * d * shared + d  # router, shared expert and its gate
                    + config["num_experts_per_tok"] * 3 * d * f + vocab * d)
    assert step_bytes(sidecar()) == pytest.approx(expected, rel=0.01)  # norms and the KV cache are small
    assert step_bytes(sidecar(dtype="float32")) == pytest.approx(2 * step_bytes(sidecar()), rel=1e-9)
    assert step_bytes(sidecar(), batch_size=24) > step_bytes(sidecar())  # more experts activated


def test_streaming_share_is_bytes_over_bandwidth_over_the_step():
    values = sidecar(bandwidth=10e9)
    share = streaming_share(values, 0.2)
    assert isinstance(share, StreamingShare) and share.bandwidth == 10e9 and share.step_seconds == 0.2
    assert share.share == pytest.approx(share.bytes / 10e9 / 0.2)
    assert streaming_share(values, 0.1).share == pytest.approx(2 * share.share)
    with pytest.raises(ValueError, match="step_seconds must be > 0"):
        streaming_share(values, 0.0)


def test_measured_streaming_share_reads_the_smallest_batch_of_a_result_file():
    values = sidecar()
    forward = pd.DataFrame({"role": ["target", "target", "target", "draft"], "batch_size": [2, 2, 8, 2],
                            "tokens": [1, 1, 1, 1], "seconds": [0.1, 0.3, 0.5, 0.01]})
    share = measured_streaming_share(forward, values)
    assert share["batch_size"] == 2 and share["step_seconds"] == pytest.approx(0.2)  # the median of 0.1 and 0.3
    e2e = pd.DataFrame({"batch_size": [4, 1, 1], "t_target_1": [0.3, 0.1, 0.2]})
    assert measured_streaming_share(e2e, values)["step_seconds"] == pytest.approx(0.15)
    assert measured_streaming_share(pd.DataFrame(), values) is None
    # a study over several K: the densest K's steps, priced with that K's experts
    sparsity = pd.DataFrame({"batch_size": [1, 1, 1, 1], "num_experts_per_tok": [1, 1, 8, 8],
                             "t_target_1": [0.05, 0.05, 0.2, 0.2]})
    share = measured_streaming_share(sparsity, values)
    assert share["top_k"] == 8 and share["step_seconds"] == pytest.approx(0.2)
    assert share["bytes"] == pytest.approx(step_bytes(values, top_k=8))
    assert step_bytes(values, top_k=1) < step_bytes(values, top_k=8)
    assert measured_streaming_share(e2e, {"settings": values["settings"]}) is None  # no measured roofline


def test_the_target_step_is_the_median_of_its_repeats_at_that_batch_and_width():
    rows = pd.DataFrame({"role": ["target"] * 4 + ["draft"], "batch_size": [1, 1, 1, 2, 1],
                         "tokens": [1, 1, 1, 1, 1], "seconds": [0.3, 0.1, 0.2, 9.0, 5.0]})
    assert target_step_seconds(rows) == 0.2  # the draft's and B = 2's forwards left out
    assert target_step_seconds(rows, batch_size=2) == 9.0
    with pytest.raises(UsageError) as error:
        target_step_seconds(rows, tokens=5)
    assert error.value.argument == "batch_size"


def test_the_design_picks_the_dtype_that_streams_most():
    steps = pd.DataFrame([{"model": "m", "dtype": "float32", "streaming_share": 0.5},
                          {"model": "m", "dtype": "bfloat16", "streaming_share": 0.7},
                          {"model": "d", "dtype": "float32", "streaming_share": 0.4}])
    check = RegimeCheck(pd.DataFrame(), pd.DataFrame(), steps, {"threads": 2})
    design = check.design().set_index("model")
    assert design.loc["m", "dtype"] == "bfloat16" and design.loc["m", "in_regime"]
    assert not design.loc["d", "in_regime"]
    assert RegimeCheck.from_dict(json.loads(json.dumps(check.as_dict()))).steps.equals(steps)


def test_the_shipped_regime_check_describes_this_project_s_cpu():
    """data/measurements/cpu/regime.json: every model and dtype measured, the products are most of the step."""
    from moesd.measure.studies import measurements_dir

    check = RegimeCheck.from_dict(json.loads((measurements_dir() / "cpu" / "regime.json").read_text()))
    assert set(check.steps["dtype"]) == {"float32", "bfloat16"} and set(check.steps["model"]) == {"qwen2-57b-a14b",
                                                                                               "opt-30b"}
    assert (check.steps["products_share"] > 0.6).all()  # a B = 1 step at real width is its matrix products
    assert (check.steps["dispatch_share"] < 0.1).all()
    assert set(check.gemm["tokens"]) >= {1, 512}
