#include <ckpt/modeled_device.h>

#include <ckpt/memory_tracker.h>

#include "autograd/dispatch_mode.h"
#include "autograd/value_text.h"
#include "compat/torch_compat.h"
#include "compat/version.h"
#include "measure/meta_memory.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/zeros.h>
#include <c10/core/Allocator.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace ckpt {
namespace {

// ~~~ Memory: the meta device's allocations, counted as the modeled device counts them ~~~

std::atomic<int64_t> g_granularity{1};
std::atomic<int64_t> g_current{0};
std::atomic<int64_t> g_peak{0};
// The modeled clock of this thread, from its ModeledDevice's start: profiles are the same whatever
// ran before (a clock that went on would round their times differently).
thread_local int64_t t_picoseconds = 0;
// Random draws on meta tensors, and the modeled device's random-state size, of this thread.
thread_local int64_t t_random_draws = 0;
thread_local int64_t t_random_state_bytes = 0;

// Meta tensors hold no data: each allocation returns a null data pointer whose context records
// the bytes counted, so that freeing the storage gives them back.
class CountingMetaAllocator final : public compat::AllocatorBase {
 public:
  c10::DataPtr allocate_bytes(size_t bytes) const override {
    const c10::Device meta(c10::DeviceType::Meta);
    if (bytes == 0) return {nullptr, meta};
    const int64_t unit = g_granularity.load();
    const int64_t rounded = (static_cast<int64_t>(bytes) + unit - 1) / unit * unit;
    const int64_t now = g_current.fetch_add(rounded) + rounded;
    int64_t peak = g_peak.load();
    while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
    }
    return {nullptr, new int64_t(rounded), &CountingMetaAllocator::free_block, meta};
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }

 private:
  static void free_block(void* context) {
    auto* rounded = static_cast<int64_t*>(context);
    g_current.fetch_sub(*rounded);
    delete rounded;
  }
};

void install_counting_allocator() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Kept for the process: meta storages made while modeling may outlive the guard.
    static auto* allocator = new CountingMetaAllocator();
    c10::SetAllocator(c10::DeviceType::Meta, allocator, /*priority=*/255);
  });
}

// ~~~ Meta kernels LibTorch lacks in C++ (its Python side registers them) ~~~

// An int or a concrete SymInt (2.x schemas take SymInt where 1.13's take int).
int64_t int_of(const c10::IValue& value) {
#if CKPT_TORCH_AT_LEAST(2, 0)
  if (value.isSymInt()) return value.toSymInt().expect_int();
#endif
  return value.toInt();
}

std::vector<int64_t> int_list(const c10::IValue& value) {
  if (value.isIntList()) return value.toIntVector();
  std::vector<int64_t> ints;
  for (const c10::IValue& element : value.toListRef()) ints.push_back(int_of(element));
  return ints;
}

// The output sizes of a convolution (transposed or not).
std::vector<int64_t> convolution_sizes(const at::Tensor& input, const at::Tensor& weight,
                                       const std::vector<int64_t>& stride,
                                       const std::vector<int64_t>& padding,
                                       const std::vector<int64_t>& dilation, bool transposed,
                                       const std::vector<int64_t>& output_padding, int64_t groups) {
  std::vector<int64_t> sizes{input.size(0), transposed ? weight.size(1) * groups : weight.size(0)};
  for (int64_t d = 2; d < input.dim(); ++d) {
    const size_t i = static_cast<size_t>(d - 2);
    const int64_t kernel = dilation[i] * (weight.size(d) - 1);
    sizes.push_back(transposed ? (input.size(d) - 1) * stride[i] - 2 * padding[i] + kernel +
                                     output_padding[i] + 1
                               : (input.size(d) + 2 * padding[i] - kernel - 1) / stride[i] + 1);
  }
  return sizes;
}

