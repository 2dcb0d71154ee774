#include "process_group_impl.h"

#include <ATen/core/ivalue.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/csrc/distributed/c10d/comm.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>

#include <atomic>

#include <chrono>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

namespace ckpt {
namespace {

using Clock = std::chrono::steady_clock;

// What the all-reduces of a step did: how often each parameter was reduced, and for how long
// all-reduces were in flight. Shared by the communication hook (the Reducer's threads) and
// DataParallel.
class ReductionLog {
 public:
  explicit ReductionLog(const std::vector<at::Tensor>& params) : counts_(params.size(), 0) {
    for (size_t i = 0; i < params.size(); ++i) index_[params[i].unsafeGetTensorImpl()] = i;
  }

  void reset() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::fill(counts_.begin(), counts_.end(), 0);
    seconds_ = 0;
  }

  void count(const std::vector<at::Tensor>& params) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& param : params) {
      const auto found = index_.find(param.unsafeGetTensorImpl());
      TORCH_INTERNAL_ASSERT(found != index_.end(),
                            "a bucket holds a parameter DataParallel does "
                            "not know");
      ++counts_[found->second];
    }
  }

  void add_seconds(double seconds) {
    std::lock_guard<std::mutex> lock(mutex_);
    seconds_ += seconds;
  }

  std::vector<int64_t> counts() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return counts_;
  }

  double seconds() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return seconds_;
  }

 private:
  mutable std::mutex mutex_;
  std::unordered_map<const void*, size_t> index_;
  std::vector<int64_t> counts_;
  double seconds_ = 0;
};

struct HookState {
  compat::GroupPtr group;
  int rank = 0;
  int world_size = 1;
  std::shared_ptr<ReductionLog> log;
};

// The Reducer's default reduction (divide the bucket by the world size, all-reduce it
// asynchronously), which also logs what it reduced and for how long, and turns a failed
// all-reduce (a rank that died, a timeout) into an error that says what happened.
class LoggingAllReduce : public c10d::CommHookInterface {
 public:
  explicit LoggingAllReduce(HookState state) : state_(std::move(state)) {}

  // The future's value is what the all-reduce produced: the bucket, alone or in a list. (Not
  // CppCommHookInterface, whose parser Debian's 1.13 keeps out of libtorch_cpu.)
  at::Tensor parseHookResult(const c10::IValue& result) override {
    TORCH_INTERNAL_ASSERT(result.isTensor() || result.isTensorList(),
                          "ckpt::DataParallel: an all-reduce returned neither a tensor nor a list "
                          "of tensors");
    return result.isTensor() ? result.toTensor() : result.toTensorVector().at(0);
  }

  c10::intrusive_ptr<c10::ivalue::Future> runHook(c10d::GradBucket& bucket) override {
    state_.log->count(bucket.getParameters());
    std::vector<at::Tensor> tensors{bucket.getBufferRef()};
    tensors[0].div_(state_.world_size);
    const Clock::time_point start = Clock::now();
    auto future = state_.group->allreduce(tensors)->getFuture();
    const auto type = future->elementType();
    return future->then(
        [log = state_.log, start, rank = state_.rank,
         index = bucket.getIndex()](c10::ivalue::Future& done) -> c10::IValue {
          log->add_seconds(std::chrono::duration<double>(Clock::now() - start).count());
          TORCH_CHECK(
              !done.hasError(), "ckpt::DataParallel: on rank ", rank,
              ", the all-reduce of gradient bucket #", index,
              " failed: another rank has probably died or lost its connection, or did "
              "not reach this step within the group's timeout (RendezvousOptions::timeout). "
              "The training cannot go on; restart every rank. The process group said: ",
              first_line(done.tryRetrieveErrorMessage()));
          return done.value();
        },
        type);
  }

 private:
  HookState state_;

  static std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }
};

// How many times each parameter's gradient accumulator ran since begin_step. The Reducer expects
// exactly one run per step; a second one would reduce a partial gradient. This check runs first
// (its hooks are registered before the Reducer's), so the error can say what ckpt users did.
class Arrivals {
 public:
  explicit Arrivals(const std::vector<at::Tensor>& params)
      : counts_(params.size()), shapes_(params.size()) {
    for (size_t i = 0; i < params.size(); ++i) shapes_[i] = params[i].sizes().vec();
  }

  // Counts from begin_step until every parameter has arrived once; backward passes outside
  // (a profiler's, before the first step) are not the Reducer's business.
  void arm() {
    for (auto& count : counts_) count.store(0);
    missing_.store(static_cast<int64_t>(counts_.size()));
    armed_.store(true);
  }

  void arrive(size_t index) {
    if (!armed_.load()) return;
    const int previous = counts_[index].fetch_add(1);
    TORCH_CHECK(previous == 0, "ckpt::DataParallel: parameter #", index, " (shape ",
                c10::IntArrayRef(shapes_[index]),
                ") received its gradient a second time in one backward pass, so data-parallel "
                "training would reduce a partial gradient. With "
                "CheckpointOptions().use_reentrant(true), each checkpointed region accumulates "
                "the gradients of its parameters in a backward pass of its own: a parameter used "
                "in several regions, or in a region and outside it (a tied weight), arrives "
                "once per use. Use the default non-reentrant checkpoint, which delivers each "
                "gradient once, or keep each parameter inside one reentrant region.");
    if (missing_.fetch_sub(1) == 1) armed_.store(false);
  }

