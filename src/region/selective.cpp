#include "selective.h"

#include "autograd/version_snapshot.h"

#include <ckpt/detail/region.h>

#include <ATen/core/enum_tag.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>

namespace ckpt {
namespace detail {
namespace {

enum class Keep { No, Prefer, Must };

bool recomputes(CheckpointPolicy decision) {
  return decision == CheckpointPolicy::MustRecompute ||
         decision == CheckpointPolicy::PreferRecompute;
}
bool must_keep(CheckpointPolicy decision) {
  return decision == CheckpointPolicy::MustSave || decision == CheckpointPolicy::MustOffload;
}
bool offloads(CheckpointPolicy decision) {
  return decision == CheckpointPolicy::MustOffload || decision == CheckpointPolicy::PreferOffload;
}
const char* label(CheckpointPolicy decision) {
  switch (decision) {
    case CheckpointPolicy::MustSave:
      return "MustSave";
    case CheckpointPolicy::PreferSave:
      return "PreferSave";
    case CheckpointPolicy::MustRecompute:
      return "MustRecompute";
    case CheckpointPolicy::PreferRecompute:
      return "PreferRecompute";
    case CheckpointPolicy::MustOffload:
      return "MustOffload";
    case CheckpointPolicy::PreferOffload:
      return "PreferOffload";
  }
  return "?";
}

// Whether the region keeps the outputs of this call (on the device or in host memory): the
// policy's decision, where they can be kept. MustSave or MustOffload on outputs that cannot be
// kept is an error.
Keep keeps_outputs(CheckpointPolicy decision, const c10::OperatorHandle& op) {
  if (recomputes(decision)) return Keep::No;
  const char* reason = why_outputs_cannot_be_kept(op);
  if (reason == nullptr) return must_keep(decision) ? Keep::Must : Keep::Prefer;
  TORCH_CHECK(!must_keep(decision), "ckpt::checkpoint: the selective policy says ", label(decision),
              " for ", operator_label(op.operator_name()), ", ", reason,
              ", so its outputs cannot be kept. Return ",
              offloads(decision) ? "PreferOffload" : "PreferSave",
              " to recompute it, or MustRecompute.");
  return Keep::No;
}

CheckpointPolicy decide(const SelectivePolicy& policy, const c10::OperatorHandle& op,
                        const torch::jit::Stack& stack) {
  const size_t count = op.schema().arguments().size();
  return policy(
      OpCall{op.schema(), c10::ArrayRef<c10::IValue>(stack.data() + stack.size() - count, count)});
}

bool unchanged(const KeptOutputs::Entry& entry) {
  if (entry.stale) return false;
  for (const KeptOutputs::Watch& watch : entry.watches) {
    for (const KeptOutputs::Counter& seen : watch.counters) {
      if (seen.counter.current_version() != seen.version) return false;
    }
  }
  return true;
}

// On a node whose saved tensors a selective forward released: a backward that reaches it raises
// ckpt's own error, before the node would fail on what it no longer holds.
class ReleasedNodeHook final : public torch::autograd::FunctionPreHook {
 public:
  explicit ReleasedNodeHook(uint64_t forward_id) : forward_id_(forward_id) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list&) override {
    throw ReleasedGraphError(forward_id_);
  }

