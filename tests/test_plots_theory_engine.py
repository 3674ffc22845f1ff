"""The speculative decoding chapter's exact distribution of a generated token, on a stub model whose answer is
known by hand."""

from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from moesd.engine.exact import second_token_distribution  # noqa: E402


class Bigram(torch.nn.Module):
    """A causal LM whose next-token logits depend only on the last token: ``logits[last]``."""

    def __init__(self, logits):
        super().__init__()
        self.logits = torch.as_tensor(logits, dtype=torch.float64)

    def forward(self, input_ids, **kwargs):
        return SimpleNamespace(logits=self.logits[input_ids])


def test_second_token_distribution_is_the_two_step_marginal():
    """The second token after prompt ...a is distributed as sum_x p(x | a) p(. | x)."""
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(5, 5))
    model = Bigram(logits)
    p = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)  # p[a, b] = p(b | a)
    prompt = torch.tensor([[4, 2]])
    got = second_token_distribution(model, prompt)
    assert got == pytest.approx(p[2] @ p)
    assert got.sum() == pytest.approx(1)


def test_temperature_scales_both_tokens():
    logits = np.array([[0.0, 2.0], [1.0, -1.0]])
    hot = second_token_distribution(Bigram(logits), torch.tensor([[0]]), temperature=2.0)
    p = np.exp(logits / 2) / np.exp(logits / 2).sum(axis=1, keepdims=True)
    assert hot == pytest.approx(p[0] @ p)


@pytest.mark.parametrize("prompt, temperature, match", [
    ([[0], [1]], 1.0, r"prompt must have shape \[1, length\], got \(2, 1\)"),
    ([[0]], 0.0, "temperature must be > 0, got 0.0")])
def test_bad_arguments_raise(prompt, temperature, match):
    with pytest.raises(ValueError, match=match):
        second_token_distribution(Bigram(np.zeros((2, 2))), torch.tensor(prompt), temperature=temperature)
