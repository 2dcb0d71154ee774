#include "autograd/forward_record.h"

#include "compat/torch_compat.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Type.h>
#include <torch/csrc/autograd/edge.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/variable.h>

#include <cstring>
#include <typeinfo>

namespace ckpt {
namespace detail {
namespace {

using torch::autograd::Edge;
using torch::autograd::Node;

// LibTorch's own derivatives: their backward is a function of the operator and the arguments the
// forward recorded, nothing else.
bool is_generated(const Node& node) {
  static const std::string generated = "torch::autograd::generated::";
  return c10::demangle(typeid(node).name()).compare(0, generated.size(), generated) == 0;
}

}  // namespace

ForwardRecord::ForwardRecord(const at::Tensor& input, const std::vector<at::Tensor>& owned)
    : next_id_(2 + static_cast<int64_t>(owned.size())) {
  auto add = [&](const at::Tensor& tensor, int64_t id) {
    if (!tensor.defined()) return;
    leaves_.emplace(tensor.unsafeGetTensorImpl(), id);
    if (!tensor.has_storage()) return;
    const c10::Storage& storage = tensor.storage();
    origins_.emplace(storage.unsafeGetStorageImpl(), Origin{storage.getWeakStorageImpl(), id});
  };
  add(input, 1);
  for (size_t k = 0; k < owned.size(); ++k) add(owned[k], 2 + static_cast<int64_t>(k));
}

template <class T>
void ForwardRecord::write(const T& word) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &word, sizeof(T));
  record_.append(bytes, sizeof(T));
}

int64_t ForwardRecord::origin_of(const at::Tensor& tensor) const {
  const auto found = origins_.find(tensor.storage().unsafeGetStorageImpl());
  if (found == origins_.end() || found->second.storage.expired()) return 0;  // from outside
  return found->second.id;
}

void ForwardRecord::note_result(const at::Tensor& tensor) {
  if (!tensor.has_storage()) return;
  const c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
  const auto found = origins_.find(storage);
  if (found != origins_.end() && !found->second.storage.expired()) return;  // a view, or in place
  origins_.insert_or_assign(storage, Origin{tensor.storage().getWeakStorageImpl(), next_id_++});
}

void ForwardRecord::write_tensor(const at::Tensor& tensor) {
  write('T');
  write(tensor.defined());
  if (!tensor.defined()) return;
  if (tensor.layout() != c10::kStrided || !tensor.has_storage()) {
    comparable_ = false;
    return;
  }
  write(static_cast<int>(tensor.scalar_type()));
  write(static_cast<int>(tensor.device().type()));
  write(static_cast<int>(tensor.device().index()));
  write(tensor.dim());
  for (const int64_t size : tensor.sizes()) write(size);
  for (const int64_t stride : tensor.strides()) write(stride);
  write(tensor.storage_offset());
  write(static_cast<int64_t>(tensor.storage().nbytes()));
  write(tensor.requires_grad());
  write(origin_of(tensor));
}

void ForwardRecord::write_value(const c10::IValue& value) {
  if (value.isTensor()) {
    write_tensor(value.toTensor());
  } else if (value.isNone()) {
    write('n');
  } else if (value.isBool()) {
    write('b');
    write(value.toBool());
  } else if (value.isInt()) {
    write('i');
    write(value.toInt());
  } else if (value.isDouble()) {
    write('d');
    write(value.toDouble());
  } else if (value.isComplexDouble()) {
    write('c');
    write(value.toComplexDouble().real());
    write(value.toComplexDouble().imag());
  } else if (value.isString()) {
    write('s');
    write(value.toStringRef().size());
    record_.append(value.toStringRef());
  } else if (value.isDevice()) {
    write('v');
    write(static_cast<int>(value.toDevice().type()));
    write(static_cast<int>(value.toDevice().index()));
  } else if (value.isList()) {
    write('L');
    write(value.toListRef().size());
    for (const c10::IValue& element : value.toListRef()) write_value(element);
  } else if (value.isTuple()) {
    write('U');
    write(value.toTupleRef().elements().size());
    for (const c10::IValue& element : value.toTupleRef().elements()) write_value(element);
  } else {
    comparable_ = false;  // a generator, an object: state the record can't see into
  }
}

void ForwardRecord::dispatch(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  write('O');
  const std::string name = operator_label(op.operator_name());
  write(name.size());
  record_.append(name);
  const size_t arguments = op.schema().arguments().size();
  for (size_t a = stack->size() - arguments; a < stack->size(); ++a) write_value((*stack)[a]);
  run(op, stack);
  const size_t returns = op.schema().returns().size();
  for (size_t r = stack->size() - returns; r < stack->size(); ++r) {
    for_each_tensor((*stack)[r], [&](const at::Tensor& result) { note_result(result); });
  }
  for (size_t r = stack->size() - returns; r < stack->size(); ++r) write_value((*stack)[r]);
}

// The nodes in the order a walk from the output first meets them, each with its edges (to which
// node, which of its inputs): the same graph gives the same words.
void ForwardRecord::write_graph(const at::Tensor& output) {
  std::unordered_map<const Node*, int64_t> index;
  std::vector<Node*> pending;
  auto meet = [&](const Edge& edge) {
    write(edge.is_valid());
    if (!edge.is_valid()) return;
    write(static_cast<int64_t>(edge.input_nr));
    const auto [at, first] = index.emplace(edge.function.get(), static_cast<int64_t>(index.size()));
    write(at->second);
    if (first) pending.push_back(edge.function.get());
  };
  if (output.requires_grad()) meet(torch::autograd::impl::gradient_edge(output));
  for (size_t next = 0; next < pending.size(); ++next) {
    Node& node = *pending[next];
    if (const auto* accumulator = dynamic_cast<const torch::autograd::AccumulateGrad*>(&node)) {
      // A leaf of another stage, captured, or gone (its accumulator then has no variable).
      const auto leaf = leaves_.find(accumulator->variable.unsafeGetTensorImpl());
      if (leaf == leaves_.end() || compat::has_hooks(node)) comparable_ = false;
      write('A');
      write(leaf != leaves_.end() ? leaf->second : 0);
      continue;
    }
    if (!is_generated(node) || compat::has_hooks(node)) comparable_ = false;
    write('N');
    const std::string name = node.name();
    write(name.size());
    record_.append(name);
    write(node.next_edges().size());
    for (const Edge& edge : node.next_edges()) meet(edge);
  }
}

std::string ForwardRecord::finish(const at::Tensor& output) {
  write('R');
  if (output.defined()) note_result(output);
  write_tensor(output);
  if (output.defined()) write_graph(output);
  return comparable_ ? std::move(record_) : std::string();
}

}  // namespace detail
}  // namespace ckpt
