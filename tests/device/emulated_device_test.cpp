// The emulated accelerator itself (ckpt::emulated_device): operators on its memory, its allocator's
// statistics, its generators, the autograd engine's device threads, streams and events, autocast.

#include <ckpt/emulated_device.h>
#include <ckpt/memory_tracker.h>

#include "emulated_device/streams.h"
#include "support/support.h"

#include <ATen/autocast_mode.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>

#include <torch/cuda.h>

#include <chrono>
#include <thread>

namespace emulated_device_test {

using ckpt::test::bit_equal;

c10::Device dev(int index = 0) {
  return ckpt::emulated_device::device(index);
}

torch::TensorOptions on(int index = 0) {
  return torch::TensorOptions().device(dev(index));
}

const c10::impl::DeviceGuardImplInterface& guard_impl() {
  return *c10::impl::getDeviceGuardImpl(c10::DeviceType::PrivateUse1);
}

// The emulated accelerator's own tests, where main() installed it: not beside a CUDA device.
class EmulatedDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!ckpt::emulated_device::installed()) {
      GTEST_SKIP() << "the emulated device is not installed: this process has a CUDA device";
    }
  }
};

// Beside a CUDA device, LibTorch 2.9+ would take the emulated accelerator for the process's
// accelerator and fail every CUDA backward pass after it: install() refuses, and CUDA still works.
TEST(EmulatedDeviceBesideCuda, InstallIsRefusedAndCudaBackwardStillRuns) {
  if (!ckpt::emulated_device::has_accelerator_hooks() || !torch::cuda::is_available()) {
    GTEST_SKIP() << "needs a CUDA device and LibTorch 2.9 or later";
  }
  CKPT_EXPECT_THROWS_WITH(ckpt::emulated_device::install(1), "this process has a CUDA device");
  EXPECT_FALSE(ckpt::emulated_device::installed());
  const auto x = torch::ones({4}, torch::TensorOptions().device(torch::kCUDA)).requires_grad_();
  x.mul(3).sum().backward();
  EXPECT_TRUE(torch::equal(x.grad().cpu(), torch::full({4}, 3.0)));
}

TEST_F(EmulatedDeviceTest, InstallIsIdempotentAndKeepsItsDeviceCount) {
  ckpt::emulated_device::install(2);  // main() installed it with 2 devices
  EXPECT_TRUE(ckpt::emulated_device::installed());
  EXPECT_EQ(ckpt::emulated_device::device_count(), 2);
  EXPECT_EQ(guard_impl().deviceCount(), 2);
  CKPT_EXPECT_THROWS_WITH(ckpt::emulated_device::install(3), "installed with 2 device(s)");
  CKPT_EXPECT_THROWS_WITH(ckpt::emulated_device::install(0), "between 1 and 16");
  CKPT_EXPECT_THROWS_WITH(ckpt::emulated_device::device(2), "out of range");
  EXPECT_EQ(torch::zeros({1}, on(1)).device().str(), ckpt::emulated_device::name() + ":1");
}

TEST_F(EmulatedDeviceTest, OperatorsWithCpuKernelsGiveTheCpuResultsToTheBit) {
  torch::manual_seed(0);
  const auto a = torch::randn({8, 16}), b = torch::randn({16, 4});
  auto f = [](const at::Tensor& x, const at::Tensor& y) {
    auto h = torch::gelu(x).matmul(y);
    h = torch::softmax(h, 1) + h.t().contiguous().t() * 2;
    return torch::cat({h, h.index({torch::indexing::Slice(1, 3)})}, 0).cumsum(0);
  };
  const auto on_device = f(a.to(dev()), b.to(dev()));
  EXPECT_EQ(on_device.device(), dev());
  EXPECT_TRUE(bit_equal(on_device.cpu(), f(a, b)));
}

TEST_F(EmulatedDeviceTest, OperatorsLibTorchComposesForEveryBackendRunTheComposition) {
  // native_layer_norm has a CPU kernel and a composition for other backends: the device runs the
  // composition, whose rounding may differ from the CPU kernel's.
  torch::manual_seed(0);
  const auto a = torch::randn({8, 16}), w = torch::randn({16});
  const auto on_device = torch::layer_norm(a.to(dev()), {16}, w.to(dev()));
  EXPECT_TRUE(ckpt::test::close(on_device.cpu(), torch::layer_norm(a, {16}, w)));
}

