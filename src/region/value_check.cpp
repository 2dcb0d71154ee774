#include "value_check.h"

#include "autograd/outside_state.h"
#include "selective.h"

#include <c10/core/DispatchKey.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <iomanip>
#include <optional>
#include <sstream>
#include <string>
#include <unordered_map>

namespace ckpt {
namespace detail {
namespace {

// Operators whose outputs hold no values of their own: uninitialised memory (`empty` and its kin),
// or a view (returns_a_view) of a tensor whose values the operator that wrote them is checked for.
bool is_uninitialised(const c10::OperatorHandle& op) {
  const std::string& name = op.operator_name().name;
  return name == "aten::empty" || name == "aten::empty_like" || name == "aten::empty_strided" ||
         name == "aten::new_empty" || name == "aten::new_empty_strided" ||
         name == "aten::empty_permuted" || name == "aten::resize_" || name == "aten::set_";
}

// FNV-1a over the tensor's bytes in logical order, eight at a time: equal values to the bit give
// equal checksums, and one flipped bit changes it.
uint64_t checksum(const at::Tensor& tensor) {
  // ckpt's own calls here are no operator of the region: no mode sees them.
  const c10::impl::ExcludeDispatchKeyGuard no_modes(c10::DispatchKey::Fake);
  const at::Tensor host = tensor.cpu().contiguous();
  const auto* bytes = static_cast<const unsigned char*>(host.data_ptr());
  const size_t count = host.numel() * host.element_size();
  constexpr uint64_t kPrime = 1099511628211ULL;
  uint64_t hash = 14695981039346656037ULL;
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    uint64_t word = 0;
    std::memcpy(&word, bytes + i, 8);
    hash = (hash ^ word) * kPrime;
  }
  for (; i < count; ++i) hash = (hash ^ bytes[i]) * kPrime;
  return hash;
}

bool checkable(const at::Tensor& tensor) {
  return tensor.layout() == c10::kStrided && tensor.has_storage() &&
         tensor.device().type() != c10::DeviceType::Meta && !tensor.is_quantized();
}

// The call's outputs: the returns left on the stack after it ran; none for a view. An output the
// call wrote into is checked only where an earlier call of the region made its storage: a write
// into state from outside (a BatchNorm's `num_batches_tracked += 1`) starts the recompute from the
// value the forward left, which the region puts back afterwards, so it differs by design. An
// uninitialised output is made, not checked.
std::optional<OutputSums> sums_of(const c10::OperatorHandle& op, const torch::jit::Stack& stack,
                                  MadeStorages& made, const ValueSample& sample,
                                  const ReplayMode* replay = nullptr) {
  if (returns_a_view(op)) return std::nullopt;
  const bool uninitialised = is_uninitialised(op);
  OutputSums sums;
  sums.op = &op.operator_name();
  const bool summed = sample.sums(op.operator_name());  // else its place, shapes and dtypes only
  const auto& returns = op.schema().returns();
  const size_t first = stack.size() - returns.size();
  for (size_t i = first; i < stack.size(); ++i) {
    const bool written = returns[i - first].alias_info() != nullptr;
    for_each_tensor(stack[i], [&](const at::Tensor& t) {
      if (!checkable(t)) return;
      if (!written) made.add(t);
      if (uninitialised || (written && !made.contains(t))) return;
      const bool forwards_data = replay != nullptr && replay->handed_out(storage_of(t));
      sums.outputs.push_back({summed && !forwards_data ? checksum(t) : 0, t.sizes().vec(),
                              t.scalar_type(), forwards_data});
    });
  }
  if (uninitialised) return std::nullopt;
  return sums;
}

// The tensors a call reads without writing, in argument order (before it runs, its arguments
// are on top of the stack). None for a normalization that updates running statistics: some of
// their schemas leave those unmarked, and a region puts them back where it can see them.
std::vector<at::Tensor> reads_of(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  std::vector<at::Tensor> reads;
  if (updates_running_statistics(op)) return reads;
  const auto& arguments = op.schema().arguments();
  const size_t first = stack.size() - arguments.size();
  for (size_t i = 0; i < arguments.size(); ++i) {
    const c10::AliasInfo* alias = arguments[i].alias_info();
    if (alias != nullptr && alias->isWrite()) continue;
    for_each_tensor(stack[first + i], [&](const at::Tensor& t) {
      if (checkable(t)) reads.push_back(t);
    });
  }
  return reads;
}

std::string hex(uint64_t value) {
  std::ostringstream out;
  out << "0x" << std::hex << std::setw(16) << std::setfill('0') << value;
  return out.str();
}

std::string describe(const OutputSums::Output& output) {
  return c10::str(c10::toString(output.dtype), " ", c10::IntArrayRef(output.sizes));
}

// What makes a recompute differ from its forward, for the error.
constexpr const char* kCauses =
    " A recompute differs from its forward where a kernel is not deterministic (on CUDA, "
    "atomics in index_add_, scatter_add_, embedding's backward: "
    "at::globalContext().setDeterministicAlgorithms(true, false) makes them so), where state "
    "outside the region changed between the forward and the backward (a tensor or a global a "
    "lambda reads, written in place after the forward), or where the function draws from a "
    "random generator the region does not replay (a torch::Generator of your own: ckpt replays "
    "the default generators of the CPU and of the arguments' device). Its gradients would not "
    "be those of the forward.";

// A kept output handed out in the recompute: what its call read from outside the region must hold
// the forward's values, since the call's backward reads them.
void check_outside_reads(const OutputSums& expected, const std::vector<at::Tensor>& reads,
                         const std::string& name, size_t position) {
  TORCH_CHECK(reads.size() == expected.outside_reads.size(),
              "ckpt::checkpoint (check_values): ", name, " (checked operator #", position,
              " of the region) read ", reads.size(), " tensors in the recompute and ",
              expected.outside_reads.size(), " in the forward.", kCauses);
  for (size_t j = 0; j < reads.size(); ++j) {
    if (!expected.outside_reads[j]) continue;
    const uint64_t now = checksum(reads[j]);
    TORCH_CHECK(now == *expected.outside_reads[j],
                "ckpt::checkpoint (check_values): the recompute of the region handed out the "
                "kept output of ",
                name, " (checked operator #", position, " of the region), but tensor #", j,
                " of its arguments, from outside the region, holds other values than in the "
                "forward (checksum ",
                hex(now), " in the recompute, ", hex(*expected.outside_reads[j]),
                " in the forward): its backward would read the new values.", kCauses);
  }
}

}  // namespace

ValueSample::ValueSample(std::vector<std::string> ops) : ops_(std::move(ops)) {}

bool ValueSample::sums(const c10::OperatorName& op) const {
  if (ops_.empty()) return true;
  for (const std::string& name : ops_) {
    if (name == op.name || name == operator_label(op)) return true;
  }
  return false;
}

void ValueRecordingMode::dispatch(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  // What the call reads from outside the region (undefined: data the region made), summed only
  // where the caching mode below keeps the call's outputs.
  std::vector<at::Tensor> outside;
  const size_t kept_before = kept_ != nullptr ? kept_->entries.size() : 0;
  if (kept_ != nullptr && sample_.sums(op.operator_name()) && !returns_a_view(op)) {
    for (const at::Tensor& t : reads_of(op, *stack))
      outside.push_back(made_.contains(t) ? at::Tensor() : t);
  }
  run(op, stack);
  std::optional<OutputSums> sums = sums_of(op, *stack, made_, sample_);
  if (!sums) return;
  if (kept_ != nullptr && kept_->entries.size() > kept_before) {
    for (const at::Tensor& t : outside)
      sums->outside_reads.push_back(t.defined() ? std::optional(checksum(t)) : std::nullopt);
  }
  record_.push_back(std::move(*sums));
}

void ValueCheckingMode::dispatch(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  // Held through the call, to compare where it hands out the forward's data.
  std::vector<at::Tensor> reads;
  if (!diverged_ && next_ < record_.size() && record_[next_].op == &op.operator_name() &&
      !record_[next_].outside_reads.empty()) {
    reads = reads_of(op, *stack);
  }
  run(op, stack);
  if (diverged_) return;
  const std::optional<OutputSums> now = sums_of(op, *stack, made_, sample_, replay_);
  if (!now) return;
  const size_t position = next_++;
  if (order_may_differ_ &&
      (position >= record_.size() || record_[position].op != &op.operator_name() ||
       record_[position].outputs.size() != now->outputs.size())) {
    diverged_ = true;
    parted_ = c10::str(
        "the recompute ran ", operator_label(op.operator_name()), " as its checked operator #",
        position, " where the forward ran ",
        position < record_.size() ? operator_label(*record_[position].op) : std::string("no more"));
    return;
  }
  const std::string name = operator_label(op.operator_name());
  TORCH_CHECK(position < record_.size(),
              "ckpt::checkpoint (check_values): the recompute of the region ran ", name,
              " as its checked operator #", position, ", after the ", record_.size(),
              " the forward ran.", kCauses);
  const OutputSums& expected = record_[position];
  TORCH_CHECK(expected.op == &op.operator_name(),
              "ckpt::checkpoint (check_values): the recompute of the region ran ", name,
              " as its checked operator #", position, " where the forward ran ",
              operator_label(*expected.op), ".", kCauses);
  TORCH_CHECK(now->outputs.size() == expected.outputs.size(),
              "ckpt::checkpoint (check_values): ", name, " (checked operator #", position,
              " of the region) returned ", now->outputs.size(), " tensors in the recompute and ",
              expected.outputs.size(), " in the forward.", kCauses);
  for (size_t i = 0; i < now->outputs.size(); ++i) {
    const OutputSums::Output& a = expected.outputs[i];
    const OutputSums::Output& b = now->outputs[i];
    const bool same_values = b.forwards_data || a.checksum == b.checksum;
    if (same_values && a.sizes == b.sizes && a.dtype == b.dtype) continue;
    TORCH_CHECK(false,
                "ckpt::checkpoint (check_values): the recompute of the region computed "
                "other values than its forward, first at ",
                name, " (checked operator #", position, " of the region), output #", i, ": ",
                describe(b), " with checksum ", hex(b.checksum), " in the recompute, ", describe(a),
                " with checksum ", hex(a.checksum), " in the forward.", kCauses);
  }
  const bool handed_out = std::any_of(now->outputs.begin(), now->outputs.end(),
                                      [](const OutputSums::Output& o) { return o.forwards_data; });
  if (handed_out && !expected.outside_reads.empty())
    check_outside_reads(expected, reads, name, position);
}

std::vector<uint64_t> output_checksums(const std::vector<at::Tensor>& outputs) {
  std::vector<uint64_t> sums;
  sums.reserve(outputs.size());
  for (const at::Tensor& t : outputs) sums.push_back(t.defined() && checkable(t) ? checksum(t) : 0);
  return sums;
}

}  // namespace detail
}  // namespace ckpt
