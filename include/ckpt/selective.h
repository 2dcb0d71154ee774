#pragma once

/// \file
/// Selective checkpointing: a policy decides, operator by operator, which outputs a checkpointed
/// region keeps from its forward and which it recomputes, as PyTorch's
/// `create_selective_checkpoint_contexts` does. docs/mechanism.md explains how the operators are
/// intercepted (below autograd, in C++).

#include <ATen/core/function_schema.h>
#include <ATen/core/ivalue.h>
#include <c10/util/ArrayRef.h>

#include <functional>
#include <string>
#include <vector>

namespace ckpt {

/// What a policy decides for one operator call, as PyTorch's `CheckpointPolicy`. ckpt treats
/// the "prefer" decisions as the "must" ones, except where an output cannot be kept (see
/// `SelectivePolicy`).
enum class CheckpointPolicy {
  MustSave,         ///< keep the outputs from the forward; the recompute does not run the kernel
  PreferSave,       ///< keep them where they can be kept and stay unchanged, recompute otherwise
  MustRecompute,    ///< run the operator again in the recompute
  PreferRecompute,  ///< the same as MustRecompute
};

/// One operator call as a policy sees it: the operator's schema and its arguments. The call
/// reaches the policy below autograd, where composite operators are already decomposed (a
/// `torch::nn::Linear` reaches it as `aten::t` and `aten::addmm`, or `aten::linear`'s kernel
/// where LibTorch has one).
struct OpCall {
  const c10::FunctionSchema& schema;
  c10::ArrayRef<c10::IValue> arguments;

  /// The operator's qualified name, without its overload: "aten::mm".
  const std::string& name() const { return schema.name(); }
};

/// A selective checkpointing policy, given to `CheckpointOptions().policy(...)`. A default
/// constructed policy is empty: the region recomputes everything, as without one.
///
/// What the policy sees and decides is PyTorch's semantics. Outputs of operators it saves are
/// kept from the forward and handed back in the recompute, where autograd records the operator's
/// node again around the kept outputs; everything else runs again. Three kinds of operators are
/// always recomputed, and `MustSave` on them is an error naming the operator:
///   - in-place and out= operators (they write into a tensor the region owns);
///   - views (their outputs alias their inputs, so a kept one would alias the forward's input);
///   - random operators (skipping one in the recompute would shift the random stream that the
///     operators after it replay).
/// An operator that writes in place into the data of a kept output later in the forward (through
/// the output, a view of it, or an alias autograd does not track, as Linear's bias add does on
/// 3-d input) makes the region keep a copy taken before the write, so the kept value stays the
/// one the operator computed. A kept output whose data the recompute writes into is used by that
/// backward only: a second backward through the region (retain_graph) runs the operator again.
/// One the caller changes after the region, through the region's output (which shares the version
/// counter of the tensor the region computed), is recomputed under `PreferSave` and an error
/// under `MustSave`.
///
/// Example:
/// ```
/// auto options = ckpt::CheckpointOptions().policy(ckpt::SelectivePolicy(
///     [](const ckpt::OpCall& call) {
///       return call.name() == "aten::addmm" ? ckpt::CheckpointPolicy::MustSave
///                                           : ckpt::CheckpointPolicy::PreferRecompute;
///     }));
/// ```
class SelectivePolicy {
 public:
  using Decide = std::function<CheckpointPolicy(const OpCall&)>;

  SelectivePolicy() = default;
  explicit SelectivePolicy(Decide decide) : decide_(std::move(decide)) {}

  /// Whether a policy is set.
  explicit operator bool() const { return static_cast<bool>(decide_); }
  /// The decision for one call (MustRecompute for an empty policy).
  CheckpointPolicy operator()(const OpCall& call) const {
    return decide_ ? decide_(call) : CheckpointPolicy::MustRecompute;
  }

 private:
  Decide decide_;
};

/// Keeps the outputs of matrix products (mm, addmm, bmm, baddbmm, matmul, linear, as they reach
/// the kernels), convolutions, and the scaled-dot-product-attention forwards; recomputes the rest.
SelectivePolicy save_matmuls();

/// Keeps the outputs of the operators named in `ops` ("aten::mm", "aten::addmm", ...; any
/// overload); recomputes the rest.
SelectivePolicy save_ops(std::vector<std::string> ops);

}  // namespace ckpt
