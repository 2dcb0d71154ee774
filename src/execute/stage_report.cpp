#include "stage_report.h"

#include "compat/torch_compat.h"

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
      first_(report.regions().size()),
      device_(input.device()) {
  if (!plain(op)) return;
  // On the CPU, a tracker of the thread's allocations; on a device, its allocator's count (every
  // thread's): a MemoryTracker there would restart the device's high-water mark, which the
  // caller may be measuring.
  if (device_.is_cpu()) {
    tracker_.emplace(device_, MemoryScope::CallingThread);
  } else if (!compat::device_memory_measurable(device_.type())) {
    return;  // not measured: a note says so
  } else if (!device_.has_index()) {
    device_.set_index(0);
  }
  measured_ = true;
  before_ = allocated();
}

int64_t StageReport::allocated() const {
  return tracker_ ? tracker_->current_bytes()
                  : compat::device_memory_stats(device_).allocated_bytes;
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
  if (plain(op_)) add_graph(output);
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
  const size_t region = ReportAccess::regions(report_).size() - 1;
  if (!measured_) {
    ReportAccess::regions(report_)[region].note =
        "Keeps its whole graph, which this LibTorch cannot measure on " + device_.str() + ".";
    return;
  }
  int64_t graph = allocated() - before_;
  if (output.has_storage() &&
      output.storage().unsafeGetStorageImpl() != input_.storage().unsafeGetStorageImpl()) {
    graph -= static_cast<int64_t>(output.storage().nbytes());
  }
  ReportAccess::add_measured(report_, region, "graph",
                             "what autograd saves for the stage's backward (measured)", graph,
                             device_);
}

}  // namespace detail
}  // namespace ckpt
