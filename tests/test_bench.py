"""Sweeps: the steady-state protocol, result files that never lose or misstate a point, refusing bad settings."""

import json
import os
import stat
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import moesd.measure.bench as bench  # noqa: E402
from moesd._checks import UsageError  # noqa: E402
from moesd._files import atomic_write  # noqa: E402
from moesd.engine import static_cache  # noqa: E402
from moesd.engine.records import DecodeStats, RoundRecord  # noqa: E402
from moesd.engine.sd import SpeculativeDecoder, generate_autoregressive  # noqa: E402
from moesd.measure import result_file  # noqa: E402
from moesd.measure.bench import run_sweep, steady_state_row, time_autoregressive, time_speculative  # noqa: E402
from moesd.measure.presets import preset  # noqa: E402
from moesd.measure.sweeps import PAPER_SIGMA, SweepConfig, acceptance_seed, estimate_seconds  # noqa: E402
from moesd.theory.speedup import alpha_from_sigma  # noqa: E402
from moesd.theory.speedup import speedup as eq4  # noqa: E402
from moesd.zoo import get_model, noisy_copy  # noqa: E402

TINY = dict(target="qwen2-57b-a14b", draft="qwen2-0.5b", layers=1, draft_layers=1, width=1 / 32,
            batch_sizes=(1, 3), gammas=(2, 3), context=8, repeats=2, warmup=1)
E2E = dict(TINY, rounds=2, warmup_rounds=1)


@pytest.fixture(scope="module")
def ragged_pair():
    """A tiny target and a noisy copy of it as draft: real greedy acceptance, different per sequence."""
    target = get_model("qwen2-57b-a14b").random_model(num_layers=1, width=1 / 32, seed=0)
    return target, noisy_copy(target, 0.06)


def test_steady_state_speedup_matches_eq4_under_ragged_acceptance(ragged_pair):
    """B = 8, real acceptance: the timed window holds only rounds with every sequence active.

    The old protocol (one batch of 16 tokens timed until its last sequence stopped) fails this: its
    speedup is Eq. 4 times the share of sequence-rounds still active.
    """
    target, draft = ragged_pair
    ids = torch.randint(1, target.config.vocab_size, (8, 8), generator=torch.Generator().manual_seed(0))
    decoder = SpeculativeDecoder(target, draft, 3)
    ar, sd = time_autoregressive(target, ids, 32, 1), time_speculative(decoder, ids, 32, 1)
    assert 0.2 < sd.acceptance_rate < 0.9 and len({r.accepted for r in sd.records}) > 3  # ragged
    row = steady_state_row(ar, sd)
    assert row["rounds"] == row["ar_steps"] == 32
    assert row["speedup"] / row["speedup_eq4"] == pytest.approx(1, abs=0.03)
    assert row["sigma"] == pytest.approx(sd.emitted / (8 * 32 * 4))
    # The old protocol on the same pair and prompts: Eq. 4 overstates its speedup (stragglers)
    old_ar = generate_autoregressive(target, ids, max_new_tokens=16).stats
    old_sd = decoder.generate(ids, max_new_tokens=16).stats
    old_t_ar, old_t_sd = ((s.t_total - s.t_prefill) / 15 for s in (old_ar, old_sd))
    old_eq4 = eq4(old_sd.sigma, 3, old_t_ar, old_sd.t_verify / old_sd.rounds, old_sd.t_draft / (3 * old_sd.rounds),
                  old_sd.t_reject / old_sd.rounds)
    assert not old_sd.full and (old_t_ar / old_t_sd) / old_eq4 < 0.97


def test_windows_with_an_idle_sequence_are_refused():
    ar = DecodeStats("autoregressive", 0, 2, [RoundRecord(2, 0, 2, 0.0, 1.0, 0.1)])
    idle = DecodeStats("greedy", 2, 2, [RoundRecord(1, 2, 3, 0.1, 1.0, 0.1)])  # one of two sequences active
    with pytest.raises(ValueError, match="full windows"):
        steady_state_row(ar, idle)
    assert steady_state_row(ar, DecodeStats("greedy", 2, 2, [RoundRecord(2, 2, 4, 0.1, 1.0, 0.1)]))["speedup"] > 0


