"""Audit of rollwise.algos (second pass): each test pins a defect found in the RL math with
numbers worked out by hand in the comments, not produced by the code under test."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch
from torch.testing import assert_close

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # run without install

from rollwise.algos import entropy_from_logits

F64 = torch.float64


def test_entropy_gradient_of_a_row_with_no_finite_logit_is_zero_not_nan() -> None:
    # Row 0: logits [1, 2, -inf]: p = [1/(1+e), e/(1+e), 0] = [0.268941, 0.731059, 0].
    # dH/dz_j = -p_j (z_j - sum_k p_k z_k); sum p z = 0.268941 + 2 * 0.731059 = 1.731059,
    # so dH/dz = [-0.268941 * -0.731059, -0.731059 * 0.268941, 0] = [0.196612, -0.196612, 0].
    # Row 1: no finite logit, no distribution: entropy 0 (documented) and so gradient 0.
    # A NaN there reaches every parameter through backward and ruins the model.
    inf = math.inf
    logits = torch.tensor([[[1.0, 2.0, -inf], [-inf, -inf, -inf]]], dtype=F64, requires_grad=True)
    h = entropy_from_logits(logits, chunk_size=1)
    q = 1.0 / (1.0 + math.e)  # 0.268941
    assert_close(h.detach(), torch.tensor([[-(q * math.log(q) + (1 - q) * math.log(1 - q)), 0.0]], dtype=F64))
    h.sum().backward()
    g = q * (1 - q)  # 0.196612
    assert_close(logits.grad, torch.tensor([[[g, -g, 0.0], [0.0, 0.0, 0.0]]], dtype=F64))


def test_entropy_gradient_of_a_row_with_an_infinite_logit_is_not_nan() -> None:
    # A +inf logit has no finite log-normaliser: the row's entropy is 0 (as documented for
    # rows without a finite lse) and the gradient must be 0, not NaN, for the other row too.
    inf = math.inf
    logits = torch.tensor([[[0.0, 0.0], [inf, 0.0]]], dtype=F64, requires_grad=True)
    h = entropy_from_logits(logits)
    assert_close(h.detach(), torch.tensor([[math.log(2.0), 0.0]], dtype=F64))
    h.sum().backward()
    # row 0 is uniform over 2: dH/dz_j = -p_j (z_j - sum p z) = 0
    assert_close(logits.grad, torch.zeros_like(logits))
