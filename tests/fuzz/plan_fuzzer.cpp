// libFuzzer target for everything the planner reads from outside and computes from it: the chain
// JSON reader, byte and budget parsing, and the solvers on structured chains. Bad input must give
// std::invalid_argument (or std::length_error for tables over the limit); a valid chain must give
// schedules that keep the planner's invariants. Any other outcome aborts, which libFuzzer reports.
//
// The first byte picks the mode (its value modulo 3): 0, JSON text; 1, a size string; 2, a chain
// built field by field from the bytes (structure-aware, so that most inputs reach the solvers).

#include <ckpt/plan/bytes.h>
#include <ckpt/plan/chain.h>
#include <ckpt/plan/simulator.h>
#include <ckpt/plan/solvers.h>

#include "chain_json.h"

#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace {

using namespace ckpt::plan;

void require(bool condition, const char* invariant) {
  if (condition) return;
  std::fprintf(stderr, "plan_fuzzer: invariant broken: %s\n", invariant);
  std::abort();
}

// Every byte size the fuzzer may give: small ones mostly, the extremes sometimes.
int64_t size_from(FuzzedDataProvider& data) {
  switch (data.ConsumeIntegralInRange(0, 7)) {
    case 0:
      return data.ConsumeIntegral<int64_t>();
    case 1:
      return int64_t{1} << data.ConsumeIntegralInRange(40, 62);
    default:
      return data.ConsumeIntegralInRange<int64_t>(0, 4096);
  }
}

double time_from(FuzzedDataProvider& data) {
  switch (data.ConsumeIntegralInRange(0, 7)) {
    case 0:
      return data.ConsumeFloatingPoint<double>();  // NaN, infinities, huge, negative
    default:
      return data.ConsumeFloatingPointInRange(0.0, 100.0);
  }
}

Chain chain_from(FuzzedDataProvider& data) {
  Chain chain;
  chain.input_bytes = size_from(data);
  const int length = data.ConsumeIntegralInRange(0, 10);
  for (int i = 0; i < length; ++i) {
    Stage stage;
    stage.forward_time = time_from(data);
    stage.backward_time = time_from(data);
    stage.output_bytes = size_from(data);
    // Mostly at least the output (as valid chains have it), sometimes one byte short of it.
    const int64_t extra = data.ConsumeIntegralInRange<int64_t>(-1, 4096);
    const bool addable = stage.output_bytes > INT64_MIN && stage.output_bytes < INT64_MAX - 4096;
    stage.saved_bytes = addable ? stage.output_bytes + extra : stage.output_bytes;
    stage.forward_tmp_bytes = size_from(data);
    stage.backward_tmp_bytes = size_from(data);
    if (data.ConsumeBool()) stage.forward_all_tmp_bytes = size_from(data);
    if (data.ConsumeBool()) {
      StorageOption option{time_from(data), time_from(data), stage.output_bytes, 0,
                           size_from(data)};
      stage.alternatives.push_back(option);
    }
    if (data.ConsumeBool()) stage.gradient_bytes = size_from(data);
    chain.stages.push_back(stage);
  }
  return chain;
}