def test_forward_study_writes_every_point_and_honours_top_ks(tmp_path, monkeypatch):
    built, real_build = [], bench.build_models

    def recording_build(config, top_k=None):
        built.append(top_k)
        return real_build(config, top_k)

    monkeypatch.setattr(bench, "build_models", recording_build)
    path = run_sweep(SweepConfig("forward", **{**TINY, "top_ks": (2, 4)}), tmp_path, progress=False)
    frame = pd.read_csv(path)
    assert built == [2] and sorted(frame["num_experts_per_tok"].unique()) == [2, 4]  # built once, K set in place
    assert len(frame) == 2 * 2 * 2 * 4 * 2  # K x roles x batch sizes x s in {1, 2, 3, 4} x repeats
    assert set(frame["tokens"]) == {1, 2, 3, 4} and (frame["seconds"] > 0).all()
    target = frame[frame["role"] == "target"]
    assert frame.loc[frame["role"] == "draft", "activated_experts"].isna().all()
    # uniform routing: a token activates exactly K experts; B s tokens at most B s K of the 64
    one_token = target[target["batch_size"] * target["tokens"] == 1]
    assert (one_token["activated_experts"] == one_token["num_experts_per_tok"]).all()
    assert (target["activated_experts"] <= np.minimum(64, target["batch_size"] * target["tokens"]
                                                      * target["num_experts_per_tok"])).all()
    sidecar = json.loads(path.with_suffix(".json").read_text())
    assert sidecar["complete"] and sidecar["settings"]["top_ks"] == [2, 4] and sidecar["acceptance"] == {"mode": "none"}
    assert {"device", "torch", "transformers", "commit", "date", "command", "hardware"} <= set(sidecar)


def test_the_sidecar_names_commit_command_and_experts_kernel_truthfully(monkeypatch):
    """MOESD_COMMIT names the commit even where a .git answers (the GPU machine's copy carried a stale one);
    a dense target has no experts kernel."""
    monkeypatch.setattr(result_file, "measured_roofline",
                        lambda device, dtype: type("R", (), {"sidecar_entries": dict})())
    monkeypatch.setattr(result_file, "_command",
                        lambda arguments, cwd=None: "ea8025e" if arguments[0] == "git" else None)
    monkeypatch.setenv("MOESD_COMMIT", "0123abc")
    monkeypatch.setattr(result_file.sys, "argv", ["-c", "sweep", "dense_forward", "--preset", "gpu"])
    dense = result_file.environment(SweepConfig("dense_forward", target="opt-30b", draft="opt-350m", layers=1,
                                                draft_layers=1, width=1 / 32, batch_sizes=(1,), gammas=(2,),
                                                context=8, repeats=1))
    assert dense["commit"] == "0123abc" and dense["command"] == "moesd sweep dense_forward --preset gpu"
    assert dense["experts_implementation"] is None
    assert result_file.environment(SweepConfig("forward", **TINY))["experts_implementation"] == "eager"  # MoE, CPU


def test_a_static_step_is_repeatable_and_equals_the_dynamic_cache_forward(ragged_pair):
    """What a CUDA graph replays (moesd.engine.static_cache.static_step): the same logits every call, the dynamic cache's logits."""
    target, _ = ragged_pair
    new = torch.randint(1, target.config.vocab_size, (3, 4), generator=torch.Generator().manual_seed(5))
    static = static_cache.filled_cache(target, 3, 8, "cpu", static_tokens=4)
    first = static_cache.static_step(target, static, new, 8)
    again = static_cache.static_step(target, static, new, 8)
    assert torch.equal(first, again)  # rewound: the second call wrote the same slots over the same keys
    dynamic = static_cache.filled_cache(target, 3, 8, "cpu")
    reference = target(input_ids=new, past_key_values=dynamic, use_cache=True,
                       position_ids=torch.arange(8, 12).expand(3, -1)).logits
    torch.testing.assert_close(first, reference, rtol=1e-4, atol=1e-4)
    assert static_cache.static_step(target, static, new[:, :1], 8).shape == (3, 1, target.config.vocab_size)
    opt = get_model("opt-30b").random_model(num_layers=1, width=1 / 32, seed=0)
    static = static_cache.filled_cache(opt, 3, 8, "cpu", static_tokens=4)
    dynamic = static_cache.filled_cache(opt, 3, 8, "cpu")
    torch.testing.assert_close(static_cache.static_step(opt, static, new % opt.config.vocab_size, 8),
                               opt(input_ids=new % opt.config.vocab_size, past_key_values=dynamic, use_cache=True,
                                   position_ids=torch.arange(8, 12).expand(3, -1)).logits, rtol=1e-4, atol=1e-4)