TEST_F(EmulatedDeviceTest, ConvolutionsTrainAsOnTheCpuToTheBit) {
  // LibTorch routes other backends' convolutions to convolution_overrideable: a kernel of the
  // device's runs them, forward and backward, plain and transposed, with and without a bias.
  torch::manual_seed(0);
  torch::nn::Sequential cpu_net(
      torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 3).padding(1)), torch::nn::BatchNorm2d(8),
      torch::nn::ReLU(), torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 8, 3).stride(2).bias(false)),
      torch::nn::ConvTranspose2d(torch::nn::ConvTranspose2dOptions(8, 4, 2).stride(2)));
  auto net = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(cpu_net->clone());
  net->to(dev());
  const auto x = torch::randn({2, 3, 9, 9});
  const auto x_cpu = x.clone().requires_grad_(), x_dev = x.to(dev()).requires_grad_();
  const auto y_cpu = cpu_net->forward(x_cpu), y_dev = net->forward(x_dev);
  EXPECT_EQ(y_dev.device(), dev());
  EXPECT_TRUE(bit_equal(y_dev.cpu(), y_cpu));
  y_cpu.pow(2).sum().backward();
  y_dev.pow(2).sum().backward();
  EXPECT_TRUE(bit_equal(x_dev.grad().cpu(), x_cpu.grad()));
  const auto params = net->parameters(), cpu_params = cpu_net->parameters();
  ASSERT_EQ(params.size(), cpu_params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(params[i].grad().device(), dev()) << "parameter " << i;
    EXPECT_TRUE(bit_equal(params[i].grad().cpu(), cpu_params[i].grad())) << "parameter " << i;
  }
  CKPT_EXPECT_THROWS_WITH(torch::conv2d(x.to(dev(0)), torch::ones({1, 3, 1, 1}, on(1))),
                          "Expected all tensors to be on the same device");
}

// Every gradient of a recurrent module that ran on the CPU and on the device, to rounding.
template <class Module>
void expect_trains_as_on_the_cpu(Module cpu_net, const at::Tensor& loss_cpu,
                                 const at::Tensor& loss_dev, Module net) {
  EXPECT_TRUE(ckpt::test::close(loss_dev.cpu(), loss_cpu));
  loss_cpu.backward();
  loss_dev.backward();
  const auto params = net->parameters(), cpu_params = cpu_net->parameters();
  ASSERT_EQ(params.size(), cpu_params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(params[i].grad().device(), dev()) << "parameter " << i;
    EXPECT_TRUE(ckpt::test::close(params[i].grad().cpu(), cpu_params[i].grad()))
        << "parameter " << i;
  }
}

TEST_F(EmulatedDeviceTest, RecurrentLayersTrainAsOnTheCpu) {
  // LibTorch 2 runs LSTM and GRU cells on accelerators as fused operators, which have CUDA kernels
  // only: the device's own run them (their sums in CUDA's order, so the CPU's to rounding). The
  // loss reads the last states too, so the cells' backward gets both state gradients.
  torch::manual_seed(0);
  const auto x = torch::randn({5, 3, 6});
  for (const bool bias : {true, false}) {
    SCOPED_TRACE(bias ? "with biases" : "without biases");
    torch::nn::LSTM cpu_lstm(torch::nn::LSTMOptions(6, 4).num_layers(2).bias(bias));
    auto lstm = std::dynamic_pointer_cast<torch::nn::LSTMImpl>(cpu_lstm->clone());
    lstm->to(dev());
    const auto [y_cpu, state_cpu] = cpu_lstm->forward(x);
    const auto [y_dev, state_dev] = lstm->forward(x.to(dev()));
    auto lstm_loss = [](const at::Tensor& y, const std::tuple<at::Tensor, at::Tensor>& state) {
      return y.pow(2).sum() + std::get<0>(state).pow(2).sum() + std::get<1>(state).sum();
    };
    expect_trains_as_on_the_cpu(cpu_lstm, lstm_loss(y_cpu, state_cpu), lstm_loss(y_dev, state_dev),
                                torch::nn::LSTM(lstm));

    torch::nn::GRU cpu_gru(torch::nn::GRUOptions(6, 4).num_layers(2).bias(bias));
    auto gru = std::dynamic_pointer_cast<torch::nn::GRUImpl>(cpu_gru->clone());
    gru->to(dev());
    const auto [z_cpu, h_cpu] = cpu_gru->forward(x);
    const auto [z_dev, h_dev] = gru->forward(x.to(dev()));
    expect_trains_as_on_the_cpu(cpu_gru, z_cpu.pow(2).sum() + h_cpu.sum(),
                                z_dev.pow(2).sum() + h_dev.sum(), torch::nn::GRU(gru));
  }
}