 private:
  uint64_t forward_id_;
};

// `value` with every tensor in it (a tensor or a list of tensors) replaced by `map(tensor)`.
template <class Map>
c10::IValue map_tensors(const c10::IValue& value, Map map) {
  if (value.isTensor()) return map(value.toTensor());
  if (value.isTensorList()) {
    c10::List<at::Tensor> list;
    for (const at::Tensor& t : value.toTensorList().vec()) list.push_back(map(t));
    return list;
  }
  return value;
}

// The data an operator is about to write into: the storages of its arguments marked as written
// in its schema (in place and out= arguments).
std::vector<const c10::StorageImpl*> written_storages(const c10::OperatorHandle& op,
                                                      const torch::jit::Stack& stack) {
  std::vector<const c10::StorageImpl*> written;
  const auto& arguments = op.schema().arguments();
  const size_t first = stack.size() - arguments.size();
  for (size_t i = 0; i < arguments.size(); ++i) {
    const c10::AliasInfo* info = arguments[i].alias_info();
    if (info == nullptr || !info->isWrite()) continue;
    map_tensors(stack[first + i], [&](const at::Tensor& t) {
      if (const c10::StorageImpl* storage = storage_of(t)) written.push_back(storage);
      return t;
    });
  }
  return written;
}

bool contains(const std::vector<const c10::StorageImpl*>& storages,
              const c10::StorageImpl* storage) {
  return storage != nullptr &&
         std::find(storages.begin(), storages.end(), storage) != storages.end();
}

// The storages of the tensors in stack[first, stack.size()).
std::vector<const c10::StorageImpl*> tensor_storages(const torch::jit::Stack& stack, size_t first) {
  std::vector<const c10::StorageImpl*> storages;
  for (size_t i = first; i < stack.size(); ++i) {
    map_tensors(stack[i], [&](const at::Tensor& t) {
      if (const c10::StorageImpl* storage = storage_of(t)) storages.push_back(storage);
      return t;
    });
  }
  return storages;
}

// The argument an in-place operator writes into, where it writes into that one alone, returns
// it, and draws no random numbers (skipping it in the replay leaves the random stream as it is);
// nullptr for any other operator.
const at::Tensor* in_place_self(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const c10::FunctionSchema& schema = op.schema();
  const auto& arguments = schema.arguments();
  if (arguments.empty() || schema.returns().size() != 1) return nullptr;
  const c10::AliasInfo* self = arguments[0].alias_info();
  if (self == nullptr || !self->isWrite() || schema.returns()[0].alias_info() == nullptr)
    return nullptr;
  for (size_t i = 1; i < arguments.size(); ++i) {
    if (arguments[i].alias_info() != nullptr && arguments[i].alias_info()->isWrite())
      return nullptr;
  }
  if (op.hasTag(at::Tag::nondeterministic_seeded)) return nullptr;
  const c10::IValue& value = stack[stack.size() - arguments.size()];
  return value.isTensor() && value.toTensor().defined() ? &value.toTensor() : nullptr;
}

// A kept tensor's watch: its data, and its version counter as it is now.
KeptOutputs::Watch watch_of(const at::Tensor& t) {
  KeptOutputs::Watch watch;
  watch.storage = storage_of(t);
  if (t.defined() && t.unsafeGetTensorImpl()->version_counter().enabled()) {
    const c10::VariableVersion& counter = t.unsafeGetTensorImpl()->version_counter();
    watch.counters.push_back({counter, counter.current_version()});
  }
  return watch;
}

}  // namespace

RememberedOutput::RememberedOutput(const at::Tensor& output) : tensor(output.getIntrusivePtr()) {
  if (output.layout() != at::kStrided || !output.has_storage()) return;
  storage = output.storage().getWeakStorageImpl();
  sizes = at::DimVector(output.sizes());
  strides = at::DimVector(output.strides());
  offset = output.storage_offset();
  options = output.options();
}

at::Tensor RememberedOutput::get() const {
  if (c10::intrusive_ptr<c10::TensorImpl> impl = tensor.lock()) return at::Tensor(std::move(impl));
  c10::intrusive_ptr<c10::StorageImpl> data = storage.lock();
  if (!data) return {};
  // ckpt's own operators reach neither the modes nor autograd.
  const c10::impl::ExcludeDispatchKeyGuard modes_off(c10::DispatchKey::Fake);
  const at::NoGradGuard no_grad;
  return at::empty({0}, options).set_(c10::Storage(std::move(data)), offset, sizes, strides);
}

void CachingMode::dispatch(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (names_tensor(op)) return name(op, stack);
  const size_t call = calls_++;
  const std::vector<const c10::StorageImpl*> arguments =
      tensor_storages(*stack, stack->size() - op.schema().arguments().size());
  Writes writes;
  if (op.schema().is_mutable()) {
    writes.storages = written_storages(op, *stack);
    if (const at::Tensor* self = in_place_self(op, *stack)) {
      writes.absorbable = storage_of(*self);
      writes.counter.counter = self->unsafeGetTensorImpl()->version_counter();
    }
    if (!kept_.entries.empty()) before_write(op, *stack, writes.storages);
  }
  const CheckpointPolicy decision = decide(policy_, op, *stack);
  const Keep keep = keeps_outputs(decision, op);
  run(op, stack);
  const size_t count = op.schema().returns().size();
  if (!kept_.entries.empty()) note_reads(arguments, *stack, count);
  note_uses(arguments, tensor_storages(*stack, stack->size() - count), writes);
  remember_outputs(op, *stack, call, arguments);
  if (keep == Keep::No) return;
  KeptOutputs::Entry entry(op.operator_name());
  entry.call = call;
  entry.must = keep == Keep::Must;
  entry.offload = offloads(decision);
  for (size_t i = stack->size() - count; i < stack->size(); ++i) {
    entry.returns.push_back(map_tensors((*stack)[i], [&](const at::Tensor& t) {
      entry.watches.push_back(watch_of(t));
      return fresh_alias(t);
    }));
  }
  kept_.entries.push_back(std::move(entry));  // the latest call: the entries stay in call order
}

CachingMode::CachingMode(SelectivePolicy policy, KeptOutputs& kept, const RngStash* rng)
    : policy_(std::move(policy)), kept_(kept), rng_(rng) {}

GraphRelease::GraphRelease(const std::vector<at::Tensor>& inputs) {
  static std::atomic<uint64_t> next_id{1};
  id_ = next_id.fetch_add(1, std::memory_order_relaxed);
  for (const at::Tensor& input : inputs) {
    if (const c10::StorageImpl* storage = storage_of(input)) argument_storages_.push_back(storage);
  }
}

bool GraphRelease::writes_an_argument(const c10::OperatorHandle& op,
                                      const torch::jit::Stack& stack) const {
  if (argument_storages_.empty() || !op.schema().is_mutable()) return false;
  const std::vector<const c10::StorageImpl*> written = written_storages(op, stack);
  return std::any_of(written.begin(), written.end(), [&](const c10::StorageImpl* storage) {
    return contains(argument_storages_, storage);
  });
}

// What a call did to the data the region's calls created: wrote into some, read some (arguments
// it does not return: a view is no read).
void CachingMode::note_uses(const std::vector<const c10::StorageImpl*>& arguments,
                            const std::vector<const c10::StorageImpl*>& outputs,
                            const Writes& writes) {
  for (const c10::StorageImpl* storage : writes.storages) {
    const auto found = data_.find(storage);
    if (found == data_.end()) continue;
    Data& data = found->second;
    if (storage != writes.absorbable || data.read_since_write) {
      data.written = true;
      continue;
    }
    ++data.absorbed_writes;
    if (writes.counter.counter.enabled()) data.counters.push_back(writes.counter);
  }
  for (const c10::StorageImpl* storage : arguments) {
    if (contains(outputs, storage)) continue;
    const auto found = data_.find(storage);
    if (found != data_.end()) found->second.read_since_write = true;
  }
}

// Remembers a call whose results are all tensors, for the data it created (outputs that share no
// argument's storage: a view or an in-place result stays its creator's data), so that a name can
// have all its outputs kept.
void CachingMode::remember_outputs(const c10::OperatorHandle& op, const torch::jit::Stack& stack,
                                   size_t call,
                                   const std::vector<const c10::StorageImpl*>& arguments) {
  const size_t count = op.schema().returns().size();
  std::shared_ptr<Call> record;
  for (size_t i = stack.size() - count; i < stack.size(); ++i) {
    if (!stack[i].isTensor() || !stack[i].toTensor().defined()) return;
  }
  for (size_t i = stack.size() - count; i < stack.size(); ++i) {
    const at::Tensor& t = stack[i].toTensor();
    const c10::StorageImpl* storage = storage_of(t);
    if (storage == nullptr || contains(arguments, storage)) continue;
    if (record == nullptr) {
      record = std::make_shared<Call>(Call{call, op, {}});
      for (size_t j = stack.size() - count; j < stack.size(); ++j) {
        record->outputs.emplace_back(stack[j].toTensor());
      }
    }
    Data data{record, t.storage().getWeakStorageImpl(), false, false, 0, {}};
    data_.insert_or_assign(storage, std::move(data));
  }
}

// checkpoint_name inside the region: the policy decides for the named tensor. The result is the
// tensor itself, and modes outside this one do not see the call (the name is this region's).
void CachingMode::name(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const at::Tensor tensor = (*stack)[stack->size() - 2].toTensor();
  const std::string name = (*stack)[stack->size() - 1].toStringRef();
  if (!names_.insert(name).second) {
    if (rng_ != nullptr) rng_->restore();
    TORCH_CHECK(false, "ckpt::checkpoint_name: the name \"", name,
                "\" was given twice in one selectively checkpointed region (the second time to ",
                describe_shape(tensor),
                "). A name picks out one tensor of its region: give each tensor a name of its own "
                "(add the block's number, say), or checkpoint each block as a region of its own "
                "(ckpt::Checkpointed, or checkpoint_sequential with one segment per block).");
  }
  const CheckpointPolicy decision = decide(policy_, op, *stack);
  stack->pop_back();
  if (recomputes(decision)) return;
  const bool must = must_keep(decision);
  const std::string why_not = keep_named(tensor, must, offloads(decision));
  if (why_not.empty() || !must) return;  // PreferSave, PreferOffload: recomputed
  if (rng_ != nullptr) rng_->restore();
  TORCH_CHECK(false, "ckpt::checkpoint_name: the selective policy says ", label(decision),
              " for the tensor named \"", name, "\", but ", why_not,
              ", so it cannot be kept. Name data an operator of the region computed, before any "
              "in-place operation on it, or return ",
              offloads(decision) ? "PreferOffload" : "PreferSave",
              " for it to have it recomputed.");
}

// Keeps the outputs of the call that computed `tensor`'s data, in that call's place among the
// kept entries. Returns why it cannot, or nothing.
std::string CachingMode::keep_named(const at::Tensor& tensor, bool must, bool offload) {
  const auto found = data_.find(storage_of(tensor));
  if (found == data_.end()) {
    return "its data was not computed inside the region (an argument, a parameter, or a tensor "
           "the function captured)";
  }
  const Data& data = found->second;
  const Call& call = *data.call;
  const std::string producer = operator_label(call.op.operator_name());
  if (data.written) return "its data was written in place after " + producer + " computed it";
  if (const char* reason = why_outputs_cannot_be_kept(call.op))
    return "it was computed by " + producer + ", " + reason;
  auto& entries = kept_.entries;
  const auto place = std::lower_bound(
      entries.begin(), entries.end(), call.number,
      [](const KeptOutputs::Entry& entry, size_t number) { return entry.call < number; });
  if (place != entries.end() && place->call == call.number) {  // the policy kept it already
    place->named = true;
    place->must = place->must || must;
    place->offload = offload;  // the name's decision
    return {};
  }
  KeptOutputs::Entry entry(call.op.operator_name());
  entry.call = call.number;
  entry.named = true;
  entry.must = must;
  entry.offload = offload;
  for (const RememberedOutput& remembered : call.outputs) {
    const at::Tensor output = remembered.get();
    if (!output.defined()) {
      return producer + ", which computed it, returned other tensors whose data is gone";
    }
    KeptOutputs::Watch watch = watch_of(output);
    const auto output_data = data_.find(watch.storage);
    if (output_data != data_.end() && output_data->second.call.get() == &call) {
      const Data& written = output_data->second;
      if (written.written) {
        return "another output of " + producer + ", which computed it, was written in place since";
      }
      watch.read_since_write = written.read_since_write;
      watch.absorbed_writes = written.absorbed_writes;
      watch.counters.insert(watch.counters.end(), written.counters.begin(), written.counters.end());
    }
    // A change through the named tensor shows on its counter (a remade output has its own).
    if (watch.storage == storage_of(tensor) && !output.is_same(tensor) &&
        tensor.unsafeGetTensorImpl()->version_counter().enabled()) {
      const c10::VariableVersion& counter = tensor.unsafeGetTensorImpl()->version_counter();
      watch.counters.push_back({counter, counter.current_version()});
    }
    entry.watches.push_back(std::move(watch));
    entry.returns.emplace_back(fresh_alias(output));
  }
  entries.insert(place, std::move(entry));
  return {};
}

// The arguments' nodes are complete (autograd, above the mode, recorded them when their
// operators returned). The node is read from the autograd metadata directly: `grad_fn()` would
// create one for a view.
void GraphRelease::release_producers(const c10::OperatorHandle& op,
                                     const torch::jit::Stack& stack) {
  // A name is no use of the data: a policy may keep all the outputs of the call that computed it,
  // some of which only its node holds.
  if (stopped_ || names_tensor(op)) return;
  if (writes_an_argument(op, stack)) {
    stopped_ = true;
    if (released_any()) throw ReleasedGraphError(id_, KeepGraphReason::WroteArgument);
    return;
  }
  const size_t count = op.schema().arguments().size();
  for (size_t i = stack.size() - count; i < stack.size(); ++i) {
    map_tensors(stack[i], [&](const at::Tensor& t) {
      const auto* meta = t.defined() ? torch::autograd::impl::get_autograd_meta(t) : nullptr;
      Node* node = meta != nullptr ? meta->grad_fn_.get() : nullptr;
      if (node != nullptr && marker_.created_inside(*node)) release(*node);
      return t;
    });
  }
}

void GraphRelease::release(Node& node) {
  if (!released_.insert(&node).second) return;
  node.release_variables();
  node.add_pre_hook(std::make_unique<ReleasedNodeHook>(id_));
  released_nodes_.push_back(compat::weak_node(node));
}

// Every holder of a released node is counted: the graph's edges into it, and the grad_fn of each
// distinct output (or base of an output view). Any holder more is outside the region's sight.
bool GraphRelease::held_outside(const std::vector<at::Tensor>& outputs) {
  if (stopped_ || released_nodes_.empty()) return false;
  std::unordered_map<const Node*, long> holders;
  std::unordered_set<const c10::TensorImpl*> seen_tensors;
  std::vector<Node*> pending;
  std::unordered_set<const Node*> visited;
  const auto visit = [&](Node* node) {
    if (node != nullptr && marker_.created_inside(*node) && visited.insert(node).second) {
      pending.push_back(node);
    }
  };
  const auto note_tensor = [&](const at::Tensor& t) {
    if (!t.defined() || !seen_tensors.insert(t.unsafeGetTensorImpl()).second) return;
    const auto* meta = torch::autograd::impl::get_autograd_meta(t);
    Node* node = meta != nullptr ? meta->grad_fn_.get() : nullptr;
    ++holders[node];
    visit(node);
  };
  for (const at::Tensor& output : outputs) {
    note_tensor(output);
    if (output.defined() && output.is_view()) note_tensor(at::Tensor(output._base()));
  }
  while (!pending.empty()) {
    Node* node = pending.back();
    pending.pop_back();
    release(*node);
    for (const torch::autograd::Edge& edge : node->next_edges()) {
      ++holders[edge.function.get()];
      visit(edge.function.get());
    }
  }
  for (const compat::WeakNodePtr& weak : released_nodes_) {
    const auto node = weak.lock();
    if (node && static_cast<long>(node.use_count()) - 1 > holders[node.get()]) return true;
  }
  return false;
}

// A write into kept data that nothing has read since it was kept (or last written) is absorbed:
// the data keeps its result. Any other write turns the kept tensor into a copy the entry owns
// alone, taken before the write (holding the writes absorbed until then).
void CachingMode::before_write(const c10::OperatorHandle& op, const torch::jit::Stack& stack,
                               const std::vector<const c10::StorageImpl*>& written) {
  if (written.empty()) return;
  const at::Tensor* self = in_place_self(op, stack);
  for (KeptOutputs::Entry& entry : kept_.entries) {
    size_t k = 0;
    for (c10::IValue& value : entry.returns) {
      value = map_tensors(value, [&](const at::Tensor& t) {
        KeptOutputs::Watch& watch = entry.watches[k++];
        if (!contains(written, watch.storage)) return t;
        if (self != nullptr && !watch.read_since_write && storage_of(*self) == watch.storage) {
          ++watch.absorbed_writes;
          const c10::VariableVersion& counter = self->unsafeGetTensorImpl()->version_counter();
          if (counter.enabled()) watch.counters.push_back({counter, 0});  // sealed at the end
          return t;
        }
        const uint32_t absorbed = watch.absorbed_writes;
        at::Tensor copy = t.clone(at::MemoryFormat::Preserve);
        watch = KeptOutputs::Watch{};
        watch.storage = storage_of(copy);
        watch.absorbed_writes = absorbed;
        return copy;
      });
    }
  }
}

// An operator read the kept data it was given, unless all it did was return a view of it.
void CachingMode::note_reads(const std::vector<const c10::StorageImpl*>& arguments,
                             const torch::jit::Stack& stack, size_t output_count) {
  const std::vector<const c10::StorageImpl*> outputs =
      tensor_storages(stack, stack.size() - output_count);
  for (KeptOutputs::Entry& entry : kept_.entries) {
    for (KeptOutputs::Watch& watch : entry.watches) {
      if (contains(arguments, watch.storage) && !contains(outputs, watch.storage)) {
        watch.read_since_write = true;
      }
    }
  }
}

void ReplayMode::dispatch(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (names_tensor(op)) {  // as in the forward: the result is the tensor, and the name stays here
    stack->pop_back();
    return;
  }
  const size_t call = calls_++;
  if (op.schema().is_mutable()) {
    if (skip_absorbed_write(op, stack)) return;
    mark_written(written_storages(op, *stack));
  }
  const bool policy_keeps = keeps_outputs(decide(policy_, op, *stack), op) != Keep::No;
  if (!policy_keeps && !named_here(call)) {
    run(op, stack);
    return;
  }
  KeptOutputs::Entry& entry = next_entry(op);
  if (usable(entry, operator_label(op.operator_name()))) {
    hand_out(op, entry, stack);
  } else {
    run(op, stack);
  }
}

// Whether the forward kept this call's outputs for a name given after it.
bool ReplayMode::named_here(size_t call) const {
  return next_ < kept_.entries.size() && kept_.entries[next_].named &&
         kept_.entries[next_].call == call;
}

// The forward's next kept call, which must be of the same operator.
KeptOutputs::Entry& ReplayMode::next_entry(const c10::OperatorHandle& op) {
  const std::string name = operator_label(op.operator_name());
  TORCH_CHECK(next_ < kept_.entries.size(),
              "ckpt::checkpoint: the recompute of a selectively checkpointed region called ", name,
              " after the ", kept_.entries.size(),
              " kept calls of its forward were used up. The function must run the same operators "
              "when it runs again, and the policy must decide the same way for them.");
  KeptOutputs::Entry& entry = kept_.entries[next_++];
  TORCH_CHECK(entry.op == op.operator_name(), "ckpt::checkpoint: the recompute of a selectively ",
              "checkpointed region called ", name, " where its forward called ",
              operator_label(entry.op), " (kept call #", next_ - 1,
              "). The function must run the same operators when it runs again.");
  return entry;
}

// Whether the entry still holds what the forward's call returned. It does not after a backward
// that kept no graph gave it up, or once its data was modified in place: the operator then runs
// again, unless the policy said MustSave (an error).
bool ReplayMode::usable(const KeptOutputs::Entry& entry, const std::string& name) const {
  if (entry.consumed) {
    // Only after a backward that kept no graph failed part-way, and is being run again.
    TORCH_CHECK(!entry.must, "ckpt::checkpoint: the outputs of ", name,
                " that the selective policy keeps (MustSave) were given up by an earlier "
                "backward through this region, which did not retain the graph. Pass "
                "retain_graph=true to the backward if you need to run it again.");
    return false;
  }
  if (!unchanged(entry)) {
    // Modified in place after the forward kept it (by the caller, or by an earlier recompute
    // that was handed it): the kept value is stale.
    TORCH_CHECK(entry.stale || !entry.must, "ckpt::checkpoint: an output of ", name,
                " that the selective policy keeps (MustSave) was modified in place after the "
                "forward kept it, so the kept value is not the one the operator computed. "
                "Recompute ",
                name,
                " (MustRecompute or PreferSave), or make the in-place operation out of "
                "place.");
    return false;
  }
  return true;
}

// Replaces the call's arguments with the kept outputs, and notes the writes into them that the
// forward absorbed (the recompute skips them).
void ReplayMode::hand_out(const c10::OperatorHandle& op, KeptOutputs::Entry& entry,
                          torch::jit::Stack* stack) {
  kept_.bring_back(entry);
  torch::jit::drop(*stack, op.schema().arguments().size());
  for (const c10::IValue& value : entry.returns) stack->push_back(map_tensors(value, fresh_alias));
  handed_out_.push_back(next_ - 1);
  for (const c10::IValue& value : entry.returns) {
    for_each_tensor(value, [&](const at::Tensor& t) {
      if (const c10::StorageImpl* storage = storage_of(t)) handed_out_storages_.insert(storage);
    });
  }
  size_t k = 0;
  for (const c10::IValue& value : entry.returns) {
    map_tensors(value, [&](const at::Tensor& t) {
      const KeptOutputs::Watch& watch = entry.watches[k++];
      if (watch.absorbed_writes > 0)
        writes_to_skip_.emplace_back(t.storage(), watch.absorbed_writes);
      return t;
    });
  }
  if (consume_) {
    entry.returns.clear();
    entry.consumed = true;
  }
}

// The forward absorbed this write into the kept data handed out: its result is there already.
// The operator's node is recorded by autograd above as usual; only the kernel is skipped.
bool ReplayMode::skip_absorbed_write(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (writes_to_skip_.empty()) return false;
  const at::Tensor* self = in_place_self(op, *stack);
  if (self == nullptr) return false;
  for (size_t i = 0; i < writes_to_skip_.size(); ++i) {
    auto& [storage, remaining] = writes_to_skip_[i];
    if (storage.unsafeGetStorageImpl() != storage_of(*self)) continue;
    if (--remaining == 0) writes_to_skip_.erase(writes_to_skip_.begin() + static_cast<long>(i));
    at::Tensor result = *self;
    torch::jit::drop(*stack, op.schema().arguments().size());
    stack->push_back(std::move(result));
    return true;
  }
  return false;
}

// The recompute writes into kept data it was handed (Linear's bias add into the kept product):
// this backward is fine, a later recompute of the same region must run those operators.
void ReplayMode::mark_written(const std::vector<const c10::StorageImpl*>& written) {
  for (size_t index : handed_out_) {
    KeptOutputs::Entry& entry = kept_.entries[index];
    for (const KeptOutputs::Watch& watch : entry.watches) {
      if (contains(written, watch.storage)) entry.stale = true;
    }
  }
}

void ReplayMode::check_all_used() const {
  TORCH_CHECK(next_ == kept_.entries.size(),
              "ckpt::checkpoint: the recompute of a selectively checkpointed region used ", next_,
              " of the ", kept_.entries.size(),
              " calls its forward kept. The function must run the same operators when it runs "
              "again, and the policy must decide the same way for them.");
}

void KeptOutputs::offload() {
  for (Entry& entry : entries) {
    if (!entry.offload) continue;
    size_t k = 0;
    for (c10::IValue& value : entry.returns) {
      value = map_tensors(value, [&](const at::Tensor& t) {
        Watch& watch = entry.watches[k++];
        if (!t.defined() || t.device().is_cpu() || t.layout() != c10::kStrided) return t;
        if (!offloaded) {
          OffloadSettings settings;  // brought back as the recompute starts: no chain
          settings.last_first = false;
          settings.in_chain = false;
          offloaded = std::make_shared<OffloadGroup>(settings);
        }
        watch.host_copy = HostCopy{offloaded->add(t), StorageView(t)};
        return at::Tensor();
      });
    }
  }
  if (offloaded) offloaded->finish_forward();
}

void KeptOutputs::bring_back(Entry& entry) {
  if (!offloaded) return;
  size_t k = 0;
  for (c10::IValue& value : entry.returns) {
    value = map_tensors(value, [&](const at::Tensor& t) {
      Watch& watch = entry.watches[k++];
      if (!watch.host_copy) return t;
      at::Tensor back = watch.host_copy->view.on(offloaded->fetch(watch.host_copy->slot));
      // Back on the device for good: a second backward (retain_graph) uses it there.
      offloaded->release(watch.host_copy->slot);
      watch.host_copy.reset();
      watch.storage = back.storage().unsafeGetStorageImpl();  // where the recompute writes
      return back;
    });
  }
}

void KeptOutputs::seal() {
  for (Entry& entry : entries) {
    for (Watch& watch : entry.watches) {
      if (watch.absorbed_writes == 0) continue;
      for (Counter& seen : watch.counters) seen.version = seen.counter.current_version();
    }
  }
}

}  // namespace detail