def test_the_cuda_graph_forward_study_replays_a_captured_static_step(tmp_path, monkeypatch):
    """The --cuda-graphs path without a GPU: capture stands in as 'run eagerly', the rest is the real code."""
    captured = []

    class EagerGraph:
        def __init__(self, model, cache, new, context, pool=None):
            self.run = lambda: static_cache.static_forward(model, cache, new, context)
            self.cache, self.context, self.pool = cache, context, object()
            assert pool is None if not captured else pool is not None  # the first graph's pool, shared
            captured.append(new.shape)

        def prepare(self):
            static_cache.rewind(self.cache, self.context)

        def replay(self):
            self.run()

    monkeypatch.setattr(bench, "GraphStep", EagerGraph)
    config = SweepConfig("forward", **{**TINY, "repeats": 1, "warmup": 0})
    config.cuda_graphs = True  # refused on a CPU device (tested below); the plumbing runs the same here
    path = run_sweep(config, tmp_path, progress=False)
    frame = pd.read_csv(path)
    assert len(frame) == 2 * 2 * 4 == len(captured) and (frame["seconds"] > 0).all()  # one capture a point
    assert sorted(set(captured)) == [(b, s) for b in (1, 3) for s in (1, 2, 3, 4)]
    assert json.loads(path.with_suffix(".json").read_text())["settings"]["cuda_graphs"] is True


