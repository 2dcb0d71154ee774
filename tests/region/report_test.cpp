// Issue 33, item 6: ckpt::KeptReport, what each region keeps for its backward and why; its kept
// totals equal what MemoryTracker measures as held after the forward.

#include <ckpt/checkpoint.h>
#include <ckpt/memory_label.h>
#include <ckpt/memory_tracker.h>
#include <ckpt/report.h>
#include <ckpt/selective.h>

#include "support/support.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <stdexcept>
#include <string>

namespace report_test {

// Regions are numbered under the label each test opens: "step/region 1" is its first.
struct ReportTest : ckpt::test::SeedingFixture {
  ckpt::MemoryLabel label{"step"};
};

int64_t storage_bytes(const torch::Tensor& t) {
  return static_cast<int64_t>(t.storage().nbytes());
}

const ckpt::KeptEntry* find_entry(const ckpt::RegionReport& region, const std::string& what) {
  for (const auto& entry : region.entries) {
    if (entry.what == what) return &entry;
  }
  return nullptr;
}

// Counts the calling thread's CPU allocations: what a region holds after its forward, less the
// output handed back, is what the report says it keeps.
struct Held {
  ckpt::MemoryTracker tracker{c10::Device(c10::kCPU), ckpt::MemoryScope::CallingThread};
  int64_t before = tracker.current_bytes();
  int64_t since_start() const { return tracker.current_bytes() - before; }
};

TEST_F(ReportTest, SelectiveRegionKeepsWhatTheTrackerMeasures) {
  auto w = torch::randn({64, 64}, torch::requires_grad());
  Held held;
  ckpt::KeptReport report;
  torch::Tensor y;
  {
    auto x = torch::randn({32, 64});
    ckpt::ReportScope scope(report);
    y = ckpt::checkpoint(
        ckpt::CheckpointOptions().policy(ckpt::save_ops({"aten::mm"})),
        [&](const torch::Tensor& t) { return torch::tanh(t.mm(w)) * 2; }, x);
  }  // the caller lets go of x: the region holds it
  ASSERT_EQ(report.regions().size(), 1u);
  const ckpt::RegionReport& region = report.regions()[0];
  EXPECT_EQ(region.name, "step/region 1");
  EXPECT_EQ(region.mode, "selective");
  const ckpt::KeptEntry* argument = find_entry(region, "argument #0");
  const ckpt::KeptEntry* mm = find_entry(region, "aten::mm");
  const ckpt::KeptEntry* tanh = find_entry(region, "aten::tanh");
  ASSERT_TRUE(argument && mm && tanh);
  EXPECT_EQ(argument->decision, ckpt::KeptDecision::Kept);
  EXPECT_EQ(mm->decision, ckpt::KeptDecision::Kept);
  EXPECT_EQ(mm->why, "the policy saves it (PreferSave)");
  EXPECT_EQ(mm->shape, (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(mm->dtype, torch::kFloat);
  EXPECT_EQ(mm->bytes, 32 * 64 * 4);
  EXPECT_EQ(tanh->decision, ckpt::KeptDecision::Recomputed);
  EXPECT_EQ(tanh->counted_bytes, 0);
  EXPECT_EQ(find_entry(region, "RNG state (cpu)"), nullptr);  // nothing random: dropped
  // A kept call is not also listed as recomputed.
  EXPECT_EQ(std::count_if(region.entries.begin(), region.entries.end(),
                          [](const ckpt::KeptEntry& entry) { return entry.what == "aten::mm"; }),
            1);
  EXPECT_EQ(report.kept_bytes(), 2 * 32 * 64 * 4);
  EXPECT_EQ(report.kept_bytes(), held.since_start() - storage_bytes(y));
  y.sum().backward();  // the report holds nothing: the backward runs as without it
  EXPECT_TRUE(w.grad().defined());
}

struct ReportVariantTest : ReportTest, ::testing::WithParamInterface<bool> {};

TEST_P(ReportVariantTest, CheckpointedRegionKeepsItsArgumentAndRngState) {
  auto layer = torch::nn::Linear(64, 64);
  Held held;
  ckpt::KeptReport report;
  torch::Tensor y;
  {
    auto x = torch::randn({16, 64}, torch::requires_grad());
    ckpt::ReportScope scope(report);
    y = ckpt::checkpoint(
        ckpt::CheckpointOptions().use_reentrant(GetParam()),
        [&](const torch::Tensor& t) {
          // A random mask, as dropout draws it (dropout's own mask is written in place into an
          // empty tensor, which the report lists as that allocation's operator).
          return torch::relu(layer(t)) * torch::bernoulli(torch::full_like(t, 0.5));
        },
        x);
  }
  ASSERT_EQ(report.regions().size(), 1u);
  const ckpt::RegionReport& region = report.regions()[0];
  EXPECT_EQ(region.mode, GetParam() ? "checkpointed (reentrant)" : "checkpointed");
  const ckpt::KeptEntry* rng = find_entry(region, "RNG state (cpu)");
  ASSERT_NE(rng, nullptr);
  EXPECT_EQ(rng->decision, ckpt::KeptDecision::Kept);
  ASSERT_NE(find_entry(region, "argument #0"), nullptr);
  bool random_recomputed = false;
  for (const auto& entry : region.entries) {
    random_recomputed |= entry.why == "it draws random numbers: never kept";
    if (entry.decision == ckpt::KeptDecision::Recomputed) {
      EXPECT_GT(entry.bytes, 0);
    }
  }
  EXPECT_TRUE(random_recomputed);
  EXPECT_EQ(report.kept_bytes(), 16 * 64 * 4 + rng->counted_bytes);
  EXPECT_EQ(report.kept_bytes(), held.since_start() - storage_bytes(y));
}

INSTANTIATE_TEST_SUITE_P(Variants, ReportVariantTest, ::testing::Values(false, true),
                         ckpt::test::VariantName());

TEST_F(ReportTest, SharedMemoryIsCountedOnce) {
  Held held;
  ckpt::KeptReport report;
  torch::Tensor a, b;
  {
    auto x = torch::randn({8, 32}, torch::requires_grad());
    ckpt::ReportScope scope(report);
    const auto fn = [](const torch::Tensor& t) { return torch::sin(t); };
    a = ckpt::checkpoint(fn, x);
    b = ckpt::checkpoint(fn, x.narrow(1, 0, 16));  // a view: the same memory
  }
  ASSERT_EQ(report.regions().size(), 2u);
  const ckpt::KeptEntry& first = report.regions()[0].entries.at(0);
  const ckpt::KeptEntry& second = report.regions()[1].entries.at(0);
  EXPECT_EQ(first.counted_bytes, 8 * 32 * 4);
  EXPECT_EQ(second.bytes, 8 * 16 * 4);
  EXPECT_EQ(second.counted_bytes, 0);
  EXPECT_EQ(second.shared_with, "step/region 1: argument #0");
  EXPECT_EQ(report.kept_bytes(), 8 * 32 * 4);
  EXPECT_EQ(report.kept_bytes(), held.since_start() - storage_bytes(a) - storage_bytes(b));
}

TEST_F(ReportTest, ARegionInsideAnotherRegionsForwardIsFreedWithItsGraph) {
  Held held;
  ckpt::KeptReport report;
  torch::Tensor y;
  {
    auto x = torch::randn({8, 32}, torch::requires_grad());
    ckpt::ReportScope scope(report);
    y = ckpt::checkpoint(
        [](const torch::Tensor& t) {
          auto inner =
              ckpt::checkpoint([](const torch::Tensor& u) { return torch::exp(u); }, torch::cos(t));
          return torch::sin(inner);
        },
        x);
  }
  ASSERT_EQ(report.regions().size(), 2u);
  const ckpt::RegionReport& inner = report.regions()[0];
  const ckpt::RegionReport& outer = report.regions()[1];
  EXPECT_EQ(inner.name, "step/region 1/region 1");
  EXPECT_EQ(outer.name, "step/region 1");
  EXPECT_EQ(inner.kept_bytes, 0);
  EXPECT_NE(inner.note.find("inside the forward of step/region 1,"), std::string::npos);
  for (const auto& entry : inner.entries) EXPECT_EQ(entry.decision, ckpt::KeptDecision::Recomputed);
  EXPECT_EQ(report.kept_bytes(), 8 * 32 * 4);
  EXPECT_EQ(report.kept_bytes(), held.since_start() - storage_bytes(y));
}

// A function that writes into its argument: the first call at the place keeps its whole graph
// (and says so), later calls keep a copy of the argument from before the write.
TEST_F(ReportTest, AnArgumentWrittenInPlaceIsKeptWithItsCopy) {
  const ckpt::test::WarningCapture warnings;
  auto w = torch::randn({16, 16}, torch::requires_grad());
  ckpt::KeptReport report;
  {
    ckpt::ReportScope scope(report);
    for (int call = 0; call < 2; ++call) {
      auto h = torch::randn({4, 16}, torch::requires_grad()) * 2;
      ckpt::checkpoint([&](torch::Tensor t) { return t.relu_().mm(w); }, h).sum().backward();
    }
  }
  EXPECT_TRUE(warnings.contains("keeps its activations instead"));
  ASSERT_EQ(report.regions().size(), 2u);
  EXPECT_NE(report.regions()[0].note.find("keeps its whole forward graph"), std::string::npos);
  EXPECT_TRUE(report.regions()[0].entries.empty());
  const ckpt::RegionReport& copied = report.regions()[1];
  const ckpt::KeptEntry* argument = find_entry(copied, "argument #0");
  const ckpt::KeptEntry* copy = find_entry(copied, "copy of argument #0");
  ASSERT_TRUE(argument && copy);
  EXPECT_EQ(copy->decision, ckpt::KeptDecision::Kept);
  EXPECT_EQ(copy->counted_bytes, 4 * 16 * 4);
  EXPECT_EQ(copied.kept_bytes, argument->counted_bytes + copy->counted_bytes);
}

TEST_F(ReportTest, RegionWithoutGradientsKeepsNothing) {
  ckpt::KeptReport report;
  {
    ckpt::ReportScope scope(report);
    ckpt::checkpoint([](const torch::Tensor& t) { return t * 2; }, torch::ones({4}));
  }
  ASSERT_EQ(report.regions().size(), 1u);
  EXPECT_TRUE(report.regions()[0].entries.empty());
  EXPECT_EQ(report.kept_bytes(), 0);
  EXPECT_NE(report.regions()[0].note.find("keeps nothing"), std::string::npos);
}

TEST_F(ReportTest, NothingIsRecordedOutsideAScope) {
  ckpt::KeptReport report;
  auto x = torch::randn({4}, torch::requires_grad());
  { ckpt::ReportScope scope(report); }
  auto y = ckpt::checkpoint([](const torch::Tensor& t) { return t.sin(); }, x);
  EXPECT_TRUE(report.regions().empty());
  EXPECT_EQ(ckpt::detail::active_report(), nullptr);
}

TEST_F(ReportTest, InnerScopeTakesTheRegionsUntilItEnds) {
  ckpt::KeptReport outer, inner;
  auto x = torch::randn({4}, torch::requires_grad());
  const auto fn = [](const torch::Tensor& t) { return t.sin(); };
  ckpt::ReportScope outer_scope(outer);
  {
    ckpt::ReportScope inner_scope(inner);
    ckpt::checkpoint(fn, x);
  }
  ckpt::checkpoint(fn, x);
  EXPECT_EQ(inner.regions().size(), 1u);
  EXPECT_EQ(outer.regions().size(), 1u);
  EXPECT_EQ(ckpt::detail::active_report(), &outer);
}

TEST_F(ReportTest, ASecondScopeOnTheSameReportIsAnError) {
  ckpt::KeptReport report;
  ckpt::ReportScope scope(report);
  CKPT_EXPECT_THROWS_WITH(ckpt::ReportScope second(report),
                          "ckpt::ReportScope: this KeptReport is already recorded into");
  EXPECT_EQ(ckpt::detail::active_report(), &report);  // the first scope still records
}

TEST_F(ReportTest, ARegionWhoseForwardThrowsRecordsNothing) {
  ckpt::KeptReport report;
  auto x = torch::randn({4}, torch::requires_grad());
  ckpt::ReportScope scope(report);
  EXPECT_THROW(ckpt::checkpoint(
                   [](const torch::Tensor& t) -> torch::Tensor {
                     auto s = t.sin();
                     throw std::runtime_error("fails");
                     return s;
                   },
                   x),
               std::runtime_error);
  EXPECT_TRUE(report.regions().empty());
  ckpt::checkpoint([](const torch::Tensor& t) { return t.cos(); }, x);
  ASSERT_EQ(report.regions().size(), 1u);
  EXPECT_EQ(report.regions()[0].entries.size(), 2u);  // argument #0, aten::cos
}

TEST_F(ReportTest, TextAndJsonCarryTheSameReport) {
  ckpt::KeptReport report;
  torch::Tensor y;
  {
    auto x = torch::randn({32, 64});
    auto w = torch::randn({64, 64}, torch::requires_grad());
    ckpt::ReportScope scope(report);
    y = ckpt::checkpoint(
        ckpt::CheckpointOptions().policy(ckpt::save_ops({"aten::mm"})),
        [&](const torch::Tensor& t) { return torch::tanh(t.mm(w)); }, x);
  }
  const std::string text = report.text();
  EXPECT_NE(text.find("kept for the backward: 16.0 KiB in 1 region"), std::string::npos) << text;
  EXPECT_NE(text.find("step/region 1 (selective): kept 16.0 KiB"), std::string::npos) << text;
  EXPECT_NE(text.find("aten::mm"), std::string::npos) << text;
  const auto json = nlohmann::json::parse(report.json());
  EXPECT_EQ(json["kept_bytes"], report.kept_bytes());
  EXPECT_EQ(json["recomputed_bytes"], report.recomputed_bytes());
  const auto& entries = json["regions"][0]["entries"];
  ASSERT_EQ(entries.size(), report.regions()[0].entries.size());
  EXPECT_EQ(entries[1]["what"], "aten::mm");
  EXPECT_EQ(entries[1]["decision"], "kept");
  EXPECT_EQ(entries[1]["dtype"], "Float");
  EXPECT_EQ(entries[1]["shape"], nlohmann::json({32, 64}));
  EXPECT_EQ(entries[2]["decision"], "recomputed");
}

}  // namespace report_test
