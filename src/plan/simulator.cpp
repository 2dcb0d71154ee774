#include "ckpt/plan/simulator.h"

#include <algorithm>
#include <string>
#include <vector>

namespace ckpt {
namespace plan {
namespace {

// Memory state of the simulation; see docs/memory-model.md.
class Machine {
 public:
  Machine(const Chain& chain, const Schedule& schedule)
      : chain_(chain),
        schedule_(schedule),
        length_(chain.size()),
        x_(static_cast<size_t>(length_ + 1), false),
        kept_(static_cast<size_t>(length_ + 1), false),
        xbar_option_(static_cast<size_t>(length_ + 1), -1),
        delta_(static_cast<size_t>(length_ + 1), false),
        backward_done_(static_cast<size_t>(length_), false),
        forward_ops_(static_cast<size_t>(length_), 0),
        forwarded_(static_cast<size_t>(length_), false) {
    for (const Op& op : schedule.ops) {
      if (op.kind != OpKind::Loss && op.kind != OpKind::Backward && op.stage >= 0 &&
          op.stage < length_) {
        ++forward_ops_[static_cast<size_t>(op.stage)];
      }
    }
    // x_0 is held by the caller for the whole step and counted in the peak.
    x_[0] = true;
    kept_[0] = true;
    current_ = chain.input_bytes;
    result_.peak_bytes = current_;
  }

  // Runs op `index`; returns false (with result_.error set) when it is invalid.
  bool run(int index, const Op& op) {
    index_ = index;
    op_ = &op;
    switch (op.kind) {
      case OpKind::ForwardNone:
      case OpKind::ForwardInput:
      case OpKind::ForwardAll:
        return forward(op);
      case OpKind::Loss:
        return loss(op);
      case OpKind::Backward:
        return backward(op);
    }
    return fail("unknown op kind");
  }

  bool finish() {
    index_ = -1;
    if (!loss_done_) return fail("the schedule never runs the loss");
    for (int i = length_ - 1; i >= 0; --i) {
      if (!backward_done_[static_cast<size_t>(i)]) {
        return fail("the schedule ends before stage " + std::to_string(i) + " is backwarded");
      }
    }
    return true;
  }

  SimulationResult result() {
    result_.final_bytes = current_ - random_held_;  // the executor lets go of them at its end
    return result_;
  }

 private:
  int64_t x_bytes(int i) const { return chain_.activation_bytes(i); }
  bool available(int i) const {
    return x_[static_cast<size_t>(i)] || (i >= 1 && xbar_option_[static_cast<size_t>(i)] >= 0);
  }

  bool fail(const std::string& reason) {
    result_.valid = false;
    result_.error_op_index = index_;
    if (index_ >= 0) {
      result_.error = "op " + std::to_string(index_) + " (" + to_string(*op_) + "): " + reason;
    } else {
      result_.error = "end of schedule: " + reason;
    }
    return false;
  }

  // The peak of an op: memory held before it + what it allocates + its temporaries.
  void touch_peak(int64_t allocated, int64_t tmp) {
    const int64_t peak = current_ + allocated + tmp;
    if (peak > result_.peak_bytes) {
      result_.peak_bytes = peak;
      result_.peak_op_index = index_;
    }
  }

  bool check_stage(const Op& op) {
    if (op.stage < 0 || op.stage >= length_) {
      return fail("stage must be in [0, " + std::to_string(length_) + ") for this chain, but got " +
                  std::to_string(op.stage));
    }
    return true;
  }

  bool forward(const Op& op) {
    if (!check_stage(op)) return false;
    const int i = op.stage;
    const Stage& stage = chain_.stages[static_cast<size_t>(i)];
    if (op.kind == OpKind::ForwardAll) {
      if (op.option < 0 || op.option >= stage.option_count()) {
        return fail("option must be in [0, " + std::to_string(stage.option_count()) +
                    ") for this stage, but got " + std::to_string(op.option));
      }
    } else if (op.option != 0) {
      return fail("option must be 0 for a no-grad forward, but got " + std::to_string(op.option));
    }
    if (backward_done_[static_cast<size_t>(i)]) {
      return fail("stage " + std::to_string(i) + " was already backwarded");
    }
    if (!available(i)) {
      return fail("its input x_" + std::to_string(i) + " is not in memory");
    }
    if (available(i + 1)) {
      return fail("its output x_" + std::to_string(i + 1) + " is already in memory");
    }
    ++result_.forward_count;
    if (op.kind == OpKind::ForwardAll) {
      const StorageOption option = stage.option(op.option);
      touch_peak(option.saved_bytes, transient_at_forward(i, option.forward_tmp_bytes));
      xbar_option_[static_cast<size_t>(i + 1)] = op.option;
      current_ += option.saved_bytes;
      host_ += option.offloaded_bytes;
      result_.host_peak_bytes = std::max(result_.host_peak_bytes, host_);
      result_.time += chain_.forward_all_time(option);
      return true;
    }
    touch_peak(stage.output_bytes, transient_at_forward(i, stage.forward_tmp_bytes));
    x_[static_cast<size_t>(i + 1)] = true;
    kept_[static_cast<size_t>(i + 1)] = false;
    current_ += stage.output_bytes;
    result_.time += stage.forward_time;
    if (op.kind == OpKind::ForwardInput) {
      if (x_[static_cast<size_t>(i)]) kept_[static_cast<size_t>(i)] = true;
    } else if (x_[static_cast<size_t>(i)] && !kept_[static_cast<size_t>(i)]) {
      x_[static_cast<size_t>(i)] = false;  // i >= 1: x_0 is always kept
      current_ -= x_bytes(i);
    }
    return true;
  }

