"""Batched speculative decoding: lossless against greedy decoding, assisted generation, and in distribution."""

from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
scipy_stats = pytest.importorskip("scipy.stats")

from moesd.engine.sd import (SpeculativeDecoder, accept_greedy, accept_sampling, accept_synthetic,  # noqa: E402
                      generate_autoregressive)
from moesd.engine.static_cache import StaticCaches  # noqa: E402
from moesd.theory.speedup import sigma as sigma_of_alpha  # noqa: E402
from moesd.zoo import get_model  # noqa: E402
from moesd.zoo import noisy_copy  # noqa: E402


@pytest.fixture(scope="module")
def pair():
    """A float64 Qwen2-57B-shaped MoE target (2 layers, E = 64, K = 8) and a perturbed draft."""
    target = get_model("qwen2-57b-a14b").random_model(num_layers=2, width=1 / 32, dtype=torch.float64)
    return target, noisy_copy(target, 0.06)


def left_padded(lengths, vocab, seed=0):
    generator = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.randint(1, vocab, (len(lengths), width), generator=generator)
    mask = (torch.arange(width) >= width - torch.tensor(lengths)[:, None]).long()
    return ids * mask, mask


PROMPTS = {1: [6], 3: [7, 3, 5], 8: [9, 2, 5, 9, 4, 1, 8, 6]}


@pytest.mark.parametrize("batch", sorted(PROMPTS))
@pytest.mark.parametrize("gamma", [1, 2, 4])
def test_greedy_sd_equals_greedy_decoding(pair, batch, gamma):
    target, draft = pair
    ids, mask = left_padded(PROMPTS[batch], target.config.vocab_size, seed=batch)
    expected = target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=16, do_sample=False,
                               pad_token_id=0)
    output = SpeculativeDecoder(target, draft, gamma).generate(ids, mask, max_new_tokens=16)
    assert torch.equal(output.sequences, expected)
    assert output.num_generated.tolist() == [16] * batch
    stats = output.stats
    assert 0.05 < stats.acceptance_rate < 0.95  # ragged: some drafts kept, some rejected
    assert stats.emitted == stats.accepted + stats.sequence_rounds
    assert stats.drafted == gamma * stats.sequence_rounds
    assert 1 / (gamma + 1) <= stats.sigma <= 1


def test_autoregressive_baseline_equals_greedy_decoding(pair):
    target, _ = pair
    ids, mask = left_padded(PROMPTS[3], target.config.vocab_size)
    expected = target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=10, do_sample=False,
                               pad_token_id=0)
    output = generate_autoregressive(target, ids, mask, max_new_tokens=10)
    assert torch.equal(output.sequences, expected)
    assert output.stats.rounds == 9 and output.stats.sigma == 1.0


@pytest.mark.parametrize("gamma", [1, 3])
def test_batch_one_equals_assisted_generation(pair, gamma):
    target, draft = pair
    ids, mask = left_padded([8], target.config.vocab_size, seed=5)
    assisted = target.generate(input_ids=ids, attention_mask=mask, assistant_model=draft, max_new_tokens=14,
                               do_sample=False, pad_token_id=0, num_assistant_tokens=gamma,
                               num_assistant_tokens_schedule="constant")
    output = SpeculativeDecoder(target, draft, gamma).generate(ids, mask, max_new_tokens=14)
    assert torch.equal(output.sequences, assisted)


def test_sequences_stop_at_eos_like_generate(pair):
    target, draft = pair
    ids, mask = left_padded(PROMPTS[8], target.config.vocab_size, seed=2)
    plain = target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0)
    eos = int(plain[3, ids.shape[1] + 4])  # a token some sequence emits mid-way
    expected = target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False,
                               pad_token_id=0, eos_token_id=eos)
    output = SpeculativeDecoder(target, draft, 3).generate(ids, mask, max_new_tokens=12, eos_token_id=eos)
    assert torch.equal(output.sequences, expected)
    assert output.num_generated.min() < 12


@pytest.mark.parametrize("name", ["deepseek-v2-lite", "opt-30b", "mixtral-8x7b"])
def test_other_architectures_are_lossless(name):
    """Latent attention (DeepSeek-V2), learned positions (OPT), sliding-window config (Mixtral)."""
    target = get_model(name).random_model(num_layers=2, width=1 / 32, dtype=torch.float64)
    draft = noisy_copy(target, 0.06)
    ids, mask = left_padded([5, 2, 7], target.config.vocab_size)
    expected = target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False,
                               pad_token_id=0)
    output = SpeculativeDecoder(target, draft, 3).generate(ids, mask, max_new_tokens=12)
    assert torch.equal(output.sequences, expected)


