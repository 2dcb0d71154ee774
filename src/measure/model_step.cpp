#include "measure/model_step.h"

#include "autograd/buffer_guard.h"
#include "autograd/graph.h"
#include "autograd/host_offload.h"
#include "autograd/outside_state.h"
#include "autograd/saved_tensor_hooks.h"
#include "autograd/step_rollback.h"
#include "measure/free_watch.h"
#include "measure/policy_preview.h"

#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/saved_variable_hooks.h>
#include <torch/csrc/autograd/variable.h>

#include <utility>

namespace ckpt {
namespace model_profiling {
namespace {

using detail::StorageSet;

// What a plain forward saved: the storages the current candidate's saved tensors use, and the
// tensors themselves, passed through for a backward the step function runs inside the forward (a
// gradient penalty) and let go of when the step ends (`~StepRecorder`): a saved output holds its
// own graph alive, a cycle that, with no backward after the forward, nothing else breaks.
struct SavedNotes {
  StorageSet storages;
  std::vector<at::Tensor> tensors;
};

// Hooks that pass a saved tensor through and note its storage.
class NotingHooks final : public torch::autograd::SavedVariableHooks {
 public:
  explicit NotingHooks(std::shared_ptr<SavedNotes> notes) : notes_(std::move(notes)) {}
  void call_pack_hook(const at::Tensor& tensor) override {
    if (tensor.defined() && tensor.has_storage())
      notes_->storages.insert(tensor.storage().unsafeGetStorageImpl());
    index_ = notes_->tensors.size();
    notes_->tensors.push_back(tensor);
  }
  at::Tensor call_unpack_hook() override {
    TORCH_CHECK(index_ < notes_->tensors.size(),
                "ckpt::profile_model: the graph of the step that finds the candidates is used "
                "after its forward; return the loss without keeping that graph elsewhere.");
    return notes_->tensors[index_];
  }

 private:
  std::shared_ptr<SavedNotes> notes_;
  size_t index_ = 0;
};

// Runs the candidates of a step as `StepRun` says and records the step's events.
class StepRecorder final : public detail::CandidateRunner {
 public:
  StepRecorder(const detail::CandidateNames& names, StepRun run, std::shared_ptr<StepRecord> record)
      : calls_(names), run_(std::move(run)), record_(std::move(record)) {}
  // The step is over: the saved tensors passed through are let go of.
  ~StepRecorder() override { saved_->tensors.clear(); }
  StepRecorder(const StepRecorder&) = delete;
  StepRecorder& operator=(const StepRecorder&) = delete;

  // The groups of the step's offloaded regions, while its forward runs (none: after it).
  void take_groups_from(detail::ManualOffloadScope* offloads) { offloads_ = offloads; }

  std::optional<CheckpointOptions> begin(const std::string& name, const torch::nn::Module* module,
                                         std::vector<at::Tensor>& inputs,
                                         detail::RegionRequest& request) override {
    const int index = add_candidate(calls_.name(name, module), inputs);
    if (run_.trial != nullptr) run_.trial->request(index, inputs, request);
    record_->record(EventKind::ForwardBegin, index);
    for (auto& t : inputs) {
      if (!t.defined() || !t.requires_grad()) continue;
      t = t.alias();  // its gradient is complete once the candidate's backward is done with it
      t.register_hook([record = record_, index](const at::Tensor&) {
        record->record(EventKind::BackwardEnd, index);
      });
    }
    current_ = index;
    if (run_.find_saved) {
      saved_->storages.clear();
      saving_.emplace([saved = saved_] { return std::make_unique<NotingHooks>(saved); });
      if (!run_.previews.empty()) {
        if (!preview_) preview_.emplace(run_.previews);
        previewing_.emplace(*preview_);
      }
      for (const auto& t : inputs) {  // version counters hold no data
        if (t.defined())
          input_versions_.emplace_back(t._version(), torch::autograd::impl::version_counter(t));
      }
    }
    const bool kept = static_cast<size_t>(index) < run_.kept.size() && run_.kept[index];
    offloaded_ = !kept && run_.mode && run_.mode->offload();
    if (offloads_ != nullptr) offloads_->take_last();  // a group that finished before it
    if (kept) return std::nullopt;
    request.inner_candidates = run_.parts;
    return run_.mode;
  }

