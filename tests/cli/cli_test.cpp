// End-to-end tests of the `ckpt` program: runs the built binary and checks exit codes, outputs,
// JSON fields and error messages (plan on the fixture chains of data/chains/, tiny train runs).

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "cli_support.h"

namespace {

using nlohmann::json;
using namespace ckpt_cli_test;

std::string chain(const std::string& name) {
  return std::string(CKPT_SOURCE_DIR) + "/data/chains/" + name;
}

json plan_json(const std::string& args) {
  const Result result = run("plan --json " + args);
  EXPECT_EQ(result.code, 0) << result.err;
  return json::parse(result.out);
}

// A refused command line: exit code `code` and one line on stderr that contains `text`, and nothing
// on stdout (no work started). `timeout 20` turns a slow refusal into a failure.
void expect_refused(const std::string& args, int code, const std::string& text) {
  const Result result = run(args, "timeout 20");
  EXPECT_EQ(result.code, code) << args << "\n" << result.err;
  EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1) << args << "\n"
                                                                       << result.err;
  EXPECT_NE(result.err.find("ckpt: error: "), std::string::npos) << result.err;
  EXPECT_NE(result.err.find(text), std::string::npos) << args << "\n" << result.err;
  EXPECT_EQ(result.out, "") << args;
}

const std::string kTiny =
    "train --layers 2 --width 32 --heads 2 --context 16 --batch 4 --steps 4 --threads 1 ";

// ~~~ global ~~~

TEST(Cli, VersionPrintsVersion) {
  const Result result = run("--version");
  EXPECT_EQ(result.code, 0);
  EXPECT_NE(result.out.find("0.1.0"), std::string::npos) << result.out;
}

TEST(Cli, HelpListsTheCommands) {
  const Result result = run("--help");
  EXPECT_EQ(result.code, 0);
  for (const char* command : {"train", "plan", "bench"}) {
    EXPECT_NE(result.out.find(command), std::string::npos) << result.out;
  }
}

TEST(Cli, CommandHelpListsItsOptions) {
  const Result result = run("train --help");
  EXPECT_EQ(result.code, 0);
  for (const char* option : {"--layers", "--strategy", "--plot", "--trace", "--json"}) {
    EXPECT_NE(result.out.find(option), std::string::npos) << result.out;
  }
}

TEST(Cli, NoCommandPrintsHelpAndFails) {
  const Result result = run("");
  EXPECT_EQ(result.code, 2);
  EXPECT_NE(result.err.find("ckpt: error:"), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("plan"), std::string::npos) << result.err;
}

TEST(Cli, UnknownOptionIsUsageError) {
  const Result result = run("plan --chain x.json --budget 1 --frobnicate");
  EXPECT_EQ(result.code, 2);
  EXPECT_NE(result.err.find("ckpt: error:"), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("frobnicate"), std::string::npos) << result.err;
}

TEST(Cli, UnknownCommandIsUsageError) {
  const Result result = run("fly");
  EXPECT_EQ(result.code, 2);
  EXPECT_NE(result.err.find("ckpt: error:"), std::string::npos) << result.err;
}

// ~~~ plan ~~~

TEST(Cli, PlanJsonHasContractFields) {
  const json plan = plan_json("--chain " + chain("homogeneous.json") + " --budget 30000");
  for (const char* key : {"feasible", "predicted_time", "predicted_peak_bytes", "forward_count",
                          "schedule", "budget_bytes", "solver", "min_feasible_budget_bytes",
                          "no_checkpoint_time", "no_checkpoint_peak_bytes"}) {
    EXPECT_TRUE(plan.contains(key)) << key;
  }
  EXPECT_TRUE(plan["feasible"].get<bool>());
  EXPECT_LE(plan["predicted_peak_bytes"].get<int64_t>(), 30000);
  const std::set<std::string> ops{"forward_none", "forward_input", "forward_all", "backward",
                                  "loss"};
  int forwards = 0;
  for (const json& op : plan["schedule"]) {
    const std::string name = op["op"].get<std::string>();
    EXPECT_TRUE(ops.count(name)) << name;
    EXPECT_TRUE(op["stage"].is_number_integer());
    forwards += name.rfind("forward", 0) == 0;
  }
  EXPECT_EQ(forwards, plan["forward_count"].get<int>());
  EXPECT_GT(plan["predicted_time"].get<double>(), plan["no_checkpoint_time"].get<double>());
}

TEST(Cli, PlanHeterogeneousChainFitsBudget) {
  const json plan = plan_json("--chain " + chain("resnet_like.json") + " --budget 100MiB");
  EXPECT_TRUE(plan["feasible"].get<bool>());
  EXPECT_EQ(plan["budget_bytes"].get<int64_t>(), 100 << 20);
  EXPECT_LE(plan["predicted_peak_bytes"].get<int64_t>(), 100 << 20);
  EXPECT_LT(plan["predicted_peak_bytes"].get<int64_t>(),
            plan["no_checkpoint_peak_bytes"].get<int64_t>());
}

TEST(Cli, PlanUnlimitedBudgetRecomputesNothing) {
  const json plan = plan_json("--chain " + chain("resnet_like.json") + " --budget 1GB");
  EXPECT_EQ(plan["forward_count"].get<int>(), plan["stages"].get<int>());
  EXPECT_DOUBLE_EQ(plan["predicted_time"].get<double>(), plan["no_checkpoint_time"].get<double>());
}

TEST(Cli, PlanInfeasibleBudgetReportsSmallestFeasible) {
  const json plan = plan_json("--chain " + chain("homogeneous.json") + " --budget 100");
  EXPECT_FALSE(plan["feasible"].get<bool>());
  const int64_t smallest = plan["min_feasible_budget_bytes"].get<int64_t>();
  EXPECT_GT(smallest, 100);
  EXPECT_TRUE(plan["schedule"].empty());
  const json retry =
      plan_json("--chain " + chain("homogeneous.json") + " --budget " + std::to_string(smallest));
  EXPECT_TRUE(retry["feasible"].get<bool>());
  EXPECT_EQ(retry["predicted_peak_bytes"].get<int64_t>(), smallest);
}

TEST(Cli, PlanAcceptsBudgetUnits) {
  const json bytes = plan_json("--chain " + chain("homogeneous.json") + " --budget 28672");
  const json units = plan_json("--chain " + chain("homogeneous.json") + " --budget 28KiB");
  EXPECT_EQ(bytes["budget_bytes"], units["budget_bytes"]);
  EXPECT_EQ(bytes["schedule"], units["schedule"]);
}