// convolution_overrideable(input, weight, bias, stride, padding, dilation, transposed,
// output_padding, groups): the output only.
void convolution_meta(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  auto args = torch::jit::last(*stack, 9).vec();
  const at::Tensor input = args[0].toTensor(), weight = args[1].toTensor();
  const auto sizes =
      convolution_sizes(input, weight, int_list(args[3]), int_list(args[4]), int_list(args[5]),
                        args[6].toBool(), int_list(args[7]), int_of(args[8]));
  torch::jit::drop(*stack, 9);
  torch::jit::push(*stack, at::empty(sizes, input.options()));
}

// convolution_backward_overrideable(grad_output, input, weight, stride, padding, dilation,
// transposed, output_padding, groups, output_mask): the gradients the mask asks for.
void convolution_backward_meta(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  auto args = torch::jit::last(*stack, 10).vec();
  const at::Tensor grad_output = args[0].toTensor(), input = args[1].toTensor(),
                   weight = args[2].toTensor();
  const auto mask = args[9].toBoolList();
  torch::jit::drop(*stack, 10);
  const auto made = [&](size_t i, at::IntArrayRef sizes) {
    return mask.get(i) ? at::empty(sizes, grad_output.options()) : at::Tensor();
  };
  torch::jit::push(*stack, made(0, input.sizes()), made(1, weight.sizes()),
                   made(2, {grad_output.size(1)}));
}

// Registered once, only for operators without a meta kernel of their own.
void register_meta_kernels() {
  static std::once_flag once;
  std::call_once(once, [] {
    static auto* library = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::Meta,
                                              __FILE__, __LINE__);
    const auto missing = [](const char* name) {
      return !c10::Dispatcher::singleton().findSchemaOrThrow(name, "").hasKernelForDispatchKey(
          c10::DispatchKey::Meta);
    };
    if (missing("aten::convolution_overrideable")) {
      library->impl("convolution_overrideable",
                    torch::CppFunction::makeFromBoxedFunction<&convolution_meta>());
    }
    if (missing("aten::convolution_backward_overrideable")) {
      library->impl("convolution_backward_overrideable",
                    torch::CppFunction::makeFromBoxedFunction<&convolution_backward_meta>());
    }
  });
}

// ~~~ The cost model ~~~

int64_t tensor_bytes(const at::Tensor& t) {
  return static_cast<int64_t>(t.numel()) * static_cast<int64_t>(t.element_size());
}

// Multiply-adds of a convolution's one pass: each output element (each input element, for a
// transposed one) takes in-channels/groups x kernel of them.
double convolution_flops(const at::Tensor& input, const at::Tensor& output,
                         const at::Tensor& weight, bool transposed) {
  const double per_element = static_cast<double>(weight.numel()) / weight.size(0);
  return 2.0 * per_element * static_cast<double>(transposed ? input.numel() : output.numel());
}

// Floating-point operations of matrix products and convolutions; 0 for everything else, whose
// time the bytes decide.
double flops_of(const std::string& name, const std::vector<c10::IValue>& args,
                const at::Tensor& output) {
  if (!output.defined()) return 0.0;
  const auto tensor = [&](size_t i) { return args.at(i).toTensor(); };
  if (name == "aten::mm" || name == "aten::bmm") {
    return 2.0 * static_cast<double>(output.numel()) * tensor(0).size(-1);
  }
  if (name == "aten::addmm" || name == "aten::baddbmm") {
    return 2.0 * static_cast<double>(output.numel()) * tensor(1).size(-1);
  }
  if (name == "aten::convolution") {
    return convolution_flops(tensor(0), output, tensor(1), args.at(6).toBool());
  }
  return 0.0;
}

double convolution_backward_flops(const std::vector<c10::IValue>& args) {
  const at::Tensor grad_output = args.at(0).toTensor(), input = args.at(1).toTensor();
  const auto mask = args.at(10).toBoolList();
  const double pass =
      convolution_flops(input, grad_output, args.at(2).toTensor(), args.at(7).toBool());
  return pass * ((mask.get(0) ? 1 : 0) + (mask.get(1) ? 1 : 0));
}

// ~~~ The mode: every operator on this thread, timed, run on meta or on zero-filled CPU tensors ~~~

