"""The layer check catches each kind of include it exists to catch (tests/layers/check_layers.py).

Usage: check_layers_test.py. Builds small source trees with one broken rule each and expects the
check to name it, and a tree that keeps the rules to pass.
"""
import contextlib
import io
import pathlib
import sys
import tempfile
import unittest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import check_layers  # noqa: E402

# A tree that keeps every rule: one private header reached across layers through a listed pair.
CLEAN = {
    "src/compat/shim.h": "",
    "src/region/graph.h": '#include "compat/shim.h"\n',
    "src/region/region.cpp": '#include "graph.h"\n#include <ckpt/checkpoint.h>\n',
    "src/chains/chain.cpp": '#include "region/graph.h"\n#include <torch/nn.h>\n',
    "include/ckpt/checkpoint.h": "",
    "include/ckpt/ckpt.h": '#include "ckpt/checkpoint.h"\n',
    "models/zoo.h": "#include <ckpt/ckpt.h>\n",
    "bench/compare/harness.h": '#include "zoo.h"\n',
    "tools/ckpt/main.cpp": '#include "harness.h"\n#include "zoo.h"\n',
}
REACH = {("src/compat", "src"): "the shim", ("src/region", "src/chains"): "the toolkit"}


def run(files):
    """The check's exit code and output on a tree of `files`."""
    with tempfile.TemporaryDirectory() as root:
        for path, text in files.items():
            (pathlib.Path(root) / path).parent.mkdir(parents=True, exist_ok=True)
            (pathlib.Path(root) / path).write_text(text)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = check_layers.main(root)
        return code, out.getvalue()


class CheckLayersTest(unittest.TestCase):
    def setUp(self):
        self.saved = check_layers.PRIVATE_REACH
        check_layers.PRIVATE_REACH = REACH

    def tearDown(self):
        check_layers.PRIVATE_REACH = self.saved

    def expect_caught(self, extra, text):
        code, out = run({**CLEAN, **extra})
        self.assertEqual(code, 1, out)
        self.assertIn(text, out)

    def test_a_tree_that_keeps_the_rules_passes(self):
        passed = "9 files: every include points to its own layer or below\n"
        self.assertEqual(run(CLEAN), (0, passed))

    def test_a_relative_include_counts_as_the_file_it_reaches(self):
        self.expect_caught({"src/region/up.cpp": '#include "../chains/chain.h"\n',
                            "src/chains/chain.h": ""},
                           "src/region/up.cpp (layer 2) includes src/chains/chain.h (layer 3)")

    def test_a_private_header_of_another_layer_is_caught(self):
        self.expect_caught({"src/measure/profiler.cpp": '#include "../region/graph.h"\n'},
                           "private header from another layer: src/measure/profiler.cpp")

    def test_tools_bench_and_models_are_checked(self):
        self.expect_caught({"tools/ckpt/train.cpp": '#include "region/graph.h"\n'},
                           "tools/ckpt/train.cpp (layer 10) includes src/region/graph.h")
        self.expect_caught({"models/strategy.cpp": '#include "harness.h"\n'},
                           "models/strategy.cpp (layer 8) includes bench/compare/harness.h")
        self.expect_caught({"bench/micro/b.cpp": '#include "../../tools/ckpt/units.h"\n',
                            "tools/ckpt/units.h": ""},
                           "points up: bench/micro/b.cpp (layer 9) includes tools/ckpt/units.h")

    def test_an_installed_header_reaches_only_installed_ones(self):
        self.expect_caught({"include/ckpt/detail/x.h": '#include "../../../src/region/graph.h"\n'},
                           "an installed header includes a file that is not installed")

    def test_a_quoted_name_that_resolves_nowhere_is_caught(self):
        self.expect_caught({"src/chains/lost.cpp": '#include "../../elsewhere/graph.h"\n'},
                           'names no file of the project')

    def test_an_unused_exception_is_caught(self):
        check_layers.PRIVATE_REACH = {**REACH, ("src/region", "src/measure"): "stale"}
        self.expect_caught({}, "PRIVATE_REACH lists (src/region, src/measure), which no include")


if __name__ == "__main__":
    unittest.main()