// The invariants of a valid chain: the smallest budget is exact and reachable, schedules fit the
// budgets they are solved for, more memory is never slower, and every fixed schedule is valid.
void check_planner(const Chain& chain, FuzzedDataProvider& data) {
  OptimalOptions options;
  options.slots = data.ConsumeIntegralInRange(1, 64);
  const int64_t min_budget = min_feasible_budget_bytes(chain, options);
  // Zero is a valid minimum: a chain whose stages hold no bytes in some storage option.
  require(min_budget >= chain.input_bytes && min_budget >= 0, "the minimum holds the input");
  const SimulationResult smallest = simulate(chain, solve_min_memory(chain, options));
  require(smallest.valid && smallest.peak_bytes == min_budget, "the minimum is reached exactly");
  const SimulationResult all = simulate(chain, solve_no_checkpoint(chain));
  require(all.valid && all.peak_bytes >= min_budget, "storing everything is valid");
  require(std::isfinite(all.time) && std::isfinite(smallest.time), "times are finite");
  for (int k = 1; k <= chain.size(); ++k) {
    require(simulate(chain, solve_uniform(chain, k)).valid, "uniform schedules are valid");
  }
  require(simulate(chain, solve_revolve(chain, data.ConsumeIntegralInRange(1, 8))).valid,
          "revolve schedules are valid");

  // Budgets are positive, even where the minimum is zero.
  const int64_t least = std::max<int64_t>(min_budget, 1);
  const int64_t top =
      std::max(all.peak_bytes, least) + data.ConsumeIntegralInRange<int64_t>(0, 1 << 20);
  const OptimalTable table(chain, top, options);
  require(table.min_feasible_budget_bytes() == min_budget, "the table knows the minimum");
  for (int probe = 0; probe < 4; ++probe) {
    const int64_t budget =
        data.ConsumeIntegralInRange<int64_t>(std::max<int64_t>(chain.input_bytes, 1), top);
    const auto schedule = table.solve(budget);
    require(schedule.has_value() == (budget >= min_budget), "a schedule exists from the minimum");
    if (!schedule) continue;
    const SimulationResult result = simulate(chain, *schedule);
    require(result.valid && result.peak_bytes <= budget, "a schedule fits its budget");
    require(std::isfinite(result.time), "a schedule's time is finite");
    // The exact program, bounded: when it finishes, it fits and is never slower than the table.
    const ExactSolution exact = solve_exact(chain, budget, 200000, options);
    if (exact.status == ExactSolution::Status::OverWorkLimit) continue;
    require(exact.schedule.has_value(), "the exact program answers every feasible budget");
    const SimulationResult exact_result = simulate(chain, *exact.schedule);
    require(exact_result.valid && exact_result.peak_bytes <= budget, "an exact schedule fits");
    require(exact_result.time <= result.time * (1 + 1e-12), "the exact optimum beats the table");
  }
  // The long-chain solver on a few groups: a schedule for every feasible budget, and it fits.
  const int64_t grouped_budget = data.ConsumeIntegralInRange<int64_t>(least, top);
  const auto grouped =
      solve_grouped(chain, grouped_budget, data.ConsumeIntegralInRange(1, chain.size()), options);
  require(grouped.has_value(), "the grouped solver answers every feasible budget");
  const SimulationResult grouped_result = simulate(chain, *grouped);
  require(grouped_result.valid && grouped_result.peak_bytes <= grouped_budget,
          "a grouped schedule fits its budget");

  const int64_t low = data.ConsumeIntegralInRange<int64_t>(least, top);
  const int64_t high = data.ConsumeIntegralInRange<int64_t>(low, top);
  require(table.time(high) <= table.time(low), "more memory is never slower");
}

void fuzz_json(const std::string& text) {
  try {
    const Chain chain = ckpt::cli::chain_from_text(text, "fuzz.json");
    chain.validate();  // what the reader returns is valid
    const Chain again = ckpt::cli::chain_from_json(ckpt::cli::chain_to_json(chain), "again");
    require(again.size() == chain.size() && again.input_bytes == chain.input_bytes,
            "a chain survives a round trip through JSON");
  } catch (const std::invalid_argument& error) {
    // Errors quote what they refuse, bounded: one line, never a whole value.
    require(std::string(error.what()).size() < 1000, "an error message stays short");
  }
}

void fuzz_bytes(const std::string& text) {
  try {
    const int64_t bytes = parse_bytes(text, "fuzz");
    require(bytes > 0 && bytes <= kMaxParsedBytes, "a parsed size is positive and in range");
  } catch (const std::invalid_argument& error) {
    require(std::string(error.what()).size() < 1000, "an error message stays short");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  if (size == 0) return 0;
  FuzzedDataProvider data(bytes + 1, size - 1);
  switch (bytes[0] % 3) {
    case 0:
      fuzz_json(data.ConsumeRemainingBytesAsString());
      break;
    case 1:
      fuzz_bytes(data.ConsumeRemainingBytesAsString());
      break;
    default: {
      const Chain chain = chain_from(data);
      try {
        chain.validate();
      } catch (const std::invalid_argument&) {
        return 0;
      }
      check_planner(chain, data);
    }
  }
  return 0;
}
