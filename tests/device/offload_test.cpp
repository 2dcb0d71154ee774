// Offloading to host memory (the device suite): OffloadGuard, offload(true) regions and the
// MustOffload policy give the plain step's gradients to the bit, keep their data in host memory
// between the forward and the backward, wait for their copies, and refuse what they can't do.

#include <ckpt/ckpt.h>
#include <ckpt/offload.h>
#include <ckpt/planned_sequential.h>
#include <ckpt/report.h>

#include "autograd/host_offload.h"
#include "bench_models.h"
#include "compat/torch_compat.h"
#include "device/device_suite.h"
#include "device/kernel_counter.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <optional>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

namespace offload_test {

using ckpt::test::bit_equal;
using ckpt::test::take_grads;

// Linear, GELU, Linear, dropout: what a transformer's MLP keeps, with random numbers in it.
struct MlpImpl : torch::nn::Module {
  explicit MlpImpl(int64_t width = 64)
      : in(register_module("in", torch::nn::Linear(width, 4 * width))),
        out(register_module("out", torch::nn::Linear(4 * width, width))),
        dropout(register_module("dropout", torch::nn::Dropout(0.2))) {}
  at::Tensor forward(const at::Tensor& x) { return x + dropout(out(torch::gelu(in(x)))); }
  torch::nn::Linear in, out;
  torch::nn::Dropout dropout;
};
TORCH_MODULE(Mlp);

// A stage whose inside is larger than its input and output: what offloading moves.
struct WideningImpl : torch::nn::Module {
  WideningImpl()
      : in(register_module("in", torch::nn::Linear(128, 512))),
        out(register_module("out", torch::nn::Linear(512, 128))) {}
  at::Tensor forward(const at::Tensor& x) { return out(torch::gelu(in(x))); }
  torch::nn::Linear in, out;
};
TORCH_MODULE(Widening);

// Two convolutions (their weights saved as they are, leaves), each with a ReLU.
struct ConvPairImpl : torch::nn::Module {
  ConvPairImpl() : first(conv()), second(conv()) {
    register_module("first", first);
    register_module("second", second);
  }
  static torch::nn::Conv2d conv() {
    return torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 32, 3).padding(1).bias(false));
  }
  at::Tensor forward(const at::Tensor& x) { return torch::relu(second(torch::relu(first(x)))); }
  torch::nn::Conv2d first, second;
};
TORCH_MODULE(ConvPair);

using Step = std::function<at::Tensor(const at::Tensor&)>;

void expect_same_bits(const std::vector<at::Tensor>& plain, const std::vector<at::Tensor>& other) {
  ASSERT_EQ(plain.size(), other.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_TRUE(bit_equal(plain[i], other[i])) << "gradient " << i;
  }
}

class OffloadTest : public ckpt::test::DeviceTest {
 protected:
  void SetUp() override {
    DeviceTest::SetUp();
    if (IsSkipped()) return;
    torch::manual_seed(0);
    for (int i = 0; i < 3; ++i) blocks.push_back(Mlp());
    for (auto& block : blocks) block->to(device());
    input = torch::randn({32, 64}, on());
  }

  // Input and parameter gradients of one step of the three blocks, each run by `run`, from the
  // same random state.
  std::vector<at::Tensor> gradients(const std::function<at::Tensor(Mlp&, const at::Tensor&)>& run) {
    seed(7);
    auto x = input.detach().requires_grad_();
    at::Tensor h = x;
    for (auto& block : blocks) h = run(block, h);
    h.pow(2).sum().backward();
    return gradients_after(x);
  }

  // The input's gradient, then every block's parameter gradients (taken).
  std::vector<at::Tensor> gradients_after(const at::Tensor& x) {
    std::vector<at::Tensor> grads{x.grad()};
    for (auto& block : blocks) {
      for (auto& g : take_grads(*block)) grads.push_back(g);
    }
    return grads;
  }

  void expect_same_gradients(const std::function<at::Tensor(Mlp&, const at::Tensor&)>& run) {
    expect_same_bits(gradients([](Mlp& block, const at::Tensor& h) { return block(h); }),
                     gradients(run));
  }

  std::vector<Mlp> blocks;
  at::Tensor input;
};

TEST_P(OffloadTest, GuardGivesThePlainGradientsAndHoldsTheSavedDataInHostMemory) {
  ckpt::reset_offload_peak();
  expect_same_gradients([&](Mlp& block, const at::Tensor& h) {
    ckpt::OffloadGuard guard;
    return block(h);
  });
  // Each block saves its input (read by `in`; the first block's is a leaf that requires grad,
  // kept), in's output (read by GELU) and GELU's output (read by `out`), the dropout mask, and no
  // parameter: all in host memory at the forward's end.
  // Dropout's mask: float on the CPU kernel the emulated device runs, bool on CUDA.
  const auto probe =
      at::native_dropout(torch::ones({1}, torch::TensorOptions().device(device())), 0.5, true);
  const int64_t mask = 32 * 64 * static_cast<int64_t>(std::get<1>(probe).element_size());
  EXPECT_GE(ckpt::offload_stats().peak_host_bytes,
            2 * 32 * 64 * 4 + 3 * (32 * (256 + 256) * 4 + mask));
  EXPECT_EQ(ckpt::offload_stats().host_bytes, 0) << "the backward used every copy up";
}

// Issue 45, item 12: a backward inside the guard's own scope, as Python's save_on_cpu allows (it
// raised an internal assert: "offloaded data fetched before its forward ended").
TEST_P(OffloadTest, BackwardInsideTheGuardsScopeGivesThePlainGradients) {
  const auto plain = gradients([](Mlp& block, const at::Tensor& h) { return block(h); });
  seed(7);
  auto x = input.detach().requires_grad_();
  {
    ckpt::OffloadGuard guard;
    at::Tensor h = x;
    for (auto& block : blocks) h = block(h);
    h.pow(2).sum().backward();
  }
  expect_same_bits(plain, gradients_after(x));
  EXPECT_EQ(ckpt::offload_stats().host_bytes, 0);
}

