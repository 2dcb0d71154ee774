#!/usr/bin/python3
"""Checks of lower_bound.py on cases computed by hand, and against measured peaks.

  OMP_NUM_THREADS=1 .venv/bin/python bench/compare/test_lower_bound.py

Each case: the bound equals the hand count, and it is at most the measured peak of the plain
step and of checkpointed variants of it (the whole forward; reentrant too where the input needs a
gradient; every leaf module). An AssertionError (exit status 1) on the first failure.
"""

import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint as tuc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import any_model_python as amp  # noqa: E402
import lower_bound as lb  # noqa: E402


class LinearSoftmax(nn.Module):
    """softmax(x W1^T + b1), then optionally a second Linear."""

    def __init__(self, n_in, n_mid, n_out=None):
        super().__init__()
        self.linear1 = nn.Linear(n_in, n_mid)
        self.linear2 = nn.Linear(n_mid, n_out) if n_out else None

    def forward(self, x):
        s = torch.softmax(self.linear1(x), -1)
        return self.linear2(s) if self.linear2 else s


def linear_softmax_case(n_in, input_grad=False, batch=64, n_out=512):
    """softmax(x W^T + b).pow(2).mean(); Y = batch*n_out*4 bytes, W = n_in*n_out*4, b = n_out*4,
    X = batch*n_in*4. PowBackward and SoftmaxBackward each read s (Y) with their gradient in and
    out (Y each): 3Y. AddmmBackward reads x (an input, or a parameter: not counted), takes Y,
    makes W and b, and X where x needs a gradient (x a parameter of the model, so that the step
    starts without its gradient): Y+W+b(+X). TBackward passes W as a view: W+b(+X)."""
    model = LinearSoftmax(n_in, n_out)
    x = torch.randn(batch, n_in)
    if input_grad:
        x = nn.Parameter(x)
        model.register_parameter("input", x)
    y, w, b, gx = batch * n_out * 4, n_in * n_out * 4, n_out * 4, batch * n_in * 4 * input_grad
    expected = max(3 * y, y + w + b + gx)
    node = "AddmmBackward0" if y + w + b + gx > 3 * y else "PowBackward0"  # Softmax's ties
    return model, x, expected, node


def two_linear_case(batch=64, n_in=64, n_mid=512, n_out=256):
    """linear2(softmax(linear1(x))).pow(2).mean(), x without grad; Y1 = batch*n_mid*4, Y2 =
    batch*n_out*4, W1 = n_in*n_mid*4, W2 = n_mid*n_out*4, b1, b2 the biases. Addmm2 reads s
    (Y1), takes Y2, makes the gradient of s (Y1), W2 and b2: 2Y1+Y2+W2+b2. SoftmaxBackward reads
    s, takes and makes Y1, while W2 (in TBackward's slot or as .grad) and b2 are held:
    3Y1+W2+b2, the largest here. Addmm1: Y1+W1+b1+W2+b2. Pow: 3Y2."""
    model = LinearSoftmax(n_in, n_mid, n_out)
    x = torch.randn(batch, n_in)
    y1, y2, w1, w2 = (batch * n_mid * 4, batch * n_out * 4, n_in * n_mid * 4, n_mid * n_out * 4)
    b1, b2 = n_mid * 4, n_out * 4
    expected = max(3 * y2, 2 * y1 + y2 + w2 + b2, 3 * y1 + w2 + b2, y1 + w1 + b1 + w2 + b2)
    assert expected == 3 * y1 + w2 + b2
    return model, x, expected, "SoftmaxBackward0"


class Residual(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)

    def forward(self, x):
        h = torch.relu(self.conv1(x))
        return self.conv2(h) + h


def residual_case(batch=2, channels=8, size=16):
    """y = conv2(h) + h, h = relu(conv1(x)), loss y.pow(2).mean(); A = activation bytes, K = one
    weight's. Conv2's backward reads h (A), takes g (A; the add passes the same g to the ReLU's
    slot: counted once) and makes its input gradient (A) and weight gradient (K): 3A + K. The
    ReLU's: h, the summed gradient, its output, conv2's weight gradient: 3A + K as well. Conv1's:
    g (A) in, K out, K already: A + 2K. Pow's: 3A."""
    model = Residual(channels)
    x = torch.randn(batch, channels, size, size)
    a, k = batch * channels * size * size * 4, channels * channels * 9 * 4
    return model, x, max(3 * a + k, a + 2 * k), "ConvolutionBackward0"


class ConvPool(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1, bias=False)

    def forward(self, x):
        return F.max_pool2d(self.conv(x), 2)


