#include "selective.h"

#include <ATen/core/enum_tag.h>
#include <c10/util/Exception.h>

#include <string>
#include <unordered_set>

namespace ckpt {
namespace detail {
namespace {

// Why the outputs of `op` cannot be kept, or nullptr when they can.
const char* cannot_keep(const c10::OperatorHandle& op) {
  const c10::FunctionSchema& schema = op.schema();
  if (schema.is_mutable()) return "which writes into its arguments (in place or out=)";
  for (const auto& result : schema.returns()) {
    if (result.alias_info() != nullptr) return "which returns a view of its input";
  }
  if (op.hasTag(at::Tag::nondeterministic_seeded)) return "which draws random numbers";
  return nullptr;
}

enum class Keep { No, Prefer, Must };

// Whether the region keeps the outputs of this call: the policy's decision, where they can be
// kept. MustSave on outputs that cannot be kept is an error.
Keep keeps_outputs(const SelectivePolicy& policy, const c10::OperatorHandle& op,
                   const torch::jit::Stack& stack) {
  const c10::FunctionSchema& schema = op.schema();
  const size_t count = schema.arguments().size();
  const OpCall call{schema, c10::ArrayRef<c10::IValue>(stack.data() + stack.size() - count, count)};
  const CheckpointPolicy decision = policy(call);
  if (decision == CheckpointPolicy::MustRecompute || decision == CheckpointPolicy::PreferRecompute)
    return Keep::No;
  const char* reason = cannot_keep(op);
  if (reason == nullptr) return decision == CheckpointPolicy::MustSave ? Keep::Must : Keep::Prefer;
  TORCH_CHECK(decision != CheckpointPolicy::MustSave,
              "ckpt::checkpoint: the selective policy says MustSave for ",
              operator_label(schema.operator_name()), ", ", reason,
              ", so its outputs cannot be kept. Return PreferSave to recompute it, or "
              "MustRecompute.");
  return Keep::No;
}

bool unchanged(const KeptOutputs::Entry& entry) {
  for (size_t i = 0; i < entry.counters.size(); ++i) {
    if (entry.counters[i].current_version() != entry.versions[i]) return false;
  }
  return true;
}

// A tensor sharing `tensor`'s data with no autograd history of its own (autograd, above the
// mode, gives the one handed out a history; the kept one must not hold the forward's graph).
at::Tensor alias(const at::Tensor& tensor) {
  return tensor.defined() ? tensor.variable_data() : tensor;
}

// `value` with every tensor in it (a tensor or a list of tensors) replaced by `map(tensor)`.
template <class Map>
c10::IValue map_tensors(const c10::IValue& value, Map map) {
  if (value.isTensor()) return map(value.toTensor());
  if (value.isTensorList()) {
    c10::List<at::Tensor> list;
    for (const at::Tensor& t : value.toTensorList().vec()) list.push_back(map(t));
    return list;
  }
  return value;
}

}  // namespace

void CachingMode::dispatch(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const Keep keep = keeps_outputs(policy_, op, *stack);
  run(op, stack);
  if (keep == Keep::No) return;
  KeptOutputs::Entry entry{op.operator_name(), keep == Keep::Must, {}, {}, {}};
  const size_t count = op.schema().returns().size();
  for (size_t i = stack->size() - count; i < stack->size(); ++i) {
    entry.returns.push_back(map_tensors((*stack)[i], [&](const at::Tensor& t) {
      if (t.defined() && t.unsafeGetTensorImpl()->version_counter().enabled()) {
        entry.counters.push_back(t.unsafeGetTensorImpl()->version_counter());
        entry.versions.push_back(t._version());
      }
      return alias(t);
    }));
  }
  kept_.entries.push_back(std::move(entry));
}

void ReplayMode::dispatch(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (keeps_outputs(policy_, op, *stack) == Keep::No) {
    run(op, stack);
    return;
  }
  const std::string name = operator_label(op.operator_name());
  TORCH_CHECK(next_ < kept_.entries.size(),
              "ckpt::checkpoint: the recompute of a selectively checkpointed region called ", name,
              " after the ", kept_.entries.size(),
              " kept calls of its forward were used up. The function must run the same operators "
              "when it runs again, and the policy must decide the same way for them.");
  const KeptOutputs::Entry& entry = kept_.entries[next_++];
  TORCH_CHECK(entry.op == op.operator_name(), "ckpt::checkpoint: the recompute of a selectively ",
              "checkpointed region called ", name, " where its forward called ",
              operator_label(entry.op), " (kept call #", next_ - 1,
              "). The function must run the same operators when it runs again.");
  if (!unchanged(entry)) {  // modified in place later in the forward: the kept value is stale
    TORCH_CHECK(!entry.must, "ckpt::checkpoint: an output of ", name,
                " that the selective policy keeps (MustSave) was modified in place later in the "
                "forward, so the kept value is not the one the operator computed. Recompute ",
                name,
                " (MustRecompute or PreferSave), or make the in-place operation out of "
                "place.");
    run(op, stack);
    return;
  }
  torch::jit::drop(*stack, op.schema().arguments().size());
  for (const c10::IValue& value : entry.returns) stack->push_back(map_tensors(value, alias));
}

void ReplayMode::check_all_used() const {
  TORCH_CHECK(next_ == kept_.entries.size(),
              "ckpt::checkpoint: the recompute of a selectively checkpointed region used ", next_,
              " of the ", kept_.entries.size(),
              " calls its forward kept. The function must run the same operators when it runs "
              "again, and the policy must decide the same way for them.");
}

}  // namespace detail

SelectivePolicy save_ops(std::vector<std::string> ops) {
  std::unordered_set<std::string> names(ops.begin(), ops.end());
  return SelectivePolicy([names = std::move(names)](const OpCall& call) {
    return names.count(call.name()) ? CheckpointPolicy::PreferSave
                                    : CheckpointPolicy::PreferRecompute;
  });
}

SelectivePolicy save_matmuls() {
  return save_ops(
      {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
       "aten::_convolution", "aten::convolution", "aten::cudnn_convolution",
       "aten::mkldnn_convolution", "aten::_scaled_dot_product_attention",
       "aten::_scaled_dot_product_efficient_attention", "aten::_scaled_dot_product_flash_attention",
       "aten::_scaled_dot_product_flash_attention_for_cpu",
       "aten::_scaled_dot_product_cudnn_attention", "aten::_efficient_attention_forward",
       "aten::_flash_attention_forward"});
}

}  // namespace ckpt
