#include "report_record.h"

#include <ckpt/memory_label.h>

#include "region_state.h"
#include "selective.h"

#include <ATen/core/enum_tag.h>

#include <algorithm>
#include <utility>

namespace ckpt {
namespace detail {
namespace {

std::string nth_output(const std::string& name, size_t k, size_t count) {
  return count > 1 ? name + " output #" + std::to_string(k) : name;
}

// An entry's metadata from where an offloaded tensor lay on its device.
KeptEntry entry_of(const StorageView& view, c10::Device device) {
  KeptEntry entry;
  entry.shape = view.sizes;
  entry.dtype = c10::typeMetaToScalarType(view.dtype);
  entry.device = device;
  int64_t numel = 1;
  for (const int64_t size : view.sizes) numel *= size;
  entry.bytes = numel * static_cast<int64_t>(view.dtype.itemsize());
  return entry;
}

}  // namespace

void ReportMode::dispatch(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const size_t count = op.schema().arguments().size();
  std::vector<const c10::StorageImpl*> arguments;
  for (size_t i = stack->size() - count; i < stack->size(); ++i) {
    for_each_tensor((*stack)[i], [&](const at::Tensor& t) { arguments.push_back(storage_of(t)); });
  }
  const size_t kept_before = kept_ != nullptr ? kept_->entries.size() : 0;
  run(op, stack);
  if (kept_ != nullptr && kept_->entries.size() > kept_before) return;  // KeptOutputs lists it
  RecordedOp record{
      operator_label(op.operator_name()), op.hasTag(at::Tag::nondeterministic_seeded), {}};
  const size_t returns = std::min(op.schema().returns().size(), stack->size());
  for (size_t i = stack->size() - returns; i < stack->size(); ++i) {
    for_each_tensor((*stack)[i], [&](const at::Tensor& t) {
      const c10::StorageImpl* storage = storage_of(t);
      if (storage == nullptr ||
          std::find(arguments.begin(), arguments.end(), storage) != arguments.end())
        return;
      record.outputs.push_back({t.sizes().vec(), t.scalar_type(), t.device(),
                                static_cast<int64_t>(t.numel() * t.element_size()), storage});
    });
  }
  if (!record.outputs.empty()) ops_.push_back(std::move(record));
}

RegionRecord::RegionRecord(KeptReport& report, std::string name, std::string mode)
    : report_(report),
      name_(std::move(name)),
      mode_(std::move(mode)),
      first_nested_(report.regions().size()) {}

std::vector<RecordedOp>& RegionRecord::start_forward() {
  ops_.clear();
  return ops_;
}

size_t RegionRecord::add(std::string note) {
  RegionReport region;
  region.name = name_;
  region.mode = mode_;
  region.note = std::move(note);
  return ReportAccess::add_region(report_, std::move(region));
}

void RegionRecord::keeps_graph() {
  add("It wrote into an argument in place, so this call keeps its whole forward graph instead "
      "(see the warning), which the report does not measure.");
}

void RegionRecord::finish(const RegionState& state, bool holds) {
  // The regions recorded since this one started ran inside its forward: their state goes with
  // the graph this region lets go of.
  if (report_.regions().size() > first_nested_) {
    ReportAccess::freed_with(report_, first_nested_, name_);
  }
  if (!holds) {
    add("No output needs a gradient: it keeps nothing and recomputes nothing.");
    return;
  }
  const size_t region = add("");
  add_kept(region, state);
  const std::string why =
      state.kept ? "the policy does not save it" : "the region recomputes every operator";
  for (const RecordedOp& op : ops_) {
    for (size_t k = 0; k < op.outputs.size(); ++k) {
      const RecordedOp::Output& output = op.outputs[k];
      KeptEntry entry;
      entry.what = nth_output(op.name, k, op.outputs.size());
      entry.why = op.random ? "it draws random numbers: never kept" : why;
      entry.shape = output.shape;
      entry.dtype = output.dtype;
      entry.device = output.device;
      entry.bytes = output.bytes;
      ReportAccess::add_recomputed(report_, region, std::move(entry));
    }
  }
}

void RegionRecord::add_kept(size_t region, const RegionState& state) {
  const auto kept = [&](std::string what, std::string why, const at::Tensor& tensor) {
    if (tensor.defined())
      ReportAccess::add_tensor(report_, region, std::move(what), std::move(why), KeptDecision::Kept,
                               tensor);
  };
  for (size_t i = 0; i < state.inputs.size(); ++i) {
    kept("argument #" + std::to_string(i), "the recompute starts from it", state.inputs[i]);
    if (state.input_copies.copied(i)) {
      kept("copy of argument #" + std::to_string(i),
           "the function writes into the argument in place: the recompute starts from this copy",
           state.input_copies.kept(i));
    }
  }
  if (state.kept) add_policy_kept(region, *state.kept);
  if (!state.rng.has_value()) return;
  kept("RNG state (cpu)", "the forward drew random numbers: the recompute replays them",
       state.rng->cpu_state());
  for (size_t k = 0; k < state.rng->device_states().size(); ++k) {
    kept("RNG state (" + state.rng->device_generators()[k].device().str() + ")",
         "the recompute replays the device's random numbers", state.rng->device_states()[k]);
  }
}

OffloadedRecord::OffloadedRecord(KeptReport& report)
    : report_(report), name_(MemoryLabel::current()), mode_(nullptr, ops_) {
  recording_.emplace(mode_);
}

// The operator whose output last took `data` in the forward (the slot held it from then on).
const RecordedOp::Output* OffloadedRecord::producer(const c10::StorageImpl* data,
                                                    std::string& name) const {
  for (auto op = ops_.rbegin(); op != ops_.rend(); ++op) {
    for (size_t k = 0; k < op->outputs.size(); ++k) {
      if (op->outputs[k].storage != data) continue;
      name = nth_output(op->name, k, op->outputs.size());
      return &op->outputs[k];
    }
  }
  return nullptr;
}

void OffloadedRecord::finish(const OffloadGroup& group, const std::vector<at::Tensor>& inputs) {
  recording_.reset();
  RegionReport report_region;
  report_region.name = name_;
  report_region.mode = "offloaded";
  const size_t region = ReportAccess::add_region(report_, std::move(report_region));
  for (const OffloadGroup::SlotState& slot : group.slot_states()) {
    if (slot.data == nullptr) continue;
    const auto input = std::find_if(inputs.begin(), inputs.end(), [&](const at::Tensor& t) {
      return t.defined() && t.has_storage() && t.storage().unsafeGetStorageImpl() == slot.data;
    });
    if (input != inputs.end()) {
      ReportAccess::add_tensor(report_, region,
                               "argument #" + std::to_string(input - inputs.begin()),
                               "autograd saves it; the caller holds it, so it stays on the device",
                               KeptDecision::Kept, *input);
      continue;
    }
    // An output, a frozen parameter, data the caller holds: the device keeps it anyway.
    if (slot.host_bytes == 0) continue;
    KeptEntry entry;
    entry.why = "autograd saves it; the region offloads what it computes";
    entry.device = slot.where;
    if (const RecordedOp::Output* output = producer(slot.data, entry.what)) {
      entry.shape = output->shape;
      entry.dtype = output->dtype;
      entry.bytes = output->bytes;
    } else {
      entry.what = "saved tensor";  // made before the region
      entry.bytes = slot.host_bytes;
    }
    ReportAccess::add_offloaded(report_, region, std::move(entry), slot.host_bytes);
  }
}

// The outputs a selective policy kept: on the device, or (offloaded) as host copies.
void RegionRecord::add_policy_kept(size_t region, const KeptOutputs& kept) {
  std::vector<OffloadGroup::SlotState> slots;
  if (kept.offloaded) slots = kept.offloaded->slot_states();
  std::vector<bool> counted(slots.size(), false);  // a host copy counts once
  for (const KeptOutputs::Entry& entry : kept.entries) {
    // As `watches` lists them: an offloaded output's place holds an undefined tensor.
    std::vector<at::Tensor> tensors;
    for (const c10::IValue& value : entry.returns) {
      if (value.isTensor()) tensors.push_back(value.toTensor());
      if (value.isTensorList()) {
        for (const at::Tensor& t : value.toTensorList().vec()) tensors.push_back(t);
      }
    }
    for (size_t k = 0; k < tensors.size(); ++k) {
      std::string what = nth_output(operator_label(entry.op), k, tensors.size());
      const auto& host_copy = entry.watches.at(k).host_copy;
      if (host_copy) {
        const size_t slot = host_copy->slot;
        KeptEntry offloaded = entry_of(host_copy->view, slots[slot].where);
        offloaded.what = std::move(what);
        offloaded.why = entry.must ? "the policy offloads it (MustOffload)"
                                   : "the policy offloads it (PreferOffload)";
        ReportAccess::add_offloaded(report_, region, std::move(offloaded),
                                    counted[slot] ? 0 : slots[slot].host_bytes);
        counted[slot] = true;
      } else if (tensors[k].defined()) {
        ReportAccess::add_tensor(
            report_, region, std::move(what),
            entry.must ? "the policy saves it (MustSave)" : "the policy saves it (PreferSave)",
            KeptDecision::Kept, tensors[k]);
      }
    }
  }
}

}  // namespace detail
}  // namespace ckpt