TEST(Cli, PlanAcceptsBudgetAsPercentageOfNoCheckpointPeak) {
  const json plan = plan_json("--chain " + chain("resnet_like.json") + " --budget 50%");
  const int64_t peak = plan["no_checkpoint_peak_bytes"].get<int64_t>();
  EXPECT_EQ(plan["budget_bytes"].get<int64_t>(), peak / 2);
  EXPECT_TRUE(plan["feasible"].get<bool>());
  EXPECT_LE(plan["predicted_peak_bytes"].get<int64_t>(), peak / 2);
  EXPECT_NE(run("plan --chain " + chain("resnet_like.json") + " --budget 150%").code, 0);
}

TEST(Cli, PlanUniformSolverIsCheckpointSequential) {
  const json plan =
      plan_json("--chain " + chain("homogeneous.json") + " --budget 1MB --solver uniform:2");
  EXPECT_EQ(plan["solver"], "uniform:2");
  EXPECT_EQ(plan["schedule"][0]["op"], "forward_input");
  EXPECT_EQ(plan["forward_count"].get<int>(), 8 + 4);
}

TEST(Cli, PlanEverySolverGivesAValidAnswer) {
  for (const char* solver :
       {"optimal", "uniform", "uniform:3", "sqrt", "revolve", "revolve:2", "none"}) {
    const json plan =
        plan_json("--chain " + chain("resnet_like.json") + " --budget 200MiB --solver " + solver);
    EXPECT_TRUE(plan["feasible"].is_boolean()) << solver;
    EXPECT_FALSE(plan["schedule"].empty()) << solver;
  }
}

TEST(Cli, PlanHumanReadableOutput) {
  const Result result = run("plan --chain " + chain("homogeneous.json") + " --budget 30000");
  EXPECT_EQ(result.code, 0) << result.err;
  for (const char* text :
       {"feasible:   yes", "schedule:   Fck0", "peak:", "overhead", "min budget:"}) {
    EXPECT_NE(result.out.find(text), std::string::npos) << result.out;
  }
}

TEST(Cli, PlanInvalidChainNamesFileAndField) {
  const Result result = run("plan --json --chain " + chain("invalid.json") + " --budget 1GB");
  EXPECT_EQ(result.code, 1);
  EXPECT_NE(result.err.find("ckpt: error:"), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("invalid.json"), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("stages[1].saved_bytes"), std::string::npos) << result.err;
}

TEST(Cli, PlanMissingChainFileFails) {
  const Result result = run("plan --chain /nonexistent/chain.json --budget 1GB");
  EXPECT_EQ(result.code, 1);
  EXPECT_NE(result.err.find("cannot open"), std::string::npos) << result.err;
}

TEST(Cli, PlanRejectsBadBudget) {
  // 400 digits: beyond a double's range, once an uncaught std::out_of_range (found by fuzzing).
  const std::string huge(400, '4');
  for (const std::string& budget :
       {std::string("12XB"), std::string("-5"), std::string("lots"), std::string("0"), huge}) {
    const Result result = run("plan --chain " + chain("homogeneous.json") + " --budget=" + budget);
    EXPECT_EQ(result.code, 2) << budget;
    EXPECT_NE(result.err.find("--budget"), std::string::npos) << result.err;
  }
}

TEST(Cli, PlanRejectsUnknownSolver) {
  const Result result =
      run("plan --chain " + chain("homogeneous.json") + " --budget 1MB --solver magic");
  EXPECT_EQ(result.code, 2);
  EXPECT_NE(result.err.find("unknown solver \"magic\""), std::string::npos) << result.err;
  // std::atoi once let a count that is no number through.
  for (const char* solver : {"uniform:abc", "revolve:3x", "uniform:0", "sqrt:2"}) {
    const Result bad =
        run("plan --chain " + chain("homogeneous.json") + " --budget 1MB --solver " + solver);
    EXPECT_EQ(bad.code, 2) << solver;
    EXPECT_NE(bad.err.find("--solver"), std::string::npos) << bad.err;
  }
}

TEST(Cli, PlanRequiresChainAndBudget) {
  const Result result = run("plan --budget 1MB");
  EXPECT_EQ(result.code, 2);
  EXPECT_NE(result.err.find("--chain"), std::string::npos) << result.err;
}

TEST(Cli, PlanRefusesTablesBeyondTheLimitUpFront) {
  // Once 35 s and 7.2 GB before an answer.
  expect_refused("plan --chain " + chain("homogeneous.json") + " --budget 1MB --slots 20000000", 2,
                 "--slots 20000000: the optimal solver needs");
}

TEST(Cli, PlanReadsOnlyRegularChainFiles) {
  // Once read until memory ran out.
  expect_refused("plan --chain /dev/zero --budget 1MB", 1, "must be a regular file");
}

TEST(Cli, PlanRefusesChainsWhoseSizesOverflow) {
  const std::string path = work_path("overflowing_chain.json");
  std::ofstream(path)
      << R"({"input_bytes": 4611686018427387904, "stages": [)"
      << R"({"forward_time": 1, "backward_time": 1, "output_bytes": 4611686018427387904, "saved_bytes": 4611686018427387904}]})";
  expect_refused("plan --chain " + path + " --budget 1MB", 1, "2^60 bytes");
}

// ~~~ errors: one line each ~~~

// Issue 27, item 16: an error echoed a whole offending value (a 20 MB line). The middle of a long
// message is left out; its start and its advice stay.
TEST(Cli, ErrorsEchoAtMostAThousandBytesOfAHugeValue) {
  const std::string huge(100000, 'x');
  for (const std::string& args : {"plan --chain " + chain("homogeneous.json") + " --budget " + huge,
                                  kTiny + "--strategy " + huge, kTiny + "--layers " + huge}) {
    const Result result = run(args, "timeout 20");
    EXPECT_EQ(result.code, 2) << result.err.size();
    EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1);
    EXPECT_LE(result.err.size(), 1100u);
    // Cut by the program ("bytes left out") or quoted in part by the library ("(100000 bytes)").
    const bool cut = result.err.find("bytes left out ...]") != std::string::npos ||
                     result.err.find("(100000 bytes)") != std::string::npos;
    EXPECT_TRUE(cut) << result.err;
  }
  const Result budget = run("plan --chain " + chain("homogeneous.json") + " --budget " + huge);
  EXPECT_NE(budget.err.find("or \"min\" for the smallest feasible budget)\n"), std::string::npos)
      << budget.err;
}

