#include "autograd/forward_record.h"

#include "compat/torch_compat.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Type.h>
#include <torch/csrc/autograd/edge.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/variable.h>

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
    : text_([this](ValueText& text, const at::Tensor& tensor) {
        text.geometry(tensor);
        if (tensor.defined() && tensor.has_storage()) text.word(origin_of(tensor));
      }),
      next_id_(2 + static_cast<int64_t>(owned.size())) {
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

void ForwardRecord::dispatch(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  text_.word('O');
  text_.string(operator_label(op.operator_name()));
  const size_t arguments = op.schema().arguments().size();
  for (size_t a = stack->size() - arguments; a < stack->size(); ++a) text_.value((*stack)[a]);
  run(op, stack);
  const size_t returns = op.schema().returns().size();
  for (size_t r = stack->size() - returns; r < stack->size(); ++r) {
    for_each_tensor((*stack)[r], [&](const at::Tensor& result) { note_result(result); });
  }
  for (size_t r = stack->size() - returns; r < stack->size(); ++r) text_.value((*stack)[r]);
}

// The nodes in the order a walk from the output first meets them, each with its edges (to which
// node, which of its inputs): the same graph gives the same words.
void ForwardRecord::write_graph(const at::Tensor& output) {
  std::unordered_map<const Node*, int64_t> index;
  std::vector<Node*> pending;
  auto meet = [&](const Edge& edge) {
    text_.word(edge.is_valid());
    if (!edge.is_valid()) return;
    text_.word(static_cast<int64_t>(edge.input_nr));
    const auto [at, first] = index.emplace(edge.function.get(), static_cast<int64_t>(index.size()));
    text_.word(at->second);
    if (first) pending.push_back(edge.function.get());
  };
  if (output.requires_grad()) meet(torch::autograd::impl::gradient_edge(output));
  for (size_t next = 0; next < pending.size(); ++next) {
    Node& node = *pending[next];
    if (compat::has_hooks(node)) text_.mark_incomplete();
    if (const auto* accumulator = dynamic_cast<const torch::autograd::AccumulateGrad*>(&node)) {
      // A leaf of another stage, captured, or gone (its accumulator then has no variable).
      const auto leaf = leaves_.find(accumulator->variable.unsafeGetTensorImpl());
      if (leaf == leaves_.end()) text_.mark_incomplete();
      text_.word('A');
      text_.word(leaf != leaves_.end() ? leaf->second : 0);
      continue;
    }
    if (!is_generated(node)) text_.mark_incomplete();
    text_.word('N');
    text_.string(node.name());
    text_.word(node.next_edges().size());
    for (const Edge& edge : node.next_edges()) meet(edge);
  }
}

std::string ForwardRecord::finish(const at::Tensor& output) {
  text_.word('R');
  if (output.defined()) note_result(output);
  text_.value(output);
  if (output.defined()) write_graph(output);
  return text_.complete() ? text_.take() : std::string();
}

}  // namespace detail
}  // namespace ckpt
