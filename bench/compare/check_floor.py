#!/usr/bin/python3
"""Checks a `ckpt bench --json` file against its floor rows (lower_bound.py's bound, computed by
the Python side on the CPU): every model has one, and no C++ row that ran peaked below it or was
predicted below it. A row below the floor means the bound, the planner's model or the counting
allocator is wrong. And every planned row that ran kept to its budget and peaked within 1% of its
prediction (issue 48's rule): a planner whose profile drifts from the step it plans fails here.

  ckpt bench --quick --models resnet,transformer --json F && python3 check_floor.py F
"""

import json
import sys


def main(path):
    rows = json.load(open(path))["rows"]
    floors = {r["model"]: r["peak_bytes"] for r in rows if r["method"] == "floor"}
    models = {r["model"] for r in rows}
    missing = models - floors.keys()
    assert not missing, f"no floor row for {sorted(missing)}"
    checked = 0
    for r in rows:
        if r["method"].startswith("python") or r["method"] == "floor" or r["step_ms"] <= 0:
            continue
        floor = floors[r["model"]]
        for what in ("peak_bytes", "predicted_peak_bytes"):
            if r[what] > 0:
                assert r[what] >= floor, (f"{r['model']} {r['method']} {r['setting']}: {what} "
                                          f"{r[what]} B is below the floor {floor} B")
                checked += 1
    assert checked > 0, "no measured row to check"
    planned = check_predictions(rows)
    for model, floor in sorted(floors.items()):
        print(f"{model}: floor {floor} B; every measured and predicted C++ peak at or above it")
    print(f"{checked} peaks checked; {planned} planned rows within their budgets and predictions")


def check_predictions(rows):
    checked = 0
    for r in rows:
        if r["method"] not in ("ckpt_planned", "ckpt_model_planned") or r["peak_bytes"] <= 0:
            continue
        where = f"{r['model']} {r['method']} {r['setting']}"
        peak, predicted = r["peak_bytes"], r["predicted_peak_bytes"]
        budget = r["budget_bytes"]
        assert peak <= budget, f"{where}: peak {peak} B above its budget {budget} B"
        # The chain planner's rows hold the 8-byte loss its model leaves out.
        assert abs(peak - predicted) <= 0.01 * predicted + 8, (
            f"{where}: peak {peak} B, predicted {predicted} B (more than 1% apart)")
        checked += 1
    assert checked > 0, "no planned row to check"
    return checked


if __name__ == "__main__":
    main(sys.argv[1])
