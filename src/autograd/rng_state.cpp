#include "rng_state.h"

#include "compat/torch_compat.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>
#include <torch/version.h>
#include <cstring>

#include <algorithm>
#include <mutex>
#include <set>

namespace ckpt {
namespace detail {
namespace {

at::Tensor read_state(at::Generator generator) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

void write_state(at::Generator& generator, const at::Tensor& state) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
}

at::Generator cpu_generator() {
  return at::detail::getDefaultCPUGenerator();
}

// Arguments on a device type whose generators this LibTorch doesn't give ckpt (PrivateUse1 on
// 1.13; before 2.3, every type but CUDA): its random draws can't be replayed in the recompute.
// Said once per type and process, as a training loop would repeat it at every step.
void warn_if_unreachable(const std::vector<at::Tensor>& inputs, c10::DeviceType type) {
  // Meta tensors have no values, so no random numbers to replay.
  if (type == c10::DeviceType::CPU || type == c10::DeviceType::Meta) return;
  const bool on_device = std::any_of(inputs.begin(), inputs.end(), [&](const at::Tensor& t) {
    return t.defined() && t.device().type() == type;
  });
  if (!on_device) return;
  static std::mutex mutex;
  static std::set<c10::DeviceType> warned;
  {
    const std::lock_guard<std::mutex> lock(mutex);
    if (!warned.insert(type).second) return;
  }
  TORCH_WARN("ckpt: the arguments of a checkpointed region are on ", c10::DeviceTypeName(type),
             ", whose random number generators LibTorch ", TORCH_VERSION,
             " doesn't expose, so that device's RNG state can't be preserved: random operators "
             "on it inside the region (dropout, say) draw other numbers in the recompute, and the "
             "gradients differ from an unchecked run's. Keep such operators out of checkpointed "
             "regions, or pass preserve_rng_state(false) to accept it. (Said once per device "
             "type.)");
}

}  // namespace

RngStash::RngStash(const std::vector<at::Tensor>& inputs, c10::DeviceType device_type)
    : cpu_state_(read_state(cpu_generator())), device_type_(device_type) {
  had_device_ = compat::device_initialized(device_type_);
  if (!had_device_) {
    warn_if_unreachable(inputs, device_type_);
    return;
  }
  std::vector<c10::DeviceIndex> indices;
  for (const auto& tensor : inputs) {
    if (tensor.defined() && tensor.device().type() == device_type_) {
      indices.push_back(tensor.device().index());
    }
  }
  std::sort(indices.begin(), indices.end());
  indices.erase(std::unique(indices.begin(), indices.end()), indices.end());
  for (auto index : indices) {
    at::Generator generator = compat::default_generator(c10::Device(device_type_, index));
    device_states_.push_back(read_state(generator));
    device_generators_.push_back(std::move(generator));
  }
}

bool same_state(const at::Tensor& a, const at::Tensor& b) {
  // Generator states are small contiguous byte tensors: compare the bytes directly.
  return a.nbytes() == b.nbytes() && std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

int64_t cpu_random_state_bytes() {
  return static_cast<int64_t>(read_state(cpu_generator()).nbytes());
}

void RngStash::drop_cpu_state_if_unused() {
  if (cpu_state_.defined() && same_state(cpu_state_, read_state(cpu_generator()))) {
    cpu_state_.reset();
  }
}

void RngStash::restore() const {
  if (cpu_state_.defined()) {
    at::Generator cpu = cpu_generator();
    write_state(cpu, cpu_state_);
  }
  for (size_t i = 0; i < device_generators_.size(); ++i) {
    at::Generator generator = device_generators_[i];
    write_state(generator, device_states_[i]);
  }
}

RngFork::RngFork(const RngStash& stash) : generators_(stash.device_generators_) {
  if (stash.cpu_state_.defined()) saved_cpu_state_ = read_state(cpu_generator());
  for (auto& generator : generators_) saved_device_states_.push_back(read_state(generator));
  stash.restore();
}

RngFork::~RngFork() {
  if (saved_cpu_state_.defined()) {
    at::Generator cpu = cpu_generator();
    write_state(cpu, saved_cpu_state_);
  }
  for (size_t i = 0; i < generators_.size(); ++i) {
    write_state(generators_[i], saved_device_states_[i]);
  }
}

}  // namespace detail
}  // namespace ckpt
