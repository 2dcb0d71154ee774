#pragma once

// A second, independent reading of docs/memory-model.md, for the tests' oracles: it scores a
// schedule by naming every buffer it holds ("x3", "xbar3", "d3", "grad3") and summing their sizes,
// and shares no code with ckpt::plan::simulate. The brute force over persistent schedules uses it,
// so a mistake in the simulator cannot hide one in the solver.

#include "ckpt/plan/chain.h"
#include "ckpt/plan/schedule.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <string>

namespace ckpt {
namespace plan {
namespace test {

struct ReferenceScore {
  bool valid = true;
  double time = 0.0;
  int64_t peak_bytes = 0;
  int64_t host_peak_bytes = 0;  // the offloaded x̄ in host memory ("host3")
};

class ReferenceAccounting {
 public:
  explicit ReferenceAccounting(const Chain& chain) : chain_(chain) {
    live_["x0"] = chain.input_bytes;
    kept_.insert(0);
  }

  ReferenceScore score(const Schedule& schedule) {
    score_.peak_bytes = chain_.input_bytes;
    for (const Op& op : schedule.ops) {
      if (!score_.valid) break;
      apply(op);
    }
    score_.valid = score_.valid && loss_done_ && backwarded_.size() == chain_.stages.size();
    return score_;
  }

 private:
  static std::string x(int i) { return "x" + std::to_string(i); }
  static std::string xbar(int i) { return "xbar" + std::to_string(i); }
  static std::string d(int i) { return "d" + std::to_string(i); }
  static std::string grad(int i) { return "grad" + std::to_string(i); }

  int64_t size_of_x(int i) const {
    return i == 0 ? chain_.input_bytes : chain_.stages[static_cast<size_t>(i - 1)].output_bytes;
  }
  // Option 0 is the stage's own fields, its forward temporaries forward_all_tmp_bytes and its
  // forward time forward_all_time when set;
  // options 1..K are the alternatives (read here, not through Stage::option).
  static StorageOption option_fields(const Stage& stage, int k) {
    if (k > 0) return stage.alternatives[static_cast<size_t>(k - 1)];
    StorageOption own;
    own.forward_time = stage.forward_all_time >= 0 ? stage.forward_all_time : stage.forward_time;
    own.backward_time = stage.backward_time;
    own.saved_bytes = stage.saved_bytes;
    own.forward_tmp_bytes =
        stage.forward_all_tmp_bytes >= 0 ? stage.forward_all_tmp_bytes : stage.forward_tmp_bytes;
    own.backward_tmp_bytes = stage.backward_tmp_bytes;
    return own;
  }
  bool has(const std::string& name) const { return live_.count(name) != 0; }
  bool available(int i) const { return has(x(i)) || has(xbar(i)); }
  int64_t held() const {
    int64_t total = 0;
    for (const auto& buffer : live_) total += buffer.second;
    return total;
  }
  void charge(int64_t extra, double time) {
    score_.peak_bytes = std::max(score_.peak_bytes, held() + extra);
    score_.time += time;
  }
  // An offload option's Fall and B take their compute time or the copy of its offloaded bytes,
  // whichever is longer (the copies overlap the compute); copies are free at bandwidth 0.
  double with_copy(double compute, const StorageOption& option) const {
    if (chain_.host_bandwidth == 0) return compute;
    return std::max(compute, static_cast<double>(option.offloaded_bytes) / chain_.host_bandwidth);
  }
  void hold_on_host(const std::string& name, int64_t bytes) {
    host_[name] = bytes;
    int64_t total = 0;
    for (const auto& buffer : host_) total += buffer.second;
    score_.host_peak_bytes = std::max(score_.host_peak_bytes, total);
  }
  void require(bool condition) { score_.valid = score_.valid && condition; }

  void apply(const Op& op) {
    const int i = op.stage;
    const int stages = chain_.size();
    if (op.kind == OpKind::Loss) {
      require(i == stages && !loss_done_ && available(stages));
      charge(size_of_x(stages), 0.0);
      live_[d(stages)] = size_of_x(stages);
      live_.erase(x(stages));
      loss_done_ = true;
      return;
    }
    require(i >= 0 && i < stages);
    if (!score_.valid) return;
    const Stage& stage = chain_.stages[static_cast<size_t>(i)];
    require(op.option >= 0 && op.option <= static_cast<int>(stage.alternatives.size()));
    if (!score_.valid) return;
    const StorageOption option = option_fields(stage, op.option);
    if (op.kind == OpKind::Backward) {
      require(backwarded_.count(i) == 0 && has(d(i + 1)) && has(xbar(i + 1)) &&
              option_of_[i + 1] == op.option && available(i));
      charge(size_of_x(i) + option.backward_tmp_bytes, with_copy(option.backward_time, option));
      host_.erase(xbar(i + 1));
      live_[d(i)] = size_of_x(i);
      live_.erase(d(i + 1));
      live_.erase(xbar(i + 1));
      if (i >= 1) live_.erase(x(i));
      live_[grad(i)] = stage.gradient_bytes;  // the parameters' gradients, until the step ends
      backwarded_.insert(i);
      return;
    }
    require(backwarded_.count(i) == 0 && available(i) && !available(i + 1));
    if (op.kind == OpKind::ForwardAll) {
      charge(option.saved_bytes + option.forward_tmp_bytes, with_copy(option.forward_time, option));
      live_[xbar(i + 1)] = option.saved_bytes;
      hold_on_host(xbar(i + 1), option.offloaded_bytes);
      option_of_[i + 1] = op.option;
      return;
    }
    require(op.option == 0);
    charge(size_of_x(i + 1) + stage.forward_tmp_bytes, stage.forward_time);
    live_[x(i + 1)] = size_of_x(i + 1);
    if (op.kind == OpKind::ForwardInput && has(x(i))) kept_.insert(i);
    if (op.kind == OpKind::ForwardNone && has(x(i)) && kept_.count(i) == 0) live_.erase(x(i));
  }

  const Chain& chain_;
  std::map<std::string, int64_t> live_;  // every buffer in memory, by name
  std::map<std::string, int64_t> host_;  // every buffer in host memory, by name
  std::set<int> kept_;                   // standalone inputs kept as checkpoints
  std::map<int, int> option_of_;         // the storage option of each x̄
  std::set<int> backwarded_;
  bool loss_done_ = false;
  ReferenceScore score_;
};

}  // namespace test
}  // namespace plan
}  // namespace ckpt
