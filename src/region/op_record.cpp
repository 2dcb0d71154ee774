#include "op_record.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <iomanip>
#include <sstream>

namespace ckpt {
namespace detail {

void RecordingMode::dispatch(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  names_.push_back(operator_label(op.operator_name()));
  run(op, stack);
}

void check_same_operators(const std::vector<std::string>& forward,
                          const std::vector<std::string>& recompute) {
  if (forward == recompute) return;
  const auto [f, r] =
      std::mismatch(forward.begin(), forward.end(), recompute.begin(), recompute.end());
  const size_t first = static_cast<size_t>(f - forward.begin());
  constexpr size_t kBefore = 3, kAfter = 4;
  const size_t from = first > kBefore ? first - kBefore : 0;
  const size_t to = std::min(std::max(forward.size(), recompute.size()), first + kAfter + 1);
  size_t width = 10;
  for (size_t i = from; i < to && i < forward.size(); ++i)
    width = std::max(width, forward[i].size());
  std::ostringstream table;
  table << "    " << std::left << std::setw(static_cast<int>(width + 8)) << "  forward"
        << "recompute\n";
  for (size_t i = from; i < to; ++i) {
    const std::string a = i < forward.size() ? forward[i] : "(end)";
    const std::string b = i < recompute.size() ? recompute[i] : "(end)";
    table << (i == first ? "  > " : "    ") << "#" << std::left << std::setw(5) << i
          << std::setw(static_cast<int>(width + 2)) << a << b << "\n";
  }
  TORCH_CHECK(false,
              "ckpt::checkpoint (debug): the recompute of the region ran other operators "
              "than its forward, from operator #",
              first, " on (the forward ran ", forward.size(), ", the recompute ", recompute.size(),
              "):\n", table.str(),
              "The checkpointed function must run the same operators when it runs again (no "
              "branches on global state or on values that change between the passes).");
}

}  // namespace detail
}  // namespace ckpt
