#pragma once

// Hand-written SVG line charts for the `ckpt` program: `train --plot` (memory over a step) and
// `bench --plot` (step time against peak memory).

#include <string>
#include <utility>
#include <vector>

namespace ckpt {
namespace cli {

/// One line of a chart.
struct ChartSeries {
  std::string label;                              // legend text; empty: not in the legend
  std::string color;                              // any SVG colour, e.g. "#d62728"
  std::vector<std::pair<double, double>> points;  // (x, y), drawn in this order
  bool markers = false;                           // a dot at each point
  bool dashed = false;
  bool line = true;  // false: the dots alone
};

/// A chart: its title, axis labels, and series. The axes start at 0 unless `y_min` says
/// otherwise, and end past the largest value at a round number.
struct Chart {
  std::string title;
  std::string x_label;
  std::string y_label;
  double y_min = 0.0;
  std::vector<ChartSeries> series;
};

/// An SVG document with the charts stacked from top to bottom.
std::string charts_svg(const std::vector<Chart>& charts);

/// Writes `charts_svg(charts)` to `path`; throws std::runtime_error naming `option` when the file
/// cannot be written.
void write_charts(const std::string& path, const std::vector<Chart>& charts,
                  const std::string& option);

}  // namespace cli
}  // namespace ckpt
