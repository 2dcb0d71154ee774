#include <ckpt/plan/bytes.h>
#include <ckpt/plan/excerpt.h>
#include <ckpt/plan/spec.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <utility>

namespace ckpt {
namespace plan {

Budget Budget::bytes(int64_t value) {
  if (value <= 0) {
    throw std::invalid_argument("the budget must be positive, but got " + std::to_string(value) +
                                " bytes");
  }
  return Budget(Kind::Bytes, value, 0.0);
}

Budget Budget::fraction(double value) {
  if (!(value > 0 && value <= 1)) {
    throw std::invalid_argument(
        "the fraction of the no-checkpoint peak must be in (0, 1], but got " +
        std::to_string(value) + " (40% is 0.4)");
  }
  return Budget(Kind::Fraction, 0, value);
}

Budget Budget::minimum() {
  return Budget(Kind::Minimum, 0, 0.0);
}

const char* Budget::kind_name() const {
  switch (kind_) {
    case Kind::Bytes:
      return "a budget in bytes";
    case Kind::Fraction:
      return "a fraction of the no-checkpoint peak";
    case Kind::Minimum:
      return "the minimum";
  }
  return "an unknown budget";
}

int64_t Budget::bytes() const {
  if (!is_bytes()) {
    throw std::logic_error(std::string("Budget::bytes() asked of ") + kind_name() +
                           "; check is_bytes() first, or use resolve() for the bytes of any "
                           "budget");
  }
  return bytes_;
}

double Budget::fraction() const {
  if (!is_fraction()) {
    throw std::logic_error(std::string("Budget::fraction() asked of ") + kind_name() +
                           "; check is_fraction() first");
  }
  return fraction_;
}

namespace {

std::string trimmed(const std::string& text) {
  const auto first = text.find_first_not_of(" \t");
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(" \t") - first + 1);
}

}  // namespace

Budget Budget::parse(const std::string& text) {
  const std::string budget = trimmed(text);
  if (budget == "min") return minimum();
  if (!budget.empty() && budget.back() == '%') {
    const std::string number = budget.substr(0, budget.size() - 1);
    char* end = nullptr;
    const double percent = std::strtod(number.c_str(), &end);
    if (number.empty() || end != number.c_str() + number.size() ||
        !(percent > 0 && percent <= 100)) {
      throw std::invalid_argument(
          "the percentage must be a number in (0, 100], such as 40%, but got " +
          quote_excerpt(text));
    }
    return fraction(percent / 100.0);
  }
  try {
    return bytes(parse_bytes(budget, "the budget"));
  } catch (const std::invalid_argument& error) {
    throw std::invalid_argument(std::string(error.what()) +
                                " (or a percentage of the no-checkpoint peak, such as 40%, or "
                                "\"min\" for the smallest feasible budget)");
  }
}

int64_t Budget::resolve(int64_t no_checkpoint_peak_bytes, int64_t smallest_feasible_bytes) const {
  switch (kind_) {
    case Kind::Bytes:
      return bytes_;
    case Kind::Fraction:
      return static_cast<int64_t>(
          std::floor(fraction_ * static_cast<double>(no_checkpoint_peak_bytes)));
    case Kind::Minimum:
      // Storing everything is a schedule too: a no-checkpoint peak known to be smaller (measured
      // rather than predicted) is the smaller feasible budget.
      return std::min(smallest_feasible_bytes, no_checkpoint_peak_bytes);
  }
  return smallest_feasible_bytes;
}

SolverSpec SolverSpec::parse(const std::string& text) {
  SolverSpec spec;
  const auto colon = text.find(':');
  spec.name = text.substr(0, colon);
  const bool family = spec.name == "uniform" || spec.name == "revolve";
  if (!family && spec.name != "optimal" && spec.name != "sqrt" && spec.name != "none") {
    throw std::invalid_argument("unknown solver " + quote_excerpt(text) +
                                "; use optimal, uniform, uniform:K, sqrt, revolve, revolve:S or "
                                "none");
  }
  if (colon == std::string::npos) return spec;
  const std::string count = text.substr(colon + 1);
  const auto [end, error] = std::from_chars(count.data(), count.data() + count.size(), spec.count);
  const bool whole = end == count.data() + count.size();
  if (family && whole && error == std::errc::result_out_of_range) {
    throw std::invalid_argument(
        "solver " + quote_excerpt(text) + ": the number after the colon is too large: at most " +
        std::to_string(std::numeric_limits<int>::max()) + ", and at most the number of stages");
  }
  if (!family || count.empty() || error != std::errc() || !whole || spec.count < 1) {
    throw std::invalid_argument(
        "solver " + quote_excerpt(text) + ": " +
        (family
             ? "the number after the colon must be a positive integer, such as " + spec.name + ":4"
             : spec.name + " takes no number"));
  }
  return spec;
}

std::string SolverSpec::to_string() const {
  return count > 0 ? name + ":" + std::to_string(count) : name;
}

namespace {

// The baselines use option 0 only, which offloads nothing: the host budget never binds them.
Plan fixed(const Chain& chain, int64_t budget_bytes, Schedule schedule, std::string solver) {
  Plan plan;
  plan.prediction = simulate(chain, schedule);
  plan.schedule = std::move(schedule);
  plan.solver = std::move(solver);
  plan.feasible = plan.prediction.valid && plan.prediction.peak_bytes <= budget_bytes;
  if (!plan.feasible) {
    plan.message = "the " + plan.solver + " schedule needs " +
                   std::to_string(plan.prediction.peak_bytes) + " bytes, above the budget";
  }
  return plan;
}

// The fastest member of a family (uniform:K or revolve:S for K, S in 1..L) that fits the budget,
// or the one with the smallest peak when none does.
template <class Make>
Plan best_of(const Chain& chain, int64_t budget_bytes, const std::string& name, Make make) {
  std::optional<Plan> best;
  for (int k = 1; k <= chain.size(); ++k) {
    Plan candidate = fixed(chain, budget_bytes, make(k), name + ":" + std::to_string(k));
    const bool better = !best || (candidate.feasible && !best->feasible) ||
                        (candidate.feasible && best->feasible &&
                         candidate.prediction.time < best->prediction.time) ||
                        (!candidate.feasible && !best->feasible &&
                         candidate.prediction.peak_bytes < best->prediction.peak_bytes);
    if (better) best = std::move(candidate);
  }
  return *best;
}

Plan solve_family(const Chain& chain, const SolverSpec& spec, int64_t budget_bytes) {
  const auto make = [&](int k) {
    return spec.name == "uniform" ? solve_uniform(chain, k) : solve_revolve(chain, k);
  };
  if (spec.count == 0) return best_of(chain, budget_bytes, spec.name, make);
  if (spec.count > chain.size()) {
    throw std::invalid_argument(
        "solver " + spec.to_string() + ": " +
        (spec.name == "uniform" ? "the number of segments" : "the number of slots") +
        " must be between 1 and the number of stages (" + std::to_string(chain.size()) + ")");
  }
  return fixed(chain, budget_bytes, make(spec.count), spec.to_string());
}

// Why the optimal solver found nothing: the device budget, or the host budget where the device
// budget suffices with unlimited host memory (then with the smallest host budget that works).
std::string infeasible_message(const Chain& chain, int64_t budget_bytes,
                               const OptimalOptions& options) {
  std::optional<int64_t> host;
  if (budget_bytes >= chain.input_bytes && options.host_budget_bytes < chain.max_host_bytes()) {
    try {
      host = min_host_budget_bytes(chain, budget_bytes, options);
    } catch (const std::length_error&) {
      return "no schedule fits the budget within the host budget of " +
             std::to_string(options.host_budget_bytes) +
             " bytes (the smallest host budget that works is too long to compute)";
    }
  }
  if (!host) return "no schedule fits the budget";
  return "no schedule fits the budget within the host budget of " +
         std::to_string(options.host_budget_bytes) +
         " bytes, but one does with more host memory: the smallest host budget that works for "
         "this budget is " +
         std::to_string(*host) + " bytes. Raise the host budget";
}

}  // namespace

Plan solve(const Chain& chain, const SolverSpec& spec, int64_t budget_bytes,
           const OptimalOptions& options) {
  if (spec.name == "none") return fixed(chain, budget_bytes, solve_no_checkpoint(chain), "none");
  if (spec.name == "sqrt") return fixed(chain, budget_bytes, solve_sqrt_n(chain), "sqrt");
  if (spec.name == "uniform" || spec.name == "revolve") {
    return solve_family(chain, spec, budget_bytes);
  }
  Plan plan;
  plan.solver = "optimal";
  std::optional<Schedule> schedule;
  if (budget_bytes >= chain.input_bytes) schedule = solve_optimal(chain, budget_bytes, options);
  if (!schedule) {
    plan.message = infeasible_message(chain, budget_bytes, options);
    return plan;
  }
  schedule = add_look_ahead(chain, std::move(*schedule), budget_bytes);
  plan.prediction = simulate(chain, *schedule);
  plan.schedule = std::move(schedule);
  plan.feasible = plan.prediction.valid && plan.prediction.peak_bytes <= budget_bytes &&
                  plan.prediction.host_peak_bytes <= options.host_budget_bytes;
  return plan;
}

}  // namespace plan
}  // namespace ckpt
