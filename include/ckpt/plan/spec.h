#pragma once

// What a plan is asked for, as people write it: a memory budget ("512MiB", "40%", "min") and a
// solver ("optimal", "uniform:4", "revolve"). Parsed here once, for the library and the CLI.

#include <ckpt/plan/chain.h>
#include <ckpt/plan/schedule.h>
#include <ckpt/plan/simulator.h>
#include <ckpt/plan/solvers.h>

#include <cstdint>
#include <optional>
#include <string>

namespace ckpt {
namespace plan {

/// A memory budget for a chain: in bytes, as a fraction of the chain's no-checkpoint peak, or
/// the smallest budget any schedule of the chain fits in.
class Budget {
 public:
  /// An absolute budget. Throws std::invalid_argument unless `value` is positive.
  static Budget bytes(int64_t value);
  /// A fraction of the no-checkpoint peak; 0.4 means 40%. Throws std::invalid_argument unless
  /// `value` is in (0, 1].
  static Budget fraction(double value);
  /// The smallest feasible budget of the chain: the most memory saved, at the fastest schedule
  /// that saves it.
  static Budget minimum();
  /// Parses "123456", "512MB", "2GiB", "1.5GB" (bytes, decimal or binary units, see
  /// parse_bytes), "40%" or "min". Throws std::invalid_argument, quoting the text (at most its
  /// first 60 characters), for anything else.
  static Budget parse(const std::string& text);

  /// An absolute budget: Budget::bytes, or a size parsed.
  bool is_bytes() const { return kind_ == Kind::Bytes; }
  /// A fraction of the no-checkpoint peak: Budget::fraction, or a percentage parsed.
  bool is_fraction() const { return kind_ == Kind::Fraction; }
  /// The smallest feasible budget: Budget::minimum, or "min" parsed.
  bool is_minimum() const { return kind_ == Kind::Minimum; }
  /// The budget in bytes. Throws std::logic_error unless is_bytes(); resolve() gives any
  /// budget in bytes.
  int64_t bytes() const;
  /// The fraction of the no-checkpoint peak, 0.4 for 40%. Throws std::logic_error unless
  /// is_fraction().
  double fraction() const;
  /// The budget in bytes for a chain whose no-checkpoint peak is `no_checkpoint_peak_bytes` and
  /// whose smallest feasible budget is `smallest_feasible_bytes`. The minimum is the smaller of
  /// the two: storing everything is always a schedule, so the minimum never exceeds 100%, even
  /// where the peak was measured and the model predicts more.
  int64_t resolve(int64_t no_checkpoint_peak_bytes, int64_t smallest_feasible_bytes) const;

 private:
  enum class Kind { Bytes, Fraction, Minimum };
  Budget(Kind kind, int64_t bytes, double fraction)
      : kind_(kind), bytes_(bytes), fraction_(fraction) {}
  const char* kind_name() const;
  Kind kind_;
  int64_t bytes_;    // Kind::Bytes only; an integer, exact past 2^53
  double fraction_;  // Kind::Fraction only
};

/// A solver as written: "optimal" (the dynamic program), "uniform:K" (checkpoint_sequential with
/// K segments), "sqrt" (Chen's √n), "revolve:S" (Revolve with S slots), "none"; "uniform" and
/// "revolve" without a number stand for the fastest of their family that fits the budget.
struct SolverSpec {
  std::string name = "optimal";
  int count = 0;  // K or S; 0 when not given

  /// Throws std::invalid_argument for an unknown name, a count that is not a positive integer,
  /// or one above INT_MAX ("too large"); the message quotes at most 60 characters of `text`.
  static SolverSpec parse(const std::string& text);
  std::string to_string() const;
};

/// What a solver gives for a chain under a budget.
struct Plan {
  /// A schedule exists and its simulated peak fits the budget.
  bool feasible = false;
  /// Empty when the optimal solver finds none (the budget is below the smallest feasible one).
  /// The other solvers always give one, feasible or not.
  std::optional<Schedule> schedule;
  SimulationResult prediction;
  /// The solver as run: "uniform:4" for "uniform", which picks the best K.
  std::string solver;
  /// Why it is infeasible; empty otherwise. Where the budget fits a schedule with unlimited host
  /// memory but not within options.host_budget_bytes, it says so and gives the smallest host
  /// budget that works for this budget (min_host_budget_bytes).
  std::string message;
};

/// Runs `spec` on `chain` under `budget_bytes` (and options.host_budget_bytes, which only the
/// optimal solver's offload options can use: the others keep everything on the device). A family
/// without a count gives its fastest member that fits, or the one with the smallest peak when none
/// does. Throws std::invalid_argument for a count above the number of stages.
Plan solve(const Chain& chain, const SolverSpec& spec, int64_t budget_bytes,
           const OptimalOptions& options = {});

}  // namespace plan
}  // namespace ckpt
