// `ckpt plan` with offload options (docs/memory-model.md, "Offloading"): --host-budget, the host
// peak in the output, offload ops named, the infeasible host budget's message, bad values.

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <string>

#include "cli_support.h"

namespace {

using nlohmann::json;
using namespace ckpt_cli_test;

// Stage 0's grad-enabled forward needs 40 KiB of temporaries, its offload option 2 KiB: at the
// smallest budget it offloads its 4 KiB. Copies at 1 KiB per second.
const char* const kOffloadChain = R"({
  "input_bytes": 4096, "host_bandwidth": 1024,
  "stages": [
    {"forward_time": 1, "backward_time": 2, "output_bytes": 8192, "saved_bytes": 12288,
     "forward_tmp_bytes": 2048, "forward_all_tmp_bytes": 40960, "backward_tmp_bytes": 2048,
     "alternatives": [{"forward_time": 1, "backward_time": 2, "saved_bytes": 8192,
                       "forward_tmp_bytes": 2048, "backward_tmp_bytes": 6144,
                       "offloaded_bytes": 4096, "name": "offloaded"}]},
    {"forward_time": 2, "backward_time": 3, "output_bytes": 16384, "saved_bytes": 20480}]})";

std::string offload_chain() {
  const std::string path = work_path("offload_chain.json");
  std::ofstream(path) << kOffloadChain;
  return path;
}

json plan_json(const std::string& args) {
  const Result result = run("plan --json --chain " + offload_chain() + " " + args);
  EXPECT_EQ(result.code, 0) << result.err;
  return json::parse(result.out);
}

TEST(CliPlanOffload, SmallestBudgetOffloadsAndSaysWhere) {
  const json plan = plan_json("--budget min");
  ASSERT_TRUE(plan["feasible"].get<bool>()) << plan.dump();
  EXPECT_EQ(plan["predicted_host_peak_bytes"].get<int64_t>(), 4096);
  EXPECT_TRUE(plan["host_budget_bytes"].is_null());
  int offloads = 0;
  for (const json& op : plan["schedule"]) {
    if (!op.contains("offloaded_bytes")) continue;
    ++offloads;
    EXPECT_EQ(op["offloaded_bytes"].get<int64_t>(), 4096);
    EXPECT_EQ(op["name"].get<std::string>(), "offloaded");
    EXPECT_EQ(op["option"].get<int>(), 1);
  }
  EXPECT_EQ(offloads, 2);  // its forward_all and its backward
  // 4 KiB at 1 KiB/s: the copies take 4 s each way, longer than the compute.
  EXPECT_EQ(plan["schedule_text"].get<std::string>().find("Fall0.1") != std::string::npos, true);
}

TEST(CliPlanOffload, TooSmallAHostBudgetNamesTheSmallestThatWorks) {
  const int64_t budget = plan_json("--budget min")["budget_bytes"].get<int64_t>();
  const std::string at = "--budget " + std::to_string(budget);
  const json refused = plan_json(at + " --host-budget 0");
  EXPECT_FALSE(refused["feasible"].get<bool>());
  EXPECT_EQ(refused["host_budget_bytes"].get<int64_t>(), 0);
  EXPECT_GT(refused["min_feasible_budget_bytes"].get<int64_t>(), budget);
  EXPECT_NE(refused["message"].get<std::string>().find(
                "the smallest host budget that works for this budget is 4096 bytes"),
            std::string::npos)
      << refused["message"];
  for (const std::string host : {"4096", "4KiB"}) {
    const json fits = plan_json(at + " --host-budget " + host);
    EXPECT_TRUE(fits["feasible"].get<bool>()) << host;
    EXPECT_LE(fits["predicted_host_peak_bytes"].get<int64_t>(), 4096);
  }
}

TEST(CliPlanOffload, TextShowsTheHostPeak) {
  const Result result = run("plan --chain " + offload_chain() + " --budget min");
  EXPECT_EQ(result.code, 0) << result.err;
  EXPECT_NE(result.out.find("host peak:  4.00 KiB (4096 bytes of offloaded activations"),
            std::string::npos)
      << result.out;
}

TEST(CliPlanOffload, BadHostBudgetIsAUsageError) {
  for (const std::string host : {"lots", "-5", "12XB", "1.5"}) {
    const Result result =
        run("plan --chain " + offload_chain() + " --budget min --host-budget=" + host);
    EXPECT_EQ(result.code, 2) << host;
    EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1) << result.err;
    EXPECT_NE(result.err.find("--host-budget"), std::string::npos) << result.err;
    EXPECT_EQ(result.out, "");
  }
}

TEST(CliPlanOffload, BadOffloadFieldsNameTheField) {
  std::string text = kOffloadChain;
  text.replace(text.find("\"offloaded_bytes\": 4096"), 23, "\"offloaded_bytes\": -1");
  const std::string negative = work_path("negative_offload.json");
  std::ofstream(negative) << text;
  Result result = run("plan --chain " + negative + " --budget min");
  EXPECT_EQ(result.code, 1);
  EXPECT_NE(result.err.find("stages[0].alternatives[0].offloaded_bytes"), std::string::npos)
      << result.err;
  text = kOffloadChain;
  text.replace(text.find("\"host_bandwidth\": 1024"), 22, "\"host_bandwidth\": -1");
  const std::string bandwidth = work_path("negative_bandwidth.json");
  std::ofstream(bandwidth) << text;
  result = run("plan --chain " + bandwidth + " --budget min");
  EXPECT_EQ(result.code, 1);
  EXPECT_NE(result.err.find("host_bandwidth must be"), std::string::npos) << result.err;
}

}  // namespace
