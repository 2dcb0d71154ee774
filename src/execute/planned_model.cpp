#include <ckpt/planned_model.h>

#include <ckpt/memory_label.h>

#include "autograd/graph.h"
#include "autograd/host_offload.h"
#include "autograd/step_rollback.h"
#include "compat/torch_compat.h"
#include "out_of_memory.h"
#include "plan_budget.h"
#include "stage_report.h"

#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <utility>

namespace ckpt {
namespace {

// A step whose candidates are not those the plan was made for; `what` says what changed.
struct PlanMismatch : std::runtime_error {
  explicit PlanMismatch(const std::string& what, std::vector<ProfiledCandidate> reached = {},
                        bool step_ended = false)
      : std::runtime_error(what), reached(std::move(reached)), step_ended(step_ended) {}

  // The candidates the step reached up to where it differed (that one included), and whether
  // it ended there: then they are all of its candidates.
  std::vector<ProfiledCandidate> reached;
  bool step_ended = false;
};

// Empty where candidate `reached` is the profiled one `expected`, taking no larger inputs; else
// what differs.
std::string first_mismatch(const ProfiledCandidate& expected, const ProfiledCandidate& reached) {
  const std::string& name = reached.name;
  if (expected.name != name) {
    return c10::str("the step reached candidate \"", name, "\" where the profiled step reached \"",
                    expected.name, "\"");
  }
  if (reached.inputs.size() != expected.inputs.size()) {
    return c10::str("candidate \"", name, "\" took ", reached.inputs.size(),
                    " tensors where the profiled step gave it ", expected.inputs.size());
  }
  for (size_t i = 0; i < reached.inputs.size(); ++i) {
    if (expected.inputs[i].holds(reached.inputs[i])) continue;
    return c10::str("input ", i, " of candidate \"", name, "\" is ", reached.inputs[i].to_string(),
                    " where the plan was profiled with ", expected.inputs[i].to_string());
  }
  return "";
}

// Whether a plan made for a step that reached `planned` may be the plan of a step that reached
// `reached` (all its candidates where `all_reached`, else as far as it went): the same
// candidates, each taking no larger inputs.
bool fits_reached(const std::vector<ProfiledCandidate>& planned,
                  const std::vector<ProfiledCandidate>& reached, bool all_reached) {
  if (planned.size() < reached.size() || (all_reached && planned.size() > reached.size()))
    return false;
  for (size_t c = 0; c < reached.size(); ++c) {
    if (!first_mismatch(planned[c], reached[c]).empty()) return false;
  }
  return true;
}

// Whether plan `larger` runs every step `other` was made for: under the same conditions, the
// same candidates, each taking no larger inputs (a plan for a larger batch runs a smaller one).
template <class Plan>
bool serves(const Plan& larger, const Plan& other) {
  return larger.conditions && other.conditions && *larger.conditions == *other.conditions &&
         fits_reached(larger.measured.candidates, other.measured.candidates,
                      /*all_reached=*/true);
}

// Runs `step`, putting the model's buffers and the RNG back where it does not complete: none
// (and `mismatch` says what changed) where the step's candidates are not the plan's; an error of
// the step itself passes on.
std::optional<at::Tensor> run_or_put_back(const std::shared_ptr<torch::nn::Module>& model,
                                          const std::function<at::Tensor()>& step,
                                          std::optional<PlanMismatch>& mismatch) {
  detail::StepRollback rollback(model);  // the profiler holds the same (its copies count)
  try {
    at::Tensor loss = step();
    rollback.dismiss();
    return loss;
  } catch (const PlanMismatch& caught) {
    mismatch = caught;
  }
  return std::nullopt;
}

// The solver's options; bad values are clear errors.
plan::ModelSolverOptions solver_options(const PlannedModelOptions& options) {
  TORCH_CHECK(options.relative_gap() >= 0.0 && options.relative_gap() < 1.0,
              "ckpt::PlannedModel: relative_gap must be in [0, 1), the share of the step time a "
              "plan may be slower than the fastest where the exact search stops at its node "
              "limit; got ",
              options.relative_gap(), ".");
  TORCH_CHECK(options.max_exact_nodes() >= 0,
              "ckpt::PlannedModel: max_exact_nodes must not be negative (0: the heuristic "
              "alone); got ",
              options.max_exact_nodes(), ".");
  plan::ModelSolverOptions solver;
  solver.host_budget_bytes = options.host_budget_bytes();
  solver.max_exact_nodes = options.max_exact_nodes();
  solver.relative_gap = options.relative_gap();
  return solver;
}

detail::BudgetLimits budget_limits(const plan::ModelProfile& profile,
                                   const plan::ModelSolverOptions& solver,
                                   const PlannedModelOptions& options) {
  return {"ckpt::PlannedModel", profile.plain_peak_bytes(), plan::min_model_budget(profile, solver),
          options.headroom()};
}

detail::ResolvedBudget plan_budget(const plan::ModelProfile& profile,
                                   const plan::ModelSolverOptions& solver, const Budget& requested,
                                   const PlannedModelOptions& options) {
  const int64_t plain_peak = profile.plain_peak_bytes();
  const detail::BudgetLimits limits = budget_limits(profile, solver, options);
  return detail::resolve_budget(
      requested, limits, options.fall_back_to_minimum(), [&](int64_t bytes, int64_t smallest) {
        return InfeasibleBudget(
            c10::str("ckpt::PlannedModel: no choice of storage modes fits in a budget of ", bytes,
                     " bytes; the smallest feasible budget for this model is ", smallest,
                     " bytes (the plain step's peak is ", plain_peak,
                     "). Raise the budget, ask for it with Budget::minimum() (\"min\"), mark more "
                     "or smaller candidates, or set PlannedModelOptions().fall_back_to_minimum("
                     "true)."),
            smallest);
      });
}

// Every candidate stored: the plain step, which is the fastest.
plan::ModelPlan plain_plan(const plan::ModelProfile& profile) {
  plan::ModelPlan plain;
  plain.feasible = true;
  plain.choice.assign(profile.candidates.size(), 0);
  plain.prediction = plan::simulate_model(profile, plain.choice);
  plain.exact = true;
  plain.gap = 0.0;
  return plain;
}

// What the solver proved of its plan.
std::string proven(const plan::ModelPlan& solution) {
  if (solution.exact) return "the fastest plan that fits";
  if (!std::isfinite(solution.gap)) return "the heuristic's plan (no bound on how far from best)";
  std::ostringstream out;
  out << "at most " << std::setprecision(2) << solution.gap * 100 << "% slower than the fastest";
  return out.str();
}

}  // namespace

// Runs each candidate of a step in its planned mode, checking that the step reaches the
// candidates the plan was profiled with, in that order, with inputs no larger.
class PlannedModel::Runner final : public detail::CandidateRunner {
 public:
  Runner(const Plan& plan, const detail::CandidateNames& names,
         detail::ManualOffloadScope& offloads)
      : plan_(plan),
        calls_(names),
        offloads_(offloads),
        groups_(std::make_shared<Groups>(plan.regions.size())),
        first_taker_(plan.regions.size(), -1) {}

