#include <ckpt/checkpoint.h>
#include <ckpt/sequential.h>

#include "module_region.h"

#include <c10/util/Exception.h>

#include <algorithm>

namespace ckpt {
namespace {

using Module = std::shared_ptr<torch::nn::Module>;

// A chain seen uniformly: how to call stage i, and which modules (for their buffers) it has.
struct FunctionChain {
  size_t size;
  std::function<torch::Tensor(size_t, torch::Tensor)> call;
  std::function<Module(size_t)> module;  // null for plain functions
};

torch::Tensor run(const FunctionChain& chain, size_t first, size_t last, torch::Tensor x) {
  for (size_t i = first; i <= last; ++i) x = chain.call(i, std::move(x));
  return x;
}

torch::Tensor run_segments(const FunctionChain& chain, int64_t segments, const torch::Tensor& input,
                           const CheckpointOptions& options) {
  const auto n = static_cast<int64_t>(chain.size);
  TORCH_CHECK(n > 0,
              "ckpt::checkpoint_sequential: the chain of functions is empty. Pass at least one "
              "module or function.");
  TORCH_CHECK(segments >= 1, "ckpt::checkpoint_sequential: segments must be at least 1, but got ",
              segments, ". Pass 1 to run the chain without checkpointing, or more to save memory.");
  if (segments > n) {
    TORCH_WARN_ONCE("ckpt::checkpoint_sequential: segments (", segments,
                    ") is greater than the number of functions (", n, "); using ", n,
                    " segments of one function each.");
    segments = n;
  }
  const int64_t segment_size = n / segments;
  torch::Tensor x = input;
  int64_t end = -1;
  for (int64_t start = 0; start < segment_size * (segments - 1); start += segment_size) {
    end = start + segment_size - 1;
    const auto first = static_cast<size_t>(start), last = static_cast<size_t>(end);
    auto segment = [chain, first, last](const torch::Tensor& t) {
      return run(chain, first, last, t);
    };
    if (chain.module) {
      std::vector<Module> modules;
      for (size_t i = first; i <= last; ++i) modules.push_back(chain.module(i));
      x = detail::checkpoint_modules(options, modules, segment, x);
    } else {
      x = checkpoint(options, segment, x);
    }
  }
  return run(chain, static_cast<size_t>(end + 1), chain.size - 1, std::move(x));
}

FunctionChain modules_chain(std::vector<torch::nn::AnyModule> modules) {
  auto shared = std::make_shared<std::vector<torch::nn::AnyModule>>(std::move(modules));
  return {shared->size(),
          [shared](size_t i, torch::Tensor x) {
            return (*shared)[i].forward<torch::Tensor>(std::move(x));
          },
          [shared](size_t i) { return (*shared)[i].ptr(); }};
}

}  // namespace

torch::Tensor checkpoint_sequential(const torch::nn::Sequential& functions, int64_t segments,
                                    const torch::Tensor& input, const CheckpointOptions& options) {
  TORCH_CHECK(!functions.is_empty(),
              "ckpt::checkpoint_sequential: the Sequential is a null holder (default-constructed "
              "with nullptr). Pass a constructed torch::nn::Sequential.");
  return run_segments(
      modules_chain(std::vector<torch::nn::AnyModule>(functions->begin(), functions->end())),
      segments, input, options);
}

torch::Tensor checkpoint_sequential(const std::vector<torch::nn::AnyModule>& functions,
                                    int64_t segments, const torch::Tensor& input,
                                    const CheckpointOptions& options) {
  return run_segments(modules_chain(functions), segments, input, options);
}

torch::Tensor checkpoint_sequential(
    const std::vector<std::function<torch::Tensor(torch::Tensor)>>& functions, int64_t segments,
    const torch::Tensor& input, const CheckpointOptions& options) {
  auto shared =
      std::make_shared<std::vector<std::function<torch::Tensor(torch::Tensor)>>>(functions);
  FunctionChain chain{shared->size(),
                      [shared](size_t i, torch::Tensor x) { return (*shared)[i](std::move(x)); },
                      nullptr};
  return run_segments(chain, segments, input, options);
}

torch::nn::Sequential join_chains(const std::vector<torch::nn::Sequential>& parts) {
  torch::nn::Sequential chain;
  for (size_t i = 0; i < parts.size(); ++i) {
    TORCH_CHECK(!parts[i].is_empty(), "ckpt::join_chains: part ", i,
                " is an empty Sequential holder (nullptr). Give every part a Sequential.");
    size_t j = 0;
    for (const torch::nn::AnyModule& stage : *parts[i]) {
      chain->push_back(std::to_string(i) + "_" + std::to_string(j++), stage);
    }
  }
  return chain;
}

}  // namespace ckpt
