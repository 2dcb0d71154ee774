#!/usr/bin/python3
"""A lower bound on the peak memory of ANY recomputation schedule of the any-model steps.

For each model of any_model_python.py (imported, same shapes and candidates) this prints the
plain step's peak (any_model_python's method: one step under torch.profiler, parameter gradients
None at its start, allocations summed above the step's start), a lower bound on the peak of every
schedule of the same step, the backward node that gives it with its breakdown, and the measured
peaks of checkpointed variants of the step, each checked to be at least the bound (exit 1 if one
is not: the argument would be unsound).

The argument. A schedule may keep or recompute any forward value (any placement of checkpoints,
any granularity, no offloading), but runs the same backward operators: every node N of the step's
autograd graph that leads to a parameter runs once, on its complete incoming gradient, after
every node from which it is reachable (B(N)) and before every node reachable from it (A(N)).
While N's operator runs these are live:
  - the saved tensors N's formula reads for the gradients that are needed (READS; a saved tensor
    used only for its shape is left out), less the storages that live before the step
    (parameters, buffers, inputs): they are its arguments;
  - the gradients flowing into N and those it produces for needed edges (made while the others
    are still held);
  - parameter gradients: once a producer in B(N) has sent a parameter its gradient, that
    gradient is held to the step's end, in the engine's slots along its way (TBackward, views)
    or as .grad; counted at the smallest size it takes on the way;
  - pending gradients: a slot of a node in A(N) that a node of B(N) has fed holds it until that
    node runs; and a gradient that a node of B(N) sends through chain nodes unordered with N
    (views, transposes: attention's dv) to a node of A(N) is in one of that chain's tensors,
    whichever runs first;
  - the operator's own allocations: its gradients, or, where more, the highest its allocations
    rose above the allocator's total when it started (its gradients and its scratch, less what
    it freed on the way), read from the profiler's events of the recorded step. The operator
    runs on the same inputs in every schedule, so it allocates the same.
Each storage is counted once, and a tensor only for the elements it covers (a region's input
gradient may be copied out of a larger one, as reentrant checkpointing does). Aliasing is read
from one recorded plain step that keeps every tensor alive (no address reused): a slot fed once
holds the producer's very tensor; a slot fed more than once holds a sum, new or made in place in
a tensor nobody else holds, so counted on its own at the smallest contribution's size; a
parameter's gradient is counted on its own only where no other gradient shares its storage.
Left out, so that the bound stays one: the loss, and anything held only under some orders the
engine may choose. Limits: the bound holds for schedules that run autograd's backward operators
whole; splitting an operator (micro-batches, tiling), other gradient formulas, or offloading
could go lower. test_lower_bound.py checks it on hand-counted cases. torch_checkpoint.py uses it
for `ckpt bench`'s floor rows, with gradients that exist before the step (`grads_before_step`:
they are added into in place, so no parameter gradient is held).

  OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python bench/compare/lower_bound.py \\
      [--quick] [--models unet,seq2seq,resnet,transformer]

Full run (2026-11-29, torch 2.15 wheel, 1 thread, the shared 2-core machine), the command
above without options; bound / plain peak, the node giving it (forward order), what is live:
  unet         64.03 / 179.29 MiB = 35.7% (ckpt's smallest plan 48.4%): the last decoder
               block's first convolution: its input, the concatenation (16 MiB), its incoming
               gradient (8 MiB), and its gradients and scratch (40 MiB);
  seq2seq      19.06 / 106.21 MiB = 17.9% (ckpt 20.3%): the first softmax: its result,
               gradient in and out (4 MiB each), every other parameter's gradient (6.56 MiB),
               dv on its way (0.5 MiB);
  resnet       17.67 /  67.96 MiB = 26.0% (ckpt 32.0%): the first block's first convolution:
               its input, gradient in, the shortcut's pending gradient (2 MiB each), the other
               parameters' gradients (5.66 MiB), its gradients and scratch (6.01 MiB);
  transformer  18.36 /  99.18 MiB = 18.5% (ckpt 20.6%): the first softmax, as seq2seq's, with
               5.86 MiB of parameter gradients.
Every measured variant (none; every candidate, every other one, the first half, the second half
checkpointed; every candidate reentrant; selective, saving matrix products; every leaf module;
every candidate and every leaf module in it) peaked at or above its model's bound: the lowest,
every candidate, at 90.32, 22.65, 36.53 and 22.15 MiB.
"""

