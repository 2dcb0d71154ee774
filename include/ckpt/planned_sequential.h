#pragma once

/// \file
/// `ckpt::PlannedSequential`: the planned chain of the execution layer, measured by the
/// measurement layer's profiler. It sits above both, so the executor never calls the profiler.

#include <ckpt/execute/planned_sequential_impl.h>
#include <ckpt/profiler.h>

#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>

#include <cstddef>
#include <memory>
#include <utility>

namespace ckpt {

/// A `ModuleHolder` for `PlannedSequentialImpl` that plans with a `MeasuringProfiler` unless the
/// options name another profiler.
class PlannedSequential : public torch::nn::ModuleHolder<PlannedSequentialImpl> {
 public:
  // NOLINTNEXTLINE(google-explicit-constructor): the holder conventions of TORCH_MODULE
  PlannedSequential(std::nullptr_t) : ModuleHolder(nullptr) {}
  // NOLINTNEXTLINE(google-explicit-constructor)
  PlannedSequential(std::shared_ptr<PlannedSequentialImpl> module)
      : ModuleHolder(std::move(module)) {}
  PlannedSequential(const torch::nn::Sequential& chain, Budget budget,
                    PlannedSequentialOptions options = {})
      : ModuleHolder(std::make_shared<PlannedSequentialImpl>(chain, budget,
                                                             with_measuring_profiler(options))) {}

 private:
  static PlannedSequentialOptions with_measuring_profiler(PlannedSequentialOptions options) {
    if (!options.profiler()) {
      options.profiler(std::make_shared<MeasuringProfiler>(
          ProfileOptions()
              .selective_option(options.selective_policy())
              .count_parameter_gradients(options.count_parameter_gradients())));
    }
    return options;
  }
};

}  // namespace ckpt