// Issue 45, item 7: one storage twice among an offloaded region's arguments and results, saved
// inside (it failed: "Cannot report itemsize of Tensor that doesn't have initialized dtype").
TEST_P(OffloadTest, OneStorageTwiceAmongArgumentsAndResults) {
  torch::nn::Linear lin(64, 64);
  lin->to(device());
  const auto offload = ckpt::CheckpointOptions().offload(true);
  auto twice = [&](const at::Tensor& a, const at::Tensor& b) { return lin(a) * b.sin(); };
  auto view_and_result = [&](const at::Tensor& t) { return std::make_tuple(t.view(-1), lin(t)); };
  auto gradients_of = [&](bool offloaded) {
    const at::Tensor h = input.detach().requires_grad_();
    const at::Tensor u = (h * 2).sin();
    at::Tensor loss;
    if (offloaded) {
      loss = ckpt::checkpoint(offload, twice, u, u).sum() +
             ckpt::checkpoint(offload, twice, u.t().t(), u).pow(2).sum();
      const auto [view, result] = ckpt::checkpoint(offload, view_and_result, u);
      loss = loss + view.pow(2).sum() + result.sum();
    } else {
      loss = twice(u, u).sum() + twice(u.t().t(), u).pow(2).sum();
      const auto [view, result] = view_and_result(u);
      loss = loss + view.pow(2).sum() + result.sum();
    }
    loss.backward();
    std::vector<at::Tensor> grads{h.grad()};
    for (auto& g : take_grads(*lin)) grads.push_back(g);
    return grads;
  };
  expect_same_bits(gradients_of(false), gradients_of(true));
  EXPECT_EQ(ckpt::offload_stats().host_bytes, 0);
}

// Issue 45, item 10: a saved conjugate or negative view comes back with its bit (the stored view
// kept sizes, strides and offset only, so the gradient came out of the unconjugated values).
TEST_P(OffloadTest, ConjugateAndNegativeViewsComeBackAsTheyWereSaved) {
  const auto a0 = torch::randn({4, 5}, on().dtype(torch::kComplexFloat));
  const auto b0 = torch::randn({4, 5}, on().dtype(torch::kComplexFloat));
  const auto r0 = torch::randn({4, 5}, on());
  const auto step = [&](bool offloaded) {
    auto a = a0.detach().requires_grad_(), b = b0.detach().requires_grad_();
    auto r = r0.detach().requires_grad_();
    std::optional<ckpt::OffloadGuard> guard;
    if (offloaded) guard.emplace();
    // mul saves each factor for the other's gradient: a conjugate view, a negative view, each of
    // data made here (a leaf's or data held elsewhere would stay on the device).
    const auto a2 = a * 2, b2 = b * 2;
    auto loss =
        (a2 * b2.conj()).abs().sum() + (r * torch::_neg_view((r * 2).detach())).pow(2).sum();
    guard.reset();
    // a2, b2's conjugate, their product (read by abs) and the negative view.
    if (offloaded) {
      EXPECT_GE(ckpt::offload_stats().host_bytes, 3 * 4 * 5 * 8 + 4 * 5 * 4);
    }
    loss.backward();
    return std::vector<at::Tensor>{a.grad(), b.grad(), r.grad()};
  };
  expect_same_bits(step(false), step(true));
}

// Issue 45, item 8: a frozen parameter (a LoRA backbone's) and the caller's batch, saved in an
// offloaded scope, stay on the device: they were copied to the host and back, and the backward
// held them twice (8 MiB of frozen weights took a step's device peak from 385 KiB to 8513 KiB).
// What requires no grad and was made and let go of inside (a dropout mask) still goes.
TEST_P(OffloadTest, FrozenParametersAndTheBatchStayOnTheDevice) {
  CKPT_SKIP_IF(missing_memory_statistics());
  torch::nn::Linear adapter(256, 256), backbone(256, 256);
  adapter->to(device());
  backbone->to(device());
  for (auto& p : backbone->parameters()) p.requires_grad_(false);
  const at::Tensor batch = torch::randn({8, 256}, on());
  ckpt::MemoryTracker tracker(device());
  int64_t held = 0;
  auto step = [&](bool offloaded) {
    seed(5);
    tracker.reset_peak();
    const int64_t before = tracker.current_bytes();
    at::Tensor loss;
    {
      std::optional<ckpt::OffloadGuard> guard;
      if (offloaded) guard.emplace();
      // The adapter saves the batch; the backbone its weight (for the input's gradient).
      loss = backbone(torch::dropout(torch::relu(adapter(batch)), 0.5, true)).pow(2).sum();
    }
    if (offloaded) held = ckpt::offload_stats().host_bytes;
    loss.backward();
    loss = at::Tensor();
    const int64_t peak = tracker.peak_bytes() - before;
    std::vector<at::Tensor> grads = take_grads(*adapter);
    EXPECT_FALSE(backbone->weight.grad().defined());
    return std::make_pair(grads, peak);
  };
  const auto [plain, plain_peak] = step(false);
  const auto [offloaded, offloaded_peak] = step(true);
  expect_same_bits(plain, offloaded);
  const int64_t activation = 8 * 256 * 4;
  // The ReLU's output, the dropout's mask (floats here, bytes on CUDA) and the backbone's output
  // (read by pow): not the batch, nor the 256 KiB weight.
  EXPECT_GT(held, 2 * activation);
  EXPECT_LE(held, 3 * activation);
  EXPECT_LE(offloaded_peak, plain_peak) << "a saved frozen weight came back as a second copy";
}

TEST_P(OffloadTest, OffloadedRegionGivesThePlainGradients) {
  expect_same_gradients([](Mlp& block, const at::Tensor& h) {
    return ckpt::checkpoint(ckpt::CheckpointOptions().offload(true), block, h);
  });
  EXPECT_EQ(ckpt::offload_stats().host_bytes, 0);
}

