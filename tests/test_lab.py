"""The laptop lab's code path (moesd.lab, moesd lab) on random weights of the lab's architecture, offline."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from moesd import lab
from moesd.cli import main
from moesd.engine.sd import SpeculativeDecoder, accept_sampling, generate_autoregressive
from moesd.routing.prompts import load_prompts
from moesd.theory.experts import expected_active_experts
from moesd.zoo import get_model

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ROOT / "tests" / "data" / "prompts"


@pytest.fixture(scope="module")
def target():
    return get_model(lab.LAB_ARCHITECTURE).random_model(num_layers=3, width=1 / 32, seed=0, dtype=torch.float64)


@pytest.fixture(scope="module")
def result():
    prompts = load_prompts("gsm8k", PROMPTS).head(2)
    prompts = prompts.assign(prompt=prompts["prompt"].str[:40])  # short prompts keep the test fast
    return lab.random_lab(prompts, num_layers=2, width=1 / 32, draft_layers=1, gamma=3, max_new_tokens=9)


def test_self_draft_shares_the_targets_weights(target):
    draft = lab.self_draft(target, 2)
    assert len(draft.model.layers) == 2 and draft.config.num_hidden_layers == 2
    assert target.config.num_hidden_layers == 3  # the target's config is untouched
    for mine, theirs in ((draft.model.layers[1], target.model.layers[1]), (draft.lm_head, target.lm_head),
                         (draft.model.embed_tokens, target.model.embed_tokens)):
        assert mine is theirs
    shared = {p.data_ptr() for p in target.parameters()}
    assert all(p.data_ptr() in shared for p in draft.parameters())


@pytest.mark.parametrize("bad", [0, 3, 1.5, True])
def test_self_draft_refuses_a_draft_that_is_not_a_strict_prefix(target, bad):
    with pytest.raises(ValueError, match="draft_layers"):
        lab.self_draft(target, bad)


def test_self_draft_keeps_greedy_sd_lossless(target):
    """Greedy SD with the early-exit draft emits exactly greedy decoding's tokens (the acceptance rule)."""
    ids, mask = lab.byte_tokens(["a short prompt", "and a longer one, left-padded"])
    greedy = generate_autoregressive(target, ids, mask, max_new_tokens=12)
    output = SpeculativeDecoder(target, lab.self_draft(target, 1), 3).generate(ids, mask, max_new_tokens=12)
    assert torch.equal(output.sequences, greedy.sequences)


def test_byte_tokens_left_pad():
    ids, mask = lab.byte_tokens(["ab", "abcd", ""])
    assert ids.shape == (3, 4)
    assert ids[0].tolist() == [0, 0, 97, 98] and mask[0].tolist() == [0, 0, 1, 1]
    assert mask[2].sum() == 1  # an empty text keeps one token (a space)


def test_random_lab_measures_consistent_acceptance(result):
    assert result.weights.startswith("random (seed 0) with the shape of allenai/OLMoE-1B-7B-0924")
    assert result.prompt_ids == ("gsm8k/0", "gsm8k/1")
    assert (result.gamma, result.draft_layers, result.target_layers) == (3, 1, 2)
    assert 0 <= result.acceptance_rate <= 1
    assert 1 / 4 <= result.sigma <= 1
    assert result.accept_length == pytest.approx(result.sigma * 4)
    assert result.rounds >= 1 and len(result.completions) == 2
    series = result.summary()
    assert series["draft layers"] == "1 of 2" and series["tokens per round"] == result.accept_length


def test_random_lab_traces_the_targets_routing(result):
    trace = result.trace
    spec = get_model(lab.LAB_ARCHITECTURE)
    assert (trace.num_experts, trace.top_k) == (spec.num_experts, spec.top_k)
    assert set(np.unique(trace.sequence)) == {0, 1}
    assert (trace.phase == "decode").sum() == 2 * (9 - 1)  # every generated token but the last is fed back
    assert trace.meta["weights"] == result.weights


def test_window_activation_is_bounded_by_eq8s_limits(result):
    table = lab.window_activation(result.trace, windows=(1, 2, 4))
    assert table.loc[1, "measured"] == pytest.approx(8)  # one token: exactly K experts
    for tokens, row in table.iterrows():
        assert row["measured"] <= min(tokens * 8, 64) + 1e-9
        assert row["Eq. 8"] == pytest.approx(float(expected_active_experts(tokens, 64, 8)))


def test_one_window_lists_the_union_of_its_tokens(result):
    window = lab.one_window(result.trace, tokens=3)
    tokens = window.drop(index="union")
    assert len(tokens) == 3 and (tokens["count"] == 8).all()
    assert window.loc["union", "experts"] == sorted(set(sum(tokens["experts"], [])))
    with pytest.raises(ValueError, match="fewer than"):
        lab.one_window(result.trace, tokens=100)


def test_fit_table_counts_from_the_configs():
    table = lab.fit_table(16)
    olmoe = get_model("olmoe-1b-7b")
    row = table.loc[olmoe.hub_id]
    assert row["total_billions"] * 1e9 == pytest.approx(olmoe.weight_counts()["total"])
    assert row["bf16_gb"] == pytest.approx(2 * row["total_billions"])
    assert row["left_gb"] == pytest.approx(16 - row["bf16_gb"])
    assert bool(row["fits"]) and not table.loc["Qwen/Qwen1.5-MoE-A2.7B-Chat", "fits"]
    assert (table["fits"] == (table["bf16_gb"] < 16)).all()
    assert list(table["total_billions"]) == sorted(table["total_billions"])
    with pytest.raises(ValueError, match="memory_gb"):
        lab.fit_table(0)


