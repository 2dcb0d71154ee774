#include <ckpt/report.h>

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <iomanip>
#include <sstream>
#include <utility>

namespace ckpt {
namespace {

thread_local KeptReport* t_active = nullptr;

// "64.0 KiB": bytes for people (the JSON has the exact numbers).
std::string human_bytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  size_t unit = 0;
  while (value >= 1024 && unit + 1 < sizeof units / sizeof units[0]) {
    value /= 1024;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, unit == 0 ? "%.0f %s" : "%.1f %s", value, units[unit]);
  return text;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

std::string region_title(const RegionReport& region) {
  std::string title = region.stage.empty() || region.stage == region.name
                          ? region.name
                          : region.stage + ", " + region.name;
  return title + " (" + region.mode + ")";
}

int64_t sum_over(const std::vector<RegionReport>& regions, int64_t RegionReport::*field) {
  int64_t total = 0;
  for (const RegionReport& region : regions) total += region.*field;
  return total;
}

bool offloads(const RegionReport& region) {
  return std::any_of(region.entries.begin(), region.entries.end(), [](const KeptEntry& entry) {
    return entry.decision == KeptDecision::Offloaded;
  });
}

nlohmann::json entry_json(const KeptEntry& entry) {
  return {{"what", entry.what},
          {"why", entry.why},
          {"decision", to_string(entry.decision)},
          {"shape", entry.shape},
          {"dtype", entry.dtype == c10::ScalarType::Undefined ? "" : c10::toString(entry.dtype)},
          {"device", entry.device.str()},
          {"bytes", entry.bytes},
          {"counted_bytes", entry.counted_bytes},
          {"shared_with", entry.shared_with}};
}

}  // namespace

const char* to_string(KeptDecision decision) {
  switch (decision) {
    case KeptDecision::Kept:
      return "kept";
    case KeptDecision::Recomputed:
      return "recomputed";
    case KeptDecision::Offloaded:
      return "offloaded";
  }
  return "unknown";
}

int64_t KeptReport::kept_bytes() const {
  return sum_over(regions_, &RegionReport::kept_bytes);
}

int64_t KeptReport::recomputed_bytes() const {
  return sum_over(regions_, &RegionReport::recomputed_bytes);
}

int64_t KeptReport::offloaded_bytes() const {
  return sum_over(regions_, &RegionReport::offloaded_bytes);
}

std::string KeptReport::text() const {
  size_t what_width = 12, shape_width = 8;  // the columns fit the longest entry
  for (const RegionReport& region : regions_) {
    for (const KeptEntry& entry : region.entries) {
      what_width = std::max(what_width, entry.what.size() + 2);
      shape_width = std::max(shape_width, shape_text(entry.shape).size() + 2);
    }
  }
  const bool any_offloaded = std::any_of(regions_.begin(), regions_.end(), offloads);
  std::ostringstream out;
  // Offloading is said only where something was offloaded.
  out << "kept for the backward: " << human_bytes(kept_bytes()) << " in " << regions_.size()
      << (regions_.size() == 1 ? " region" : " regions");
  if (any_offloaded) out << "; offloaded: " << human_bytes(offloaded_bytes());
  out << "; recomputed: " << human_bytes(recomputed_bytes()) << "\n";
  for (const RegionReport& region : regions_) {
    out << region_title(region) << ": kept " << human_bytes(region.kept_bytes);
    if (offloads(region)) out << ", offloaded " << human_bytes(region.offloaded_bytes);
    out << ", recomputed " << human_bytes(region.recomputed_bytes) << "\n";
    if (!region.note.empty()) out << "  " << region.note << "\n";
    for (const KeptEntry& entry : region.entries) {
      std::string size = human_bytes(entry.bytes);
      if (!entry.shared_with.empty()) size += " (counted with " + entry.shared_with + ")";
      out << "  " << std::left << std::setw(11) << to_string(entry.decision)
          << std::setw(static_cast<int>(what_width)) << entry.what
          << std::setw(static_cast<int>(shape_width))
          << (entry.shape.empty() ? "" : shape_text(entry.shape)) << std::setw(8)
          << (entry.dtype == c10::ScalarType::Undefined ? "" : c10::toString(entry.dtype))
          << std::setw(11) << size << " " << entry.why << "\n";
    }
  }
  return out.str();
}

std::string KeptReport::json() const {
  nlohmann::json regions = nlohmann::json::array();
  for (const RegionReport& region : regions_) {
    nlohmann::json entries = nlohmann::json::array();
    for (const KeptEntry& entry : region.entries) entries.push_back(entry_json(entry));
    regions.push_back({{"name", region.name},
                       {"stage", region.stage},
                       {"mode", region.mode},
                       {"note", region.note},
                       {"kept_bytes", region.kept_bytes},
                       {"recomputed_bytes", region.recomputed_bytes},
                       {"offloaded_bytes", region.offloaded_bytes},
                       {"entries", std::move(entries)}});
  }
  const nlohmann::json document = {{"kept_bytes", kept_bytes()},
                                   {"recomputed_bytes", recomputed_bytes()},
                                   {"offloaded_bytes", offloaded_bytes()},
                                   {"regions", std::move(regions)}};
  return document.dump(2);
}

ReportScope::ReportScope(KeptReport& report) : report_(report), previous_(t_active) {
  TORCH_CHECK(!report.recording_.exchange(true),
              "ckpt::ReportScope: this KeptReport is already recorded into by another "
              "ReportScope (on this thread or another). Give each scope a report of its own.");
  t_active = &report;
}

ReportScope::~ReportScope() {
  report_.recording_ = false;
  t_active = previous_;
}

namespace detail {

KeptReport* active_report() {
  return t_active;
}

ReportPause::ReportPause() : previous_(t_active) {
  t_active = nullptr;
}

ReportPause::~ReportPause() {
  t_active = previous_;
}

size_t ReportAccess::add_region(KeptReport& report, RegionReport region) {
  report.regions_.push_back(std::move(region));
  return report.regions_.size() - 1;
}

void ReportAccess::add_tensor(KeptReport& report, size_t region, std::string what, std::string why,
                              KeptDecision decision, const at::Tensor& tensor) {
  KeptEntry entry;
  entry.what = std::move(what);
  entry.why = std::move(why);
  entry.decision = decision;
  entry.shape = tensor.sizes().vec();
  entry.dtype = tensor.scalar_type();
  entry.device = tensor.device();
  entry.bytes = static_cast<int64_t>(tensor.numel() * tensor.element_size());
  if (decision == KeptDecision::Recomputed) return add_recomputed(report, region, std::move(entry));
  RegionReport& target = report.regions_.at(region);
  const c10::StorageImpl* storage =
      tensor.has_storage() ? tensor.storage().unsafeGetStorageImpl() : nullptr;
  for (const KeptReport::Counted& counted : report.counted_) {
    if (storage == nullptr || counted.storage._unsafe_get_target() != storage) continue;
    const RegionReport& owner = report.regions_[counted.region];
    entry.shared_with = owner.name + ": " + owner.entries[counted.entry].what;
    target.entries.push_back(std::move(entry));
    return;
  }
  if (storage != nullptr) {
    entry.counted_bytes = static_cast<int64_t>(tensor.storage().nbytes());
    report.counted_.push_back(
        {tensor.storage().getWeakStorageImpl(), region, target.entries.size()});
  }
  target.kept_bytes += entry.counted_bytes;
  target.entries.push_back(std::move(entry));
}

void ReportAccess::add_recomputed(KeptReport& report, size_t region, KeptEntry entry) {
  RegionReport& target = report.regions_.at(region);
  entry.decision = KeptDecision::Recomputed;
  entry.counted_bytes = 0;
  target.recomputed_bytes += entry.bytes;
  target.entries.push_back(std::move(entry));
}

void ReportAccess::add_offloaded(KeptReport& report, size_t region, KeptEntry entry,
                                 int64_t host_bytes) {
  RegionReport& target = report.regions_.at(region);
  entry.decision = KeptDecision::Offloaded;
  entry.counted_bytes = host_bytes;
  target.offloaded_bytes += host_bytes;
  target.entries.push_back(std::move(entry));
}

void ReportAccess::add_measured(KeptReport& report, size_t region, std::string what,
                                std::string why, int64_t bytes, c10::Device device) {
  RegionReport& target = report.regions_.at(region);
  KeptEntry entry;
  entry.what = std::move(what);
  entry.why = std::move(why);
  entry.dtype = c10::ScalarType::Undefined;
  entry.device = device;
  entry.bytes = bytes;
  entry.counted_bytes = bytes;
  target.kept_bytes += bytes;
  target.entries.push_back(std::move(entry));
}

bool ReportAccess::counts(const KeptReport& report, const at::Tensor& tensor) {
  if (!tensor.defined() || !tensor.has_storage()) return false;
  const c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
  for (const KeptReport::Counted& counted : report.counted_) {
    if (counted.storage._unsafe_get_target() == storage) return true;
  }
  return false;
}

void ReportAccess::freed_with(KeptReport& report, size_t first, const std::string& outer) {
  for (size_t r = first; r < report.regions_.size(); ++r) {
    RegionReport& region = report.regions_[r];
    region.note = "Ran inside the forward of " + outer +
                  ", which lets go of it with its graph: its backward recomputes all of it.";
    region.kept_bytes = 0;
    region.offloaded_bytes = 0;
    for (KeptEntry& entry : region.entries) {
      if (entry.decision == KeptDecision::Recomputed) continue;
      entry.decision = KeptDecision::Recomputed;
      entry.counted_bytes = 0;
      entry.shared_with.clear();
      region.recomputed_bytes += entry.bytes;
    }
  }
  auto& counted = report.counted_;
  counted.erase(std::remove_if(counted.begin(), counted.end(),
                               [&](const KeptReport::Counted& c) { return c.region >= first; }),
                counted.end());
}

}  // namespace detail
}  // namespace ckpt
