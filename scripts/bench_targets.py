#!/usr/bin/env python3
"""Checks the figures of `ckpt bench --json FILE` against the project's targets.

The targets are the project's acceptance thresholds, not the product's business: `ckpt bench`
reports figures only, and this script (run where results are recorded, e.g. bench/results.md)
prints one line per target with its figures and "met" or "missed".

usage: python3 scripts/bench_targets.py bench.json
"""
import json
import math
import sys


def find(rows, model, method, segments=0):
    for row in rows:
        if row["model"] == model and row["method"] == method and row.get("segments", 0) == segments:
            return row
    return None


def verdict(met):
    return "met" if met else "missed"


def mib(size):
    return f"{size / 2**20:.2f} MiB"


def segment_counts(stages):
    counts = []
    for s in (2, 4, round(math.sqrt(stages)), stages):
        s = max(1, min(s, stages))
        if s not in counts:
            counts.append(s)
    return counts


def mlp_target(rows):
    none = find(rows, "mlp", "none")
    if none is None:
        return
    s = round(math.sqrt(none["forward_count"]))
    row = find(rows, "mlp", "ckpt_sequential", s)
    if row:
        yield (f"MLP: peak at sqrt(n) = {s} segments <= 0.5x none",
               f"{mib(row['peak_bytes'])} / {mib(none['peak_bytes'])} = {row['memory_ratio']:.3f}x",
               row["memory_ratio"] <= 0.5)


def small_targets(rows):
    none = find(rows, "small", "none")
    if none is None:
        return
    for s in segment_counts(none["forward_count"]):
        for method in ("ckpt_sequential_reentrant", "ckpt_sequential"):
            row = find(rows, "small", method, s)
            if row is None:
                continue
            python = find(rows, "small", "python" + method[len("ckpt"):], s)
            if python and python["step_ms"] > 0:
                ratio = row["step_ms"] / python["step_ms"]
                yield (f"small, segments={s}: {method} <= 0.8x Python",
                       f"{row['step_ms']:.2f} / {python['step_ms']:.2f} ms = {ratio:.3f}x",
                       ratio <= 0.8)
            yield (f"small, segments={s}: {method} overhead <= 1.45x",
                   f"{row['overhead']:.3f}x", row["overhead"] <= 1.45)


def planned_targets(rows):
    """Issue 12's targets for PlannedSequential, per model."""
    for model in sorted({row["model"] for row in rows}):
        planned = [r for r in rows if r["model"] == model and r["method"] == "ckpt_planned"]
        ran = [r for r in planned if r["step_ms"] > 0]
        for row in ran:
            if "min feasible" in row["setting"]:
                yield (f"{model}: lowest feasible budget <= 15% of none",
                       f"{mib(row['peak_bytes'])} = {100 * row['memory_ratio']:.1f}% of none",
                       row["memory_ratio"] <= 0.15)
            if "(none peak)" in row["setting"]:
                yield (f"{model}: at the no-checkpoint peak, step <= 1.02x none",
                       f"{row['overhead']:.3f}x", row["overhead"] <= 1.02)
        yield from prediction_targets(model, ran)
        yield from sequential_comparison(rows, model, ran)


def prediction_targets(model, ran):
    peaks = [r for r in ran if r["predicted_peak_bytes"] > 0 and r["peak_bytes"] >= 0]
    if peaks:
        worst = max(abs(r["peak_bytes"] - r["predicted_peak_bytes"]) / r["predicted_peak_bytes"]
                    for r in peaks)
        yield (f"{model}: measured peak within 5% of the prediction ({len(peaks)} rows)",
               f"worst {100 * worst:.1f}%", worst <= 0.05)
    times = [r for r in ran if r.get("predicted_step_ms", -1) > 0]
    if times:
        worst = max(abs(r["step_ms"] - r["predicted_step_ms"]) / r["predicted_step_ms"]
                    for r in times)
        yield (f"{model}: step time within 10% of the prediction ({len(times)} rows)",
               f"worst {100 * worst:.1f}%", worst <= 0.10)


def sequential_comparison(rows, model, ran):
    """Planned at checkpoint_sequential's own peak: its overhead against the sequential one."""
    for row in ran:
        label = row["setting"].split("(")[-1].rstrip(")")
        if not label.startswith("segments=") or not label.endswith(" peak"):
            continue
        segments = int(label[len("segments="):-len(" peak")])
        sequential = find(rows, model, "ckpt_sequential", segments)
        if sequential is None or sequential["overhead"] <= 1:
            continue
        share = (row["overhead"] - 1) / (sequential["overhead"] - 1)
        figures = (f"planned {row['overhead']:.3f}x, sequential {sequential['overhead']:.3f}x: "
                   f"{100 * share:.0f}% of its overhead")
        if model == "resnet":
            yield (f"resnet, segments={segments}: planned <= 1/3 of the overhead", figures,
                   share <= 1 / 3)
        if model == "transformer":
            yield (f"transformer, segments={segments}: planned >= 10% less overhead", figures,
                   share <= 0.9)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    with open(sys.argv[1]) as file:
        rows = json.load(file)["rows"]
    print("| target | figures | verdict |\n|---|---|---|")
    for target in (*mlp_target(rows), *small_targets(rows), *planned_targets(rows)):
        name, figures, met = target
        print(f"| {name} | {figures} | {verdict(met)} |")


if __name__ == "__main__":
    main()
