#include "process_group_impl.h"

#include <ATen/core/ivalue.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/csrc/distributed/c10d/comm.hpp>
#include <torch/csrc/distributed/c10d/logger.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>

#include <atomic>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <sstream>
#include <string>
#include <unordered_map>
#include <unordered_set>
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

// A parameter as the errors name it: 'name' (#index, shape [..]).
struct ParamInfo {
  std::string name;
  std::vector<int64_t> shape;
};

std::string describe(const std::vector<ParamInfo>& infos, size_t index) {
  std::ostringstream text;
  text << "'" << infos[index].name << "' (#" << index << ", shape "
       << c10::IntArrayRef(infos[index].shape) << ")";
  return text.str();
}

// How many times each parameter's gradient accumulator ran since begin_step. The Reducer expects
// exactly one run per step; a second one would reduce a partial gradient. This check runs first
// (its hooks are registered before the Reducer's), so the error can say what ckpt users did.
// With find_unused_parameters, it also checks that prepare_for_backward came first and found the
// parameter.
class Arrivals {
 public:
  explicit Arrivals(std::vector<ParamInfo> infos)
      : infos_(std::move(infos)), counts_(infos_.size()), reachable_(infos_.size(), 1) {}

  // Counts from begin_step until every parameter has arrived once; backward passes outside
  // (a profiler's, before the first step) are not the Reducer's business. `search` tells that
  // prepare_for_backward must come before any arrival.
  void arm(bool search) {
    for (auto& count : counts_) count.store(0);
    missing_.store(static_cast<int64_t>(counts_.size()));
    searched_.store(!search);
    armed_.store(true);
  }

  // prepare_for_backward's search: which parameters the outputs' graph leads to.
  void searched(std::vector<char> reachable) {
    reachable_ = std::move(reachable);
    searched_.store(true);
  }

  void arrive(size_t index) {
    if (!armed_.load()) return;
    TORCH_CHECK(searched_.load(), "ckpt::DataParallel: parameter ", describe(infos_, index),
                " got its gradient before prepare_for_backward was called. With "
                "DataParallelOptions().find_unused_parameters(true), call "
                "prepare_for_backward({loss}) after each forward pass and before its backward.");
    TORCH_CHECK(reachable_[index], "ckpt::DataParallel: parameter ", describe(infos_, index),
                " received a gradient, but the graph of the outputs given to "
                "prepare_for_backward does not lead to it, so find_unused_parameters counted it "
                "as unused. A checkpointed region with use_reentrant(true) hides its parameters "
                "from that graph: use the default non-reentrant checkpoint, or pass every tensor "
                "the backward starts from.");
    const int previous = counts_[index].fetch_add(1);
    TORCH_CHECK(previous == 0, "ckpt::DataParallel: parameter ", describe(infos_, index),
                " received its gradient a second time in one backward pass, so data-parallel "
                "training would reduce a partial gradient. With "
                "CheckpointOptions().use_reentrant(true), each checkpointed region accumulates "
                "the gradients of its parameters in a backward pass of its own: a parameter used "
                "in several regions, or in a region and outside it (a tied weight), arrives "
                "once per use. Use the default non-reentrant checkpoint, which delivers each "
                "gradient once, or keep each parameter inside one reentrant region.");
    if (missing_.fetch_sub(1) == 1) armed_.store(false);
  }

  // After a backward that gave some parameters a gradient but not all: the others, described.
  std::string missing() const {
    if (!armed_.load() || missing_.load() == static_cast<int64_t>(counts_.size())) return "";
    std::string text;
    int listed = 0;
    for (size_t i = 0; i < counts_.size(); ++i) {
      if (counts_[i].load() != 0) continue;
      if (listed++ < 5) text += (text.empty() ? "" : ", ") + describe(infos_, i);
    }
    if (listed > 5) text += " and " + std::to_string(listed - 5) + " more";
    return text;
  }