TEST_F(EmulatedDeviceTest, ViewsAndInPlaceOperatorsShareTheDeviceMemory) {
  auto x = torch::arange(6, on().dtype(torch::kFloat)).view({2, 3});
  auto column = x.t().select(0, 1);
  EXPECT_EQ(column.device(), dev());
  column.add_(10);
  EXPECT_TRUE(bit_equal(x.cpu(), torch::tensor({{0.f, 11.f, 2.f}, {3.f, 14.f, 5.f}})));
  EXPECT_EQ(x.storage().data(), column.storage().data());
  EXPECT_EQ(x._version(), 1);
}

// Issue 45, item 10: conjugate and negative views keep their bit through the CPU kernels (they
// crashed: the host alias of a device tensor, and the device view of a CPU result, dropped it).
TEST_F(EmulatedDeviceTest, ConjugateAndNegativeViewsGiveTheCpuResults) {
  const auto c = torch::randn({3, 4}, torch::kComplexFloat);
  const auto t = torch::randn({3, 4});
  const auto dc = c.to(dev()), dt = t.to(dev());
  EXPECT_TRUE(dc.conj().is_conj());
  EXPECT_TRUE(bit_equal(dc.conj().resolve_conj().cpu(), c.conj().resolve_conj()));
  EXPECT_TRUE(bit_equal((dc.conj() * dc).cpu(), c.conj() * c));
  EXPECT_TRUE(bit_equal(dc.conj().cpu(), c.conj().resolve_conj()));
  EXPECT_TRUE(bit_equal((torch::_neg_view(dt) * dt).cpu(), torch::_neg_view(t) * t));
  EXPECT_TRUE(bit_equal(torch::_neg_view(dt).resolve_neg().cpu(), -t));
}

TEST_F(EmulatedDeviceTest, OutVariantsResizeTheDeviceTensor) {
  auto out = torch::empty({0}, on());
  const auto a = torch::ones({2, 3}, on()), b = torch::full({2, 3}, 2.f, on());
  torch::add_out(out, a, b);
  EXPECT_EQ(out.device(), dev());
  EXPECT_TRUE(bit_equal(out.cpu(), torch::full({2, 3}, 3.f)));
  EXPECT_EQ(out.storage().nbytes(), 6 * sizeof(float));
}

TEST_F(EmulatedDeviceTest, TensorsMoveBetweenDevicesAndOperatorsRefuseToMixThem) {
  const auto x = torch::randn({5}, on(0));
  const auto y = x.to(dev(1));
  EXPECT_EQ(y.device(), dev(1));
  EXPECT_TRUE(bit_equal(x.cpu(), y.cpu()));
  CKPT_EXPECT_THROWS_WITH(x + y, "Expected all tensors to be on the same device");
  const c10::DeviceGuard guard(dev(1));
  EXPECT_EQ(torch::empty({1}, torch::TensorOptions().device(c10::DeviceType::PrivateUse1)).device(),
            dev(1));
}