  void end(std::vector<at::Tensor>& outputs, const detail::RegionRequest& request) override {
    const int index = current_;
    if (saving_) {
      previewing_.reset();
      if (preview_) note_policy_drops(index, outputs);
      note_saved_inputs(index);
      bool written = false;
      for (const auto& [version, counter] : input_versions_) {
        written = written || counter.current_version() != version;
      }
      input_versions_.clear();
      const std::lock_guard<std::mutex> lock(record_->mutex);
      record_->candidates[index].writes_into_inputs = written;
    }
    if (run_.trial != nullptr) run_.trial->outputs.add(index, outputs, request);
    record_->record(EventKind::ForwardEnd, index);
    {
      const std::lock_guard<std::mutex> lock(record_->mutex);
      record_->watch(index, outputs, /*output=*/true);
      record_->candidates[index].inner_markers = request.inner_markers;
    }
    for (auto& t : outputs) {
      if (!t.defined() || !t.requires_grad()) continue;
      t.register_hook([record = record_, index](const at::Tensor&) {
        record->record(EventKind::BackwardBegin, index);
      });
    }
    if (offloaded_ && offloads_ != nullptr) bring_back_at_backward(index, outputs);
  }

  void abandon() noexcept override {
    previewing_.reset();
    saving_.reset();
  }

  // Whether the step's backward would measure nothing: a step that finds what forwards do, or a
  // step of a "recomputed" trial whose forward ended no chain (`run_trials` drops such a step).
  bool needs_no_backward() const {
    const RecomputeTrial* trial = run_.trial;
    return run_.forward_only ||
           (trial != nullptr && std::find(trial->depth.begin(), trial->depth.end(),
                                          trial->length) == trial->depth.end());
  }

 private:
  // What each previewed policy would not keep of what the candidate's forward made and saved.
  void note_policy_drops(int index, const std::vector<at::Tensor>& outputs) {
    const detail::PolicyPreview::Made made = preview_->take();
    StorageSet outputs_made;  // its outputs: every mode keeps them
    for (const auto& t : outputs) outputs_made.insert(detail::storage_of(t));
    int64_t inside = 0;
    std::vector<int64_t> drops(made.kept.size());
    for (const c10::StorageImpl* storage : saved_->storages) {
      if (made.storages.count(storage) == 0 || outputs_made.count(storage) > 0) continue;
      const auto bytes = static_cast<int64_t>(storage->nbytes());
      inside += bytes;
      for (size_t p = 0; p < drops.size(); ++p) {
        if (made.kept[p].count(storage) == 0) drops[p] += bytes;
      }
    }
    const std::lock_guard<std::mutex> lock(record_->mutex);
    record_->candidates[index].saved_inside_bytes = inside;
    record_->candidates[index].policy_drops_bytes = std::move(drops);
  }

  void note_saved_inputs(int index) {
    saving_.reset();
    const std::lock_guard<std::mutex> lock(record_->mutex);
    for (auto& w : record_->candidates[index].watched) {
      if (!w.output) w.saved = saved_->storages.count(w.address) > 0;
    }
  }

  // Its offloaded data comes back where its backward begins, as `PlannedModel` brings it back
  // (after the event, in the backward's first segment); the bytes that takes are its
  // `fetched_bytes`.
  void bring_back_at_backward(int index, const std::vector<at::Tensor>& outputs) {
    const std::weak_ptr<detail::OffloadGroup> group = offloads_->take_last();
    detail::at_first_gradient(outputs, [record = record_, group, index] {
      const std::shared_ptr<detail::OffloadGroup> data = group.lock();
      if (!data) return;
      const std::lock_guard<std::mutex> lock(record->mutex);
      const int64_t before = record->tracker->current_bytes();
      const int64_t bytes = data->prefetch();
      if (!record->open) return;
      // The device's count, with its blocks' rounding; at least the data's own bytes, where the
      // allocator let go of blocks it held for other streams in the same call.
      const int64_t rise = record->tracker->current_bytes() - before;
      int64_t& fetched = record->candidates[index].fetched_bytes;
      fetched = std::max({fetched, rise, bytes});
    });
  }

  int add_candidate(const std::string& name, const std::vector<at::Tensor>& inputs) {
    CandidateRecord c;
    c.profiled = ProfiledCandidate::of(name, inputs);
    const std::lock_guard<std::mutex> lock(record_->mutex);
    record_->candidates.push_back(std::move(c));
    const int index = static_cast<int>(record_->candidates.size()) - 1;
    record_->watch(index, inputs, /*output=*/false);
    return index;
  }

