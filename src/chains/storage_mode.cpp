#include <ckpt/storage_mode.h>

#include "module_region.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cctype>
#include <stdexcept>

namespace ckpt {

StorageModes StorageModes::standard() {
  StorageModes modes;
  modes.add({kCheckpointedMode, "keeps the stage's output; its backward recomputes the rest",
             [](const StorageSettings&) -> std::optional<CheckpointOptions> {
               return CheckpointOptions();
             }});
  modes.add({"two_pass",
             "keeps the stage's output; its backward recomputes the rest in two passes, "
             "never holding the first operators' saved tensors beside the last ones'",
             [](const StorageSettings&) -> std::optional<CheckpointOptions> {
               return CheckpointOptions().two_pass_recompute(true);
             }});
  modes.add({"selective",
             "keeps the output and what the selective policy saves; recomputes the rest",
             [](const StorageSettings& settings) -> std::optional<CheckpointOptions> {
               if (!settings.selective_policy) return std::nullopt;
               return CheckpointOptions().policy(settings.selective_policy);
             }});
  modes.add({"offloaded",
             "keeps what its backward needs in host memory, brought back when the backward "
             "starts; recomputes nothing (accelerators only)",
             [](const StorageSettings&) -> std::optional<CheckpointOptions> {
               return CheckpointOptions().offload(true);
             }});
  return modes;
}

StorageModes StorageModes::defaults() {
  return standard().remove("two_pass");
}

std::optional<CheckpointOptions> StorageMode::region_on(const StorageSettings& settings,
                                                        c10::Device device) const {
  std::optional<CheckpointOptions> options = region(settings);
  if (options && options->offload() && (device.is_cpu() || device.is_meta())) return std::nullopt;
  return options;
}

StorageModes& StorageModes::add(StorageMode mode) {
  const bool spelt =
      !mode.name.empty() && std::all_of(mode.name.begin(), mode.name.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
      });
  TORCH_CHECK(spelt,
              "ckpt::StorageModes::add: a mode's name is made of letters, digits and '_', "
              "but got '",
              mode.name, "'.");
  TORCH_CHECK(find(mode.name) == nullptr, "ckpt::StorageModes::add: a mode named '", mode.name,
              "' is already in the table (", names(), "). Give the new mode another name.");
  TORCH_CHECK(static_cast<bool>(mode.region), "ckpt::StorageModes::add: mode '", mode.name,
              "' has no `region`: say which region options a stage in this mode runs with.");
  modes_.push_back(std::move(mode));
  return *this;
}

StorageModes& StorageModes::remove(const std::string& name) {
  const StorageMode& mode = at(name, "ckpt::StorageModes::remove");
  modes_.erase(modes_.begin() + (&mode - modes_.data()));
  return *this;
}

const StorageMode* StorageModes::find(const std::string& name) const {
  for (const StorageMode& mode : modes_) {
    if (mode.name == name) return &mode;
  }
  return nullptr;
}

const StorageMode& StorageModes::at(const std::string& name, const std::string& context) const {
  const StorageMode* mode = find(name);
  TORCH_CHECK(mode != nullptr, context, ": no storage mode is named '", name,
              "'; the table has: ", names(), ".");
  return *mode;
}

std::string StorageModes::names() const {
  std::string names;
  for (const StorageMode& mode : modes_) names += (names.empty() ? "" : ", ") + mode.name;
  return names.empty() ? "none" : names;
}

StorageModes StorageModes::select(const std::string& list) const {
  StorageModes selected;
  if (list.empty() || list == "none") return selected;
  size_t begin = 0;
  while (begin <= list.size()) {
    const size_t end = std::min(list.find(',', begin), list.size());
    const std::string name = list.substr(begin, end - begin);
    const StorageMode* mode = find(name);
    if (mode == nullptr || selected.find(name) != nullptr) {
      throw std::invalid_argument(
          (mode == nullptr ? "unknown storage mode '" : "storage mode named twice: '") + name +
          "' in '" + list + "'; the modes are: " + names() + " (or none)");
    }
    selected.modes_.push_back(*mode);
    begin = end + 1;
  }
  return selected;
}

std::function<at::Tensor(const at::Tensor&)> stage_forward(
    torch::nn::AnyModule stage, const std::optional<CheckpointOptions>& region) {
  if (!region) {
    return [stage](const at::Tensor& x) mutable { return stage.forward<at::Tensor>(x); };
  }
  return [stage, options = *region](const at::Tensor& x) mutable {
    return detail::checkpoint_modules(
        options, {stage.ptr()},
        [stage](const at::Tensor& input) mutable { return stage.forward<at::Tensor>(input); }, x);
  };
}

}  // namespace ckpt