// A value with a newline in it stays on one line, the newline escaped (as \x0A by the library's
// quote of the value).
TEST(Cli, ErrorsShowControlCharactersAsEscapes) {
  const std::string args =
      "plan --chain " + chain("homogeneous.json") + " --budget \"$(printf '12\\nMB')\"";
  expect_refused(args, 2, "12\\x0AMB");
}

// ~~~ train: bad options ~~~

// Each once crashed (signed overflow, then a store through a null pointer) or ran on.
TEST(Cli, TrainRefusesSizesBeyondTheMachineWithTheEstimate) {
  expect_refused(kTiny + "--batch 1152921504606846976", 2, "--batch must be at most 16777216");
  expect_refused(kTiny + "--width 65536 --layers 1000", 2, "more than this machine's");
  expect_refused(kTiny + "--layers 9223372036854775807", 2, "--layers must be at most");
  expect_refused(kTiny + "--steps 4294967296", 2, "--steps must be at most");
}

TEST(Cli, TrainRefusesMoreThreadsThanTheMachineHas) {
  expect_refused(kTiny + "--threads 100000", 2, "hardware threads");
}

TEST(Cli, TrainRefusesNegativeSeedAndNonFiniteRate) {
  expect_refused(kTiny + "--seed -1", 2, "--seed: must not be negative, but got -1");
  expect_refused(kTiny + "--lr inf", 2, "--lr must be a positive number");
}

TEST(Cli, TrainZeroSegmentsIsUsageError) {
  expect_refused(kTiny + "--strategy sequential:0", 2, "must be a positive integer");
}

// Once checked only after both training runs.
TEST(Cli, TrainChecksOutputPathsBeforeAnyWork) {
  expect_refused(kTiny + "--plot /nonexistent/memory.svg", 2, "--plot: the folder '/nonexistent'");
  expect_refused(kTiny + "--json " + work_path(""), 2, "--json: '");
  expect_refused(kTiny + "--trace /proc/1/trace.json", 2, "is not writable");
}

// Issue 45, item 11: a file that can't be written whole (a full disk: /dev/full) fails the run,
// after the training, with the option's name; a device is written into, never replaced.
TEST(Cli, OutputsThatCannotBeWrittenFail) {
  if (access("/dev/full", W_OK) != 0) GTEST_SKIP() << "no writable /dev/full here";
  for (const std::string option : {"--json", "--trace", "--chain"}) {
    const Result result = run(kTiny + "--strategy sequential:2 " + option + " /dev/full");
    EXPECT_EQ(result.code, 1) << option << "\n" << result.err;
    EXPECT_NE(result.err.find(option + ": cannot write '/dev/full'"), std::string::npos)
        << result.err;
  }
  const Result bench = run("bench --quick --no-python --models mlp --json /dev/full");
  EXPECT_EQ(bench.code, 1) << bench.err;
  EXPECT_NE(bench.err.find("--json: cannot write '/dev/full'"), std::string::npos) << bench.err;
  struct stat status {};
  ASSERT_EQ(stat("/dev/full", &status), 0);
  EXPECT_TRUE(S_ISCHR(status.st_mode)) << "/dev/full was replaced";
}

TEST(Cli, TrainCorpusErrorsSayWhatIsWrong) {
  expect_refused(kTiny + "--corpus /dev/null", 1, "is not a regular file or a folder");
  expect_refused(kTiny + "--corpus /nonexistent/text", 1, "does not exist");
  const std::string path = work_path("short_corpus.txt");
  std::ofstream(path) << "tiny";
  expect_refused(kTiny + "--corpus " + path, 1, "holds 4 characters, fewer than the 18");
}

// The reentrant variant is a strategy of the benchmarks (models/strategy.h), but on the GPT it
// would train no parameter of the first segment: the loss curves differ.
TEST(Cli, TrainRefusesTheReentrantVariant) {
  expect_refused(kTiny + "--strategy sequential_reentrant:2", 2,
                 "--strategy sequential_reentrant:2: the reentrant variant would leave");
}

// Offloaded regions refuse host data (nothing to offload to): one line before any run.
TEST(Cli, TrainRefusesOffloadingOnTheCpu) {
  expect_refused(kTiny + "--strategy offload", 2,
                 "--strategy offload: offloading moves activations from an accelerator to host "
                 "memory, and --device cpu has none; use --device emulated or --device cuda");
  expect_refused(kTiny + "--strategy offload:2 --device cpu", 2, "--strategy offload:2: ");
}

TEST(Cli, TrainRejectsUnknownStrategy) {
  const Result result = run(kTiny + "--strategy magic");
  EXPECT_EQ(result.code, 2);
  EXPECT_NE(result.err.find("unknown strategy 'magic'"), std::string::npos) << result.err;
}

// Issue 45, item 15: an empty K after the colon was read as "one region per stage".
TEST(Cli, TrainRejectsAnEmptySegmentCount) {
  expect_refused(kTiny + "--strategy offload:", 2, "offload:K needs a number of segments K");
  expect_refused(kTiny + "--strategy selective:", 2, "selective:K needs a number of segments K");
}

TEST(Cli, BenchRejectsAModelNamedTwice) {
  expect_refused("bench --quick --no-python --models mlp,mlp", 2, "'mlp' is named twice");
}

TEST(Cli, TrainRejectsNonPositiveSizes) {
  for (const char* option : {"--layers 0", "--width -1", "--batch 0", "--steps 0", "--context 0"}) {
    const Result result = run(kTiny + option);
    EXPECT_EQ(result.code, 2) << option;
    EXPECT_NE(result.err.find("must be a positive integer"), std::string::npos) << result.err;
  }
}

TEST(Cli, TrainRejectsHeadsNotDividingWidth) {
  const Result result = run(kTiny + "--heads 3");
  EXPECT_EQ(result.code, 2);
  EXPECT_NE(result.err.find("must divide --width"), std::string::npos) << result.err;
}

TEST(Cli, TrainRejectsSegmentsOutOfRange) {
  const Result result = run(kTiny + "--strategy sequential:9");
  EXPECT_EQ(result.code, 2);
  EXPECT_NE(result.err.find("number of stages"), std::string::npos) << result.err;
}

