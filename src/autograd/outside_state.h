#pragma once

// State a function changes that ckpt was not told about: the running statistics of a TorchScript
// module, or of a C++ module a lambda captures. A region's forward keeps what it read of it and
// wrote, as it was before the write, so that a recompute reads the same values; every recompute
// puts the state back afterwards, so it changes once per step, as without checkpointing. The chain
// profiler refuses stages that write it.

#include "dispatch_mode.h"
#include "rng_state.h"
#include "version_snapshot.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Storage.h>

#include <functional>
#include <memory>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace torch {
namespace nn {
class Module;
}  // namespace nn
}  // namespace torch

namespace ckpt {
namespace detail {

/// Tensors from outside a region as they were at one moment: the bytes of their storages, and
/// where each written tensor lay in its storage (`set_` and `resize_` change that).
class OutsideState {
 public:
  bool empty() const { return storages_.empty() && tensors_.empty(); }
  /// Writes the bytes and places back, through aliases of their own, so that no tensor's version
  /// counter moves (a recompute's graph may have saved one); a tensor given another place takes
  /// its own back.
  void put_back() const;
  /// The same tensors as they are now.
  OutsideState now() const;

  class Swap;

 private:
  friend class OutsideStateWatch;
  struct Bytes {
    at::Tensor alias;   // all the storage's bytes, through a tensor of its own
    at::Tensor values;  // their copy
  };
  struct Place {
    at::Tensor tensor;  // the written tensor itself
    c10::Storage storage;
    int64_t offset = 0;
    std::vector<int64_t> sizes, strides;
    size_t bytes = 0;  // its storage's entry in `storages_` when first written
  };
  size_t add_bytes(const at::Tensor& tensor);
  void add_place(const at::Tensor& tensor, size_t bytes);
  std::vector<Bytes> storages_;
  std::vector<Place> tensors_;
};

/// While alive, the state as a forward found it (`at_forward`); then the state as it was.
class OutsideState::Swap {
 public:
  explicit Swap(const OutsideState& at_forward);
  ~Swap();
  Swap(const Swap&) = delete;
  Swap& operator=(const Swap&) = delete;

 private:
  OutsideState before_swap_;
};

/// A dispatch mode that copies, before an operator first writes into it, every tensor that
/// doesn't require grad and that neither an operator under the mode created nor `known` holds
/// (the region's arguments, the parameters and buffers of its modules, which the region handles
/// itself). Written: marked so in the operator's schema, or any tensor argument of a batch or
/// instance normalization (native_batch_norm writes its running statistics without the mark).
///
/// Around a recompute (`PutBack`) it writes the copies back when destroyed, also when an exception
/// leaves the scope: what the recompute changes outside the region stays as the forward left it,
/// whichever module, captured by whichever lambda, the call site ran this time. Around a forward
/// (`Keep`), `finished` hands over the copies of what an operator read before or after the
/// forward's first write into it (or what the writing operator computed fresh results from), for
/// the recompute to start from; a forward that does not finish (an exception) puts everything
/// back.
class OutsideStateWatch : public DispatchMode {
 public:
  enum class Purpose { PutBack, Keep };
  /// Called with each operator call just before it runs (a region's forward lets go of its
  /// graph there: one mode on every call instead of two).
  using BeforeCall = std::function<void(const c10::OperatorHandle&, const torch::jit::Stack&)>;

  /// Called with the data of a module's buffer an operator is about to write into, each write
  /// (a write through `.data()` included, which moves no version counter).
  using BeforeBufferWrite = std::function<void(const c10::StorageImpl*)>;

  /// `before_buffer_write`, where given: told of each write into the modules' buffers.
  OutsideStateWatch(const std::vector<at::Tensor>& known,
                    const std::vector<std::shared_ptr<torch::nn::Module>>& modules,
                    Purpose purpose = Purpose::PutBack, BeforeCall before_call = nullptr,
                    BeforeBufferWrite before_buffer_write = nullptr);
  ~OutsideStateWatch() override;
  OutsideStateWatch(const OutsideStateWatch&) = delete;
  OutsideStateWatch& operator=(const OutsideStateWatch&) = delete;

  void dispatch(const c10::OperatorHandle& op, torch::jit::Stack* stack) override;
  /// `Keep`: the forward returned. What it wrote and read again, as it was before the write.
  OutsideState finished();
  /// `Keep`, once the forward returned (once): the tensors from outside the region (neither its
  /// arguments, nor its modules' parameters, nor written by it) and its modules' buffers it did
  /// not write that its operators read, at their versions now. A recompute reads them again: a
  /// write into one before it changes what it computes.
  ReadVersions take_reads();
  /// Whether an operator wrote into outside state so far.
  bool saw_writes() const { return !written_.empty(); }
  /// The default generators that random operators under the mode drew from (a generator is
  /// outside state too, which the region's RNG stash handles).
  RandomDraws random_draws() const { return draws_; }

 private:
  // Copies `tensor` before its first write; returns its storage's entry, or -1 (not outside).
  int64_t see(const at::Tensor& tensor);
  // `Keep`: an operator reads `tensor`; where it is outside state, written before or after, the
  // recompute must find it as the forward did.
  void note_read(const at::Tensor& tensor, const c10::OperatorHandle& op);

  const Purpose purpose_;
  BeforeCall before_call_;
  BeforeBufferWrite before_buffer_write_;
  bool finished_ = false;
  std::unordered_set<const c10::StorageImpl*> inside_;  // created under the mode, or known
  OutsideState before_;
  // Each copied storage's and tensor's entry in `before_`, and (`Keep`) whether an operator read
  // the storage's entry after the write.
  std::unordered_map<const c10::StorageImpl*, size_t> written_;
  std::unordered_map<const c10::TensorImpl*, size_t> placed_;
  std::vector<bool> read_again_;
  std::unordered_set<const c10::StorageImpl*> read_before_;  // `Keep`: outside, read, not written
  // `Keep`: every outside tensor an operator read, whether or not it requires grad (the reentrant
  // variant finds no border in a graph to check those by), with its storage and how to name it.
  struct Read {
    c10::VariableVersion counter;
    const c10::StorageImpl* storage;
    std::vector<int64_t> sizes;
    std::string reader;
  };
  std::vector<Read> reads_;
  // The region's modules' buffers, and (`Keep`) those an operator wrote.
  std::unordered_set<const c10::StorageImpl*> buffers_, written_buffers_;
  std::unordered_set<const c10::TensorImpl*> read_tensors_;
  RandomDraws draws_;
};

/// Whether `op` is a normalization that updates running statistics in place, which some of their
/// schemas do not mark as written (native_batch_norm's running_mean and running_var in 1.13).
bool updates_running_statistics(const c10::OperatorHandle& op);

}  // namespace detail
}  // namespace ckpt