  std::optional<CheckpointOptions> begin(const std::string& name, const torch::nn::Module* module,
                                         std::vector<at::Tensor>& inputs,
                                         detail::RegionRequest& request) override {
    const std::string resolved = calls_.name(name, module);
    reached_.push_back(ProfiledCandidate::of(resolved, inputs));
    const auto& expected = plan_.measured.candidates;
    if (next_ >= expected.size()) {
      throw PlanMismatch(c10::str("the step reached candidate \"", resolved, "\" after the ",
                                  expected.size(), " candidates of the profiled step"),
                         reached_);
    }
    const std::string mismatch = first_mismatch(expected[next_], reached_.back());
    if (!mismatch.empty()) throw PlanMismatch(mismatch, reached_);
    const size_t c = next_++;
    offloads_.take_last();  // a group that finished before it is not its own
    // Its region's memory and report are named after it: "blocks.3/region 1".
    label_.emplace(resolved);
    std::vector<int> producers;
    auto sources = recomputable_.sources_for(inputs, producers);
    keep_skips(c, producers, sources);
    if (plan_.regions[c]) {  // a region drops the outputs of "recomputed" candidates it takes
      request.input_sources = std::move(sources);
      request.recomputable_outputs = plan_.recomputable[c];
      if (plan_.parts_checkpointed[c]) request.inner_candidates = plan_.regions[c];
    }
    if (KeptReport* report = detail::active_report()) {
      first_region_ = report->regions().size();
      // A report lists what a plain candidate's graph keeps.
      if (!plan_.regions[c] && !inputs.empty()) {
        kept_.emplace(inputs.front().device());
        kept_inputs_ = inputs;
      }
    }
    return plan_.regions[c];
  }
  void end(std::vector<at::Tensor>& outputs, const detail::RegionRequest& request) override {
    if (detail::active_report() != nullptr) report_candidate(outputs);
    label_.reset();
    recomputable_.add(static_cast<int>(next_) - 1, outputs, request);
    bring_back_at_backward(next_ - 1, outputs);
  }
  void abandon() noexcept override {
    kept_.reset();
    kept_inputs_.clear();
    label_.reset();
  }

