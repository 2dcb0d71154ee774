// Nested regions, double backward and backward inside a region (non-reentrant). Ports of
// test_autograd.py::TestNestedCheckpoint, adapted to C++ closures.

#include <ckpt/checkpoint.h>
#include <ckpt/memory_tracker.h>

#include "support/support.h"

#include <functional>

namespace checkpoint_nested_test {

using Fn = std::function<torch::Tensor(const torch::Tensor&)>;
using ckpt::test::close;

struct NestedCheckpointTest : ckpt::test::SeedingFixture {};

// The helpers of TestNestedCheckpoint: c(fn) checkpoints, grad(fn) differentiates with
// create_graph, sum(fn) reduces.
Fn c(Fn fn) {
  return [fn](const torch::Tensor& x) { return ckpt::checkpoint(fn, x); };
}
Fn grad(Fn fn) {
  return [fn](const torch::Tensor& x) {
    torch::AutoGradMode enable(true);
    auto out = fn(x);
    return torch::autograd::grad({out}, {x}, {}, /*retain_graph=*/c10::nullopt,
                                 /*create_graph=*/true)[0];
  };
}
Fn sum(Fn fn) {
  return [fn](const torch::Tensor& x) { return fn(x).sum(); };
}

std::vector<std::pair<Fn, std::vector<Fn>>> get_tests(Fn fn) {
  return {
      {fn, {c(fn), c(c(fn))}},
      {grad(fn), {grad(c(fn)), grad(c(c(fn)))}},
      {grad(grad(fn)), {grad(c(grad(fn))), c(grad(grad(c(fn)))), grad(c(grad(c(fn))))}},
      {grad(grad(grad(fn))), {grad(c(grad(grad(c(fn))))), grad(c(grad(c(grad(c(fn))))))}},
  };
}

// Every node reachable from `root`, as weak pointers.
std::vector<ckpt::test::WeakNodePtr> reachable(const torch::Tensor& root) {
  std::vector<ckpt::test::WeakNodePtr> out;
  std::vector<ckpt::compat::NodePtr> stack;
  std::set<torch::autograd::Node*> seen;
  if (root.grad_fn()) stack.push_back(root.grad_fn());
  while (!stack.empty()) {
    auto node = stack.back();
    stack.pop_back();
    if (!seen.insert(node.get()).second) continue;
    out.emplace_back(node);
    for (const auto& edge : node->next_edges()) {
      if (edge.function) stack.push_back(edge.function);
    }
  }
  return out;
}

// After the result is dropped, no node of its graph survives (no reference cycles).
void expect_graph_dies(const Fn& fn) {
  std::vector<ckpt::test::WeakNodePtr> nodes;
  {
    auto a = torch::randn({}, torch::requires_grad());
    nodes = reachable(fn(a));
  }
  for (const auto& node : nodes) {
    EXPECT_TRUE(node.expired()) << "a " << node.lock()->name() << " node survived";
  }
}

TEST_F(NestedCheckpointTest, NestedCheckpoint) {
  Fn f = [](const torch::Tensor& x) { return x.sin().exp().sin(); };
  Fn g = [](const torch::Tensor& x) {
    // A backward inside the checkpointed function.
    auto a = x.sin().exp().sin();
    auto b = x.sin().exp().sin();
    auto ga = torch::autograd::grad({a}, {x})[0];
    auto gb = torch::autograd::grad({b}, {x})[0];
    return x.sin() + 0 * (ga + gb).detach();
  };
  for (const auto& fn : {f, g}) {
    for (const auto& [expected, actuals] : get_tests(fn)) {
      auto x = torch::randn({}, torch::requires_grad());
      auto want = expected(x);
      for (const auto& actual : actuals) {
        EXPECT_TRUE(close(actual(x), want));
        expect_graph_dies(actual);
      }
    }
  }
}

TEST_F(NestedCheckpointTest, TwoChildren) {
  Fn f = [](const torch::Tensor& x) { return x.sin().exp().sin(); };
  Fn g = [](const torch::Tensor& x) { return x.cos().sin().exp(); };
  Fn hc = [=](const torch::Tensor& x) { return c(g)(c(f)(x)); };
  Fn h = [=](const torch::Tensor& x) { return g(f(x)); };
  auto a = torch::randn({3, 3}, torch::requires_grad());
  auto expected = grad(sum(grad(sum(h))))(a);
  EXPECT_TRUE(close(grad(sum(grad(sum(c(hc)))))(a), expected));
  EXPECT_TRUE(close(grad(sum(c(grad(sum(c(hc))))))(a), expected));
  expect_graph_dies(grad(c(hc)));
  expect_graph_dies(grad(sum(grad(sum(c(hc))))));
  expect_graph_dies(grad(sum(c(grad(sum(c(hc)))))));
}

TEST_F(NestedCheckpointTest, NonTensorInputsAndOutputs) {
  auto fn = [](int k, const torch::Tensor& a, const torch::Tensor& b,
               const std::function<torch::Tensor(const torch::Tensor&)>& f) {
    return std::make_tuple(f(k * a * b.exp()), 1, std::string("abcd"));
  };
  auto sin = [](const torch::Tensor& t) { return t.sin(); };
  std::function<torch::Tensor(const torch::Tensor&)> f = sin;
  auto a = torch::tensor(2.0, torch::requires_grad());
  auto b = torch::tensor(3.0, torch::requires_grad());
  auto [out, one, text] = ckpt::checkpoint(fn, 3, a, b, f);
  EXPECT_EQ(one, 1);
  EXPECT_EQ(text, "abcd");
  auto actual = torch::autograd::grad({out}, {a, b});
  auto expected = torch::autograd::grad({std::get<0>(fn(3, a, b, f))}, {a, b});
  EXPECT_TRUE(close(actual[0], expected[0]));
  EXPECT_TRUE(close(actual[1], expected[1]));
}

TEST_F(NestedCheckpointTest, TensorArgumentBeyondTheFirstReceivesGradient) {
  // Adapted from test_nested_checkpoint_kwargs: gradient flows into every tensor argument.
  auto fn = [](const torch::Tensor& a, c10::optional<torch::Tensor> blah) {
    auto out = a.sin().exp();
    if (blah.has_value()) out = out * *blah;
    return out.sin().exp();
  };
  auto a = torch::tensor(2.0, torch::requires_grad());
  auto b = torch::tensor(3.0, torch::requires_grad());
  auto expected = torch::autograd::grad({fn(a, b)}, {a, b});
  auto actual =
      torch::autograd::grad({ckpt::checkpoint(fn, a, c10::optional<torch::Tensor>(b))}, {a, b});
  EXPECT_TRUE(close(actual[0], expected[0]));
  EXPECT_TRUE(close(actual[1], expected[1]));
}

TEST_F(NestedCheckpointTest, HookOnTheGraphBelowFiresOnce) {
  // Adapted from test_nested_checkpoint_same_graph.
  auto a = torch::tensor(1.0, torch::requires_grad());
  auto pre = a * 2;
  int calls = 0;
  pre.register_hook([&](const torch::Tensor& g) {
    ++calls;
    return g;
  });
  auto out = ckpt::checkpoint([](const torch::Tensor& t) { return t.sin().cos().sin(); }, pre);
  out.backward();
  EXPECT_EQ(calls, 1);
}

TEST_F(NestedCheckpointTest, ReentrantBackwardFromAHook) {
  // Adapted from test_nested_checkpoint_reentrant_backwards: a hook on an output runs a backward
  // through the same region from inside the outer backward. Both outputs share the region's node,
  // so the hook acts only when its own gradient arrives.
  auto a = torch::randn({}, torch::requires_grad());
  auto [x, out] = ckpt::checkpoint(
      [](const torch::Tensor& t) {
        auto h = t.sin().cos();
        return std::make_tuple(h, h.sin());
      },
      a);
  int inner_backwards = 0;
  out.register_hook([&](const torch::Tensor& g) {
    if (g.defined() && inner_backwards++ == 0) x.backward({}, /*retain_graph=*/true);
    return g;
  });
  out.backward({}, /*retain_graph=*/true);
  EXPECT_EQ(inner_backwards, 1);
  auto expected = (a.sin().cos().cos() + 1) * -a.sin().sin() * a.cos();
  EXPECT_TRUE(close(a.grad(), expected.detach()));
}

TEST_F(NestedCheckpointTest, ReentrantRegionInsideANonReentrantOne) {
  // The outer recompute runs the engine as backward() does when the outer backward is a plain
  // one, so the reentrant variant inside accepts it; under autograd::grad it still refuses.
  torch::nn::Linear inner(4, 4), outer(4, 4);
  const auto reentrant = ckpt::CheckpointOptions().use_reentrant(true);
  auto body = [&](const torch::Tensor& t, bool checkpointed) {
    auto inner_fn = [&](const torch::Tensor& u) { return inner(u).tanh(); };
    auto h = outer(t).sin();
    return checkpointed ? ckpt::checkpoint(reentrant, inner_fn, h) : inner_fn(h);
  };
  auto x = torch::randn({3, 4}, torch::requires_grad());
  body(x, false).pow(2).sum().backward();
  const std::vector<torch::Tensor> expected = {x.grad().clone(), inner->weight.grad().clone(),
                                               outer->weight.grad().clone()};
  for (auto* tensor : {&x, &inner->weight, &outer->weight}) tensor->mutable_grad().reset();
  ckpt::checkpoint([&](const torch::Tensor& t) { return body(t, true); }, x)
      .pow(2)
      .sum()
      .backward();
  EXPECT_TRUE(ckpt::test::bit_equal(x.grad(), expected[0]));
  EXPECT_TRUE(ckpt::test::bit_equal(inner->weight.grad(), expected[1]));
  EXPECT_TRUE(ckpt::test::bit_equal(outer->weight.grad(), expected[2]));

  auto out = ckpt::checkpoint([&](const torch::Tensor& t) { return body(t, true); }, x);
  CKPT_EXPECT_THROWS_WITH(torch::autograd::grad({out.sum()}, {x}),
                          "incompatible with torch::autograd::grad()");
}

TEST_F(NestedCheckpointTest, DeepNestingMatchesWithDropout) {
  torch::nn::Dropout dropout(0.3);
  Fn leaf = [dropout](const torch::Tensor& x) mutable { return dropout(x.tanh()) * 1.5; };
  Fn nested = leaf;
  for (int depth = 0; depth < 4; ++depth)
    nested = c([nested](const torch::Tensor& x) { return nested(x).sin() + x; });
  Fn plain = leaf;
  for (int depth = 0; depth < 4; ++depth)
    plain = [plain](const torch::Tensor& x) { return plain(x).sin() + x; };
  auto x = torch::randn({64}, torch::requires_grad());
  torch::manual_seed(7);
  auto expected = torch::autograd::grad({plain(x).sum()}, {x})[0];
  torch::manual_seed(7);
  auto actual = torch::autograd::grad({nested(x).sum()}, {x})[0];
  // x receives five gradient contributions, which the regions sum in another grouping than the
  // plain graph does: equal up to float rounding, and dropout masks identical.
  EXPECT_TRUE(close(actual, expected));
}

TEST_F(NestedCheckpointTest, DoubleBackwardThroughParameters) {
  torch::nn::Linear linear(3, 3);
  auto x = torch::randn({2, 3}, torch::requires_grad());
  auto w = linear->weight;
  auto first_plain = torch::autograd::grad({linear(x).tanh().pow(2).sum()}, {x}, {}, true, true)[0];
  auto expected = torch::autograd::grad({first_plain.pow(2).sum()}, {x, w});
  auto first = torch::autograd::grad(
      {ckpt::checkpoint([&](const torch::Tensor& t) { return linear(t).tanh(); }, x).pow(2).sum()},
      {x}, {}, true, true)[0];
  auto actual = torch::autograd::grad({first.pow(2).sum()}, {x, w});
  EXPECT_TRUE(close(actual[0], expected[0]));
  EXPECT_TRUE(close(actual[1], expected[1]));
}

}  // namespace checkpoint_nested_test

