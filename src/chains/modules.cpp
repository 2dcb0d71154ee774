#include <ckpt/candidate.h>
#include <ckpt/modules.h>

#include <c10/util/Exception.h>

#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace ckpt {

namespace {

// Registers `wrapped`'s own parameters, buffers and children in `wrapper` under their own names,
// so that the wrapper adds no prefix to any parameter or buffer name.
void adopt_members(torch::nn::Module& wrapper, torch::nn::Module& wrapped) {
  for (const auto& item : wrapped.named_parameters(/*recurse=*/false)) {
    wrapper.register_parameter(item.key(), item.value(), item.value().requires_grad());
  }
  for (const auto& item : wrapped.named_buffers(/*recurse=*/false)) {
    wrapper.register_buffer(item.key(), item.value());
  }
  for (const auto& item : wrapped.named_children())
    wrapper.register_module(item.key(), item.value());
}

}  // namespace

CheckpointedBase::CheckpointedBase(std::shared_ptr<torch::nn::Module> wrapped,
                                   const CheckpointOptions& options)
    : options(options), wrapped_(std::move(wrapped)) {
  adopt_members(*this, *wrapped_);
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

constexpr const char* kApplyCheckpointing = "ckpt::apply_checkpointing";

// An element of a Sequential marked as a candidate by apply_candidates: its forward is
// `ckpt::candidate(element, x)`, named after the element's path. It adopts the element's members
// under their own names, as Checkpointed does.
class CandidateMark final : public torch::nn::Module {
 public:
  explicit CandidateMark(torch::nn::AnyModule element) : element_(std::move(element)) {
    adopt_members(*this, *element_.ptr());
  }

  void train(bool on = true) override {
    torch::nn::Module::train(on);
    element_.ptr()->train(on);  // a leaf such as Dropout is not among the adopted children
  }

  at::Tensor forward(const at::Tensor& input) {
    detail::CandidateRunner* runner = detail::active_candidate_runner();
    if (runner == nullptr) return element_.forward<at::Tensor>(input);
    auto run = [this](const at::Tensor& x) { return element_.forward<at::Tensor>(x); };
    std::tuple<at::Tensor> args(input);
    return detail::run_as_candidate(runner, std::string(), shared_from_this(), run, args);
  }

  void pretty_print(std::ostream& stream) const override { stream << "ckpt::Candidate"; }

 private:
  torch::nn::AnyModule element_;
};

// A wrapper of ckpt's own: walks don't wrap it again, or look inside.
bool is_wrapper(const torch::nn::Module& module) {
  return dynamic_cast<const CheckpointedBase*>(&module) != nullptr ||
         dynamic_cast<const CandidateMark*>(&module) != nullptr;
}

struct Match {
  torch::nn::SequentialImpl* sequential;
  size_t index;  // the element's position in the Sequential
  std::string key;
};

// What the walk has seen: each module once by address (a module registered at two places in the
// tree is one object), and the matches found inside a match, which are not wrapped again.
struct Walk {
  const char* api;  // "ckpt::apply_checkpointing", for messages
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
    if (is_wrapper(child)) continue;  // checkpointed or marked already
    if (!walk.predicate(name, child)) {
      find_matches(walk, child, name);
      continue;
    }
    TORCH_CHECK(sequential != nullptr, walk.api, ": '", name, "' (", child.name(),
                ") matches, but it is a member of ", parent.name(),
                ", whose C++ forward calls it directly, so it can't be wrapped behind its back; "
                "only the elements of a torch::nn::Sequential can. ",
                walk.api == std::string(kApplyCheckpointing)
                    ? "Wrap it where it is registered, as in `block = register_module(\"block\", "
                      "ckpt::Checkpointed(Block(...)))`"
                    : "Mark it where your forward calls it, as in `x = ckpt::candidate(block, x)` "
                      "(for a ModuleList's elements, `ckpt::candidates<Block>(list, x)`)",
                ", or narrow the predicate. Nothing was changed.");
    walk.matches.push_back({sequential, i, key});
    find_nested(walk, child, name, name);
  }
}

void warn_about(const Walk& walk) {
  if (!walk.nested.empty()) {
    TORCH_WARN(walk.api, ": '", walk.nested.front().second, "'",
               walk.nested.size() > 1 ? " and " + std::to_string(walk.nested.size() - 1) + " more"
                                      : std::string(),
               " match inside '", walk.nested.front().first,
               "', which is wrapped whole, and are not wrapped again: a region inside a region is "
               "recomputed twice, and candidates do not nest. Narrow the predicate to the modules "
               "you mean.");
  }
  if (!walk.twice.empty()) {
    TORCH_WARN(walk.api, ": '", walk.twice.front().first, "' and '", walk.twice.front().second,
               "' are the same module, registered twice in this tree (a PlannedSequential "
               "registered beside the Sequential it runs, say): the tree's parameters() lists its "
               "parameters twice, so an optimizer built from it updates them twice. Register it "
               "once, or build the optimizer from ckpt::distinct_parameters(root).");
  }
}

// Replaces every match below `root` with `wrap(element)`, in the Sequential's forward and in the
// tree, after checking all of them.
void wrap_matches(const char* api, torch::nn::Module& root, const Predicate& predicate,
                  const std::function<torch::nn::AnyModule(torch::nn::AnyModule&)>& wrap) {
  TORCH_CHECK(predicate != nullptr, api, ": the predicate is empty.");
  Walk walk{api, predicate, {}, {}, {}, {}};
  find_matches(walk, root, "");
  warn_about(walk);
  for (const Match& match : walk.matches) {
    torch::nn::AnyModule& element = *(match.sequential->begin() + match.index);
    torch::nn::AnyModule wrapped = wrap(element);
    element = wrapped;  // what the Sequential's forward calls
    match.sequential->replace_module(match.key, wrapped.ptr());  // what its tree shows
  }
}

}  // namespace

void apply_checkpointing(torch::nn::Module& root, const Predicate& predicate,
                         const CheckpointOptions& options) {
  wrap_matches(kApplyCheckpointing, root, predicate, [&](torch::nn::AnyModule& element) {
    return torch::nn::AnyModule(Checkpointed(element, options));
  });
}

void apply_candidates(torch::nn::Module& root, const Predicate& predicate) {
  wrap_matches("ckpt::apply_candidates", root, predicate, [](torch::nn::AnyModule& element) {
    return torch::nn::AnyModule(std::make_shared<CandidateMark>(element));
  });
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
