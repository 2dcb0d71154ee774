#!/usr/bin/python3
"""Python's nearest equivalents for bench/planner/any_model.cpp.

The same four models (the U-Net and the encoder-decoder transformer of models/marked_models.cpp,
the bench "resnet" and "transformer" chains of models/bench_models.cpp, twins from
torch_checkpoint.py), the same candidates in the same forward order, and the same hand-placed
regions (torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False) around every
candidate, every other one, the first half, the second half), beside no checkpointing and
torch.compile with torch._functorch.config.activation_memory_budget (0.5, 0.3), each compiled in
a child process with a time limit.

Peak: one training step (forward + backward, parameter gradients None at its start) under
torch.profiler with profile_memory=True; the CPU allocator's allocation and free events, in
order, summed to the highest live total above the step's start (check_memory_method() checks the
method on hand-computed cases). Frees of blocks allocated before the profiler started are not
reported by the profiler, so a step that frees older tensors would read high; these steps free
none. Time: median of --repeats steps after one warm-up, without the profiler. One thread.

  OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python bench/compare/any_model_python.py \
      [--quick] [--models unet,seq2seq,resnet,transformer] [--repeats 3] [--json FILE]
      [--compile-models unet,seq2seq] [--compile-budgets 0.5,0.3] [--compile-timeout 600]

Full run (2026-11-26, torch 2.15 wheel, the shared 2-core machine, about 9 minutes), the command
above without options: the plain peaks equal the C++ counting allocator's (bench/results.md
"Any model": U-Net 179.29 MiB and transformer 99.18 MiB exactly, seq2seq 106.21 against 105.71,
resnet 67.96 against 67.77), and every candidate checkpointed reaches the C++ plan's smallest
budget (U-Net 50.4%, seq2seq 21.3%, resnet 53.7%, transformer 22.3%) at 1.29-1.48x the plain
step. Compiling at budget 0.5 / 0.3 took 45-70 s per budget and gave 64.6% / 58.0% (U-Net) and
54.0% / 36.4% (seq2seq) at 1.5-1.8x: compiled steps are slower than eager ones on this CPU even
at budget 1.0 (U-Net 1.28x, seq2seq 1.74x, transformer 1.46x).
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint as tuc
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_checkpoint as chains  # noqa: E402  (the resnet and transformer twins)

# --- Candidates: each model's forward passes its candidate blocks through candidate(), in the
# order the C++ forward marks them; the active runner (like ckpt's CandidateRunnerScope) decides.

_RUNNER = [None]


def candidate(fn, *args):
    runner = _RUNNER[0]
    return runner(fn, *args) if runner else fn(*args)


class Placed:
    """Checkpoints the candidates `place(index, count)` picks, runs the others plainly."""

    def __init__(self, place, count):
        self.place, self.count, self.next = place, count, 0

    def __call__(self, fn, *args):
        index, self.next = self.next, self.next + 1
        if self.place(index, self.count):
            return tuc.checkpoint(fn, *args, use_reentrant=False)
        return fn(*args)


PLACEMENTS = [
    ("every candidate", lambda i, n: True),
    ("every other one", lambda i, n: i % 2 == 0),
    ("the first half", lambda i, n: i < n // 2),
    ("the second half", lambda i, n: i >= n // 2),
]

# --- The U-Net (models/marked_models.cpp).


def unet_config(quick):
    if quick:
        return dict(batch=2, in_channels=3, out_channels=2, base=4, levels=3, image=64)
    return dict(batch=8, in_channels=3, out_channels=2, base=16, levels=4, image=128)


class ConvBnRelu(nn.Sequential):
    def __init__(self, cin, cout):
        super().__init__(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
                         nn.ReLU())


class Down(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.conv1, self.conv2 = ConvBnRelu(cin, cout), ConvBnRelu(cout, cout)

    def forward(self, x):
        features = self.conv2(self.conv1(x))
        return features, F.max_pool2d(features, 2)


class Bottom(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.conv1, self.conv2 = ConvBnRelu(cin, cout), ConvBnRelu(cout, cout)

    def forward(self, x):
        return self.conv2(self.conv1(x))


class Up(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.up = nn.ConvTranspose2d(cin, cout, 2, stride=2)
        self.conv1, self.conv2 = ConvBnRelu(2 * cout, cout), ConvBnRelu(cout, cout)

    def forward(self, x, skip):
        return self.conv2(self.conv1(torch.cat([self.up(x), skip], 1)))


class UNet(nn.Module):
    def __init__(self, c):
        super().__init__()
        channels, cin = c["base"], c["in_channels"]
        self.downs = nn.ModuleList()
        for _ in range(c["levels"]):
            self.downs.append(Down(cin, channels))
            cin, channels = channels, channels * 2
        self.bottom = Bottom(cin, channels)
        self.ups = nn.ModuleList()
        for _ in range(c["levels"]):
            self.ups.append(Up(channels, channels // 2))
            channels //= 2
        self.out = nn.Conv2d(channels, c["out_channels"], 1)

    def forward(self, x):
        skips, h = [], x
        for down in self.downs:
            skip, h = candidate(down, h)
            skips.append(skip)
        h = candidate(self.bottom, h)
        for i, up in enumerate(self.ups):
            h = candidate(up, h, skips[-1 - i])
        return self.out(h)


def unet_subject(quick):
    c = unet_config(quick)
    torch.manual_seed(0)
    model = UNet(c)
    torch.manual_seed(1)
    x = torch.randn(c["batch"], c["in_channels"], c["image"], c["image"])
    description = (f"U-Net, {c['levels']} levels from {c['base']} channels, BatchNorm; input "
                   f"{c['batch']}x{c['in_channels']}x{c['image']}x{c['image']}")
    return "unet", description, model, lambda: model(x).pow(2).mean()

# --- The encoder-decoder transformer (models/marked_models.cpp).


def seq2seq_config(quick):
    c = dict(batch=2, source=48, target=40, d_model=32, heads=4, ff=128, encoder_layers=2,
             decoder_layers=2)
    if not quick:
        c.update(batch=4, source=256, target=192, d_model=128, ff=512, encoder_layers=4,
                 decoder_layers=4)
    return c


class Attention(nn.Module):
    """AttentionImpl: multi-head attention of `query` over `memory`, written out."""

    def __init__(self, d_model, heads, causal):
        super().__init__()
        self.heads, self.causal = heads, causal
        self.q = nn.Linear(d_model, d_model)
        self.kv = nn.Linear(d_model, 2 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, query, memory):
        b, t, d = query.shape
        s, dh = memory.size(1), d // self.heads
        q = self.q(query).view(b, t, self.heads, dh).transpose(1, 2)
        kv = self.kv(memory).view(b, s, 2, self.heads, dh).permute(2, 0, 3, 1, 4)
        scores = torch.matmul(q, kv[0].transpose(-2, -1)) / math.sqrt(dh)
        if self.causal:
            mask = torch.ones(t, s, dtype=torch.bool).triu(1)
            scores = scores.masked_fill(mask, float("-inf"))
        context = torch.matmul(torch.softmax(scores, -1), kv[1]).transpose(1, 2).reshape(b, t, d)
        return self.out(context)


class EncoderLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        d = c["d_model"]
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attention = Attention(d, c["heads"], False)
        self.ff1, self.ff2 = nn.Linear(d, c["ff"]), nn.Linear(c["ff"], d)

    def self_attention(self, x):
        normed = self.ln1(x)
        return x + self.attention(normed, normed)

    def feed_forward(self, x):
        return x + self.ff2(F.gelu(self.ff1(self.ln2(x))))

    def forward(self, x):
        return candidate(self.feed_forward, candidate(self.self_attention, x))


class DecoderLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        d = c["d_model"]
        self.ln1, self.ln2, self.ln3 = nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d)
        self.self_attn = Attention(d, c["heads"], True)
        self.cross = Attention(d, c["heads"], False)
        self.ff1, self.ff2 = nn.Linear(d, c["ff"]), nn.Linear(c["ff"], d)

    def self_attention(self, x):
        normed = self.ln1(x)
        return x + self.self_attn(normed, normed)

    def cross_attention(self, x, memory):
        return x + self.cross(self.ln2(x), memory)

    def feed_forward(self, x):
        return x + self.ff2(F.gelu(self.ff1(self.ln3(x))))

    def forward(self, x, memory):
        h = candidate(self.self_attention, x)
        h = candidate(self.cross_attention, h, memory)
        return candidate(self.feed_forward, h)


class Seq2Seq(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.encoder = nn.ModuleList(EncoderLayer(c) for _ in range(c["encoder_layers"]))
        self.decoder = nn.ModuleList(DecoderLayer(c) for _ in range(c["decoder_layers"]))
        self.final = nn.LayerNorm(c["d_model"])

    def forward(self, source, target):
        memory = source
        for layer in self.encoder:
            memory = layer(memory)
        h = target
        for layer in self.decoder:
            h = layer(h, memory)
        return self.final(h)


def seq2seq_subject(quick):
    c = seq2seq_config(quick)
    torch.manual_seed(0)
    model = Seq2Seq(c)
    torch.manual_seed(1)
    source = torch.randn(c["batch"], c["source"], c["d_model"])
    target = torch.randn(c["batch"], c["target"], c["d_model"])
    description = (f"encoder-decoder transformer, {c['encoder_layers']}+{c['decoder_layers']} "
                   f"pre-LN layers, d={c['d_model']}, {c['heads']} heads, FF {c['ff']}, "
                   f"cross-attention; source {c['batch']}x{c['source']}, target "
                   f"{c['batch']}x{c['target']}")
    return "seq2seq", description, model, lambda: model(source, target).pow(2).mean()

# --- The bench chains (models/bench_models.cpp), candidates as the C++ stages mark them.


def chain_config(name, quick):
    if name == "resnet":
        return dict(kind="resnet", channels=[4, 8] if quick else [16, 32, 64, 128],
                    blocks_per_stage=1 if quick else 4, image=16 if quick else 64,
                    batch=2 if quick else 8, batch_norm=True)
    d_model = 16 if quick else 128
    return dict(kind="transformer", depth=2 if quick else 8, d_model=d_model, heads=4,
                ff=4 * d_model, seq=8 if quick else 256, batch=2 if quick else 4)


def residual_block(block, x):
    """ResidualBlockImpl's two candidates: conv1 (+bn1, relu), then conv2 (+bn2) with the
    shortcut from the block's input, which the second candidate takes too."""
    h = candidate(lambda i: torch.relu(block.bn1(block.conv1(i))), x)

    def second(i, block_input):
        shortcut = block_input
        if block.proj is not None:
            shortcut = block.proj_bn(block.proj(block_input))
        return torch.relu(block.bn2(block.conv2(i)) + shortcut)
    return candidate(second, h, x)


