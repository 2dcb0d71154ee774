#include "measure/policy_preview.h"

namespace ckpt {
namespace detail {
namespace {

// Whether the call makes new outputs: no view, no write into an argument (in place or out=). A
// random draw does: a selective region drops it.
bool makes_new_outputs(const c10::OperatorHandle& op) {
  return !op.schema().is_mutable() && !returns_a_view(op);
}

// Whether a selective region keeps the new outputs of `op` where it is, where its policy says
// `decision`: saved (offloaded ones leave the device), outputs a region can keep, and not a
// `checkpoint_name` call (whose decision is the named tensor's producer's). Each exception may
// only under-count what a policy keeps, and so only measure a mode the preview could have skipped.
bool would_keep(CheckpointPolicy decision, const c10::OperatorHandle& op) {
  if (decision != CheckpointPolicy::MustSave && decision != CheckpointPolicy::PreferSave)
    return false;
  return op.schema().name() != "ckpt::name" && why_outputs_cannot_be_kept(op) == nullptr;
}

}  // namespace

void PolicyPreview::dispatch(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (!makes_new_outputs(op)) {
    run(op, stack);
    return;
  }
  const size_t count = op.schema().arguments().size();
  std::vector<bool> kept(policies_.size());
  for (size_t p = 0; p < policies_.size(); ++p) {
    const OpCall call{op.schema(),
                      c10::ArrayRef<c10::IValue>(stack->data() + stack->size() - count, count)};
    kept[p] = would_keep(policies_[p](call), op);
  }
  run(op, stack);
  const size_t returns = op.schema().returns().size();
  for (size_t r = stack->size() - returns; r < stack->size(); ++r) {
    for_each_tensor((*stack)[r], [&](const at::Tensor& t) {
      const c10::StorageImpl* storage = storage_of(t);
      if (storage == nullptr || t.is_inference()) return;
      const c10::VariableVersion& counter = t.unsafeGetTensorImpl()->version_counter();
      outputs_.push_back({storage, counter, counter.current_version(), kept});
    });
  }
}

PolicyPreview::Made PolicyPreview::take() {
  Made made;
  made.kept.resize(policies_.size());
  for (const Output& o : outputs_) {
    made.storages.insert(o.storage);
    if (o.counter.current_version() != o.version) continue;  // a selective region recomputes it
    for (size_t p = 0; p < policies_.size(); ++p) {
      if (o.kept[p]) made.kept[p].insert(o.storage);
    }
  }
  outputs_.clear();
  return made;
}

}  // namespace detail
}  // namespace ckpt
