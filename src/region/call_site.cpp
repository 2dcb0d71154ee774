// Call sites per place in the code and module: what one region learns (a fallback, a warning)
// stays with the module it ran, not with every region the same template makes.

#include <ckpt/detail/region.h>

#include <torch/nn/module.h>

#include <atomic>
#include <functional>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <utility>

namespace ckpt {
namespace detail {
namespace {

std::atomic<uint64_t> lessons{0};                      // learned by every call site so far
thread_local std::optional<uint64_t> replayed_moment;  // inside a recompute: its forward's

struct Key {
  const CallSite* code;
  const torch::nn::Module* module;
  bool operator==(const Key& other) const { return code == other.code && module == other.module; }
};

struct KeyHash {
  size_t operator()(const Key& key) const {
    return std::hash<const void*>()(key.code) ^ (std::hash<const void*>()(key.module) << 1);
  }
};

struct Entry {
  std::weak_ptr<torch::nn::Module> module;  // a dead module's address may be reused
  std::shared_ptr<CallSite> site;
};

class Registry {
 public:
  std::shared_ptr<CallSite> find_or_add(const CallSite& code,
                                        const std::shared_ptr<torch::nn::Module>& module) {
    const std::lock_guard<std::mutex> lock(mutex_);
    Entry& entry = entries_[Key{&code, module.get()}];
    if (entry.site == nullptr || entry.module.expired()) {
      entry = Entry{module, std::make_shared<CallSite>()};
      if (entries_.size() >= 2 * live_after_pruning_) prune();
    }
    return entry.site;
  }

 private:
  // Forgets the sites of modules that died; amortised over the insertions that doubled the map.
  void prune() {
    for (auto it = entries_.begin(); it != entries_.end();) {
      it = it->second.module.expired() ? entries_.erase(it) : std::next(it);
    }
    live_after_pruning_ = std::max<size_t>(entries_.size(), 64);
  }

  std::mutex mutex_;
  std::unordered_map<Key, Entry, KeyHash> entries_;
  size_t live_after_pruning_ = 64;
};

}  // namespace

uint64_t learning_moment() {
  return replayed_moment ? *replayed_moment : lessons.load();
}

LearnedAsAt::LearnedAsAt(uint64_t moment) : before_(replayed_moment) {
  replayed_moment = moment;
}

LearnedAsAt::~LearnedAsAt() {
  replayed_moment = before_;
}

bool CallSite::keeps_forward_graph_at(uint64_t moment) const {
  if (!learned_any_.load()) return false;  // most sites never learn: no lock per region
  const std::lock_guard<std::mutex> lock(learned_mutex_);
  return keeps_forward_graph_since_ <= moment;
}

bool CallSite::learn_keeps_forward_graph() {
  const std::lock_guard<std::mutex> lock(learned_mutex_);
  if (keeps_forward_graph_since_ != UINT64_MAX) return false;
  keeps_forward_graph_since_ = ++lessons;
  learned_any_.store(true);
  return true;
}

uint64_t CallSite::written_inputs_at(uint64_t moment) const {
  if (!learned_any_.load()) return 0;
  const std::lock_guard<std::mutex> lock(learned_mutex_);
  uint64_t written = 0;
  for (const auto& [at, bits] : written_inputs_) {
    if (at <= moment) written = bits;
  }
  return written;
}

bool CallSite::learn_written_inputs(uint64_t written) {
  const std::lock_guard<std::mutex> lock(learned_mutex_);
  const uint64_t known = written_inputs_.empty() ? 0 : written_inputs_.back().second;
  if ((known | written) == known) return false;
  written_inputs_.emplace_back(++lessons, known | written);
  learned_any_.store(true);
  return true;
}

std::shared_ptr<CallSite> call_site(CallSite& fallback, const ModuleList& modules) {
  if (modules.empty()) return std::shared_ptr<CallSite>(std::shared_ptr<CallSite>(), &fallback);
  static Registry* registry = new Registry();  // never destroyed: regions may outlive statics
  return registry->find_or_add(fallback, modules.front());
}

}  // namespace detail
}  // namespace ckpt
