#pragma once

// Fixtures shared by the planning layer's tests.

#include <ckpt/plan/chain.h>

#include <cmath>
#include <cstdint>
#include <random>

namespace ckpt {
namespace plan {
namespace test {

/// Input 10; stage 0: f=1 b=2 |x1|=20 |x̄1|=30 ftmp=5 btmp=7; stage 1: f=2 b=3 |x2|=40 |x̄2|=50
/// ftmp=0 btmp=1 (the worked example of docs/memory-model.md).
inline Chain two_stage_chain() {
  Chain chain;
  chain.input_bytes = 10;
  chain.stages.push_back(Stage{1.0, 2.0, 20, 30, 5, 7, {}});
  chain.stages.push_back(Stage{2.0, 3.0, 40, 50, 0, 1, {}});
  return chain;
}

/// Random heterogeneous chain with integer times (exact sums) and optional alternatives.
inline Chain random_chain(std::mt19937& rng, int stages, int max_bytes, int alternatives) {
  std::uniform_int_distribution<int64_t> size(1, max_bytes);
  std::uniform_int_distribution<int64_t> tmp(0, max_bytes / 2);
  std::uniform_int_distribution<int> time(1, 10);
  Chain chain;
  chain.input_bytes = size(rng);
  for (int i = 0; i < stages; ++i) {
    Stage stage;
    stage.forward_time = time(rng);
    stage.backward_time = time(rng);
    stage.output_bytes = size(rng);
    stage.saved_bytes = stage.output_bytes + tmp(rng) * 2;
    stage.forward_tmp_bytes = tmp(rng);
    stage.backward_tmp_bytes = tmp(rng);
    // Half the stages give their grad-enabled forward its own temporaries.
    if (std::uniform_int_distribution<int>(0, 1)(rng) == 1) stage.forward_all_tmp_bytes = tmp(rng);
    for (int k = 0; k < alternatives; ++k) {
      stage.alternatives.push_back(StorageOption{static_cast<double>(time(rng)),
                                                 static_cast<double>(time(rng)),
                                                 stage.output_bytes + tmp(rng),
                                                 tmp(rng),
                                                 tmp(rng),
                                                 {}});
    }
    // Most stages have parameters whose gradients the backward creates.
    stage.gradient_bytes = std::uniform_int_distribution<int64_t>(0, max_bytes / 2)(rng);
    chain.stages.push_back(stage);
  }
  return chain;
}

/// random_chain with one offload option more per stage: it keeps only its output on the device
/// and offloads the rest of what option 0 saves (and a little more), brings some or all of it
/// back at the start of its backward (in backward_tmp_bytes), with forward temporaries of its own,
/// and computes a little slower. The copies are
/// free, or take up to about 4 or 8 units of time (comparable with the compute) at a bandwidth of
/// a power of two, so that every time stays a sum of exact binary fractions.
inline Chain random_offload_chain(std::mt19937& rng, int stages, int max_bytes, int alternatives) {
  Chain chain = random_chain(rng, stages, max_bytes, alternatives);
  std::uniform_int_distribution<int64_t> jitter(0, max_bytes / 4);
  std::uniform_int_distribution<int> slower(0, 2);
  const double unit = std::exp2(std::floor(std::log2(max_bytes))) / 4;
  chain.host_bandwidth = unit * std::uniform_int_distribution<int>(0, 2)(rng);
  for (Stage& stage : chain.stages) {
    StorageOption offload = stage.option(0);
    offload.offloaded_bytes = stage.saved_bytes - stage.output_bytes + jitter(rng);
    offload.saved_bytes = stage.output_bytes;
    // The copies may stream (fewer temporaries than option 0's) and come back in parts.
    offload.forward_tmp_bytes = jitter(rng);
    offload.backward_tmp_bytes +=
        std::uniform_int_distribution<int64_t>(0, offload.offloaded_bytes)(rng);
    offload.forward_time += slower(rng);
    offload.name = "offloaded";
    stage.alternatives.push_back(offload);
  }
  return chain;
}

}  // namespace test
}  // namespace plan
}  // namespace ckpt