SelectivePolicy save_names(std::vector<std::string> names, SelectivePolicy others) {
  std::unordered_set<std::string> kept(names.begin(), names.end());
  return SelectivePolicy([kept = std::move(kept), others = std::move(others)](const OpCall& call) {
    if (const std::string* name = call.tensor_name()) {
      return kept.count(*name) ? CheckpointPolicy::MustSave : CheckpointPolicy::PreferRecompute;
    }
    return others(call);
  });
}

SelectivePolicy save_and_offload_names(std::vector<std::string> saved,
                                       std::vector<std::string> offloaded, SelectivePolicy others) {
  std::unordered_set<std::string> to_host(offloaded.begin(), offloaded.end());
  for (const std::string& name : saved) {
    TORCH_CHECK(!to_host.count(name), "ckpt::save_and_offload_names: \"", name,
                "\" is both saved and offloaded. Name it in one list.");
  }
  SelectivePolicy saving = save_names(std::move(saved), std::move(others));
  return SelectivePolicy(
      [to_host = std::move(to_host), saving = std::move(saving)](const OpCall& call) {
        const std::string* name = call.tensor_name();
        if (name != nullptr && to_host.count(*name)) return CheckpointPolicy::MustOffload;
        return saving(call);
      });
}

SelectivePolicy save_ops(std::vector<std::string> ops) {
  std::unordered_set<std::string> names(ops.begin(), ops.end());
  return SelectivePolicy([names = std::move(names)](const OpCall& call) {
    return names.count(call.name()) ? CheckpointPolicy::PreferSave
                                    : CheckpointPolicy::PreferRecompute;
  });
}

SelectivePolicy save_matmuls() {
  return save_ops(
      {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
       "aten::_convolution", "aten::convolution", "aten::cudnn_convolution",
       "aten::mkldnn_convolution", "aten::_scaled_dot_product_attention",
       "aten::_scaled_dot_product_efficient_attention", "aten::_scaled_dot_product_flash_attention",
       "aten::_scaled_dot_product_flash_attention_for_cpu",
       "aten::_scaled_dot_product_cudnn_attention", "aten::_efficient_attention_forward",
       "aten::_flash_attention_forward"});
}

}  // namespace ckpt
