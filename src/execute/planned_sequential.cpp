#include <ckpt/plan/solvers.h>
#include <ckpt/planned_sequential.h>
#include <ckpt/profiler.h>
#include <ckpt/report.h>

#include "autograd/graph.h"
#include "compat/torch_compat.h"
#include "joined_stages.h"
#include "out_of_memory.h"
#include "plan_budget.h"
#include "schedule_runner.h"

#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <functional>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unordered_set>
#include <utility>

namespace ckpt {
namespace {

using torch::autograd::variable_list;

// With OutOfMemory::Replan: after the chain ran out of device memory, puts its state back, plans
// for less and runs the forward again; the runner holds what the backward needs.
using RunAgain = std::function<std::pair<std::shared_ptr<detail::ScheduleRunner>, at::Tensor>(
    c10::OutOfMemoryError& error, bool in_backward)>;

// Stands for the whole chain in the autograd graph. Its next edges: the input's (when it needs a
// gradient), then the accumulators of the chain's parameters, so that each parameter's
// accumulator runs once per backward with its gradient summed over the stages that use it.
class PlannedBackward final : public compat::OwningNode {
 public:
  PlannedBackward(std::shared_ptr<detail::ScheduleRunner> runner, torch::autograd::edge_list next,
                  bool has_input, RunAgain again)
      : OwningNode(std::move(next)),
        runner_(std::move(runner)),
        has_input_(has_input),
        again_(std::move(again)) {}

  variable_list apply(variable_list&& grads) override {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_CHECK(runner_ != nullptr,
                "ckpt::PlannedSequential: Trying to backward through the planned chain a second "
                "time. Its schedule frees what it stored as it goes, so retain_graph is not "
                "supported: run the forward again.");
    TORCH_CHECK(!at::GradMode::is_enabled(),
                "ckpt::PlannedSequential does not support double backward (create_graph=true). "
                "Use ckpt::checkpoint or checkpoint_sequential for higher-order gradients.");
    // A plain backward gives the parameters their gradients; inside autograd::grad or
    // backward(inputs=...) only the input's gradient is computed.
    const bool accumulate = torch::autograd::Engine::get_default_engine().is_checkpoint_valid();
    auto runner = std::move(runner_);
    if (!again_) return run(*runner, std::move(grads[0]), accumulate);
    for (;;) {
      try {
        return run(*runner, grads[0], accumulate);
      } catch (c10::OutOfMemoryError& error) {
        runner.reset();  // what the schedule stored: let go of it first
        runner = again_(error, /*in_backward=*/true).first;
      }
    }
  }

  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    runner_.reset();
    again_ = nullptr;
  }

  std::string name() const override { return "ckpt::PlannedSequentialBackward"; }

 private:
  void release_owned() override {
    runner_.reset();
    again_ = nullptr;
  }

  variable_list run(detail::ScheduleRunner& runner, at::Tensor grad, bool accumulate) {
    detail::LeafGradients leaves(runner.single_stage_leaves());
    // Hand δ_L over rather than keep it for the whole backward: the schedule frees it early.
    at::Tensor input_grad = runner.backward(std::move(grad), accumulate ? &leaves : nullptr);
    variable_list result;
    result.reserve(num_outputs());
    if (has_input_) result.push_back(std::move(input_grad));
    for (size_t k = result.size(); k < num_outputs(); ++k) {
      result.push_back(leaves.take(next_edge(k).function.get()));
    }
    leaves.accumulate_rest();
    return result;
  }

  std::shared_ptr<detail::ScheduleRunner> runner_;
  bool has_input_;
  RunAgain again_;  // with OutOfMemory::Replan
};

// The plain chain under OutOfMemory::Replan: it ran on a detached `start`, and its backward runs
// inside this node (a backward within the backward, as the reentrant checkpoint runs one), so
// that where it runs out of memory the chain runs again under a plan for less.
class RetryingChainBackward final : public compat::OwningNode {
 public:
  RetryingChainBackward(at::Tensor output, at::Tensor start, torch::autograd::edge_list next,
                        RunAgain again)
      : OwningNode(std::move(next)),
        output_(std::move(output)),
        start_(std::move(start)),
        again_(std::move(again)) {}