def test_draft_cost_ratio_follows_the_weights_a_step_reads():
    from transformers import AutoModelForCausalLM

    spec = get_model("olmoe-1b-7b")
    ratio = lab.draft_cost_ratio("olmoe-1b-7b", np.arange(1, 17))
    assert ratio[-1] == pytest.approx(1.0)
    assert np.all(np.diff(ratio) > 0)
    with torch.device("meta"):  # an independent count: the weights of an empty model of the real shape
        model = AutoModelForCausalLM.from_config(spec.hf_config())
    layer = model.model.layers[0]
    experts = sum(p.numel() for n, p in layer.named_parameters() if ".experts." in f".{n}")
    active_layer = sum(p.numel() for p in layer.parameters()) - experts * (1 - spec.top_k / spec.num_experts)
    head = model.lm_head.weight.numel()
    assert ratio[3] == pytest.approx((4 * active_layer + head) / (16 * active_layer + head), rel=1e-3)
    with pytest.raises(ValueError, match="draft_layers"):
        lab.draft_cost_ratio("olmoe-1b-7b", 17)
    with pytest.raises(ValueError, match="draft_layers"):
        lab.draft_cost_ratio("olmoe-1b-7b", 1.5)


def test_cli_runs_the_lab_offline(capsys, tmp_path):
    trace = tmp_path / "lab.npz"
    assert main(["lab", "--random-weights", "--prompts", "gsm8k", "--prompt-source", str(PROMPTS),
                 "--num-prompts", "1", "--layers", "2", "--draft-layers", "1", "--width", "0.03125",
                 "--max-new-tokens", "4", "--trace", str(trace)]) == 0
    printed = capsys.readouterr().out
    assert "random (seed 0)" in printed and "sigma (Eq. 5)" in printed and trace.is_file()


@pytest.mark.parametrize("argv, flag", [
    (["--random-weights", "--layers", "2", "--draft-layers", "2"], "--draft-layers"),
    (["--random-weights", "--model", "x"], "--model"),
    (["--gamma", "0"], "--gamma"),
    (["--temperature", "-1"], "--temperature"),
])
def test_cli_refuses_bad_options_before_any_work(capsys, argv, flag):
    with pytest.raises(SystemExit) as exit_:
        main(["lab", "--prompt-source", str(PROMPTS)] + argv)
    assert exit_.value.code == 2 and flag in capsys.readouterr().err


# The lab chapter's exercise "implement the acceptance rule yourself": its solution cell (tagged
# acceptance-solution) must behave as the package's rule on random distributions.

def _solution():
    cells = json.loads((ROOT / "book" / "lab.ipynb").read_text())["cells"]
    source = [c for c in cells if "acceptance-solution" in c.get("metadata", {}).get("tags", [])]
    assert len(source) == 1, "book/lab.ipynb must have one cell tagged acceptance-solution"
    namespace = {"torch": torch}  # the chapter imported it in an earlier cell
    exec("".join(source[0]["source"]), namespace)
    return namespace["accept_by_hand"]


def _exact(draft_tokens, q, p):
    """The exact joint law of (accepted drafts, following token) of the acceptance rule, for one row."""
    gamma, vocab = q.shape
    law = np.zeros((gamma + 1, vocab))
    reach = 1.0
    for j in range(gamma + 1):
        if j == gamma:
            law[j] = reach * p[j]
            break
        x = draft_tokens[j]
        accept = min(1.0, p[j, x] / q[j, x])
        residual = np.clip(p[j] - q[j], 0, None)
        law[j] = reach * (1 - accept) * (residual / residual.sum() if residual.sum() > 0 else p[j])
        reach *= accept
    return law


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_acceptance_exercises_solution_matches_the_package(seed):
    accept_by_hand = _solution()
    rng = np.random.default_rng(seed)
    gamma, vocab, rows = 3, 5, 40_000
    q = rng.dirichlet(np.ones(vocab), gamma)
    p = rng.dirichlet(np.ones(vocab), gamma + 1)
    drafts = np.array([rng.choice(vocab, p=q[j]) for j in range(gamma)])
    law = _exact(drafts, q, p)
    batch = (torch.tensor(drafts).expand(rows, -1), torch.tensor(q).expand(rows, -1, -1),
             torch.tensor(p).expand(rows, -1, -1))
    for rule in (accept_by_hand, accept_sampling):
        accepted, following = rule(*batch, torch.Generator().manual_seed(seed))
        assert accepted.shape == following.shape == (rows,)
        counts = np.zeros_like(law)
        np.add.at(counts, (accepted.numpy(), following.numpy()), 1)
        total_variation = 0.5 * np.abs(counts / rows - law).sum()
        assert total_variation < 0.02, f"{rule.__name__}: total variation {total_variation:.3f} from the exact law"


def test_the_acceptance_exercises_solution_on_the_edge_cases():
    accept_by_hand = _solution()
    p = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]], dtype=torch.float64)
    same = accept_by_hand(torch.tensor([[1]]).expand(500, -1), p[:1].expand(500, -1, -1),
                          p.expand(500, -1, -1), torch.Generator().manual_seed(0))
    assert (same[0] == 1).all()  # q = p: every draft accepted, the bonus token follows
    never = accept_by_hand(torch.tensor([[2]]).expand(500, -1), torch.tensor([[[0.0, 0.0, 1.0]]]).expand(500, -1, -1),
                           p.expand(500, -1, -1), torch.Generator().manual_seed(0))
    assert (never[0] == 0).all() and (never[1] != 2).all()  # p(x) = 0: rejected, replaced from the residual
