#include "rng_state.h"

#include "compat/torch_compat.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>
#include <c10/util/hash.h>
#include <torch/version.h>
#include <cstring>

#include <algorithm>
#include <functional>
#include <mutex>
#include <set>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <utility>

namespace ckpt {
namespace detail {
namespace {

at::Tensor read_state(at::Generator generator) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

// Writes of a state into each generator (replays, put-backs), by every thread and by this one:
// their difference counts the other threads' writes, which may have fed a forward's draws.
class WriteCounts {
 public:
  void count(const at::Generator& generator) {
    const void* key = generator.unsafeGetGeneratorImpl();
    ++own_[key];
    const std::lock_guard<std::mutex> lock(mutex_);
    ++all_[key];
  }
  uint64_t by_other_threads(const at::Generator& generator) {
    const void* key = generator.unsafeGetGeneratorImpl();
    const auto own = own_.find(key);
    const uint64_t mine = own == own_.end() ? 0 : own->second;
    const std::lock_guard<std::mutex> lock(mutex_);
    const auto all = all_.find(key);
    return (all == all_.end() ? 0 : all->second) - mine;
  }

 private:
  std::mutex mutex_;
  std::unordered_map<const void*, uint64_t> all_;  // default generators live as long as the process
  static thread_local std::unordered_map<const void*, uint64_t> own_;
};
thread_local std::unordered_map<const void*, uint64_t> WriteCounts::own_;

WriteCounts& write_counts() {
  static WriteCounts* counts = new WriteCounts();  // never destroyed: used from static destructors
  return *counts;
}

void write_state(at::Generator& generator, const at::Tensor& state) {
  {
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(state);
  }
  write_counts().count(generator);
}

at::Generator cpu_generator() {
  return at::detail::getDefaultCPUGenerator();
}

// Arguments on a device type whose generators this LibTorch doesn't give ckpt (PrivateUse1 on
// 1.13; before 2.3, every type but CUDA): its random draws can't be replayed in the recompute.
// Said once per type and process, as a training loop would repeat it at every step.
void warn_if_unreachable(const std::vector<at::Tensor>& inputs, c10::DeviceType type) {
  // Meta tensors have no values, so no random numbers to replay.
  if (type == c10::DeviceType::CPU || type == c10::DeviceType::Meta) return;
  const bool on_device = std::any_of(inputs.begin(), inputs.end(), [&](const at::Tensor& t) {
    return t.defined() && t.device().type() == type;
  });
  if (!on_device) return;
  static std::mutex mutex;
  static std::set<c10::DeviceType> warned;
  {
    const std::lock_guard<std::mutex> lock(mutex);
    if (!warned.insert(type).second) return;
  }
  TORCH_WARN("ckpt: the arguments of a checkpointed region are on ", c10::DeviceTypeName(type),
             ", whose random number generators LibTorch ", TORCH_VERSION,
             " doesn't expose, so that device's RNG state can't be preserved: random operators "
             "on it inside the region (dropout, say) draw other numbers in the recompute, and the "
             "gradients differ from an unchecked run's. Keep such operators out of checkpointed "
             "regions, or pass preserve_rng_state(false) to accept it. (Said once per device "
             "type.)");
}

}  // namespace

size_t generator_state_hash(at::Generator generator) {
  if (generator.device().is_cpu()) {
    // From the engine, without a tensor: a read per random operator allocates nothing.
    auto* cpu = at::check_generator<at::CPUGeneratorImpl>(generator);
    std::lock_guard<std::mutex> lock(generator.mutex());
    const at::mt19937_data_pod data = cpu->engine().data();
    const auto float_sample = cpu->next_float_normal_sample();
    const auto double_sample = cpu->next_double_normal_sample();
    const std::string_view words(reinterpret_cast<const char*>(data.state_.data()),
                                 data.state_.size() * sizeof(data.state_[0]));
    return c10::get_hash(std::hash<std::string_view>()(words), data.seed_, data.left_, data.next_,
                         float_sample.has_value() ? *float_sample : 0.0F, float_sample.has_value(),
                         double_sample.has_value() ? *double_sample : 0.0,
                         double_sample.has_value());
  }
  const at::Tensor state = read_state(generator);
  return std::hash<std::string_view>()(
      std::string_view(static_cast<const char*>(state.data_ptr()), state.nbytes()));
}

RngStash::RngStash(const std::vector<at::Tensor>& inputs, c10::DeviceType device_type)
    : cpu_state_(read_state(cpu_generator())), device_type_(device_type) {
  cpu_end_.replays_at_stash = write_counts().by_other_threads(cpu_generator());
  had_device_ = compat::device_initialized(device_type_);
  if (!had_device_) {
    warn_if_unreachable(inputs, device_type_);
    return;
  }
  std::vector<c10::DeviceIndex> indices;
  for (const auto& tensor : inputs) {
    if (tensor.defined() && tensor.device().type() == device_type_) {
      indices.push_back(tensor.device().index());
    }
  }
  std::sort(indices.begin(), indices.end());
  indices.erase(std::unique(indices.begin(), indices.end()), indices.end());
  for (auto index : indices) {
    at::Generator generator = compat::default_generator(c10::Device(device_type_, index));
    device_states_.push_back(read_state(generator));
    device_ends_.emplace_back().replays_at_stash = write_counts().by_other_threads(generator);
    device_generators_.push_back(std::move(generator));
  }
}

bool same_state(const at::Tensor& a, const at::Tensor& b) {
  // Generator states are small contiguous byte tensors: compare the bytes directly.
  return a.nbytes() == b.nbytes() && std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

int64_t cpu_random_state_bytes() {
  return static_cast<int64_t>(read_state(cpu_generator()).nbytes());
}

void RngStash::note_forward_end(const std::optional<RandomDraws>& draws) {
  const auto note = [](ForwardEnd& end, const at::Generator& generator, const at::Tensor& stash) {
    const at::Tensor now = read_state(generator);
    end.moved = !same_state(stash, now);
    if (end.moved) end.state_hash = generator_state_hash(generator);  // unmoved: the stash
    end.beside_replay = write_counts().by_other_threads(generator) != end.replays_at_stash;
  };
  if (cpu_state_.defined()) {
    note(cpu_end_, cpu_generator(), cpu_state_);
    // Unmoved, and undisturbed or seen to draw nothing: the forward drew nothing here.
    const bool seen_not_drawing = draws && !draws->drew_on_cpu();
    if (!cpu_end_.moved && (!cpu_end_.beside_replay || seen_not_drawing)) cpu_state_.reset();
  }
  for (size_t i = 0; i < device_generators_.size(); ++i) {
    note(device_ends_[i], device_generators_[i], device_states_[i]);
  }
  forward_ended_ = true;
}

bool RngStash::ForwardEnd::fed(const std::optional<RandomDraws>& draws, bool cpu) const {
  if (draws) return cpu ? draws->drew_on_cpu() : draws->drew_on_device();
  return moved;  // a replay that put the state back hides draws from this
}

bool RngStash::forward_beside_replay(const std::optional<RandomDraws>& draws) const {
  if (cpu_state_.defined() && cpu_end_.beside_replay && cpu_end_.fed(draws, true)) return true;
  return std::any_of(device_ends_.begin(), device_ends_.end(), [&](const ForwardEnd& end) {
    return end.beside_replay && end.fed(draws, false);
  });
}

void RngStash::restore() const {
  if (cpu_state_.defined()) {
    at::Generator cpu = cpu_generator();
    write_state(cpu, cpu_state_);
  }
  for (size_t i = 0; i < device_generators_.size(); ++i) {
    at::Generator generator = device_generators_[i];
    write_state(generator, device_states_[i]);
  }
}

RngFork::RngFork(const RngStash& stash) : stash_(stash), generators_(stash.device_generators_) {
  if (stash.cpu_state_.defined()) {
    saved_cpu_state_ = read_state(cpu_generator());
    replays_at_fork_.push_back(write_counts().by_other_threads(cpu_generator()));
  }
  for (const auto& generator : generators_) {
    replays_at_fork_.push_back(write_counts().by_other_threads(generator));
  }
  for (auto& generator : generators_) saved_device_states_.push_back(read_state(generator));
  stash.restore();
}

void RngFork::check_drew_as_forward(const std::optional<RandomDraws>& forward_draws,
                                    const std::optional<RandomDraws>& recompute_draws,
                                    const char* who, const char* skip_hint) const {
  if (!stash_.forward_ended_) return;  // a forward run again: nothing to compare with
  // The function drew elsewhere this time (a module in another mode): the graphs tell how.
  if (forward_draws && recompute_draws && !forward_draws->same_generators(*recompute_draws)) {
    return;
  }
  std::vector<std::tuple<at::Generator, const at::Tensor*, const RngStash::ForwardEnd*, bool>>
      written;  // each generator the fork wrote, its stash, how the forward left it, and the CPU?
  if (stash_.cpu_state_.defined()) {
    written.emplace_back(cpu_generator(), &stash_.cpu_state_, &stash_.cpu_end_, true);
  }
  for (size_t i = 0; i < generators_.size(); ++i) {
    written.emplace_back(generators_[i], &stash_.device_states_[i], &stash_.device_ends_[i], false);
  }
  const auto check = [&](bool as_forward, const std::string& generator) {
    TORCH_CHECK(as_forward, who, ": the recompute drew other random numbers than the forward pass ",
                "did from ", generator,
                ", so its random operators (dropout, say) did not make the forward's values, and "
                "the gradients would not be those of the forward. Another thread drew from that "
                "generator, or wrote a state into it, while the forward or this recompute ran "
                "(LibTorch's default generators serve every thread), or the function draws "
                "another amount of random numbers when it runs again. Run steps that draw random "
                "numbers inside checkpointed regions one thread at a time (a mutex around forward "
                "and backward), or keep the random operators out of the regions.",
                skip_hint);
  };
  // Watched both times: each draw must start and end where the forward's did.
  if (forward_draws && recompute_draws) {
    const auto& expected = forward_draws->states;
    const auto parted =
        std::mismatch(expected.begin(), expected.end(), recompute_draws->states.begin());
    if (parted.first != expected.end()) {
      const c10::Device device = forward_draws->devices.at((parted.first - expected.begin()) / 2);
      const bool stashed =
          device.is_cpu()
              ? stash_.cpu_state_.defined()
              : std::any_of(generators_.begin(), generators_.end(),
                            [&](const at::Generator& g) { return g.device() == device; });
      TORCH_CHECK(stashed, who, ": the function drew random numbers on ", device,
                  ", where none of the region's tensor arguments is, so the region did not stash "
                  "that device's random state (as in PyTorch) and the recompute drew other "
                  "numbers: the gradients would not be those of the forward. Pass a tensor on ",
                  device, " as an argument to have its state stashed too.", skip_hint);
      check(false, c10::str("the ", device, " generator"));
    }
  }
  for (size_t i = 0; i < written.size(); ++i) {
    const auto& [generator, stash, end, cpu] = written[i];
    const bool fed = end->fed(forward_draws, cpu);
    if (forward_draws && !fed) continue;  // seen to draw nothing from it: nothing to replay
    // Unwatched, a recompute that drew nothing here stands where the stash was (another thread's
    // draws moved the generator during the forward).
    const bool at_stash = same_state(read_state(generator), *stash);
    const bool where_forward_ended =
        end->moved ? generator_state_hash(generator) == end->state_hash : at_stash;
    const bool as_forward = where_forward_ended || (!forward_draws && at_stash);
    const bool disturbed = fed && write_counts().by_other_threads(generator) != replays_at_fork_[i];
    check(as_forward && !disturbed, c10::str("the ", generator.device(), " generator"));
  }
}

RngFork::~RngFork() {
  if (saved_cpu_state_.defined()) {
    at::Generator cpu = cpu_generator();
    write_state(cpu, saved_cpu_state_);
  }
  for (size_t i = 0; i < generators_.size(); ++i) {
    write_state(generators_[i], saved_device_states_[i]);
  }
}

}  // namespace detail
}  // namespace ckpt