  variable_list apply(variable_list&& grads) override {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_CHECK(output_.defined(),
                "ckpt::PlannedSequential: Trying to backward through the planned chain a second "
                "time; with OutOfMemory::Replan its backward runs once: run the forward again.");
    TORCH_CHECK(!at::GradMode::is_enabled(),
                "ckpt::PlannedSequential does not support double backward (create_graph=true). "
                "Use ckpt::checkpoint or checkpoint_sequential for higher-order gradients.");
    const bool accumulate = torch::autograd::Engine::get_default_engine().is_checkpoint_valid();
    at::Tensor input_grad;
    try {
      input_grad = run_plain(grads[0], accumulate);
    } catch (c10::OutOfMemoryError& error) {
      output_.reset();  // the chain's graph: let go of it first
      input_grad = run_planned(error, grads[0], accumulate);
    }
    release_owned();
    variable_list result;
    if (num_outputs() > 0) result.push_back(std::move(input_grad));
    return result;
  }

  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    release_owned();
  }
  std::string name() const override { return "ckpt::PlannedSequentialBackward"; }

 private:
  void release_owned() override {
    output_.reset();
    start_.reset();
    again_ = nullptr;
  }

  // The plain chain's backward: the parameters' gradients go where a plain backward puts them
  // (none inside autograd::grad), the input's comes back.
  at::Tensor run_plain(const at::Tensor& grad, bool accumulate) {
    if (!accumulate) {
      if (!start_.requires_grad()) return {};
      return torch::autograd::grad({output_}, {start_}, {grad})[0];
    }
    torch::autograd::backward({output_}, {grad});
    at::Tensor input_grad = start_.grad();
    if (start_.requires_grad()) start_.mutable_grad().reset();
    return input_grad;
  }

  // The chain again under plans for less, as often as it runs out.
  at::Tensor run_planned(c10::OutOfMemoryError& error, const at::Tensor& grad, bool accumulate) {
    for (;;) {
      auto runner = again_(error, /*in_backward=*/true).first;
      try {
        detail::LeafGradients leaves(runner->single_stage_leaves());
        at::Tensor input_grad = runner->backward(grad, accumulate ? &leaves : nullptr);
        if (accumulate) leaves.accumulate_rest();  // what the engine would add for PlannedBackward
        return input_grad;
      } catch (c10::OutOfMemoryError& again) {
        error = again;
      }
    }
  }

  at::Tensor output_;
  at::Tensor start_;  // the input, detached: where the plain chain's backward ends
  RunAgain again_;
};

// The plain chain under OutOfMemory::Replan (a store-everything plan): run as it is, its
// backward run by a RetryingChainBackward.
torch::Tensor run_plain_surviving(std::vector<torch::nn::AnyModule> stages,
                                  const torch::Tensor& input, RunAgain again) {
  const torch::Tensor start = input.detach().requires_grad_(input.requires_grad());
  torch::Tensor x = start;
  for (auto& stage : stages) x = stage.forward<torch::Tensor>(x);
  torch::autograd::edge_list next;
  if (input.requires_grad()) next.push_back(torch::autograd::impl::gradient_edge(input));
  auto node = compat::make_node<RetryingChainBackward>(x, start, std::move(next), std::move(again));
  return detail::output_of(node, detail::fresh_alias(x));
}

// The planning layer reports a bad solver or budget as std::invalid_argument; the module reports
// it as LibTorch does, as c10::Error.
template <class PlanningCall>
auto as_torch_error(PlanningCall&& call) {
  try {
    return call();
  } catch (const std::invalid_argument& error) {
    TORCH_CHECK(false, "ckpt::PlannedSequential: ", error.what());
  }
}

