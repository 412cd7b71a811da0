"""The course's losses: masked cross-entropy against a hand computation, the hand-written backward
against finite differences (gradcheck, float64) and against autograd."""

import math

import pytest
import torch
import torch.nn.functional as F

from gpuformer_lib.losses import linear_softmax_cross_entropy, masked_cross_entropy


def test_masked_cross_entropy_equals_a_hand_computation():
    torch.manual_seed(0)
    logits = torch.randn(2, 4, 5, dtype=torch.float64)
    targets = torch.randint(0, 5, (2, 4))
    padding = torch.tensor([[False, False, False, True], [False, True, True, True]])
    by_hand = []
    for b in range(2):
        for t in range(4):
            if not padding[b, t]:
                row = logits[b, t]
                by_hand.append(-(row[targets[b, t]].item() - math.log(sum(math.exp(v) for v in row.tolist()))))
    expected = sum(by_hand) / len(by_hand)
    assert masked_cross_entropy(logits, targets, padding).item() == pytest.approx(expected, rel=1e-12)
    as_chapters_do = F.cross_entropy(logits.flatten(0, 1), targets.masked_fill(padding, 0).flatten(), ignore_index=0)
    if not (targets == 0).any():  # ignore_index also drops real tokens whose id is the pad id
        assert as_chapters_do.item() == pytest.approx(expected, rel=1e-12)


def test_masked_cross_entropy_errors():
    with pytest.raises(ValueError, match="agree"):
        masked_cross_entropy(torch.randn(2, 3, 5), torch.zeros(2, 4, dtype=torch.long), torch.zeros(2, 4, dtype=torch.bool))


def test_masked_cross_entropy_of_all_padding_says_so_unless_allowed():
    """Before: a batch of only padding (a mask the wrong way round, targets all -100) quietly gave loss 0."""
    logits, targets = torch.randn(2, 3, 5), torch.zeros(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="every one of the 6 target positions is padding.*wrong way round"):
        masked_cross_entropy(logits, targets, torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="allow_empty=True"):
        masked_cross_entropy(logits, targets.fill_(-100), torch.zeros(2, 3, dtype=torch.bool))
    one_real = torch.ones(2, 3, dtype=torch.bool)
    one_real[1, 2] = False  # a single real token is a batch
    assert masked_cross_entropy(logits, targets.fill_(1), one_real).item() > 0


def test_masked_cross_entropy_of_all_padding_is_zero_with_a_zero_gradient():
    logits = torch.full((1, 2, 5), float("nan")).requires_grad_()  # whatever a padded position holds
    loss = masked_cross_entropy(logits, torch.zeros(1, 2, dtype=torch.long), torch.ones(1, 2, dtype=torch.bool),
                                allow_empty=True)
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(logits.grad, torch.zeros_like(logits))  # not NaN (0 / 0)


def test_hand_written_backward():
    torch.manual_seed(1)
    args = (torch.randn(6, 5, dtype=torch.float64, requires_grad=True),
            torch.randn(7, 5, dtype=torch.float64, requires_grad=True),
            torch.randn(7, dtype=torch.float64, requires_grad=True), torch.randint(0, 7, (6,)))
    assert torch.autograd.gradcheck(linear_softmax_cross_entropy, args)
    ours = torch.autograd.grad(linear_softmax_cross_entropy(*args), args[:3])
    ref = torch.autograd.grad(F.cross_entropy(F.linear(*args[:3]), args[3]), args[:3])
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b)
