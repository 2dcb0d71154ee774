#pragma once

// The thread-local flag behind `ckpt::is_recomputing()`.

namespace ckpt {
namespace detail {

/// Marks the calling thread as recomputing for its lifetime (nests).
class RecomputeMark {
 public:
  RecomputeMark();
  ~RecomputeMark();
  RecomputeMark(const RecomputeMark&) = delete;
  RecomputeMark& operator=(const RecomputeMark&) = delete;
};

/// Whether the calling thread is inside a `RecomputeMark` (what `ckpt::is_recomputing()` says).
bool recomputing();

}  // namespace detail
}  // namespace ckpt