import argparse
import contextlib
import functools
import os
import sys
from collections import Counter, defaultdict

import torch
import torch.utils.checkpoint as tuc
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import any_model_python as amp  # noqa: E402
import torch_checkpoint as chains  # noqa: E402  (save_matmuls, the selective policy)

# Kineto's warnings (on a machine without a GPU it logs an ERROR line per profiled step) would
# read as failures in `ckpt bench`'s output; read when the profiler first starts.
os.environ.setdefault("KINETO_LOG_LEVEL", "5")

# Saved tensors whose data a node's backward reads, by the outputs (positions in next_functions)
# that need them; None: every needed output. A node type not listed reads nothing we count.
READS = {
    "AddmmBackward0": {"_saved_mat1": {2}, "_saved_mat2": {1}},
    "MmBackward0": {"_saved_self": {1}, "_saved_mat2": {0}},
    "BmmBackward0": {"_saved_self": {1}, "_saved_mat2": {0}},
    "ConvolutionBackward0": {"_saved_input": {1}, "_saved_weight": {0}},
    "MulBackward0": {"_saved_self": {1}, "_saved_other": {0}},
    "DivBackward0": {"_saved_self": {1}, "_saved_other": None},
    "GeluBackward0": {"_saved_self": None},
    "PowBackward0": {"_saved_self": None},
    "ReluBackward0": {"_saved_result": None},
    "SoftmaxBackward0": {"_saved_result": None},
    "MaskedFillBackward0": {"_saved_mask": None},
    "MaxPool2DWithIndicesBackward0": {"_saved_result1": None},  # its input: only the shape
    "NativeBatchNormBackward0": {"_saved_input": {0, 1}, "_saved_result1": {0, 1},
                                 "_saved_result2": {0, 1}},
    "NativeLayerNormBackward0": {"_saved_input": {0, 1}, "_saved_result1": {0, 1},
                                 "_saved_result2": {0, 1}},
}

# Quoted from bench/results.md "Any model" (ckpt's smallest feasible budgets) and issue 48 (its
# ResNet and transformer targets are in `ckpt bench`'s accounting: its floor rows).
CKPT_FLOOR = {"unet": 48.4, "seq2seq": 20.3, "resnet": 32.0, "transformer": 20.6}
TARGET = {"unet": 40.0}
MIB = 2**20

# --- Storages and the bytes a set of tensors covers.


def storage_key(t):
    return ("storage", t.untyped_storage().data_ptr())


class Item:
    """A live tensor (a view of a storage) or a sum held in a storage of its own."""

    def __init__(self, tensor=None, key=None, nbytes=0):
        if tensor is not None:
            self.key, self.storage_bytes = storage_key(tensor), tensor.untyped_storage().nbytes()
            self.geometry = (tensor.element_size(), tensor.storage_offset(),
                             tuple(tensor.shape), tuple(tensor.stride()))
            self.nbytes = covered_bytes(self.storage_bytes, (self.geometry,))
        else:
            self.key, self.storage_bytes, self.geometry, self.nbytes = key, nbytes, None, nbytes


def non_overlapping(sizes, strides):
    extent = 1
    for stride, size in sorted((st, sz) for sz, st in zip(sizes, strides) if sz > 1):
        if stride < extent:
            return False
        extent += stride * (size - 1)
    return True


