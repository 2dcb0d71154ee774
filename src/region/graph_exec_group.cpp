#include "graph_exec_group.h"

#include "compat/torch_compat.h"

#include <c10/util/Exception.h>
#include <torch/csrc/autograd/engine.h>

#include <utility>

namespace ckpt {
namespace detail {
namespace {
thread_local std::shared_ptr<GroupState> current_group;
}  // namespace

bool GroupState::join(std::function<void()> at_end_of_group) {
  const std::lock_guard<std::mutex> lock(mutex);
  if (ended) return false;
  at_end.push_back(std::move(at_end_of_group));
  return true;
}

std::shared_ptr<GroupState> current_graph_exec_group() {
  if (current_group != nullptr) return current_group;
  auto* carried = dynamic_cast<GroupState*>(compat::carried());
  return carried != nullptr ? carried->shared_from_this() : nullptr;
}

}  // namespace detail

namespace {

bool has_ended(detail::GroupState& group) {
  const std::lock_guard<std::mutex> lock(group.mutex);
  return group.ended;
}

}  // namespace

GraphExecGroup::GraphExecGroup() {
  // A group that ended is current no more (end() on another thread could not say so here).
  TORCH_CHECK(detail::current_group == nullptr || has_ended(*detail::current_group),
              "ckpt::GraphExecGroup: groups cannot be nested, and one is already current on this "
              "thread. Use the one group for all the backward passes that should share "
              "recomputes, or end it first.");
  state_ = std::make_shared<detail::GroupState>();
  detail::current_group = state_;
  compat::carry(state_);
}

GraphExecGroup::~GraphExecGroup() {
  end();
}

void GraphExecGroup::end() {
  if (detail::current_group == state_) detail::current_group.reset();
  compat::stop_carrying(state_.get());
  std::vector<std::function<void()>> at_end;
  {
    const std::lock_guard<std::mutex> lock(state_->mutex);
    state_->ended = true;
    at_end.swap(state_->at_end);
  }
  auto run = [at_end = std::move(at_end)] {
    for (const auto& f : at_end) f();
  };
  // Inside a backward (a hook), the nodes it runs through keep their edges until it ends.
  if (compat::inside_backward()) {
    torch::autograd::Engine::get_default_engine().queue_callback(std::move(run));
  } else {
    run();
  }
}

}  // namespace ckpt
