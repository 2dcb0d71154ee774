#include <ckpt/candidate.h>

#include "recomputed_input.h"

namespace ckpt {
namespace detail {
namespace {
thread_local CandidateRunner* current_runner = nullptr;
}  // namespace

CandidateRunner* candidate_runner() {
  return current_runner;
}

CandidateRunnerScope::CandidateRunnerScope(CandidateRunner* runner) : previous_(current_runner) {
  current_runner = runner;
}

CandidateRunnerScope::~CandidateRunnerScope() {
  current_runner = previous_;
}

std::optional<CheckpointOptions> InnerCandidates::begin(const std::string& /*name*/,
                                                        const torch::nn::Module* /*module*/,
                                                        std::vector<at::Tensor>& /*inputs*/,
                                                        RegionRequest& request) {
  if (reached_) reached_->fetch_add(1);
  request.inner_candidates = options_;
  return options_;
}

void RecomputableOutputs::add(int producer, const std::vector<at::Tensor>& outputs,
                              const RegionRequest& request) {
  for (size_t i = 0; i < outputs.size() && i < request.output_sources.size(); ++i) {
    if (!request.output_sources[i] || !outputs[i].defined()) continue;
    c10::TensorImpl* impl = outputs[i].unsafeGetTensorImpl();
    request.output_sources[i]->note_returned(outputs[i]);
    entries_.insert_or_assign(
        impl, Entry{c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>(
                        outputs[i].getIntrusivePtr()),
                    request.output_sources[i], producer});
  }
}

std::vector<std::shared_ptr<const RecomputeSource>> RecomputableOutputs::sources_for(
    const std::vector<at::Tensor>& inputs, std::vector<int>& producers) const {
  std::vector<std::shared_ptr<const RecomputeSource>> sources(inputs.size());
  producers.assign(inputs.size(), -1);
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined()) continue;
    const auto found = entries_.find(inputs[i].unsafeGetTensorImpl());
    // The address is the tensor's only while the tensor recorded there lives. Written in place
    // since its candidate returned it, it is not what that candidate computes again (issue 45,
    // item 4: the taker dropped it, and its gradients were those of the value before the write).
    if (found == entries_.end() ||
        found->second.tensor.lock().get() != inputs[i].unsafeGetTensorImpl() ||
        found->second.source->written_since_returned(inputs[i]))
      continue;
    sources[i] = found->second.source;
    producers[i] = found->second.producer;
  }
  return sources;
}

}  // namespace detail
}  // namespace ckpt