// Operators whose result depends on tensor values, which meta tensors do not have.
const std::unordered_set<std::string>& value_reads() {
  static const std::unordered_set<std::string> names = {"aten::_local_scalar_dense",
                                                        "aten::nonzero",
                                                        "aten::argwhere",
                                                        "aten::masked_select",
                                                        "aten::_unique",
                                                        "aten::_unique2",
                                                        "aten::unique_dim",
                                                        "aten::unique_consecutive",
                                                        "aten::unique_dim_consecutive",
                                                        "aten::bincount",
                                                        "aten::equal",
                                                        "aten::is_nonzero",
                                                        "aten::repeat_interleave"};
  return names;
}

bool reads_values(const std::string& name) {
  return value_reads().count(name) > 0;
}

bool has_mask_index(const std::vector<c10::IValue>& args) {
  bool found = false;
  for (const c10::IValue& arg : args) {
    detail::for_each_tensor(arg, [&](const at::Tensor& t) {
      found = found || t.scalar_type() == at::kBool || t.scalar_type() == at::kByte;
    });
  }
  return found;
}

[[noreturn]] void refuse_value_read(const std::string& label) {
  TORCH_CHECK(false, "ckpt::ModeledDevice: ", label,
              " reads tensor values (an .item(), a boolean mask, an output whose size depends on "
              "values), which a step planned without the device does not have: its tensors are "
              "meta tensors, shapes without data. Plan this model on the device itself "
              "(ckpt::profile_chain or ckpt::profile_model on real tensors), or move the "
              "value-dependent part out of the planned step.");
}

class ModeledMode final : public detail::DispatchMode {
 public:
  explicit ModeledMode(const DeviceProfile& profile) : profile_(profile) {}

  void dispatch(const c10::OperatorHandle& op, torch::jit::Stack* stack) override {
    const auto& schema = op.schema();
    const size_t arity = schema.arguments().size();
    std::vector<c10::IValue> args(stack->end() - static_cast<std::ptrdiff_t>(arity), stack->end());
    const bool meta = touches_meta(args);
    const std::string& name = schema.name();
    if (meta && (reads_values(name) ||
                 ((name == "aten::index" || name == "aten::index_put_") && has_mask_index(args)))) {
      refuse_value_read(detail::operator_label(schema.operator_name()));
    }
    if (meta && op.hasTag(at::Tag::nondeterministic_seeded)) ++t_random_draws;
    run(op, stack);
    if (!meta && !touches_meta(torch::jit::last(*stack, schema.returns().size()).vec())) return;
    t_picoseconds += static_cast<int64_t>(1e12 * seconds(op, args, *stack));
  }

 private:
  static bool touches_meta(const std::vector<c10::IValue>& values) {
    bool meta = false;
    for (const c10::IValue& value : values) {
      detail::for_each_tensor(value, [&](const at::Tensor& t) { meta = meta || t.is_meta(); });
      if (value.isDevice() && value.toDevice().is_meta()) meta = true;
    }
    return meta;
  }

  // Views and allocations launch nothing; everything else costs a launch and the larger of its
  // arithmetic and its memory traffic.
  double seconds(const c10::OperatorHandle& op, const std::vector<c10::IValue>& args,
                 const torch::jit::Stack& stack) const {
    const auto& schema = op.schema();
    const auto& returns = schema.returns();
    if (detail::returns_a_view(op)) return 0.0;
    if (schema.name().rfind("aten::empty", 0) == 0) return 0.0;
    int64_t bytes = 0;
    for (const auto& arg : args)
      detail::for_each_tensor(arg, [&](const at::Tensor& t) { bytes += tensor_bytes(t); });
    const auto outputs = torch::jit::last(stack, returns.size());
    at::Tensor first;
    for (const auto& out : outputs)
      detail::for_each_tensor(out, [&](const at::Tensor& t) {
        bytes += tensor_bytes(t);
        if (!first.defined()) first = t;
      });
    const double flops = schema.name() == "aten::convolution_backward"
                             ? convolution_backward_flops(args)
                             : flops_of(schema.name(), args, first);
    return profile_.seconds_per_operator +
           std::max(flops / profile_.flops_per_second,
                    static_cast<double>(bytes) / profile_.bytes_per_second);
  }