@functools.lru_cache(maxsize=None)
def covered_bytes(storage_bytes, geometries):
    """Bytes of a storage that views of these geometries cover, each element once."""
    if len(geometries) == 1 and non_overlapping(*geometries[0][2:]):
        size, _, shape, _ = geometries[0]
        return min(storage_bytes, size * torch.Size(shape).numel())
    if len({g[0] for g in geometries}) > 1:  # mixed element sizes: the largest single view
        return max(covered_bytes(storage_bytes, (g,)) for g in geometries)
    size = geometries[0][0]
    covered = torch.zeros(storage_bytes // size, dtype=torch.bool)
    index = torch.arange(covered.numel())
    for _, offset, shape, strides in geometries:
        covered[index.as_strided(shape, strides, offset)] = True
    return size * int(covered.sum())


def union_bytes(items):
    groups = defaultdict(list)
    for item in items:
        groups[item.key].append(item)
    total = 0
    for group in groups.values():
        if group[0].geometry is None:
            total += group[0].nbytes
        else:
            geometries = tuple(sorted({i.geometry for i in group}))
            total += covered_bytes(group[0].storage_bytes, geometries)
    return total

# --- One recorded plain step: the graph, the saved tensors read, every gradient.


class StepStorages(TorchDispatchMode):
    """The storages created in the step: those of the tensors operators return, less those of
    their arguments (a view or an in-place result of a parameter or an input is not new)."""

    def __init__(self):
        super().__init__()
        self.keys = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tensors = lambda tree: {storage_key(t) for t in tree_leaves(tree)  # noqa: E731
                                if isinstance(t, torch.Tensor)}
        self.keys |= tensors(out) - tensors((args, kwargs))
        return out


def is_parameter_sink(node):
    return type(node).__name__ == "AccumulateGrad"


def graph_order(root):
    """The nodes that lead to a parameter, root first, each after every node feeding it."""
    pending, stack, seen = defaultdict(int), [root], {root}
    while stack:
        for f, _ in stack.pop().next_functions:
            if f is not None:
                pending[f] += 1
                if f not in seen:
                    seen.add(f)
                    stack.append(f)
    order, ready = [], [root]
    while ready:
        node = ready.pop()
        order.append(node)
        for f, _ in node.next_functions:
            if f is not None:
                pending[f] -= 1
                if pending[f] == 0:
                    ready.append(f)
    needed = set()
    for node in reversed(order):
        if is_parameter_sink(node) or any(f in needed for f, _ in node.next_functions):
            needed.add(node)
    return [n for n in order if n in needed]


def own_allocation_peaks(prof):
    """Sequence number -> the highest the allocator's total rose above its value when the
    backward node of that number started, while its operator ran (its gradients and scratch,
    less what it freed on the way)."""
    peaks, stack = {}, list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        stack.extend(event.children)
        # The node's own range (named as the node: "ConvolutionBackward0", "MulBackward1"...),
        # not the engine's "autograd::engine::evaluate_function: ..." around it.
        if (event.tag != _EventType.TorchOp or "Backward" not in event.name
                or event.name.startswith("autograd::")):
            continue
        sizes, below = [], list(event.children)
        while below:
            inner = below.pop()
            below.extend(inner.children)
            if inner.tag == _EventType.Allocation and inner.extra_fields.device.type == "cpu":
                sizes.append((inner.start_time_ns, inner.extra_fields.alloc_size))
        live = peak = 0
        for _, size in sorted(sizes, key=lambda e: e[0]):
            live += size
            peak = max(peak, live)
        peaks[event.extra_fields.sequence_number] = peak
    return peaks


class Record:
    """One plain step of `model` under `step_loss`, every tensor of it kept alive. With
    `grads_before_step` the parameters' gradients exist before the step (zeros), so that the
    backward adds into them in place, as ckpt bench's steps do."""

    def __init__(self, model, step_loss, grads_before_step=False):
        for p in model.parameters():
            p.grad = torch.zeros_like(p) if grads_before_step else None
        self.grads_before_step = grads_before_step
        created = StepStorages()
        with created:
            loss = step_loss()
        self.order = graph_order(loss.grad_fn)
        self.index = {n: i for i, n in enumerate(self.order)}
        self.edges = [(i, k, self.index[f], nr) for i, n in enumerate(self.order)
                      for k, (f, nr) in enumerate(n.next_functions) if f in self.index]
        self.saved = [self.saved_reads(n, created.keys) for n in self.order]
        self.grads = {}
        hooks = [n.register_hook(functools.partial(self.keep, i))
                 for i, n in enumerate(self.order) if not is_parameter_sink(n)]
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            loss.backward()
        peaks = own_allocation_peaks(prof)
        self.own_peak = [peaks.get(n._sequence_nr(), 0) for n in self.order]
        for hook in hooks:
            hook.remove()
        self.before, self.after = reach(len(self.order), self.edges)
        self.outgoing, self.locations = defaultdict(list), tensor_locations(self)
        for edge in self.edges:
            self.outgoing[edge[0]].append(edge)
        self.fed_by = Counter(c for _, _, c, _ in self.edges)
        self.flows = parameter_flows(self)

    def is_chain(self, i):
        return (not is_parameter_sink(self.order[i]) and self.fed_by[i] == 1
                and len(self.outgoing[i]) == 1)

    def keep(self, i, produced, incoming):
        self.grads[i] = (produced, incoming)

    def needed_outputs(self, node):
        return {k for k, (f, _) in enumerate(node.next_functions) if f in self.index}

    def saved_reads(self, node, created):
        needed, items = self.needed_outputs(node), []
        for attr, outputs in READS.get(type(node).__name__, {}).items():
            t = getattr(node, attr)
            if (isinstance(t, torch.Tensor) and storage_key(t) in created
                    and (outputs is None or outputs & needed)):
                items.append((attr, t))
        return items


def tensor_locations(rec):
    """Storage -> where the record holds tensors of it: edges, nodes' incoming, saved."""
    found = defaultdict(set)
    for p, k, _, _ in rec.edges:
        if rec.grads[p][0][k] is not None:
            found[storage_key(rec.grads[p][0][k])].add(("edge", p, k))
    for i, (_, incoming) in rec.grads.items():
        for j, t in enumerate(incoming):
            if t is not None:
                found[storage_key(t)].add(("in", i, j))
    for i, saved in enumerate(rec.saved):
        for attr, t in saved:
            found[storage_key(t)].add(("saved", i, attr))
    return found


def reach(count, edges):
    """Bit masks: before[i], the nodes from which i is reachable; after[i], those reachable
    from i (edges go from the node producing a gradient to the node receiving it)."""
    parents, children = defaultdict(list), defaultdict(list)
    for p, _, c, _ in edges:
        parents[c].append(p)
        children[p].append(c)
    before, after = [0] * count, [0] * count
    for i in range(count):  # the order is topological
        for p in parents[i]:
            before[i] |= before[p] | (1 << p)
    for i in reversed(range(count)):
        for c in children[i]:
            after[i] |= after[c] | (1 << c)
    return before, after

# --- The bound.


class Flow:
    """A parameter's gradient on its way from `producer`: the tensors it is carried in, through
    chain nodes (one edge in, one out: TBackward, views) to the parameter's AccumulateGrad. From
    the producer's run to the step's end one of them, or the parameter's .grad, holds it."""

    def __init__(self, rec, producer, k, node, nr):
        self.producer, self.nodes, self.tensors = producer, [], [rec.grads[producer][0][k]]
        self.locations = {("edge", producer, k)}
        while rec.is_chain(node):
            self.nodes.append(node)
            _, k, next_node, next_nr = rec.outgoing[node][0]
            self.locations |= {("in", node, nr), ("edge", node, k)}
            self.tensors.append(rec.grads[node][0][k])
            node, nr = next_node, next_nr
        self.sink = node
        self.nbytes = min(Item(t).nbytes if t is not None else 0 for t in self.tensors)

    def exclusive(self, rec):
        """No tensor outside the flow shares a storage with it: it is counted on its own."""
        return all(rec.locations[storage_key(t)] <= self.locations
                   for t in self.tensors if t is not None)


def parameter_flows(rec):
    flows = defaultdict(list)
    for p, k, c, nr in rec.edges:
        if not rec.is_chain(p):
            flow = Flow(rec, p, k, c, nr)
            if is_parameter_sink(rec.order[flow.sink]):
                flows[flow.sink].append(flow)
    return flows


def parameter_items(rec, i):
    """The parameter gradients held while node i runs: one per parameter a flow of which has
    left a node of B(i) (and does not pass through i, where it is counted as i's gradients)."""
    items = []
    if rec.grads_before_step:  # each is added into its .grad, which lives before the step
        return items
    for sink, flows in rec.flows.items():
        fed = [f for f in flows if rec.before[i] >> f.producer & 1 and i not in f.nodes]
        variable = rec.order[sink].variable
        if fed and all(f.exclusive(rec) for f in fed):
            size = min([f.nbytes for f in fed] + [variable.numel() * variable.element_size()])
            items.append(Item(key=("gradient of", sink), nbytes=size))
        elif len(fed) == 1 and not fed[0].nodes and fed[0].tensors[0] is not None:
            # the produced tensor itself, or .grad (stolen from it, or a new copy)
            items.append(Item(fed[0].tensors[0]))
    return items


def pending_items(rec, i):
    """Gradients waiting in the slots of nodes that run after node i, fed by nodes of B(i)."""
    slots = defaultdict(list)
    for p, k, c, nr in rec.edges:
        tensor = rec.grads[p][0][k]
        if (rec.before[i] >> p & 1 and rec.after[i] >> c & 1 and tensor is not None
                and not is_parameter_sink(rec.order[c])):  # those: parameter_items
            slots[(c, nr)].append(tensor)
    items = []
    for (c, nr), fed in slots.items():
        if len(fed) == 1:
            items.append(Item(fed[0]))
        else:  # a sum: new, or made in place in a tensor nobody else holds
            items.append(Item(key=("sum", c, nr), nbytes=min(Item(t).nbytes for t in fed)))
    return items + detoured_items(rec, i)


def unordered(rec, i, j):
    return j != i and not (rec.before[i] >> j & 1) and not (rec.after[i] >> j & 1)


def detoured_items(rec, i):
    """Gradients that nodes of B(i) send through chain nodes unordered with node i (views,
    transposes) to a node of A(i): whether those run before node i or after it, one of the
    flow's tensors holds the gradient while node i runs (counted at the flow's smallest, where
    no tensor outside the flow shares its storages)."""
    items = []
    for p, k, c, nr in rec.edges:
        if not (rec.before[i] >> p & 1 and unordered(rec, i, c) and rec.is_chain(c)):
            continue
        flow = Flow(rec, p, k, c, nr)
        if (rec.after[i] >> flow.sink & 1 and all(unordered(rec, i, n) for n in flow.nodes)
                and not is_parameter_sink(rec.order[flow.sink]) and flow.exclusive(rec)):
            items.append(Item(key=("detour", p, k), nbytes=flow.nbytes))
    return items


def live_at(rec, i, scratch=True):
    """The parts live while node i runs, each counted above the ones before it. Last the
    operator's own: the gradients it makes, or with `scratch` what it allocated at its highest
    (gradients and temporaries, measured in the record) where that is more."""
    produced, incoming = rec.grads[i]
    needed = rec.needed_outputs(rec.order[i])
    parts = [("saved", [Item(t) for _, t in rec.saved[i]]),
             ("gradients in", [Item(t) for t in incoming if t is not None]),
             ("parameter gradients", parameter_items(rec, i)),
             ("pending gradients", pending_items(rec, i))]
    breakdown, items, total = {}, [], 0
    for name, part in parts:
        items += part
        now = union_bytes(items)
        breakdown[name], total = now - total, now
    made = [Item(t) for k, t in enumerate(produced) if k in needed and t is not None]
    own = union_bytes(items + made) - total
    if scratch and rec.own_peak[i] > own:
        breakdown["gradients out and scratch"] = rec.own_peak[i]
        return total + rec.own_peak[i], breakdown
    breakdown["gradients out"] = own
    return total + own, breakdown


def describe(rec, i):
    node = rec.order[i]
    name = type(node).__name__
    same = sorted(n._sequence_nr() for n in rec.order if type(n).__name__ == name)
    shapes = lambda ts: ", ".join("x".join(map(str, t.shape)) for t in ts if t is not None)
    saved = "; ".join(f"{a[7:]} {shapes([t])}" for a, t in rec.saved[i])
    return (f"{name} #{same.index(node._sequence_nr()) + 1} of {len(same)} in forward order "
            f"(gradient in {shapes(rec.grads[i][1])}; reads {saved or 'nothing counted'})")


def lower_bound(model, step_loss, scratch=True, grads_before_step=False):
    """(bound bytes, the node giving it, its breakdown) over the nodes of one recorded step."""
    rec = Record(model, step_loss, grads_before_step)
    best = max((live_at(rec, i, scratch) + (i,) for i in range(len(rec.order))
                if not is_parameter_sink(rec.order[i])), key=lambda r: r[0])
    total, breakdown, i = best
    return total, describe(rec, i), breakdown

# --- Checkpointed variants of the step, measured.


def reentrant_where_possible(fn, *args):
    """Reentrant checkpoint; a region whose inputs need no gradient would give its parameters
    none that way, so it runs non-reentrant (the same step either way)."""
    reentrant = any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)
    return tuc.checkpoint(fn, *args, use_reentrant=reentrant)


