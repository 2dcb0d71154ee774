#!/usr/bin/python3
"""Python twin of the ckpt comparison harness (bench/compare/harness.cpp).

Builds the same chain as models/bench_models.cpp from the same configuration (JSON, written by
the harness), and measures no checkpointing and torch.utils.checkpoint.checkpoint_sequential
(both variants where checkpoint_sequential takes use_reentrant, as in 2.x; reentrant only in
1.13) with the same protocol: gradient buffers
pre-allocated and zeroed in place, input requiring grad, loss = mean(output^2), warm-up steps,
one memory step per method (RSS high-water mark: VmHWM - VmRSS before, after writing 5 to
/proc/self/clear_refs, with mallopt(M_MMAP_THRESHOLD, 65536) as MALLOC_MMAP_THRESHOLD_=65536
would set), then timed steps interleaved across methods with a large mmap threshold (no mmap and
page faults per tensor), exactly like the C++ harness. Prints one JSON object on stdout.

With --device cuda[:N] the chain runs on that GPU: each memory step's peak is
torch.cuda.max_memory_allocated after reset_peak_memory_stats, less what was allocated before the
step (as the C++ harness reads the caching allocator's statistics), RSS is not measured, every
timed step ends with torch.cuda.synchronize(), and the rows add offloading: the same segments as
checkpoint_sequential's, each run under torch.autograd.graph.save_on_cpu(pin_memory=True) (what
offload_wrapper does around a module), the last segment plain as in checkpoint_sequential.

Usage: torch_checkpoint.py --config JSON --segments 2,4,8 [--steps 15] [--warmup 3] [--threads 1]
                           [--device cpu|cuda[:N]]
"""

import argparse
import functools
import inspect
import json
import math
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.utils.checkpoint as tuc


class MlpLayer(nn.Module):
    def __init__(self, width, activation):
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.activation = torch.nn.functional.gelu if activation == "gelu" else torch.tanh

    def forward(self, x):
        return self.activation(self.linear(x))


def norm(channels, batch_norm):
    return nn.BatchNorm2d(channels) if batch_norm else nn.Identity()


class Stem(nn.Module):
    def __init__(self, channels, batch_norm):
        super().__init__()
        self.conv = nn.Conv2d(3, channels, 3, padding=1, bias=False)
        self.bn = norm(channels, batch_norm)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


class ResidualBlock(nn.Module):
    def __init__(self, cin, cout, stride, batch_norm):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = norm(cout, batch_norm)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = norm(cout, batch_norm)
        self.proj = None
        if stride != 1 or cin != cout:
            self.proj = nn.Conv2d(cin, cout, 1, stride=stride, bias=False)
            self.proj_bn = norm(cout, batch_norm)

    def forward(self, x):
        h = torch.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        shortcut = self.proj_bn(self.proj(x)) if self.proj is not None else x
        return torch.relu(h + shortcut)


class Head(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.linear = nn.Linear(channels, 10)

    def forward(self, x):
        return self.linear(x.mean((2, 3)))


class AttentionHalf(nn.Module):
    """x + out(attention(ln1(x))): the first of a pre-LN block's two stages."""

    def __init__(self, d_model, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x):
        b, s, d = x.shape
        dh = d // self.heads
        qkv = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, dh).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(dh))
        context = torch.matmul(torch.softmax(scores, -1), v).transpose(1, 2).reshape(b, s, d)
        return x + self.out(context)


class FeedForwardHalf(nn.Module):
    """x + ff2(gelu(ff1(ln2(x)))): the second stage of the block."""

    def __init__(self, d_model, ff):
        super().__init__()
        self.ln2 = nn.LayerNorm(d_model)
        self.ff1 = nn.Linear(d_model, ff)
        self.ff2 = nn.Linear(ff, d_model)

    def forward(self, x):
        return x + self.ff2(torch.nn.functional.gelu(self.ff1(self.ln2(x))))


