#pragma once

// `ckpt train --plot FILE`: memory over one training step, as an SVG line chart (svg_chart.h).

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ckpt {
namespace cli {

/// One line of the chart: samples of (seconds since the step began, bytes above the step's
/// starting memory).
struct MemorySeries {
  std::string label;
  std::string color;  // any SVG colour, e.g. "#d62728"
  std::vector<std::pair<double, int64_t>> samples;
};

/// Writes the chart to `path` as SVG: axes in milliseconds and MiB, a legend with each series'
/// peak, one line per series, and a dashed line at each peak. Throws std::runtime_error when the
/// file cannot be written.
void write_memory_plot(const std::string& path, const std::vector<MemorySeries>& series,
                       const std::string& title);

}  // namespace cli
}  // namespace ckpt