  bool loss(const Op& op) {
    if (op.stage != length_) {
      return fail("the loss's stage index must be the number of stages (" +
                  std::to_string(length_) + "), but got " + std::to_string(op.stage));
    }
    if (op.option != 0) {
      return fail("option must be 0 for the loss, but got " + std::to_string(op.option));
    }
    if (loss_done_) return fail("the loss was already computed");
    if (!available(length_)) {
      return fail("the chain's output x_" + std::to_string(length_) + " is not in memory");
    }
    const int64_t bytes = x_bytes(length_);
    touch_peak(bytes, 0);
    loss_done_ = true;
    // The executor's backward keeps the caller's random state where a recompute replays one.
    if (replays_random_state()) {
      current_ += chain_.random_state_bytes;
      random_held_ += chain_.random_state_bytes;
    }
    delta_[static_cast<size_t>(length_)] = true;
    current_ += bytes;
    if (x_[static_cast<size_t>(length_)] && length_ >= 1) {
      x_[static_cast<size_t>(length_)] = false;
      current_ -= bytes;
    }
    return true;
  }

  bool backward(const Op& op) {
    if (!check_stage(op)) return false;
    const int i = op.stage;
    const Stage& stage = chain_.stages[static_cast<size_t>(i)];
    if (backward_done_[static_cast<size_t>(i)]) {
      return fail("stage " + std::to_string(i) + " was already backwarded");
    }
    if (!delta_[static_cast<size_t>(i + 1)]) {
      return fail("the gradient δ_" + std::to_string(i + 1) + " is not in memory");
    }
    const int stored = xbar_option_[static_cast<size_t>(i + 1)];
    if (stored < 0) {
      return fail("the saved activations x̄_" + std::to_string(i + 1) +
                  " are not in memory (run forward_all of stage " + std::to_string(i) + " first)");
    }
    if (op.option != stored) {
      return fail("option must match the forward_all that saved x̄_" + std::to_string(i + 1) + " (" +
                  std::to_string(stored) + "), but got " + std::to_string(op.option));
    }
    if (!available(i)) {
      return fail("its input x_" + std::to_string(i) + " is not in memory");
    }
    const StorageOption option = stage.option(stored);
    // The look-ahead of stage i - 1: its data comes back during this backward, on the side.
    int64_t ahead_bytes = 0;
    if (i >= 1 && looks_ahead(i - 1)) {
      const Op* next = index_ + 1 < static_cast<int>(schedule_.ops.size())
                           ? &schedule_.ops[static_cast<size_t>(index_ + 1)]
                           : nullptr;
      if (next == nullptr || next->kind != OpKind::Backward || next->stage != i - 1) {
        return fail("the look-ahead of stage " + std::to_string(i - 1) +
                    " needs its backward right after this one");
      }
      ahead_bytes = chain_.stages[static_cast<size_t>(i - 1)].option(next->option).offloaded_bytes;
      if (ahead_bytes == 0) {
        return fail("the look-ahead of stage " + std::to_string(i - 1) +
                    " needs an offload option in its backward");
      }
    }
    touch_peak(x_bytes(i), option.backward_tmp_bytes + ahead_bytes);
    // A stage brought back ahead waits for nothing; the copy runs beside the backward before.
    const double own_time = looks_ahead(i) ? option.backward_time : chain_.backward_time(option);
    result_.time += std::max(own_time, chain_.copy_time(ahead_bytes));
    host_ -= option.offloaded_bytes;  // the host copy lives until the backward's end
    backward_done_[static_cast<size_t>(i)] = true;
    delta_[static_cast<size_t>(i)] = true;
    current_ += x_bytes(i);
    delta_[static_cast<size_t>(i + 1)] = false;
    current_ -= x_bytes(i + 1);
    xbar_option_[static_cast<size_t>(i + 1)] = -1;
    current_ -= option.saved_bytes;
    current_ += stage.gradient_bytes;  // the parameters' gradients stay until the step ends
    if (forward_ops_[static_cast<size_t>(i)] > 1) current_ -= stage.kept_buffer_bytes;
    if (i >= 1 && x_[static_cast<size_t>(i)]) {
      x_[static_cast<size_t>(i)] = false;
      current_ -= x_bytes(i);
    }
    return true;
  }