TEST_P(OffloadTest, MustOffloadPolicyGivesThePlainGradientsWithoutRunningTheKernelAgain) {
  CKPT_SKIP_IF(missing_rng());  // the recompute replays the dropout masks
  const auto policy = ckpt::SelectivePolicy([](const ckpt::OpCall& call) {
    return call.name() == "aten::addmm" ? ckpt::CheckpointPolicy::MustOffload
                                        : ckpt::CheckpointPolicy::PreferRecompute;
  });
  const auto options = ckpt::CheckpointOptions().policy(policy);
  expect_same_gradients(
      [&](Mlp& block, const at::Tensor& h) { return ckpt::checkpoint(options, block, h); });
  if (!ckpt::test::KernelCounter::available(type())) GTEST_SKIP() << "no kernel counters here";
  ckpt::test::KernelCounter counter(type(), {"aten::addmm"});
  auto x = input.detach().requires_grad_();
  const auto y = ckpt::checkpoint(options, blocks[0], x);
  const int64_t forward = counter.calls();
  EXPECT_GT(ckpt::offload_stats().host_bytes, 0);
  y.sum().backward();
  EXPECT_EQ(counter.calls(), forward) << "the recompute ran an offloaded product again";
  EXPECT_EQ(ckpt::offload_stats().host_bytes, 0);
}

const ckpt::KeptEntry* find_entry(const ckpt::RegionReport& region, const std::string& what) {
  for (const auto& entry : region.entries) {
    if (entry.what == what) return &entry;
  }
  return nullptr;
}

// Issue 45, item 13: a kept report lists offloaded regions and what a policy offloads (the first
// was missing, the second's outputs unlisted), each by the operator that made it, with the host
// memory it holds; its kept total is what the device holds after the forward, its offloaded
// total what offloading holds in host memory.
TEST_P(OffloadTest, AReportListsWhatOffloadedRegionsAndPoliciesMove) {
  CKPT_SKIP_IF(missing_memory_statistics());
  Widening first, second;
  first->to(device());
  second->to(device());
  const auto offload_products = ckpt::SelectivePolicy([](const ckpt::OpCall& call) {
    return call.name() == "aten::addmm" ? ckpt::CheckpointPolicy::MustOffload
                                        : ckpt::CheckpointPolicy::PreferRecompute;
  });
  const auto x = torch::randn({32, 128}, on().requires_grad(true));
  ckpt::MemoryTracker tracker(device());
  const int64_t before = tracker.current_bytes();
  ckpt::KeptReport report;
  at::Tensor z;
  {
    const ckpt::MemoryLabel label("step");
    const ckpt::ReportScope scope(report);
    const at::Tensor y = ckpt::checkpoint(ckpt::CheckpointOptions().offload(true), first, x);
    z = ckpt::checkpoint(ckpt::CheckpointOptions().policy(offload_products), second, y);
  }
  ASSERT_EQ(report.regions().size(), 2u) << report.text();
  const ckpt::RegionReport& offloaded = report.regions()[0];
  const ckpt::RegionReport& selective = report.regions()[1];
  EXPECT_EQ(offloaded.name, "step/region 1");
  EXPECT_EQ(offloaded.mode, "offloaded");
  EXPECT_EQ(selective.name, "step/region 2");
  // The first region's GELU reads in's product, `out` reads the GELU's output (its argument is a
  // leaf that requires grad: kept where it is, not listed).
  for (const char* what : {"aten::addmm", "aten::gelu"}) {
    const ckpt::KeptEntry* entry = find_entry(offloaded, what);
    ASSERT_NE(entry, nullptr) << what << "\n" << report.text();
    EXPECT_EQ(entry->decision, ckpt::KeptDecision::Offloaded);
    EXPECT_EQ(entry->shape, (std::vector<int64_t>{32, 512}));
    EXPECT_EQ(entry->counted_bytes, 32 * 512 * 4);
  }
  EXPECT_EQ(offloaded.offloaded_bytes, 2 * 32 * 512 * 4);
  EXPECT_EQ(offloaded.kept_bytes, 0);
  // The second region's products, in host memory; its argument on the device.
  int64_t products = 0;
  for (const auto& entry : selective.entries) {
    if (entry.what != "aten::addmm") continue;
    EXPECT_EQ(entry.decision, ckpt::KeptDecision::Offloaded);
    EXPECT_EQ(entry.why, "the policy offloads it (MustOffload)");
    products += entry.counted_bytes;
  }
  EXPECT_EQ(products, 32 * (512 + 128) * 4);
  EXPECT_EQ(selective.offloaded_bytes, products);
  ASSERT_NE(find_entry(selective, "argument #0"), nullptr);
  EXPECT_EQ(report.offloaded_bytes(), ckpt::offload_stats().host_bytes);
  int64_t kept_on_device = 0;  // the RNG state the selective region stashed is host memory
  for (const auto& region : report.regions()) {
    for (const auto& entry : region.entries) {
      if (entry.decision == ckpt::KeptDecision::Kept && !entry.device.is_cpu())
        kept_on_device += entry.counted_bytes;
    }
  }
  EXPECT_EQ(kept_on_device,
            tracker.current_bytes() - before - static_cast<int64_t>(z.storage().nbytes()));
  EXPECT_NE(report.text().find("step/region 1 (offloaded): kept 0 B, offloaded 128.0 KiB"),
            std::string::npos)
      << report.text();
  z.sum().backward();
  EXPECT_EQ(ckpt::offload_stats().host_bytes, 0);
}

TEST_P(OffloadTest, OffloadedDataLeavesTheDevice) {
  CKPT_SKIP_IF(missing_memory_statistics());
  ckpt::MemoryTracker tracker(device());
  auto kept_after_forward = [&](const Step& run) {
    const int64_t before = tracker.current_bytes();
    const at::Tensor y = run(input.detach().requires_grad_());
    return tracker.current_bytes() - before;
  };
  auto& block = blocks[0];
  const int64_t plain = kept_after_forward([&](const at::Tensor& x) { return block(x); });
  const int64_t offloaded = kept_after_forward([&](const at::Tensor& x) {
    return ckpt::checkpoint(ckpt::CheckpointOptions().offload(true), block, x);
  });
  const int64_t output = 32 * 64 * 4;
  EXPECT_GE(plain, 32 * (256 + 256) * 4 + output);
  EXPECT_EQ(offloaded, output) << "the output alone stays on the device";
}

