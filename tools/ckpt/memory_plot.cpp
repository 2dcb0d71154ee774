#include "memory_plot.h"

#include "svg_chart.h"
#include "units.h"

#include <algorithm>

namespace ckpt {
namespace cli {

namespace {

Chart memory_chart(const std::vector<MemorySeries>& series, const std::string& title) {
  constexpr double kMiB = 1024.0 * 1024.0;
  Chart chart;
  chart.title = title;
  chart.x_label = "time since the step began (ms)";
  chart.y_label = "memory above the step's start (MiB)";
  double end_ms = 0;
  for (const MemorySeries& s : series) {
    for (const auto& sample : s.samples) end_ms = std::max(end_ms, sample.first * 1e3);
  }
  for (const MemorySeries& s : series) {
    int64_t peak = 0;
    ChartSeries line{s.label, s.color, {}, false, false};
    for (const auto& [seconds, bytes] : s.samples) {
      line.points.emplace_back(seconds * 1e3, static_cast<double>(bytes) / kMiB);
      peak = std::max(peak, bytes);
    }
    line.label += " (peak " + format_bytes(peak) + ")";
    chart.series.push_back(std::move(line));
    // A dashed line at the peak, across the chart.
    const double peak_mib = static_cast<double>(peak) / kMiB;
    chart.series.push_back({"", s.color, {{0.0, peak_mib}, {end_ms, peak_mib}}, false, true});
  }
  return chart;
}

}  // namespace

void write_memory_plot(const std::string& path, const std::vector<MemorySeries>& series,
                       const std::string& title) {
  write_charts(path, {memory_chart(series, title)}, "--plot");
}

}  // namespace cli
}  // namespace ckpt