namespace checkpoint_nested_test {

// Issue 46, item 6: regions nested `depth` deep around a tower of Linear layers, one layer per
// level; with gradient buffers kept from step to step (zero_grad(false)), the step's peak above
// what lived before it.
struct NestedTower {
  explicit NestedTower(int levels) {
    torch::manual_seed(2);
    for (int i = 0; i < levels; ++i) layers.emplace_back(512, 512);
  }
  torch::Tensor run(const torch::Tensor& x, size_t level, int depth) {
    if (level == layers.size()) return x;
    const auto body = [this, level, depth](const torch::Tensor& t) {
      return run(torch::tanh(layers[level](t)), level + 1, depth - 1);
    };
    return depth > 0 ? ckpt::checkpoint(body, x) : body(x);
  }
  int64_t step_peak(int depth) {
    for (auto& layer : layers) {
      for (auto& p : layer->parameters()) {
        if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);  // kept buffers
      }
    }
    torch::manual_seed(5);
    const auto x = torch::randn({64, 512});
    ckpt::MemoryTracker tracker(torch::kCPU, ckpt::MemoryScope::CallingThread);
    tracker.reset_peak();
    const int64_t before = tracker.current_bytes();
    run(x, 0, depth).pow(2).sum().backward();
    return tracker.peak_bytes() - before;
  }
  std::vector<torch::nn::Linear> layers;
};

