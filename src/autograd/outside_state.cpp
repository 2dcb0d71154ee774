#include "outside_state.h"

#include "compat/torch_compat.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/nn/module.h>

namespace ckpt {
namespace detail {
namespace {

// The default generator a random operator draws from (none where it was given one of its own, or
// where this LibTorch doesn't give ckpt its device's): that of its first tensor argument's device,
// or of its device argument, else the CPU's.
std::optional<at::Generator> default_generator_of(const c10::OperatorHandle& op,
                                                  const torch::jit::Stack& stack, size_t first) {
  if (!op.hasTag(at::Tag::nondeterministic_seeded)) return std::nullopt;
  std::optional<c10::Device> device;
  for (size_t i = first; i < stack.size(); ++i) {
    if (stack[i].isGenerator()) return std::nullopt;
    if (device) continue;
    if (stack[i].isTensor()) device = stack[i].toTensor().device();
    if (stack[i].isDevice()) device = stack[i].toDevice();
  }
  try {
    return compat::default_generator(device.value_or(c10::Device(c10::DeviceType::CPU)));
  } catch (const c10::Error&) {
    return std::nullopt;  // warned where the region stashed the states it can reach
  }
}

// What ckpt runs itself (copies, comparisons) reaches neither the modes below (a recording or
// replaying mode counts operators) nor autograd.
struct ModesOff {
  c10::impl::ExcludeDispatchKeyGuard off{c10::DispatchKey::Fake};
  at::NoGradGuard no_grad;
};

}  // namespace

bool updates_running_statistics(const c10::OperatorHandle& op) {
  const std::string& name = op.operator_name().name;
  return name.find("batch_norm") != std::string::npos ||
         name.find("instance_norm") != std::string::npos;
}

size_t OutsideState::add_bytes(const at::Tensor& tensor) {
  const ModesOff off;
  at::Tensor alias = bytes_of(tensor.storage());
  at::Tensor values = alias.clone();
  storages_.push_back({std::move(alias), std::move(values)});
  return storages_.size() - 1;
}

void OutsideState::add_place(const at::Tensor& tensor, size_t bytes) {
  tensors_.push_back({tensor, tensor.storage(), tensor.storage_offset(), tensor.sizes().vec(),
                      tensor.strides().vec(), bytes});
}

void OutsideState::put_back() const {
  const ModesOff off;
  // A tensor the function gave other data (`set_`, `resize_`) gets its own back, without a
  // version bump; one whose metadata can't change (a `.data()` alias) can't have moved either.
  for (const Place& place : tensors_) {
    c10::TensorImpl* impl = place.tensor.unsafeGetTensorImpl();
    const bool moved = !impl->storage().is_alias_of(place.storage) ||
                       impl->storage_offset() != place.offset ||
                       impl->sizes() != c10::IntArrayRef(place.sizes) ||
                       impl->strides() != c10::IntArrayRef(place.strides);
    if (!moved || !impl->allow_tensor_metadata_change()) continue;
    impl->set_storage_keep_dtype(place.storage);
    impl->set_sizes_and_strides(place.sizes, place.strides);
    impl->set_storage_offset(place.offset);
  }
  for (const Bytes& bytes : storages_) bytes.alias.copy_(bytes.values);
}

OutsideState OutsideState::now() const {
  OutsideState state;
  for (const Bytes& bytes : storages_) {
    const ModesOff off;
    state.storages_.push_back({bytes.alias, bytes.alias.clone()});
  }
  for (const Place& place : tensors_) state.add_place(place.tensor, place.bytes);
  return state;
}

OutsideState::Swap::Swap(const OutsideState& at_forward) : before_swap_(at_forward.now()) {
  at_forward.put_back();
}

OutsideState::Swap::~Swap() {
  before_swap_.put_back();
}

OutsideStateWatch::OutsideStateWatch(const std::vector<at::Tensor>& known,
                                     const std::vector<std::shared_ptr<torch::nn::Module>>& modules,
                                     Purpose purpose, BeforeCall before_call,
                                     BeforeBufferWrite before_buffer_write)
    : purpose_(purpose),
      before_call_(std::move(before_call)),
      before_buffer_write_(std::move(before_buffer_write)) {
  for (const auto& tensor : known) inside_.insert(storage_of(tensor));
  for (const auto& module : modules) {
    for (const auto& tensor : module->parameters()) inside_.insert(storage_of(tensor));
    for (const auto& tensor : module->buffers()) {
      inside_.insert(storage_of(tensor));
      buffers_.insert(storage_of(tensor));
    }
  }
}

OutsideStateWatch::~OutsideStateWatch() {
  if (finished_ || before_.empty()) return;
  before_.put_back();
}

OutsideState OutsideStateWatch::finished() {
  finished_ = true;
  OutsideState kept;
  std::vector<int64_t> renumbered(before_.storages_.size(), -1);
  for (size_t i = 0; i < before_.storages_.size(); ++i) {
    if (!read_again_[i]) continue;
    renumbered[i] = static_cast<int64_t>(kept.storages_.size());
    kept.storages_.push_back(std::move(before_.storages_[i]));
  }
  for (OutsideState::Place& place : before_.tensors_) {
    if (renumbered[place.bytes] < 0) continue;
    place.bytes = static_cast<size_t>(renumbered[place.bytes]);
    kept.tensors_.push_back(std::move(place));
  }
  before_ = OutsideState();
  return kept;
}

int64_t OutsideStateWatch::see(const at::Tensor& tensor) {
  const c10::StorageImpl* storage = storage_of(tensor);
  if (storage == nullptr || tensor.requires_grad()) return -1;
  size_t entry = 0;
  const auto found = written_.find(storage);
  if (found != written_.end()) {
    entry = found->second;
  } else {
    if (inside_.count(storage) != 0) return -1;
    entry = before_.add_bytes(tensor);
    written_.emplace(storage, entry);
    read_again_.push_back(read_before_.count(storage) != 0);
  }
  if (placed_.emplace(tensor.unsafeGetTensorImpl(), entry).second) before_.add_place(tensor, entry);
  return static_cast<int64_t>(entry);
}

void OutsideStateWatch::note_read(const at::Tensor& tensor, const c10::OperatorHandle& op) {
  const c10::StorageImpl* storage = storage_of(tensor);
  const auto found = written_.find(storage);
  if (found != written_.end()) read_again_[found->second] = true;
  const auto placed = placed_.find(tensor.unsafeGetTensorImpl());
  if (placed != placed_.end()) read_again_[placed->second] = true;
  if (found != written_.end() || storage == nullptr) return;
  // A buffer of the region's modules is theirs to put back where the function writes it (a
  // BatchNorm's statistics); one it only reads is read again by the recompute, as a captured one.
  const bool buffer = buffers_.count(storage) != 0;
  if (buffer ? written_buffers_.count(storage) != 0 : inside_.count(storage) != 0) return;
  if (!buffer && !tensor.requires_grad()) read_before_.insert(storage);  // outside state
  const c10::VariableVersion& counter = tensor.unsafeGetTensorImpl()->version_counter();
  // An inference tensor has none, and can't be written outside InferenceMode.
  if (!counter.enabled() || !read_tensors_.insert(tensor.unsafeGetTensorImpl()).second) return;
  // (A nested tensor has no sizes of its own to name it by.)
  reads_.push_back({counter, storage,
                    tensor.is_nested() ? std::vector<int64_t>() : tensor.sizes().vec(),
                    op.operator_name().name});
}

ReadVersions OutsideStateWatch::take_reads() {
  ReadVersions snapshot;
  for (Read& read : reads_) {
    // Written by the function itself: outside state, which the recompute starts from as the
    // forward found it (other regions' forwards may write it too).
    if (written_.count(read.storage) == 0 && written_buffers_.count(read.storage) == 0)
      snapshot.add(read.counter, std::move(read.sizes), std::move(read.reader));
  }
  reads_.clear();
  return snapshot;
}

void OutsideStateWatch::dispatch(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const auto& arguments = schema.arguments();
  const size_t first = stack->size() - arguments.size();
  const bool updates_statistics = updates_running_statistics(op);
  const bool keep = purpose_ == Purpose::Keep;
  std::vector<size_t> first_writes;  // `Keep`: entries this operator wrote first
  for (size_t i = 0; i < arguments.size(); ++i) {
    const c10::AliasInfo* alias = arguments[i].alias_info();
    const bool written = updates_statistics || (alias != nullptr && alias->isWrite());
    if (!written && !keep) continue;
    for_each_tensor((*stack)[first + i], [&](const at::Tensor& t) {
      // A write after the first reads what the first wrote (`mul_(0.5).add_(h)`); a first write
      // alone reads nothing the graph keeps (`copy_`), or its fresh results say so (below).
      if (keep && (!written || written_.count(storage_of(t)) != 0)) note_read(t, op);
      if (!written) return;
      if (buffers_.count(storage_of(t)) != 0) {
        if (keep) written_buffers_.insert(storage_of(t));
        if (before_buffer_write_) before_buffer_write_(storage_of(t));
      }
      const size_t entries = read_again_.size();
      const int64_t entry = see(t);
      if (keep && read_again_.size() > entries) first_writes.push_back(static_cast<size_t>(entry));
    });
  }
  const std::optional<at::Generator> generator = default_generator_of(op, *stack, first);
  if (generator) {
    draws_.devices.push_back(generator->device());
    draws_.states.push_back(generator_state_hash(*generator));
  }
  if (before_call_) before_call_(op, *stack);
  run(op, stack);
  if (generator) draws_.states.push_back(generator_state_hash(*generator));
  // Fresh results (no alias in the schema) belong to the function; views and in-place results
  // share an argument's data, which keeps its own standing.
  const auto& returns = schema.returns();
  const size_t results = std::min(returns.size(), stack->size());
  bool fresh_results = false;
  for (size_t i = 0; i < results; ++i) {
    if (returns[i].alias_info() != nullptr) continue;
    for_each_tensor((*stack)[stack->size() - results + i], [&](const at::Tensor& t) {
      inside_.insert(storage_of(t));
      fresh_results = true;
    });
  }
  // A fresh result may have been computed from what the operator found before its write (a
  // quantization observer's statistics): the recompute must find it too.
  if (fresh_results) {
    for (size_t entry : first_writes) read_again_[entry] = true;
  }
}

}  // namespace detail
}  // namespace ckpt
