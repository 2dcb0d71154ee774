#pragma once

// Which entries (i, l) of rotor's recursion a program fills, and which checkpoints x_j its case (a)
// may take in each: all of them (dense, the exact programs, O(L^3) pairs), or, for long chains,
// a sparse set (docs/memory-model.md, "Long chains").
//
// Sparse: positions 1..L are cut into segments of `segment` consecutive positions, each with one
// anchor, its smallest activation (the last of equals). An interval of at least
// window = 2 * segment stages always holds a whole segment, so an anchor; such a long interval
// may checkpoint only anchors, a shorter one any x_j. The entries are then the short intervals and
// the long ones that end right before an anchor or at the loss: O(L * (L / segment + segment))
// entries and O(L * (L / segment + segment)^2) pairs of an entry and a checkpoint, O(L^2) for a
// segment of about sqrt(L) / 2.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ckpt {
namespace plan {
namespace detail {

class Intervals {
 public:
  /// Every entry and every checkpoint, for a chain of `length` stages.
  static Intervals dense(int length);
  /// Anchors chosen by `x` (|x_0| ... |x_L|), one per `segment` positions (segment >= 1).
  static Intervals sparse(const std::vector<int64_t>& x, int segment);
  /// Dense when that takes at most `max_pairs` pairs and `max_entries` entries; else sparse with
  /// sparse_segment(L). (Wider windows than the cheapest were measured to lower neither the
  /// minimum nor the truncated program's times.)
  static Intervals within(const std::vector<int64_t>& x, int64_t max_pairs, double max_entries);
  /// The pairs of the dense structure: sum over l of l(l+1)/2, about L^3 / 6.
  static int64_t dense_pairs(int length);
  /// The segment with the fewest pairs on a chain of equal activations: about sqrt(L) / 2, for
  /// about 1.2 L^2 pairs and 2.9 L^1.5 entries.
  static int sparse_segment(int length);

  int length() const { return length_; }
  bool is_dense() const { return window_ > length_; }
  int segment() const { return window_ / 2; }
  /// Whether entry (i, l), 0 <= i <= l <= L, is filled.
  bool has(int i, int l) const { return l - i < count_[static_cast<size_t>(l)]; }
  /// Where entry (i, l) is stored, in [0, entries()): the entries of one l side by side.
  size_t index(int i, int l) const {
    return base_[static_cast<size_t>(l)] + static_cast<size_t>(l - i);
  }
  size_t entries() const { return base_.back(); }
  /// The same entries laid out by start: those of one i side by side, by increasing l (a program
  /// that walks case (a)'s (i, j - 1) by j reads them in order).
  size_t index_by_start(int i, int l) const {
    const auto si = static_cast<size_t>(i);
    if (l - i < window_) return row_[si] + static_cast<size_t>(l - i);
    return row_[si] + static_cast<size_t>(window_) + ends_before_[static_cast<size_t>(l)] -
           ends_before_[si + static_cast<size_t>(window_)];
  }
  /// Pairs of an entry and a checkpoint it may take: the work of a program on this structure.
  int64_t pairs() const { return pairs_; }

  /// The entry after (i, l) among those starting at i, by increasing l (L + 1 after the last).
  int next_end(int i, int l) const {
    return l + 1 - i < window_ ? l + 1 : next_end_[static_cast<size_t>(l + 1)];
  }
  /// The first checkpoint j >= from that entry (i, l) may take (l + 1 or more when none).
  int next_split(int i, int l, int from) const {
    return l - i < window_ ? from : next_anchor_[static_cast<size_t>(from)];
  }
  /// Whether entry (i, l) may checkpoint x_j (i < j <= l).
  bool splits_at(int i, int l, int j) const {
    return l - i < window_ || anchor_[static_cast<size_t>(j)] != 0;
  }

 private:
  Intervals(int length, int window, std::vector<char> anchor);

  int length_ = 0;
  int window_ = 0;
  std::vector<char> anchor_;      // position p in [0, L + 1] is an anchor
  std::vector<int> next_anchor_;  // the smallest anchor >= p, or L + 1; p in [0, L + 2]
  std::vector<int> next_end_;     // the smallest end (anchor - 1, or L) >= p; p in [0, L + 2]
  std::vector<int> count_;        // entries (i, l) for each l: l + 1 at an end, else at most window
  std::vector<size_t> base_;      // index of entry (l, l); base_[L + 1] = entries()
  std::vector<size_t> row_;       // index_by_start of entry (i, i)
  std::vector<size_t> ends_before_;  // ends in [0, p); p in [0, L + 1]
  int64_t pairs_ = 0;
};

}  // namespace detail
}  // namespace plan
}  // namespace ckpt
