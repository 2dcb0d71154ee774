#pragma once

// What one grad-enabled forward did, written down so that two forwards can be told apart: each
// operator it called with every argument (a tensor's shape, strides, dtype, device, whether it
// requires grad, and where its data came from: the input, the k-th parameter or buffer, the n-th
// result), and the autograd graph it recorded. The chain profiler measures a stage once and
// reuses the measurement for later stages whose forwards write the same (docs/memory-model.md,
// "Repeated stages").

#include "autograd/dispatch_mode.h"
#include "autograd/value_text.h"

#include <ATen/core/Tensor.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/intrusive_ptr.h>

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace ckpt {
namespace detail {

/// Records a forward's operator calls while it is the innermost dispatch mode of its thread.
/// `input` is the forward's argument, `owned` the parameters and buffers of its modules, in order.
class ForwardRecord : public DispatchMode {
 public:
  ForwardRecord(const at::Tensor& input, const std::vector<at::Tensor>& owned);
  ForwardRecord(const ForwardRecord&) = delete;
  ForwardRecord& operator=(const ForwardRecord&) = delete;
  void dispatch(const c10::OperatorHandle& op, torch::jit::Stack* stack) override;

  /// The record, completed with the forward's `output` and the graph it reaches back to the
  /// input and the parameters; empty where the forward did something the record can't vouch
  /// for: an autograd node other than LibTorch's generated ones (a custom `Function`, whose
  /// backward may depend on what it stashed), a hook on a node, a leaf that isn't the input or
  /// one of `owned`, an argument of a kind it doesn't write down (a generator), a tensor without
  /// strided storage. Two forwards with the same non-empty record run the same operators on
  /// tensors of the same shapes from the same places, and their backwards run the same nodes.
  std::string finish(const at::Tensor& output);

 private:
  void write_graph(const at::Tensor& output);
  int64_t origin_of(const at::Tensor& tensor) const;
  void note_result(const at::Tensor& tensor);

  ValueText text_;  // tensors with where their data came from
  // Where each storage came from: 1 the input, 2 + k the k-th owned tensor, later ones results.
  // The weak references keep a freed storage's address from being reused while it is recorded.
  struct Origin {
    c10::weak_intrusive_ptr<c10::StorageImpl> storage;
    int64_t id = 0;
  };
  std::unordered_map<const c10::StorageImpl*, Origin> origins_;
  std::unordered_map<const c10::TensorImpl*, int64_t> leaves_;  // the input and owned tensors
  int64_t next_id_ = 0;
};

}  // namespace detail
}  // namespace ckpt