// The backward's copies back run on the side stream: held there, a use that did not wait for its
// copy would read the device memory before the copy wrote it, and the gradients would differ.
TEST_P(OffloadTest, BackwardWaitsForEachCopyBack) {
  if (type() != c10::DeviceType::PrivateUse1) GTEST_SKIP() << "streams are held on emulated only";
  auto& block = blocks[0];
  auto step = [&](bool hold) {
    seed(3);
    auto x = input.detach().requires_grad_();
    at::Tensor y;
    {
      ckpt::OffloadGuard guard;
      y = block(x);
    }
    std::unique_ptr<ckpt::emulated_device::StreamHold> held;
    if (hold)
      held.reset(new ckpt::emulated_device::StreamHold(ckpt::detail::offload_stream(device())));
    std::thread release([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      held.reset();
    });
    y.pow(2).sum().backward();
    release.join();
    std::vector<at::Tensor> grads{x.grad()};
    for (auto& g : take_grads(*block)) grads.push_back(g);
    return grads;
  };
  const auto free_running = step(false);
  const auto held = step(true);
  for (size_t i = 0; i < held.size(); ++i) EXPECT_TRUE(bit_equal(free_running[i], held[i])) << i;
}

// Three offloaded regions, each with a hook on its output that records the device bytes brought
// back ahead: the hooks fire between the backward of the region after and that of the region
// itself (third, second, first). With the look-ahead, the next region's data has started coming
// back by then (the test fails if the prefetch is issued only when that region's own backward
// starts); without, nothing comes back ahead. The gradients are the plain step's either way.
TEST_P(OffloadTest, LookAheadBringsTheNextRegionBackBeforeItsBackward) {
  std::vector<std::vector<int64_t>> ahead;
  for (const auto& options : {ckpt::OffloadOptions().look_ahead(0), ckpt::OffloadOptions(),
                              ckpt::OffloadOptions().look_ahead(2),
                              ckpt::OffloadOptions().look_ahead(2).max_ahead_bytes(-1)}) {
    const auto offloaded = ckpt::CheckpointOptions().offload(true).offload_options(options);
    std::vector<int64_t> seen;
    expect_same_gradients([&](Mlp& block, const at::Tensor& h) {
      at::Tensor y = ckpt::checkpoint(offloaded, block, h);
      y.register_hook(
          [&seen](const at::Tensor&) { seen.push_back(ckpt::offload_stats().ahead_device_bytes); });
      return y;
    });
    EXPECT_EQ(ckpt::offload_stats().ahead_device_bytes, 0) << "every region's backward ran";
    EXPECT_EQ(ckpt::offload_stats().host_bytes, 0);
    ASSERT_EQ(seen.size(), 3u);
    ahead.push_back(seen);
  }
  EXPECT_EQ(ahead[0], (std::vector<int64_t>{0, 0, 0})) << "look_ahead(0)";
  const std::vector<int64_t>& one = ahead[1];
  EXPECT_EQ(one[0], 0) << "before the first backward, nothing";
  EXPECT_GT(one[1], 0) << "the second region's data, during the third's backward";
  EXPECT_GT(one[2], 0) << "the first region's, during the second's";
  // Whole regions at once (max_ahead_bytes(-1)), two ahead: the second and first regions' data
  // (the same size) during the third's backward, the first's during the second's.
  const std::vector<int64_t>& whole = ahead[3];
  EXPECT_GT(whole[2], 0);
  EXPECT_EQ(whole[1], 2 * whole[2]) << "look_ahead(2).max_ahead_bytes(-1)";
  // Paced, one or two ahead: never more than the room the backward before let go of, one region.
  EXPECT_LE(one[1], whole[2]);
  EXPECT_LE(ahead[2][1], whole[2]) << "look_ahead(2)";
}

// keep_last: the newest region keeps its data on the device until a newer one's forward ends, so
// after the forward the last region's data is still there, and the backward copies nothing back
// for it; the others went to host memory. Gradients as the plain step's.
TEST_P(OffloadTest, KeepLastKeepsTheNewestRegionsDataOnTheDevice) {
  CKPT_SKIP_IF(missing_memory_statistics());
  ckpt::MemoryTracker tracker(device());
  const auto after_forward = [&](int keep_last) {
    const auto options = ckpt::CheckpointOptions().offload(true).offload_options(
        ckpt::OffloadOptions().look_ahead(0).keep_last(keep_last));
    seed(7);
    const int64_t before = tracker.current_bytes();
    auto x = input.detach().requires_grad_();
    at::Tensor h = x;
    for (auto& block : blocks) h = ckpt::checkpoint(options, block, h);
    const int64_t kept = tracker.current_bytes() - before;
    h.pow(2).sum().backward();
    for (auto& block : blocks) take_grads(*block);
    return kept;
  };
  const int64_t none = after_forward(0), last = after_forward(1), two = after_forward(2);
  // One block's inside: in's output and GELU's output (and the dropout mask).
  const int64_t block_data = 32 * (256 + 256) * 4;
  EXPECT_GE(last - none, block_data);
  EXPECT_GE(two - last, block_data);
  expect_same_gradients([](Mlp& block, const at::Tensor& h) {
    return ckpt::checkpoint(ckpt::CheckpointOptions().offload(true).offload_options(
                                ckpt::OffloadOptions().keep_last(2)),
                            block, h);
  });
  EXPECT_EQ(ckpt::offload_stats().host_bytes, 0);
}

// min_bytes: data below it stays on the device, and nothing moves when all of it is below.
TEST_P(OffloadTest, MinBytesKeepsSmallDataOnTheDevice) {
  ckpt::reset_offload_peak();
  expect_same_gradients([](Mlp& block, const at::Tensor& h) {
    ckpt::OffloadGuard guard(ckpt::OffloadOptions().min_bytes(int64_t{1} << 30));
    const at::Tensor y = block(h);
    EXPECT_EQ(guard.host_bytes(), 0);
    return y;
  });
  EXPECT_EQ(ckpt::offload_stats().peak_host_bytes, 0);
  // 32 x 256 floats move, 32 x 64 (the mask, the blocks' inputs) stay.
  expect_same_gradients([](Mlp& block, const at::Tensor& h) {
    ckpt::OffloadGuard guard(ckpt::OffloadOptions().min_bytes(32 * 256 * 4));
    const at::Tensor y = block(h);
    EXPECT_EQ(guard.host_bytes(), 2 * 32 * 256 * 4);
    return y;
  });
}