  void run(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    const std::string label = detail::operator_label(op.schema().operator_name());
    const bool convolution = op.schema().name() == "aten::convolution" ||
                             op.schema().name() == "aten::convolution_backward";
    if (on_cpu_.count(label) == 0 && !(convolution && profile_.count_cpu_scratch)) {
      try {
        const size_t below = stack->size() - op.schema().arguments().size();
        const std::vector<c10::IValue> arguments(
            stack->begin() + static_cast<std::ptrdiff_t>(below), stack->end());
        try {
          detail::DispatchMode::run(op, stack);
          return;
        } catch (const c10::NotImplementedError& error) {
          // A missing meta kernel, of the operator or of one it calls (native_layer_norm runs
          // native_batch_norm): run it on the CPU. Not where it is a value read inside the
          // operator (a mask's nonzero inside index): that is an error of its own.
          if (mentions_value_read(error.what())) throw;
          stack->resize(below);
          stack->insert(stack->end(), arguments.begin(), arguments.end());
          on_cpu_.insert(label);
        }
      } catch (const c10::Error& error) {
        TORCH_CHECK(false, "ckpt::ModeledDevice: ", label,
                    " failed on the meta device: ", error.what_without_backtrace());
      }
    }
    run_on_cpu(op, stack, label);
  }

  static bool mentions_value_read(const std::string& message) {
    for (const std::string& name : value_reads()) {
      if (message.find(name) != std::string::npos) return true;
    }
    return false;
  }

  // What an operator without a meta kernel gave on zero-filled CPU tensors, by return: the
  // argument it aliases, or the geometry of each tensor it made; and the kernel's scratch.
  struct TensorGeometry {
    std::vector<int64_t> sizes, strides;
    at::TensorOptions options;
  };
  struct CpuReturn {
    int aliased = -1;  // the argument it is, or -1
    bool list = false;
    std::vector<std::optional<TensorGeometry>> tensors;  // none: undefined
  };
  struct CpuResult {
    std::vector<CpuReturn> returns;
    int64_t scratch = 0;
  };

  // Runs the operator's CPU kernel on zero-filled tensors of the arguments' shapes, and returns
  // meta tensors of its outputs' shapes (the arguments themselves where the operator writes
  // them). With `count_cpu_scratch`, charges what the kernel held beside its arguments and
  // outputs as a short-lived meta allocation. On zeros, what a kernel makes and holds depends on
  // the arguments' geometry and values alone: a call like one seen before (every tensor meta)
  // gets that one's answer without running it again (a ResNet's BatchNorm on every call).
  void run_on_cpu(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                  const std::string& label) {
    const auto& schema = op.schema();
    const size_t arity = schema.arguments().size();
    const std::vector<c10::IValue> metas(stack->end() - static_cast<std::ptrdiff_t>(arity),
                                         stack->end());
    const std::optional<std::string> key = call_key(label, metas);
    const auto known = key ? cpu_results_.find(*key) : cpu_results_.end();
    if (known != cpu_results_.end()) {
      stack->resize(stack->size() - arity);
      for (const CpuReturn& result : known->second.returns) stack->push_back(made(result, metas));
      charge_scratch(known->second.scratch);
      return;
    }
    const CpuResult result = run_on_zeros(op, stack, label, metas);
    if (key) cpu_results_.emplace(*key, result);
  }

  // The call's arguments as text, where every tensor among them is meta (a real tensor's values,
  // or a write into it, would not be in the answer); none otherwise.
  static std::optional<std::string> call_key(const std::string& label,
                                             const std::vector<c10::IValue>& arguments) {
    bool all_meta = true;
    for (const c10::IValue& argument : arguments) {
      detail::for_each_tensor(argument, [&](const at::Tensor& t) { all_meta &= t.is_meta(); });
    }
    if (!all_meta) return std::nullopt;
    detail::ValueText text;
    text.string(label);
    text.word(at::get_num_threads());  // a kernel's scratch may depend on it
    for (const c10::IValue& argument : arguments) text.value(argument);
    if (!text.complete()) return std::nullopt;
    return text.take();
  }