TEST_F(EmulatedDeviceTest, ModulesMoveToTheDeviceAndTrainThere) {
  torch::manual_seed(0);
  torch::nn::Linear cpu_layer(4, 3);
  torch::nn::Linear layer(4, 3);
  layer->weight.set_data(cpu_layer->weight.detach().clone());
  layer->bias.set_data(cpu_layer->bias.detach().clone());
  layer->to(dev(1));
  EXPECT_EQ(layer->weight.device(), dev(1));
  const auto x = torch::randn({2, 4});
  layer(x.to(dev(1))).pow(2).sum().backward();
  cpu_layer(x).pow(2).sum().backward();
  EXPECT_EQ(layer->weight.grad().device(), dev(1));
  EXPECT_TRUE(bit_equal(layer->weight.grad().cpu(), cpu_layer->weight.grad()));
}

TEST_F(EmulatedDeviceTest, TheAllocatorKeepsCudaStyleStatistics) {
  const auto before = ckpt::emulated_device::memory_stats(0);
  {
    auto big = torch::empty({1 << 20}, on());  // 4 MiB
    auto small = torch::empty({1}, on());      // rounded up to 512 bytes
    const auto now = ckpt::emulated_device::memory_stats(0);
    EXPECT_EQ(now.allocated_bytes - before.allocated_bytes, (4 << 20) + 512);
    EXPECT_EQ(now.allocations - before.allocations, 2);
    EXPECT_EQ(ckpt::emulated_device::memory_stats(1).allocated_bytes,
              ckpt::emulated_device::memory_stats(1).allocated_bytes);
  }
  const auto after = ckpt::emulated_device::memory_stats(0);
  EXPECT_EQ(after.allocated_bytes, before.allocated_bytes);
  EXPECT_GE(after.peak_allocated_bytes, before.allocated_bytes + (4 << 20) + 512);
  ckpt::emulated_device::reset_peak_memory(0);
  EXPECT_EQ(ckpt::emulated_device::memory_stats(0).peak_allocated_bytes, after.allocated_bytes);
}

TEST_F(EmulatedDeviceTest, AMemoryLimitRaisesLibTorchsOutOfMemoryErrorAndFreesNothing) {
  struct NoLimitAfterwards {
    ~NoLimitAfterwards() { ckpt::emulated_device::set_memory_limit(0); }
  } restore;
  const int64_t before = ckpt::emulated_device::memory_stats(0).allocated_bytes;
  ckpt::emulated_device::set_memory_limit(before + (1 << 20));
  auto kept = torch::ones({1 << 17}, on());  // 512 KiB of the 1 MiB left
  try {
    auto more = torch::empty({1 << 18}, on());  // 1 MiB more: past the limit
    ADD_FAILURE() << "no out-of-memory error";
  } catch (const c10::OutOfMemoryError& error) {
    EXPECT_NE(std::string(error.what()).find("out of memory"), std::string::npos) << error.what();
  }
  EXPECT_TRUE(torch::equal(kept.cpu(), torch::ones({1 << 17})));
  EXPECT_EQ(ckpt::emulated_device::memory_stats(0).allocated_bytes, before + (1 << 19));
  auto fits = torch::empty({1 << 17}, on());    // exactly up to the limit
  auto other = torch::empty({1 << 18}, on(1));  // each device has the limit of its own
  ckpt::emulated_device::set_memory_limit(0);
  auto unlimited = torch::empty({1 << 20}, on());
  EXPECT_EQ(unlimited.numel(), 1 << 20);
}

TEST_F(EmulatedDeviceTest, MemoryTrackerReadsItThroughTheDeviceGenericAllocatorInterface) {
  if (!ckpt::MemoryTracker::can_measure(dev(1))) {
    GTEST_SKIP() << "LibTorch " << TORCH_VERSION << " has no device-generic allocator statistics";
  }
  ckpt::MemoryTracker tracker(dev(1));
  const int64_t before = tracker.current_bytes();
  {
    auto t = torch::empty({1 << 20}, on(1));
    EXPECT_EQ(tracker.current_bytes() - before, 4 << 20);
    EXPECT_EQ(ckpt::emulated_device::memory_stats(1).allocated_bytes, tracker.current_bytes());
  }
  EXPECT_EQ(tracker.current_bytes(), before);
  EXPECT_EQ(tracker.peak_bytes() - before, 4 << 20);
  tracker.reset_peak();
  EXPECT_EQ(tracker.peak_bytes(), before);
}

