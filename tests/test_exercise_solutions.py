"""The worked solutions that write a piece of the package by hand must agree with the package.

Three exercises define a function in their solution (the book's only functions, besides the lab's
``accept_by_hand``, which ``tests/test_lab.py`` checks): each solution cell carries a tag, and these tests run it
and compare its function with the package on inputs the chapter does not show.
"""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import moesd
from moesd.zoo import get_model

ROOT = Path(__file__).resolve().parents[1]


def _solution(chapter, tag, name, namespace):
    """Run the solution cell of ``chapter`` tagged ``tag`` in ``namespace`` and return its function ``name``."""
    cells = json.loads((ROOT / "book" / chapter).read_text())["cells"]
    found = [c for c in cells if tag in c.get("metadata", {}).get("tags", [])]
    assert len(found) == 1, f"book/{chapter} must have one cell tagged {tag}"
    exec("".join(found[0]["source"]), namespace)
    return namespace[name]


@pytest.mark.parametrize("gamma", [1, 2, 4, 7])
def test_alpha_by_bisection_inverts_eq5_as_the_package_does(gamma):
    alpha_by_bisection = _solution(
        "speculative_decoding.ipynb", "alpha-bisection-solution", "alpha_by_bisection", {"moesd": moesd}
    )
    for sigma in np.linspace(1 / (gamma + 1) + 0.01, 0.99, 9):
        found = alpha_by_bisection(sigma, gamma)
        assert found == pytest.approx(float(moesd.alpha_from_sigma(sigma, gamma)), abs=1e-9)
        assert moesd.sigma(found, gamma) == pytest.approx(sigma, abs=1e-9)


def test_moe_by_hand_matches_the_models_block_on_other_states():
    namespace = {"torch": torch, "get_model": get_model}
    moe_by_hand = _solution("serving.ipynb", "moe-by-hand-solution", "moe_by_hand", namespace)
    mlp, config = namespace["mlp"], namespace["olmoe"].config
    h = torch.randn(40, config.hidden_size, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        mine, theirs = moe_by_hand(mlp, h, config.num_experts_per_tok), mlp(h[None])[0]
    assert torch.allclose(mine, theirs, atol=1e-10)
    with torch.no_grad():  # a wrong K must show: the check can fail
        assert not torch.allclose(moe_by_hand(mlp, h, config.num_experts_per_tok - 1), theirs, atol=1e-6)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_ragged_round_agrees_with_a_loop_over_sequences(seed):
    ragged_round = _solution("serving.ipynb", "ragged-round-solution", "ragged_round", {"torch": torch})
    g = torch.Generator().manual_seed(seed)
    batch, gamma = 7, 5
    draft = torch.randint(0, 50, (batch, gamma), generator=g)
    accepted = torch.randint(0, gamma + 1, (batch,), generator=g)
    following = torch.randint(0, 50, (batch,), generator=g)
    kv = torch.randint(5, 30, (batch,), generator=g)
    tokens, valid, kv_after = ragged_round(draft, accepted, following, kv)
    assert tokens.shape == valid.shape == (batch, gamma + 1)
    for b in range(batch):
        a = int(accepted[b])
        assert tokens[b][valid[b]].tolist() == draft[b, :a].tolist() + [int(following[b])]
        assert int(kv_after[b]) == int(kv[b]) + 1 + a