class MarkedChain(nn.Module):
    """A torch_checkpoint.py chain whose stages are candidates (the head is not one)."""

    def __init__(self, chain):
        super().__init__()
        self.chain = chain

    def forward(self, x):
        for stage in self.chain:
            if isinstance(stage, chains.ResidualBlock):
                x = residual_block(stage, x)
            elif isinstance(stage, chains.Head):
                x = stage(x)
            else:
                x = candidate(stage, x)
        return x


def chain_subject(name, quick):
    c = chain_config(name, quick)
    model = MarkedChain(chains.build_model(c))  # seeds 0 and 1, as the C++ side
    x = chains.make_input(c)
    if name == "resnet":
        description = (f"ResNet, {len(c['channels'])} stages x {c['blocks_per_stage']} blocks, "
                       f"channels {c['channels']}, BatchNorm; input "
                       f"{c['batch']}x3x{c['image']}x{c['image']}")
    else:
        description = (f"{c['depth']} pre-LN blocks, d={c['d_model']}, {c['heads']} heads, "
                       f"FF {c['ff']}; input {c['batch']}x{c['seq']}x{c['d_model']}")
    return name, description, model, lambda: model(x).pow(2).mean()


SUBJECTS = {"unet": unet_subject, "seq2seq": seq2seq_subject,
            "resnet": lambda quick: chain_subject("resnet", quick),
            "transformer": lambda quick: chain_subject("transformer", quick)}

