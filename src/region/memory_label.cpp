#include <ckpt/memory_label.h>

#include <atomic>
#include <deque>
#include <mutex>
#include <unordered_map>
#include <utility>

namespace ckpt {
namespace detail {

// One open label: its name under its parent. Its text and number are found when a recording
// allocator first asks, so that opening a label costs no lock.
struct LabelNode {
  LabelNode(std::shared_ptr<LabelNode> parent_node, std::string label_name)
      : parent(std::move(parent_node)), name(std::move(label_name)) {}

  const std::shared_ptr<LabelNode> parent;
  const std::string name;
  std::atomic<int> regions{0};  // regions opened directly under it
  std::atomic<int> id{-1};      // its number, once interned
};

namespace {

thread_local std::shared_ptr<LabelNode> t_current;
thread_local int t_root_regions = 0;  // regions opened outside any label

// Label texts and their numbers, for the life of the process (a deque keeps references stable).
class LabelRegistry {
 public:
  int intern(const std::string& text) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto found = ids_.find(text);
    if (found != ids_.end()) return found->second;
    texts_.push_back(text);
    const int id = static_cast<int>(texts_.size()) - 1;
    ids_.emplace(text, id);
    return id;
  }
  std::string text(int id) {
    std::lock_guard<std::mutex> lock(mutex_);
    return id >= 0 && id < static_cast<int>(texts_.size()) ? texts_[static_cast<size_t>(id)] : "";
  }

  static LabelRegistry& instance() {
    static auto* registry = new LabelRegistry;  // never destroyed: blocks may outlive statics
    return *registry;
  }

 private:
  std::mutex mutex_;
  std::deque<std::string> texts_;
  std::unordered_map<std::string, int> ids_;
};

std::string text_of(const LabelNode* node) {
  if (node == nullptr) return "";
  if (node->parent == nullptr) return node->name;
  return text_of(node->parent.get()) + "/" + node->name;
}

int id_of(LabelNode& node) {
  int id = node.id.load(std::memory_order_acquire);
  if (id < 0) {
    id = LabelRegistry::instance().intern(text_of(&node));
    node.id.store(id, std::memory_order_release);
  }
  return id;
}

}  // namespace

std::shared_ptr<LabelNode> current_label() {
  return t_current;
}

std::shared_ptr<LabelNode> child_label(std::shared_ptr<LabelNode> parent, std::string name) {
  return std::make_shared<LabelNode>(std::move(parent), std::move(name));
}

std::shared_ptr<LabelNode> next_region_label() {
  const int number = t_current != nullptr ? t_current->regions.fetch_add(1) + 1 : ++t_root_regions;
  return child_label(t_current, "region " + std::to_string(number));
}

LabelScope::LabelScope(std::shared_ptr<LabelNode> node) : previous_(std::move(t_current)) {
  t_current = std::move(node);
}

LabelScope::~LabelScope() {
  t_current = std::move(previous_);
}

int current_label_id() {
  return t_current != nullptr ? id_of(*t_current) : -1;
}

std::string label_text(int id) {
  return LabelRegistry::instance().text(id);
}

}  // namespace detail

MemoryLabel::MemoryLabel(std::string name) : previous_(detail::t_current) {
  detail::t_current = detail::child_label(previous_, std::move(name));
}

MemoryLabel::~MemoryLabel() {
  detail::t_current = std::move(previous_);
}

std::string MemoryLabel::current() {
  return detail::text_of(detail::t_current.get());
}

}  // namespace ckpt
