#!/usr/bin/python3
"""Checks a `ckpt bench --json` file against its floor rows (lower_bound.py's bound, computed by
the Python side on the CPU): every model has one, and no C++ row that ran peaked below it or was
predicted below it. A row below the floor means the bound, the planner's model or the counting
allocator is wrong.

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
    for model, floor in sorted(floors.items()):
        print(f"{model}: floor {floor} B; every measured and predicted C++ peak at or above it")
    print(f"{checked} peaks checked")


if __name__ == "__main__":
    main(sys.argv[1])
