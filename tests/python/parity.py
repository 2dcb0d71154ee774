"""Redoes python_parity.cpp's computation with torch.utils.checkpoint and compares bit for bit."""
import sys

import numpy as np
import torch
from torch.utils.checkpoint import checkpoint

SHAPES = {"x": (8, 16), "w1": (32, 16), "b1": (32,), "w2": (16, 32), "b2": (16,)}


def load(directory, name, shape):
    return torch.from_numpy(np.fromfile(f"{directory}/{name}.bin", dtype=np.float32).reshape(shape))


def main(directory):
    torch.set_num_threads(1)
    tensors = {n: load(directory, n, s).requires_grad_() for n, s in SHAPES.items()}

    def fn(x):
        h = torch.nn.functional.linear(x, tensors["w1"], tensors["b1"]).tanh()
        h = torch.nn.functional.dropout(h, 0.5, training=True)
        return torch.nn.functional.linear(h, tensors["w2"], tensors["b2"])

    failures = 0
    for reentrant in (True, False):
        for t in tensors.values():
            t.grad = None
        torch.manual_seed(123)
        y = checkpoint(fn, tensors["x"], use_reentrant=reentrant)
        y.pow(2).sum().backward()
        prefix = "reentrant_" if reentrant else "non_reentrant_"
        pairs = [("y", y.detach(), SHAPES["x"][:1] + (16,))]
        pairs += [(f"grad_{n}", t.grad, SHAPES[n]) for n, t in tensors.items()]
        for name, ours, shape in pairs:
            theirs = load(directory, prefix + name, shape)
            same = torch.equal(ours, theirs)
            failures += not same
            diff = (ours - theirs).abs().max().item()
            print(f"{prefix}{name}: {'identical' if same else f'DIFFERENT (max abs diff {diff})'}")
    print("all identical" if not failures else f"{failures} tensors differ")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