MATMULS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
           "aten::convolution", "aten::_convolution", "aten::mkldnn_convolution",
           "aten::_scaled_dot_product_flash_attention_for_cpu",
           "aten::_scaled_dot_product_efficient_attention",
           "aten::_scaled_dot_product_flash_attention"}


def save_matmuls(ctx, op, *args, **kwargs):
    """The policy of ckpt::save_matmuls(): keep the outputs of matrix products, convolutions and
    attention where they can be kept, recompute the rest."""
    name = op._schema.name if hasattr(op, "_schema") else str(op)
    return (tuc.CheckpointPolicy.PREFER_SAVE if name in MATMULS
            else tuc.CheckpointPolicy.PREFER_RECOMPUTE)


def build_model(c):
    torch.manual_seed(0)
    stages = []
    if c["kind"] == "mlp":
        stages = [MlpLayer(c["width"], c.get("activation", "tanh")) for _ in range(c["depth"])]
    elif c["kind"] == "resnet":
        ch = c["channels"]
        bn = c.get("batch_norm", True)
        stages.append(Stem(ch[0], bn))
        cin = ch[0]
        for s, cout in enumerate(ch):
            for b in range(c["blocks_per_stage"]):
                stages.append(ResidualBlock(cin, cout, 2 if (s > 0 and b == 0) else 1, bn))
                cin = cout
        stages.append(Head(cin))
    else:
        for _ in range(c["depth"]):
            stages.append(AttentionHalf(c["d_model"], c["heads"]))
            stages.append(FeedForwardHalf(c["d_model"], c["ff"]))
    return nn.Sequential(*stages)


def make_input(c):
    torch.manual_seed(1)
    if c["kind"] == "mlp":
        return torch.randn(c["batch"], c["width"])
    if c["kind"] == "resnet":
        return torch.randn(c["batch"], 3, c["image"], c["image"])
    return torch.randn(c["batch"], c["seq"], c["d_model"])


def status_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1


def reset_hwm():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def set_mmap_threshold(threshold, trim):
    """mallopt(M_MMAP_THRESHOLD / M_TRIM_THRESHOLD), as the C++ harness does (glibc only)."""
    try:
        import ctypes
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, threshold)  # M_MMAP_THRESHOLD
        if trim:
            libc.mallopt(-1, trim)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):
        pass