// The host buffers of one step serve the next: the pool keeps them, a second step takes its
// buffers from it, and empty_offload_pool frees them.
TEST_P(OffloadTest, HostBuffersComeFromThePoolInTheNextStep) {
  ckpt::empty_offload_pool();
  const auto step = [&] {
    expect_same_gradients([](Mlp& block, const at::Tensor& h) {
      return ckpt::checkpoint(ckpt::CheckpointOptions().offload(true), block, h);
    });
  };
  step();
  const int64_t pooled = ckpt::offload_stats().pooled_host_bytes;
  EXPECT_GT(pooled, 0);
  EXPECT_LE(pooled, ckpt::offload_stats().peak_host_bytes);
  step();
  EXPECT_EQ(ckpt::offload_stats().pooled_host_bytes, pooled) << "taken and given back";
  ckpt::empty_offload_pool();
  EXPECT_EQ(ckpt::offload_stats().pooled_host_bytes, 0);
}

// Pinned memory that can't be had (here: no CUDA to pin with) falls back to pageable memory with a
// warning; the step gives the plain gradients.
TEST_P(OffloadTest, PinnedMemoryThatFailsFallsBackToPageableMemory) {
  if (type() == c10::DeviceType::CUDA) GTEST_SKIP() << "pinning works on CUDA";
  ckpt::detail::pin_every_device_for_testing(true);
  ckpt::empty_offload_pool();
  expect_same_gradients([](Mlp& block, const at::Tensor& h) {
    ckpt::OffloadGuard guard;
    const at::Tensor y = block(h);
    EXPECT_GT(guard.host_bytes(), 0);
    return y;
  });
  ckpt::detail::pin_every_device_for_testing(false);
  ckpt::empty_offload_pool();
}

TEST_P(OffloadTest, BadOffloadOptionsAreClearErrors) {
  auto x = input.detach().requires_grad_();
  CKPT_EXPECT_THROWS_WITH(ckpt::OffloadGuard(ckpt::OffloadOptions().look_ahead(-1)),
                          "look_ahead, keep_last and min_bytes must be >= 0, but got -1");
  CKPT_EXPECT_THROWS_WITH(
      ckpt::checkpoint(ckpt::CheckpointOptions().offload(true).offload_options(
                           ckpt::OffloadOptions().max_ahead_bytes(-2)),
                       blocks[0], x),
      "max_ahead_bytes must be >= 0 bytes, or -1 for whole scopes at once, but got -2");
}

// Autograd lets go of what a node saved when the node goes: inside the scope, that may happen
// before the scope's end, and the same data may be saved again after.
TEST_P(OffloadTest, DataSavedThenLetGoOfInsideTheScope) {
  auto x = input.detach().requires_grad_();
  at::Tensor y, h;
  {
    ckpt::OffloadGuard guard;
    h = x * 2;
    { const auto dropped = h.cos() + (x * 3).sin(); }  // saves h and x * 3, then lets them go
    y = h.sin();                                       // saves h again
  }
  y.sum().backward();
  EXPECT_TRUE(bit_equal(x.grad(), 2 * (x * 2).cos()));
  EXPECT_EQ(ckpt::offload_stats().host_bytes, 0);
}

TEST_P(OffloadTest, InPlaceChangeAfterTheForwardIsAnError) {
  auto x = input.detach().requires_grad_();
  at::Tensor h, y;
  {
    ckpt::OffloadGuard guard;
    h = x * 2;
    y = h.sin();  // saves h
  }
  h.detach().add_(1);
  CKPT_EXPECT_THROWS_WITH(y.sum().backward(), "modified by an inplace operation after ckpt");
}

TEST_P(OffloadTest, CheckpointedRegionInsideAGuardKeepsItsGraphOutOfIt) {
  CKPT_SKIP_IF(missing_rng());  // the recompute replays the dropout masks
  expect_same_gradients([](Mlp& block, const at::Tensor& h) {
    ckpt::OffloadGuard guard;
    const at::Tensor y = ckpt::checkpoint(block, h);
    EXPECT_EQ(guard.host_bytes(), 0) << "the region's node holds its argument itself";
    return y;
  });
}

TEST_P(OffloadTest, BadOptionsAreClearErrors) {
  auto x = input.detach().requires_grad_();
  CKPT_EXPECT_THROWS_WITH(
      ckpt::checkpoint(ckpt::CheckpointOptions().offload(true).use_reentrant(true), blocks[0], x),
      "Drop use_reentrant(true), or offload(true)");
  CKPT_EXPECT_THROWS_WITH(
      ckpt::checkpoint(ckpt::CheckpointOptions().offload(true).policy(ckpt::save_matmuls()),
                       blocks[0], x),
      "return MustOffload for them from the policy");
  CKPT_EXPECT_THROWS_WITH(ckpt::save_and_offload_names({"a", "b"}, {"b"}),
                          "\"b\" is both saved and offloaded");
  const auto must_offload_view = ckpt::SelectivePolicy([](const ckpt::OpCall& call) {
    return call.name() == "aten::view" ? ckpt::CheckpointPolicy::MustOffload
                                       : ckpt::CheckpointPolicy::PreferRecompute;
  });
  CKPT_EXPECT_THROWS_WITH(ckpt::checkpoint(
                              ckpt::CheckpointOptions().policy(must_offload_view),
                              [](const at::Tensor& t) { return t.view({-1}) * 2; }, x),
                          "says MustOffload for aten::view");
}

