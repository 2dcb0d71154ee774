#include <ckpt/memory_tracker.h>

#include <c10/util/Exception.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/lbfgs.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <typeinfo>

namespace ckpt {
namespace {

using torch::optim::OptimizerParamState;

template <class State>
const State* as(const OptimizerParamState& state) {
  return dynamic_cast<const State*>(&state);
}

// The tensors of one parameter's state; false for a state type this does not know.
bool add_state_tensors(const OptimizerParamState& state, std::vector<at::Tensor>& out) {
  if (const auto* adam = as<torch::optim::AdamParamState>(state)) {
    out.insert(out.end(), {adam->exp_avg(), adam->exp_avg_sq(), adam->max_exp_avg_sq()});
  } else if (const auto* adamw = as<torch::optim::AdamWParamState>(state)) {
    out.insert(out.end(), {adamw->exp_avg(), adamw->exp_avg_sq(), adamw->max_exp_avg_sq()});
  } else if (const auto* sgd = as<torch::optim::SGDParamState>(state)) {
    out.push_back(sgd->momentum_buffer());
  } else if (const auto* rmsprop = as<torch::optim::RMSpropParamState>(state)) {
    out.insert(out.end(), {rmsprop->square_avg(), rmsprop->momentum_buffer(), rmsprop->grad_avg()});
  } else if (const auto* adagrad = as<torch::optim::AdagradParamState>(state)) {
    out.push_back(adagrad->sum());
  } else if (const auto* lbfgs = as<torch::optim::LBFGSParamState>(state)) {
    out.insert(out.end(), {lbfgs->d(), lbfgs->H_diag(), lbfgs->prev_flat_grad()});
    for (const auto* history : {&lbfgs->old_dirs(), &lbfgs->old_stps(), &lbfgs->ro()}) {
      out.insert(out.end(), history->begin(), history->end());
    }
    if (lbfgs->al()) out.insert(out.end(), lbfgs->al()->begin(), lbfgs->al()->end());
  } else {
    return false;
  }
  return true;
}

}  // namespace

std::vector<at::Tensor> optimizer_state_tensors(const torch::optim::Optimizer& optimizer) {
  std::vector<at::Tensor> tensors;
  for (const auto& entry : optimizer.state()) {
    const OptimizerParamState& state = *entry.second;
    TORCH_CHECK(add_state_tensors(state, tensors),
                "ckpt::optimizer_state_tensors: the optimizer's state has the type ",
                typeid(state).name(),
                ", which ckpt does not know (it knows Adam, AdamW, SGD, RMSprop, Adagrad and "
                "LBFGS). Collect its state tensors yourself and pass them to "
                "MemoryTracker::peak_breakdown.");
  }
  return tensors;
}

}  // namespace ckpt