def selective(fn, *args):
    context = functools.partial(tuc.create_selective_checkpoint_contexts, chains.save_matmuls)
    return tuc.checkpoint(fn, *args, use_reentrant=False, context_fn=context)


@contextlib.contextmanager
def leaf_modules_checkpointed(model, on):
    """Every leaf module (convolution, norm, linear, ReLU...) a checkpoint, for the whole step
    (a candidate's recomputation in the backward must run the same regions)."""
    leaves = [m for m in model.modules() if not list(m.children())] if on else []
    for m in leaves:
        m.forward = functools.partial(tuc.checkpoint, type(m).forward.__get__(m),
                                      use_reentrant=False)
    try:
        yield
    finally:
        for m in leaves:
            del m.forward


def variants(loss, count):
    """(method, step, whether every leaf module is a checkpoint too)."""
    runner = lambda fn: amp.with_runner(loss, lambda: fn)  # noqa: E731
    found = [("none", loss, False)]
    for method, place in amp.PLACEMENTS:
        found.append((method, amp.with_runner(loss, lambda p=place: amp.Placed(p, count)), False))
    every = found[1][1]
    return found + [("every candidate, reentrant", runner(reentrant_where_possible), False),
                    ("every candidate, selective (save matmuls)", runner(selective), False),
                    ("every leaf module", loss, True),
                    ("every candidate and every leaf module in it", every, True)]