// A planned chain that may keep, recompute or offload each stage, with a host budget that holds
// only some stages' offloaded data: the plan mixes offloading with recomputing, its measured
// device peak is the prediction within 2% and within the budget, host memory stays within its
// budget, and the gradients are the plain chain's.
TEST_P(OffloadTest, PlannedChainMixesOffloadingWithRecomputingAtThePredictedPeak) {
  CKPT_SKIP_IF(missing_memory_statistics());
  torch::nn::Sequential chain;
  for (int i = 0; i < 8; ++i) {
    chain->push_back(Widening());
  }
  chain->to(device());
  for (auto& p : chain->parameters()) p.mutable_grad() = torch::zeros_like(p);
  const auto x = torch::randn({64, 128}, on()).requires_grad_();
  const auto target = torch::randn({64, 128}, on());
  const int64_t stage_offload = 2 * 64 * 512 * 4;  // GELU's input and output
  const auto options =
      ckpt::PlannedSequentialOptions()
          .count_parameter_gradients(false)
          .storage_modes(ckpt::StorageModes::standard().remove("selective").remove("checkpointed"))
          .host_budget_bytes(3 * stage_offload);
  ckpt::PlannedSequential planned(chain, ckpt::Budget::parse("50%"), options);
  planned->plan(x);
  int offloaded = 0, recomputed = 0;
  for (const auto& op : planned->schedule().ops) {
    if (op.kind == ckpt::plan::OpKind::ForwardNone || op.kind == ckpt::plan::OpKind::ForwardInput)
      ++recomputed;  // the schedule runs the stage again later
    if (op.kind != ckpt::plan::OpKind::ForwardAll || op.option == 0) continue;
    const auto option = planned->profile().stages[op.stage].option(op.option);
    ++(option.offloaded_bytes > 0 ? offloaded : recomputed);  // a checkpointed region recomputes
  }
  EXPECT_GT(offloaded, 0) << ckpt::plan::to_string(planned->schedule());
  EXPECT_GT(recomputed, 0) << ckpt::plan::to_string(planned->schedule());
  EXPECT_LE(planned->prediction().host_peak_bytes, 3 * stage_offload);

  const auto plain_grads = [&] {
    x.mutable_grad().reset();
    (chain->forward(x) * target).sum().backward();
    std::vector<at::Tensor> grads{x.grad()};
    for (auto& p : chain->parameters()) grads.push_back(p.grad().clone());
    return grads;
  };
  for (auto& p : chain->parameters()) p.mutable_grad().zero_();
  const auto plain = plain_grads();
  for (auto& p : chain->parameters()) p.mutable_grad().zero_();
  x.mutable_grad().reset();
  ckpt::reset_offload_peak();
  ckpt::test::expect_step_peak_as_predicted(planned, x, target);
  EXPECT_LE(ckpt::offload_stats().peak_host_bytes, 3 * stage_offload);
  std::vector<at::Tensor> grads{x.grad()};
  for (auto& p : chain->parameters()) grads.push_back(p.grad());
  ASSERT_EQ(grads.size(), plain.size());
  for (size_t i = 0; i < grads.size(); ++i) EXPECT_TRUE(bit_equal(grads[i], plain[i])) << i;
}

// An offloaded stage copies its output too as its forward saves it, and lets go of that copy when
// the forward ends (the output stays on the device): its forward holds more host memory than it
// leaves held. The profiler counts the most it held, so every plan of the small ResNet, from the
// smallest budget to the plain peak, holds at most the host memory predicted (counting what the
// forward left held, each of these four held up to a third more: 40,992 bytes against 32,864).
TEST_P(OffloadTest, PlannedChainHoldsNoMoreHostMemoryThanPredicted) {
  CKPT_SKIP_IF(missing_memory_statistics());
  const ckpt::models::ModelConfig config = ckpt::models::model_config("resnet", true);
  torch::nn::Sequential chain = ckpt::models::build_model(config);
  chain->to(device());
  const at::Tensor x = ckpt::models::make_input(config).to(device());
  ckpt::PlannedSequential smallest(chain, ckpt::Budget::minimum());
  smallest->plan(x);
  const int64_t low = smallest->budget_bytes(), high = smallest->no_checkpoint_peak_bytes();
  int offloading = 0;
  for (int quarter = 0; quarter < 4; ++quarter) {
    SCOPED_TRACE(quarter);
    ckpt::PlannedSequential planned(chain, ckpt::Budget::bytes(low + (high - low) * quarter / 4));
    planned->plan(x);
    offloading += planned->prediction().host_peak_bytes > 0;
    ckpt::reset_offload_peak();
    planned(x).square().mean().backward();
    EXPECT_LE(ckpt::offload_stats().peak_host_bytes, planned->prediction().host_peak_bytes)
        << ckpt::plan::to_string(planned->schedule());
  }
  EXPECT_GE(offloading, 2) << "few plans offload: the test checks little";
}

// With host memory to spare, the plan offloads and brings stages back one backward early where
// that raises no peak (Schedule::look_ahead): the runner does so (the data is back ahead at the
// end of the backward before), the measured peak is the prediction within 2%, and the gradients
// are the plain chain's.
TEST_P(OffloadTest, PlannedChainLooksAheadWithinThePredictedPeak) {
  CKPT_SKIP_IF(missing_memory_statistics());
  torch::nn::Sequential chain;
  for (int i = 0; i < 8; ++i) chain->push_back(Widening());
  chain->to(device());
  for (auto& p : chain->parameters()) p.mutable_grad() = torch::zeros_like(p);
  const auto x = torch::randn({64, 128}, on()).requires_grad_();
  const auto target = torch::randn({64, 128}, on());
  const auto options =
      ckpt::PlannedSequentialOptions().count_parameter_gradients(false).storage_modes(
          ckpt::StorageModes::standard().remove("selective").remove("checkpointed"));
  ckpt::PlannedSequential planned(chain, ckpt::Budget::parse("50%"), options);
  planned->plan(x);
  const auto& look_ahead = planned->schedule().look_ahead;
  ASSERT_FALSE(look_ahead.empty()) << ckpt::plan::to_string(planned->schedule());

  struct AheadAtEnd : ckpt::ExecutionObserver {
    void on_op_end(const ckpt::plan::Op& op) override {
      if (op.kind == ckpt::plan::OpKind::Backward)
        ahead.emplace_back(op.stage, ckpt::offload_stats().ahead_device_bytes);
    }
    std::vector<std::pair<int, int64_t>> ahead;
  };
  const auto observer = std::make_shared<AheadAtEnd>();
  planned->set_observer(observer);
  const auto plain_grads = [&] {
    (chain->forward(x) * target).sum().backward();
    std::vector<at::Tensor> grads{x.grad().clone()};
    for (auto& p : chain->parameters()) grads.push_back(p.grad().clone());
    return grads;
  };
  const auto plain = plain_grads();
  for (auto& p : chain->parameters()) p.mutable_grad().zero_();
  x.mutable_grad().reset();
  ckpt::test::expect_step_peak_as_predicted(planned, x, target);
  for (const auto& [stage, bytes] : observer->ahead) {
    const bool ahead = std::binary_search(look_ahead.begin(), look_ahead.end(), stage - 1);
    EXPECT_EQ(bytes > 0, ahead) << "after B" << stage;
  }
  std::vector<at::Tensor> grads{x.grad()};
  for (auto& p : chain->parameters()) grads.push_back(p.grad());
  expect_same_bits(plain, grads);
}

