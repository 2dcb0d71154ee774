#include "train_recorder.h"

#include <ckpt/recompute.h>

#include <torch/torch.h>

#include <algorithm>
#include <limits>

namespace ckpt {
namespace cli {

void MemorySampler::start(Clock::time_point origin, int64_t base_bytes) {
  stop();
  samples_.clear();
  samples_.reserve(1 << 16);
  // The first and last samples are taken here and in stop(): on a loaded machine the thread may
  // not run at all during a short step.
  origin_ = origin;
  base_bytes_ = base_bytes;
  sample();
  running_ = true;
  thread_ = std::thread([this] {
    while (running_.load(std::memory_order_relaxed)) {
      std::this_thread::sleep_for(period_);
      sample();
    }
  });
}

std::vector<std::pair<double, int64_t>> MemorySampler::stop() {
  if (thread_.joinable()) {
    running_ = false;
    thread_.join();
    sample();
  }
  return samples_;
}

void MemorySampler::sample() {
  const double seconds = std::chrono::duration<double>(Clock::now() - origin_).count();
  samples_.emplace_back(seconds, tracker_.current_bytes() - base_bytes_);
}

class RecorderObserver : public ExecutionObserver {
 public:
  explicit RecorderObserver(StepRecorder* recorder) : recorder_(recorder) {}
  void on_op_begin(const plan::Op& op) override { recorder_->on_op(op, true); }
  void on_op_end(const plan::Op& op) override { recorder_->on_op(op, false); }

 private:
  StepRecorder* recorder_;
};

StepRecorder::StepRecorder(std::vector<std::string> stage_names)
    : stage_names_(std::move(stage_names)),
      forward_begin_us_(stage_names_.size() + 1, 0.0),
      op_begin_us_(stage_names_.size() + 1, 0.0) {}

double StepRecorder::now_us() const {
  return std::chrono::duration<double, std::micro>(Clock::now() - origin_).count();
}

std::string StepRecorder::stage_label(int stage) const {
  return stage >= 0 && stage < static_cast<int>(stage_names_.size())
             ? stage_names_[static_cast<size_t>(stage)]
             : "loss";
}

// "F3 block.3": the kind of span, the stage and its label. Built by appending, which also keeps
// GCC 12's -Wstringop-overflow false positive on `"F" + std::string` quiet.
std::string StepRecorder::span_name(const std::string& kind, int stage) const {
  std::string name = kind;
  name += std::to_string(stage);
  name += ' ';
  name += stage_label(stage);
  return name;
}

void StepRecorder::begin(Clock::time_point origin) {
  std::lock_guard<std::mutex> lock(mutex_);
  origin_ = origin;
  active_ = true;
  backward_ = false;
  spans_.clear();
  phases_.clear();
  grad_ready_.clear();
}

void StepRecorder::begin_backward() {
  std::lock_guard<std::mutex> lock(mutex_);
  backward_ = true;
  backward_begin_us_ = now_us();
}

void StepRecorder::end() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (active_ && backward_) backward_end_us_ = now_us();
  active_ = false;
}

void StepRecorder::add_phase(const std::string& name, Clock::time_point begin,
                             Clock::time_point end) {
  std::lock_guard<std::mutex> lock(mutex_);
  phases_.push_back({name, "step",
                     std::chrono::duration<double, std::micro>(begin - origin_).count(),
                     std::chrono::duration<double, std::micro>(end - origin_).count()});
}

void StepRecorder::on_forward_begin(int stage) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!active_) return;
  forward_begin_us_[static_cast<size_t>(stage)] = now_us();
}

void StepRecorder::on_forward_end(int stage, const torch::Tensor& output) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!active_) return;
  const bool recompute = backward_ || ckpt::is_recomputing();
  spans_.push_back({span_name(recompute ? "R" : "F", stage), recompute ? "recompute" : "forward",
                    forward_begin_us_[static_cast<size_t>(stage)], now_us()});
  if (torch::GradMode::is_enabled() && output.requires_grad()) {
    // Fires when the gradient of this stage's output arrives: the stage's backward starts.
    const_cast<torch::Tensor&>(output).register_hook([this, stage](const torch::Tensor&) {
      std::lock_guard<std::mutex> hook_lock(mutex_);
      if (active_) grad_ready_.emplace_back(stage + 1, now_us());
    });
  }
}

void StepRecorder::set_peak(Clock::time_point time, nlohmann::json breakdown) {
  std::lock_guard<std::mutex> lock(mutex_);
  peak_us_ = std::chrono::duration<double, std::micro>(time - origin_).count();
  peak_ = std::move(breakdown);
}

std::shared_ptr<ExecutionObserver> StepRecorder::observer() {
  return std::make_shared<RecorderObserver>(this);
}

void StepRecorder::on_op(const plan::Op& op, bool begin) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!active_) return;
  const size_t slot =
      static_cast<size_t>(std::min<int>(op.stage, static_cast<int>(stage_names_.size())));
  if (begin) {
    op_begin_us_[slot] = now_us();
    return;
  }
  std::string category;
  switch (op.kind) {
    case plan::OpKind::Backward:
      category = "backward";
      break;
    case plan::OpKind::Loss:
      category = "loss";
      break;
    default:
      category = backward_ ? "recompute" : "forward";
  }
  spans_.push_back(
      {plan::to_string(op) + " " + stage_label(op.stage), category, op_begin_us_[slot], now_us()});
}

void StepRecorder::write_to(ChromeTrace& trace, int pid, const std::string& name,
                            const std::vector<std::pair<double, int64_t>>& memory) const {
  std::lock_guard<std::mutex> lock(mutex_);
  trace.set_process_name(pid, name);
  trace.set_thread_name(pid, 0, "step");
  trace.set_thread_name(pid, 1, "stages");
  for (const Span& span : phases_) {
    trace.add_span(pid, 0, span.name, span.category, span.begin_us, span.end_us);
  }
  for (const Span& span : spans_) {
    trace.add_span(pid, 1, span.name, span.category, span.begin_us, span.end_us);
  }
  // Backward spans from gradient hooks: stage i's backward runs from the arrival of the gradient
  // of its output until the next event of the chain (the gradient of its input, or a recompute
  // that starts), or the end of the backward pass.
  std::vector<double> boundaries;
  for (const auto& event : grad_ready_) boundaries.push_back(event.second);
  for (const Span& span : spans_) {
    if (span.category == "recompute") boundaries.push_back(span.begin_us);
  }
  boundaries.push_back(backward_end_us_);
  std::sort(boundaries.begin(), boundaries.end());
  std::vector<bool> seen(stage_names_.size() + 2, false);
  for (const auto& [index, time] : grad_ready_) {
    const int stage = index - 1;
    if (stage < 0 || seen[static_cast<size_t>(index)]) continue;
    seen[static_cast<size_t>(index)] = true;
    const auto next = std::upper_bound(boundaries.begin(), boundaries.end(), time);
    const double end = next == boundaries.end() ? backward_end_us_ : *next;
    trace.add_span(pid, 1, span_name("B", stage), "backward", time, end);
  }
  for (const auto& [seconds, bytes] : memory)
    trace.add_counter(pid, "memory", seconds * 1e6, bytes);
  if (peak_us_ >= 0) trace.add_instant(pid, "memory peak", peak_us_, peak_);
}

}  // namespace cli
}  // namespace ckpt
