#pragma once

/// \file
/// Selective checkpointing: a policy decides, operator by operator, which outputs a checkpointed
/// region keeps from its forward and which it recomputes, as PyTorch's
/// `create_selective_checkpoint_contexts` does. docs/mechanism.md explains how the operators are
/// intercepted (below autograd, in C++).

#include <ATen/core/Tensor.h>
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
  MustOffload,      ///< keep the outputs in host memory; the recompute brings them back
  PreferOffload,    ///< offload them where they can be kept and stay unchanged, else recompute
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

  /// The name a `checkpoint_name` call gives its tensor, or null for any other call. The
  /// decision for such a call is the decision for the named tensor: saving it keeps the outputs
  /// of the operator call that computed it.
  const std::string* tensor_name() const {
    return schema.name() == "ckpt::name" ? &arguments[1].toStringRef() : nullptr;
  }
};

/// A selective checkpointing policy, given to `CheckpointOptions().policy(...)`. A default
/// constructed policy is empty: the region recomputes everything, as without one.
///
/// What the policy sees and decides is PyTorch's semantics. Outputs of operators it saves are
/// kept from the forward and handed back in the recompute, where autograd records the operator's
/// node again around the kept outputs; everything else runs again. Outputs of operators it
/// offloads (`MustOffload`, `PreferOffload`) are kept the same way, but in host memory: the
/// region's forward copies them there on a side stream and lets go of the device's copy once it
/// has landed, and its recompute brings them all back when it starts, in the order it uses them
/// (`ckpt::OffloadGuard` describes the copies); an output already in host memory stays where it
/// is. Three kinds of operators are always recomputed, and `MustSave` or `MustOffload` on them is
/// an error naming the operator:
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

/// Names `tensor` for selective checkpointing (JAX's `checkpoint_name`) and returns it unchanged:
/// the same tensor, with its gradient passing through. A policy sees the name as a call whose
/// `OpCall::tensor_name()` is `name`, and its decision there applies to the operator call that
/// computed the tensor's data (following views back to it): `save_names` keeps that call's
/// outputs, and the recompute does not run its kernel.
///
/// A name belongs to the innermost region with a selective policy around the call; regions
/// outside it do not see it. Within one such region a name may be given once (an error
/// otherwise). Outside such a region, or in one without a policy, it does nothing and costs a
/// thread-local check.
///
/// Example:
/// ```
/// auto attention_output = ckpt::checkpoint_name(attention->forward(x), "attn_out");
/// ```
at::Tensor checkpoint_name(const at::Tensor& tensor, const std::string& name);

/// Keeps the tensors named (`checkpoint_name`) with one of `names`, and decides every other
/// operator call with `others` (recomputes it when `others` is empty), as JAX's
/// `save_only_these_names` does. A named tensor that cannot be kept is an error that says why: data
/// not computed inside the region (an argument), data written in place between the call that
/// computed it and the name, or the output of an operator that cannot be kept (one that writes in
/// place, returns a view or draws random numbers itself, such as `bernoulli_`). A write after the
/// name is absorbed, and a dropout's output (a product) is kept, both exactly.
///
/// Example:
/// ```
/// auto options = ckpt::CheckpointOptions().policy(
///     ckpt::save_names({"attn_out"}, /*others=*/ckpt::save_matmuls()));
/// ```
SelectivePolicy save_names(std::vector<std::string> names, SelectivePolicy others = {});

/// Keeps the tensors named with one of `saved` on the device and those named with one of
/// `offloaded` in host memory, and decides every other call with `others` (recomputes it when
/// `others` is empty), as JAX's `save_and_offload_only_these_names` does. A name in both lists is
/// an error (c10::Error).
///
/// Example:
/// ```
/// auto options = ckpt::CheckpointOptions().policy(
///     ckpt::save_and_offload_names(/*saved=*/{"attn_out"}, /*offloaded=*/{"mlp_in"}));
/// ```
SelectivePolicy save_and_offload_names(std::vector<std::string> saved,
                                       std::vector<std::string> offloaded,
                                       SelectivePolicy others = {});

/// Keeps the outputs of matrix products (mm, addmm, bmm, baddbmm, matmul, linear, as they reach
/// the kernels), convolutions, and the scaled-dot-product-attention forwards; recomputes the rest.
SelectivePolicy save_matmuls();

/// Keeps the outputs of the operators named in `ops` ("aten::mm", "aten::addmm", ...; any
/// overload); recomputes the rest.
SelectivePolicy save_ops(std::vector<std::string> ops);

}  // namespace ckpt
