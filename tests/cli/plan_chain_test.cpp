// `ckpt plan` on hostile chain files and options (issue 27, items 3, 16 and 17): each is refused
// with one line that says what and where, bounded in length, never a crash or a silent guess.

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <string>

#include "cli_support.h"

namespace {

using nlohmann::json;
using namespace ckpt_cli_test;

const std::string kStage =
    R"({"forward_time": 1, "backward_time": 2, "output_bytes": 4096, "saved_bytes": 8192})";
const std::string kChain = R"({"input_bytes": 4096, "stages": [)" + kStage + "]}";

std::string write_file(const std::string& name, const std::string& bytes) {
  const std::string path = work_path(name);
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

// Exit code `code`, one short line on stderr containing `text`, nothing on stdout.
void expect_refused(const std::string& args, int code, const std::string& text) {
  const Result result = run(args, "timeout 60");
  EXPECT_EQ(result.code, code) << args << "\n" << result.err.substr(0, 2000);
  EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1)
      << result.err.substr(0, 2000);
  EXPECT_LT(result.err.size(), 600u) << result.err.substr(0, 2000);
  EXPECT_NE(result.err.find(text), std::string::npos) << result.err.substr(0, 2000);
  EXPECT_EQ(result.out, "");
}

// Once a SIGSEGV: the error message dumped the value recursively and overflowed the stack.
TEST(CliChainFile, DeeplyNestedValueIsRefusedNotACrash) {
  const std::string deep = std::string(70000, '[') + std::string(70000, ']');
  const std::string path =
      write_file("deep.json", R"({"input_bytes": 4096, "stages": [)" + deep + "]}");
  expect_refused("plan --chain " + path + " --budget 1MiB", 1,
                 "deep.json: not valid as a chain: stages[0][0]");
  expect_refused("plan --chain " + path + " --budget 1MiB", 1, "more than 32 deep");
}

// Once accepted silently, the last value winning.
TEST(CliChainFile, DuplicateKeyIsRefusedNamingKeyAndPlace) {
  std::string stage = kStage;
  stage.insert(stage.size() - 1, R"(, "saved_bytes": 4096)");
  expect_refused(
      "plan --chain " +
          write_file("duplicate.json", R"({"input_bytes": 4096, "stages": [)" + stage + "]}") +
          " --budget 1MiB",
      1, R"(stages[0] has the key "saved_bytes" twice)");
  expect_refused("plan --chain " +
                     write_file("duplicate_top.json", R"({"input_bytes": 1, )" + kChain.substr(1)) +
                     " --budget 1MiB",
                 1, R"(the document has the key "input_bytes" twice)");
}

// Once accepted silently: the parser stops at a NUL byte as at the end of the text.
TEST(CliChainFile, NulByteIsRefused) {
  for (const std::string& tail : {std::string(1, '\0'), std::string("\0{garbage", 9)}) {
    expect_refused("plan --chain " + write_file("nul.json", kChain + tail) + " --budget 1MiB", 1,
                   "a NUL byte at offset " + std::to_string(kChain.size()));
  }
  expect_refused("plan --chain " + write_file("garbage.json", kChain + " x") + " --budget 1MiB", 1,
                 "not valid JSON");
}

// A UTF-8 byte-order mark is skipped (RFC 8259 lets a parser ignore it): the same plan.
TEST(CliChainFile, ByteOrderMarkIsSkipped) {
  const Result plain = run("plan --json --budget 1MiB --chain " + write_file("plain.json", kChain));
  const Result marked =
      run("plan --json --budget 1MiB --chain " + write_file("bom.json", "\xEF\xBB\xBF" + kChain));
  ASSERT_EQ(marked.code, 0) << marked.err;
  EXPECT_EQ(json::parse(marked.out), json::parse(plain.out));
}

// Once the whole value, 20 MB on one line.
TEST(CliChainFile, ErrorsQuoteAtMostTheStartOfHugeValues) {
  const std::string huge(2'000'000, 'A');
  expect_refused("plan --chain " +
                     write_file("huge_string.json", R"({"input_bytes": ")" + huge + R"("})") +
                     " --budget 1MiB",
                 1, "(2000000 bytes)");
  expect_refused("plan --chain " +
                     write_file("huge_number.json",
                                R"({"input_bytes": )" + std::string(2'000'000, '9') + "}") +
                     " --budget 1MiB",
                 1, "not valid JSON");
}

// Once "must be a positive ...": they are positive, only too large.
TEST(CliChainFile, TooLargeBudgetOrCountSaysSo) {
  const std::string chain = " --chain " + write_file("chain.json", kChain);
  for (const char* budget : {"9223372036854775807", "99999999999TiB"}) {
    expect_refused("plan --budget " + std::string(budget) + chain, 2,
                   "too large: at most 9000000000000000000 bytes");
  }
  expect_refused("plan --budget 1MiB --solver revolve:99999999999" + chain, 2,
                 "too large: at most 2147483647");
}

}  // namespace

