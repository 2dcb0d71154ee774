#include "svg_chart.h"

#include "output_path.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <stdexcept>

namespace ckpt {
namespace cli {
namespace {

constexpr double kWidth = 800, kHeight = 450;
constexpr double kLeft = 80, kRight = 30, kTop = 50, kBottom = 60;
constexpr double kPlotWidth = kWidth - kLeft - kRight, kPlotHeight = kHeight - kTop - kBottom;

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

// Maps data to pixels in the panel whose top is at `top`.
struct Frame {
  double top, x_max, x_step, y_min, y_max, y_step;
  double px(double x) const { return kLeft + x / x_max * kPlotWidth; }
  double py(double y) const {
    return top + kTop + kPlotHeight - (y - y_min) / (y_max - y_min) * kPlotHeight;
  }
};

Frame frame_of(const Chart& chart, double top) {
  double x_max = 0, y_min = chart.y_min, y_max = chart.y_min;
  for (const ChartSeries& s : chart.series) {
    for (const auto& [x, y] : s.points) {
      x_max = std::max(x_max, x);
      y_min = std::min(y_min, y);  // the axis starts lower rather than hide a point
      y_max = std::max(y_max, y);
    }
  }
  const double x_range = x_max > 0 ? x_max : 1;
  const double y_range = y_max > y_min ? (y_max - y_min) * 1.05 : 1;
  const double x_step = tick_step(x_range, 8), y_step = tick_step(y_range, 6);
  const double y_low = y_min < chart.y_min ? std::floor(y_min / y_step) * y_step : chart.y_min;
  return {top,
          std::ceil(x_range / x_step) * x_step,
          x_step,
          y_low,
          y_low + std::ceil((y_max - y_low) * 1.05 / y_step) * y_step,
          y_step};
}

void draw_axes(std::ostringstream& svg, const Chart& chart, const Frame& f) {
  svg << "<text x=\"" << kWidth / 2 << "\" y=\"" << f.top + 28
      << "\" text-anchor=\"middle\" font-size=\"16\">" << escape(chart.title) << "</text>\n";
  for (double y = f.y_min; y <= f.y_max + 1e-9; y += f.y_step) {
    svg << "<line x1=\"" << kLeft << "\" y1=\"" << number(f.py(y)) << "\" x2=\""
        << kLeft + kPlotWidth << "\" y2=\"" << number(f.py(y)) << "\" stroke=\"#e0e0e0\"/>\n";
    svg << "<text x=\"" << kLeft - 8 << "\" y=\"" << number(f.py(y) + 4)
        << "\" text-anchor=\"end\">" << tick_label(y) << "</text>\n";
  }
  const double bottom = f.top + kTop + kPlotHeight;
  for (double x = 0; x <= f.x_max + 1e-9; x += f.x_step) {
    svg << "<line x1=\"" << number(f.px(x)) << "\" y1=\"" << f.top + kTop << "\" x2=\""
        << number(f.px(x)) << "\" y2=\"" << bottom << "\" stroke=\"#f0f0f0\"/>\n";
    svg << "<text x=\"" << number(f.px(x)) << "\" y=\"" << bottom + 18
        << "\" text-anchor=\"middle\">" << tick_label(x) << "</text>\n";
  }
  svg << "<line x1=\"" << kLeft << "\" y1=\"" << bottom << "\" x2=\"" << kLeft + kPlotWidth
      << "\" y2=\"" << bottom << "\" stroke=\"black\"/>\n";
  svg << "<line x1=\"" << kLeft << "\" y1=\"" << f.top + kTop << "\" x2=\"" << kLeft << "\" y2=\""
      << bottom << "\" stroke=\"black\"/>\n";
  svg << "<text x=\"" << kLeft + kPlotWidth / 2 << "\" y=\"" << f.top + kHeight - 18
      << "\" text-anchor=\"middle\" font-size=\"13\">" << escape(chart.x_label) << "</text>\n";
  svg << "<text transform=\"translate(22," << f.top + kTop + kPlotHeight / 2
      << ") rotate(-90)\" text-anchor=\"middle\" font-size=\"13\">" << escape(chart.y_label)
      << "</text>\n";
}

void draw_series(std::ostringstream& svg, const ChartSeries& s, const Frame& f) {
  if (s.line) {
    svg << "<polyline fill=\"none\" stroke=\"" << s.color << "\" stroke-width=\"1.5\""
        << (s.dashed ? " stroke-dasharray=\"4 4\" stroke-opacity=\"0.6\"" : "")
        << " stroke-linejoin=\"round\" points=\"";
    for (const auto& [x, y] : s.points) svg << number(f.px(x)) << "," << number(f.py(y)) << " ";
    svg << "\"/>\n";
  }
  if (!s.markers) return;
  for (const auto& [x, y] : s.points) {
    svg << "<circle cx=\"" << number(f.px(x)) << "\" cy=\"" << number(f.py(y))
        << "\" r=\"3.5\" fill=\"" << s.color << "\"/>\n";
  }
}

void draw_legend(std::ostringstream& svg, const Chart& chart, const Frame& f) {
  double y = f.top + kTop + 14;
  const double x = kLeft + kPlotWidth - 300;
  for (const ChartSeries& s : chart.series) {
    if (s.label.empty()) continue;
    svg << "<rect x=\"" << x - 8 << "\" y=\"" << y - 12
        << "\" width=\"306\" height=\"20\" fill=\"white\" fill-opacity=\"0.85\"/>\n";
    svg << "<line x1=\"" << x << "\" y1=\"" << y - 4 << "\" x2=\"" << x + 24 << "\" y2=\"" << y - 4
        << "\" stroke=\"" << s.color << "\" stroke-width=\"3\"/>\n";
    svg << "<text x=\"" << x + 32 << "\" y=\"" << y << "\">" << escape(s.label) << "</text>\n";
    y += 20;
  }
}

}  // namespace

std::string charts_svg(const std::vector<Chart>& charts) {
  const double height = kHeight * static_cast<double>(std::max<size_t>(charts.size(), 1));
  std::ostringstream svg;
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kWidth << "\" height=\"" << height
      << "\" viewBox=\"0 0 " << kWidth << " " << height
      << "\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"12\">\n";
  svg << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  for (size_t i = 0; i < charts.size(); ++i) {
    const Frame f = frame_of(charts[i], kHeight * static_cast<double>(i));
    draw_axes(svg, charts[i], f);
    for (const ChartSeries& s : charts[i].series) draw_series(svg, s, f);
    draw_legend(svg, charts[i], f);
  }
  svg << "</svg>\n";
  return svg.str();
}

void write_charts(const std::string& path, const std::vector<Chart>& charts,
                  const std::string& option) {
  write_whole_file(path, charts_svg(charts), option);
}

}  // namespace cli
}  // namespace ckpt
