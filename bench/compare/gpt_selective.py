#!/usr/bin/python3
"""Python twin of `ckpt train`'s GPT (models/gpt.cpp), trained under torch.utils.checkpoint.

The same chain of stages (embeddings, pre-LN blocks with causal attention and a GELU MLP, final
LayerNorm and a head tied to the token embedding), the same step (gradients set to none, forward,
cross-entropy, backward, AdamW with GPT-2's betas and weight decay) and the same strategies as
`ckpt train --strategy`:
  none          no checkpointing
  sequential    every stage but the last its own region (checkpoint_sequential, non-reentrant)
  selective     the same regions under create_selective_checkpoint_contexts with the policy of
                ckpt::save_matmuls() (torch_checkpoint.save_matmuls)
Token ids are drawn at random from the vocabulary and the weights keep PyTorch's default
initialisation: step time and memory depend on neither.
Peaks are RSS high-water marks as in torch_checkpoint.py (allocations of 64 KiB or more mmapped);
times are medians of steps interleaved across strategies. Prints one JSON object.

Usage: gpt_selective.py [--steps 20] [--warmup 3] [--layers 8] [--batch 8] [--dropout 0.1]
"""

import argparse
import functools
import json
import math
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint as tuc

from torch_checkpoint import reset_hwm, save_matmuls, set_mmap_threshold, status_kib


class Embedding(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.token = nn.Embedding(c.vocab, c.width)
        self.position = nn.Embedding(c.context, c.width)
        self.dropout = nn.Dropout(c.dropout)

    def forward(self, ids):
        positions = torch.arange(ids.shape[1])
        return self.dropout(self.token(ids) + self.position(positions))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.heads = c.heads
        self.ln1 = nn.LayerNorm(c.width)
        self.qkv = nn.Linear(c.width, 3 * c.width)
        self.proj = nn.Linear(c.width, c.width)
        self.ln2 = nn.LayerNorm(c.width)
        self.fc1 = nn.Linear(c.width, 4 * c.width)
        self.fc2 = nn.Linear(4 * c.width, c.width)
        self.attention_dropout = nn.Dropout(c.dropout)
        self.residual_dropout = nn.Dropout(c.dropout)
        self.causal_mask = torch.ones(c.context, c.context, dtype=torch.bool).triu(1)

    def forward(self, x):
        b, t, c = x.shape
        hs = c // self.heads
        qkv = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, hs)
        q, k, v = (qkv.select(2, i).transpose(1, 2) for i in range(3))
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(hs)
        scores = scores.masked_fill(self.causal_mask[:t, :t], float("-inf"))
        attention = self.attention_dropout(torch.softmax(scores, -1))
        mixed = torch.matmul(attention, v).transpose(1, 2).reshape(b, t, c)
        h = x + self.residual_dropout(self.proj(mixed))
        return h + self.residual_dropout(self.fc2(F.gelu(self.fc1(self.ln2(h)))))


class Head(nn.Module):
    def __init__(self, c, tied_weight):
        super().__init__()
        self.ln = nn.LayerNorm(c.width)
        self.tied_weight = tied_weight  # stage 0's parameter, not registered again

    def forward(self, x):
        return torch.matmul(self.ln(x), self.tied_weight.t())


def make_gpt(c):
    torch.manual_seed(c.seed)
    embedding = Embedding(c)
    return nn.Sequential(embedding, *[Block(c) for _ in range(c.layers)],
                         Head(c, embedding.token.weight))


def run_stages(chain, first, end):
    def run(h):
        for j in range(first, end):
            h = chain[j](h)
        return h
    return run


def forward(chain, ids, strategy):
    if strategy == "none":
        return chain(ids)
    context_fn = (functools.partial(tuc.create_selective_checkpoint_contexts, save_matmuls)
                  if strategy == "selective" else tuc.noop_context_fn)
    h = ids
    for i in range(len(chain) - 1):  # as checkpoint_sequential with one stage per segment
        h = tuc.checkpoint(run_stages(chain, i, i + 1), h, use_reentrant=False,
                           context_fn=context_fn)
    return chain[-1](h)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=86)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--lr", type=float, default=6e-4)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--threads", type=int, default=1)
    c = parser.parse_args()
    torch.set_num_threads(c.threads)

    strategies = ["none", "sequential"]
    if hasattr(tuc, "create_selective_checkpoint_contexts"):
        strategies.append("selective")
    runs = {}
    for s in strategies:
        chain = make_gpt(c)
        chain.train()
        optimizer = torch.optim.AdamW(chain.parameters(), lr=c.lr, betas=(0.9, 0.95),
                                      weight_decay=0.1)
        runs[s] = {"chain": chain, "optimizer": optimizer, "times": []}
    generator = torch.Generator().manual_seed(c.seed)

    def step(s):
        run = runs[s]
        ids = torch.randint(c.vocab, (c.batch, c.context), generator=generator)
        targets = torch.randint(c.vocab, (c.batch, c.context), generator=generator)
        run["optimizer"].zero_grad(set_to_none=True)
        logits = forward(run["chain"], ids, s)
        loss = F.cross_entropy(logits.view(-1, c.vocab), targets.view(-1))
        loss.backward()
        run["optimizer"].step()

    # Memory: one step per strategy after warm-up, with large allocations mmapped so that RSS
    # follows the live tensors.
    set_mmap_threshold(65536, 0)
    for s in strategies:
        for _ in range(c.warmup):
            step(s)
        # Gradients set to none before the mark, as `ckpt train` measures: the step's peak
        # includes the gradients it creates.
        runs[s]["optimizer"].zero_grad(set_to_none=True)
        rss_ok = reset_hwm()
        before = status_kib("VmRSS")
        step(s)
        runs[s]["rss_peak_bytes"] = (status_kib("VmHWM") - before) * 1024 if rss_ok else -1
    # Time: steps interleaved across strategies, the heap keeping what is freed.
    set_mmap_threshold(32 << 20, 64 << 20)
    for r in range(c.steps):
        for s in strategies[r % len(strategies):] + strategies[:r % len(strategies)]:
            t0 = time.perf_counter()
            step(s)
            runs[s]["times"].append((time.perf_counter() - t0) * 1e3)

    rows = [{"strategy": s, "step_ms": statistics.median(runs[s]["times"]),
             "rss_peak_bytes": runs[s]["rss_peak_bytes"]} for s in strategies]
    json.dump({"torch_version": torch.__version__, "threads": torch.get_num_threads(),
               "rows": rows}, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