def floor(model, x):
    """lower_bound.py's bound on the peak of any schedule of this step that runs LibTorch's
    backward operators whole (their scratch counted), in the C++ side's terms: gradients
    allocated before the step, the input's too."""
    try:
        import lower_bound  # here: it imports this file
    except ImportError:  # an installed copy without bench/compare's other scripts
        return None
    x.grad = torch.zeros_like(x)
    bound, node, parts = lower_bound.lower_bound(model, lambda: model(x).square().mean(),
                                                 grads_before_step=True)
    return {"peak_bytes": bound, "node": node, "parts": parts}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--segments", default="")
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    config = json.loads(args.config)
    model = build_model(config)  # built on the CPU, with the C++ side's seeds, then moved
    model.train()
    model.to(device)
    x = make_input(config).to(device).requires_grad_(True)
    x.grad = torch.zeros_like(x)
    params = list(model.parameters())
    for p in params:
        p.grad = torch.zeros_like(p)
    n = len(model)

    # A setting is (segments, variant); segments 0 is no checkpointing. The variants: "reentrant",
    # "non_reentrant", and "selective" (non-reentrant, keeping the matrix products' outputs as
    # ckpt::save_matmuls() does, through create_selective_checkpoint_contexts).
    def forward(setting):
        segments, variant = setting
        if segments == 0:
            return model(x)
        if variant == "selective":
            return selective_sequential(segments)
        if variant == "offload":
            return offloaded_sequential(segments)
        if not has_use_reentrant:
            return tuc.checkpoint_sequential(model, segments, x)
        return tuc.checkpoint_sequential(model, segments, x, use_reentrant=variant == "reentrant")

    def run_stages(first, end):
        def run(h):
            for j in range(first, end):
                h = model[j](h)
            return h
        return run

    # checkpoint_sequential's segments, each a selectively checkpointed region.
    def selective_sequential(segments):
        size = n // segments
        h = x
        for first in range(0, size * (segments - 1), size):
            h = tuc.checkpoint(run_stages(first, first + size), h, use_reentrant=False,
                               context_fn=functools.partial(
                                   tuc.create_selective_checkpoint_contexts, save_matmuls))
        return run_stages(size * (segments - 1), n)(h)

    # checkpoint_sequential's segments, each under save_on_cpu as offload_wrapper runs a module;
    # the last one plain (its saved tensors are the backward's first reads).
    def offloaded_sequential(segments):
        size = n // segments
        h = x
        for first in range(0, size * (segments - 1), size):
            with torch.autograd.graph.save_on_cpu(pin_memory=True):
                h = run_stages(first, first + size)(h)
        return run_stages(size * (segments - 1), n)(h)

    def step(setting):
        for p in params:
            p.grad.zero_()
        x.grad.zero_()
        loss = forward(setting).square().mean()  # the output is not held through backward
        loss.backward()
        if cuda:
            torch.cuda.synchronize(device)

    # One memory step: the device's peak on CUDA, else the RSS high-water mark.
    def measure(setting):
        if cuda:
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            before = torch.cuda.memory_allocated(device)
            step(setting)
            return {"peak_bytes": torch.cuda.max_memory_allocated(device) - before,
                    "rss_peak_bytes": -1}
        rss_ok = reset_hwm()
        before = status_kib("VmRSS")
        step(setting)
        return {"rss_peak_bytes": (status_kib("VmHWM") - before) * 1024 if rss_ok else -1}

    has_use_reentrant = "use_reentrant" in inspect.signature(tuc.checkpoint_sequential).parameters
    segment_counts = [int(s) for s in args.segments.split(",") if s]
    variants = ["reentrant", "non_reentrant"] if has_use_reentrant else ["reentrant"]
    if hasattr(tuc, "create_selective_checkpoint_contexts"):
        variants.append("selective")
    if cuda:
        variants.append("offload")
    settings = [(0, "reentrant")] + [(s, v) for v in variants for s in segment_counts]
    results = {}
    # Memory phase: allocations of 64 KiB or more are mmapped and returned when freed, so RSS
    # follows the live tensors (as MALLOC_MMAP_THRESHOLD_=65536 does).
    set_mmap_threshold(65536, 0)
    for s in settings:
        for _ in range(args.warmup):
            step(s)
        size = n // s[0] if s[0] else 0
        recomputed = size * (s[0] - 1) if s[0] and s[1] != "offload" else 0
        results[s] = dict(measure(s), times=[], forward_count=n + recomputed)

    # Timing phase: the heap keeps freed memory, as in the C++ harness; one untimed round first.
    set_mmap_threshold(32 << 20, 64 << 20)
    for s in settings:
        step(s)
    for r in range(args.steps):
        order = settings[r % len(settings):] + settings[:r % len(settings)]
        for s in order:
            t0 = time.perf_counter()
            step(s)
            results[s]["times"].append((time.perf_counter() - t0) * 1e3)

    rows = []
    for s in settings:
        times = sorted(results[s]["times"])
        q = statistics.quantiles(times, n=4) if len(times) >= 2 else [times[0]] * 3
        row = {"segments": s[0], "reentrant": s[1] == "reentrant", "variant": s[1],
               "step_ms": statistics.median(times), "iqr_ms": q[2] - q[0],
               "rss_peak_bytes": results[s]["rss_peak_bytes"],
               "forward_count": results[s]["forward_count"]}
        if cuda:
            row["peak_bytes"] = results[s]["peak_bytes"]
        rows.append(row)
    result = {"torch_version": torch.__version__, "threads": torch.get_num_threads(),
              "stages": n, "rows": rows}
    if device.type == "cpu" and int(torch.__version__.split(".")[0]) >= 2:
        bound = floor(model, x)
        if bound is not None:
            result["floor"] = bound
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