// A convolution saves its weight itself (Linear saves a transposed view of it), and under
// saved-tensor hooks LibTorch 2's saved variable of a leaf holds the leaf's gradient accumulator.
// The chain took that for another use of the weight and held each offloaded stage's weight
// gradient to the end of the backward instead of adding it to .grad at once: the step peaked
// above its prediction and its budget (3.1 MiB over 16 MiB on the bench ResNet).
TEST_P(OffloadTest, OffloadedConvolutionsAddTheirWeightGradientsAtOnce) {
  CKPT_SKIP_IF(missing_memory_statistics());
  torch::nn::Sequential chain;
  for (int i = 0; i < 6; ++i) {
    chain->push_back(ConvPair());
  }
  chain->to(device());
  for (auto& p : chain->parameters()) p.mutable_grad() = torch::zeros_like(p);
  const auto x = torch::randn({2, 32, 8, 8}, on()).requires_grad_();
  const auto target = torch::randn({2, 32, 8, 8}, on());
  const auto options =
      ckpt::PlannedSequentialOptions().count_parameter_gradients(false).storage_modes(
          ckpt::StorageModes::standard().remove("selective").remove("checkpointed"));
  ckpt::PlannedSequential planned(chain, ckpt::Budget::parse("60%"), options);
  planned->plan(x);
  int offloaded = 0;
  for (const auto& op : planned->schedule().ops) {
    offloaded += op.kind == ckpt::plan::OpKind::ForwardAll && op.option > 0;
  }
  ASSERT_GE(offloaded, 3) << ckpt::plan::to_string(planned->schedule());
  x.mutable_grad().reset();
  ckpt::test::expect_step_peak_as_predicted(planned, x, target);
}

// Hostile cases of the look-ahead (on by default): what a user may write beside it.

// Offloaded regions inside an offloaded region: the inner groups join the chain before the outer,
// whose backward then brings them back ahead of their own. The plain gradients, every option.
TEST_P(OffloadTest, NestedOffloadedRegionsLookAheadToThePlainGradients) {
  const auto whole = ckpt::OffloadOptions().look_ahead(2).max_ahead_bytes(-1);
  for (const auto& options : {ckpt::OffloadOptions(), whole, ckpt::OffloadOptions().keep_last(1)}) {
    const auto offloaded = ckpt::CheckpointOptions().offload(true).offload_options(options);
    const auto run = [&](bool offload) {
      const auto nested = [&](const at::Tensor& h) {
        at::Tensor inner = h;
        for (auto& block : blocks) {
          inner = offload ? ckpt::checkpoint(offloaded, block, inner) : block(inner);
        }
        return inner.tanh();
      };
      seed(7);
      auto x = input.detach().requires_grad_();
      const at::Tensor y = offload ? ckpt::checkpoint(offloaded, nested, x) : nested(x);
      y.pow(2).sum().backward();
      return gradients_after(x);
    };
    expect_same_bits(run(false), run(true));
    EXPECT_EQ(ckpt::offload_stats().host_bytes, 0);
    EXPECT_EQ(ckpt::offload_stats().ahead_device_bytes, 0);
  }
}

// A region whose backward never runs, after one whose backward runs: the look-ahead of the one
// that runs brings the other's data back, and letting go of its graph lets go of that data too,
// on the device and in host memory.
TEST_P(OffloadTest, DataBroughtBackAheadForABackwardThatNeverRunsIsLetGoOf) {
  CKPT_SKIP_IF(missing_memory_statistics());
  ckpt::MemoryTracker tracker(device());
  const auto offloaded = ckpt::CheckpointOptions().offload(true).offload_options(
      ckpt::OffloadOptions().max_ahead_bytes(-1));
  const int64_t before = tracker.current_bytes();
  {
    auto x = input.detach().requires_grad_();
    at::Tensor never = ckpt::checkpoint(offloaded, blocks[0], x);     // its backward never runs
    at::Tensor runs = ckpt::checkpoint(offloaded, blocks[1], x * 2);  // joins the chain after
    runs.pow(2).sum().backward();
    EXPECT_GT(ckpt::offload_stats().ahead_device_bytes, 0) << "brought back for nothing";
    for (auto& block : blocks) take_grads(*block);
  }
  // A copy still in flight holds its tensors until it is done (a loaded machine saw 72 KiB).
  ckpt::compat::synchronize_device(device());
  EXPECT_EQ(ckpt::offload_stats().ahead_device_bytes, 0);
  EXPECT_EQ(ckpt::offload_stats().host_bytes, 0);
  EXPECT_EQ(tracker.current_bytes(), before) << "device memory left behind";
}

