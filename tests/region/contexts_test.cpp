// Issue 33, items 3, 4 and 7: contexts of the user's own around a region's forward and recomputes
// (`context_fn`), and the process-wide `debug` switch.

#include <ckpt/ckpt.h>

#include "support/support.h"

#include <memory>
#include <stdexcept>
#include <vector>

namespace contexts_test {

using ckpt::test::bit_equal;

// A context that records, in order, when it is entered and left, and whether the region was
// recomputing at the time.
struct Journal {
  std::vector<std::string> events;
};

struct Entered {
  Entered(Journal& journal, std::string name) : journal(journal), name(std::move(name)) {
    journal.events.push_back("enter " + this->name +
                             (ckpt::is_recomputing() ? " (recomputing)" : ""));
  }
  ~Entered() { journal.events.push_back("leave " + name); }
  Journal& journal;
  std::string name;
};

ckpt::CheckpointOptions journaled(Journal& journal) {
  return ckpt::CheckpointOptions().context_fn([&journal] {
    return ckpt::RegionContexts{
        [&journal] { return std::make_shared<Entered>(journal, "forward"); },
        [&journal] { return std::make_shared<Entered>(journal, "recompute"); }};
  });
}

// The forward runs inside the forward context and each recompute inside the recompute context;
// the function sees them (a flag of the user's here), and the gradients are the plain ones.
TEST(RegionContextsTest, ForwardAndRecomputeRunInTheirContexts) {
  torch::nn::Linear linear(8, 8);
  const auto x = torch::randn({4, 8}, torch::requires_grad());
  Journal journal;
  const auto fn = [&](const at::Tensor& t) {
    journal.events.push_back("function");
    return torch::tanh(linear(t));
  };
  for (const bool reentrant : {false, true}) {
    SCOPED_TRACE(reentrant);
    journal.events.clear();
    auto y = ckpt::checkpoint(journaled(journal).use_reentrant(reentrant), fn, x);
    EXPECT_EQ(journal.events,
              (std::vector<std::string>{"enter forward", "function", "leave forward"}));
    y.sum().backward();
    EXPECT_EQ(journal.events, (std::vector<std::string>{
                                  "enter forward", "function", "leave forward",
                                  "enter recompute (recomputing)", "function", "leave recompute"}));
  }
}

// With a selective policy: the contexts apply, and the gradients equal the plain run's.
TEST(RegionContextsTest, ComposeWithAPolicy) {
  torch::nn::Linear linear(8, 8);
  const auto x = torch::randn({4, 8});
  const auto fn = [&](const at::Tensor& t) { return torch::tanh(linear(t)).sin(); };
  auto plain_x = x.clone().requires_grad_();
  fn(plain_x).sum().backward();
  const auto plain_grad = plain_x.grad().clone(), plain_weight = linear->weight.grad().clone();
  linear->weight.mutable_grad().reset();
  linear->bias.mutable_grad().reset();

  Journal journal;
  auto checked_x = x.clone().requires_grad_();
  ckpt::checkpoint(journaled(journal).policy(ckpt::save_matmuls()), fn, checked_x).sum().backward();
  EXPECT_EQ(journal.events.size(), 4u);
  EXPECT_EQ(journal.events[2], "enter recompute (recomputing)");
  EXPECT_TRUE(bit_equal(checked_x.grad(), plain_grad));
  EXPECT_TRUE(bit_equal(linear->weight.grad(), plain_weight));
}

// A factory, or a context, that throws: the error reaches the caller with grad mode and the RNG as
// they were, and the forward context that was entered is left.
TEST(RegionContextsTest, AThrowingFactoryOrContextLeavesStateAsItWas) {
  const auto x = torch::randn({3}, torch::requires_grad());
  const auto fn = [](const at::Tensor& t) { return torch::dropout(t, 0.5, true); };
  torch::manual_seed(5);
  const auto rng_before = torch::rand({1});
  torch::manual_seed(5);
  auto throwing_factory = ckpt::CheckpointOptions().context_fn(
      []() -> ckpt::RegionContexts { throw std::runtime_error("no context today"); });
  EXPECT_THROW(ckpt::checkpoint(throwing_factory, fn, x), std::runtime_error);
  EXPECT_TRUE(at::GradMode::is_enabled());
  EXPECT_TRUE(bit_equal(torch::rand({1}), rng_before));  // no random number was drawn

  Journal journal;
  auto throwing_recompute = ckpt::CheckpointOptions().context_fn([&journal] {
    return ckpt::RegionContexts{
        [&journal] { return std::make_shared<Entered>(journal, "forward"); },
        []() -> ckpt::RegionContext { throw std::runtime_error("no recompute context"); }};
  });
  auto y = ckpt::checkpoint(throwing_recompute, fn, x);
  EXPECT_EQ(journal.events.back(), "leave forward");
  torch::manual_seed(6);
  const auto expected_next = torch::rand({1});
  torch::manual_seed(6);
  EXPECT_THROW(y.sum().backward(), std::runtime_error);
  EXPECT_TRUE(at::GradMode::is_enabled());
  EXPECT_FALSE(ckpt::is_recomputing());
  EXPECT_TRUE(bit_equal(torch::rand({1}), expected_next));  // the recompute's RNG was put back
}

// A function that runs other operators in its recompute, with the same shapes: with the
// graph-shape check off, only `debug` tells, by naming both sequences.
struct Branching {
  int calls = 0;
  at::Tensor operator()(const at::Tensor& t) {
    auto h = torch::tanh(t);
    return ++calls == 1 ? h.sin() : h.cos();
  }
};

std::string backward_error(const ckpt::CheckpointOptions& options) {
  const auto x = torch::randn({2, 4}, torch::requires_grad());
  auto branching = std::make_shared<Branching>();
  auto y = ckpt::checkpoint(
      options, [branching](const at::Tensor& t) { return (*branching)(t); }, x);
  try {
    y.sum().backward();
  } catch (const c10::Error& error) {
    return error.what_without_backtrace();
  }
  return "";
}

TEST(CheckpointDebugSwitchTest, OverridesEveryRegionWhileSet) {
  const std::string kDebugError = "ran other operators than its forward";
  // Without the graph-shape check, which would catch sin against cos on its own: only debug tells.
  const auto quiet = [] { return ckpt::CheckpointOptions().determinism_check(false); };
  ASSERT_FALSE(ckpt::checkpoint_debug_enabled().has_value());
  EXPECT_EQ(backward_error(quiet()), "");  // without debug nothing tells
  {
    const ckpt::CheckpointDebugGuard on(true);
    EXPECT_EQ(ckpt::checkpoint_debug_enabled(), std::optional<bool>(true));
    EXPECT_NE(backward_error(quiet()).find(kDebugError), std::string::npos);
    {
      const ckpt::CheckpointDebugGuard off(false);
      EXPECT_EQ(backward_error(quiet().debug(true)), "");
    }
    EXPECT_EQ(ckpt::checkpoint_debug_enabled(), std::optional<bool>(true));  // put back
  }
  EXPECT_FALSE(ckpt::checkpoint_debug_enabled().has_value());
  EXPECT_NE(backward_error(quiet().debug(true)).find(kDebugError), std::string::npos);
  ckpt::set_checkpoint_debug_enabled(true);  // process-wide, until set again
  EXPECT_NE(backward_error(quiet()).find(kDebugError), std::string::npos);
  ckpt::set_checkpoint_debug_enabled(std::nullopt);
  EXPECT_EQ(backward_error(quiet()), "");
}

}  // namespace contexts_test