@pytest.mark.parametrize("name", ["qwen2-57b-a14b", "opt-30b"])
def test_static_caches_decode_losslessly(name):
    """The engine over static caches (what CUDA graphs replay, here run eagerly): the target's greedy
    output for left-padded prompts, AR and SD at every gamma sharing one set of caches; the forward
    shapes repeat every round, so that a graph captured once serves them all."""
    target = get_model(name).random_model(num_layers=2, width=1 / 32, dtype=torch.float64)
    draft = noisy_copy(target, 0.06)
    ids, mask = left_padded(PROMPTS[3], target.config.vocab_size, seed=4)
    expected = target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False,
                               pad_token_id=0)
    static = StaticCaches(ids.shape[1] + 11 * 5 + 1)
    shapes = []
    for model in (target, draft):
        forward = model.forward
        model.forward = lambda *a, _f=forward, **k: shapes.append(k["input_ids"].shape[1]) or _f(*a, **k)
    try:
        ar = generate_autoregressive(target, ids, mask, max_new_tokens=12, static_caches=static)
        assert torch.equal(ar.sequences, expected)
        for gamma in (1, 2, 4):
            shapes.clear()
            output = SpeculativeDecoder(target, draft, gamma).generate(ids, mask, max_new_tokens=12,
                                                                       static_caches=static)
            assert torch.equal(output.sequences, expected)
            assert 0.05 < output.stats.acceptance_rate < (0.95 if name == "qwen2-57b-a14b" else 1.01)  # ragged
            rounds = shapes[2:]  # after the two prefills: [2, 1 x (gamma - 1), gamma + 1] every round
            assert rounds == [2, *[1] * (gamma - 1), gamma + 1] * output.stats.rounds, gamma
    finally:
        for model in (target, draft):
            del model.forward
    assert len(static._models) == 2  # one cache per model and batch, shared by every run


def test_static_caches_refuse_a_generation_they_cannot_hold(pair):
    target, draft = pair
    ids, mask = left_padded(PROMPTS[3], target.config.vocab_size)
    with pytest.raises(ValueError, match=r"needs 26 slots per sequence \(7 prompt, then 6 rounds of 3 and one more\), "
                                         "the static caches hold 20"):
        SpeculativeDecoder(target, draft, 2).generate(ids, mask, max_new_tokens=7, static_caches=StaticCaches(20))
    with pytest.raises(ValueError, match="capacity must be a whole number of slots >= 2"):
        StaticCaches(1.5)


@pytest.fixture(scope="module")
def small_vocabulary_pair():
    spec = get_model("olmoe-1b-7b")
    target = spec.random_model(num_layers=1, width=1 / 32, vocab_size=12, dtype=torch.float64, seed=4)
    with torch.no_grad():  # sharper logits than the default init, so the distributions are far from uniform
        target.lm_head.weight.mul_(10)
    return target, noisy_copy(target, 0.6, seed=2)


def exact_marginals(model, prompt, temperature):
    """Exact distributions of the 2nd and 3rd generated tokens under the target, by enumeration."""
    vocab = model.config.vocab_size
    with torch.no_grad():
        first = torch.softmax(model(prompt).logits[0, -1] / temperature, -1)
        one = torch.cat([prompt.repeat(vocab, 1), torch.arange(vocab)[:, None]], 1)
        second = torch.softmax(model(one).logits[:, -1] / temperature, -1)  # [x1, x2]
        two = torch.cat([one.repeat_interleave(vocab, 0), torch.arange(vocab).repeat(vocab)[:, None]], 1)
        third = torch.softmax(model(two).logits[:, -1] / temperature, -1).reshape(vocab, vocab, vocab)
    joint = first[:, None] * second
    return joint.sum(0).numpy(), (joint[..., None] * third).sum((0, 1)).numpy()


def chi_square_p(samples, probabilities):
    counts = np.bincount(samples, minlength=probabilities.size)
    expected = probabilities * samples.size
    keep = expected >= 5  # pool the rare cells
    observed = np.r_[counts[keep], counts[~keep].sum()]
    expected = np.r_[expected[keep], expected[~keep].sum()]
    if expected[-1] == 0:
        observed, expected = observed[:-1], expected[:-1]
    return scipy_stats.chisquare(observed, expected).pvalue


