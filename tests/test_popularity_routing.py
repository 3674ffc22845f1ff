"""Routing by a trained router's popularity in the timed studies: exact inclusion, seeded, N(t) as predicted."""

import json

import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from moesd._checks import UsageError  # noqa: E402
from moesd.measure.bench import run_sweep  # noqa: E402
from moesd.measure.router_control import RoutingControl, draw_by_popularity  # noqa: E402
from moesd.measure.sweeps import SweepConfig  # noqa: E402
from moesd.routing import sources  # noqa: E402
from moesd.theory.experts import expected_active_experts, expected_active_experts_from_popularity  # noqa: E402
from moesd.zoo import get_model  # noqa: E402

BASE = dict(target="qwen2-57b-a14b", draft="qwen2-0.5b", layers=2, draft_layers=1, width=1 / 32)


@pytest.fixture(scope="module")
def moe():
    return get_model("qwen2-57b-a14b").random_model(num_layers=2, width=1 / 32, seed=0)


def test_each_token_draws_k_distinct_experts_each_with_its_popularity():
    p = torch.as_tensor(sources.popularity("olmoe/wikipedia")[2], dtype=torch.float64)  # a skewed layer
    draws = draw_by_popularity(p, 40000, 8, torch.Generator().manual_seed(0))
    assert draws.shape == (40000, 8)
    assert (torch.sort(draws, dim=-1).values.diff(dim=-1) > 0).all()  # distinct within a token
    frequency = torch.bincount(draws.ravel(), minlength=64).double() / 40000
    standard_error = torch.sqrt(p * (1 - p) / 40000)
    assert (torch.abs(frequency - p) < 5 * standard_error + 1e-12).all()  # inclusion probability p_e


def test_draws_handle_certain_and_impossible_experts():
    p = torch.tensor([1.0, 0.0, 0.5, 0.5, 0.0, 1.0], dtype=torch.float64)  # sums to K = 3
    draws = draw_by_popularity(p, 2000, 3, torch.Generator().manual_seed(1))
    chosen = torch.bincount(draws.ravel(), minlength=6)
    assert chosen[0] == chosen[5] == 2000 and chosen[1] == chosen[4] == 0
    assert (torch.sort(draws, dim=-1).values.diff(dim=-1) > 0).all()


def test_popularity_routing_activates_what_the_popularity_model_expects(moe):
    """Measured N(t) per forward against sum_e 1 - (1 - p_e)^t of each model layer's mapped popularity."""
    popularity = sources.popularity("olmoe/github")
    mapped = popularity[[0, 1]]  # two model layers take recorded layers 0 and 7
    with torch.no_grad(), RoutingControl(moe, "popularity", keep=60, popularity=popularity, seed=3) as control:
        for batch, tokens in ((1, 1), (4, 1), (4, 5), (16, 5)):
            for seed in range(60):
                ids = torch.randint(1, moe.config.vocab_size, (batch, tokens), generator=torch.Generator().manual_seed(seed))
                moe(input_ids=ids)
            t = batch * tokens
            expected = float(np.mean([expected_active_experts_from_popularity(t, p) for p in mapped]))
            assert control.mean_distinct() == pytest.approx(expected, rel=0.03)
            if t > 8:  # below Eq. 8, as a skewed popularity must be
                assert expected < float(expected_active_experts(t, 64, 8))


def test_popularity_draws_are_reproducible_by_seed(moe):
    popularity = sources.popularity("olmoe/c4")
    ids = torch.randint(1, moe.config.vocab_size, (3, 4), generator=torch.Generator().manual_seed(0))

    def routed(seed):
        with torch.no_grad(), RoutingControl(moe, "popularity", popularity=popularity, seed=seed) as control:
            moe(input_ids=ids)
        return [layer.clone() for layer in control.forwards[-1]]

    first, again, other = routed(7), routed(7), routed(8)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not all(torch.equal(a, b) for a, b in zip(first, other))