TEST(Cli, TrainRejectsBadBudgetPercentage) {
  const Result result = run(kTiny + "--strategy budget:150%");
  EXPECT_EQ(result.code, 2);
  EXPECT_NE(result.err.find("(0, 100]"), std::string::npos) << result.err;
}

TEST(Cli, TrainInfeasibleBudgetNamesTheSmallestFeasible) {
  const Result result = run(kTiny + "--strategy budget:1KiB");
  EXPECT_EQ(result.code, 2) << result.out;
  EXPECT_NE(result.err.find("ckpt: error: --strategy budget:1KiB"), std::string::npos)
      << result.err;
  EXPECT_NE(result.err.find("smallest"), std::string::npos) << result.err;
}

// ~~~ train: runs ~~~

TEST(Cli, TrainTinyRunHasIdenticalLossCurves) {
  const std::string json_path = work_path("tiny_train.json");
  const std::string plot_path = work_path("tiny_train.svg");
  const std::string trace_path = work_path("tiny_train_trace.json");
  const Result result = run(kTiny + "--strategy sequential:2 --json " + json_path + " --plot " +
                            plot_path + " --trace " + trace_path);
  ASSERT_EQ(result.code, 0) << result.err;
  EXPECT_NE(result.out.find("identical, bit for bit"), std::string::npos) << result.out;
  EXPECT_NE(result.err.find("step 4/4"), std::string::npos) << result.err;

  const json summary = json::parse(read_text(json_path));
  EXPECT_EQ(summary["strategy"], "sequential:2");
  EXPECT_TRUE(summary["identical_losses"].get<bool>());
  for (const char* run_name : {"baseline", "checkpointed"}) {
    const json& run_json = summary[run_name];
    EXPECT_GT(run_json["peak_bytes"].get<int64_t>(), 0);
    EXPECT_GT(run_json["step_ms"].get<double>(), 0);
    EXPECT_EQ(run_json["losses"].size(), 4u);
  }
  EXPECT_EQ(summary["baseline"]["losses"], summary["checkpointed"]["losses"]);
  EXPECT_LT(summary["checkpointed"]["peak_bytes"].get<int64_t>(),
            summary["baseline"]["peak_bytes"].get<int64_t>());

  const std::string svg = read_text(plot_path);
  EXPECT_NE(svg.find("<svg"), std::string::npos);
  EXPECT_NE(svg.find("polyline"), std::string::npos);
  EXPECT_NE(svg.find("sequential:2"), std::string::npos);

  const json trace = json::parse(read_text(trace_path));
  std::set<std::string> categories, phases;
  for (const json& event : trace["traceEvents"]) {
    phases.insert(event["ph"].get<std::string>());
    if (event.contains("cat")) categories.insert(event["cat"].get<std::string>());
  }
  for (const char* category : {"forward", "recompute", "backward"}) {
    EXPECT_TRUE(categories.count(category)) << category;
  }
  EXPECT_TRUE(phases.count("C"));
  EXPECT_TRUE(phases.count("X"));
}

// Issue 32: a model that is not a chain, planned by PlannedModel, trains like the plain run.
TEST(Cli, TrainUnetPlansWithinTheBudgetWithIdenticalLosses) {
  const std::string json_path = work_path("unet_train.json");
  const Result result =
      run("train --model unet --steps 2 --batch 2 --threads 1 "
          "--strategy budget:70% --json " +
          json_path);
  ASSERT_EQ(result.code, 0) << result.err;
  EXPECT_NE(result.out.find("losses identical to the plain run's: yes"), std::string::npos)
      << result.out;
  const json summary = json::parse(read_text(json_path));
  EXPECT_EQ(summary["model"], "unet");
  EXPECT_TRUE(summary["identical_losses"].get<bool>());
  EXPECT_EQ(summary["baseline"]["losses"], summary["checkpointed"]["losses"]);
  const auto peak = summary["checkpointed"]["peak_bytes"].get<int64_t>();
  const auto predicted = summary["predicted_peak_bytes"].get<int64_t>();
  EXPECT_LE(peak, summary["budget_bytes"].get<int64_t>());
  EXPECT_NEAR(static_cast<double>(peak), static_cast<double>(predicted), 0.02 * predicted);
  EXPECT_LT(peak, summary["baseline"]["peak_bytes"].get<int64_t>());
}

TEST(Cli, TrainUnetRefusesWhatItCannotRun) {
  const std::string unet = "train --model unet --steps 1 --batch 1 ";
  expect_refused(unet + "--strategy sequential:2", 2, "--model unet runs none or budget:B");
  expect_refused(unet + "--strategy budget:lots", 2, "--strategy budget:lots");
  expect_refused(unet + "--batch 100000", 2, "--batch must be in [1, 1024]");
  expect_refused(unet + "--plot x.svg", 2, "--plot is for --model gpt");
  expect_refused("train --model resnet", 2, "--model");
  // Issue 45, item 15: a budget no plan fits is a usage error, as with --model gpt (it was 1).
  const Result infeasible = run(unet + "--strategy budget:1KiB", "timeout 60");
  EXPECT_EQ(infeasible.code, 2) << infeasible.err;
  EXPECT_NE(infeasible.err.find("--strategy budget:1KiB: "), std::string::npos) << infeasible.err;
  EXPECT_NE(infeasible.err.find("the smallest feasible budget"), std::string::npos)
      << infeasible.err;
}

// Issue 45, item 15: an empty value is refused by every command (it was read as "not given"), and
// an output file that can't be made is refused before any training (it trained, then failed).
TEST(Cli, EmptyValuesAndPathsWhereNoFileCanBeMadeAreRefusedAtOnce) {
  expect_refused(kTiny + "--trace ''", 2, "--trace: an empty value");
  expect_refused(kTiny + "--json ''", 2, "--json: an empty value");
  expect_refused("plan --chain " + std::string(CKPT_SOURCE_DIR) +
                     "/data/chains/homogeneous.json --budget min --host-budget ''",
                 2, "--host-budget: an empty value");
  expect_refused("bench --quick --no-python --models ''", 2, "--models: an empty value");
  expect_refused(kTiny + "--trace /proc/version", 2, "--trace: ");
}