def test_speculative_sampling_has_the_target_distribution(small_vocabulary_pair):
    target, draft = small_vocabulary_pair
    prompt = torch.tensor([[3, 7, 1]])
    temperature, batch = 1.0, 4000
    second, third = exact_marginals(target, prompt, temperature)
    output = SpeculativeDecoder(target, draft, 2).generate(prompt.repeat(batch, 1), max_new_tokens=3,
                                                            temperature=temperature, seed=11)
    assert 0.1 < output.stats.acceptance_rate < 0.9
    generated = output.sequences[:, 3:].numpy()
    assert chi_square_p(generated[:, 1], second) > 1e-3
    assert chi_square_p(generated[:, 2], third) > 1e-3
    # The test has power: the draft's own samples are rejected as target samples.
    draft_second, _ = exact_marginals(draft, prompt, temperature)
    wrong = np.random.default_rng(0).choice(second.size, size=batch, p=draft_second / draft_second.sum())
    assert chi_square_p(wrong, second) < 1e-6


class FixedLogits(torch.nn.Module):
    """A stub LM whose every position predicts token 1: the engine's bookkeeping without a model."""

    def __init__(self, vocab: int = 5):
        super().__init__()
        self.lm_head = torch.nn.Linear(1, vocab, bias=False)
        self.forwards = 0

    def get_output_embeddings(self):
        return self.lm_head

    def forward(self, input_ids, past_key_values=None, **kwargs):
        self.forwards += 1
        logits = torch.zeros(*input_ids.shape, self.lm_head.out_features)
        logits[..., 1] = 1.0
        return SimpleNamespace(logits=logits, past_key_values=past_key_values)


@pytest.mark.parametrize("alpha", [0.0, 0.6, 0.9, 1.0])
def test_synthetic_acceptance_follows_eq5(alpha):
    gamma, batch, rounds = 3, 64, 200
    stub = FixedLogits()
    ids = torch.ones(batch, 4, dtype=torch.long)
    stats = SpeculativeDecoder(stub, stub, gamma).generate(
        ids, max_new_tokens=1 + rounds * (gamma + 1), max_rounds=rounds, synthetic_acceptance=alpha, seed=0).stats
    assert stats.mode == f"synthetic alpha={alpha:g}"
    assert stats.rounds == rounds and stats.full and stats.sequence_rounds == batch * rounds
    assert stub.forwards == 2 + rounds * (gamma + 1)  # two prefills, gamma drafts and one verification a round
    if alpha in (0.0, 1.0):
        assert stats.accepted == alpha * stats.drafted
    # 12 800 sequence-rounds: the standard error of sigma is below 0.004
    assert stats.sigma == pytest.approx(float(sigma_of_alpha(alpha, gamma)), abs=0.015)


def test_each_seed_draws_its_own_acceptance_coins():
    """The sweeps give every point its own seed (moesd.measure.sweeps.acceptance_seed): different seeds must give
    different accepted counts, the same seed the same ones."""
    stub = FixedLogits()
    decoder = SpeculativeDecoder(stub, stub, 3)
    ids = torch.ones(4, 2, dtype=torch.long)

    def accepted(seed):
        stats = decoder.generate(ids, max_new_tokens=1 + 10 * 4, max_rounds=10, synthetic_acceptance=0.5, seed=seed).stats
        return [record.accepted for record in stats.records]

    first = accepted(1)
    assert accepted(1) == first and accepted(2) != first and accepted(3) != first


def test_rounds_are_recorded_and_windows_cut_them():
    stub = FixedLogits()
    decoder = SpeculativeDecoder(stub, stub, 2)
    ids = torch.ones(3, 2, dtype=torch.long)
    stats = decoder.generate(ids, max_new_tokens=1 + 5 * 3, max_rounds=5, synthetic_acceptance=0.7, seed=1).stats
    assert stats.rounds == 5 and stats.full
    window = stats.window(2)
    assert window.rounds == 3 and window.t_prefill == 0
    assert window.emitted == sum(r.emitted for r in stats.records[2:])
    assert window.t_total == pytest.approx(sum(r.t_draft + r.t_verify + r.t_reject for r in stats.records[2:]))
    assert all(r.emitted == r.accepted + r.active for r in stats.records)
    # A budget the sequences reach: they stop, the rounds after it are not full
    short = decoder.generate(ids, max_new_tokens=4, synthetic_acceptance=1.0, seed=1).stats
    assert short.rounds == 1 and short.emitted == 3 * 3
    ragged = decoder.generate(ids, max_new_tokens=6, synthetic_acceptance=0.5, seed=3).stats
    assert not ragged.full
    ar = generate_autoregressive(stub, ids, max_new_tokens=50, max_rounds=7).stats
    assert ar.rounds == 7 and ar.full and ar.emitted == 21 and ar.sigma == 1.0