  // A return as `result` describes it: the argument it aliases, or fresh meta tensors.
  static c10::IValue made(const CpuReturn& result, const std::vector<c10::IValue>& metas) {
    if (result.aliased >= 0) return metas[static_cast<size_t>(result.aliased)];
    std::vector<at::Tensor> tensors;
    for (const auto& geometry : result.tensors) {
      tensors.push_back(geometry ? at::empty_strided(geometry->sizes, geometry->strides,
                                                     geometry->options.device(c10::kMeta))
                                 : at::Tensor());
    }
    if (result.list) return tensors;
    return tensors.empty() ? c10::IValue() : c10::IValue(tensors.front());
  }

  void charge_scratch(int64_t scratch) const {
    if (profile_.count_cpu_scratch && scratch > 0) {
      at::empty({scratch}, at::TensorOptions().dtype(at::kByte).device(c10::kMeta));
    }
  }

  CpuResult run_on_zeros(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                         const std::string& label, const std::vector<c10::IValue>& metas) {
    const auto& schema = op.schema();
    const size_t arity = metas.size();
    MemoryTracker tracker(c10::Device(c10::kCPU), MemoryScope::CallingThread);
    std::unordered_map<const c10::TensorImpl*, at::Tensor> cpu_of;
    const auto to_cpu = [&](const at::Tensor& t) {
      if (!t.defined() || !t.is_meta()) return t;
      auto& made = cpu_of[t.unsafeGetTensorImpl()];
      if (!made.defined()) {
        made = at::empty_strided(t.sizes(), t.strides(), t.options().device(c10::kCPU)).zero_();
      }
      return made;
    };
    for (size_t i = 0; i < arity; ++i) {
      (*stack)[stack->size() - arity + i] = map_tensors(metas[i], to_cpu);
    }
    tracker.reset_peak();
    try {
      op.callBoxed(stack);
    } catch (const c10::Error& error) {
      TORCH_CHECK(false, "ckpt::ModeledDevice: ", label,
                  " has no meta kernel and failed on zero-filled CPU tensors of its arguments' "
                  "shapes: ",
                  error.what_without_backtrace());
    }
    CpuResult result;
    result.scratch = tracker.peak_bytes() - tracker.current_bytes();
    cpu_of.clear();
    const auto& returns = schema.returns();
    for (size_t j = 0; j < returns.size(); ++j) {
      c10::IValue& out = (*stack)[stack->size() - returns.size() + j];
      TORCH_CHECK(out.isTensor() || out.isTensorList() || out.isNone(),
                  "ckpt::ModeledDevice: ", label, " returns a ", out.tagKind(),
                  ", a value computed from tensor data, which meta tensors do not have.");
      CpuReturn described;
      const auto* written = returns[j].alias_info();
      described.aliased = written != nullptr ? aliased_index(schema, *written) : -1;
      described.list = out.isTensorList();
      if (described.aliased < 0) {
        map_tensors(out, [&](const at::Tensor& t) {
          described.tensors.push_back(t.defined()
                                          ? std::optional<TensorGeometry>(TensorGeometry{
                                                t.sizes().vec(), t.strides().vec(), t.options()})
                                          : std::nullopt);
          return t;
        });
      }
      out = made(described, metas);
      result.returns.push_back(std::move(described));
    }
    charge_scratch(result.scratch);
    return result;
  }

  // The argument a return aliases (an in-place or out= operator's self or out), or -1.
  static int aliased_index(const c10::FunctionSchema& schema, const c10::AliasInfo& alias) {
    for (size_t i = 0; i < schema.arguments().size(); ++i) {
      const auto* info = schema.arguments()[i].alias_info();
      if (info != nullptr && info->beforeSets() == alias.beforeSets()) return static_cast<int>(i);
    }
    return -1;
  }