// Issue 29, item 7: with --trace, each run's peak is broken down by kind and by label, in the
// summary, the JSON and the trace; the parts sum to the peak, and the parameters and the AdamW
// state (two tensors per parameter) are those of the model, tied head counted once.
TEST(Cli, TrainTraceShowsWhatIsLiveAtEachRunsPeak) {
  const std::string json_path = work_path("tiny_peak.json");
  const std::string trace_path = work_path("tiny_peak_trace.json");
  const Result result =
      run(kTiny + "--strategy sequential:2 --json " + json_path + " --trace " + trace_path);
  ASSERT_EQ(result.code, 0) << result.err;
  EXPECT_NE(result.out.find("what is live at each run's peak"), std::string::npos) << result.out;
  EXPECT_NE(result.out.find("checkpointing can lower only the activations"), std::string::npos)
      << result.out;
  const json summary = json::parse(read_text(json_path));
  const int64_t width = 32, context = 16, vocabulary = summary["config"]["vocabulary"];
  const int64_t block = 12 * width * width + 13 * width;
  const int64_t parameters = vocabulary * width + context * width + 2 * block + 2 * width;
  for (const char* run_name : {"baseline", "checkpointed"}) {
    SCOPED_TRACE(run_name);
    const json& peak = summary[run_name]["peak_breakdown"];
    ASSERT_TRUE(peak.is_object()) << summary[run_name].dump();
    int64_t sum = peak["parameters_bytes"].get<int64_t>() + peak["gradients_bytes"].get<int64_t>() +
                  peak["optimizer_state_bytes"].get<int64_t>() + peak["other_bytes"].get<int64_t>();
    std::set<std::string> labels;
    for (const json& entry : peak["labels"]) {
      sum += entry["bytes"].get<int64_t>();
      labels.insert(entry["label"].get<std::string>());
    }
    EXPECT_EQ(sum, peak["peak_bytes"].get<int64_t>());
    EXPECT_EQ(peak["above_step_start_bytes"], summary[run_name]["peak_bytes"]);
    EXPECT_EQ(peak["parameters_bytes"].get<int64_t>(), 4 * parameters);
    EXPECT_EQ(peak["optimizer_state_bytes"].get<int64_t>(), 2 * 4 * parameters);
    EXPECT_LE(peak["gradients_bytes"].get<int64_t>(), 4 * parameters);
    EXPECT_GT(peak["activations_bytes"].get<int64_t>(), 0);
    EXPECT_FALSE(peak["where"].get<std::string>().empty());
    // The plain run peaks in the backward with block 1's activations live; the checkpointed one
    // in the backward of its first region (of two), whose recompute is live.
    if (run_name == std::string("baseline")) {
      EXPECT_TRUE(labels.count("forward/block 1")) << peak.dump();
    } else {
      EXPECT_EQ(peak["where"].get<std::string>().rfind("forward/region 1/recompute/", 0), 0u)
          << peak.dump();
    }
  }
  const json trace = json::parse(read_text(trace_path));
  std::set<int> peaks;
  for (const json& event : trace["traceEvents"]) {
    if (event["ph"] != "i") continue;
    EXPECT_EQ(event["name"], "memory peak");
    EXPECT_GT(event["args"]["peak_bytes"].get<int64_t>(), 0);
    peaks.insert(event["pid"].get<int>());
  }
  EXPECT_EQ(peaks, (std::set<int>{1, 2}));
}

TEST(Cli, TrainTinyPlannedRunHasIdenticalLossCurves) {
  const std::string json_path = work_path("tiny_planned.json");
  const Result result =
      run(kTiny + "--strategy budget:80% --dropout 0.2 --untied --json " + json_path);
  ASSERT_EQ(result.code, 0) << result.err;
  const json summary = json::parse(read_text(json_path));
  EXPECT_TRUE(summary["identical_losses"].get<bool>()) << result.out;
  EXPECT_TRUE(summary["checkpointed"].contains("schedule"));
  EXPECT_GT(summary["checkpointed"]["budget_bytes"].get<int64_t>(), 0);
}

// Selective checkpointing per block (issue 9): the same losses, less memory than no checkpointing
// and more than full recomputation; the planner's profile offers the "selective" option.
TEST(Cli, TrainSelectiveKeepsMatrixProductsBetweenNoneAndFullRecompute) {
  const std::string selective_path = work_path("tiny_selective.json");
  const std::string full_path = work_path("tiny_full.json");
  const Result selective =
      run(kTiny + "--dropout 0.2 --strategy selective --json " + selective_path);
  ASSERT_EQ(selective.code, 0) << selective.err;
  const Result full = run(kTiny + "--dropout 0.2 --strategy sequential:4 --json " + full_path);
  ASSERT_EQ(full.code, 0) << full.err;
  const json with_policy = json::parse(read_text(selective_path));
  const json recompute_all = json::parse(read_text(full_path));
  EXPECT_TRUE(with_policy["identical_losses"].get<bool>()) << selective.out;
  const int64_t kept = with_policy["checkpointed"]["peak_bytes"].get<int64_t>();
  EXPECT_LT(kept, with_policy["baseline"]["peak_bytes"].get<int64_t>());
  EXPECT_GT(kept, recompute_all["checkpointed"]["peak_bytes"].get<int64_t>());

  const std::string planned_path = work_path("tiny_planned_selective.json");
  // The smallest budget: this tiny model's parameter gradients outweigh its activations.
  const Result planned = run(kTiny + "--strategy budget:min --json " + planned_path);
  ASSERT_EQ(planned.code, 0) << planned.err;
  const json planned_summary = json::parse(read_text(planned_path));
  int selective_options = 0;
  for (const json& stage : planned_summary["checkpointed"]["profile"]["stages"]) {
    for (const json& option : stage.value("alternatives", json::array())) {
      selective_options += option.value("name", "") == "selective";
    }
  }
  EXPECT_GT(selective_options, 0);
}

// Issue 28, item 1: --storage-modes selects from the storage-mode table; the profile offers only
// the modes named, and a name the table lacks exits 2 naming those it has.
TEST(Cli, TrainStorageModesComeFromTheTable) {
  const auto option_names = [](const json& summary) {
    std::set<std::string> names;
    for (const json& stage : summary["checkpointed"]["profile"]["stages"]) {
      for (const json& option : stage.value("alternatives", json::array())) {
        names.insert(option.value("name", ""));
      }
    }
    return names;
  };
  const std::string only_path = work_path("tiny_planned_checkpointed_only.json");
  const Result only =
      run(kTiny + "--strategy budget:min --storage-modes checkpointed --json " + only_path);
  ASSERT_EQ(only.code, 0) << only.err;
  EXPECT_EQ(option_names(json::parse(read_text(only_path))), std::set<std::string>{"checkpointed"});
  const std::string none_path = work_path("tiny_planned_no_modes.json");
  const Result none = run(kTiny + "--strategy budget:min --storage-modes none --json " + none_path);
  ASSERT_EQ(none.code, 0) << none.err;
  EXPECT_TRUE(option_names(json::parse(read_text(none_path))).empty());
  expect_refused(kTiny + "--storage-modes checkpointed,offload", 2,
                 "--storage-modes: unknown storage mode 'offload' in 'checkpointed,offload'; the "
                 "modes are: checkpointed, two_pass, selective, offloaded (or none)");
  expect_refused("bench --quick --storage-modes selective,selective", 2,
                 "storage mode named twice: 'selective'");
}