def test_greedy_rule_accepts_exactly_the_matching_prefix():
    vocab = 6
    targets = torch.tensor([[2, 3, 4, 5],   # draft 2, 3, 1: two match, then the target's 4
                            [2, 3, 1, 5],   # all three match: bonus token 5
                            [0, 3, 1, 5]])  # the first differs: the target's 0
    logits = torch.nn.functional.one_hot(targets, vocab).double()
    drafts = torch.tensor([[2, 3, 1], [2, 3, 1], [2, 3, 1]])
    accepted, following = accept_greedy(drafts, logits)
    assert accepted.tolist() == [2, 3, 0] and following.tolist() == [4, 5, 0]


def test_synthetic_rule_at_alpha_zero_and_one():
    generator = torch.Generator().manual_seed(0)
    drafts = torch.randint(0, 9, (50, 4), generator=generator)
    picks = torch.arange(5).repeat(50, 1)
    accepted, following = accept_synthetic(drafts, picks, 0.0, generator)
    assert (accepted == 0).all() and (following == 0).all()
    accepted, following = accept_synthetic(drafts, picks, 1.0, generator)
    assert (accepted == 4).all() and (following == 4).all()  # the bonus token: the pick after the last draft


def test_speculative_sampling_rule_against_its_closed_form():
    """gamma = 1 on a 3-token vocabulary: acceptance sum(min(p, q)), residual max(0, p - q), output p."""
    p, q, bonus = torch.tensor([0.5, 0.3, 0.2]), torch.tensor([0.2, 0.2, 0.6]), torch.tensor([0.1, 0.1, 0.8])
    n = 200_000
    generator = torch.Generator().manual_seed(7)
    drafts = torch.multinomial(q, n, replacement=True, generator=generator)[:, None]
    accepted, following = accept_sampling(drafts, q.expand(n, 1, 3), torch.stack([p, bonus]).expand(n, 2, 3),
                                          generator)
    accepted, following = accepted.numpy(), following.numpy()
    assert accepted.mean() == pytest.approx(float(torch.minimum(p, q).sum()), abs=0.005)  # 0.6
    residual = (p - q).clamp(min=0) / (p - q).clamp(min=0).sum()  # [0.75, 0.25, 0]
    after_rejection = np.bincount(following[accepted == 0], minlength=3) / (accepted == 0).sum()
    assert after_rejection == pytest.approx(residual.numpy(), abs=0.01)
    assert after_rejection[2] == 0  # never a token the draft over-proposes
    after_acceptance = np.bincount(following[accepted == 1], minlength=3) / (accepted == 1).sum()
    assert after_acceptance == pytest.approx(bonus.numpy(), abs=0.01)
    first = np.where(accepted == 1, drafts[:, 0].numpy(), following)
    assert np.bincount(first, minlength=3) / n == pytest.approx(p.numpy(), abs=0.006)  # lossless: p, not q


def test_seeded_runs_repeat(pair):
    target, draft = pair
    ids, mask = left_padded(PROMPTS[3], target.config.vocab_size)
    decoder = SpeculativeDecoder(target, draft, 2)
    runs = [decoder.generate(ids, mask, max_new_tokens=8, temperature=0.8, seed=3).sequences for _ in range(2)]
    assert torch.equal(*runs)


def test_bad_arguments_raise(pair):
    target, draft = pair
    ids, mask = left_padded([3], target.config.vocab_size)
    with pytest.raises(ValueError, match="gamma"):
        SpeculativeDecoder(target, draft, 0)
    other = get_model("olmoe-1b-7b").random_model(num_layers=1, width=1 / 32)
    with pytest.raises(ValueError, match="vocabularies differ"):
        SpeculativeDecoder(target, other, 2)
    decoder = SpeculativeDecoder(target, draft, 2)
    for kwargs, match in [(dict(max_new_tokens=0), "max_new_tokens"), (dict(temperature=-1.0), "temperature"),
                          (dict(synthetic_acceptance=1.5), "synthetic_acceptance"), (dict(max_rounds=0), "max_rounds"),
                          (dict(max_rounds=2.5), "max_rounds")]:
        with pytest.raises(ValueError, match=match):
            decoder.generate(ids, mask, **kwargs)
    with pytest.raises(ValueError, match="unmasked"):
        decoder.generate(ids, torch.zeros_like(mask))
    with pytest.raises(ValueError, match="shape"):
        decoder.generate(ids, mask[:, :1])