  template <class Fn>
  static c10::IValue map_tensors(const c10::IValue& value, const Fn& fn) {
    if (value.isTensor()) return fn(value.toTensor());
    if (value.isTensorList()) {
      std::vector<at::Tensor> mapped;
      for (const at::Tensor& t : value.toTensorVector()) mapped.push_back(fn(t));
      return mapped;
    }
    if (value.isList()) {
      c10::List<c10::optional<at::Tensor>> mapped;
      bool tensors = false;
      for (const c10::IValue& element : value.toListRef()) {
        if (!element.isTensor() && !element.isNone()) return value;
        tensors = true;
        mapped.push_back(element.isTensor() ? c10::optional<at::Tensor>(fn(element.toTensor()))
                                            : c10::nullopt);
      }
      if (tensors) return mapped;
    }
    return value;
  }

  DeviceProfile profile_;
  std::unordered_set<std::string> on_cpu_;  // operators without a meta kernel, seen once
  std::unordered_map<std::string, CpuResult> cpu_results_;  // by call_key
};

thread_local bool t_modeling = false;
// The meta allocator's count and granularity are the process's: one modeled device at a time.
std::atomic<bool> g_modeling{false};

}  // namespace

namespace detail {

int64_t meta_allocated_bytes() {
  return g_current.load();
}
int64_t meta_peak_bytes() {
  return g_peak.load();
}
void reset_meta_peak() {
  g_peak.store(g_current.load());
}
int64_t meta_granularity() {
  return g_granularity.load();
}
bool modeling_on_this_thread() {
  return t_modeling;
}
double modeled_seconds() {
  return static_cast<double>(t_picoseconds) * 1e-12;
}
int64_t modeled_random_draws() {
  return t_random_draws;
}
int64_t modeled_random_state_bytes() {
  return t_modeling ? t_random_state_bytes : 0;
}

}  // namespace detail

struct ModeledDevice::State {
  explicit State(const DeviceProfile& p)
      : profile(p), mode(std::make_unique<ModeledMode>(p)), guard(*mode) {}
  DeviceProfile profile;
  std::unique_ptr<detail::DispatchMode> mode;
  detail::DispatchModeGuard guard;
  double start = detail::modeled_seconds();
};

ModeledDevice::ModeledDevice(const DeviceProfile& profile) {
  TORCH_CHECK(!t_modeling,
              "ckpt::ModeledDevice: a modeled device is already active on this thread; model "
              "one device at a time.");
  TORCH_CHECK(profile.allocation_granularity >= 1 && profile.flops_per_second > 0 &&
                  profile.bytes_per_second > 0 && profile.seconds_per_operator >= 0 &&
                  profile.random_state_bytes >= 0,
              "ckpt::ModeledDevice: the profile of '", profile.name,
              "' needs a granularity of at least 1 byte, positive throughputs and a random "
              "state of at least 0 bytes; got ",
              profile.allocation_granularity, " B, ", profile.flops_per_second, " FLOP/s, ",
              profile.bytes_per_second, " B/s, ", profile.seconds_per_operator, " s, ",
              profile.random_state_bytes, " B.");
  bool idle = false;
  TORCH_CHECK(g_modeling.compare_exchange_strong(idle, true),
              "ckpt::ModeledDevice: another thread models a device now; the meta device's "
              "allocation count is the process's, so model one device at a time.");
  try {
    install_counting_allocator();
    register_meta_kernels();
    g_granularity.store(profile.allocation_granularity);
    t_picoseconds = 0;
    t_random_draws = 0;
    t_random_state_bytes = profile.random_state_bytes;
    state_ = std::make_unique<State>(profile);
  } catch (...) {
    g_granularity.store(1);
    g_modeling.store(false);
    throw;
  }
  t_modeling = true;
}

ModeledDevice::~ModeledDevice() {
  state_.reset();
  g_granularity.store(1);
  t_modeling = false;
  g_modeling.store(false);
}

const DeviceProfile& ModeledDevice::profile() const {
  return state_->profile;
}

double ModeledDevice::seconds() const {
  return detail::modeled_seconds() - state_->start;
}

