#pragma once

// Keeps a recompute from updating module buffers (BatchNorm's running statistics) a second time.

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace ckpt {
namespace detail {

/// Snapshots the buffers of `modules` and their submodules, and writes the snapshot back when
/// destroyed (also when an exception leaves the scope).
class BufferGuard {
 public:
  /// When a buffer is copied: all of them now, or each just before the first write into its data
  /// that the caller reports (`copy_before_write`), so that buffers nothing writes (a causal mask,
  /// a positional table) cost no copy.
  enum class Copy { Now, BeforeFirstWrite };
  explicit BufferGuard(const std::vector<std::shared_ptr<torch::nn::Module>>& modules,
                       Copy copy = Copy::Now);
  ~BufferGuard();
  /// `Copy::BeforeFirstWrite`: an operator is about to write into `storage`; copies the buffers
  /// whose data it is, unless copied already.
  void copy_before_write(const c10::StorageImpl* storage);
  /// Leaves the buffers as they are now: nothing is written back.
  void dismiss() {
    buffers_.clear();
    saved_.clear();
  }
  BufferGuard(const BufferGuard&) = delete;
  BufferGuard& operator=(const BufferGuard&) = delete;

 private:
  std::vector<at::Tensor> buffers_;
  std::vector<at::Tensor> saved_;  // saved_[i] undefined: buffer i not copied (not written)
};

/// Bit i of a call site's 64-bit mask of arguments or buffers: #63 and beyond share the last.
inline uint64_t site_bit(size_t i) {
  return uint64_t{1} << (i < 63 ? i : 63);
}

/// The buffers of `modules` as a forward found them, for its recomputes to start from: a module
/// that writes into a buffer and then reads it (a running normaliser, spectral norm's power
/// iteration) must read in the recompute what it read in the forward, not what the forward left.
/// Copies the buffers `copy` marks (bit i: buffer i in the modules' traversal order, bit 63: those
/// from #63 on); `finish`, after the forward, keeps only the copies of buffers it wrote into (its
/// version moved, or its values, shape or dtype changed) and of those `keep` marks.
class BuffersAtForward {
 public:
  BuffersAtForward() = default;
  BuffersAtForward(const std::vector<std::shared_ptr<torch::nn::Module>>& modules, uint64_t copy,
                   uint64_t keep = 0);
  /// After the forward: the buffers it wrote into (bits as `copy`'s).
  uint64_t finish();
  /// Whether the forward wrote into a buffer that was not copied: its value before is lost.
  bool lost() const { return lost_; }
  /// An operator is about to write into `storage`: the buffers whose data it is count as
  /// written, whatever their version counters say (a write through `.data()` moves none).
  void note_write(const c10::StorageImpl* storage);
  /// Before `finish`: whether the forward so far wrote (its version moved, or `note_write`) into
  /// a buffer that was not copied.
  bool lost_so_far() const;
  /// Writes the copies into their buffers, through aliases that leave their version counters.
  void restore() const;

 private:
  std::vector<at::Tensor> buffers_, copies_;  // copies_[i] undefined: not copied, or let go of
  std::vector<uint32_t> versions_;
  std::vector<bool> seen_written_;  // by `note_write`
  uint64_t keep_ = 0;
  bool lost_ = false;
};

/// For each of `stages` (modules run one after another), the buffers it shares with another
/// stage, as a mask of `BuffersAtForward`'s bits: a later stage may write what an earlier one
/// read, so a stage that runs again keeps their copies.
std::vector<uint64_t> buffers_shared_between(
    const std::vector<std::shared_ptr<torch::nn::Module>>& stages);

}  // namespace detail
}  // namespace ckpt
