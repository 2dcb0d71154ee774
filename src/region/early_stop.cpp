#include "early_stop.h"

#include "autograd/outside_state.h"

#include <ckpt/options.h>

#include <ATen/core/enum_tag.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <algorithm>
#include <string>
#include <utility>

namespace ckpt {
namespace detail {
namespace {

// The storages of the tensors in stack[first, first + count).
std::vector<const c10::StorageImpl*> storages(const torch::jit::Stack& stack, size_t first,
                                              size_t count) {
  std::vector<const c10::StorageImpl*> found;
  for (size_t i = first; i < first + count; ++i) {
    for_each_tensor(stack[i], [&](const at::Tensor& t) {
      if (const c10::StorageImpl* storage = storage_of(t)) found.push_back(storage);
    });
  }
  return found;
}

std::vector<TensorGeometry> geometry(const torch::jit::Stack& stack, size_t first, size_t count) {
  std::vector<TensorGeometry> found;
  for (size_t i = first; i < first + count; ++i) {
    for_each_tensor(stack[i], [&](const at::Tensor& t) { found.push_back(TensorGeometry::of(t)); });
  }
  return found;
}

// The data of the arguments the schema marks as written (in place and out=).
std::vector<c10::Storage> written(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const auto& arguments = op.schema().arguments();
  const size_t first = stack.size() - arguments.size();
  std::vector<c10::Storage> found;
  for (size_t i = 0; i < arguments.size(); ++i) {
    const c10::AliasInfo* info = arguments[i].alias_info();
    if (info == nullptr || !info->isWrite()) continue;
    for_each_tensor(stack[first + i], [&](const at::Tensor& t) {
      if (storage_of(t) != nullptr) found.push_back(t.storage());
    });
  }
  return found;
}

bool contains(const std::vector<const c10::StorageImpl*>& list, const c10::StorageImpl* storage) {
  return std::find(list.begin(), list.end(), storage) != list.end();
}

// A pure function of its arguments, drawing no random numbers, whose results are all plain
// dense tensors of their own: its kernel may be skipped when nobody reads them.
bool skippable(const c10::OperatorHandle& op, const torch::jit::Stack& stack,
               const std::vector<const c10::StorageImpl*>& reads) {
  const c10::FunctionSchema& schema = op.schema();
  if (schema.is_mutable() || op.hasTag(at::Tag::nondeterministic_seeded)) return false;
  if (updates_running_statistics(op)) return false;  // writes what its schema does not say
  const size_t count = schema.returns().size();
  if (count == 0) return false;
  for (const auto& result : schema.returns()) {
    if (result.alias_info() != nullptr) return false;
  }
  for (size_t i = stack.size() - count; i < stack.size(); ++i) {
    if (!stack[i].isTensor()) return false;
    const at::Tensor& t = stack[i].toTensor();
    if (!t.defined() || t.layout() != c10::kStrided || t.is_quantized() || !t.has_storage() ||
        contains(reads, storage_of(t)))
      return false;
  }
  return true;
}

// Whatever the data it writes or returns, the data such a call reads matters: it draws random
// numbers (how many may depend on it), writes, or returns values that are not tensors.
bool reads_matter(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const c10::FunctionSchema& schema = op.schema();
  if (op.hasTag(at::Tag::nondeterministic_seeded) || schema.returns().empty()) return true;
  for (size_t i = stack.size() - schema.returns().size(); i < stack.size(); ++i) {
    const c10::IValue& value = stack[i];
    if (!value.isTensor() && !value.isTensorList() && !value.isNone()) return true;
  }
  return false;
}

}  // namespace

TensorGeometry TensorGeometry::of(const at::Tensor& tensor) {
  TensorGeometry geometry;
  if (!tensor.defined()) return geometry;
  geometry.sizes = tensor.sizes().vec();
  if (tensor.layout() == c10::kStrided) geometry.strides = tensor.strides().vec();
  geometry.dtype = tensor.scalar_type();
  geometry.device = tensor.device();
  return geometry;
}

bool TensorGeometry::operator==(const TensorGeometry& other) const {
  return sizes == other.sizes && strides == other.strides && dtype == other.dtype &&
         device == other.device;
}

void EarlyStopLearning::dispatch(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const size_t argument_count = op.schema().arguments().size();
  Seen seen;
  seen.op = op.operator_name();
  seen.reads = storages(*stack, stack->size() - argument_count, argument_count);
  for (const c10::Storage& storage : written(op, *stack)) {
    seen.writes.push_back(storage.unsafeGetStorageImpl());
  }
  std::vector<TensorGeometry> argument_geometry =
      geometry(*stack, stack->size() - argument_count, argument_count);
  run(op, stack);
  const size_t return_count = op.schema().returns().size();
  seen.returns = storages(*stack, stack->size() - return_count, return_count);
  seen.skippable = skippable(op, *stack, seen.reads);
  seen.reads_always = reads_matter(op, *stack);
  if (seen.skippable) {
    seen.argument_geometry = std::move(argument_geometry);
    seen.return_geometry = geometry(*stack, stack->size() - return_count, return_count);
  }
  for (size_t i = stack->size() - return_count; i < stack->size(); ++i) {
    for_each_tensor((*stack)[i], [&](const at::Tensor& t) {
      const c10::StorageImpl* storage = storage_of(t);
      if (storage == nullptr || !made_set_.insert(storage).second) return;
      made_.push_back(t.storage().getWeakStorageImpl());
    });
  }
  seen_.push_back(std::move(seen));
}

// Backwards through the calls: data is needed when it is alive now or a needed call reads it;
// a call is needed when it makes needed data, writes into needed or older data, or its reads
// matter whatever it makes.
std::shared_ptr<const EarlyStopPlan> EarlyStopLearning::plan() const {
  std::unordered_set<const c10::StorageImpl*> needed;
  for (const WeakStorage& made : made_) {
    if (!made.expired()) needed.insert(made._unsafe_get_target());
  }
  auto is_needed = [&](const c10::StorageImpl* s) { return needed.count(s) > 0; };
  auto older = [&](const c10::StorageImpl* s) { return made_set_.count(s) == 0; };
  auto plan = std::make_shared<EarlyStopPlan>();
  plan->calls.resize(seen_.size());
  for (size_t i = seen_.size(); i-- > 0;) {
    const Seen& seen = seen_[i];
    bool needed_call = seen.reads_always ||
                       std::any_of(seen.returns.begin(), seen.returns.end(), is_needed) ||
                       std::any_of(seen.writes.begin(), seen.writes.end(), is_needed) ||
                       std::any_of(seen.writes.begin(), seen.writes.end(), older);
    if (needed_call || !seen.skippable) {
      if (needed_call) needed.insert(seen.reads.begin(), seen.reads.end());
      plan->calls[i].op = seen.op;
      continue;
    }
    plan->calls[i] = {seen.op, true, seen.argument_geometry, seen.return_geometry};
    ++plan->skipped;
  }
  return plan;
}

void EarlyStopMode::dispatch(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const size_t call = next_++;
  if (skips(op, *stack, call)) {
    torch::jit::drop(*stack, op.schema().arguments().size());
    // Past every mode: the skipped call's stand-ins are not operators the region runs.
    const c10::impl::ExcludeDispatchKeyGuard no_modes(c10::DispatchKey::Fake);
    for (const TensorGeometry& g : plan_->calls[call].returns) {
      at::Tensor stand_in =
          at::empty_strided(g.sizes, g.strides, at::device(g.device).dtype(g.dtype));
      tainted_set_.insert(storage_of(stand_in));
      tainted_.push_back(stand_in.storage().getWeakStorageImpl());
      stack->push_back(std::move(stand_in));
    }
    ++skipped_;
    return;
  }
  const size_t argument_count = op.schema().arguments().size();
  const auto reads = storages(*stack, stack->size() - argument_count, argument_count);
  const auto writes = written(op, *stack);
  const bool reads_tainted = std::any_of(reads.begin(), reads.end(),
                                         [&](const auto* s) { return tainted_set_.count(s) > 0; });
  run(op, stack);
  if (reads_tainted) taint(op, *stack, writes);
}

bool EarlyStopMode::skips(const c10::OperatorHandle& op, const torch::jit::Stack& stack,
                          size_t call) {
  if (stale_) return false;
  if (call >= plan_->calls.size() || !(plan_->calls[call].op == op.operator_name())) {
    stale_ = true;
    return false;
  }
  const EarlyStopPlan::Call& planned = plan_->calls[call];
  if (!planned.skip) return false;
  const size_t count = op.schema().arguments().size();
  if (geometry(stack, stack.size() - count, count) != planned.arguments) {
    stale_ = true;
    return false;
  }
  return true;
}

// A call that ran on data early stop did not compute: what it makes and writes is such data.
void EarlyStopMode::taint(const c10::OperatorHandle& op, const torch::jit::Stack& stack,
                          const std::vector<c10::Storage>& writes) {
  if (reads_matter(op, stack)) unsound_ = true;  // a value that is not a tensor escapes
  auto add = [&](const c10::Storage& storage) {
    if (tainted_set_.insert(storage.unsafeGetStorageImpl()).second) {
      tainted_.push_back(storage.getWeakStorageImpl());
    }
  };
  const size_t count = op.schema().returns().size();
  for (size_t i = stack.size() - count; i < stack.size(); ++i) {
    for_each_tensor(stack[i], [&](const at::Tensor& t) {
      if (storage_of(t) != nullptr) add(t.storage());
    });
  }
  for (const c10::Storage& storage : writes) add(storage);
}

EarlyStopRun::EarlyStopRun(CallSite& site, bool enabled, bool forbidden) : site_(site) {
  if (forbidden) return;
  if (const std::optional<bool> global = checkpoint_early_stop()) enabled = *global;
  if (!enabled || site.early_stop_failed.load()) return;
  std::shared_ptr<const EarlyStopPlan> plan;
  {
    const std::lock_guard<std::mutex> lock(site.early_stop_mutex);
    plan = site.early_stop_plan;
  }
  if (plan == nullptr) {
    learning_.emplace();
  } else if (plan->skipped > 0) {
    skipping_.emplace(std::move(plan));
  }
}

DispatchMode* EarlyStopRun::mode() {
  if (learning_) return &*learning_;
  if (skipping_) return &*skipping_;
  return nullptr;
}

bool EarlyStopRun::finish() {
  if (learning_) {
    std::shared_ptr<const EarlyStopPlan> plan = learning_->plan();
    const std::lock_guard<std::mutex> lock(site_.early_stop_mutex);
    site_.early_stop_plan = std::move(plan);
    return true;
  }
  if (!skipping_) return true;
  const bool sound = skipping_->sound();
  if (sound && !skipping_->stale()) return true;
  if (!sound) site_.early_stop_failed.store(true);
  const std::lock_guard<std::mutex> lock(site_.early_stop_mutex);
  site_.early_stop_plan = nullptr;  // learn again from the next recompute
  return sound;
}

bool EarlyStopMode::sound() const {
  if (unsound_) return false;
  return std::all_of(tainted_.begin(), tainted_.end(),
                     [](const WeakStorage& storage) { return storage.expired(); });
}

}  // namespace detail
}  // namespace ckpt
