#pragma once

/// \file
/// Data-parallel training on c10d, PyTorch's distributed engine, for LibTorch modules trained
/// under any ckpt strategy. CMake target: `ckpt::distributed` (library `ckpt_distributed`).
///
/// Each process (a *rank*) holds a full copy of the model and trains on its share of the batch.
/// `DataParallel` broadcasts rank 0's parameters and buffers at the start, then averages the
/// gradients over the ranks in buckets while the backward pass still runs, through c10d's own
/// `Reducer` (the engine of Python's DistributedDataParallel). After `loss.backward()` every rank
/// holds the same averaged gradients, so the same optimizer step keeps the copies equal.
///
/// Example (a world of one process; start N processes with ranks 0..N-1 for more):
/// ```
/// auto group = ckpt::ProcessGroup::join(ckpt::RendezvousOptions().world_size(1).master_port(0));
/// ckpt::DataParallel parallel(model.ptr(), group);
/// for (...) {
///   parallel.begin_step();
///   auto loss = loss_fn(ckpt::checkpoint_sequential(model, 4, x_of_this_rank), y_of_this_rank);
///   loss.backward();  // gradients averaged over the ranks
///   optimizer.step();
/// }
/// ```

#include <ATen/core/Tensor.h>
#include <torch/arg.h>
#include <torch/nn/module.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ckpt {

/// Where and as whom a process joins a group. Rank 0 serves a TCPStore at
/// `master_addr:master_port`; the others connect to it.
///
/// Example:
/// ```
/// auto options = ckpt::RendezvousOptions().rank(1).world_size(2).master_port(29500);
/// ```
struct RendezvousOptions {
  /// The options `torchrun` sets in the environment: MASTER_ADDR, MASTER_PORT, RANK and
  /// WORLD_SIZE (all four required; the timeout keeps its default). Raises an error naming the
  /// variable that is missing or malformed.
  static RendezvousOptions from_environment();

  /// Address of rank 0's store: an IP address or a host name. Default: "127.0.0.1"
  TORCH_ARG(std::string, master_addr) = "127.0.0.1";
  /// Port of rank 0's store; 0 lets a world of one process pick a free port. Default: 29500
  TORCH_ARG(int, master_port) = 29500;
  /// This process's rank, in [0, world_size). Default: 0
  TORCH_ARG(int, rank) = 0;
  /// How many processes the group has. Default: 1
  TORCH_ARG(int, world_size) = 1;
  /// How long the rendezvous and each collective operation may wait for the other ranks before
  /// failing with an error (a rank that died, a network that broke). Default: 60 s
  TORCH_ARG(std::chrono::milliseconds, timeout) = std::chrono::seconds(60);
};

/// The communication library of a process group.
enum class Backend {
  /// Gloo: CPU tensors, over TCP.
  Gloo,
  /// NCCL: CUDA tensors; needs a LibTorch built with CUDA and NCCL (the `torch` wheel).
  Nccl,
};

/// Whether this build of ckpt can create process groups of `backend`.
bool backend_available(Backend backend);

/// A group of processes joined through a TCPStore, with a Gloo or NCCL backend. Copies share the
/// same group.
class ProcessGroup {
 public:
  /// Joins the group: checks the options (the master address must resolve), rendezvouses through
  /// rank 0's TCPStore (every rank checks that all agree on the world size and that no rank is
  /// taken twice), then creates the backend. Raises an error saying what was wrong when the
  /// address does not resolve, the port is in use, the rank is out of range, the world sizes
  /// disagree, or rank 0 or the other ranks don't answer within the timeout (a rank 0 that accepts
  /// connections but is stopped included).
  /// Ignores SIGPIPE unless the program handles it (docs/distributed.md: a dying peer would
  /// otherwise kill this process through Gloo's socket writes).
  static ProcessGroup join(const RendezvousOptions& options, Backend backend = Backend::Gloo);

  /// This process's rank.
  int rank() const;
  /// The number of processes.
  int world_size() const;
  /// The backend the group was created with.
  Backend backend() const;
  /// The port of rank 0's store (the one picked when joining with port 0).
  int port() const;

