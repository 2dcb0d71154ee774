#include <ckpt/modules.h>

#include <c10/util/Exception.h>

#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
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

// What the walk has seen: each module once by address (a module registered at two places in the
// tree is one object), and the matches found inside a match, which are not wrapped again.
struct Walk {
  const Predicate& predicate;
  std::vector<Match> matches;
  std::unordered_map<const torch::nn::Module*, std::string> seen;
  std::vector<std::pair<std::string, std::string>> twice;   // (first name, second name)
  std::vector<std::pair<std::string, std::string>> nested;  // (outer match, inner match)
};

// Records `module` at `name`; false when the walk met the same object before.
bool first_visit(Walk& walk, const torch::nn::Module& module, const std::string& name) {
  const auto [it, inserted] = walk.seen.emplace(&module, name);
  if (!inserted) walk.twice.emplace_back(it->second, name);
  return inserted;
}

// The matches inside a match: they stay as they are, since the outer region recomputes them.
void find_nested(Walk& walk, const torch::nn::Module& parent, const std::string& prefix,
                 const std::string& outer) {
  for (const auto& item : parent.named_children()) {
    const std::string name = prefix + "." + item.key();
    if (!first_visit(walk, *item.value(), name)) continue;
    if (walk.predicate(name, *item.value())) walk.nested.emplace_back(outer, name);
    find_nested(walk, *item.value(), name, outer);
  }
}

// Finds the matches below `parent` and checks that each can be swapped, before anything changes.
void find_matches(Walk& walk, torch::nn::Module& parent, const std::string& prefix) {
  auto* sequential = dynamic_cast<torch::nn::SequentialImpl*>(&parent);
  const auto children = parent.named_children();
  for (size_t i = 0; i < children.size(); ++i) {
    const std::string& key = children[i].key();
    torch::nn::Module& child = *children[i].value();
    const std::string name = prefix.empty() ? key : prefix + "." + key;
    if (!first_visit(walk, child, name)) continue;
    if (dynamic_cast<CheckpointedBase*>(&child) != nullptr) continue;  // checkpointed already
    if (!walk.predicate(name, child)) {
      find_matches(walk, child, name);
      continue;
    }
    TORCH_CHECK(sequential != nullptr, "ckpt::apply_checkpointing: '", name, "' (", child.name(),
                ") matches, but it is a member of ", parent.name(),
                ", whose C++ forward calls it directly, so it can't be wrapped behind its back; "
                "only the elements of a torch::nn::Sequential can. Wrap it where it is "
                "registered, as in `block = register_module(\"block\", "
                "ckpt::Checkpointed(Block(...)))`, or narrow the predicate. Nothing was changed.");
    walk.matches.push_back({sequential, i, key});
    find_nested(walk, child, name, name);
  }
}

void warn_about(const Walk& walk) {
  if (!walk.nested.empty()) {
    TORCH_WARN("ckpt::apply_checkpointing: '", walk.nested.front().second, "'",
               walk.nested.size() > 1 ? " and " + std::to_string(walk.nested.size() - 1) + " more"
                                      : std::string(),
               " match inside '", walk.nested.front().first,
               "', which is wrapped whole, and are not wrapped again: a region inside a region is "
               "recomputed twice. Narrow the predicate to the modules you mean.");
  }
  if (!walk.twice.empty()) {
    TORCH_WARN("ckpt::apply_checkpointing: '", walk.twice.front().first, "' and '",
               walk.twice.front().second,
               "' are the same module, registered twice in this tree (a PlannedSequential "
               "registered beside the Sequential it runs, say): the tree's parameters() lists its "
               "parameters twice, so an optimizer built from it updates them twice. Register it "
               "once, or build the optimizer from ckpt::distinct_parameters(root).");
  }
}

}  // namespace

void apply_checkpointing(torch::nn::Module& root, const Predicate& predicate,
                         const CheckpointOptions& options) {
  TORCH_CHECK(predicate != nullptr, "ckpt::apply_checkpointing: the predicate is empty.");
  Walk walk{predicate, {}, {}, {}, {}};
  find_matches(walk, root, "");
  warn_about(walk);
  for (const Match& match : walk.matches) {
    torch::nn::AnyModule& element = *(match.sequential->begin() + match.index);
    torch::nn::AnyModule wrapped(Checkpointed(element, options));
    element = wrapped;  // what the Sequential's forward calls
    match.sequential->replace_module(match.key, wrapped.ptr());  // what its tree shows
  }
}

std::vector<at::Tensor> distinct_parameters(const torch::nn::Module& module) {
  std::vector<at::Tensor> distinct;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& parameter : module.parameters()) {
    if (seen.insert(parameter.unsafeGetTensorImpl()).second) distinct.push_back(parameter);
  }
  return distinct;
}

}  // namespace ckpt
