#include <ckpt/modules.h>

#include <c10/util/Exception.h>

#include <vector>

namespace ckpt {

CheckpointedBase::CheckpointedBase(std::shared_ptr<torch::nn::Module> wrapped,
                                   const CheckpointOptions& options)
    : options(options), wrapped_(std::move(wrapped)) {
  // Adopt the wrapped module's own members under their own names, so that the wrapper adds no
  // prefix to any parameter or buffer name.
  for (const auto& item : wrapped_->named_parameters(/*recurse=*/false)) {
    register_parameter(item.key(), item.value(), item.value().requires_grad());
  }
  for (const auto& item : wrapped_->named_buffers(/*recurse=*/false)) {
    register_buffer(item.key(), item.value());
  }
  for (const auto& item : wrapped_->named_children()) register_module(item.key(), item.value());
}

void CheckpointedBase::train(bool on) {
  torch::nn::Module::train(on);
  wrapped_->train(on);  // a leaf such as Dropout is not among the adopted children
}

void CheckpointedBase::pretty_print(std::ostream& stream) const {
  stream << "ckpt::Checkpointed(use_reentrant=" << (options.use_reentrant() ? "true" : "false")
         << ", preserve_rng_state=" << (options.preserve_rng_state() ? "true" : "false") << ")";
}

namespace {

using Predicate = std::function<bool(const std::string&, const torch::nn::Module&)>;

struct Match {
  torch::nn::SequentialImpl* sequential;
  size_t index;  // the element's position in the Sequential
  std::string key;
};

// Finds the matches below `parent` and checks that each can be swapped, before anything changes.
void find_matches(torch::nn::Module& parent, const std::string& prefix, const Predicate& predicate,
                  std::vector<Match>& matches) {
  auto* sequential = dynamic_cast<torch::nn::SequentialImpl*>(&parent);
  const auto children = parent.named_children();
  for (size_t i = 0; i < children.size(); ++i) {
    const std::string& key = children[i].key();
    torch::nn::Module& child = *children[i].value();
    const std::string name = prefix.empty() ? key : prefix + "." + key;
    if (dynamic_cast<CheckpointedBase*>(&child) != nullptr) continue;  // checkpointed already
    if (!predicate(name, child)) {
      find_matches(child, name, predicate, matches);
      continue;
    }
    TORCH_CHECK(sequential != nullptr, "ckpt::apply_checkpointing: '", name, "' (", child.name(),
                ") matches, but it is a member of ", parent.name(),
                ", whose C++ forward calls it directly, so it can't be wrapped behind its back; "
                "only the elements of a torch::nn::Sequential can. Wrap it where it is "
                "registered, as in `block = register_module(\"block\", "
                "ckpt::Checkpointed(Block(...)))`, or narrow the predicate. Nothing was changed.");
    matches.push_back({sequential, i, key});
  }
}

}  // namespace

void apply_checkpointing(torch::nn::Module& root, const Predicate& predicate,
                         const CheckpointOptions& options) {
  TORCH_CHECK(predicate != nullptr, "ckpt::apply_checkpointing: the predicate is empty.");
  std::vector<Match> matches;
  find_matches(root, "", predicate, matches);
  for (const Match& match : matches) {
    torch::nn::AnyModule& element = *(match.sequential->begin() + match.index);
    torch::nn::AnyModule wrapped(Checkpointed(element, options));
    element = wrapped;  // what the Sequential's forward calls
    match.sequential->replace_module(match.key, wrapped.ptr());  // what its tree shows
  }
}

}  // namespace ckpt
