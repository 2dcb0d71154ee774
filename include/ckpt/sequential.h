#pragma once

#include <ckpt/options.h>

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <c10/util/TypeIndex.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

namespace ckpt {

/// Runs a chain of functions in `segments` segments, all but the last checkpointed, like Python's
/// `torch.utils.checkpoint.checkpoint_sequential`.
///
/// The chain is cut into segments of `n / segments` functions (integer division); the first
/// `segments - 1` run as checkpointed regions and the rest of the chain runs normally. Both
/// variants are available through `options`, and RNG state is preserved per segment.
///
/// Differences from PyTorch: `segments` greater than the number of functions is clamped to it
/// (PyTorch 1.13 fails with an unrelated `ValueError`), and buffers of the chain's modules (the
/// running statistics of BatchNorm) are updated once per step, not again by the recompute
/// (pytorch/pytorch#96136). Functions given as `std::function` have no buffers ckpt can see: use
/// `ckpt::is_recomputing()` inside them to skip side effects.
///
/// Example:
/// ```
/// auto y = ckpt::checkpoint_sequential(model, /*segments=*/4, x);
/// ```
torch::Tensor checkpoint_sequential(const torch::nn::Sequential& functions, int64_t segments,
                                    const torch::Tensor& input,
                                    const CheckpointOptions& options = {});

/// `checkpoint_sequential` over a list of modules.
torch::Tensor checkpoint_sequential(const std::vector<torch::nn::AnyModule>& functions,
                                    int64_t segments, const torch::Tensor& input,
                                    const CheckpointOptions& options = {});

/// `checkpoint_sequential` over a list of functions.
torch::Tensor checkpoint_sequential(
    const std::vector<std::function<torch::Tensor(torch::Tensor)>>& functions, int64_t segments,
    const torch::Tensor& input, const CheckpointOptions& options = {});

/// One chain from consecutive chains: a `Sequential` of every stage of `parts`, in order. The
/// stages are the same modules, shared, not copied. Stage `j` of part `i` is named `i_j`.
///
/// This is how a nested model becomes one fine chain: a transformer block written as the chain
/// of its attention and MLP halves, and the model as its blocks, give a chain of halves that
/// `PlannedSequential` and `checkpoint_sequential` can cut between any two halves. (A LibTorch
/// `Sequential` cannot hold another `Sequential`, whose `forward` is a template.)
///
/// Example:
/// ```
/// std::vector<torch::nn::Sequential> blocks;
/// for (int i = 0; i < 4; ++i) {
///   blocks.push_back(torch::nn::Sequential(torch::nn::Linear(8, 8), torch::nn::GELU()));
/// }
/// torch::nn::Sequential chain = ckpt::join_chains(blocks);  // 8 stages
/// ```
torch::nn::Sequential join_chains(const std::vector<torch::nn::Sequential>& parts);

#ifndef DOXYGEN_SHOULD_SKIP_THIS
namespace detail {
template <class M, class = void>
struct ModuleImpl {
  using type = M;
};
template <class M>
struct ModuleImpl<
    M, std::enable_if_t<std::is_base_of_v<torch::nn::ModuleHolder<typename M::ContainedType>, M>>> {
  using type = typename M::ContainedType;
};
}  // namespace detail
#endif

/// The chain of a model's blocks kept in a `ModuleList`: a `Sequential` of the same modules, in
/// order, each a `Block` (a module holder such as `TransformerBlock`, or its `Impl`) whose
/// `forward` takes and returns one tensor. A block of another type is a clear error.
///
/// Example:
/// ```
/// torch::nn::ModuleList blocks(torch::nn::Linear(8, 8), torch::nn::Linear(8, 8));
/// torch::nn::Sequential chain = ckpt::chain_of<torch::nn::Linear>(blocks);
/// ```
template <class Block>
torch::nn::Sequential chain_of(const torch::nn::ModuleList& blocks) {
  using Impl = typename detail::ModuleImpl<Block>::type;
  static_assert(std::is_base_of_v<torch::nn::Module, Impl>,
                "ckpt::chain_of<Block>: Block must be a module or a module holder");
  torch::nn::Sequential chain;
  for (size_t i = 0; i < blocks->size(); ++i) {
    auto block = std::dynamic_pointer_cast<Impl>(blocks->ptr(i));
    TORCH_CHECK(block != nullptr, "ckpt::chain_of: block ", i, " of the ModuleList is a ",
                blocks->ptr(i)->name(), ", not a ",
                c10::util::get_fully_qualified_type_name<Impl>(),
                ". Name the type of the blocks, or build the chain with Sequential::push_back.");
    chain->push_back(std::to_string(i), block);
  }
  return chain;
}

}  // namespace ckpt