class _HostSyncs(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the operators that read a device value back to the host (a CUDA graph cannot capture them)."""

    SYNCS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.nonzero.default,
             torch.ops.aten.item.default}

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in self.SYNCS:
            self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name, options", [("qwen2-57b-a14b", {"experts_implementation": "grouped_mm"}),
                                           ("qwen2-0.5b", {}), ("opt-30b", {})])
def test_a_static_forward_reads_nothing_back_to_the_host(name, options):
    """What --cuda-graphs captures: no host synchronisation (item, nonzero) in the forward, at s = 1 and 5."""
    model = get_model(name).random_model(num_layers=1, width=1 / 32, seed=0, **options)
    for tokens in (1, 5):
        new = torch.randint(1, model.config.vocab_size, (3, tokens), generator=torch.Generator().manual_seed(1))
        cache = static_cache.filled_cache(model, 3, 8, "cpu", static_tokens=5)
        static_cache.rewind(cache, 8)
        with torch.no_grad(), _HostSyncs() as syncs:
            static_cache.static_forward(model, cache, new, 8)
        assert syncs.seen == [], f"{name} at s = {tokens}"


def test_cuda_graphs_are_refused_off_cuda_and_without_a_warm_up_round():
    with pytest.raises(UsageError, match="cuda_graphs applies on a CUDA device, not on cpu"):
        SweepConfig("forward", **TINY, cuda_graphs=True)
    with pytest.raises(UsageError, match="captures its graphs in the warm-up round: set warmup_rounds >= 1"):
        SweepConfig("e2e", **{**E2E, "device": "cuda", "cuda_graphs": True, "warmup_rounds": 0})
    assert SweepConfig("e2e", **{**E2E, "device": "cuda", "cuda_graphs": True}).cuda_graphs


def test_the_cuda_graph_e2e_study_decodes_over_shared_static_caches(tmp_path, monkeypatch):
    """The --cuda-graphs e2e path without a GPU: its static caches run eagerly, the rest is the real code."""
    made = []

    class EagerCaches(static_cache.StaticCaches):
        def __init__(self, capacity, cuda_graphs=False, routing=None):
            assert cuda_graphs and routing is not None  # the MoE target's routing control, for replays
            super().__init__(capacity, cuda_graphs=False, routing=routing)
            made.append(self)

    monkeypatch.setattr(bench, "StaticCaches", EagerCaches)
    config = SweepConfig("e2e", **{**E2E, "repeats": 1, "warmup": 0})
    config.cuda_graphs = True  # refused on a CPU device (tested above); the plumbing runs the same here
    frame = pd.read_csv(run_sweep(config, tmp_path, progress=False))
    assert len(frame) == 2 * 2 and len(made) == 2  # one set of caches per point, shared by AR and both gammas
    assert all(len(caches._models) == 2 and caches.capacity == 8 + 3 * 4 + 1 for caches in made)
    assert (frame["speedup"] > 0).all() and frame["activated_experts_gamma"].notna().all()
    assert np.allclose(frame["speedup"], frame["speedup_eq4"], rtol=1e-9)


def test_e2e_rows_follow_the_protocol(tmp_path):
    path = run_sweep(SweepConfig("e2e", **E2E), tmp_path, progress=False)
    frame = pd.read_csv(path)
    assert len(frame) == 2 * 2 * 2
    schema = {"run", "batch_size", "gamma", "num_experts_per_tok", "context", "seed", "sigma_target", "alpha",
              "warmup_rounds", "rounds", "ar_steps", "t_ar", "t_sd", "t_target_1", "t_target_gamma", "t_draft",
              "t_reject", "sigma", "accept_length", "speedup", "speedup_eq4", "target_efficiency",
              "activated_experts_1", "activated_experts_gamma"}
    assert set(frame.columns) == schema
    # uniform routing (the default with random weights): the window's experts per layer, N(B) and N(B (gamma + 1))
    assert (frame["activated_experts_1"] <= 8 * frame["batch_size"]).all()
    assert (frame["activated_experts_gamma"] <= np.minimum(64, 8 * frame["batch_size"] * (frame["gamma"] + 1))).all()
    assert (frame.loc[frame["batch_size"] == 1, "activated_experts_1"] == 8).all()  # K distinct experts a token
    assert (frame["rounds"] == 2).all() and (frame["ar_steps"] == 2).all() and (frame["warmup_rounds"] == 1).all()
    assert frame["speedup"].to_numpy() == pytest.approx((frame["t_ar"] / frame["t_sd"]).to_numpy())
    assert frame["speedup_eq4"].to_numpy() == pytest.approx(frame["speedup"].to_numpy(), rel=1e-9)
    efficiency = frame["t_target_1"] / frame["t_target_gamma"]
    assert frame["target_efficiency"].to_numpy() == pytest.approx(efficiency.to_numpy())
    assert (frame["t_ar"] > frame["t_target_1"]).all()  # the AR step also selects its token
    assert ((frame["sigma"] >= 1 / (frame["gamma"] + 1)) & (frame["sigma"] <= 1)).all()
    for row in frame.itertuples():
        assert row.sigma_target == PAPER_SIGMA[row.gamma]
        assert row.alpha == pytest.approx(float(alpha_from_sigma(row.sigma_target, row.gamma)))
        assert row.seed == acceptance_seed("e2e", row.batch_size, row.gamma, 8, row.run)
    assert frame["seed"].nunique() == len(frame)  # no two points share their acceptance coins
    # each point's AR window is shared by its gammas
    assert (frame.groupby(["run", "batch_size"])["t_ar"].nunique() == 1).all()


def test_acceptance_seeds_are_independent_and_reproducible():
    seeds = {acceptance_seed(study, b, g, k, r) for study in ("e2e", "sparsity") for b in (1, 2, 100)
             for g in (2, 4) for k in (1, 8) for r in range(3)}
    assert len(seeds) == 2 * 3 * 2 * 2 * 3
    assert acceptance_seed("e2e", 4, 2, 8, 0, base_seed=1) != acceptance_seed("e2e", 4, 2, 8, 0)
    # reproducible: another process, with another string hash seed, gives the same seed
    code = "from moesd.measure.sweeps import acceptance_seed; print(acceptance_seed('e2e', 4, 2, 8, 0))"
    elsewhere = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                               env={**os.environ, "PYTHONHASHSEED": "12345"})
    assert int(elsewhere.stdout) == acceptance_seed("e2e", 4, 2, 8, 0)


def test_small_batches_measure_the_target_sigma():
    """32 rounds at B = 1, 2, 4 with independent seeds: no bias towards sigma = 1 (the old protocol's)."""

    class Stub(torch.nn.Module):
        lm_head = torch.nn.Linear(1, 4, bias=False)

        def get_output_embeddings(self):
            return self.lm_head

        def forward(self, input_ids, past_key_values=None, **kwargs):
            return type("Output", (), {"logits": torch.zeros(*input_ids.shape, 4), "past_key_values": None})

    for gamma, sigma in PAPER_SIGMA.items():
        alpha, decoder = float(alpha_from_sigma(sigma, gamma)), SpeculativeDecoder(Stub(), Stub(), gamma)
        measured = [time_speculative(decoder, torch.ones(b, 2, dtype=torch.long), 32, 1, alpha,
                                     acceptance_seed("e2e", b, gamma, 8, run)).sigma
                    for b in (1, 2, 4) for run in range(3)]
        assert np.mean(measured) == pytest.approx(sigma, abs=0.03)


def test_settings_study_emulates_table_1(tmp_path):
    config = SweepConfig("settings", **{**E2E, "gammas": (4,), "batch_sizes": (2,), "repeats": 1, "rounds": 2})
    assert [(w["dataset"], w["temperature"], w["sigma"][4]) for w in config.workloads] == [
        ("humaneval", 0.0, 0.91), ("humaneval", 1.0, 0.67), ("mtbench", 0.0, 0.55), ("mtbench", 1.0, 0.48)]
    frame = pd.read_csv(run_sweep(config, tmp_path, progress=False))
    assert len(frame) == 4 and sorted(frame["setting"]) == ["humaneval T=0", "humaneval T=1", "mtbench T=0",
                                                             "mtbench T=1"]
    assert frame["sigma_target"].tolist() == [w["sigma"][4] for w in config.workloads]
    assert frame["seed"].nunique() == 4 and frame["t_ar"].nunique() == 1


def test_sparsity_study_varies_k(tmp_path):
    config = SweepConfig("sparsity", **{**E2E, "top_ks": (1, 4), "repeats": 1, "batch_sizes": (2,)})
    frame = pd.read_csv(run_sweep(config, tmp_path, progress=False))
    assert sorted(frame["num_experts_per_tok"].unique()) == [1, 4] and len(frame) == 2 * 2


def test_an_interrupted_sweep_loses_only_the_point_in_flight(tmp_path, monkeypatch):
    config = SweepConfig("e2e", **E2E)  # 4 points (2 repeats x 2 batch sizes) of 2 SD runs each
    real, calls = bench.time_speculative, []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2 + 2 * 2 + 2:  # after the warm-up's two, the third point's second SD run
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(bench, "time_speculative", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(config, tmp_path, progress=False)
    partial = pd.read_csv(tmp_path / "e2e.csv")
    assert len(partial) == 2 * 2  # the two finished points, every row of each
    assert not json.loads((tmp_path / "e2e.json").read_text())["complete"]
    monkeypatch.setattr(bench, "time_speculative", real)
    first = json.loads((tmp_path / "e2e.json").read_text())
    frame = pd.read_csv(run_sweep(config, tmp_path, progress=False))
    assert len(frame) == 8 and not frame.duplicated(["run", "batch_size", "gamma"]).any()
    pd.testing.assert_frame_equal(frame.iloc[:4], partial)
    history = json.loads((tmp_path / "e2e.json").read_text())["earlier_runs"]  # whose rows the file holds
    assert history == [{name: first[name] for name in result_file.EARLIER_RUN_FIELDS}] and history[0]["rows"] == 4
    with pytest.raises(FileExistsError, match="finished"):
        run_sweep(config, tmp_path, progress=False)
    with pytest.raises(FileExistsError, match="finished"):
        run_sweep(SweepConfig("e2e", **{**E2E, "repeats": 3}), tmp_path, progress=False)
    assert len(pd.read_csv(run_sweep(config, tmp_path, overwrite=True, progress=False))) == 8
    assert "earlier_runs" not in json.loads((tmp_path / "e2e.json").read_text())  # measured afresh in one run


def test_a_truncated_or_incomplete_row_is_measured_again(tmp_path, monkeypatch):
    config = SweepConfig("e2e", **{**E2E, "repeats": 1})
    real, calls = bench.time_speculative, []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2 + 2 + 2:  # after the warm-up's two, the second point's second SD run
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(bench, "time_speculative", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(config, tmp_path, progress=False)
    monkeypatch.setattr(bench, "time_speculative", real)
    path = tmp_path / "e2e.csv"
    lines = path.read_text().splitlines(keepends=True)
    assert len(lines) == 3  # header and the first point's two rows
    header, cells = lines[0].strip().split(","), lines[1].split(",")
    cells[header.index("t_sd")] = ""  # an empty cell in the first row
    lines[1] = ",".join(cells)
    path.write_text("".join(lines)[:-9])  # and the last row cut mid-line
    with pytest.raises(FileExistsError, match="other settings"):
        run_sweep(SweepConfig("e2e", **{**E2E, "repeats": 1, "context": 9}), tmp_path, progress=False)
    with pytest.warns(UserWarning) as warned:
        frame = pd.read_csv(run_sweep(config, tmp_path, progress=False))
    messages = [str(w.message) for w in warned]
    assert any("line 3, cut mid-line" in m for m in messages)
    assert any("data row 1, which has empty" in m for m in messages)
    assert len(frame) == 4 and not frame.isna().any().any()
    assert json.loads((tmp_path / "e2e.json").read_text())["complete"]


def test_pretrained_weights_default_to_real_acceptance():
    config = SweepConfig("e2e", target="qwen2-57b-a14b", draft="qwen2-0.5b", weights="pretrained")
    assert config.sigma == "real" and config.layers is None and config.settings()["sigma"] == "real"


def test_presets_keep_the_paper_settings():
    from moesd.predictor.predict import PAPER_BATCH_SIZES
    from moesd.zoo import depth_scaled_vocab

    sparsity = preset("sparsity")
    assert sparsity.top_ks == (1, 2, 4, 8) and sparsity.gammas == (2, 4)
    for study in ("forward", "dense_forward", "e2e", "dense", "sparsity", "settings"):
        config = preset(study)
        # the paper's regime on a CPU: real widths, cut in depth only, the vocabulary by the same factor
        assert config.width == 1 and config.layers == 1 and config.dtype == "bfloat16" and config.repeats >= 5
        assert config.vocab_size == depth_scaled_vocab(config.target, 1)
        assert set(config.batch_sizes) <= set(PAPER_BATCH_SIZES) and len(config.batch_sizes) >= 5
        assert config.routing == (None if config.target == "opt-30b" else "uniform")
    assert preset("forward").batch_sizes == PAPER_BATCH_SIZES  # the forward studies keep all 19
    assert preset("dense").target == "opt-30b" and preset("e2e", "gpu").dtype == "bfloat16"
    assert preset("e2e").sigma == PAPER_SIGMA and sparsity.sigma == {2: 0.95, 4: 0.90}
    assert preset("settings").repeats == 5 and len(preset("settings").workloads) == 4
    assert preset("forward").rounds is None and preset("forward").sigma is None
    with pytest.raises(ValueError, match="preset"):
        preset("e2e", "tpu")


def test_paper_sigma_is_table_2s_greedy_humaneval_row_on_every_device():
    """PAPER_SIGMA against data/paper/tables_1_2.csv (transcribed from the paper, not from this code)."""
    from moesd.paper_tables import paper_table

    table = paper_table("tables_1_2")
    rows = table[(table["table"] == 2) & (table["dataset"] == "humaneval") & (table["temperature"] == 0)]
    assert sorted(rows["device"].unique()) == ["2xH800", "4xA800", "4xL40"]
    for device, part in rows.groupby("device"):
        assert dict(zip(part["gamma"].astype(int), part["sigma"])) == PAPER_SIGMA, device
    table_1 = table[(table["table"] == 1) & (table["device"] == "2xA800") & (table["dataset"] == "humaneval")
                    & (table["temperature"] == 0)].drop_duplicates("gamma")
    assert dict(zip(table_1["gamma"].astype(int), table_1["sigma"])) != PAPER_SIGMA  # 0.94, 0.93, 0.91


def test_estimate_seconds_by_hand():
    forward = pd.DataFrame([{"role": r, "batch_size": b, "tokens": s, "seconds": 1.0}
                            for r in ("target", "draft") for b in (1, 2) for s in (1, 3)])
    config = SweepConfig("e2e", **{**E2E, "batch_sizes": (1, 2), "gammas": (2,), "repeats": 1, "rounds": 4})
    # per batch size: AR 4 steps + SD 4 rounds of (2 drafts + 1 verify); warm-up 1 + 3; prefills 2 target, 1 draft
    assert estimate_seconds(config, forward, build_seconds=5) == {"timed": 32, "warmup": 8, "prefill": 6,
                                                                  "build": 5, "total": 51}
    with pytest.raises(ValueError, match="no target time at B = 1, s = 4"):
        estimate_seconds(SweepConfig("e2e", **{**E2E, "batch_sizes": (1,), "gammas": (3,)}), forward)


def test_atomic_write_refuses_special_files(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for target, kind in ((fifo, "FIFO"), (tmp_path, "folder"), ("/dev/null", "character device")):
        with pytest.raises(ValueError, match=f"is a {kind}, not a regular file"):
            with atomic_write(target, "w") as file:
                file.write("x")
    assert stat.S_ISFIFO(fifo.stat().st_mode) and stat.S_ISCHR(os.stat("/dev/null").st_mode)
    real, link = tmp_path / "real.txt", tmp_path / "link.txt"
    real.write_text("old")
    link.symlink_to(real)
    with atomic_write(link, "w") as file:
        file.write("new")
    assert link.is_symlink() and real.read_text() == "new"


def test_out_dir_and_device_are_checked_before_any_model(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "build_models", lambda *a, **k: pytest.fail("a model was built"))
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="is not a folder"):
        run_sweep(SweepConfig("e2e", **E2E), tmp_path / "file", progress=False)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="'cuda' is not available"):
            run_sweep(SweepConfig("e2e", **{**E2E, "device": "cuda"}), tmp_path, progress=False)
    (tmp_path / "e2e.csv").mkdir()
    with pytest.raises(ValueError, match="not a regular file"):
        run_sweep(SweepConfig("e2e", **E2E), tmp_path, progress=False)


def test_the_default_folder_follows_moesd_data(tmp_path, monkeypatch):
    monkeypatch.setenv("MOESD_DATA", str(tmp_path / "data"))
    config = SweepConfig("e2e", **{**E2E, "batch_sizes": (1,), "gammas": (2,), "repeats": 1, "rounds": 2})
    path = run_sweep(config, progress=False)
    assert path == tmp_path / "data" / "measurements" / "cpu" / "e2e.csv" and path.exists()


CLI_TINY = ["--layers", "1", "--draft-layers", "1", "--width", "0.03125", "--batch-sizes", "2", "--gammas", "2",
            "--repeats", "1", "--rounds", "2", "--context", "5"]


def test_cli_sweep_says_when_rows_break_a_physical_bound(tmp_path, capsys, monkeypatch):
    """A short window can time a verification faster than a decode step: the command says so on stderr."""
    import moesd.measure.bench
    from moesd.cli import main

    def timed_too_short(config, folder, overwrite=False):  # a row of speedup 3.4 > sigma (gamma + 1) = 3
        pd.DataFrame({"run": [0], "batch_size": [2], "gamma": [2], "num_experts_per_tok": [8], "sigma": [1.0],
                      "speedup": [3.4], "target_efficiency": [1.37]}).to_csv(folder / "e2e.csv", index=False)
        (folder / "e2e.json").write_text("{}")

    monkeypatch.setattr(moesd.measure.bench, "run_sweep", timed_too_short)
    assert main(["sweep", "e2e", *CLI_TINY, "--out-dir", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert "warning: e2e.csv: line 2 (run=0, batch_size=2, gamma=2, num_experts_per_tok=8): speedup = 3.4" in err
    assert "1 problem(s) in e2e.csv" in err


def test_cli_sweep(tmp_path, capsys):
    from moesd.cli import main

    arguments = ["sweep", "e2e", *CLI_TINY, "--top-ks", "2", "--sigma", "0.8", "--out-dir", str(tmp_path)]
    assert main(arguments) == 0
    frame = pd.read_csv(tmp_path / "e2e.csv")
    assert len(frame) == 1 and frame["alpha"].iloc[0] == pytest.approx(float(alpha_from_sigma(0.8, 2)))
    assert frame["num_experts_per_tok"].tolist() == [2]  # --top-ks reaches the rows (they had K = 8)
    assert json.loads((tmp_path / "e2e.json").read_text())["settings"]["top_ks"] == [2]
    with pytest.raises(SystemExit):
        main(arguments)
    assert "finished" in capsys.readouterr().err


def _stopped_at(calls_before_stop: int, monkeypatch):
    """Make ``bench.time_speculative`` raise KeyboardInterrupt at its ``calls_before_stop + 1``-th call."""
    real, calls = bench.time_speculative, []

    def stopping(*args, **kwargs):
        calls.append(1)
        if len(calls) > calls_before_stop:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(bench, "time_speculative", stopping)
    return real


def test_an_overwrite_stopped_part_way_keeps_the_finished_sweep(tmp_path, monkeypatch):
    """--overwrite of a finished sweep writes a partial file and moves it onto the result file only when complete."""
    config = SweepConfig("e2e", **E2E)
    path = run_sweep(config, tmp_path, progress=False)
    finished = {name: (tmp_path / name).read_bytes() for name in ("e2e.csv", "e2e.json")}
    real = _stopped_at(2 + 2 * 2, monkeypatch)  # the warm-up's two SD runs, two points, then stop
    with pytest.raises(KeyboardInterrupt):
        run_sweep(config, tmp_path, overwrite=True, progress=False)
    assert {name: (tmp_path / name).read_bytes() for name in finished} == finished  # every finished row kept
    partial = result_file.partial_file(path)
    assert len(pd.read_csv(partial)) == 4 and not json.loads(partial.with_suffix(".json").read_text())["complete"]
    with pytest.raises(FileExistsError, match="other settings"):  # the partial file is not another sweep's to take
        run_sweep(SweepConfig("e2e", **{**E2E, "context": 9}), tmp_path, progress=False)
    monkeypatch.setattr(bench, "time_speculative", real)
    kept = pd.read_csv(partial)
    with pytest.raises(FileExistsError, match="stopped part-way; e2e.csv keeps its rows until that sweep completes. "
                                              "Finish it with"):  # a plain rerun never replaces a finished file
        run_sweep(config, tmp_path, progress=False)
    assert {name: (tmp_path / name).read_bytes() for name in finished} == finished
    frame = pd.read_csv(run_sweep(config, tmp_path, overwrite=True, progress=False))  # resumes the partial, moves it
    assert len(frame) == 8 and not frame.duplicated(["run", "batch_size", "gamma"]).any()
    pd.testing.assert_frame_equal(frame.iloc[:4], kept)  # the stopped overwrite's rows were kept, not measured again
    assert (tmp_path / "e2e.csv").read_bytes() != finished["e2e.csv"]
    assert json.loads((tmp_path / "e2e.json").read_text())["complete"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e2e.csv", "e2e.json"]


def test_a_stale_partial_file_is_dropped_by_the_next_overwrite(tmp_path, monkeypatch):
    config = SweepConfig("e2e", **{**E2E, "repeats": 1})
    run_sweep(config, tmp_path, progress=False)
    real = _stopped_at(2 + 2, monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(config, tmp_path, overwrite=True, progress=False)
    assert result_file.partial_file(tmp_path / "e2e.csv").exists()
    monkeypatch.setattr(bench, "time_speculative", real)
    other = SweepConfig("e2e", **{**E2E, "repeats": 1, "context": 9})
    assert len(pd.read_csv(run_sweep(other, tmp_path, overwrite=True, progress=False))) == 4
    assert json.loads((tmp_path / "e2e.json").read_text())["settings"]["context"] == 9
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e2e.csv", "e2e.json"]


@pytest.mark.parametrize("moved", [False, True])
def test_a_move_cut_between_csv_and_sidecar_is_finished(tmp_path, moved):
    """A stop inside ResultFile.finish leaves a complete partial sidecar: the next sweep finishes the move first."""
    path, partial = tmp_path / "e2e.csv", result_file.partial_file(tmp_path / "e2e.csv")
    path.write_text("run\n0\n")
    path.with_suffix(".json").write_text('{"complete": true, "settings": {}}')
    (path if moved else partial).write_text("run\n1\n")
    partial.with_suffix(".json").write_text('{"complete": true, "settings": {"new": 1}}')
    with pytest.raises(FileExistsError, match="finished"):
        result_file.check_sweep(SweepConfig("e2e", **E2E), tmp_path)
    assert path.read_text() == "run\n1\n"
    assert json.loads(path.with_suffix(".json").read_text())["settings"] == {"new": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e2e.csv", "e2e.json"]


def test_a_stop_between_sidecar_and_csv_resumes(tmp_path, monkeypatch):
    """Each point writes the sidecar, then the CSV: a stop between them leaves a sidecar a point ahead, never rows
    without their sidecar, and the sweep resumes."""
    config = SweepConfig("e2e", **{**E2E, "repeats": 1})
    real_write, writes = result_file.atomic_write, []

    def stopping_write(path, mode="wb"):
        writes.append(path)
        if len(writes) == 3:  # the first point's sidecar and CSV, then the second point's sidecar
            raise KeyboardInterrupt
        return real_write(path, mode)

    monkeypatch.setattr(result_file, "atomic_write", stopping_write)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(config, tmp_path, progress=False)
    assert [p.suffix for p in writes] == [".json", ".csv", ".json"]
    assert len(pd.read_csv(tmp_path / "e2e.csv")) == 2 and json.loads((tmp_path / "e2e.json").read_text())["rows"] == 2
    monkeypatch.setattr(result_file, "atomic_write", real_write)
    assert len(pd.read_csv(run_sweep(config, tmp_path, progress=False))) == 4


def test_cli_sweep_stopped_by_ctrl_c_says_how_to_resume(tmp_path, capsys, monkeypatch):
    """Ctrl-C: one line with the rows kept, their file and the command that resumes (with --overwrite while it
    replaces a finished file); exit status 130."""
    from moesd.cli import main

    arguments = ["sweep", "e2e", *CLI_TINY, "--sigma", "0.8", "--out-dir", str(tmp_path)]
    batch = arguments.index("--batch-sizes") + 1
    arguments[batch:batch + 1] = ["1", "2"]  # two points
    assert main(arguments) == 0
    finished = (tmp_path / "e2e.csv").read_bytes()

    def stopped(argv, calls_before_stop) -> str:
        capsys.readouterr()
        monkeypatch.setattr("sys.argv", ["moesd", *argv])
        _stopped_at(calls_before_stop, monkeypatch)
        with pytest.raises(SystemExit) as stop:
            main(argv)
        err = capsys.readouterr().err
        assert stop.value.code == 130 and "Traceback" not in err and err.endswith("\n"), err
        return err.replace("\r", "\n").splitlines()[-1]  # the line after the progress bar

    line = stopped([*arguments, "--overwrite"], 1 + 1)  # the warm-up's SD run and the first point's, then stop
    assert (tmp_path / "e2e.csv").read_bytes() == finished
    assert line == (f"interrupted: 1 row(s) kept in {tmp_path / '.e2e.partial.csv'} ({tmp_path / 'e2e.csv'} keeps its "
                    f"rows until the sweep completes); resume with: moesd {' '.join(arguments)} --overwrite")
    line = stopped([*arguments, "--overwrite"], 0)  # the resume, stopped in its warm-up: the same command resumes
    assert line.startswith("interrupted: 1 row(s)") and line.endswith(f"resume with: moesd {' '.join(arguments)} "
                                                                       "--overwrite")
    capsys.readouterr()
    with pytest.raises(SystemExit) as refused:  # without --overwrite: refused, naming the command that finishes it
        main(arguments)
    assert refused.value.code == 2
    assert f"Finish it with `moesd {' '.join(arguments)} --overwrite`" in capsys.readouterr().err
    assert (tmp_path / "e2e.csv").read_bytes() == finished