// The tower's peak is mostly gradients (a weight's gradient is 1 MiB, an activation 128 KiB), as
// in the U-Net that found it. Before the fix, three levels and more held every inner weight's
// gradient until the outermost backward ended: 5120008 bytes against 2361352 at one or two. Since
// a region's backward lets go of its output's gradient once read, one level peaks where the plain
// step does (2230280 bytes); two levels and more hold one activation more (2361352).
TEST(NestedCheckpointMemory, DeeperNestingWithKeptGradientBuffersHoldsNoMore) {
  NestedTower plain(6);
  plain.step_peak(0);
  NestedTower unchecked(6);  // a second plain step, as each tower's measured one is its second
  unchecked.step_peak(0);
  const int64_t plain_peak = unchecked.step_peak(0);
  std::vector<int64_t> peaks;
  for (int depth = 1; depth <= 4; ++depth) {
    NestedTower tower(6);
    tower.step_peak(depth);                             // the first step of a call site may differ
    for (size_t i = 0; i < tower.layers.size(); ++i) {  // added early or not: the plain bits
      EXPECT_TRUE(
          ckpt::test::bit_equal(tower.layers[i]->weight.grad(), plain.layers[i]->weight.grad()))
          << "depth " << depth << ", layer " << i;
    }
    peaks.push_back(tower.step_peak(depth));
  }
  EXPECT_EQ(peaks[0], plain_peak);
  EXPECT_LE(peaks[1], plain_peak + plain_peak / 16);
  for (size_t d = 2; d < peaks.size(); ++d) {
    EXPECT_LE(peaks[d], peaks[1] + peaks[1] / 100) << "nested " << d + 1 << " deep";
  }
}