  /// Sums `tensor` over the ranks, in place; blocks until done.
  void all_reduce_sum(at::Tensor& tensor) const;
  /// Copies rank `root`'s `tensors` into every rank's, in place; blocks until done.
  void broadcast(std::vector<at::Tensor> tensors, int root = 0) const;
  /// Returns when every rank has called it.
  void barrier() const;
  /// Every rank's `bytes` (of any length), in rank order; blocks until done. For comparing what
  /// the ranks were started with, such as a serialization of their settings.
  std::vector<std::string> all_gather(const std::string& bytes) const;

  struct Impl;
  /// The c10d objects behind the group (src/distributed/process_group_impl.h).
  const std::shared_ptr<Impl>& impl() const { return impl_; }

 private:
  explicit ProcessGroup(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<Impl> impl_;
};

/// Options of `DataParallel`.
struct DataParallelOptions {
  /// Gradient bytes per bucket: a bucket's all-reduce starts as soon as its gradients are all
  /// ready. Default: 25 MiB (as DistributedDataParallel's bucket_cap_mb)
  TORCH_ARG(int64_t, bucket_bytes) = int64_t{25} << 20;
  /// Bytes of the first bucket, small so that the first all-reduce starts early. Default: 1 MiB
  TORCH_ARG(int64_t, first_bucket_bytes) = int64_t{1} << 20;
  /// Allow parameters that get no gradient in some steps (a branch not taken), as
  /// DistributedDataParallel's find_unused_parameters: before each backward, call
  /// `prepare_for_backward(outputs)`, which searches the outputs' graph for the parameters that
  /// will get one. A parameter unused on every rank keeps no gradient for the step; one used on
  /// some ranks gets the average with zeros from the others. Default: false (every parameter must
  /// get its gradient in every step, and no graph is searched)
  TORCH_ARG(bool, find_unused_parameters) = false;
};

/// Data-parallel training of `module` over `group`: gradients averaged in buckets during the
/// backward pass, through c10d's Reducer.
///
/// Works with every ckpt strategy: `checkpoint` (non-reentrant; reentrant too, as long as each
/// parameter is used inside one reentrant region only), `checkpoint_sequential`, `Checkpointed`,
/// `PlannedSequential` and selective checkpointing. Every parameter that requires grad must get
/// its gradient exactly once per step, in one backward pass, unless `find_unused_parameters(true)`
/// allows it none; a parameter whose gradient arrives twice raises an error that says why. That
/// happens under `use_reentrant(true)` when a parameter is used in several regions, or in a region
/// and outside it (a tied weight): each reentrant region accumulates its parameters' gradients in a
/// backward of its own. The default non-reentrant variant delivers each gradient once.
class DataParallel {
 public:
  /// Broadcasts rank 0's parameters and buffers to every rank (after checking that all ranks
  /// have the same parameters: an error on every rank names the first that differs) and sets up
  /// the buckets.
  DataParallel(std::shared_ptr<torch::nn::Module> module, ProcessGroup group,
               DataParallelOptions options = {});
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  /// Call before the forward pass of each training step: the backward that follows averages the
  /// gradients. Raises an error, naming them, when parameters got no gradient in the previous
  /// step without `find_unused_parameters(true)` (that step's gradients were not averaged).
  void begin_step();

  /// With `find_unused_parameters(true)`, call after the forward pass and before the backward,
  /// with the tensors the backward starts from (the loss): finds the parameters their graph does
  /// not reach. Without that option it does nothing.
  ///
  /// Example: `parallel.begin_step(); auto loss = ...; parallel.prepare_for_backward({loss});
  /// loss.backward();`
  void prepare_for_backward(const std::vector<at::Tensor>& outputs);

  /// How many times each parameter (in `module->parameters()` order) had its gradient all-reduced
  /// in the last step: 1 each after a complete backward.
  std::vector<int64_t> reductions() const;
  /// Seconds the last step's all-reduces were in flight, summed over buckets (they overlap the
  /// backward pass and each other, so this is not time added to the step).
  double communication_seconds() const;
  /// The group.
  const ProcessGroup& group() const;

  struct State;

 private:
  std::unique_ptr<State> state_;
};

}  // namespace ckpt
