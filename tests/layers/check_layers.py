"""Each layer of ckpt includes only its own layer and those below it (docs/design.md, Layers).

Usage: check_layers.py SOURCE_DIR. Exits 1 and names every include that breaks a rule:
- an include points up a layer;
- a private header (under src/) is reached from another layer, unless PRIVATE_REACH lists the
  pair with its reason;
- an installed header (include/ckpt) reaches a file that is not installed;
- a file of a checked folder, or a file it includes, is not assigned to a layer;
- a quoted include names no file of the project (ckpt's own headers are quoted, others take <>);
- PRIVATE_REACH lists a pair that no include uses any more.
Every include of the library, models/, bench/ and tools/ is resolved to the file it names, as the
compiler does: a quoted name next to the including file first, then the project's include roots;
`"../x.h"` counts as the file it reaches. Names found nowhere in the project are LibTorch's,
the standard library's or another dependency's. tests/ and examples/ are not checked: white-box
tests reach private headers on purpose.
"""
import os
import pathlib
import re
import sys

# Folders and headers, by layer (0: the LibTorch shim, 1: the shared autograd toolkit ... 7: the
# umbrella headers; then the model zoo, the benchmarks and the program, each above the last:
# `ckpt bench` is the harness). docs/design.md describes each layer.
LAYERS = {
    "src/compat": 0,
    "src/autograd": 1,
    "include/ckpt/detail": 2, "include/ckpt/checkpoint.h": 2, "include/ckpt/options.h": 2,
    "include/ckpt/selective.h": 2,
    "include/ckpt/recompute.h": 2, "include/ckpt/memory_label.h": 2, "src/region": 2,
    "include/ckpt/graph_exec_group.h": 2, "include/ckpt/report.h": 2,
    "include/ckpt/offload.h": 2, "include/ckpt/candidate.h": 2,
    "include/ckpt/sequential.h": 3, "include/ckpt/modules.h": 3,
    "include/ckpt/storage_mode.h": 3, "src/chains": 3,
    "include/ckpt/plan": 4, "src/plan": 4,
    "include/ckpt/profiler.h": 5, "include/ckpt/memory_tracker.h": 5, "src/measure": 5,
    "include/ckpt/model_profiler.h": 5, "include/ckpt/modeled_device.h": 5,
    "include/ckpt/planned_sequential.h": 6, "src/execute": 6,
    "include/ckpt/planned_model.h": 6, "include/ckpt/resilient_step.h": 6,
    "include/ckpt/ckpt.h": 7,
    # ckpt::emulated_device: an accelerator for tests, beside ckpt on the LibTorch shim alone.
    "include/ckpt/emulated_device.h": 0, "src/emulated_device": 0,
    # ckpt::distributed: data-parallel training under any strategy, on top of the whole library.
    "include/ckpt/distributed.h": 7, "src/distributed": 7,
    # Above the library, through its installed headers only.
    "models": 8,  # the model zoo and the strategies of the tools and tests
    "bench": 9,   # benchmarks; bench/compare is also the `ckpt bench` subcommand
    "tools": 10,  # the ckpt program
}
CHECKED = ["include/ckpt", "src", "models", "bench", "tools"]
SOURCE_SUFFIXES = {".h", ".hpp", ".cpp", ".cc"}
# Where the compiler looks for ckpt's own headers (target_include_directories of the targets).
INCLUDE_ROOTS = ["include", "src", "models", "bench/compare", "bench", "tools/ckpt"]

# Private headers reached from another layer, by (header folder or file, including folder): each
# with its reason. A pair not listed here is an error.
PRIVATE_REACH = {
    ("src/compat", "src"):
        "the LibTorch shim: version differences live in src/compat only, for every layer of the "
        "library",
    ("src/autograd", "src"):
        "the shared autograd toolkit (graph walks, the accumulation rule, RNG fork, autocast, "
        "buffers, versions, training modes, dispatch modes, stage graphs): its headers are meant "
        "for the regions, chains, profiler and executor above it",
}
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.MULTILINE)


def within(path, prefix):
    return path == prefix or path.startswith(prefix + "/")


def layer_of(path):
    """The layer of a repository-relative path, by its longest listed prefix; None if unlisted."""
    best = None
    for prefix, layer in LAYERS.items():
        if within(path, prefix) and (best is None or len(prefix) > len(best[0])):
            best = (prefix, layer)
    return None if best is None else best[1]


def resolve(root, including, quote, name):
    """The repository path an include names, or None when it is not one of the project's."""
    candidates = [os.path.join(os.path.dirname(including), name)] if quote == '"' else []
    candidates += [os.path.join(base, name) for base in INCLUDE_ROOTS]
    for candidate in candidates:
        path = os.path.normpath(candidate)
        if not path.startswith("..") and (root / path).is_file():
            return pathlib.PurePosixPath(path).as_posix()
    return None


def private_reach_reason(target, path):
    """Why `path` may include the private header `target`; None when it may not."""
    for (header, includer), reason in PRIVATE_REACH.items():
        if within(target, header) and within(path, includer):
            return reason
    return None


def check_include(path, layer, target):
    """The rule an include of `path` (layer `layer`) breaks, or None."""
    target_layer = layer_of(target)
    if target_layer is None:
        return f"not assigned to a layer in {__file__}: {target} (included by {path})"
    if target_layer > layer:
        return f"points up: {path} (layer {layer}) includes {target} (layer {target_layer})"
    if within(path, "include") and not within(target, "include"):
        return f"an installed header includes a file that is not installed: {path} -> {target}"
    private = within(target, "src") and not target.endswith(".cpp")
    if private and target_layer != layer and private_reach_reason(target, path) is None:
        return (f"private header from another layer: {path} (layer {layer}) includes {target} "
                f"(layer {target_layer}); use a public header, or list the pair with its "
                f"reason in PRIVATE_REACH")
    return None


def project_files(root):
    files = []
    for folder in CHECKED:
        files += [p for p in (root / folder).rglob("*") if p.suffix in SOURCE_SUFFIXES]
    return sorted(files)


def file_problems(root, path, used_reach):
    """The broken rules of one file's includes; records the PRIVATE_REACH pairs it uses."""
    layer = layer_of(path)
    if layer is None:
        return [f"not assigned to a layer in {__file__}: {path}"]
    problems = []
    for quote, name in INCLUDE.findall((root / path).read_text()):
        target = resolve(root, path, quote, name)
        if target is None:
            if quote == '"':  # ckpt's own headers are quoted; another project's take <>
                problems.append(f"{path}: #include \"{name}\" names no file of the project")
            continue
        problem = check_include(path, layer, target)
        if problem:
            problems.append(problem)
        elif within(target, "src") and layer_of(target) != layer:
            used_reach.update(pair for pair in PRIVATE_REACH
                              if within(target, pair[0]) and within(path, pair[1]))
    return problems


def main(root):
    root = pathlib.Path(root)
    files = project_files(root)
    problems, used_reach = [], set()
    for file in files:
        problems += file_problems(root, file.relative_to(root).as_posix(), used_reach)
    for header, includer in sorted(set(PRIVATE_REACH) - used_reach):
        problems.append(f"PRIVATE_REACH lists ({header}, {includer}), which no include uses: "
                        "remove it")
    for line in problems:
        print(line)
    if problems:
        return 1
    print(f"{len(files)} files: every include points to its own layer or below")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