namespace {

// What Tensor::set_data does, without its check that both sides are the same kind of tensor:
// the tensor keeps its identity, autograd state and version counter.
// Returns the gradient accumulator the tensor had cached, and drops it: a graph still alive from
// before (a clone of a parameter, say) keeps it, and with it the old device, which the engine
// would check the new device's gradients against.
using Accumulator = decltype(torch::autograd::AutogradMeta::grad_accumulator_);

std::optional<Accumulator> replace_data(const at::Tensor& tensor, const at::Tensor& data) {
  tensor.unsafeGetTensorImpl()->shallow_copy_from(data.getIntrusivePtr());
  auto* autograd = torch::autograd::impl::get_autograd_meta(tensor);
  if (autograd == nullptr) return std::nullopt;
  std::optional<Accumulator> cached(autograd->grad_accumulator_);
  autograd->grad_accumulator_.reset();
  return cached;
}

at::Tensor meta_like(const at::Tensor& t) {
  return at::empty_strided(t.sizes(), t.strides(), t.options().device(c10::kMeta));
}

// The parameters and buffers of some modules on the meta device for its lifetime; their data,
// and the parameters' gradients, come back afterwards.
class OnMeta {
 public:
  explicit OnMeta(const std::vector<torch::nn::AnyModule>& stages) {
    std::unordered_set<const c10::TensorImpl*> seen;
    for (const auto& stage : stages) {
      for (const at::Tensor& t : stage.ptr()->parameters()) move(t, seen, /*parameter=*/true);
      for (const at::Tensor& t : stage.ptr()->buffers()) move(t, seen, /*parameter=*/false);
    }
  }
  ~OnMeta() {
    for (Moved& m : moved_) {
      replace_data(m.tensor, m.data);
      auto* autograd = torch::autograd::impl::get_autograd_meta(m.tensor);
      if (autograd != nullptr && m.accumulator) autograd->grad_accumulator_ = *m.accumulator;
      if (m.parameter) m.tensor.mutable_grad() = m.grad;
    }
  }
  OnMeta(const OnMeta&) = delete;
  OnMeta& operator=(const OnMeta&) = delete;

 private:
  struct Moved {
    at::Tensor tensor, data, grad;
    bool parameter;
    std::optional<Accumulator> accumulator;
  };
  void move(const at::Tensor& t, std::unordered_set<const c10::TensorImpl*>& seen, bool parameter) {
    if (!t.defined() || t.is_meta() || !seen.insert(t.unsafeGetTensorImpl()).second) return;
    Moved m{t, t.detach(), parameter ? t.grad() : at::Tensor(), parameter, std::nullopt};
    if (parameter) m.tensor.mutable_grad() = at::Tensor();
    m.accumulator = replace_data(t, meta_like(t));
    moved_.push_back(std::move(m));
  }
  std::vector<Moved> moved_;
};

at::Tensor meta_sample(const at::Tensor& sample) {
  return at::empty(sample.sizes(), sample.options().device(c10::kMeta))
      .requires_grad_(sample.requires_grad());
}

}  // namespace

void move_to_meta(torch::nn::Module& module) {
  install_counting_allocator();
  for (at::Tensor& p : module.parameters()) {
    if (p.is_meta()) continue;
    if (p.grad().defined()) p.mutable_grad() = at::Tensor();
    replace_data(p, meta_like(p));
  }
  for (at::Tensor& b : module.buffers()) {
    if (b.defined() && !b.is_meta()) replace_data(b, meta_like(b));
  }
}

plan::Chain ModeledProfiler::profile(const std::vector<torch::nn::AnyModule>& stages,
                                     const at::Tensor& sample_input) {
  install_counting_allocator();
  const OnMeta on_meta(stages);
  const ModeledDevice modeled(device_);
  return profile_chain(stages, meta_sample(sample_input), options_);
}

int64_t ModeledProfiler::no_checkpoint_peak(const std::vector<torch::nn::AnyModule>& stages,
                                            const at::Tensor& sample_input) {
  install_counting_allocator();
  const OnMeta on_meta(stages);
  const ModeledDevice modeled(device_);
  return measure_no_checkpoint_peak(stages, meta_sample(sample_input), options_);
}

}  // namespace ckpt