plan::SolverSpec parse_solver(const std::string& solver) {
  return as_torch_error([&] { return plan::SolverSpec::parse(solver); });
}

// True for a schedule that keeps every activation and recomputes nothing: the plain chain.
bool keeps_everything(const plan::Schedule& schedule, int stages) {
  int forwards = 0;
  for (const plan::Op& op : schedule.ops) {
    if (op.kind == plan::OpKind::ForwardAll && op.option == 0) ++forwards;
    if (op.kind == plan::OpKind::ForwardInput || op.kind == plan::OpKind::ForwardNone ||
        (op.kind == plan::OpKind::ForwardAll && op.option != 0)) {
      return false;
    }
  }
  return forwards == stages;
}

}  // namespace

InfeasibleBudget::InfeasibleBudget(int64_t budget_bytes, int64_t smallest_feasible_bytes)
    : c10::Error({__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                 c10::str("ckpt::PlannedSequential: no schedule fits in a budget of ", budget_bytes,
                          " bytes; the smallest feasible budget for this chain is ",
                          smallest_feasible_bytes,
                          " bytes. Raise the budget, ask for it with Budget::minimum() (\"min\"), "
                          "or set PlannedSequentialOptions().fall_back_to_minimum(true).")),
      smallest_feasible_bytes_(smallest_feasible_bytes) {}

InfeasibleBudget::InfeasibleBudget(const std::string& message, int64_t smallest_feasible_bytes)
    : c10::Error({__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, message),
      smallest_feasible_bytes_(smallest_feasible_bytes) {}

InfeasibleBudget::InfeasibleBudget(int64_t budget_bytes, int64_t smallest_feasible_bytes,
                                   int64_t host_budget_bytes, int64_t smallest_host_budget_bytes)
    : c10::Error({__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                 c10::str("ckpt::PlannedSequential: no schedule fits in a budget of ", budget_bytes,
                          " bytes with a host budget of ", host_budget_bytes,
                          " bytes for offloading; the smallest host budget that works at this "
                          "budget is ",
                          smallest_host_budget_bytes,
                          " bytes, and the smallest budget at this host budget is ",
                          smallest_feasible_bytes,
                          " bytes. Raise the host budget "
                          "(PlannedSequentialOptions().host_budget_bytes) or the budget.")),
      smallest_feasible_bytes_(smallest_feasible_bytes),
      smallest_host_budget_bytes_(smallest_host_budget_bytes) {}

namespace {

plan::OptimalOptions optimal_options(const PlannedSequentialOptions& options) {
  plan::OptimalOptions optimal;
  optimal.slots = options.slots();
  optimal.host_budget_bytes = options.host_budget_bytes();
  return optimal;
}

// What the chain's budget is resolved against: its plain peak and the optimal solver's minimum.
detail::BudgetLimits budget_limits(const plan::Chain& profile, int64_t no_checkpoint_peak_bytes,
                                   const PlannedSequentialOptions& options) {
  return {"ckpt::PlannedSequential", no_checkpoint_peak_bytes,
          plan::min_feasible_budget_bytes(profile, optimal_options(options)), options.headroom()};
}

// The infeasible-budget error for `budget_bytes`, naming the host budget that would make it fit
// where only the host budget is short.
InfeasibleBudget infeasible(const plan::Chain& profile, const plan::OptimalOptions& optimal,
                            int64_t budget_bytes, int64_t minimum) {
  if (optimal.host_budget_bytes < profile.max_host_bytes()) {
    std::optional<int64_t> host;
    try {
      host = plan::min_host_budget_bytes(profile, budget_bytes, optimal);
    } catch (const std::length_error&) {  // too long a chain to answer exactly: say less
    }
    if (host && *host > optimal.host_budget_bytes) {
      return InfeasibleBudget(budget_bytes, minimum, optimal.host_budget_bytes, *host);
    }
  }
  return InfeasibleBudget(budget_bytes, minimum);
}

}  // namespace

PlannedSequentialImpl::PlannedSequentialImpl(const torch::nn::Sequential& chain, Budget budget,
                                             PlannedSequentialOptions options)
    : options(std::move(options)), budget_(budget) {
  parse_solver(this->options.solver());  // a misspelt solver fails here, not at the first step
  TORCH_CHECK(!chain.is_empty() && !chain->is_empty(),
              "ckpt::PlannedSequential: the chain is empty. Pass a Sequential of at least one "
              "module.");
  size_t index = 0;
  for (const auto& stage : *chain) {
    stages_.push_back(stage);
    register_module(std::to_string(index++), stage.ptr());
  }
}

void PlannedSequentialImpl::plan(const torch::Tensor& sample_input) {
  auto planned = measure_and_solve(sample_input);
  const std::lock_guard<std::mutex> lock(mutex_);
  plan_ = std::move(planned);
  other_plans_.clear();
}

void PlannedSequentialImpl::plan(const plan::Chain& profile) {
  check_profile(profile);
  auto planned =
      solve(stages_, profile,
            plan::simulate(profile, plan::solve_no_checkpoint(profile)).peak_bytes, budget_);
  const std::lock_guard<std::mutex> lock(mutex_);
  plan_ = std::move(planned);
  other_plans_.clear();
}

std::shared_ptr<detail::ChainPlan> PlannedSequentialImpl::measure_and_solve(
    const torch::Tensor& sample_input) const {
  const detail::ReportPause no_report;  // the profiler's runs are not the forward's
  // Measured with these options' modes and settings unless the user supplied a profiler.
  const std::shared_ptr<ChainProfiler> profiler =
      options.profiler() ? options.profiler()
                         : std::make_shared<MeasuringProfiler>(
                               ProfileOptions()
                                   .storage_modes(options.storage_modes())
                                   .selective_policy(options.selective_policy())
                                   .count_parameter_gradients(options.count_parameter_gradients()));
  std::vector<torch::nn::AnyModule> stages = detail::stages_to_plan(stages_, sample_input);
  plan::Chain profile = profiler->profile(stages, sample_input);
  TORCH_CHECK(profile.size() == static_cast<int>(stages.size()),
              "ckpt::PlannedSequential::plan: the profiler measured ", profile.size(),
              " stages but the chain has ", stages.size(), " to plan.");
  profile.validate();
  const int64_t no_checkpoint_peak = profiler->no_checkpoint_peak(stages, sample_input);
  auto planned = solve(std::move(stages), profile, no_checkpoint_peak, budget_);
  planned->input = detail::InputSignature::of(sample_input);
  planned->conditions = std::make_shared<const detail::StepConditions>(
      detail::StepConditions::current(*this, sample_input.device().type()));
  return planned;
}

void PlannedSequentialImpl::check_profile(const plan::Chain& profile) const {
  TORCH_CHECK(profile.size() == static_cast<int>(stages_.size()),
              "ckpt::PlannedSequential::plan: the profile has ", profile.size(),
              " stages but the chain has ", stages_.size(), ".");
  profile.validate();
}

// At a budget that holds the no-checkpoint peak, the chain keeps everything: that peak was
// measured (or predicted from this profile), so it fits, even where the model of a stage's
// temporaries would predict more.
std::shared_ptr<detail::ChainPlan> PlannedSequentialImpl::solve(
    std::vector<torch::nn::AnyModule> stages, const plan::Chain& profile,
    int64_t no_checkpoint_peak_bytes, const Budget& budget) const {
  auto planned = std::make_shared<detail::ChainPlan>();
  // First, so that a profile with an option the executor cannot run fails whatever the budget.
  planned->option_forwards = std::make_shared<const detail::OptionForwards>(detail::option_forwards(
      stages, profile, options.storage_modes(), StorageSettings{options.selective_policy()}));
  const plan::OptimalOptions optimal = optimal_options(options);
  const plan::SolverSpec solver = parse_solver(options.solver());
  const bool optimal_solver = solver.name == "optimal";
  const detail::BudgetLimits limits = budget_limits(profile, no_checkpoint_peak_bytes, options);
  // Only the optimal solver answers every budget it can; the others plan their own way, and a
  // schedule over the budget is an error below.
  detail::InfeasibleError infeasible_error;
  if (optimal_solver) {
    infeasible_error = [&](int64_t bytes, int64_t smallest) {
      return infeasible(profile, optimal, bytes, smallest);
    };
  }
  const detail::ResolvedBudget resolved =
      detail::resolve_budget(budget, limits, options.fall_back_to_minimum(), infeasible_error);
  const bool store_everything = optimal_solver && resolved.fits_plain_step;
  plan::Schedule schedule = plan::solve_no_checkpoint(profile);
  if (!store_everything) {
    plan::Plan solved =
        as_torch_error([&] { return plan::solve(profile, solver, resolved.solved_for, optimal); });
    TORCH_INTERNAL_ASSERT(solved.schedule.has_value(), "no schedule at a budget above the minimum");
    schedule = std::move(*solved.schedule);
  }
  plan::SimulationResult prediction = plan::simulate(profile, schedule);
  TORCH_INTERNAL_ASSERT(prediction.valid,
                        "solver returned an invalid schedule: ", prediction.error);
  // Where the plain step fits, the plain chain runs: its peak is measured, not modeled.
  if (store_everything) prediction.peak_bytes = no_checkpoint_peak_bytes;
  // A schedule never needs more than the plain chain; the profile's model of temporaries may
  // predict more than the measured plain step, so only a tighter budget is checked.
  TORCH_CHECK(resolved.fits_plain_step || prediction.peak_bytes <= resolved.bytes,
              "ckpt::PlannedSequential: the ", options.solver(), " schedule needs ",
              prediction.peak_bytes, " bytes, more than the budget of ", resolved.bytes,
              " bytes. Raise the budget or use the optimal solver.");
  planned->profile = profile;
  planned->keeps_everything = keeps_everything(schedule, profile.size());
  planned->stages = std::move(stages);
  planned->schedule = std::move(schedule);
  planned->prediction = std::move(prediction);
  planned->budget_bytes = resolved.bytes;
  planned->no_checkpoint_peak_bytes = no_checkpoint_peak_bytes;
  return planned;
}

namespace {

// What changed between the sample a plan was made for and `input`, which it does not hold, and
// what to do about it.
std::pair<std::string, std::string> input_change(const detail::InputSignature& planned_for,
                                                 const torch::Tensor& input) {
  const std::string now = detail::InputSignature::of(input).to_string();
  detail::InputSignature with_grad = planned_for;
  with_grad.requires_grad = true;
  if (with_grad.holds(input)) {
    return {
        c10::str("the input ", now, " requires grad where the sample the chain was planned for, ",
                 planned_for.to_string(),
                 ", did not, so its first stage may keep more for the backward than the "
                 "budget holds"),
        "Plan with a sample that requires grad, as the steps' inputs do "
        "(plan(sample.detach().requires_grad_())), or set "
        "PlannedSequentialOptions().on_input_change(ckpt::InputChange::Replan)."};
  }
  return {c10::str("the input ", now, " is larger than the one the chain was planned for, ",
                   planned_for.to_string(),
                   ", or of another kind, so the schedule may need more memory than the budget"),
          "Plan with a sample of the largest input (plan(sample)), or set "
          "PlannedSequentialOptions().on_input_change(ckpt::InputChange::Replan)."};
}

}  // namespace

std::shared_ptr<const detail::ChainPlan> PlannedSequentialImpl::plan_for(
    const torch::Tensor& input) {
  const std::lock_guard<std::mutex> lock(mutex_);
  if (plan_ && !plan_->input) return plan_;  // from a given profile: it runs any input
  const detail::StepConditions now = detail::StepConditions::current(*this, input.device().type());
  const auto holds = [&](const detail::ChainPlan& plan) {
    return plan.input->holds(input) && *plan.conditions == now;
  };
  if (plan_ && holds(*plan_)) return plan_;
  if (detail::switch_to_other_plan(other_plans_, plan_,
                                   [&](const auto& other) { return holds(*other); }))
    return plan_;
  if (plan_) {
    const std::string conditions = now.change_from(*plan_->conditions, "the chain");
    const auto [change, advice] =
        conditions.empty()
            ? input_change(*plan_->input, input)
            : std::pair<std::string, std::string>(
                  conditions + ", so the schedule may need more memory than the budget",
                  "Plan under the conditions the steps run in, or set "
                  "PlannedSequentialOptions().on_input_change(ckpt::InputChange::Replan).");
    detail::on_input_change("ckpt::PlannedSequential", options.on_input_change(), change, advice);
  }
  std::shared_ptr<const detail::ChainPlan> next = measure_and_solve(input);
  if (!plan_) {
    plan_ = std::move(next);
    return plan_;
  }
  // A plan for a larger input runs a smaller one under the same conditions.
  const auto serves = [](const auto& larger, const auto& other) {
    return other->input && larger->input->holds(*other->input) &&
           *larger->conditions == *other->conditions;
  };
  detail::replace_current_plan(other_plans_, plan_, std::move(next), serves);
  return plan_;
}

torch::Tensor PlannedSequentialImpl::forward(const torch::Tensor& input) {
  bool any_grad = input.requires_grad();
  for (const auto& p : parameters()) any_grad = any_grad || p.requires_grad();
  const bool differentiated = at::GradMode::is_enabled() && any_grad;
  // Without a backward to come, any plan runs the plain chain: none is made again for it.
  const std::shared_ptr<const detail::ChainPlan> plan =
      differentiated || !planned() ? plan_for(input) : nullptr;
  // A schedule that recomputes nothing is the plain chain: run it as such, adding nothing.
  const bool plain =
      plan == nullptr || (plan->keeps_everything && !observer_ && !detail::active_report());
  const bool surviving = options.on_out_of_memory() == OutOfMemory::Replan;
  if (!differentiated || (plain && !surviving)) {
    torch::Tensor x = input;
    for (auto& stage : stages_) x = stage.forward<torch::Tensor>(x);
    return x;
  }
  TORCH_CHECK(!input.is_inference(),
              "ckpt::PlannedSequential: the input is an inference tensor (created under "
              "c10::InferenceMode), which autograd cannot save for the backward pass. Create it "
              "outside InferenceMode, or pass a clone made outside it.");
  RunAgain again;
  if (surviving) again = run_again_function(input, plan);
  std::shared_ptr<detail::ScheduleRunner> runner;
  torch::Tensor output;
  try {
    // The planned stages: a first stage that writes into its input runs on a copy of it.
    if (plain) return run_plain_surviving(plan->stages, input, again);
    runner = std::make_shared<detail::ScheduleRunner>(plan->stages, plan->schedule,
                                                      plan->option_forwards,
                                                      options.preserve_rng_state(), observer_);
    output = runner->forward(input);
  } catch (c10::OutOfMemoryError& error) {
    if (!again) throw;
    runner.reset();
    std::tie(runner, output) = again(error, /*in_backward=*/false);
  }
  torch::autograd::edge_list next;
  if (input.requires_grad()) next.push_back(torch::autograd::impl::gradient_edge(input));
  std::unordered_set<const void*> seen;  // a tied weight registered in two stages is one edge
  for (const auto& parameter : parameters()) {
    if (parameter.requires_grad() && seen.insert(parameter.unsafeGetTensorImpl()).second) {
      next.push_back(torch::autograd::impl::gradient_edge(parameter));
    }
  }
  auto node = compat::make_node<PlannedBackward>(std::move(runner), std::move(next),
                                                 input.requires_grad(), std::move(again));
  return detail::output_of(node, detail::fresh_alias(output));
}

// Runs the chain again from `input` after it ran out of memory (see RunAgain): the state of the
// step's start put back, under the plan for less, as often as the device runs out again.
std::function<std::pair<std::shared_ptr<detail::ScheduleRunner>, at::Tensor>(c10::OutOfMemoryError&,
                                                                             bool)>
PlannedSequentialImpl::run_again_function(const torch::Tensor& input,
                                          std::shared_ptr<const detail::ChainPlan> plan) {
  auto start = std::make_shared<detail::StepStart>(*this, std::vector<at::Tensor>{input});
  return [this, start, input, plan](c10::OutOfMemoryError& error, bool in_backward) mutable {
    return start->run_again(
        error, in_backward,
        [&](c10::OutOfMemoryError& failed, std::optional<int64_t> held) {
          plan = replan_for_less(failed, *plan, held, in_backward);
        },
        [&] {
          auto runner = std::make_shared<detail::ScheduleRunner>(
              plan->stages, plan->schedule, plan->option_forwards, options.preserve_rng_state(),
              observer_);
          torch::Tensor output = runner->forward(input);
          return std::make_pair(std::move(runner), std::move(output));
        });
  };
}

std::shared_ptr<const detail::ChainPlan> PlannedSequentialImpl::replan_for_less(
    c10::OutOfMemoryError& error, const detail::ChainPlan& failed,
    std::optional<int64_t> held_bytes, bool in_backward) {
  const int64_t smallest = detail::smallest_budget(
      budget_limits(failed.profile, failed.no_checkpoint_peak_bytes, options));
  std::shared_ptr<detail::ChainPlan> smaller;
  int64_t smaller_budget = 0;
  detail::plan_for_less("ckpt::PlannedSequential", error, in_backward, held_bytes,
                        failed.budget_bytes, failed.prediction.peak_bytes, smallest,
                        [&](int64_t next) {
                          smaller = solve(failed.stages, failed.profile,
                                          failed.no_checkpoint_peak_bytes, Budget::bytes(next));
                          smaller_budget = next;
                          return smaller->prediction.peak_bytes;
                        });
  smaller->input = failed.input;
  smaller->conditions = failed.conditions;
  const std::lock_guard<std::mutex> lock(mutex_);
  budget_ = Budget::bytes(smaller_budget);  // later plans (a changed input) stay as small
  plan_ = smaller;
  other_plans_.clear();  // made for the budget before
  return smaller;
}

bool PlannedSequentialImpl::planned() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return plan_ != nullptr;
}

const detail::ChainPlan& PlannedSequentialImpl::planned_or_error() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(plan_ != nullptr,
              "ckpt::PlannedSequential: not planned yet; call plan() or forward().");
  return *plan_;
}

const plan::Chain& PlannedSequentialImpl::profile() const {
  return planned_or_error().profile;
}

const plan::Schedule& PlannedSequentialImpl::schedule() const {
  return planned_or_error().schedule;
}

const plan::SimulationResult& PlannedSequentialImpl::prediction() const {
  return planned_or_error().prediction;
}

int64_t PlannedSequentialImpl::budget_bytes() const {
  return planned_or_error().budget_bytes;
}

int64_t PlannedSequentialImpl::no_checkpoint_peak_bytes() const {
  return planned_or_error().no_checkpoint_peak_bytes;
}

void PlannedSequentialImpl::pretty_print(std::ostream& stream) const {
  stream << "ckpt::PlannedSequential(stages=" << stages_.size() << ", solver=" << options.solver();
  const std::lock_guard<std::mutex> lock(mutex_);
  if (plan_) {
    stream << ", budget_bytes=" << plan_->budget_bytes
           << ", predicted_peak_bytes=" << plan_->prediction.peak_bytes
           << ", forwards=" << plan_->prediction.forward_count;
  }
  stream << ")";
}

}  // namespace ckpt