  void finish() {
    const auto& expected = plan_.measured.candidates;
    if (next_ != expected.size()) {
      throw PlanMismatch(
          c10::str("the step reached ", next_, " of the ", expected.size(),
                   " candidates of the profiled step, not \"", expected[next_].name, "\""),
          reached_, /*step_ended=*/true);
    }
    report_held_outputs();
  }

 private:
  // A "recomputed, skips kept" producer's outputs are let go of by the first candidate that takes
  // one, as the profile measured it; a later one keeps what it takes.
  void keep_skips(size_t c, const std::vector<int>& producers,
                  std::vector<std::shared_ptr<const detail::RecomputeSource>>& sources) {
    for (size_t i = 0; i < producers.size(); ++i) {
      const int p = producers[i];
      if (p < 0 || !run_of(static_cast<size_t>(p)).later_takers_keep_outputs()) continue;
      int& first = first_taker_[p];
      if (first < 0) first = static_cast<int>(c);
      if (first != static_cast<int>(c)) sources[i] = nullptr;
    }
  }
  const plan::OptionRun& run_of(size_t c) const {
    return plan_.measured.profile.candidates[c].options[plan_.solution.choice[c]].run;
  }

  // A "kept" candidate's graph. The outputs of every candidate are watched: a later candidate's
  // graph (or the loss's) may hold them, which is known only at the step's end.
  void report_candidate(const std::vector<at::Tensor>& outputs) {
    KeptReport& report = *detail::active_report();
    if (kept_) {
      RegionReport region;
      region.name = MemoryLabel::current();
      region.mode = "kept";
      const size_t index = detail::ReportAccess::add_region(report, std::move(region));
      kept_->add_graph(report, index, outputs, kept_inputs_);
      kept_.reset();
      kept_inputs_.clear();
    }
    if (report.regions().size() == first_region_) return;  // ran as nothing that keeps
    const size_t index = report.regions().size() - 1;      // its outermost region finished last
    for (const at::Tensor& output : outputs) {
      if (output.defined() && output.has_storage())
        outputs_.push_back(
            {index, output.storage().getWeakStorageImpl(), detail::StorageView(output)});
    }
  }

  // Where candidate c's backward begins, its offloaded data comes back (where the profile
  // measured it), and behind it that of the candidate it looks ahead to (where the plan counted
  // it): those copies run beside this backward.
  void bring_back_at_backward(size_t c, const std::vector<at::Tensor>& outputs) {
    const bool offloaded = plan_.regions[c] && plan_.regions[c]->offload();
    if (offloaded) (*groups_)[c] = offloads_.take_last();
    const auto& look_ahead = plan_.solution.look_ahead;
    const int ahead = look_ahead.empty() ? -1 : look_ahead[c];
    if (!offloaded && ahead < 0) return;
    detail::at_first_gradient(outputs, [groups = groups_, c, ahead] {
      if (const std::shared_ptr<detail::OffloadGroup> own = (*groups)[c].lock()) own->prefetch();
      if (ahead < 0) return;
      if (const auto next = (*groups)[static_cast<size_t>(ahead)].lock()) next->prefetch_ahead();
    });
  }

