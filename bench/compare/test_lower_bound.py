#!/usr/bin/python3
"""Checks of lower_bound.py on cases computed by hand, and against measured peaks.

  OMP_NUM_THREADS=1 .venv/bin/python bench/compare/test_lower_bound.py

Each case: the bound equals the hand count, and it is at most the measured peak of the plain
step and of every checkpointed variant of it (whole forward, every leaf module, each reentrant).
Exit status 1 on the first failure.
"""

import os
import sys

import torch
import torch.nn as nn
import torch.utils.checkpoint as tuc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import any_model_python as amp  # noqa: E402
import lower_bound as lb  # noqa: E402


class LinearSoftmax(nn.Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        self.linear = nn.Linear(n_in, n_out)

    def forward(self, x):
        return torch.softmax(self.linear(x), -1)


def linear_softmax_case(n_in, batch=64, n_out=512):
    """softmax(x W^T + b).pow(2).mean(), x without grad; Y = batch*n_out*4 bytes, W = n_in*n_out*4,
    b = n_out*4. PowBackward and SoftmaxBackward each read s (Y) with their gradient in and out
    (Y each): 3Y. AddmmBackward reads x (an input: not counted), takes Y, makes W and b: Y+W+b.
    TBackward passes W as a view, b already made: W+b. MeanBackward: the seed (4 B) and Y."""
    model = LinearSoftmax(n_in, n_out)
    x = torch.randn(batch, n_in)
    y, w, b = batch * n_out * 4, n_in * n_out * 4, n_out * 4
    expected = max(3 * y, y + w + b)
    node = "AddmmBackward0" if y + w + b > 3 * y else "PowBackward0"  # Softmax's ties Pow's
    return model, x, expected, node


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


def measured(model, x):
    """Peaks of the plain step and of checkpointed variants of it."""
    loss = lambda forward: lambda: forward(x).pow(2).mean()  # noqa: E731
    whole = lambda reentrant: lambda i: tuc.checkpoint(  # noqa: E731
        model, i.requires_grad_(reentrant), use_reentrant=reentrant)
    rows = {"plain": loss(model), "whole forward, non-reentrant": loss(whole(False)),
            "whole forward, reentrant (input requiring grad)": loss(whole(True))}
    peaks = {}
    for name, step in rows.items():
        peaks[name] = amp.profiled_peak(model, step)
        x.requires_grad_(False)
    with lb.leaf_modules_checkpointed(model, True):
        peaks["every leaf module"] = amp.profiled_peak(model, loss(model))
    return peaks


def check(name, case):
    torch.manual_seed(0)
    model, x, expected, node = case
    bound, found, breakdown = lb.lower_bound(model, lambda: model(x).pow(2).mean())
    peaks = measured(model, x)
    print(f"{name}: bound {bound} B (hand count {expected}) at {found}; {breakdown}; measured "
          f"{peaks}")
    assert bound == expected, f"{name}: bound {bound} B, hand count {expected} B"
    assert found.startswith(node), f"{name}: bottleneck {found}, expected {node}"
    low = {k: v for k, v in peaks.items() if v < bound}
    assert not low, f"{name}: measured peaks below the bound {bound} B: {low}"


def main():
    torch.set_num_threads(1)
    cases = {"Linear(64, 512) + softmax": linear_softmax_case(64),
             "Linear(1024, 512) + softmax": linear_softmax_case(1024),
             "two-convolution residual block": residual_case()}
    for name, case in cases.items():
        check(name, case)
    print("all checks passed")


if __name__ == "__main__":
    main()