 private:
  std::vector<std::atomic<int>> counts_;
  std::vector<std::vector<int64_t>> shapes_;
  std::atomic<int64_t> missing_{0};
  std::atomic<bool> armed_{false};
};

class ArrivalHook : public torch::autograd::FunctionPostHook {
 public:
  ArrivalHook(std::shared_ptr<Arrivals> arrivals, size_t index)
      : arrivals_(std::move(arrivals)), index_(index) {}

  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    arrivals_->arrive(index_);
    return outputs;
  }

 private:
  std::shared_ptr<Arrivals> arrivals_;
  size_t index_;
};

// Each tensor once: a tied weight registered in two modules is one tensor.
std::vector<at::Tensor> unique(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> result;
  std::unordered_map<const void*, bool> seen;
  for (const auto& tensor : tensors) {
    if (seen.emplace(tensor.unsafeGetTensorImpl(), true).second) result.push_back(tensor);
  }
  return result;
}

// The parameters to reduce.
std::vector<at::Tensor> trained_parameters(const torch::nn::Module& module) {
  std::vector<at::Tensor> params;
  for (const auto& param : unique(module.parameters())) {
    if (param.requires_grad()) params.push_back(param);
  }
  return params;
}

}  // namespace

struct DataParallel::State {
  State(std::shared_ptr<torch::nn::Module> module_, ProcessGroup group_,
        DataParallelOptions options_)
      : module(std::move(module_)), group(std::move(group_)), options(options_) {}

  std::shared_ptr<torch::nn::Module> module;
  ProcessGroup group;
  DataParallelOptions options;
  std::vector<at::Tensor> params;
  std::shared_ptr<ReductionLog> log;
  std::shared_ptr<Arrivals> arrivals;
  // Held so that the accumulators, and the hooks on them, live as long as this state.
  std::vector<decltype(torch::autograd::impl::grad_accumulator(at::Tensor()))> accumulators;
  std::shared_ptr<c10d::Reducer> reducer;
  bool first_step = true;
};

namespace {

void check_arguments(const std::vector<at::Tensor>& params, const DataParallelOptions& options) {
  TORCH_CHECK(!params.empty(),
              "ckpt::DataParallel: the module has no parameter that requires "
              "grad, so there is nothing to train in parallel.");
  TORCH_CHECK(options.bucket_bytes() > 0 && options.first_bucket_bytes() > 0,
              "ckpt::DataParallel: bucket sizes must be positive, but got bucket_bytes=",
              options.bucket_bytes(), " and first_bucket_bytes=", options.first_bucket_bytes());
  for (const auto& param : params) {
    TORCH_CHECK(!param.is_sparse(), "ckpt::DataParallel: sparse parameters are not supported");
  }
}

// Every rank starts from rank 0's weights and buffers (running statistics and the like).
void broadcast_state(const torch::nn::Module& module, const ProcessGroup& group,
                     const std::vector<at::Tensor>& params) {
  c10d::verify_params_across_processes(group.impl()->group, params, /*logger=*/{});
  std::vector<at::Tensor> state = module.parameters();
  for (const auto& buffer : module.buffers()) state.push_back(buffer);
  const at::NoGradGuard no_grad;
  group.broadcast(unique(state), /*root=*/0);
}

}  // namespace

DataParallel::DataParallel(std::shared_ptr<torch::nn::Module> module, ProcessGroup group,
                           DataParallelOptions options)
    : state_(std::make_unique<State>(std::move(module), std::move(group), options)) {
  State& state = *state_;
  TORCH_CHECK(state.module != nullptr,
              "ckpt::DataParallel: the module is null. Pass a module, "
              "such as model.ptr() for a module holder.");
  state.params = trained_parameters(*state.module);
  check_arguments(state.params, options);
  broadcast_state(*state.module, state.group, state.params);
  state.log = std::make_shared<ReductionLog>(state.params);
  state.arrivals = std::make_shared<Arrivals>(state.params);
  for (size_t i = 0; i < state.params.size(); ++i) {
    state.accumulators.push_back(torch::autograd::impl::grad_accumulator(state.params[i]));
    state.accumulators.back()->add_post_hook(std::make_unique<ArrivalHook>(state.arrivals, i));
  }
  state.reducer = compat::make_reducer(state.params, state.group.impl()->group,
                                       options.bucket_bytes(), options.first_bucket_bytes());
  state.reducer->register_comm_hook(std::make_unique<LoggingAllReduce>(HookState{
      state.group.impl()->group, state.group.rank(), state.group.world_size(), state.log}));
}

DataParallel::~DataParallel() = default;

void DataParallel::begin_step() {
  State& state = *state_;
  TORCH_CHECK(at::GradMode::is_enabled(),
              "ckpt::DataParallel::begin_step: gradients are disabled (NoGradGuard); a training "
              "step needs them. Call begin_step only before a forward pass that will be "
              "differentiated.");
  // After the first step, the buckets follow the order in which the gradients became ready
  // (DistributedDataParallel does the same); rank 0's order is broadcast to all.
  if (!state.first_step) state.reducer->rebuild_buckets();
  state.log->reset();
  state.arrivals->arm();
  state.reducer->prepare_for_forward();
  state.reducer->prepare_for_backward({});
  state.first_step = false;
}

std::vector<int64_t> DataParallel::reductions() const {
  return state_->log->counts();
}

double DataParallel::communication_seconds() const {
  return state_->log->seconds();
}

const ProcessGroup& DataParallel::group() const {
  return state_->group;
}

}  // namespace ckpt