  void report_held_outputs() {
    KeptReport* report = detail::active_report();
    for (const CandidateOutput& output : outputs_) {
      const auto storage = output.storage.lock();
      if (report == nullptr || !storage) continue;  // nothing held it
      detail::ReportAccess::add_tensor(*report, output.region, "output",
                                       "a later graph of the step holds it for the backward",
                                       KeptDecision::Kept, output.view.on(c10::Storage(storage)));
    }
    outputs_.clear();
  }

  using Groups = std::vector<std::weak_ptr<detail::OffloadGroup>>;  // by candidate

  const Plan& plan_;
  detail::CandidateCalls calls_;
  detail::ManualOffloadScope& offloads_;
  std::shared_ptr<Groups> groups_;  // the step's offloaded candidates' data, for its backward
  // Under a report: the running candidate's first region, and if it runs plainly, what it holds.
  size_t first_region_ = 0;
  std::optional<detail::HeldSince> kept_;
  std::vector<at::Tensor> kept_inputs_;
  struct CandidateOutput {
    size_t region;
    c10::weak_intrusive_ptr<c10::StorageImpl> storage;  // not holding it
    detail::StorageView view;
  };
  std::vector<CandidateOutput> outputs_;
  size_t next_ = 0;
  std::vector<ProfiledCandidate> reached_;    // this step's candidates so far
  detail::RecomputableOutputs recomputable_;  // this step's "recomputed" candidates' outputs
  std::vector<int> first_taker_;              // by candidate: the first that took its outputs
  std::optional<MemoryLabel> label_;  // the running candidate's (candidates do not nest here)
};

PlannedModel::PlannedModel(std::shared_ptr<torch::nn::Module> model, Budget budget,
                           PlannedModelOptions options)
    : model_(std::move(model)), budget_(budget), options_(std::move(options)) {
  TORCH_CHECK(model_ != nullptr, "ckpt::PlannedModel: the model is empty (a null module holder).");
}

at::Tensor PlannedModel::run(const std::function<at::Tensor()>& loss_fn) {
  if (!at::GradMode::is_enabled()) return loss_fn();  // nothing is saved: candidates run plainly
  if (!plan_) plan(loss_fn);
  if (options_.on_out_of_memory() == OutOfMemory::Replan) return run_surviving(loss_fn);
  return run_checked(loss_fn);
}

at::Tensor PlannedModel::run_checked(const std::function<at::Tensor()>& loss_fn) {
  const auto step = [&] {
    if (plan_->conditions) {
      const std::string change =
          detail::StepConditions::current(*model_, plan_->measured.device.type())
              .change_from(*plan_->conditions, "the model");
      if (!change.empty()) throw PlanMismatch(change);
    }
    return run_planned(loss_fn);
  };
  std::optional<PlanMismatch> mismatch;
  std::optional<at::Tensor> loss = run_or_put_back(model_, step, mismatch);
  if (loss) return *loss;
  // A plan kept for another step may be this one's: tried where it fits what the step reached
  // (a mismatch puts the state back again).
  const PlanMismatch change = *mismatch;
  const auto runs_the_step = [&](const Plan& kept) {
    // A mismatch of the step's conditions reached no candidate: any kept plan may be its.
    return fits_reached(kept.measured.candidates, change.reached, change.step_ended) &&
           (loss = run_or_put_back(model_, step, mismatch)).has_value();
  };
  if (detail::switch_to_other_plan(other_plans_, *plan_, runs_the_step)) return *loss;
  detail::on_input_change("ckpt::PlannedModel", options_.on_input_change(), change.what(),
                          "The step did not run and the model's state is as it was. Plan with the "
                          "largest input (plan(loss_fn)), or let it re-plan: "
                          "PlannedModelOptions().on_input_change(InputChange::Replan).");
  detail::replace_current_plan(other_plans_, *plan_, profile_and_solve(loss_fn), serves<Plan>);
  if ((loss = run_or_put_back(model_, step, mismatch))) return *loss;
  TORCH_CHECK(false, "ckpt::PlannedModel: ", mismatch->what(),
              " right after profiling the same step: the model's candidates change from one "
              "forward to the next. Mark only blocks that every step reaches in the same order.");
}

// The step's loss for the caller: its backward runs the backward of the loss `loss_fn` returned
// (a backward inside a backward, as the reentrant checkpoint runs one), and where that runs out
// of device memory, lets go of the step's graph and runs the step again under a plan for less.
class PlannedModel::RetryingBackward final : public compat::OwningNode {
 public:
  RetryingBackward(PlannedModel& owner, std::shared_ptr<detail::StepStart> start,
                   std::function<at::Tensor()> loss_fn, at::Tensor loss)
      : owner_(owner),
        start_(std::move(start)),
        loss_fn_(std::move(loss_fn)),
        loss_(std::move(loss)) {}

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_CHECK(loss_.defined(),
                "ckpt::PlannedModel: Trying to backward through a step's loss a second time. "
                "With OutOfMemory::Replan its backward runs once, without retain_graph: run the "
                "step again.");
    TORCH_CHECK(!at::GradMode::is_enabled(),
                "ckpt::PlannedModel: with OutOfMemory::Replan, the loss has no double backward "
                "(create_graph=true). Use OutOfMemory::Raise for higher-order gradients.");
    TORCH_CHECK(torch::autograd::Engine::get_default_engine().is_checkpoint_valid(),
                "ckpt::PlannedModel: with OutOfMemory::Replan, call loss.backward(): the step's "
                "backward gives the parameters their gradients itself, so torch::autograd::grad "
                "and backward(inputs=...) can't be served.");
    for (;;) {
      try {
        torch::autograd::backward({loss_}, {grads[0]});
        loss_.reset();
        return {};
      } catch (c10::OutOfMemoryError& error) {
        loss_.reset();  // the step's graph: what ran out of memory lets go of it first
        loss_ = owner_.run_again(error, *start_, loss_fn_, /*in_backward=*/true);
      }
    }
  }

  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    loss_.reset();
  }
  std::string name() const override { return "ckpt::PlannedModelStepBackward"; }

 private:
  void release_owned() override {
    loss_.reset();
    loss_fn_ = nullptr;
  }

  PlannedModel& owner_;
  std::shared_ptr<detail::StepStart> start_;
  std::function<at::Tensor()> loss_fn_;
  at::Tensor loss_;
};