// A region nested in another hands the gradients for the outer region's border (its parameters')
// over itself: as an engine post-hook on its node, that capture made LibTorch keep the node's
// incoming gradient through the inner region's whole recompute and backward.
TEST_F(NestedCheckpointTest, AnInnerRegionLetsGoOfItsOutputsGradientInItsBackward) {
  torch::nn::Linear first(8, 32), second(32, 32);
  const torch::Tensor x = torch::randn({4, 8}).requires_grad_();
  c10::Storage inner_grad;  // the inner region's incoming gradient, as its output's hook saw it
  long holders = -1;
  const auto inner = [&](const torch::Tensor& h) {
    torch::Tensor hidden = at::relu(h);
    if (hidden.requires_grad()) {  // fires after second's backward, inside the inner backward
      hidden.register_hook(
          [&](const torch::Tensor&) { holders = static_cast<long>(inner_grad.use_count()); });
    }
    return second->forward(hidden);
  };
  const auto outer = [&](const torch::Tensor& in) {
    torch::Tensor y = ckpt::checkpoint(inner, first->forward(in));
    if (y.requires_grad())
      y.register_hook([&](const torch::Tensor& g) { inner_grad = g.storage(); });
    return at::gelu(y);
  };
  ckpt::checkpoint(outer, x).sum().backward();
  EXPECT_EQ(holders, 1) << "only this test holds the gradient's memory";
  const auto grads = ckpt::test::take_grads(*second);
  const torch::Tensor input_grad = x.grad().clone();
  x.mutable_grad().reset();
  at::gelu(second->forward(at::relu(first->forward(x)))).sum().backward();
  EXPECT_TRUE(ckpt::test::bit_equal(input_grad, x.grad()));
  const auto plain = ckpt::test::take_grads(*second);
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(ckpt::test::bit_equal(grads[i], plain[i]));
}

}  // namespace checkpoint_nested_test