  detail::CandidateCalls calls_;
  StepRun run_;
  std::shared_ptr<StepRecord> record_;
  int current_ = -1;
  bool offloaded_ = false;  // the current candidate runs as an offloaded region
  detail::ManualOffloadScope* offloads_ = nullptr;
  std::shared_ptr<SavedNotes> saved_ = std::make_shared<SavedNotes>();
  // In the `find_saved` step: the current candidate's tensor arguments' versions at its begin.
  std::vector<std::pair<int64_t, c10::VariableVersion>> input_versions_;
  std::optional<detail::SavedTensorHooksScope> saving_;
  std::optional<detail::PolicyPreview> preview_;
  std::optional<detail::DispatchModeGuard> previewing_;
};

// The leaves a backward from `loss` accumulates into that are not parameters of `model`.
std::vector<at::Tensor> leaves_outside(const torch::nn::Module& model, const at::Tensor& loss) {
  std::unordered_set<const c10::TensorImpl*> parameters;
  for (const auto& p : model.parameters()) parameters.insert(p.unsafeGetTensorImpl());
  std::vector<at::Tensor> outside;
  for (auto& leaf : detail::leaves_reached(loss)) {
    if (parameters.count(leaf.unsafeGetTensorImpl()) == 0) outside.push_back(std::move(leaf));
  }
  return outside;
}

// `watch`, where given, watches the forward only: the backward's writes outside the model are
// the gradients of leaves, put back below (watched, their copies would count in every segment).
void run_loss_and_backward(const StepSetup& setup, StepRecorder& recorder,
                           detail::OutsideStateWatch* watch) {
  at::Tensor loss;
  {
    const detail::CandidateRunnerScope scope(&recorder);
    const at::AutoGradMode grad_mode(true);
    // As PlannedModel::run forwards: each offloaded candidate's data comes back where its
    // runner says, never ahead by itself.
    detail::ManualOffloadScope offloads;
    recorder.take_groups_from(&offloads);
    // What PlannedModel::run holds through the forward, held here too: the plan counts it.
    detail::StepRollback as_run(setup.model);
    std::optional<detail::DispatchModeGuard> watching;
    if (watch) watching.emplace(*watch);
    loss = setup.loss_fn();
    as_run.dismiss();
    recorder.take_groups_from(nullptr);
  }
  detail::check_step_loss(loss);
  if (recorder.needs_no_backward()) return;
  // A profiled step's backward must leave no gradient behind: the model's are swapped by the
  // caller; those of leaves outside it (an input that requires grad, a loss's own parameters)
  // are found in the graph and put back here.
  const detail::SwappedGradients outside(leaves_outside(*setup.model, loss));
  loss.backward();
}

}  // namespace

std::shared_ptr<StepRecord> record_step(const StepSetup& setup, StepRun run) {
  const detail::SwappedGradients grads({setup.model},
                                       setup.count_parameter_gradients
                                           ? detail::SwappedGradients::Start::None
                                           : detail::SwappedGradients::Start::ZeroBuffers);
  const detail::BufferGuard buffers({setup.model});
  std::optional<detail::OutsideStateWatch> outside;
  if (setup.watch_outside) {
    outside.emplace(std::vector<at::Tensor>{},
                    std::vector<std::shared_ptr<torch::nn::Module>>{setup.model});
  }
  auto record = std::make_shared<StepRecord>();
  record->tracker = setup.tracker;
  record->device = setup.device;
  StepRecorder recorder(*setup.names, std::move(run), record);
  std::optional<detail::FreeWatch> frees;
  std::optional<detail::HostHighWater> host_high;
  if (setup.device.is_cpu()) {
    record->frees_noted = true;
    frees.emplace([step = record.get()](const void* data) { step->note_free(data); });
  } else {
    record->host_high = &host_high.emplace();
  }
  record->start_time = detail::clock_now(setup.device);
  setup.tracker->reset_peak();
  record->start_bytes = setup.tracker->current_bytes();
  run_loss_and_backward(setup, recorder, outside ? &*outside : nullptr);
  record->record(EventKind::StepEnd, -1);
  record->wrote_outside = outside && outside->saw_writes();
  const std::lock_guard<std::mutex> lock(record->mutex);
  record->open = false;
  record->host_high = nullptr;
  return record;
}

c10::Device device_of(const torch::nn::Module& model) {
  for (const auto& p : model.parameters()) {
    if (!p.device().is_cpu()) return p.device();
  }
  for (const auto& b : model.buffers()) {
    if (!b.device().is_cpu()) return b.device();
  }
  return c10::Device(c10::DeviceType::CPU);
}

}  // namespace model_profiling
}  // namespace ckpt
