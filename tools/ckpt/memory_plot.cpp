#include "memory_plot.h"

#include "units.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace ckpt {
namespace cli {
namespace {

// A "nice" tick step (1, 2 or 5 times a power of ten) giving about `target` ticks over `range`.
double tick_step(double range, int target) {
  const double raw = range / target;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  for (double factor : {1.0, 2.0, 5.0, 10.0}) {
    if (factor * power >= raw) return factor * power;
  }
  return 10 * power;
}

std::string escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string number(double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.1f", value);
  return buffer;
}

std::string tick_label(double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%g", std::fabs(value) < 1e-9 ? 0.0 : value);
  return buffer;
}

}  // namespace

std::string memory_plot_svg(const std::vector<MemorySeries>& series, const std::string& title) {
  constexpr double kWidth = 800, kHeight = 450;
  constexpr double kLeft = 80, kRight = 30, kTop = 50, kBottom = 60;
  const double plot_width = kWidth - kLeft - kRight, plot_height = kHeight - kTop - kBottom;
  constexpr double kMiB = 1024.0 * 1024.0;

  double max_ms = 0, max_mib = 0;
  for (const MemorySeries& s : series) {
    for (const auto& [seconds, bytes] : s.samples) {
      max_ms = std::max(max_ms, seconds * 1e3);
      max_mib = std::max(max_mib, static_cast<double>(bytes) / kMiB);
    }
  }
  const double x_step = tick_step(max_ms > 0 ? max_ms : 1, 8);
  const double y_step = tick_step(max_mib > 0 ? max_mib * 1.05 : 1, 6);
  const double x_max = std::ceil((max_ms > 0 ? max_ms : 1) / x_step) * x_step;
  const double y_max = std::ceil((max_mib > 0 ? max_mib * 1.05 : 1) / y_step) * y_step;
  const auto px = [&](double ms) { return kLeft + ms / x_max * plot_width; };
  const auto py = [&](double mib) { return kTop + plot_height - mib / y_max * plot_height; };

  std::ostringstream svg;
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kWidth << "\" height=\"" << kHeight
      << "\" viewBox=\"0 0 " << kWidth << " " << kHeight
      << "\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"12\">\n";
  svg << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  svg << "<text x=\"" << kWidth / 2 << "\" y=\"28\" text-anchor=\"middle\" font-size=\"16\">"
      << escape(title) << "</text>\n";
  // Grid and ticks.
  for (double y = 0; y <= y_max + 1e-9; y += y_step) {
    svg << "<line x1=\"" << kLeft << "\" y1=\"" << number(py(y)) << "\" x2=\"" << kLeft + plot_width
        << "\" y2=\"" << number(py(y)) << "\" stroke=\"#e0e0e0\"/>\n";
    svg << "<text x=\"" << kLeft - 8 << "\" y=\"" << number(py(y) + 4) << "\" text-anchor=\"end\">"
        << tick_label(y) << "</text>\n";
  }
  for (double x = 0; x <= x_max + 1e-9; x += x_step) {
    svg << "<line x1=\"" << number(px(x)) << "\" y1=\"" << kTop << "\" x2=\"" << number(px(x))
        << "\" y2=\"" << kTop + plot_height << "\" stroke=\"#f0f0f0\"/>\n";
    svg << "<text x=\"" << number(px(x)) << "\" y=\"" << kTop + plot_height + 18
        << "\" text-anchor=\"middle\">" << tick_label(x) << "</text>\n";
  }
  // Axes and labels.
  svg << "<line x1=\"" << kLeft << "\" y1=\"" << kTop + plot_height << "\" x2=\""
      << kLeft + plot_width << "\" y2=\"" << kTop + plot_height << "\" stroke=\"black\"/>\n";
  svg << "<line x1=\"" << kLeft << "\" y1=\"" << kTop << "\" x2=\"" << kLeft << "\" y2=\""
      << kTop + plot_height << "\" stroke=\"black\"/>\n";
  svg << "<text x=\"" << kLeft + plot_width / 2 << "\" y=\"" << kHeight - 18
      << "\" text-anchor=\"middle\" font-size=\"13\">time since the step began (ms)</text>\n";
  svg << "<text transform=\"translate(22," << kTop + plot_height / 2
      << ") rotate(-90)\" text-anchor=\"middle\" font-size=\"13\">memory above the step's start "
         "(MiB)</text>\n";
  // Series, with a dashed line at each peak.
  for (const MemorySeries& s : series) {
    int64_t peak = 0;
    for (const auto& sample : s.samples) peak = std::max(peak, sample.second);
    svg << "<line x1=\"" << kLeft << "\" y1=\"" << number(py(peak / kMiB)) << "\" x2=\""
        << kLeft + plot_width << "\" y2=\"" << number(py(peak / kMiB)) << "\" stroke=\"" << s.color
        << "\" stroke-dasharray=\"4 4\" stroke-opacity=\"0.6\"/>\n";
    svg << "<polyline fill=\"none\" stroke=\"" << s.color
        << "\" stroke-width=\"1.5\" stroke-linejoin=\"round\" points=\"";
    for (const auto& [seconds, bytes] : s.samples) {
      svg << number(px(seconds * 1e3)) << "," << number(py(bytes / kMiB)) << " ";
    }
    svg << "\"/>\n";
  }
  // Legend (top right).
  double legend_y = kTop + 14;
  for (const MemorySeries& s : series) {
    int64_t peak = 0;
    for (const auto& sample : s.samples) peak = std::max(peak, sample.second);
    const double x = kLeft + plot_width - 300;
    svg << "<rect x=\"" << x - 8 << "\" y=\"" << legend_y - 12
        << "\" width=\"306\" height=\"20\" fill=\"white\" fill-opacity=\"0.85\"/>\n";
    svg << "<line x1=\"" << x << "\" y1=\"" << legend_y - 4 << "\" x2=\"" << x + 24 << "\" y2=\""
        << legend_y - 4 << "\" stroke=\"" << s.color << "\" stroke-width=\"3\"/>\n";
    svg << "<text x=\"" << x + 32 << "\" y=\"" << legend_y << "\">"
        << escape(s.label + " (peak " + format_bytes(peak) + ")") << "</text>\n";
    legend_y += 20;
  }
  svg << "</svg>\n";
  return svg.str();
}

void write_memory_plot(const std::string& path, const std::vector<MemorySeries>& series,
                       const std::string& title) {
  std::ofstream file(path);
  if (!file) throw std::runtime_error("--plot: cannot write '" + path + "'");
  file << memory_plot_svg(series, title);
  if (!file) throw std::runtime_error("--plot: error while writing '" + path + "'");
}

}  // namespace cli
}  // namespace ckpt