// Issue 33, item 6: --report prints what the strategy run's regions keep after its first step,
// one region per checkpointed stage under `selective`, and --json carries the same report; the
// plain run has none, and a run without --report prints and writes nothing of it.
TEST(Cli, TrainReportShowsWhatEachRegionKeeps) {
  const std::string json_path = work_path("tiny_report.json");
  const Result result = run(kTiny + "--strategy selective --report --json " + json_path);
  ASSERT_EQ(result.code, 0) << result.err;
  EXPECT_NE(result.out.find("what the first step of the selective run keeps for its backward "
                            "(--report):\nkept for the backward: "),
            std::string::npos)
      << result.out;
  EXPECT_NE(result.out.find("forward/region 1 (selective): kept"), std::string::npos) << result.out;
  const json summary = json::parse(read_text(json_path));
  EXPECT_FALSE(summary["baseline"].contains("kept_report"));
  const json& report = summary["checkpointed"]["kept_report"];
  // --layers 2: the embedding and two blocks (checkpoint_sequential runs the head plainly).
  ASSERT_EQ(report["regions"].size(), 3u);
  int64_t kept = 0;
  bool kept_product = false;
  for (const json& region : report["regions"]) {
    EXPECT_EQ(region["mode"], "selective");
    kept += region["kept_bytes"].get<int64_t>();
    for (const json& entry : region["entries"]) {
      kept_product |= entry["decision"] == "kept" &&
                      entry["why"].get<std::string>().rfind("the policy saves it", 0) == 0;
    }
  }
  EXPECT_TRUE(kept_product);
  EXPECT_GT(kept, 0);
  EXPECT_EQ(report["kept_bytes"].get<int64_t>(), kept);

  const Result plain = run(kTiny + "--strategy selective");
  ASSERT_EQ(plain.code, 0) << plain.err;
  EXPECT_EQ(plain.out.find("--report"), std::string::npos) << plain.out;
}

// Issue 45, item 13: the report of an offloading run lists each offloaded region and what it
// moved to host memory (it printed "0 B in 0 regions").
TEST(Cli, TrainReportListsWhatOffloadedRegionsMove) {
  if (!CKPT_EMULATED_DEVICE_HOOKS) GTEST_SKIP() << "the emulated device needs LibTorch 2.9+";
  const std::string json_path = work_path("tiny_offload_report.json");
  const Result result =
      run(kTiny + "--device emulated --strategy offload --report --json " + json_path);
  ASSERT_EQ(result.code, 0) << result.err;
  EXPECT_NE(result.out.find("forward/region 1 (offloaded): kept"), std::string::npos) << result.out;
  const json report = json::parse(read_text(json_path))["checkpointed"]["kept_report"];
  ASSERT_EQ(report["regions"].size(), 3u);  // as checkpoint_sequential's regions
  int64_t offloaded = 0;
  for (const json& region : report["regions"]) {
    EXPECT_EQ(region["mode"], "offloaded");
    EXPECT_GT(region["offloaded_bytes"].get<int64_t>(), 0);
    offloaded += region["offloaded_bytes"].get<int64_t>();
    for (const json& entry : region["entries"]) {
      if (entry["decision"] != "offloaded") continue;
      EXPECT_EQ(entry["what"].get<std::string>().rfind("aten::", 0), 0u) << entry.dump();
    }
  }
  EXPECT_EQ(report["offloaded_bytes"].get<int64_t>(), offloaded);
}

// Under a planned strategy each stage of the first step's forward has its report, named after
// the stage, with the storage the schedule gives it.
TEST(Cli, TrainReportOfAPlannedRunNamesEachStage) {
  const std::string json_path = work_path("tiny_planned_report.json");
  const Result result = run(kTiny + "--strategy budget:min --report --json " + json_path);
  ASSERT_EQ(result.code, 0) << result.err;
  const json summary = json::parse(read_text(json_path));
  std::set<std::string> stages;
  for (const json& region : summary["checkpointed"]["kept_report"]["regions"]) {
    stages.insert(region["stage"].get<std::string>());
  }
  EXPECT_EQ(stages, (std::set<std::string>{"stage 0", "stage 1", "stage 2", "stage 3"}));
  expect_refused(kTiny + "--report --ranks 2", 2,
                 "--report prints what a single-process run keeps; leave out --ranks");
}

// Issue 11, item 5: a budget below the smallest feasible one names it and the way to ask for it.
TEST(Cli, TrainBudgetMinRunsAndAnInfeasibleBudgetNamesIt) {
  const std::string json_path = work_path("train_min.json");
  const Result result = run(kTiny + "--strategy budget:min --json " + json_path);
  ASSERT_EQ(result.code, 0) << result.err;
  const json summary = json::parse(read_text(json_path));
  EXPECT_TRUE(summary["identical_losses"].get<bool>());
  EXPECT_LT(summary["peak_ratio"].get<double>(), 1.0);
  const Result refused = run(kTiny + "--strategy budget:1%");
  EXPECT_EQ(refused.code, 2);
  EXPECT_NE(refused.err.find("smallest feasible budget of this model is"), std::string::npos)
      << refused.err;
  EXPECT_NE(refused.err.find("--strategy budget:min"), std::string::npos) << refused.err;
}

