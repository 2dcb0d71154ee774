#pragma once

// CheckpointOptions::check_values: a checksum of every operator's outputs, recorded in the forward
// by one dispatch mode and compared in the recompute by another, which names the first operator
// whose outputs differ.

#include "autograd/dispatch_mode.h"

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace ckpt {
namespace detail {

class ReplayMode;
struct KeptOutputs;

/// The storages one run's calls made, held weakly: a storage freed and its address used again is
/// not one of them.
class MadeStorages {
 public:
  void add(const at::Tensor& t) {
    made_.insert_or_assign(storage_of(t), t.storage().getWeakStorageImpl());
  }
  bool contains(const at::Tensor& t) const {
    const auto found = made_.find(storage_of(t));
    return found != made_.end() && found->second.lock().get() == storage_of(t);
  }

 private:
  std::unordered_map<const c10::StorageImpl*, c10::weak_intrusive_ptr<c10::StorageImpl>> made_;
};

/// What the forward recorded of one operator call whose outputs hold values of their own.
struct OutputSums {
  const c10::OperatorName* op = nullptr;
  struct Output {
    uint64_t checksum = 0;
    std::vector<int64_t> sizes;
    c10::ScalarType dtype = c10::ScalarType::Undefined;
    bool forwards_data = false;  // the recompute's: kept data of the forward, not computed again
  };
  std::vector<Output> outputs;  // the call's tensor outputs, in stack order
  /// Where a selective region kept the call's outputs: checksums of the tensors it read without
  /// writing, in argument order, where they came from outside the region (nullopt for data an
  /// earlier call made). The recompute hands a kept output out instead of computing it, so what
  /// its backward reads from outside (a captured tensor written in place after the forward) is
  /// compared here.
  std::vector<std::optional<uint64_t>> outside_reads;
};

/// The operators whose outputs are checksummed: all, or a sample named by the user.
class ValueSample {
 public:
  /// `ops`: "aten::mm" (every overload) or "aten::add.Tensor" (one); empty: every operator.
  explicit ValueSample(std::vector<std::string> ops = {});
  bool sums(const c10::OperatorName& op) const;

 private:
  std::vector<std::string> ops_;
};

/// Records the checksums of each call's outputs (the forward's side), and in a selective region
/// (`kept`: what its caching mode keeps) those of what a call whose outputs it kept read from
/// outside the region.
class ValueRecordingMode : public DispatchMode {
 public:
  ValueRecordingMode(std::vector<OutputSums>& record, ValueSample sample, const KeptOutputs* kept)
      : record_(record), sample_(std::move(sample)), kept_(kept) {}
  void dispatch(const c10::OperatorHandle& op, torch::jit::Stack* stack) override;

 private:
  std::vector<OutputSums>& record_;
  ValueSample sample_;
  const KeptOutputs* kept_;
  MadeStorages made_;
};

/// Compares each call's outputs with what the forward recorded at the same position (the
/// recompute's side), raising an error at the first that differs. Outputs in data `replay` handed
/// out are the forward's own (kept, with the writes it absorbed since): only their shapes are
/// compared, and what the call read from outside the region, where the forward recorded it.
/// `order_may_differ` (the reentrant variant, whose forward ran without grad: a composite
/// operator may decompose otherwise then, `1 / x` writing in place) stops comparing at the first
/// call that is not the forward's, and `diverged` says so: the region's outputs are compared.
class ValueCheckingMode : public DispatchMode {
 public:
  ValueCheckingMode(const std::vector<OutputSums>& record, ValueSample sample,
                    const ReplayMode* replay, bool order_may_differ)
      : record_(record),
        sample_(std::move(sample)),
        replay_(replay),
        order_may_differ_(order_may_differ) {}
  void dispatch(const c10::OperatorHandle& op, torch::jit::Stack* stack) override;
  bool diverged() const { return diverged_; }
  /// Where the recompute's operators parted from the forward's, once they did.
  const std::string& parted() const { return parted_; }

 private:
  const std::vector<OutputSums>& record_;
  ValueSample sample_;
  const ReplayMode* replay_;
  bool order_may_differ_;
  bool diverged_ = false;
  std::string parted_;
  size_t next_ = 0;
  MadeStorages made_;
};

/// Checksums of a region's output tensors, in traversal order (0 where one can't be summed).
std::vector<uint64_t> output_checksums(const std::vector<at::Tensor>& outputs);

}  // namespace detail
}  // namespace ckpt
