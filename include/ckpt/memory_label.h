#pragma once

#include <memory>
#include <string>

namespace ckpt {

namespace detail {
struct LabelNode;
}  // namespace detail

/// Names the CPU memory the calling thread allocates while it lives, for
/// `MemoryTracker::peak_breakdown`.
///
/// Labels nest: inside `MemoryLabel("forward")`, `MemoryLabel("block 3")` labels allocations
/// "forward/block 3". Each checkpointed region opens one of its own, "region N" (its number
/// among the regions opened directly under the same label, from 1), and its recompute runs
/// under "<the region's label>/recompute", so a breakdown tells the activations of each region
/// and of its recompute apart. Outside any label, regions are numbered per thread for the
/// life of the thread: label each step's forward pass to have them numbered from 1 each step.
/// A label costs a small heap node and nothing per allocation unless a tracker records a
/// breakdown (`MemoryTracker::record_breakdown`).
///
/// Example:
/// ```
/// {
///   ckpt::MemoryLabel label("forward");
///   loss = model->forward(x).sum();  // its activations are labelled "forward/..."
/// }
/// ```
class MemoryLabel {
 public:
  /// Opens the label `name` inside the thread's current label until destruction.
  explicit MemoryLabel(std::string name);
  ~MemoryLabel();
  MemoryLabel(const MemoryLabel&) = delete;
  MemoryLabel& operator=(const MemoryLabel&) = delete;

  /// The calling thread's current label: the open labels' names, outermost first, joined by
  /// '/'; empty outside any.
  static std::string current();

 private:
  std::shared_ptr<detail::LabelNode> previous_;
};

#ifndef DOXYGEN_SHOULD_SKIP_THIS
namespace detail {

/// The calling thread's current label node (null outside any label).
std::shared_ptr<LabelNode> current_label();

/// A new label under the current one, named "region N" for the next region number there.
std::shared_ptr<LabelNode> next_region_label();

/// The label "<parent>/<name>".
std::shared_ptr<LabelNode> child_label(std::shared_ptr<LabelNode> parent, std::string name);

/// Makes `node` the calling thread's label until the scope ends, whatever was current (a
/// recompute runs under its region's label, not under the backward's).
class LabelScope {
 public:
  explicit LabelScope(std::shared_ptr<LabelNode> node);
  ~LabelScope();
  LabelScope(const LabelScope&) = delete;
  LabelScope& operator=(const LabelScope&) = delete;

 private:
  std::shared_ptr<LabelNode> previous_;
};

/// A number for the calling thread's current label, the same for the same text (-1 outside
/// any label): what the counting allocator writes into each block it records.
int current_label_id();

/// The text of a label number from `current_label_id`.
std::string label_text(int id);

}  // namespace detail
#endif  // DOXYGEN_SHOULD_SKIP_THIS

}  // namespace ckpt