// ~~~ Generators ~~~

at::Tensor generator_state(at::Generator generator) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

TEST_F(EmulatedDeviceTest, DropoutOnADeviceDrawsFromThatDevicesGenerator) {
  const auto cpu = generator_state(at::detail::getDefaultCPUGenerator());
  const auto device0 = generator_state(ckpt::emulated_device::default_generator(0));
  const auto device1 = generator_state(ckpt::emulated_device::default_generator(1));
  const auto x = torch::ones({1000}, on(0));
  const auto y = torch::dropout(x, 0.5, /*train=*/true);
  EXPECT_GT((y == 0).sum().item<int64_t>(), 0);
  EXPECT_TRUE(bit_equal(generator_state(at::detail::getDefaultCPUGenerator()), cpu));
  EXPECT_FALSE(bit_equal(generator_state(ckpt::emulated_device::default_generator(0)), device0));
  EXPECT_TRUE(bit_equal(generator_state(ckpt::emulated_device::default_generator(1)), device1));
  // The same state gives the same mask again.
  auto generator = ckpt::emulated_device::default_generator(0);
  generator.set_state(device0);
  EXPECT_TRUE(bit_equal(torch::dropout(x, 0.5, true).cpu(), y.cpu()));
}

TEST_F(EmulatedDeviceTest, RandomFactoriesDrawFromTheDevicesGenerator) {
  auto generator = ckpt::emulated_device::default_generator(1);
  generator.set_current_seed(5);
  const auto first = torch::randn({16}, on(1));
  generator.set_current_seed(5);
  EXPECT_TRUE(bit_equal(torch::randn({16}, on(1)).cpu(), first.cpu()));
  at::Generator cpu = at::detail::createCPUGenerator(5);
  CKPT_EXPECT_THROWS_WITH(torch::randn({16}, cpu, on(1)), "generator");
}

TEST_F(EmulatedDeviceTest, LibTorchsDeviceGenericCodeFindsTheGenerators) {
  if (!ckpt::emulated_device::has_accelerator_hooks()) {
    GTEST_SKIP() << "LibTorch " << TORCH_VERSION << " has no accelerator hooks for PrivateUse1";
  }
  auto generator = ckpt::compat::default_generator(dev(1));
  EXPECT_EQ(generator.unsafeGetGeneratorImpl(),
            ckpt::emulated_device::default_generator(1).unsafeGetGeneratorImpl());
  torch::manual_seed(11);
  EXPECT_EQ(generator.current_seed(), 11u);
}

// ~~~ The autograd engine's device threads ~~~

struct RecordThread : torch::autograd::Function<RecordThread> {
  static at::Tensor forward(torch::autograd::AutogradContext*, const at::Tensor& x) {
    return x * 2;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list grads) {
    backward_thread() = std::this_thread::get_id();
    return {grads[0] * 2};
  }
  static std::thread::id& backward_thread() {
    static std::thread::id id;
    return id;
  }
};

std::thread::id backward_thread_of(const torch::TensorOptions& options) {
  const auto x = torch::ones({3}, options).requires_grad_();
  RecordThread::apply(x).sum().backward();
  return RecordThread::backward_thread();
}

TEST_F(EmulatedDeviceTest, BackwardOfDeviceTensorsRunsOnTheEnginesDeviceThreads) {
  const auto caller = std::this_thread::get_id();
  EXPECT_EQ(backward_thread_of(torch::TensorOptions()), caller);  // CPU: the calling thread
  const auto device0 = backward_thread_of(on(0));
  const auto device1 = backward_thread_of(on(1));
  EXPECT_NE(device0, caller);
  EXPECT_NE(device1, caller);
  EXPECT_NE(device0, device1);
  EXPECT_EQ(backward_thread_of(on(0)), device0);
}

// ~~~ Streams and events ~~~