at::Tensor PlannedModel::run_surviving(const std::function<at::Tensor()>& loss_fn) {
  auto start = std::make_shared<detail::StepStart>(*model_, model_->parameters());
  at::Tensor loss;
  try {
    loss = run_checked(loss_fn);
  } catch (c10::OutOfMemoryError& error) {
    loss = run_again(error, *start, loss_fn, /*in_backward=*/false);
  }
  if (!loss.requires_grad()) return loss;
  auto node = compat::make_node<RetryingBackward>(*this, std::move(start), loss_fn, loss);
  return detail::output_of(node, loss.detach());
}

at::Tensor PlannedModel::run_again(c10::OutOfMemoryError& error, detail::StepStart& start,
                                   const std::function<at::Tensor()>& loss_fn, bool in_backward) {
  return start.run_again(
      error, in_backward,
      [&](c10::OutOfMemoryError& failed, std::optional<int64_t> held) {
        replan_for_less(failed, held, in_backward);
      },
      [&] { return run_planned(loss_fn); });
}

void PlannedModel::replan_for_less(c10::OutOfMemoryError& error, std::optional<int64_t> held_bytes,
                                   bool in_backward) {
  const Plan& failed = current();
  const int64_t smallest =
      plan_budget(failed.measured.profile, solver_options(options_), Budget::minimum(), options_)
          .bytes;
  std::optional<Plan> smaller;
  int64_t smaller_budget = 0;
  detail::plan_for_less("ckpt::PlannedModel", error, in_backward, held_bytes, failed.budget_bytes,
                        failed.solution.prediction.peak_bytes, smallest, [&](int64_t next) {
                          smaller = make_plan(MeasuredModel(failed.measured), Budget::bytes(next));
                          smaller_budget = next;
                          return smaller->solution.prediction.peak_bytes;
                        });
  smaller->conditions = failed.conditions;
  budget_ = Budget::bytes(smaller_budget);  // later plans (a changed input) stay as small
  plan_ = std::move(smaller);
  other_plans_.clear();  // made for the budget before
}

