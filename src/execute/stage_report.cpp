#include "stage_report.h"

#include <utility>

namespace ckpt {
namespace detail {
namespace {

bool plain(const plan::Op& op) {
  return op.kind == plan::OpKind::ForwardAll && op.option == 0;
}

}  // namespace

StageReport::StageReport(KeptReport& report, const plan::Op& op, const at::Tensor& input,
                         std::string mode)
    : report_(report),
      op_(op),
      input_(input),
      name_("stage " + std::to_string(op.stage)),
      mode_(std::move(mode)),
      first_(report.regions().size()) {
  if (!plain(op)) return;
  // The calling thread's allocations on the CPU; a device's allocator counts every thread's.
  const bool cpu = input.device().is_cpu();
  tracker_.emplace(input.device(), cpu ? MemoryScope::CallingThread : MemoryScope::Process);
  before_ = tracker_->current_bytes();
}

void StageReport::finish(bool input_held, const at::Tensor& output, const RngStash* rng,
                         bool last) {
  auto& regions = ReportAccess::regions(report_);
  size_t region = 0;
  if (regions.size() > first_) {  // it ran as a region: the region's report is the stage's
    for (size_t r = first_; r < regions.size(); ++r) {
      regions[r].stage = name_;
      regions[r].mode = mode_;
    }
    region = regions.size() - 1;  // the stage's outermost region finished last
  } else {
    RegionReport stage;
    stage.name = name_;
    stage.stage = name_;
    stage.mode = mode_;
    if (op_.kind == plan::OpKind::ForwardNone)
      stage.note = "Keeps nothing: the schedule runs it again in the backward.";
    region = ReportAccess::add_region(report_, std::move(stage));
  }
  if (input_held) {
    ReportAccess::add_tensor(report_, region, "input",
                             op_.kind == plan::OpKind::ForwardAll
                                 ? "the executor holds it until the stage's backward"
                                 : "the schedule keeps it: the stage runs again from it",
                             KeptDecision::Kept, input_);
  }
  if (tracker_) add_graph(output);
  if (output.defined() && !last) {
    ReportAccess::add_tensor(report_, region, "output",
                             "the stage's graph holds it until its backward; the next stage "
                             "reads it",
                             KeptDecision::Kept, output);
  }
  if (rng != nullptr && rng->cpu_state().defined()) {
    ReportAccess::add_tensor(report_, region, "RNG state (cpu)",
                             "the stage drew random numbers: its recompute replays them",
                             KeptDecision::Kept, rng->cpu_state());
  }
}

// A plain stage keeps its whole graph: autograd's saved tensors, as the tracker measures them,
// less its output (an entry of its own, or the caller's for the last stage).
void StageReport::add_graph(const at::Tensor& output) {
  int64_t graph = tracker_->current_bytes() - before_;
  if (output.has_storage() &&
      output.storage().unsafeGetStorageImpl() != input_.storage().unsafeGetStorageImpl()) {
    graph -= static_cast<int64_t>(output.storage().nbytes());
  }
  ReportAccess::add_measured(report_, ReportAccess::regions(report_).size() - 1, "graph",
                             "what autograd saves for the stage's backward (measured)", graph);
}

}  // namespace detail
}  // namespace ckpt
