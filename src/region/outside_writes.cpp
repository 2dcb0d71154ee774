#include "outside_writes.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/nn/module.h>

namespace ckpt {
namespace detail {
namespace {

// What ckpt runs itself (copies, comparisons) reaches neither the modes below (a recording or
// replaying mode counts operators) nor autograd.
struct ModesOff {
  c10::impl::ExcludeDispatchKeyGuard off{c10::DispatchKey::Fake};
  at::NoGradGuard no_grad;
};

// All of `storage`'s bytes, through a tensor of its own (its own version counter).
at::Tensor bytes_of(const c10::Storage& storage) {
  const auto n = static_cast<int64_t>(storage.nbytes());
  return at::empty({0}, at::TensorOptions().dtype(at::kByte).device(storage.device()))
      .set_(storage, 0, {n}, {1});
}

}  // namespace

bool updates_running_statistics(const c10::OperatorHandle& op) {
  const std::string& name = op.operator_name().name;
  return name.find("batch_norm") != std::string::npos ||
         name.find("instance_norm") != std::string::npos;
}

OutsideStateWatch::OutsideStateWatch(const std::vector<at::Tensor>& known,
                                     const ModuleList& modules) {
  for (const auto& tensor : known) inside_.insert(storage_of(tensor));
  for (const auto& module : modules) {
    for (const auto& tensor : module->parameters()) inside_.insert(storage_of(tensor));
    for (const auto& tensor : module->buffers()) inside_.insert(storage_of(tensor));
  }
}

OutsideStateWatch::~OutsideStateWatch() {
  if (seen_.empty()) return;
  const ModesOff off;
  for (const Seen& seen : seen_) seen.alias.copy_(seen.before);
}

void OutsideStateWatch::see(const at::Tensor& tensor) {
  const c10::StorageImpl* storage = storage_of(tensor);
  if (storage == nullptr || tensor.requires_grad() || !inside_.insert(storage).second) return;
  const ModesOff off;
  at::Tensor alias = bytes_of(tensor.storage());
  at::Tensor before = alias.clone();
  seen_.push_back({std::move(alias), std::move(before)});
}

void OutsideStateWatch::dispatch(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const auto& arguments = schema.arguments();
  const size_t first = stack->size() - arguments.size();
  const bool updates_statistics = updates_running_statistics(op);
  for (size_t i = 0; i < arguments.size(); ++i) {
    const c10::AliasInfo* alias = arguments[i].alias_info();
    if (!updates_statistics && (alias == nullptr || !alias->isWrite())) continue;
    for_each_tensor((*stack)[first + i], [&](const at::Tensor& t) { see(t); });
  }
  run(op, stack);
  // Fresh results (no alias in the schema) belong to the function; views and in-place results
  // share an argument's data, which keeps its own standing.
  const auto& returns = schema.returns();
  const size_t results = std::min(returns.size(), stack->size());
  for (size_t i = 0; i < results; ++i) {
    if (returns[i].alias_info() != nullptr) continue;
    for_each_tensor((*stack)[stack->size() - results + i],
                    [&](const at::Tensor& t) { inside_.insert(storage_of(t)); });
  }
}

}  // namespace detail
}  // namespace ckpt