at::Tensor PlannedModel::run_planned(const std::function<at::Tensor()>& loss_fn) {
  // The plan brings each offloaded candidate's data back where it counted it (the runner does),
  // never ahead by itself.
  detail::ManualOffloadScope offloads;
  Runner runner(*plan_, *plan_->names, offloads);
  at::Tensor loss;
  {
    const detail::CandidateRunnerScope scope(&runner);
    loss = loss_fn();
  }
  runner.finish();
  detail::check_step_loss(loss);
  return loss;
}

void PlannedModel::plan(const std::function<at::Tensor()>& loss_fn) {
  plan_ = profile_and_solve(loss_fn);
  other_plans_.clear();
}

void PlannedModel::plan(MeasuredModel measured) {
  plan_ = make_plan(std::move(measured), budget_);
  other_plans_.clear();
}

PlannedModel::Plan PlannedModel::profile_and_solve(
    const std::function<at::Tensor()>& loss_fn) const {
  ModelProfiler profiler(model_, loss_fn,
                         ModelProfileOptions()
                             .storage_modes(options_.storage_modes())
                             .selective_policy(options_.selective_policy())
                             .count_parameter_gradients(options_.count_parameter_gradients())
                             .preserve_rng_state(options_.preserve_rng_state())
                             .recompute_outputs(options_.recompute_outputs())
                             .max_recompute_chain(options_.max_recompute_chain())
                             .host_budget_bytes(options_.host_budget_bytes()));
  const bool every_option = !options_.measure_as_needed() || budget_.is_minimum() ||
                            options_.on_out_of_memory() == OutOfMemory::Replan;
  std::optional<MeasuredModel> measured;
  while (!profiler.complete()) {
    if (!every_option) {
      measured = profiler.measured();
      if (fits_budget(measured->profile)) break;
    }
    profiler.measure_more(loss_fn);
    measured.reset();
  }
  Plan next = make_plan(measured ? std::move(*measured) : profiler.measured(), budget_);
  // Profiling left the model as it found it.
  next.conditions = std::make_shared<const detail::StepConditions>(
      detail::StepConditions::current(*model_, next.measured.device.type()));
  return next;
}

bool PlannedModel::fits_budget(const plan::ModelProfile& profile) const {
  const detail::BudgetLimits limits = budget_limits(profile, solver_options(options_), options_);
  const int64_t smallest = detail::smallest_budget(limits);
  return budget_.resolve(limits.plain_peak_bytes, smallest) >= smallest;
}

