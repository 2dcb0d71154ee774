#include "peak_report.h"

#include "units.h"

#include <algorithm>
#include <cstdio>

namespace ckpt {
namespace cli {
namespace {

bool starts_with(const std::string& text, const std::string& prefix) {
  return text.compare(0, prefix.size(), prefix) == 0;
}

std::string share(int64_t bytes, int64_t total) {
  char text[32];
  std::snprintf(text, sizeof text, "%.0f%%",
                total > 0 ? 100.0 * static_cast<double>(bytes) / static_cast<double>(total) : 0.0);
  return text;
}

}  // namespace

int64_t activation_bytes(const MemoryBreakdown& breakdown) {
  int64_t bytes = 0;
  for (const auto& [label, size] : breakdown.labels) {
    const bool forward = label == "forward" || starts_with(label, "forward/");
    if (forward || starts_with(label, "backward/")) bytes += size;
  }
  return bytes;
}

nlohmann::json peak_json(const StepPeak& peak) {
  const MemoryBreakdown& b = peak.breakdown;
  nlohmann::json labels = nlohmann::json::array();
  for (const auto& [label, bytes] : b.labels)
    labels.push_back({{"label", label}, {"bytes", bytes}});
  return {{"step", peak.step},
          {"peak_bytes", b.peak_bytes},
          {"above_step_start_bytes", b.peak_bytes - peak.base_bytes},
          {"where", b.where},
          {"parameters_bytes", b.parameters_bytes},
          {"gradients_bytes", b.gradients_bytes},
          {"optimizer_state_bytes", b.optimizer_state_bytes},
          {"activations_bytes", activation_bytes(b)},
          {"labels", labels},
          {"other_bytes", b.other_bytes}};
}

void print_peak(const std::string& label, const StepPeak& peak) {
  const MemoryBreakdown& b = peak.breakdown;
  const int64_t activations = activation_bytes(b);
  std::printf("%s: step %d, %s live (%s above the step's start), reached in %s\n", label.c_str(),
              peak.step, format_bytes(b.peak_bytes).c_str(),
              format_bytes(b.peak_bytes - peak.base_bytes).c_str(),
              b.where.empty() ? "(no label)" : b.where.c_str());
  std::printf("  parameters %s, gradients %s, optimizer state %s, activations %s (%s), rest %s\n",
              format_bytes(b.parameters_bytes).c_str(), format_bytes(b.gradients_bytes).c_str(),
              format_bytes(b.optimizer_state_bytes).c_str(), format_bytes(activations).c_str(),
              share(activations, b.peak_bytes).c_str(),
              format_bytes(b.peak_bytes - b.parameters_bytes - b.gradients_bytes -
                           b.optimizer_state_bytes - activations)
                  .c_str());
  std::string largest;
  const size_t shown = std::min<size_t>(b.labels.size(), 4);
  for (size_t i = 0; i < shown; ++i) {
    largest += (i ? ", " : "") + b.labels[i].first + " " + format_bytes(b.labels[i].second);
  }
  if (b.labels.size() > shown) largest += ", ...";
  if (b.other_bytes != 0)
    largest +=
        (largest.empty() ? "" : ", ") + std::string("unlabelled ") + format_bytes(b.other_bytes);
  std::printf("  by label: %s\n", largest.c_str());
}

}  // namespace cli
}  // namespace ckpt