// Backwards in another order than the forwards: the second branch's backward runs first, the
// first's later, each with the plain gradients, and nothing is held when both are done.
TEST_P(OffloadTest, BackwardsInAnotherOrderThanTheForwardsGiveThePlainGradients) {
  const auto run = [&](bool offload) {
    const auto options = ckpt::CheckpointOptions().offload(true);
    seed(5);
    auto x = input.detach().requires_grad_();
    std::vector<at::Tensor> branches;
    for (auto& block : blocks) {
      branches.push_back(offload ? ckpt::checkpoint(options, block, x) : block(x));
    }
    for (auto it = branches.rbegin(); it != branches.rend(); ++it) it->pow(2).sum().backward();
    return gradients_after(x);
  };
  expect_same_bits(run(false), run(true));
  EXPECT_EQ(ckpt::offload_stats().host_bytes, 0);
  EXPECT_EQ(ckpt::offload_stats().ahead_device_bytes, 0);
}

// Saved tensors whose sizes depend on the values (a mask's selection): offloaded and brought back
// ahead as they were, the plain gradients.
TEST_P(OffloadTest, SizesThatDependOnTheValuesComeBackAsSaved) {
  const auto step = [&](const at::Tensor& h) {
    const at::Tensor picked = h.masked_select(h > 0.25);  // its size depends on h's values
    return h * picked.pow(2).sum() + h.tanh();
  };
  const auto offloaded = ckpt::CheckpointOptions().offload(true);
  const auto run = [&](bool offload) {
    seed(9);
    auto x = input.detach().requires_grad_();
    at::Tensor h = x;
    for (auto& block : blocks) {
      h = block(h);
      h = offload ? ckpt::checkpoint(offloaded, step, h) : step(h);
    }
    h.pow(2).mean().backward();
    return gradients_after(x);
  };
  expect_same_bits(run(false), run(true));
}

// Two threads, each training its own blocks under offloaded regions at once: each thread's chain
// of groups is its own, so each gets the gradients it gets alone.
TEST_P(OffloadTest, TwoThreadsOffloadingAtOnceGiveTheirOwnGradients) {
  std::vector<std::vector<Widening>> models(2);
  for (size_t t = 0; t < models.size(); ++t) {
    torch::manual_seed(static_cast<uint64_t>(t) + 1);
    for (int i = 0; i < 4; ++i) models[t].push_back(Widening());
    for (auto& block : models[t]) block->to(device());
  }
  const at::Tensor batch = torch::randn({64, 128}, on());
  const auto step = [&](size_t t, bool offload) {
    auto x = (batch * static_cast<double>(t + 1)).detach().requires_grad_();
    at::Tensor h = x;
    for (auto& block : models[t]) {
      h = offload ? ckpt::checkpoint(ckpt::CheckpointOptions().offload(true), block, h) : block(h);
    }
    h.pow(2).sum().backward();
    std::vector<at::Tensor> grads{x.grad()};
    for (auto& block : models[t]) {
      for (auto& g : take_grads(*block)) grads.push_back(g);
    }
    return grads;
  };
  const std::vector<std::vector<at::Tensor>> alone{step(0, false), step(1, false)};
  std::vector<std::vector<std::vector<at::Tensor>>> together(2);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 3; ++round) together[t].push_back(step(t, true));
    });
  }
  for (auto& thread : threads) thread.join();
  for (size_t t = 0; t < 2; ++t) {
    ASSERT_EQ(together[t].size(), 3u);
    for (const auto& grads : together[t]) expect_same_bits(alone[t], grads);
  }
  EXPECT_EQ(ckpt::offload_stats().host_bytes, 0);
}

CKPT_INSTANTIATE_DEVICE_SUITE(OffloadTest);

// A budget that fits only with more host memory than the host budget: the infeasible-budget
// error says how much (a profile where offloading lowers the smallest budget: its backward
// brings back less than it offloaded).
TEST(OffloadPlan, HostBudgetTooSmallNamesTheHostBudgetThatWorks) {
  ckpt::plan::Chain profile;
  profile.input_bytes = 100;
  for (int i = 0; i < 4; ++i) {
    ckpt::plan::Stage stage;
    stage.forward_time = stage.backward_time = 1.0;
    stage.output_bytes = 100;
    stage.saved_bytes = 1000;
    ckpt::plan::StorageOption offloaded;
    offloaded.name = "offloaded";
    offloaded.forward_time = offloaded.backward_time = 1.0;
    offloaded.saved_bytes = 100;
    offloaded.offloaded_bytes = 900;
    offloaded.backward_tmp_bytes = 400;
    stage.alternatives.push_back(offloaded);
    profile.stages.push_back(stage);
  }
  ckpt::plan::OptimalOptions unlimited;
  const int64_t budget = ckpt::plan::min_feasible_budget_bytes(profile, unlimited);
  torch::nn::Sequential chain;
  for (int i = 0; i < 4; ++i) chain->push_back(torch::nn::Linear(4, 4));
  ckpt::PlannedSequential planned(chain, ckpt::Budget::bytes(budget),
                                  ckpt::PlannedSequentialOptions().host_budget_bytes(0));
  try {
    planned->plan(profile);
    FAIL() << "planned without the host memory it needs";
  } catch (const ckpt::InfeasibleBudget& error) {
    EXPECT_EQ(error.smallest_host_budget_bytes(), 900);
    EXPECT_GT(error.smallest_feasible_bytes(), budget);
    EXPECT_NE(std::string(error.what()).find("the smallest host budget that works"),
              std::string::npos)
        << error.what();
  }
  ckpt::PlannedSequential enough(chain, ckpt::Budget::bytes(budget),
                                 ckpt::PlannedSequentialOptions().host_budget_bytes(900));
  enough->plan(profile);
  EXPECT_LE(enough->prediction().host_peak_bytes, 900);
}

// On the host, there is nowhere to offload to.
TEST(OffloadOnHost, RegionOnHostDataIsAnErrorAndTheGuardCopiesNothing) {
  auto x = torch::randn({4, 8}, torch::requires_grad());
  torch::nn::Linear linear(8, 8);
  CKPT_EXPECT_THROWS_WITH(ckpt::checkpoint(ckpt::CheckpointOptions().offload(true), linear, x),
                          "tensor arguments are all in host memory already");
  ckpt::OffloadGuard guard;
  const auto y = linear(x).tanh();
  EXPECT_EQ(guard.host_bytes(), 0);
}

}  // namespace offload_test
