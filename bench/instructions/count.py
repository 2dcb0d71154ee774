#!/usr/bin/env python3
"""Instructions per training step of bench models, counted by callgrind (deterministic, unlike
step times on a shared machine).

Each method runs twice under `valgrind --tool=callgrind`, for 1 and 1 + STEPS steps (the first
step, which warms LibTorch up, is in both runs); the difference over STEPS is the count of one
step, with start-up, model building and planning cancelled. Prints a markdown table with the
ratio of each method to `none`.

usage: count.py STEP_PROGRAM MODEL METHOD... [--steps N] [--quick]
"""
import argparse
import re
import subprocess
import sys
import tempfile


def instructions(program, model, method, steps, quick):
    with tempfile.NamedTemporaryFile(suffix=".callgrind") as out:
        command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out.name}",
                   program, model, method, str(steps)] + (["--quick"] if quick else [])
        run = subprocess.run(command, capture_output=True, text=True,
                             env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
        if run.returncode != 0:
            sys.exit(f"count.py: {' '.join(command)} failed:\n{run.stderr[-2000:]}")
        collected = re.search(r"Collected : (\d+)", run.stderr)
        schedule = re.search(r"schedule: (.*)", run.stderr)
        return int(collected.group(1)), schedule.group(1) if schedule else ""


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("program")
    parser.add_argument("model")
    parser.add_argument("methods", nargs="+")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    print(f"| {args.model} method | instructions per step | vs none |\n|---|---:|---:|")
    base = None
    for method in ["none"] + [m for m in args.methods if m != "none"]:
        one, schedule_one = instructions(args.program, args.model, method, 1, args.quick)
        more, schedule_more = instructions(args.program, args.model, method, 1 + args.steps,
                                           args.quick)
        if schedule_one != schedule_more:
            sys.exit(f"count.py: {method} planned differently in its two runs; count again")
        per_step = (more - one) / args.steps
        base = base or per_step
        print(f"| {method} | {per_step / 1e6:.3f}M | {per_step / base:.3f}x |", flush=True)


if __name__ == "__main__":
    main()