def measured_peaks(model, loss, count):
    """Peak bytes of each variant (after one unmeasured step), its gradients checked against the
    plain step's: the variants are the same step."""
    rows, reference = [], None
    for method, step, leaves in variants(loss, count):
        with leaf_modules_checkpointed(model, leaves):
            amp.profiled_peak(model, step)  # warm-up
            peak = amp.profiled_peak(model, step)
        grads = [p.grad.clone() for p in model.parameters()]
        if reference is None:
            reference = grads
        error = max(float((g - r).abs().max() / r.abs().max().clamp_min(1e-30))
                    for g, r in zip(grads, reference))
        if error > 1e-3:
            raise RuntimeError(f"{method}: gradients differ from the plain step's ({error:.1e})")
        rows.append((method, peak))
    return rows

# --- The table.


def report(name, plain, bound, node, breakdown, rows):
    pct = lambda b: f"{100 * b / plain:.1f}%"  # noqa: E731
    floor = f"{CKPT_FLOOR[name]}%" if name in CKPT_FLOOR else "-"
    target = f"{TARGET[name]}%" if name in TARGET else "-"
    parts = ", ".join(f"{k} {v / MIB:.2f}" for k, v in breakdown.items())
    print(f"| {name} | {plain / MIB:.2f} | {bound / MIB:.2f} | {pct(bound)} | {target} | {floor} "
          f"| {node}: {parts} MiB |")
    for method, peak in rows:
        verdict = "yes" if peak >= bound else "NO: UNSOUND"
        print(f"|   | {method} | {peak / MIB:.2f} | {pct(peak)} | >= bound: {verdict} | | |")
    return all(peak >= bound for _, peak in rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--models", default="unet,seq2seq,resnet,transformer")
    args = parser.parse_args()
    names = amp.model_list(parser, args.models)
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, 1 thread\n\n| model | plain peak MiB | bound MiB | bound vs "
          f"plain | target | ckpt's floor | bottleneck node: live parts |\n|---|---|---|---|---|"
          f"---|---|", flush=True)
    sound = True
    for name in names:
        _, _, model, loss = amp.SUBJECTS[name](args.quick)
        bound, node, breakdown = lower_bound(model, loss)
        rows = measured_peaks(model, loss, amp.count_candidates(loss))
        sound &= report(name, rows[0][1], bound, node, breakdown, rows)
        sys.stdout.flush()
    sys.exit(0 if sound else 1)


if __name__ == "__main__":
    main()