# --- Measurement.


def allocation_events(prof):
    """The CPU allocator's events in the order they happened: (bytes, allocator total after)."""
    found, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if node.tag == _EventType.Allocation and node.extra_fields.device.type == "cpu":
            found.append((node.start_time_ns, node.extra_fields.alloc_size,
                          node.extra_fields.total_allocated))
    found.sort(key=lambda e: e[0])  # stable only matters on equal stamps; the check below tells
    return [(size, total) for _, size, total in found]


def peak_of(events):
    """Highest live total above the start, summing the sizes in order. The allocator's own
    running total must move by each event's size: a missed or misordered event would break it."""
    live = peak = 0
    for i, (size, total) in enumerate(events):
        live += size
        peak = max(peak, live)
        if i and total - events[i - 1][1] != size:
            raise RuntimeError(f"allocation event {i}: allocator total moved by "
                               f"{total - events[i - 1][1]}, the event says {size}")
    return peak


def profiled_peak(model, step_loss):
    """Peak bytes of one step, its parameter gradients None at the start."""
    for p in model.parameters():
        p.grad = None
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step_loss().backward()
    return peak_of(allocation_events(prof))


def median_seconds(model, step_loss, repeats):
    times = []
    for r in range(-1, repeats):  # one untimed warm-up step first
        for p in model.parameters():
            p.grad = None
        start = time.perf_counter()
        step_loss().backward()
        if r >= 0:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(model, step_loss, repeats):
    seconds = median_seconds(model, step_loss, repeats)  # also warms up before the profiled step
    return {"peak_bytes": profiled_peak(model, step_loss), "step_s": seconds}


