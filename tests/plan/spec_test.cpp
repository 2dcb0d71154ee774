// Tests of what people write to the planner (ckpt/plan/spec.h, bytes.h, excerpt.h): budgets,
// solver names, byte sizes, and how their errors quote the text they refuse.

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>

#include "ckpt/plan/bytes.h"
#include "ckpt/plan/excerpt.h"
#include "ckpt/plan/simulator.h"
#include "ckpt/plan/solvers.h"
#include "ckpt/plan/spec.h"
#include "plan_support.h"

namespace ckpt {
namespace plan {
namespace {

// The message of the std::invalid_argument `parse` throws (a failure when it throws none).
template <class Parse>
std::string refusal(const Parse& parse) {
  try {
    parse();
  } catch (const std::invalid_argument& error) {
    return error.what();
  }
  ADD_FAILURE() << "accepted";
  return "";
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Issue 27, item 10: PlannedSequential resolves "min" against a measured no-checkpoint peak, which
// can lie below the model's smallest feasible budget (659,456 B against 626,688 B for 100%).
TEST(BudgetTest, MinimumNeverExceedsTheNoCheckpointPeak) {
  EXPECT_EQ(Budget::minimum().resolve(626688, 659456), 626688);
  EXPECT_EQ(Budget::parse("min").resolve(626688, 659456),
            Budget::parse("100%").resolve(626688, 659456));
  EXPECT_EQ(Budget::minimum().resolve(1000, 77), 77);
}

// Storing everything is one of the schedules the min-max program searches: the planner's own
// minimum never exceeds the predicted no-checkpoint peak (alternatives, parameter gradients and
// separate grad-enabled temporaries included).
TEST(BudgetTest, PlannerMinimumNeverExceedsStoringEverything) {
  std::mt19937 rng(10);
  for (int trial = 0; trial < 200; ++trial) {
    const Chain chain = test::random_chain(rng, 1 + trial % 30, 1 << 20, trial % 3);
    const int64_t plain = simulate(chain, solve_no_checkpoint(chain)).peak_bytes;
    EXPECT_LE(min_feasible_budget_bytes(chain), plain) << "trial " << trial;
  }
}

// Issue 27, item 16: these are positive, only too large.
TEST(BudgetTest, TooLargeSaysSoWithTheLimit) {
  for (const char* text : {"9223372036854775807", "99999999999TiB", "9000000000000000001",
                           "99999999999999999999999"}) {
    const std::string message = refusal([&] { Budget::parse(text); });
    EXPECT_TRUE(contains(message, "too large: at most 9000000000000000000 bytes")) << message;
    EXPECT_FALSE(contains(message, "positive")) << message;
  }
  EXPECT_EQ(parse_bytes("9000000000000000000", "size"), kMaxParsedBytes);
}

TEST(BudgetTest, ReadsIntegersExactly) {
  // Past 2^53 a double would round this to ...992.
  EXPECT_EQ(parse_bytes("9007199254740993", "size"), int64_t{9007199254740993});
  EXPECT_EQ(parse_bytes(" 64 kB ", "size"), 64000);
  EXPECT_EQ(parse_bytes("1.5KiB", "size"), 1536);
  EXPECT_TRUE(contains(refusal([] { parse_bytes("0", "size"); }), "must be a positive size"));
  EXPECT_TRUE(contains(refusal([] { parse_bytes("1.5", "size"); }), "must be a positive size"));
}

// Past 2^53 a budget kept as a double would round 9007199254740993 bytes to ...992.
TEST(BudgetTest, KeepsBytesExactly) {
  const int64_t odd = 9007199254740993;
  EXPECT_EQ(Budget::bytes(odd).resolve(1, 1), odd);
  EXPECT_EQ(Budget::parse("9007199254740993").resolve(1, 1), odd);
}

// Each accessor holds one kind of budget, and asking the other kind says what to do instead.
TEST(BudgetTest, AccessorsSayWhatTheyHold) {
  EXPECT_EQ(Budget::parse("512MiB").bytes(), int64_t{512} << 20);
  EXPECT_TRUE(Budget::parse("512MiB").is_bytes());
  EXPECT_DOUBLE_EQ(Budget::parse("40%").fraction(), 0.4);
  EXPECT_FALSE(Budget::parse("40%").is_bytes());
  const auto message = [](const auto& ask) -> std::string {
    try {
      ask();
    } catch (const std::logic_error& error) {
      return error.what();
    }
    return "no error";
  };
  const std::string bytes_of_fraction = message([] { Budget::fraction(0.4).bytes(); });
  EXPECT_TRUE(contains(bytes_of_fraction, "a fraction of the no-checkpoint peak"))
      << bytes_of_fraction;
  EXPECT_TRUE(contains(bytes_of_fraction, "resolve()")) << bytes_of_fraction;
  EXPECT_TRUE(contains(message([] { Budget::minimum().bytes(); }), "asked of the minimum"));
  EXPECT_TRUE(
      contains(message([] { Budget::bytes(64).fraction(); }), "asked of a budget in bytes"));
}

TEST(SolverSpecTest, TooLargeCountSaysSo) {
  const std::string message = refusal([] { SolverSpec::parse("revolve:99999999999"); });
  EXPECT_TRUE(contains(message, "too large: at most 2147483647")) << message;
  EXPECT_TRUE(contains(refusal([] { SolverSpec::parse("uniform:-3"); }), "positive integer"));
}

// Issue 27, item 16: an error once echoed a whole 20 MB value.
TEST(ExcerptTest, ErrorsQuoteAtMostTheStartOfHugeValues) {
  const std::string huge(20'000'000, '7');
  for (const std::string& message :
       {refusal([&] { Budget::parse(huge + "%"); }), refusal([&] { Budget::parse(huge + "XB"); }),
        refusal([&] { SolverSpec::parse("magic" + huge); }),
        refusal([&] { SolverSpec::parse("uniform:" + huge + "x"); })}) {
    EXPECT_LT(message.size(), 400u) << message.substr(0, 400);
    EXPECT_TRUE(contains(message, "(20000")) << message;  // the length, in bytes
  }
}

TEST(ExcerptTest, QuotesShortTextWholeAndLongTextCut) {
  EXPECT_EQ(quote_excerpt("magic"), "\"magic\"");
  EXPECT_EQ(quote_excerpt(std::string(100, 'a'), 10), "\"aaaaaaaaaa...\" (100 bytes)");
  // Never half a UTF-8 character: "é" is 2 bytes, and 4 bytes would end inside the second.
  EXPECT_EQ(quote_excerpt("aé\xc3\xa9z", 4), "\"aé...\" (6 bytes)");
  // One line: control bytes escaped.
  EXPECT_EQ(quote_excerpt(std::string("a\nb\0c", 5)), "\"a\\x0Ab\\x00c\"");
}

}  // namespace
}  // namespace plan
}  // namespace ckpt
