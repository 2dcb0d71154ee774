#include "stage_graph.h"

#include "autocast_state.h"
#include "graph.h"

#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/variable.h>

namespace ckpt {
namespace detail {

StageGraph::StageGraph(const StageForward& forward, const at::Tensor& input,
                       bool input_requires_grad) {
  const at::AutoGradMode grad_mode(true);
  // Autocast's cache would hand the stage casts of weights that an earlier run of it (a
  // recompute, a profiling run) made, outside this graph: each run casts its own.
  const AutocastCacheOff cache_off;
  leaf_ = input.detach();
  if (input_requires_grad) leaf_.requires_grad_(true);
  {
    const SavedLeafTally::Recording recording(saved_leaves_);
    output_ = forward(leaf_);
  }
  if (!output_.requires_grad()) return;
  // A stage that returns a leaf (its input, from Identity or Dropout(0)) made no node: its
  // backward would start at the leaf's accumulator and hand nothing on. A view gives it one.
  if (output_.is_leaf()) output_ = output_.view_as(output_);
  boundary_ = find_boundary({torch::autograd::impl::gradient_edge(output_)}, marker_);
  for (const auto& edge : boundary_.edges) {
    // Stages built from modules reach only leaves (their input and parameters). A non-leaf tensor
    // from outside the stage would make the stage's backward run the graph before it.
    TORCH_CHECK(leaf_variable(edge).defined(),
                "ckpt: a stage of the chain uses a tensor that requires grad, was computed outside "
                "the stage (",
                edge.function->name(),
                "), and is neither the stage's input nor a parameter. Pass it to the stage as a "
                "parameter or buffer, or detach it.");
  }
}

void LeafGradients::add(const torch::autograd::Edge& edge, const at::Tensor& grad) {
  if (!grad.defined()) return;
  auto found = slots_.find(edge.function.get());
  if (found == slots_.end()) found = slots_.emplace(edge.function.get(), Slot{edge, {}}).first;
  at::Tensor& sum = found->second.sum;
  sum = sum.defined() ? sum + grad : grad;
}

at::Tensor LeafGradients::take(const torch::autograd::Node* accumulator) {
  const auto found = slots_.find(accumulator);
  if (found == slots_.end()) return {};
  at::Tensor sum = std::move(found->second.sum);
  slots_.erase(found);
  return sum;
}

void LeafGradients::accumulate_rest() {
  torch::autograd::edge_list roots;
  torch::autograd::variable_list grads;
  for (auto& item : slots_) {
    if (!item.second.sum.defined()) continue;
    roots.push_back(item.second.edge);
    grads.push_back(std::move(item.second.sum));
  }
  slots_.clear();
  if (roots.empty()) return;
  // Handed over, not held: an accumulator takes a sum as the leaf's gradient instead of a copy.
  execute_letting_go(roots, std::move(grads), EngineRun{}, {});
}

namespace {

// A list of one gradient, moved in: a braced list copies its elements, and the original would
// live until the engine's run ends.
torch::autograd::variable_list only(at::Tensor grad) {
  torch::autograd::variable_list list;
  list.push_back(std::move(grad));
  return list;
}

}  // namespace

std::unordered_set<const c10::TensorImpl*> single_stage_leaves(
    const std::vector<torch::nn::AnyModule>& stages) {
  std::unordered_map<const c10::TensorImpl*, int> stages_using;
  for (const auto& stage : stages) {
    std::unordered_set<const c10::TensorImpl*> own;
    for (const auto& p : stage.ptr()->parameters()) own.insert(p.unsafeGetTensorImpl());
    for (const auto* leaf : own) ++stages_using[leaf];
  }
  std::unordered_set<const c10::TensorImpl*> single;
  for (const auto& [leaf, count] : stages_using) {
    if (count == 1) single.insert(leaf);
  }
  return single;
}

at::Tensor StageGraph::input_gradient(at::Tensor grad_output) {
  at::Tensor input_grad;
  if (output_.requires_grad() && grad_output.defined()) {
    const torch::autograd::edge_list roots = {torch::autograd::impl::gradient_edge(output_)};
    output_.reset();  // as in autograd's backward, it lives on only where the stage saved it
    if (leaf_.requires_grad()) {
      input_grad = execute_letting_go(
          roots, only(std::move(grad_output)),
          EngineRun{/*keep_graph=*/false, /*create_graph=*/false, /*accumulate_grad=*/false},
          {torch::autograd::impl::gradient_edge(leaf_)})[0];
    }
  }
  release();
  return input_grad;
}

at::Tensor StageGraph::backward(at::Tensor grad_output, LeafGradients& leaves) {
  at::Tensor input_grad;
  if (output_.requires_grad() && grad_output.defined()) {
    const torch::autograd::edge_list roots = {torch::autograd::impl::gradient_edge(output_)};
    output_.reset();  // as in autograd's backward, it lives on only where the stage saved it
    const Node* input_node = leaf_.requires_grad()
                                 ? torch::autograd::impl::gradient_edge(leaf_).function.get()
                                 : nullptr;
    // The border's gradients are collected: the leaves' accumulators (and the tensor hooks on
    // them) run once, when the chain hands over the sums.
    std::vector<GradientReceiver> receivers(boundary_.edges.size());
    for (size_t k = 0; k < boundary_.edges.size(); ++k) {
      if (boundary_.edges[k].function.get() == input_node) {
        receivers[k] = [&input_grad](const at::Tensor& grad) {
          input_grad = input_grad.defined() ? input_grad + grad : grad;
        };
      } else {
        // By index: a copy of the edge would be one more holder of the accumulator.
        receivers[k] = [&leaves, this, k](const at::Tensor& grad) {
          leaves.add(boundary_.edges[k], grad);
        };
      }
    }
    BorderCapture border(roots, marker_, boundary_, std::move(receivers));
    // Holders of a leaf's accumulator when nothing else leads to it: the boundary's copy of the
    // edge, the chain node's next edge, the stage's one edge into it (kept aside by the
    // capture), and each variable the stage saved it in under hooks, where those hold it. The
    // stage's input is not a leaf of the chain's backward.
    std::vector<size_t> needed;
    for (size_t k = 0; k < boundary_.edges.size(); ++k) {
      if (boundary_.edges[k].function.get() != input_node) needed.push_back(k);
    }
    const std::vector<size_t> summed_whole =
        accumulate_sole_gradients_early(border, boundary_, needed, [&](size_t k) -> long {
          const torch::autograd::Edge& edge = boundary_.edges[k];
          return leaves.single_stage(leaf_variable(edge))
                     ? 3 + saved_leaves_.holders_of(edge.function.get())
                     : -1;
        });
    execute_letting_go(roots, only(std::move(grad_output)), EngineRun{}, border.outputs());
    // A leaf the stage uses several times (a weight normalised by its own norm) has its whole
    // gradient summed now: it goes into `.grad` here rather than being held to the chain's end.
    for (size_t k : summed_whole) {
      const torch::autograd::Edge& edge = boundary_.edges[k];
      at::Tensor sum = leaves.take(edge.function.get());
      if (!sum.defined()) continue;
      if (auto add = early_accumulation(edge)) {
        add(sum);
      } else {
        leaves.add(edge, sum);
      }
    }
  }
  release();
  return input_grad;
}

void StageGraph::release() {
  leaf_.reset();
  output_.reset();
  boundary_ = Boundary();
}

}  // namespace detail
}  // namespace ckpt
