"""Each layer of ckpt includes only its own layer and those below it (docs/design.md, Layers).

Usage: check_layers.py SOURCE_DIR. Exits 1 and names every include that points up.
"""
import pathlib
import re
import sys

# Public headers and source folders, by layer (0: the LibTorch shim ... 6: the umbrella headers).
LAYERS = {
    "src/compat": 0,
    "include/ckpt/detail": 1, "include/ckpt/checkpoint.h": 1, "include/ckpt/options.h": 1,
    "include/ckpt/selective.h": 1,
    "include/ckpt/recompute.h": 1, "include/ckpt/memory_label.h": 1, "src/region": 1,
    "include/ckpt/sequential.h": 2, "include/ckpt/modules.h": 2, "src/chains": 2,
    "include/ckpt/plan": 3, "src/plan": 3,
    "include/ckpt/execute": 4, "src/execute": 4,
    "include/ckpt/profiler.h": 5, "include/ckpt/memory_tracker.h": 5, "src/measure": 5,
    "include/ckpt/planned_sequential.h": 6, "include/ckpt/ckpt.h": 6,
    # ckpt::emulated_device: an accelerator for tests, beside ckpt on the LibTorch shim alone.
    "include/ckpt/emulated_device.h": 0, "src/emulated_device": 0,
    # ckpt::distributed: data-parallel training under any strategy, on top of the whole library.
    "include/ckpt/distributed.h": 6, "src/distributed": 6,
}
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.MULTILINE)


def layer_of(path):
    """The layer of a repository-relative path, by its longest listed prefix; None if unlisted."""
    best = None
    for prefix, layer in LAYERS.items():
        if path == prefix or path.startswith(prefix + "/"):
            if best is None or len(prefix) > len(best[0]):
                best = (prefix, layer)
    return None if best is None else best[1]


def included_path(name):
    """The repository path of an include of ckpt's own, or None for LibTorch and the standard."""
    if name.startswith("ckpt/"):
        return "include/" + name
    if name.split("/")[0] in {"compat", "region", "chains", "plan", "execute", "measure",
                                  "distributed", "emulated_device"}:
        return "src/" + name
    return None


def main(root):
    root = pathlib.Path(root)
    files = [p for p in root.glob("include/ckpt/**/*") if p.is_file()]
    files += [p for p in root.glob("src/**/*") if p.suffix in {".h", ".cpp"}]
    unlisted, upward = [], []
    for file in sorted(files):
        path = file.relative_to(root).as_posix()
        layer = layer_of(path)
        if layer is None:
            unlisted.append(path)
            continue
        for name in INCLUDE.findall(file.read_text()):
            target = included_path(name)
            if target is None:
                continue
            target_layer = layer_of(target)
            if target_layer is None and target.startswith("src/") and "/" not in name:
                continue  # a sibling of the same folder, included by its bare name
            if target_layer is None:
                unlisted.append(f"{target} (included by {path})")
            elif target_layer > layer:
                upward.append(f"{path} (layer {layer}) includes {name} (layer {target_layer})")
    for line in unlisted:
        print(f"not assigned to a layer in {__file__}: {line}")
    for line in upward:
        print(f"points up: {line}")
    if unlisted or upward:
        return 1
    print(f"{len(files)} files: every include points to its own layer or below")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