 private:
  std::vector<ParamInfo> infos_;
  std::vector<std::atomic<int>> counts_;
  std::vector<char> reachable_;  // written by prepare_for_backward, before the backward
  std::atomic<int64_t> missing_{0};
  std::atomic<bool> armed_{false};
  std::atomic<bool> searched_{true};
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

// The parameters to reduce, each once (a tied weight under its first name).
std::vector<at::Tensor> trained_parameters(const torch::nn::Module& module,
                                           std::vector<ParamInfo>* infos) {
  std::vector<at::Tensor> params;
  std::unordered_map<const void*, bool> seen;
  for (const auto& item : module.named_parameters()) {
    const at::Tensor& param = item.value();
    if (!param.requires_grad() || !seen.emplace(param.unsafeGetTensorImpl(), true).second) continue;
    params.push_back(param);
    infos->push_back({item.key(), param.sizes().vec()});
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
  // The Reducer reports to it (its unused-parameter search needs one), as in Python's DDP.
  std::shared_ptr<c10d::Logger> logger;
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

// One line per parameter: what must agree between the ranks (dtype, sizes, strides), then a tab
// and its name.
std::string model_signature(const std::vector<at::Tensor>& params,
                            const std::vector<ParamInfo>& infos) {
  std::ostringstream text;
  for (size_t i = 0; i < params.size(); ++i) {
    text << params[i].scalar_type() << " " << params[i].sizes() << " strides "
         << params[i].strides() << "\t" << infos[i].name << "\n";
  }
  return text.str();
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream stream(text);
  for (std::string line; std::getline(stream, line);) lines.push_back(line);
  return lines;
}

// What rank `rank` has as parameter #index, for the error.
std::string parameter_text(const std::vector<std::string>& lines, size_t index, int rank) {
  if (index >= lines.size()) {
    return "rank " + std::to_string(rank) + " has no parameter #" + std::to_string(index) +
           " (it has " + std::to_string(lines.size()) + ")";
  }
  const std::string& line = lines[index];
  const size_t tab = line.find('\t');
  return "rank " + std::to_string(rank) + " has '" + line.substr(tab + 1) + "' " +
         line.substr(0, tab);
}

// Every rank compares every rank's parameters with rank 0's, so that all raise the same error
// (as DistributedDataParallel's check, but before any rank goes on to the broadcast, which would
// leave rank 0 with Gloo's message about a closed connection).
void check_same_model(const ProcessGroup& group, const std::vector<at::Tensor>& params,
                      const std::vector<ParamInfo>& infos) {
  const std::vector<std::string> all = group.all_gather(model_signature(params, infos));
  const std::vector<std::string> reference = lines_of(all[0]);
  for (int rank = 1; rank < group.world_size(); ++rank) {
    const std::vector<std::string> theirs = lines_of(all[static_cast<size_t>(rank)]);
    for (size_t i = 0; i < std::max(reference.size(), theirs.size()); ++i) {
      const auto key = [i](const std::vector<std::string>& lines) {
        return i < lines.size() ? lines[i].substr(0, lines[i].find('\t')) : std::string();
      };
      TORCH_CHECK(key(reference) == key(theirs),
                  "ckpt::DataParallel: the ranks' models differ: parameter #", i, ": ",
                  parameter_text(reference, i, 0), ", but ", parameter_text(theirs, i, rank),
                  " (parameters that require grad, in module order). Build the same model on "
                  "every rank: the same options, sizes and dtype.");
    }
  }
}

// Every rank starts from rank 0's weights and buffers (running statistics and the like).
void broadcast_state(const torch::nn::Module& module, const ProcessGroup& group) {
  std::vector<at::Tensor> state = module.parameters();
  for (const auto& buffer : module.buffers()) state.push_back(buffer);
  const at::NoGradGuard no_grad;
  group.broadcast(unique(state), /*root=*/0);
}

// The nodes of the autograd graph that `outputs` lead to.
std::unordered_set<const torch::autograd::Node*> graph_of(const std::vector<at::Tensor>& outputs) {
  std::unordered_set<const torch::autograd::Node*> seen;
  std::vector<torch::autograd::Node*> stack;
  for (const auto& output : outputs) {
    if (!output.defined() || !output.requires_grad()) continue;
    const auto edge = torch::autograd::impl::gradient_edge(output);
    if (edge.function) stack.push_back(edge.function.get());
  }
  while (!stack.empty()) {
    torch::autograd::Node* node = stack.back();
    stack.pop_back();
    if (!seen.insert(node).second) continue;
    for (const auto& edge : node->next_edges()) {
      if (edge.function) stack.push_back(edge.function.get());
    }
  }
  return seen;
}

}  // namespace

DataParallel::DataParallel(std::shared_ptr<torch::nn::Module> module, ProcessGroup group,
                           DataParallelOptions options)
    : state_(std::make_unique<State>(std::move(module), std::move(group), options)) {
  State& state = *state_;
  TORCH_CHECK(state.module != nullptr,
              "ckpt::DataParallel: the module is null. Pass a module, "
              "such as model.ptr() for a module holder.");
  std::vector<ParamInfo> infos;
  state.params = trained_parameters(*state.module, &infos);
  check_arguments(state.params, options);
  check_same_model(state.group, state.params, infos);
  broadcast_state(*state.module, state.group);
  state.log = std::make_shared<ReductionLog>(state.params);
  state.arrivals = std::make_shared<Arrivals>(std::move(infos));
  for (size_t i = 0; i < state.params.size(); ++i) {
    state.accumulators.push_back(torch::autograd::impl::grad_accumulator(state.params[i]));
    state.accumulators.back()->add_post_hook(std::make_unique<ArrivalHook>(state.arrivals, i));
  }
  state.reducer =
      compat::make_reducer(state.params, state.group.impl()->group, options.bucket_bytes(),
                           options.first_bucket_bytes(), options.find_unused_parameters());
  state.logger = std::make_shared<c10d::Logger>(state.reducer);
  state.reducer->set_logger(state.logger);
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
  const bool search = state.options.find_unused_parameters();
  // The Reducer would say the same in Python's terms (rebuild_buckets checks it).
  const std::string missing = search ? "" : state.arrivals->missing();
  TORCH_CHECK(missing.empty(), "ckpt::DataParallel: in the previous step, these parameters got no ",
              "gradient: ", missing,
              ". So their gradient buckets were never all-reduced, and that step's gradients were "
              "not averaged over the ranks: the replicas have diverged; restart the ranks. If "
              "some parameters go unused in a step, construct DataParallel with "
              "DataParallelOptions().find_unused_parameters(true) and call "
              "prepare_for_backward({loss}) before each backward; parameters that are never "
              "trained need requires_grad(false).");
  // After the first step, the buckets follow the order in which the gradients became ready
  // (DistributedDataParallel does the same); rank 0's order is broadcast to all.
  if (!state.first_step) state.reducer->rebuild_buckets();
  state.log->reset();
  state.arrivals->arm(search);
  state.reducer->prepare_for_forward();
  if (!search) state.reducer->prepare_for_backward({});
  state.first_step = false;
}

void DataParallel::prepare_for_backward(const std::vector<at::Tensor>& outputs) {
  State& state = *state_;
  if (!state.options.find_unused_parameters()) return;
  const auto graph = graph_of(outputs);
  std::vector<char> reachable(state.params.size());
  for (size_t i = 0; i < state.params.size(); ++i) {
    reachable[i] = graph.count(state.accumulators[i].get()) != 0;
  }
  state.reducer->prepare_for_backward(outputs);
  state.arrivals->searched(std::move(reachable));
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
