#include <ckpt/modeled_device.h>

#include "autograd/rng_state.h"
#include "compat/torch_compat.h"
#include "measure/step_measure.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/ones.h>
#include <c10/util/Exception.h>

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <fstream>

namespace ckpt {
namespace {

using nlohmann::json;

// The median seconds of `run` over a few repetitions, after one untimed.
template <class Run>
double timed(c10::Device device, int repeats, const Run& run) {
  run();
  std::vector<double> seconds;
  for (int r = 0; r < repeats; ++r) {
    compat::synchronize(device);
    const auto start = detail::Clock::now();
    run();
    seconds.push_back(detail::seconds_since(start, device));
  }
  return detail::median(seconds);
}

int64_t host_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : 0;
}

template <class T>
T field(const json& object, const char* name, const std::string& path) {
  TORCH_CHECK(object.contains(name), "ckpt::DeviceProfile::load: ", path, " has no \"", name,
              "\"; a device profile has name, memory_bytes, allocation_granularity, "
              "flops_per_second, bytes_per_second and seconds_per_operator (write one with "
              "`ckpt bench --device-profile FILE`).");
  try {
    return object.at(name).get<T>();
  } catch (const json::exception& error) {
    TORCH_CHECK(false, "ckpt::DeviceProfile::load: ", path, ": \"", name, "\" ", error.what());
  }
}

}  // namespace

DeviceProfile DeviceProfile::load(const std::string& path) {
  std::ifstream in(path);
  TORCH_CHECK(in, "ckpt::DeviceProfile::load: can't read ", path,
              "; write a device's profile with `ckpt bench --device-profile FILE` on it, or by "
              "hand (docs/any-model.md, \"Planning without the device\").");
  json object;
  try {
    in >> object;
  } catch (const json::exception& error) {
    TORCH_CHECK(false, "ckpt::DeviceProfile::load: ", path, " is not JSON: ", error.what());
  }
  DeviceProfile profile;
  profile.name = field<std::string>(object, "name", path);
  profile.memory_bytes = field<int64_t>(object, "memory_bytes", path);
  profile.allocation_granularity = field<int64_t>(object, "allocation_granularity", path);
  profile.flops_per_second = field<double>(object, "flops_per_second", path);
  profile.bytes_per_second = field<double>(object, "bytes_per_second", path);
  profile.seconds_per_operator = field<double>(object, "seconds_per_operator", path);
  if (object.contains("count_cpu_scratch")) {
    profile.count_cpu_scratch = field<bool>(object, "count_cpu_scratch", path);
  }
  if (object.contains("random_state_bytes")) {
    profile.random_state_bytes = field<int64_t>(object, "random_state_bytes", path);
  }
  TORCH_CHECK(profile.memory_bytes >= 0 && profile.allocation_granularity >= 1 &&
                  profile.random_state_bytes >= 0 && profile.flops_per_second > 0 &&
                  profile.bytes_per_second > 0 && profile.seconds_per_operator >= 0,
              "ckpt::DeviceProfile::load: ", path,
              ": memory_bytes and random_state_bytes must be at least 0, "
              "allocation_granularity at least 1, the throughputs positive and "
              "seconds_per_operator at least 0.");
  return profile;
}

void DeviceProfile::save(const std::string& path) const {
  const json object = {{"name", name},
                       {"memory_bytes", memory_bytes},
                       {"allocation_granularity", allocation_granularity},
                       {"flops_per_second", flops_per_second},
                       {"bytes_per_second", bytes_per_second},
                       {"seconds_per_operator", seconds_per_operator},
                       {"count_cpu_scratch", count_cpu_scratch},
                       {"random_state_bytes", random_state_bytes}};
  std::ofstream out(path);
  out << object.dump(2) << "\n";
  TORCH_CHECK(out, "ckpt::DeviceProfile::save: can't write ", path, ".");
}

DeviceProfile DeviceProfile::measure(c10::Device device) {
  const auto options = at::TensorOptions().device(device).dtype(at::kFloat);
  DeviceProfile profile;
  profile.name = device.str();
  profile.memory_bytes = device.is_cpu() ? host_memory_bytes() : 0;
  profile.allocation_granularity = detail::allocation_granularity(device);
  profile.count_cpu_scratch = device.is_cpu();
  profile.random_state_bytes = device.is_cpu() ? detail::cpu_random_state_bytes() : 0;

  const int64_t n = device.is_cpu() ? 512 : 4096;
  const at::Tensor a = at::ones({n, n}, options), b = at::ones({n, n}, options);
  const double mm = timed(device, 5, [&] { at::mm(a, b); });
  profile.flops_per_second = 2.0 * static_cast<double>(n * n * n) / mm;

  const at::Tensor from = at::ones({int64_t{16} << 20}, options);  // 64 MiB
  at::Tensor to = at::empty_like(from);
  const double copy = timed(device, 5, [&] { to.copy_(from); });
  profile.bytes_per_second = 2.0 * static_cast<double>(from.nbytes()) / copy;

  const at::Tensor one = at::ones({1}, options);
  constexpr int kSmall = 200;
  const double small = timed(device, 3, [&] {
    for (int i = 0; i < kSmall; ++i) one.add(one);
  });
  profile.seconds_per_operator = small / kSmall;
  return profile;
}

}  // namespace ckpt