// Starts ckpt in the background and sends it one SIGINT, as a terminal's Ctrl-C does, once its
// first step is printed: its handler is installed by then, whatever the machine's load (a fixed
// delay raced with the program's start). At most 60 s of waiting.
Result run_and_interrupt(const std::string& args) {
  const std::string err_path = work_path("stderr_interrupted");
  // The old file goes first: the loop may look before the background job opens it anew.
  const std::string command =
      "rm -f " + err_path + "; OMP_NUM_THREADS=1 " + std::string(CKPT_CLI_BINARY) + " " + args +
      " 2>" + err_path + " & pid=$!; i=0; " + "while [ $i -lt 1200 ] && ! grep -q 'step 1/' " +
      err_path + " 2>/dev/null; do sleep 0.05; i=$((i+1)); done; " + "kill -INT $pid; wait $pid";
  return run_shell(command, err_path);
}

TEST(Cli, TrainCtrlCStopsWithSummary) {
  const Result result = run_and_interrupt(
      "train --layers 2 --width 32 --heads 2 --context 16 --batch 4 --steps 1000000 "
      "--threads 1 --strategy sequential:2");
  EXPECT_EQ(result.code, 130) << result.err;
  EXPECT_NE(result.err.find("interrupted"), std::string::npos) << result.err;
  EXPECT_NE(result.out.find("no checkpoint"), std::string::npos) << result.out;
}

// ~~~ bench ~~~

TEST(Cli, TrainWritesTheMeasuredChainForPlan) {
  const std::string path = work_path("measured_chain.json");
  const Result result = run(kTiny + "--strategy sequential:2 --chain " + path);
  ASSERT_EQ(result.code, 0) << result.err;
  const json plan = plan_json("--chain " + path + " --budget 80%");
  EXPECT_EQ(plan["stages"].get<int>(), 4);  // embedding, 2 blocks, head
  EXPECT_TRUE(plan["feasible"].get<bool>()) << plan.dump();
}

TEST(Cli, BenchQuickRunPrintsTheTables) {
  const std::string path = work_path("bench.json");
  const Result result = run("bench --quick --no-python --json " + path);
  ASSERT_EQ(result.code, 0) << result.err;
  EXPECT_NE(result.out.find("| none |"), std::string::npos) << result.out;
  EXPECT_NE(result.out.find("ckpt_planned"), std::string::npos);
  const json rows = json::parse(read_text(path))["rows"];
  EXPECT_GT(rows.size(), 10u);
}

TEST(Cli, BenchPlotDrawsEachModelsCurves) {
  const std::string path = work_path("bench.svg");
  const Result result = run("bench --quick --no-python --models mlp --plot " + path);
  ASSERT_EQ(result.code, 0) << result.err;
  const std::string svg = read_text(path);
  EXPECT_NE(svg.find("mlp: step time against peak memory"), std::string::npos);
  for (const char* series :
       {"checkpoint_sequential, every segment count", "PlannedSequential, measured",
        "optimum, predicted from the profile"}) {
    EXPECT_NE(svg.find(series), std::string::npos) << series;
  }
  // Every count from 2 to L: the quick MLP has 16 stages.
  EXPECT_NE(result.out.find("| ckpt_sequential | segments=7 |"), std::string::npos) << result.out;
}

TEST(Cli, BenchChecksOutputPathsBeforeAnyWork) {
  const Result result = run("bench --quick --no-python --plot /nonexistent/bench.svg");
  EXPECT_EQ(result.code, 2);
  EXPECT_NE(result.err.find("--plot: the folder '/nonexistent'"), std::string::npos) << result.err;
  EXPECT_EQ(result.out.find("| none |"), std::string::npos);  // nothing ran
}

// Issue 27, item 8: `train` capped --threads, `bench` did not, and crashed 16-23 s later.
TEST(Cli, BenchRefusesMoreThreadsThanTheMachineHas) {
  expect_refused("bench --quick --no-python --threads 100000", 2, "--threads must be at most");
}

// Issue 27, item 16: a device LibTorch can't parse printed a backtrace and exited with 1.
TEST(Cli, BenchRefusesDevicesItCannotUse) {
  expect_refused("bench --quick --no-python --device foo/cuda", 2,
                 "--device 'foo/cuda' is not a device");
  expect_refused("bench --quick --no-python --device cuda:99", 2, "--device cuda:99: this machine");
  expect_refused("bench --quick --no-python --device meta", 2,
                 "ckpt runs on cpu, cuda[:N] or emulated[:N] only");
}

// The options `ckpt bench` took over from compare_bench, the comparison's former own program.
TEST(Cli, BenchHelpListsTheOptionsOfTheFormerCompareBench) {
  const Result result = run("bench --help");
  EXPECT_EQ(result.code, 0);
  for (const char* option : {"--no-planned", "--no-rss", "--resnet-no-batchnorm", "--python",
                             "--script", "--offload-summary"}) {
    EXPECT_NE(result.out.find(option), std::string::npos) << option << "\n" << result.out;
  }
}

// Offloading moves activations from an accelerator to host memory: on the CPU there is no
// summary to write, said before any work.
TEST(Cli, BenchOffloadSummaryNeedsAnAccelerator) {
  expect_refused(
      "bench --quick --no-python --models mlp --offload-summary " + work_path("offload_cpu.md"), 2,
      "--offload-summary: offloading moves activations from an accelerator");
  expect_refused("bench --quick --no-python --models mlp --device cpu --offload-summary " +
                     work_path("offload_cpu.md"),
                 2, "use --device cuda or --device emulated");
}

TEST(Cli, BenchChecksTheOffloadSummaryPathBeforeAnyWork) {
  if (!CKPT_EMULATED_DEVICE_HOOKS) GTEST_SKIP() << "the emulated device needs LibTorch 2.9+";
  expect_refused(
      "bench --quick --no-python --models mlp --device emulated --offload-summary "
      "/nonexistent/offload.md",
      2, "--offload-summary: the folder '/nonexistent'");
  expect_refused(
      "bench --quick --no-python --models mlp --device emulated --offload-summary " + work_path(""),
      2, "--offload-summary: '");
}

// A script that isn't there would only show as a skipped Python run, minutes later.
TEST(Cli, BenchRefusesAScriptThatIsNoFile) {
  expect_refused("bench --quick --no-python --models mlp --script /nonexistent/torch_checkpoint.py",
                 2, "--script: '/nonexistent/torch_checkpoint.py' does not exist");
  expect_refused("bench --quick --no-python --models mlp --script " + std::string(CKPT_SOURCE_DIR),
                 2, "' is not a regular file");
}

