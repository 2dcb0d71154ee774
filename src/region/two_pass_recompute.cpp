#include "two_pass_recompute.h"

#include "autograd/graph.h"
#include "autograd/saved_tensor_hooks.h"
#include "early_stop.h"
#include "region_state.h"

#include <c10/core/StorageImpl.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/saved_variable_hooks.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <mutex>
#include <unordered_set>
#include <utility>

namespace ckpt {
namespace detail {

class FirstPassHooks;

struct TwoPassRecompute::Passes {
  // One tensor the first pass saved, in the order autograd saved them.
  struct Saved {
    TensorGeometry geometry;
    int64_t new_bytes = 0;            // of data the recompute made, counted at its first save
    int64_t bytes = 0;                // of the tensor itself (none for a parameter's)
    FirstPassHooks* hooks = nullptr;  // while its saved variable lives
  };

  std::shared_ptr<RegionState> state;
  bool let_go_after = false;
  std::mutex mutex;  // saved variables come and go on the engine's threads
  std::vector<Saved> saved;
  size_t head = 0;  // the first `head` saved tensors are the head's
  // The data the first pass saw saved, held weakly so that each address stays its own.
  std::vector<WeakStorage> seen;
  std::unordered_set<const c10::StorageImpl*> seen_set;
  std::unordered_set<const c10::StorageImpl*> arguments;
  std::once_flag second_pass;

  size_t add(const at::Tensor& tensor, FirstPassHooks* hooks);
  size_t head_by_estimate() const;
  void drop_head();
  void run_second_pass();
};

// A tensor the first pass saved: kept, or, in the head, let go of and taken from the second pass.
class FirstPassHooks final : public torch::autograd::SavedVariableHooks {
 public:
  explicit FirstPassHooks(std::shared_ptr<TwoPassRecompute::Passes> passes)
      : passes_(std::move(passes)) {}
  ~FirstPassHooks() override {
    const std::lock_guard<std::mutex> lock(passes_->mutex);
    if (index_ < passes_->saved.size()) passes_->saved[index_].hooks = nullptr;
  }

  void call_pack_hook(const at::Tensor& tensor) override {
    version_.note(tensor);
    parameter_ = of_parameter(tensor);
    kept_ = tensor.detach();  // no reference cycle through an output's own node
    index_ = passes_->add(tensor, this);
    if (index_ < passes_->head) drop();
  }

  at::Tensor call_unpack_hook() override {
    version_.check();
    if (dropped_) passes_->run_second_pass();
    TORCH_CHECK(kept_.defined(),
                "ckpt::checkpoint: the recompute's second pass did not save "
                "tensor #",
                index_,
                " again. A function recomputed in two passes "
                "must compute the same thing each time it runs.");
    return kept_;
  }

  // Lets go of the tensor, to be taken from the second pass. A parameter's stays: it lives on.
  void drop() {
    if (parameter_) return;
    kept_ = at::Tensor();
    dropped_ = true;
  }

  void take(const at::Tensor& tensor) {
    kept_ = tensor.detach();
    dropped_ = false;
  }

 private:
  std::shared_ptr<TwoPassRecompute::Passes> passes_;
  size_t index_ = SIZE_MAX;
  at::Tensor kept_;
  bool parameter_ = false;
  bool dropped_ = false;
  SavedVersion version_;
};

// What a call site's first recompute in two passes saves, sized in a run of its own that keeps
// nothing: where the head ends, before the first pass.
class SizingHooks final : public torch::autograd::SavedVariableHooks {
 public:
  explicit SizingHooks(TwoPassRecompute::Passes& passes) : passes_(passes) {}
  void call_pack_hook(const at::Tensor& tensor) override { passes_.add(tensor, nullptr); }
  at::Tensor call_unpack_hook() override {
    TORCH_CHECK(false, "ckpt::checkpoint: internal error: the sizing run's graph ran backward");
  }

 private:
  TwoPassRecompute::Passes& passes_;
};

// Thrown once the second pass saved the head's last tensor: the function stops there, as
// PyTorch's early stop does (its tail would only make data to let go of). Not a std::exception,
// so that no handler on the way takes it for an error.
struct SecondPassOver {};

// What the second pass saves: the head's tensors go to the first pass's saved variables that
// still live; the pass stops after the last.
class SecondPassHooks final : public torch::autograd::SavedVariableHooks {
 public:
  using Taken = std::vector<std::pair<at::Tensor, uint32_t>>;  // each with its version then

  SecondPassHooks(TwoPassRecompute::Passes& passes, size_t index, Taken& taken)
      : passes_(passes), index_(index), taken_(taken) {}

  void call_pack_hook(const at::Tensor& tensor) override {
    if (index_ >= passes_.head) return;
    {
      const std::lock_guard<std::mutex> lock(passes_.mutex);
      const TwoPassRecompute::Passes::Saved& first = passes_.saved[index_];
      TORCH_CHECK(TensorGeometry::of(tensor) == first.geometry,
                  "ckpt::checkpoint: the function saved another tensor for the backward when it "
                  "ran again (tensor #",
                  index_,
                  " differs in shape, strides, dtype or device). A function recomputed "
                  "in two passes must compute the same thing each time it runs.");
      if (first.hooks != nullptr) {  // else its backward is over
        first.hooks->take(tensor);
        taken_.emplace_back(tensor, tensor._version());  // checked once the pass is over
      }
    }
    if (index_ + 1 == passes_.head) throw SecondPassOver();
  }

  at::Tensor call_unpack_hook() override {
    TORCH_CHECK(false, "ckpt::checkpoint: internal error: the second pass's graph ran backward");
  }

