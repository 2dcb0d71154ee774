#include "model_chain.h"

#include "bench_models.h"
#include "errors.h"

#include <ckpt/modeled_device.h>
#include <ckpt/plan/bytes.h>
#include <ckpt/profiler.h>

#include <ATen/ops/empty.h>

#include <algorithm>
#include <stdexcept>

namespace ckpt {
namespace cli {

ModeledChain modeled_bench_chain(const PlanArgs& args) {
  const std::vector<std::string> names = models::model_names();
  if (std::find(names.begin(), names.end(), args.model) == names.end()) {
    std::string known;
    for (const auto& name : names) known += (known.empty() ? "" : ", ") + name;
    throw UsageError("--model: unknown model '" + args.model + "'; choose among " + known);
  }
  DeviceProfile device = DeviceProfile::load(args.device_profile_path);
  if (!args.device_memory.empty()) {
    try {
      device.memory_bytes = plan::parse_bytes(args.device_memory, "the device's memory");
    } catch (const std::invalid_argument& error) {
      throw UsageError(std::string("--device-memory: ") + error.what());
    }
  }
  const models::ModelConfig config = models::model_config(args.model, args.quick);
  auto model = models::build_model(config);
  move_to_meta(*model);
  const at::Tensor sample = models::make_input(config);
  ModeledChain modeled;
  modeled.device_memory_bytes = device.memory_bytes;
  modeled.device_name = device.name;
  modeled.resident_bytes = static_cast<int64_t>(sample.nbytes());
  for (const auto& p : model->parameters()) modeled.resident_bytes += p.numel() * p.element_size();
  const ModeledDevice modeled_device(device);
  modeled.chain = profile_chain({model->begin(), model->end()},
                                at::empty(sample.sizes(), sample.options().device(c10::kMeta)));
  return modeled;
}

}  // namespace cli
}  // namespace ckpt