namespace {

// A chain of `stages` identical stages, written to `name`.
std::string long_chain_file(const std::string& name, int stages) {
  std::string text = R"({"input_bytes": 4096, "stages": [)";
  for (int i = 0; i < stages; ++i) text += (i > 0 ? ", " : "") + kStage;
  return write_file(name, text + "]}");
}

// Issue 27, item 13: from 5000 stages, refused with "use fewer --slots", which could not help.
TEST(CliChainFile, FiveThousandStagesArePlanned) {
  const Result result =
      run("plan --json --budget 25% --chain " + long_chain_file("long.json", 5000), "timeout 120");
  ASSERT_EQ(result.code, 0) << result.err.substr(0, 2000);
  const json plan = json::parse(result.out);
  EXPECT_TRUE(plan["feasible"].get<bool>());
  EXPECT_LE(plan["predicted_peak_bytes"].get<int64_t>(), plan["budget_bytes"].get<int64_t>());
  EXPECT_LE(plan["min_feasible_budget_bytes"].get<int64_t>(),
            plan["no_checkpoint_peak_bytes"].get<int64_t>());
}

// Past what the tables can hold, the advice is about stages, not --slots.
TEST(CliChainFile, TooManyStagesAdviseMergingThem) {
  expect_refused("plan --budget 1MiB --chain " + long_chain_file("longer.json", 60000), 2,
                 "; merge consecutive stages into at most ");
  expect_refused("plan --budget 1MiB --slots 20000000 --chain " + long_chain_file("short.json", 8),
                 2, "; use at most ");
}

}  // namespace

namespace {

// Planning without the device (issue 51, item 3): a bench model measured on the meta device under
// a device profile, the budget by default what the device's memory leaves.
TEST(CliPlanModel, ABenchModelIsPlannedFromADeviceProfileWithoutTheDevice) {
  const std::string profile = write_file(
      "h100.json", R"({"name": "H100", "memory_bytes": 85899345920, "allocation_granularity": 512,
                       "flops_per_second": 9.89e14, "bytes_per_second": 3.35e12,
                       "seconds_per_operator": 5e-6})");
  const Result fits =
      run("plan --model transformer --quick --device-profile " + profile + " --json");
  ASSERT_EQ(fits.code, 0) << fits.err;
  const json plan = json::parse(fits.out);
  EXPECT_TRUE(plan["feasible"].get<bool>());
  EXPECT_EQ(plan["stages"].get<int>(), 4);
  // The device's 80 GiB less the model's parameters and input.
  EXPECT_LT(plan["budget_bytes"].get<int64_t>(), int64_t{80} << 30);
  EXPECT_GT(plan["budget_bytes"].get<int64_t>(), int64_t{79} << 30);
  EXPECT_EQ(plan["predicted_peak_bytes"].get<int64_t>() % 512, 0);  // whole allocator blocks

  const Result small =
      run("plan --model transformer --quick --device-profile " + profile + " --budget min --json");
  ASSERT_EQ(small.code, 0) << small.err;
  EXPECT_LT(json::parse(small.out)["predicted_peak_bytes"].get<int64_t>(),
            plan["predicted_peak_bytes"].get<int64_t>());

  expect_refused("plan --model transformer --quick", 2, "needs --device-profile");
  expect_refused("plan --model nosuch --device-profile " + profile, 2, "unknown model 'nosuch'");
  const std::string no_memory = write_file(
      "no_memory.json", R"({"name": "X", "memory_bytes": 0, "allocation_granularity": 512,
                            "flops_per_second": 1e12, "bytes_per_second": 1e11,
                            "seconds_per_operator": 5e-6})");
  expect_refused("plan --model mlp --quick --device-profile " + no_memory, 2,
                 "pass --device-memory");
  expect_refused("plan --budget 1MiB", 2, "--chain FILE.json or --model NAME");
}

}  // namespace