def count_candidates(loss):
    counter = Placed(lambda i, n: False, 0)
    _RUNNER[0] = counter
    try:
        with torch.no_grad():
            loss()
    finally:
        _RUNNER[0] = None
    return counter.next


def with_runner(loss, make_runner):
    def run():
        _RUNNER[0] = make_runner()
        try:
            return loss()
        finally:
            _RUNNER[0] = None
    return run

# --- Hand-validation of the memory method.


def check_memory_method():
    """Cases computed by hand: raw allocations, then two bias-free Linear steps."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        a = torch.empty(1000)  # 4000 B
        b = torch.empty(2000)  # 8000 B: peak 12000
        del a
        c = torch.empty(500)  # 2000 B: live 10000
    events = allocation_events(prof)
    assert [e[0] for e in events] == [4000, 8000, -4000, 2000], events
    assert peak_of(events) == 12000
    del b, c
    checks = [check_linear_step(n_in) for n_in in (128, 1024)]  # pow's peak, then the weight's
    for check in checks:
        if check["measured"] != check["expected"]:
            raise RuntimeError(f"memory method disagrees with the hand count: {check}")
    return checks


def check_linear_step(n_in, batch=64, n_out=512):
    """y = x W^T (bias-free, x without grad), loss = y.pow(2).mean(); Y = batch*n_out*4 bytes,
    W = n_in*n_out*4. The loss and the backward's seed (4 B each) live to the end. PowBackward
    computes grad * (2 * y.pow(1)): three new tensors of Y while y and mean's gradient (Y each)
    still live, 5Y + 8; then MmBackward allocates the weight's gradient (W, kept as .grad) while
    pow's gradient (Y) lives, Y + W + 8. The peak is the larger of the two."""
    torch.manual_seed(0)
    linear = nn.Linear(n_in, n_out, bias=False)
    x = torch.randn(batch, n_in)
    y, w = batch * n_out * 4, n_in * n_out * 4
    measured = profiled_peak(linear, lambda: linear(x).pow(2).mean())
    return {"n_in": n_in, "measured": measured, "expected": max(5 * y, y + w) + 8}

# --- torch.compile with an activation memory budget, in a child process with a time limit.


def compiled_row(name, budget, quick, repeats):
    """Runs in the child: compile the whole step's loss under the budget and measure it."""
    import torch._functorch.config as functorch_config
    _, _, model, loss = SUBJECTS[name](quick)
    functorch_config.activation_memory_budget = budget
    compiled = torch.compile(loss)
    start = time.perf_counter()
    for p in model.parameters():
        p.grad = None
    compiled().backward()  # compiles the forward and the backward
    compile_s = time.perf_counter() - start
    return dict(measure(model, compiled, repeats), compile_s=compile_s)


