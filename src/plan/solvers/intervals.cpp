#include "intervals.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

namespace ckpt {
namespace plan {
namespace detail {

Intervals::Intervals(int length, int window, std::vector<char> anchor)
    : length_(length), window_(window), anchor_(std::move(anchor)) {
  const auto n = static_cast<size_t>(length);
  next_anchor_.assign(n + 3, length + 1);
  next_end_.assign(n + 3, length + 1);
  for (size_t p = n + 1; p-- > 0;) {  // p in [0, L]; p = L + 1 is neither
    next_anchor_[p] = anchor_[p] != 0 ? static_cast<int>(p) : next_anchor_[p + 1];
    const bool end = p == n || anchor_[p + 1] != 0;
    next_end_[p] = end ? static_cast<int>(p) : next_end_[p + 1];
  }
  ends_before_.assign(n + 2, 0);
  for (size_t p = 0; p <= n; ++p) {
    ends_before_[p + 1] = ends_before_[p] + (next_end_[p] == static_cast<int>(p) ? 1 : 0);
  }
  row_.assign(n + 2, 0);
  for (size_t i = 0; i <= n; ++i) {  // the short entries of i, then its long ones (at ends)
    const size_t short_entries = std::min(n + 1 - i, static_cast<size_t>(window_));
    const size_t long_entries =
        i + short_entries <= n ? ends_before_[n + 1] - ends_before_[i + short_entries] : 0;
    row_[i + 1] = row_[i] + short_entries + long_entries;
  }
  // anchors[p]: anchors in [1, p]; their prefix sums count the pairs of the long entries.
  std::vector<int64_t> anchors(n + 1, 0), anchor_sums(n + 1, 0);
  for (size_t p = 1; p <= n; ++p) anchors[p] = anchors[p - 1] + (anchor_[p] != 0 ? 1 : 0);
  for (size_t p = 1; p <= n; ++p) anchor_sums[p] = anchor_sums[p - 1] + anchors[p];
  count_.assign(n + 1, 0);
  base_.assign(n + 2, 0);
  for (int l = 0; l <= length; ++l) {
    const auto sl = static_cast<size_t>(l);
    const bool end = next_end_[sl] == l;
    const int short_entries = std::min(l + 1, window_);
    count_[sl] = end ? l + 1 : short_entries;
    base_[sl + 1] = base_[sl] + static_cast<size_t>(count_[sl]);
    const int64_t longest_short = short_entries - 1;  // interval l - i of the short entries
    pairs_ += longest_short * (longest_short + 1) / 2;
    if (end && l >= window_) {  // (i, l) for i in [0, l - window]: the anchors in (i, l]
      const auto last = static_cast<size_t>(l - window_);
      pairs_ += static_cast<int64_t>(last + 1) * anchors[sl] - anchor_sums[last];
    }
  }
}

Intervals Intervals::dense(int length) {
  return Intervals(length, length + 1, std::vector<char>(static_cast<size_t>(length) + 2, 0));
}

Intervals Intervals::sparse(const std::vector<int64_t>& x, int segment) {
  const int length = static_cast<int>(x.size()) - 2;  // x holds |x_0| ... |x_L| and x_{L+1} = 0
  segment = std::max(segment, 1);
  std::vector<char> anchor(static_cast<size_t>(length) + 2, 0);
  for (int first = 1; first <= length; first += segment) {
    int best = first;
    for (int p = first; p < first + segment && p <= length; ++p) {
      if (x[static_cast<size_t>(p)] <= x[static_cast<size_t>(best)]) best = p;
    }
    anchor[static_cast<size_t>(best)] = 1;
  }
  return Intervals(length, 2 * segment, std::move(anchor));
}

int64_t Intervals::dense_pairs(int length) {
  const double n = length;
  const double pairs = n * (n + 1) * (n + 2) / 6;  // sum of l(l+1)/2 for l in [0, L]
  return pairs < 9e18 ? static_cast<int64_t>(pairs) : std::numeric_limits<int64_t>::max();
}

int Intervals::sparse_segment(int length) {
  // The pairs first fall with the segment (fewer anchors), then grow (wider windows); the fewest
  // lie near sqrt(L) / 2. Segments 10% apart around there; equal activations stand for any chain.
  const std::vector<int64_t> equal(static_cast<size_t>(length) + 2, 1);
  const double middle = std::sqrt(static_cast<double>(length)) / 2;
  int cheapest = 1;
  int64_t fewest = std::numeric_limits<int64_t>::max();
  for (double grown = std::max(1.0, middle / 4); grown <= std::min<double>(length, 4 * middle + 1);
       grown = std::max(grown * 1.1, grown + 1)) {
    const int segment = static_cast<int>(grown);
    const int64_t pairs = sparse(equal, segment).pairs();
    if (pairs < fewest) {
      fewest = pairs;
      cheapest = segment;
    }
  }
  return cheapest;
}

Intervals Intervals::within(const std::vector<int64_t>& x, int64_t max_pairs, double max_entries) {
  const int length = static_cast<int>(x.size()) - 2;
  const double n = length + 1.0;
  if (dense_pairs(length) <= max_pairs && n * (n + 1) / 2 <= max_entries) return dense(length);
  return sparse(x, sparse_segment(length));
}

}  // namespace detail
}  // namespace plan
}  // namespace ckpt