def test_routing_control_refuses_a_popularity_of_another_shape(moe):
    with pytest.raises(ValueError, match="needs one"):
        RoutingControl(moe, "popularity")
    with pytest.raises(ValueError, match=r"shape \(layers, 64\)"):
        RoutingControl(moe, "popularity", popularity=sources.popularity("mixtral/c4"))
    with pytest.raises(ValueError, match="summing to K = 8"):
        RoutingControl(moe, "popularity", popularity=sources.popularity("olmoe/c4") / 2)


def test_sweep_settings_check_the_source():
    config = SweepConfig("forward", **BASE, routing="popularity", routing_source="olmoe/c4")
    assert config.settings()["routing_source"] == "olmoe/c4"
    assert "routing_source" not in SweepConfig("forward", **BASE).settings()  # as in older sidecars
    with pytest.raises(UsageError, match="routing_source names the trained router"):
        SweepConfig("forward", **BASE, routing="popularity")
    with pytest.raises(UsageError, match="routing_source names the trained router"):
        SweepConfig("forward", **BASE, routing_source="olmoe/c4")
    with pytest.raises(UsageError, match="routing_source 'olmoe/nowhere' is not a shipped source"):
        SweepConfig("forward", **BASE, routing="popularity", routing_source="olmoe/nowhere")
    with pytest.raises(UsageError, match="routes E = 8, K = 2; the sweep's qwen2-57b-a14b has E = 64 and K = 8"):
        SweepConfig("forward", **BASE, routing="popularity", routing_source="mixtral/c4")
    with pytest.raises(UsageError, match="K = 4"):
        SweepConfig("forward", **BASE, routing="popularity", routing_source="olmoe/c4", top_ks=(4,))
    with pytest.raises(UsageError, match="popularity routing draws the target's experts at random"):
        SweepConfig("e2e", target="qwen2-57b-a14b", draft="qwen2-0.5b", weights="pretrained", routing="popularity",
                    routing_source="olmoe/c4", sigma="real")


def test_a_popularity_routed_forward_study_records_its_source_and_the_expected_experts(tmp_path):
    config = SweepConfig("forward", **{**BASE, "batch_sizes": (1, 8), "gammas": (4,), "context": 4, "repeats": 6,
                                       "warmup": 0}, routing="popularity", routing_source="olmoe/wikipedia")
    path = run_sweep(config, tmp_path, progress=False)
    sidecar = json.loads(path.with_suffix(".json").read_text())
    source = sidecar["routing_source"]
    assert source["source"] == "olmoe/wikipedia" and source["licence"] == "Apache-2.0"
    assert source["layers_mapped"] == [0, 7] and source["repository"] == "https://github.com/allenai/OLMoE"
    target = pd.read_csv(path).query("role == 'target'")
    mapped = sources.popularity("olmoe/wikipedia", num_layers=2)
    for (batch, tokens), rows in target.groupby(["batch_size", "tokens"]):
        t = batch * tokens
        expected = np.mean([expected_active_experts_from_popularity(t, p) for p in mapped])
        # each row: the mean over 2 layers of one forward's distinct experts
        assert (rows["activated_experts"] <= min(64, t * 8)).all()
        assert rows["activated_experts"].mean() == pytest.approx(expected, rel=0.12 if t < 40 else 0.05)
    one = target[target["batch_size"] * target["tokens"] == 1]
    assert (one["activated_experts"] == 8).all()


def test_quiet_sweep_runs_its_command_and_passes_its_exit_status_on(tmp_path):
    """tools/quiet_sweep.sh with the watchdog's limit out of reach: the command runs once, its status comes back."""
    import os
    import subprocess
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "tools" / "quiet_sweep.sh"
    done = subprocess.run([str(script), "bash", "-c", f"echo ran >> {tmp_path / 'log'}; exit 3"], capture_output=True,
                          text=True, env={**os.environ, "LIMIT": "100000", "QUIET": "0"}, timeout=60)
    assert done.returncode == 3 and (tmp_path / "log").read_text() == "ran\n"
    assert "start" in done.stderr and "finished with exit 3" in done.stderr