def conv_pool_case(batch=2, channels=8, size=32):
    """max_pool2d(conv(x), 2).pow(2).mean(), x without grad; A = the convolution's output, K its
    weight. The pool's backward reads its indices (int64: A/2; its input only for the shape),
    takes A/4 and makes A: 1.75A. The convolution's: A in, K out. Pow's: 3A/4."""
    model = ConvPool(channels)
    x = torch.randn(batch, channels, size, size)
    a, k = batch * channels * size * size * 4, channels * channels * 9 * 4
    return model, x, max(7 * a // 4, a + k), "MaxPool2DWithIndicesBackward0"


def measured(model, x):
    """Peaks of the plain step and of checkpointed variants of it (reentrant where x needs a
    gradient: otherwise the region's parameters would get none)."""
    loss = lambda forward: lambda: forward(x).pow(2).mean()  # noqa: E731
    whole = lambda reentrant: lambda i: tuc.checkpoint(  # noqa: E731
        model, i, use_reentrant=reentrant)
    steps = {"plain": loss(model), "whole forward, non-reentrant": loss(whole(False))}
    if x.requires_grad:
        steps["whole forward, reentrant"] = loss(whole(True))
    peaks = {name: amp.profiled_peak(model, step) for name, step in steps.items()}
    with lb.leaf_modules_checkpointed(model, True):
        peaks["every leaf module"] = amp.profiled_peak(model, loss(model))
    return peaks


def check(name, case):
    torch.manual_seed(0)
    model, x, expected, node = case
    step = lambda: model(x).pow(2).mean()  # noqa: E731
    bound, found, breakdown = lb.lower_bound(model, step, scratch=False)
    floor, at, parts = lb.lower_bound(model, step)
    peaks = measured(model, x)
    print(f"{name}: bound {bound} B (hand count {expected}) at {found}; {breakdown}; with "
          f"scratch {floor} B at {at}; {parts}; measured {peaks}")
    assert bound == expected, f"{name}: bound {bound} B, hand count {expected} B"
    assert found.startswith(node), f"{name}: bottleneck {found}, expected {node}"
    assert floor >= bound, f"{name}: counting scratch lowered the bound ({floor} < {bound} B)"
    low = {k: v for k, v in peaks.items() if v < floor}
    assert not low, f"{name}: measured peaks below the bound {floor} B: {low}"


class SelfAttentionLike(nn.Module):
    """mm(softmax(h), h^T), h = linear(x): the gradient of h^T, made by MmBackward before the
    softmax's backward, reaches h's node through a transpose that the softmax's backward is not
    ordered with (as attention's dv does)."""

    def __init__(self, n):
        super().__init__()
        self.linear = nn.Linear(n, n)

    def forward(self, x):
        h = self.linear(x)
        return torch.mm(torch.softmax(h, -1), h.t())


def node_index(rec, name):
    return next(i for i, n in enumerate(rec.order) if type(n).__name__ == name)


def detour_check(n=64):
    """SoftmaxBackward's live parts, Y = n*n*4: its result (Y), gradient in and out (Y each),
    and the gradient of h^T on its way through the transpose (Y): 4Y, whichever runs first."""
    torch.manual_seed(0)
    model, x = SelfAttentionLike(n), torch.randn(n, n)
    rec = lb.Record(model, lambda: model(x).pow(2).mean())
    total, parts = lb.live_at(rec, node_index(rec, "SoftmaxBackward0"), scratch=False)
    y = n * n * 4
    print(f"detour: SoftmaxBackward0 {total} B (hand count {4 * y}); {parts}")
    assert parts["pending gradients"] == y and total == 4 * y, parts


def scratch_check(batch=64, n_out=512):
    """Linear(64, 512) + softmax with its operators' scratch: PowBackward computes
    grad * (2 * s.pow(1)), two temporaries and its result (3Y) above s and its gradient in (2Y):
    5Y, above every other node's."""
    torch.manual_seed(0)
    model, x, _, _ = linear_softmax_case(64, batch=batch, n_out=n_out)
    floor, at, parts = lb.lower_bound(model, lambda: model(x).pow(2).mean())
    y = batch * n_out * 4
    print(f"scratch: {floor} B at {at} (hand count {5 * y}); {parts}")
    assert floor == 5 * y and at.startswith("PowBackward0"), (floor, at)


def main():
    torch.set_num_threads(1)
    detour_check()
    scratch_check()
    cases = {"Linear(64, 512) + softmax": linear_softmax_case(64),
             "Linear(1024, 512) + softmax": linear_softmax_case(1024),
             "Linear(1024, 512) + softmax, input needing a gradient":
                 linear_softmax_case(1024, input_grad=True),
             "Linear(64, 512) + softmax + Linear(512, 256)": two_linear_case(),
             "two-convolution residual block": residual_case(),
             "convolution + max pool": conv_pool_case()}
    for name, case in cases.items():
        check(name, case)
    print("all checks passed")


if __name__ == "__main__":
    main()