def test_sampling_over_static_caches_equals_sampling_over_dynamic_ones(small_vocabulary_pair):
    """Speculative sampling draws the same tokens whichever caches hold the slots (same seed, same numbers)."""
    target, draft = small_vocabulary_pair
    ids, mask = left_padded([3, 1, 4, 2], target.config.vocab_size, seed=6)
    decoder = SpeculativeDecoder(target, draft, 3)
    dynamic = decoder.generate(ids, mask, max_new_tokens=10, temperature=1.0, seed=5)
    static = decoder.generate(ids, mask, max_new_tokens=10, temperature=1.0, seed=5,
                              static_caches=StaticCaches(ids.shape[1] + 9 * 4 + 1))
    assert torch.equal(static.sequences, dynamic.sequences)
    assert 0.1 < dynamic.stats.acceptance_rate < 0.9  # ragged: rejections, residual draws and bonus tokens


def test_round_source_is_the_round_that_runs():
    """The chapter's listing: the whole round, every stage in it, no clock in it, one screen long."""
    import inspect

    from moesd.engine import round_source

    listing = round_source()
    lines = listing.splitlines()
    assert lines[0].startswith("def round(self, gen") and len(lines) < 25
    for stage in ("draft(", "verify(", "self.accept(", "keep_accepted("):
        assert stage in listing
    for clock in ("time", "synchron", "Event", "timer"):
        assert clock not in listing
    assert listing.strip() in inspect.cleandoc(inspect.getsource(SpeculativeDecoder)) or all(
        line.strip() in inspect.getsource(SpeculativeDecoder) for line in lines)
    from moesd.engine import sd

    for stage in (sd.draft, sd.verify, sd.keep_accepted):  # a stage's listing: its definition, whole
        listing = round_source(stage)
        assert listing == inspect.getsource(stage) and listing.startswith(f"def {stage.__name__}(")


def test_a_round_reads_no_clock(monkeypatch):
    """The round itself never reads a clock: the caller times it from outside."""
    from moesd.engine import sd, timing

    stub = FixedLogits()
    decoder = SpeculativeDecoder(stub, stub, 3)
    ids = torch.ones(2, 3, dtype=torch.long)
    gen = sd._start(stub, stub, ids, torch.ones_like(ids), 20, 0.0, 0, None, 0, 4, 4, None)
    sd._prefill(gen)
    monkeypatch.setattr(timing.time, "perf_counter", lambda: pytest.fail("a round read the clock"))
    accepted = decoder.round(gen)
    assert accepted.tolist() == [3, 3]  # the stub's draft is its own target: every draft token accepted
    assert gen.generated.count.tolist() == [5, 5] and gen.slots.length == 3 + 4


def test_stages_are_marked_around_the_round_and_the_target_forward(monkeypatch):
    """A fake clock that ticks one second per reading: each round's marks are its start, the target forward's
    start and end, and its end, so each stage lasts one tick (a decode step: verify 2, after 1)."""
    from moesd.engine import timing

    ticks = iter(range(10_000))
    monkeypatch.setattr(timing.time, "perf_counter", lambda: float(next(ticks)))
    stub = FixedLogits()
    ids = torch.ones(2, 3, dtype=torch.long)
    stats = SpeculativeDecoder(stub, stub, 2).generate(ids, max_new_tokens=1 + 4 * 3, max_rounds=4).stats
    assert [(r.t_draft, r.t_verify, r.t_reject) for r in stats.records] == [(1.0, 1.0, 1.0)] * 4
    assert stats.t_prefill == 1.0 and stats.t_total == 2 + 4 * 4 - 1  # from the first of 2 + 4 x 4 marks to the last
    ar = generate_autoregressive(stub, ids, max_new_tokens=6, max_rounds=3).stats
    assert [(r.t_draft, r.t_verify, r.t_reject) for r in ar.records] == [(0.0, 2.0, 1.0)] * 3


def test_the_timer_refuses_a_round_without_one_target_forward():
    from moesd.engine.timing import RoundTimer

    verifier = torch.nn.Identity()
    with RoundTimer("cpu", verifier) as timer, pytest.raises(RuntimeError, match="2 times, not once"):
        with timer.round():
            verifier(torch.zeros(1))
            verifier(torch.zeros(1))
    verifier(torch.zeros(1))  # the hooks are gone