 private:
  TwoPassRecompute::Passes& passes_;
  size_t index_;
  Taken& taken_;
};

size_t TwoPassRecompute::Passes::add(const at::Tensor& tensor, FirstPassHooks* hooks) {
  const std::lock_guard<std::mutex> lock(mutex);
  Saved entry{TensorGeometry::of(tensor), 0, 0, hooks};
  const bool parameter = of_parameter(tensor);
  if (!parameter) entry.bytes = static_cast<int64_t>(tensor.numel() * tensor.element_size());
  const c10::StorageImpl* data =
      tensor.has_storage() ? tensor.storage().unsafeGetStorageImpl() : nullptr;
  if (data != nullptr && !parameter && arguments.count(data) == 0 && seen_set.insert(data).second) {
    seen.push_back(tensor.storage().getWeakStorageImpl());
    entry.new_bytes = static_cast<int64_t>(tensor.storage().nbytes());
  }
  saved.push_back(std::move(entry));
  return saved.size() - 1;
}

// The head that gives the lowest estimated peak. The backward reads saved tensors in about the
// reverse order of their saving, so when it reads tensor i it holds those saved up to i, beside
// gradients about twice i's size; in two passes with a head of h, those saved from h to i where
// i >= h (the head is let go of), and from 0 to i otherwise (the second pass made the head again).
// The shortest head of the lowest estimate; none where two passes lower nothing.
size_t TwoPassRecompute::Passes::head_by_estimate() const {
  const size_t n = saved.size();
  std::vector<int64_t> before(n + 1, 0);  // new bytes saved before each
  for (size_t i = 0; i < n; ++i) before[i + 1] = before[i] + saved[i].new_bytes;
  size_t best = 0;
  int64_t lowest = std::numeric_limits<int64_t>::max();
  for (size_t head = 0; head < n; ++head) {
    int64_t peak = 0;
    for (size_t i = 0; i < n; ++i) {
      const int64_t held = before[i + 1] - (i >= head ? before[head] : 0);
      peak = std::max(peak, held + 2 * saved[i].bytes);
    }
    if (peak < lowest) {
      lowest = peak;
      best = head;
    }
  }
  return best;
}

void TwoPassRecompute::Passes::drop_head() {
  const std::lock_guard<std::mutex> lock(mutex);
  for (size_t i = 0; i < head && i < saved.size(); ++i) {
    if (saved[i].hooks != nullptr) saved[i].hooks->drop();
  }
}

// Once, at the first read of a head's tensor: the function runs again and hands the head's
// tensors to the first pass's saved variables. Its outputs and graph go at once.
void TwoPassRecompute::Passes::run_second_pass() {
  std::call_once(second_pass, [this] {
    SecondPassHooks::Taken taken;
    size_t next = 0;
    try {
      state->run_recompute(
          /*replacement=*/nullptr, /*early_stop=*/nullptr,
          [&] { return std::make_unique<SecondPassHooks>(*this, next++, taken); });
    } catch (const SecondPassOver&) {
    }
    // Written in place after the second pass saved it, as autograd would have refused.
    for (const auto& [tensor, version] : taken) {
      TORCH_CHECK(tensor._version() == version,
                  "one of the variables needed for gradient computation has been modified by "
                  "an inplace operation in the recompute's second pass. Don't modify a tensor "
                  "in place after an operator saved it.");
    }
    if (let_go_after) state->let_go_of_arguments();
  });
}

TwoPassRecompute::TwoPassRecompute(std::shared_ptr<RegionState> state, bool let_go_after)
    : passes_(std::make_shared<Passes>()) {
  passes_->state = std::move(state);
  passes_->let_go_after = let_go_after;
  for (const at::Tensor& input : passes_->state->inputs) {
    if (input.defined() && input.has_storage())
      passes_->arguments.insert(input.storage().unsafeGetStorageImpl());
  }
}

TwoPassRecompute::~TwoPassRecompute() = default;

// Drops the head's tensors as they are saved, where the head ends as the call site learned (its
// first recompute in two passes sizes the head in a run of its own, so that the pass holds no
// more than later ones); where this pass's sizes give a longer head, the rest goes once it is
// over. The call site learns the head from each pass.
std::vector<at::Tensor> TwoPassRecompute::first_pass() const {
  Passes& passes = *passes_;
  std::atomic<size_t>& learned = passes.state->site->two_pass_head;
  if (learned.load() == CallSite::kUnknownHead) {
    passes.state->run_recompute(/*replacement=*/nullptr, /*early_stop=*/nullptr,
                                [&] { return std::make_unique<SizingHooks>(passes); });
    const std::lock_guard<std::mutex> lock(passes.mutex);
    learned.store(passes.head_by_estimate());
    passes.saved.clear();
    passes.seen.clear();
    passes.seen_set.clear();
  }
  passes.head = learned.load();
  std::vector<at::Tensor> outputs = passes.state->run_recompute(
      /*replacement=*/nullptr, /*early_stop=*/nullptr,
      [shared = passes_] { return std::make_unique<FirstPassHooks>(shared); });
  {
    const std::lock_guard<std::mutex> lock(passes.mutex);
    const size_t head = passes.head_by_estimate();
    learned.store(head);
    // What was dropped as it was saved stays dropped, where this pass's head is shorter.
    passes.head = std::min(std::max(passes.head, head), passes.saved.size());
    passes.seen.clear();
    passes.seen_set.clear();
  }
  passes.drop_head();
  // No head: no second pass to read the arguments again.
  if (passes.head == 0 && passes.let_go_after) passes.state->let_go_of_arguments();
  return outputs;
}

bool prepare_two_pass_recompute() {
  if (!saved_tensor_hooks_available()) return false;
  const SavedTensorHooksScope install([] { return nullptr; });
  return true;
}

}  // namespace detail
}  // namespace ckpt