// --no-rss: no row has an RSS figure; --resnet-no-batchnorm is taken (the MLP has no BatchNorm).
TEST(Cli, BenchWithoutRssMeasuresNoRss) {
  const std::string path = work_path("bench_no_rss.json");
  const Result result = run(
      "bench --quick --no-python --models mlp --no-planned --no-rss --resnet-no-batchnorm --json " +
      path);
  ASSERT_EQ(result.code, 0) << result.err;
  const json rows = json::parse(read_text(path))["rows"];
  ASSERT_FALSE(rows.empty());
  for (const json& row : rows) {
    EXPECT_EQ(row["rss_memory_ratio"].get<double>(), 0.0) << row.dump();
    EXPECT_NE(row["method"].get<std::string>(), "ckpt_planned") << row.dump();
  }
}

// ~~~ --device: the emulated accelerator (LibTorch 2.9+) ~~~

// Both runs of `ckpt train --device emulated[:N]` on the device: the same loss bits, with dropout,
// for the default variant, the reentrant one, a selective policy and a planned schedule; device
// memory measured (the checkpointed peak below the plain one).
json train_on_device(const std::string& strategy, const std::string& device,
                     const std::string& extra = "") {
  const std::string json_path = work_path("device_" + strategy.substr(0, strategy.find(':')) + "_" +
                                          device.substr(device.find(':') + 1) + ".json");
  const Result result = run(kTiny + "--dropout 0.2 --strategy " + strategy + " --device " + device +
                            " --json " + json_path + " " + extra);
  EXPECT_EQ(result.code, 0) << result.err;
  EXPECT_NE(result.out.find("device:   " + device), std::string::npos) << result.out;
  return json::parse(read_text(json_path));
}

void expect_same_losses_and_less_memory(const json& summary) {
  EXPECT_TRUE(summary["identical_losses"].get<bool>())
      << summary["baseline"]["losses"] << " " << summary["checkpointed"]["losses"];
  EXPECT_EQ(summary["baseline"]["losses"].size(), 4u);
  EXPECT_GT(summary["baseline"]["peak_bytes"].get<int64_t>(), 0);
  EXPECT_LT(summary["checkpointed"]["peak_bytes"].get<int64_t>(),
            summary["baseline"]["peak_bytes"].get<int64_t>());
}

TEST(Cli, TrainOnTheEmulatedDeviceHasThePlainRunsLosses) {
  if (!CKPT_EMULATED_DEVICE_HOOKS) GTEST_SKIP() << "the emulated device needs LibTorch 2.9+";
  const json sequential = train_on_device("sequential:2", "emulated:1");
  expect_same_losses_and_less_memory(sequential);
  EXPECT_EQ(sequential["config"]["device"], "emulated:1");
  expect_same_losses_and_less_memory(train_on_device("selective", "emulated:0"));
  expect_same_losses_and_less_memory(train_on_device("budget:min", "emulated"));
}

// Every stage but the last an offloaded region, and two segments: the saved activations go to
// host memory and come back, with the plain run's loss bits.
TEST(Cli, TrainOffloadedOnTheEmulatedDeviceHasThePlainRunsLosses) {
  if (!CKPT_EMULATED_DEVICE_HOOKS) GTEST_SKIP() << "the emulated device needs LibTorch 2.9+";
  const json per_stage = train_on_device("offload", "emulated");
  expect_same_losses_and_less_memory(per_stage);
  EXPECT_EQ(per_stage["strategy"], "offload");
  expect_same_losses_and_less_memory(train_on_device("offload:2", "emulated:1"));
}

// The instrumented step samples the device's memory; the chain is profiled on the device.
TEST(Cli, TrainOnTheEmulatedDeviceDrawsItsMemory) {
  if (!CKPT_EMULATED_DEVICE_HOOKS) GTEST_SKIP() << "the emulated device needs LibTorch 2.9+";
  const std::string plot_path = work_path("device_memory.svg");
  const std::string chain_path = work_path("device_chain.json");
  const json summary = train_on_device("sequential:3", "emulated:0",
                                       "--plot " + plot_path + " --chain " + chain_path);
  EXPECT_TRUE(summary["identical_losses"].get<bool>());
  EXPECT_NE(read_text(plot_path).find("polyline"), std::string::npos);
  const json measured = json::parse(read_text(chain_path));
  ASSERT_EQ(measured["stages"].size(), 4u);
  EXPECT_GT(measured["stages"][1]["saved_bytes"].get<int64_t>(), 0);
}

TEST(Cli, TrainRefusesDevicesItCannotUse) {
  expect_refused(kTiny + "--device foo/bar", 2, "--device 'foo/bar' is not a device");
  expect_refused(kTiny + "--device meta", 2, "ckpt runs on cpu, cuda[:N] or emulated[:N] only");
  expect_refused(kTiny + "--device cuda:99", 2, "--device cuda:99: ");
  if (CKPT_EMULATED_DEVICE_HOOKS) {
    expect_refused(kTiny + "--device emulated:2", 2,
                   "--device emulated:2: there are 2 emulated device(s), emulated:0 to emulated:1");
    expect_refused(kTiny + "--device emulated --ranks 2", 2,
                   "data-parallel training (--ranks, --rank or the torchrun environment) runs on "
                   "the CPU only");
  } else {
    expect_refused(kTiny + "--device emulated", 2,
                   "--device emulated: the emulated device needs LibTorch 2.9 or later");
  }
}

TEST(Cli, BenchRunsOnTheEmulatedDevice) {
  if (!CKPT_EMULATED_DEVICE_HOOKS) GTEST_SKIP() << "the emulated device needs LibTorch 2.9+";
  const std::string path = work_path("bench_device.json");
  const Result result =
      run("bench --quick --no-python --models mlp --device emulated --json " + path);
  ASSERT_EQ(result.code, 0) << result.err;
  const json rows = json::parse(read_text(path))["rows"];
  int64_t none_peak = 0, smallest_peak = 0;
  for (const json& row : rows) {
    const int64_t peak = row["peak_bytes"].get<int64_t>();
    if (row["method"] == "none") none_peak = peak;
    if (peak > 0 && (smallest_peak == 0 || peak < smallest_peak)) smallest_peak = peak;
  }
  EXPECT_GT(none_peak, 0);
  EXPECT_LT(smallest_peak, none_peak);  // the device's memory, as checkpointing lowers it
}

TEST(Cli, BenchRejectsUnknownModel) {
  const Result result = run("bench --models mlp,teapot");
  EXPECT_EQ(result.code, 2);
  EXPECT_NE(result.err.find("teapot"), std::string::npos) << result.err;
}

}  // namespace
