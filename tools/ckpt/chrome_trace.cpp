#include "chrome_trace.h"

#include "output_path.h"

#include <nlohmann/json.hpp>

#include <stdexcept>
#include <utility>

namespace ckpt {
namespace cli {

void ChromeTrace::set_process_name(int pid, const std::string& name) {
  events_.push_back({'M', pid, 0, "process_name", name, 0, 0, 0, {}});
}

void ChromeTrace::set_thread_name(int pid, int tid, const std::string& name) {
  events_.push_back({'m', pid, tid, "thread_name", name, 0, 0, 0, {}});
}

void ChromeTrace::add_span(int pid, int tid, const std::string& name, const std::string& category,
                           double begin_us, double end_us) {
  events_.push_back({'X', pid, tid, name, category, begin_us, end_us - begin_us, 0, {}});
}

void ChromeTrace::add_instant(int pid, const std::string& name, double time_us,
                              nlohmann::json args) {
  events_.push_back({'i', pid, 0, name, "", time_us, 0, 0, std::move(args)});
}

void ChromeTrace::add_counter(int pid, const std::string& name, double time_us, int64_t value) {
  events_.push_back({'C', pid, 0, name, "", time_us, 0, value, {}});
}

std::string ChromeTrace::to_json() const {
  nlohmann::json events = nlohmann::json::array();
  for (const Event& event : events_) {
    nlohmann::json object;
    switch (event.phase) {
      case 'M':
      case 'm':
        object = {{"ph", "M"},
                  {"pid", event.pid},
                  {"tid", event.tid},
                  {"name", event.name},
                  {"args", {{"name", event.category}}}};
        break;
      case 'X':
        object = {{"ph", "X"},
                  {"pid", event.pid},
                  {"tid", event.tid},
                  {"name", event.name},
                  {"cat", event.category},
                  {"ts", event.time_us},
                  {"dur", event.duration_us}};
        break;
      case 'i':
        object = {{"ph", "i"},         {"s", "p"},           {"pid", event.pid},
                  {"tid", event.tid},  {"name", event.name}, {"ts", event.time_us},
                  {"args", event.args}};
        break;
      default:
        object = {{"ph", "C"},
                  {"pid", event.pid},
                  {"name", event.name},
                  {"ts", event.time_us},
                  {"args", {{"bytes", event.value}}}};
    }
    events.push_back(std::move(object));
  }
  return nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump() + "\n";
}

void ChromeTrace::write(const std::string& path) const {
  write_whole_file(path, to_json(), "--trace");
}

}  // namespace cli
}  // namespace ckpt
