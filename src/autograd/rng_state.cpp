#include "rng_state.h"

#include "compat/torch_compat.h"

#include <ATen/CPUGeneratorImpl.h>
#include <cstring>

#include <algorithm>
#include <mutex>

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

}  // namespace

RngStash::RngStash(const std::vector<at::Tensor>& inputs, c10::DeviceType device_type)
    : cpu_state_(read_state(cpu_generator())), device_type_(device_type) {
  had_device_ = compat::device_initialized(device_type_);
  if (!had_device_) return;
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