TEST_F(EmulatedDeviceTest, ACopyOnAnotherStreamIsNotThereUntilWaitedFor) {
  const auto side = guard_impl().getStreamFromGlobalPool(dev(0), false);
  const auto source = torch::ones({1000});
  auto target = torch::zeros({1000}, on(0));
  c10::Event copied(c10::DeviceType::PrivateUse1);
  {
    ckpt::emulated_device::StreamHold hold(side);
    {
      const c10::StreamGuard on_side(side);
      target.copy_(source, /*non_blocking=*/true);
      copied.record(side);
    }
    // A read on the default stream that does not wait sees the old values.
    EXPECT_EQ(target.sum().item<float>(), 0.f);
    EXPECT_FALSE(copied.query());
  }
  copied.block(guard_impl().getStream(dev(0)));  // the default stream waits for the copy
  EXPECT_EQ(target.sum().item<float>(), 1000.f);
  EXPECT_TRUE(copied.query());
}

TEST_F(EmulatedDeviceTest, ACopyToTheHostOnAnotherStreamIsNotThereUntilSynchronized) {
  const auto side = ckpt::emulated_device::detail::new_stream(1);
  const auto source = torch::ones({1000}, on(1));
  auto target = torch::zeros({1000});
  {
    ckpt::emulated_device::StreamHold hold(side);
    const c10::StreamGuard on_side(side);
    target.copy_(source, /*non_blocking=*/true);
    EXPECT_EQ(target.sum().item<float>(), 0.f);
  }
  guard_impl().synchronizeStream(side);
  EXPECT_EQ(target.sum().item<float>(), 1000.f);
}

TEST_F(EmulatedDeviceTest, KernelsOnAStreamRunAfterTheStreamsEarlierWork) {
  const auto side = guard_impl().getStreamFromGlobalPool(dev(0), false);
  const auto source = torch::ones({1000});
  auto target = torch::zeros({1000}, on(0));
  const c10::StreamGuard on_side(side);
  auto hold = std::make_unique<ckpt::emulated_device::StreamHold>(side);
  target.copy_(source, /*non_blocking=*/true);
  std::thread releaser([&hold] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    hold.reset();
  });
  // The sum runs on the side stream too: it waits for the copy, which waits for the release.
  EXPECT_EQ(target.sum().item<float>(), 1000.f);
  releaser.join();
}

TEST_F(EmulatedDeviceTest, EventsTimeTheWorkBetweenThem) {
  namespace detail = ckpt::emulated_device::detail;
  const auto side = detail::new_stream(0);
  void* start = nullptr;
  void* stop = nullptr;
  {
    ckpt::emulated_device::StreamHold hold(side);
    guard_impl().record(&start, side, 0, c10::EventFlag::BACKEND_DEFAULT);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    guard_impl().record(&stop, side, 0, c10::EventFlag::BACKEND_DEFAULT);
    EXPECT_FALSE(guard_impl().queryEvent(stop));
  }
  detail::synchronize_event(stop);
  EXPECT_TRUE(guard_impl().queryEvent(stop));
  EXPECT_GE(detail::elapsed_milliseconds(start, stop), 0.0);
  guard_impl().destroyEvent(start, 0);
  guard_impl().destroyEvent(stop, 0);
}

// ~~~ Autocast ~~~

TEST_F(EmulatedDeviceTest, AutocastCastsMatrixProductsOnTheDevice) {
  if (!ckpt::compat::autocast_available(c10::DeviceType::PrivateUse1)) {
    GTEST_SKIP() << "LibTorch " << TORCH_VERSION << " has no autocast for PrivateUse1";
  }
  const auto a = torch::randn({4, 4}, on()), b = torch::randn({4, 4}, on());
  ckpt::compat::set_autocast_enabled(c10::DeviceType::PrivateUse1, true);
  const auto product = torch::mm(a, b);
  const auto sum = a + b;
  ckpt::compat::set_autocast_enabled(c10::DeviceType::PrivateUse1, false);
  EXPECT_EQ(product.scalar_type(), ckpt::compat::autocast_dtype(c10::DeviceType::PrivateUse1));
  EXPECT_NE(product.scalar_type(), torch::kFloat);
  EXPECT_EQ(sum.scalar_type(), torch::kFloat);
}

}  // namespace emulated_device_test