  // The transient bytes of a forward of stage i whose own are `forward_tmp`, with what the
  // executor holds around it (docs/memory-model.md, "Random state" and "Buffers"): in the first
  // forward of a stage that runs again, the stash (kept where the stage draws random numbers) and
  // a copy of every buffer (`kept_buffer_bytes` of them kept until the stage's backward), then,
  // once the forward's own are gone, a second read of the random state that tells whether the
  // stage drew; in a later forward, the caller's random state, put aside while a stage that draws
  // them runs again, and the copy of the stage's buffers. Adds the kept bytes to `current_`.
  int64_t transient_at_forward(int i, int64_t forward_tmp) {
    const auto index = static_cast<size_t>(i);
    const Stage& stage = chain_.stages[index];
    const int64_t kept = stage.random_state_bytes;
    const int64_t state = chain_.random_state_bytes;
    const bool first = !forwarded_[index];
    forwarded_[index] = true;
    if (first) {
      if (forward_ops_[index] == 1) return forward_tmp;
      current_ += kept + stage.kept_buffer_bytes;
      random_held_ += kept;
      const int64_t during = forward_tmp + stage.buffer_bytes - stage.kept_buffer_bytes;
      return state - kept + std::max(during, state);
    }
    return forward_tmp + (kept == 0 ? 0 : state) + stage.buffer_bytes;
  }

  // Whether a stage that draws random numbers runs again: its recompute replays its stash.
  bool replays_random_state() const {
    for (int i = 0; i < length_; ++i) {
      const auto index = static_cast<size_t>(i);
      if (forward_ops_[index] > 1 && chain_.stages[index].random_state_bytes > 0) return true;
    }
    return false;
  }

  bool looks_ahead(int i) const {
    return std::binary_search(schedule_.look_ahead.begin(), schedule_.look_ahead.end(), i);
  }

  const Chain& chain_;
  const Schedule& schedule_;
  int length_;
  std::vector<bool> x_;           // standalone x_i in memory
  std::vector<bool> kept_;        // standalone x_i is a checkpoint
  std::vector<int> xbar_option_;  // option of x̄_i in memory, -1 if absent (index 0 unused)
  std::vector<bool> delta_;       // δ_i in memory
  std::vector<bool> backward_done_;
  std::vector<int> forward_ops_;  // forward ops of each stage in the schedule
  std::vector<bool> forwarded_;   // stage ran a forward already
  int64_t random_held_ = 0;       // random state kept to the step's end
  bool loss_done_ = false;
  int64_t current_ = 0;
  int64_t host_ = 0;  // bytes in host memory
  int index_ = -1;
  const Op* op_ = nullptr;
  SimulationResult result_;
};

}  // namespace

SimulationResult simulate(const Chain& chain, const Schedule& schedule) {
  chain.validate();
  Machine machine(chain, schedule);
  bool ok = std::is_sorted(schedule.look_ahead.begin(), schedule.look_ahead.end());
  if (!ok) {
    SimulationResult result;
    result.valid = false;
    result.error = "the look-ahead's stages must be in increasing order";
    return result;
  }
  for (size_t k = 0; k < schedule.ops.size() && ok; ++k) {
    ok = machine.run(static_cast<int>(k), schedule.ops[k]);
  }
  if (ok) ok = machine.finish();
  SimulationResult result = machine.result();
  result.valid = ok;
  return result;
}

Schedule add_look_ahead(const Chain& chain, Schedule schedule, int64_t budget_bytes) {
  const SimulationResult without = simulate(chain, schedule);
  if (!without.valid) return schedule;
  const int64_t limit = std::max(budget_bytes, without.peak_bytes);
  schedule.look_ahead.clear();
  for (size_t k = 0; k + 1 < schedule.ops.size(); ++k) {
    const Op& op = schedule.ops[k];
    const Op& next = schedule.ops[k + 1];
    if (op.kind != OpKind::Backward || next.kind != OpKind::Backward ||
        next.stage != op.stage - 1 ||
        chain.stages[static_cast<size_t>(next.stage)].option(next.option).offloaded_bytes == 0) {
      continue;
    }
    schedule.look_ahead.push_back(next.stage);
    std::sort(schedule.look_ahead.begin(), schedule.look_ahead.end());
    const SimulationResult with = simulate(chain, schedule);
    if (!with.valid || with.peak_bytes > limit) {
      schedule.look_ahead.erase(
          std::find(schedule.look_ahead.begin(), schedule.look_ahead.end(), next.stage));
    }
  }
  return schedule;
}

}  // namespace plan
}  // namespace ckpt