PlannedModel::Plan PlannedModel::make_plan(MeasuredModel measured, const Budget& budget) const {
  const plan::ModelProfile& profile = measured.profile;  // the solvers validate it
  const plan::ModelSolverOptions solver = solver_options(options_);
  const detail::ResolvedBudget resolved = plan_budget(profile, solver, budget, options_);
  plan::ModelPlan solution = plan::solve_model(profile, resolved.solved_for, solver);
  // Where the plain step fits, a plan no faster runs it, as PlannedSequential runs its plain
  // chain: a mode timed at the plain step's time (its floor, where noise measured it faster)
  // would otherwise win the tie on its lower peak, and cost its copies or recomputes for nothing.
  if (resolved.fits_plain_step) {
    plan::ModelPlan plain = plain_plan(profile);
    if (solution.prediction.time >= plain.prediction.time) solution = std::move(plain);
  }
  solution = plan::add_look_ahead(profile, std::move(solution), resolved.solved_for);
  TORCH_CHECK(solution.feasible, "ckpt::PlannedModel: the solver found no choice within ",
              resolved.solved_for, " bytes although its smallest feasible budget is ",
              resolved.smallest, "; please report this with the model.");
  Plan next{std::move(measured),
            std::move(solution),
            resolved.bytes,
            {},
            std::make_shared<const detail::CandidateNames>(*model_),
            {},
            {},
            {}};
  const StorageSettings settings{options_.selective_policy()};
  const auto& candidates = next.measured.profile.candidates;  // `profile` was moved from
  for (size_t c = 0; c < candidates.size(); ++c) {
    const plan::OptionRun& run = candidates[c].options[next.solution.choice[c]].run;
    std::optional<CheckpointOptions> region;
    if (!run.mode.empty()) {
      region =
          detail::candidate_region(options_.storage_modes().at(run.mode, "ckpt::PlannedModel"),
                                   settings, next.measured.device, options_.preserve_rng_state());
      TORCH_CHECK(region.has_value(), "ckpt::PlannedModel: the storage mode \"", run.mode,
                  "\" is off with these options; the measurement offers it.");
    }
    next.regions.push_back(region);
    next.recomputable.push_back(run.outputs_recomputed);  // a checkpointed region, outputs dropped
    next.parts_checkpointed.push_back(run.parts_checkpointed);
  }
  return next;
}

const PlannedModel::Plan& PlannedModel::current() const {
  TORCH_CHECK(plan_.has_value(),
              "ckpt::PlannedModel: not planned yet; call run(loss_fn) or "
              "plan(loss_fn) first.");
  return *plan_;
}

const MeasuredModel& PlannedModel::measured() const {
  return current().measured;
}
const plan::ModelPlan& PlannedModel::solution() const {
  return current().solution;
}
int64_t PlannedModel::budget_bytes() const {
  return current().budget_bytes;
}
int64_t PlannedModel::plain_peak_bytes() const {
  return current().measured.profile.plain_peak_bytes();
}

const std::string& PlannedModel::mode_of(const std::string& name) const {
  const Plan& plan = current();
  const auto& candidates = plan.measured.profile.candidates;
  for (size_t c = 0; c < candidates.size(); ++c) {
    if (candidates[c].name == name) return candidates[c].options[plan.solution.choice[c]].name;
  }
  TORCH_CHECK(false, "ckpt::PlannedModel: no candidate is named \"", name, "\".");
}

std::string PlannedModel::summary() const {
  const Plan& plan = current();
  std::ostringstream out;
  const auto& prediction = plan.solution.prediction;
  // MiB and ms for people, as `ckpt train` prints them; the budget's exact bytes beside it.
  const auto mib = [](int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); };
  out << std::fixed << std::setprecision(1) << "budget " << mib(plan.budget_bytes) << " MiB ("
      << plan.budget_bytes << " bytes) of a plain peak of "
      << mib(plan.measured.profile.plain_peak_bytes()) << " MiB; predicted peak "
      << mib(prediction.peak_bytes) << " MiB, step " << prediction.time * 1e3 << " ms (plain "
      << plan.measured.profile.step_time * 1e3 << " ms); " << proven(plan.solution) << "\n";
  const auto& candidates = plan.measured.profile.candidates;
  const auto& look_ahead = plan.solution.look_ahead;
  for (size_t c = 0; c < candidates.size(); ++c) {
    out << "  " << std::left << std::setw(24) << candidates[c].name << " "
        << candidates[c].options[plan.solution.choice[c]].name;
    if (!look_ahead.empty() && look_ahead[c] >= 0) {
      out << " (brings back " << candidates[static_cast<size_t>(look_ahead[c])].name << ")";
    }
    out << "\n";
  }
  return out.str();
}

}  // namespace ckpt