def run_compiled(name, budget, args):
    command = [sys.executable, os.path.abspath(__file__), "--compile-row", f"{name}:{budget}",
               "--repeats", str(args.repeats)] + (["--quick"] if args.quick else [])
    # Cold compiles (no cache from an earlier run), one compile worker: the time a user waits.
    env = dict(os.environ, TORCHINDUCTOR_COMPILE_THREADS="1", OMP_NUM_THREADS="1",
               TORCHINDUCTOR_FORCE_DISABLE_CACHES="1")
    start = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, env=env,
                              timeout=args.compile_timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"no result after {args.compile_timeout} s (killed)"}
    minutes = (time.perf_counter() - start) / 60
    if done.returncode != 0:
        tail = [line for line in done.stderr.strip().splitlines() if line][-3:]
        return {"error": f"exit {done.returncode} after {minutes:.1f} min: " + " / ".join(tail)}
    return json.loads(done.stdout.strip().splitlines()[-1])

# --- The table.


def row(name, method, result, plain):
    if "error" in result:
        return f"| {name} | {method} | failed: {result['error']} | | | |"
    peak = result["peak_bytes"]
    extra = f" (compiled in {result['compile_s']:.0f} s)" if "compile_s" in result else ""
    return (f"| {name} | {method}{extra} | {peak / 2**20:.2f} | "
            f"{100 * peak / plain['peak_bytes']:.1f}% | {1e3 * result['step_s']:.0f} | "
            f"{result['step_s'] / plain['step_s']:.2f}x |")


def run_subject(name, args, rows):
    _, description, model, loss = SUBJECTS[name](args.quick)
    count = count_candidates(loss)
    print(f"{name}: {description}; {count} candidates", file=sys.stderr, flush=True)
    plain = measure(model, loss, args.repeats)
    results = [("none", plain)]
    for method, place in PLACEMENTS:
        step = with_runner(loss, lambda place=place: Placed(place, count))
        results.append((method, measure(model, step, args.repeats)))
    if name in args.compile_models:
        for budget in args.compile_budgets:
            results.append((f"torch.compile, memory budget {budget}",
                            run_compiled(name, budget, args)))
    for method, result in results:
        print(row(name, method, result, plain), flush=True)
        rows.append(dict(model=name, description=description, candidates=count,
                         method=method, **result))


def model_list(parser, text):
    names = [m for m in text.split(",") if m]
    unknown = [m for m in names if m not in SUBJECTS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}: expected some of "
                     f"{', '.join(SUBJECTS)}")
    return names


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--models", default="unet,seq2seq,resnet,transformer")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument("--compile-models", default="unet,seq2seq")
    parser.add_argument("--compile-budgets", default="0.5,0.3")
    parser.add_argument("--compile-timeout", type=int, default=600, help="seconds per compile")
    parser.add_argument("--compile-row", help=argparse.SUPPRESS)  # the child: MODEL:BUDGET
    args = parser.parse_args()
    args.models = model_list(parser, args.models)
    args.compile_models = model_list(parser, args.compile_models)
    try:
        args.compile_budgets = [float(b) for b in args.compile_budgets.split(",") if b]
    except ValueError:
        parser.error(f"--compile-budgets: expected numbers like 0.5,0.3, got "
                     f"'{args.compile_budgets}'")
    args.repeats = max(1, args.repeats)
    return args


def main():
    args = parse_args()
    torch.set_num_threads(1)
    if args.compile_row:
        name, budget = args.compile_row.split(":")
        print(json.dumps(compiled_row(name, float(budget), args.quick, args.repeats)))
        return
    check = check_memory_method()
    for c in check:
        print(f"memory method: Linear({c['n_in']}, 512) step {c['measured']} B measured, "
              f"{c['expected']} B by hand", file=sys.stderr)
    print(f"torch {torch.__version__}, 1 thread\n\n| model | method | peak MiB | peak vs none | "
          f"median step ms | time vs none |\n|---|---|---|---|---|---|", flush=True)
    rows = []
    for name in args.models:
        run_subject(name, args, rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch_version": torch.__version__, "check": check, "rows": rows}, f,
                      indent=1)


if __name__ == "__main__":
    main()
