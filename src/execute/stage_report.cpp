#include "stage_report.h"

#include "compat/torch_compat.h"

#include <algorithm>
#include <utility>

namespace ckpt {
namespace detail {
namespace {

bool plain(const plan::Op& op) {
  return op.kind == plan::OpKind::ForwardAll && op.option == 0;
}

}  // namespace

HeldSince::HeldSince(c10::Device device) : device_(device) {
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

int64_t HeldSince::allocated() const {
  return tracker_ ? tracker_->current_bytes()
                  : compat::device_memory_stats(device_).allocated_bytes;
}

void HeldSince::add_graph(KeptReport& report, size_t region, const std::vector<at::Tensor>& outputs,
                          const std::vector<at::Tensor>& inputs) const {
  if (!measured_) {
    ReportAccess::regions(report)[region].note =
        "Keeps its whole graph, which this LibTorch cannot measure on " + device_.str() + ".";
    return;
  }
  int64_t graph = allocated() - before_;
  std::vector<const c10::StorageImpl*> seen;
  for (const at::Tensor& t : inputs) {
    if (t.defined() && t.has_storage()) seen.push_back(t.storage().unsafeGetStorageImpl());
  }
  for (const at::Tensor& output : outputs) {
    if (!output.defined() || !output.has_storage()) continue;
    const c10::StorageImpl* storage = output.storage().unsafeGetStorageImpl();
    if (std::find(seen.begin(), seen.end(), storage) != seen.end()) continue;
    seen.push_back(storage);
    graph -= static_cast<int64_t>(output.storage().nbytes());
  }
  ReportAccess::add_measured(report, region, "graph",
                             "what autograd saves for its backward (measured)", graph, device_);
}

StageReport::StageReport(KeptReport& report, const plan::Op& op, const at::Tensor& input,
                         std::string mode)
    : report_(report),
      op_(op),
      input_(input),
      name_("stage " + std::to_string(op.stage)),
      mode_(std::move(mode)),
      first_(report.regions().size()) {
  if (plain(op)) held_.emplace(input.device());
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
  // A plain stage keeps its whole graph: autograd's saved tensors, less its output (an entry of
  // its own, or the caller's for the last stage).
  if (held_) held_->add_graph(report_, region, {output}, {input_});
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

}  // namespace detail
}  // namespace ckpt
