"""Is SD lossless? The exact distribution of the second token a model generates (by enumeration) and a
goodness-of-fit test of sampled tokens against it, which the chapter *Speculative decoding* runs on the engine's
output and on the draft alone (so that the test is seen to fail where it should).
"""

from __future__ import annotations

import numpy as np


def second_token_distribution(model, prompt, temperature: float = 1.0) -> np.ndarray:
    """Exact distribution of the second token ``model`` generates after ``prompt``, by enumeration.

    The first token ``x1`` is drawn from ``p(x1 | prompt)`` and the second from ``p(x2 | prompt, x1)``, so
    the second one's distribution is ``sum_x1 p(x1 | prompt) p(x2 | prompt, x1)``: one forward pass over
    the prompt and one over the ``V`` continuations. Meant for models with a small vocabulary ``V``.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        A causal LM.
    prompt : torch.Tensor
        [1, length] token ids.
    temperature : float
        Sampling temperature (> 0) of both tokens.

    Returns
    -------
    numpy.ndarray
        [V] probabilities, summing to 1.
    """
    import torch

    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    if prompt.ndim != 2 or prompt.shape[0] != 1:
        raise ValueError(f"prompt must have shape [1, length], got {tuple(prompt.shape)}")
    with torch.no_grad():
        first = torch.softmax(model(prompt).logits[0, -1].double() / temperature, -1)
        vocab = first.numel()
        continued = torch.cat([prompt.repeat(vocab, 1), torch.arange(vocab)[:, None]], dim=1)
        second = torch.softmax(model(continued).logits[:, -1].double() / temperature, -1)
    distribution = (first[:, None] * second).sum(0).numpy()
    return distribution / distribution.sum()


def goodness_of_fit(samples, probabilities, min_expected: float = 5.0) -> dict:
    """Do token ``samples`` follow ``probabilities``? Pearson's chi-square test and the total variation.

    Cells whose expected count is below ``min_expected`` are pooled into one (dropped if it expects
    nothing), as the chi-square approximation needs.

    Parameters
    ----------
    samples : array_like of int
        Token ids in ``[0, V)``.
    probabilities : array_like of float
        [V] the distribution they should follow.
    min_expected : float
        Smallest expected count of a cell of its own (tokens).

    Returns
    -------
    dict
        ``samples``; ``chi_square`` and its degrees of freedom ``dof``; ``p_value``, the chance of a
        statistic at least as large if the samples did follow ``probabilities``; ``total_variation``,
        ``sum |empirical - probabilities| / 2`` over tokens.
    """
    from scipy import stats

    samples = np.asarray(samples).ravel()
    probabilities = np.asarray(probabilities, dtype=float)
    if samples.size == 0:
        raise ValueError("samples must not be empty")
    if samples.min() < 0 or samples.max() >= probabilities.size:
        raise ValueError(f"samples must be token ids in [0, {probabilities.size})")
    counts = np.bincount(samples, minlength=probabilities.size)
    expected = probabilities / probabilities.sum() * samples.size
    own = expected >= min_expected
    observed = np.r_[counts[own], counts[~own].sum()]
    expected_cells = np.r_[expected[own], expected[~own].sum()]
    if expected_cells[-1] == 0:
        observed, expected_cells = observed[:-1], expected_cells[:-1]
    result = stats.chisquare(observed, expected_cells)
    return {"samples": int(samples.size), "chi_square": float(result.statistic), "dof": int(observed.size - 1),
            "p_value": float(result.pvalue),
            "total_variation": float(np.abs(counts / samples.size - expected / samples.size).sum() / 2)}
