#include "c10d_compat.h"

#include "torch_compat.h"

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#ifdef CKPT_HAVE_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <algorithm>
#include <type_traits>
#include <unordered_map>
#include <utility>

namespace ckpt {
namespace compat {
namespace {

// Since 2.0 a ProcessGroup dispatches to one backend per device type; before, the backend was
// the ProcessGroup itself.
template <class BackendT>
GroupPtr as_group(const StorePtr& store, int rank, int size,
                  const c10::intrusive_ptr<BackendT>& backend, c10::DeviceType device) {
#if CKPT_TORCH_AT_LEAST(2, 0)
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, rank, size);
  const auto type = std::is_same_v<BackendT, c10d::ProcessGroupGloo>
                        ? c10d::ProcessGroup::BackendType::GLOO
                        : c10d::ProcessGroup::BackendType::NCCL;
  group->setBackend(device, type, backend);
  group->setDefaultBackend(type);
  return group;
#else
  (void)store, (void)rank, (void)size, (void)device;
  return backend;
#endif
}

// The Reducer's constructor gained and lost arguments across releases; pick the form this
// LibTorch has. Forms: 1.13 (per-bucket limits, 10 arguments), 2.x (no per-bucket limits, plus
// skip_all_reduce_unused_params, use_python_reducer and the rebuilt buckets' caps).
using Indices = std::vector<std::vector<size_t>>;
using Names = std::unordered_map<size_t, std::string>;
constexpr bool kReducerWithLimits =
    std::is_constructible_v<c10d::Reducer, std::vector<at::Tensor>, Indices, std::vector<size_t>,
                            GroupPtr, std::vector<bool>, int64_t, bool, bool, Names, int64_t>;
constexpr bool kReducerWithCapList =
    std::is_constructible_v<c10d::Reducer, std::vector<at::Tensor>, Indices, GroupPtr,
                            std::vector<bool>, int64_t, bool, bool, Names, int64_t, bool, bool,
                            std::vector<int64_t>>;
static_assert(kReducerWithLimits || kReducerWithCapList,
              "ckpt_distributed: this LibTorch's c10d::Reducer constructor is not one ckpt knows; "
              "add its form to src/compat/c10d_compat.cpp");

}  // namespace

StorePtr make_tcp_store(const std::string& host, int port, bool is_server, int world_size,
                        std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(port);
  options.isServer = is_server;
  options.numWorkers = static_cast<std::size_t>(world_size);
  // The rendezvous waits for the ranks itself, with errors that name the missing ones.
  options.waitWorkers = false;
  options.timeout = timeout;
  return c10::make_intrusive<c10d::TCPStore>(host, options);
}

int tcp_store_port(const StorePtr& store) {
  return static_cast<c10d::TCPStore&>(*store).getPort();
}

GroupPtr make_gloo_group(const StorePtr& store, int rank, int size,
                         std::chrono::milliseconds timeout, const GlooDevice& device) {
  using Gloo = c10d::ProcessGroupGloo;
  auto options = Gloo::Options::create(timeout);
  if (device.kind == GlooDevice::Interface) {
    options->devices.push_back(Gloo::createDeviceForInterface(device.name));
  } else {
    options->devices.push_back(device.name.empty() ? Gloo::createDefaultDevice()
                                                   : Gloo::createDeviceForHostname(device.name));
  }
  auto backend = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
  return as_group(store, rank, size, backend, c10::DeviceType::CPU);
}

bool nccl_compiled() {
#ifdef CKPT_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

GroupPtr make_nccl_group(const StorePtr& store, int rank, int size,
                         std::chrono::milliseconds timeout) {
#ifdef CKPT_HAVE_NCCL
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  auto backend = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
  return as_group(store, rank, size, backend, c10::DeviceType::CUDA);
#else
  (void)store, (void)rank, (void)size, (void)timeout;
  TORCH_CHECK(false,
              "ckpt::ProcessGroup: this ckpt_distributed was built without NCCL (its LibTorch "
              "has no CUDA or no NCCL). Use Backend::Gloo, or rebuild ckpt against a CUDA "
              "LibTorch such as the torch wheel's.");
#endif
}

namespace {

// A template, so that only the constructor form this LibTorch has is compiled.
template <class Reducer>
std::shared_ptr<Reducer> construct_reducer(const std::vector<at::Tensor>& params,
                                           const Indices& indices,
                                           const std::vector<size_t>& per_bucket,
                                           const GroupPtr& group, int64_t bucket_bytes,
                                           int64_t first_bucket_bytes, bool find_unused) {
  const std::vector<bool> sparse(params.size(), false);
  const Names names;
  if constexpr (kReducerWithLimits) {
    return std::make_shared<Reducer>(params, indices, per_bucket, group, sparse, bucket_bytes,
                                     find_unused, /*gradient_as_bucket_view=*/false, names,
                                     first_bucket_bytes);
  } else {
    return std::make_shared<Reducer>(params, indices, group, sparse, bucket_bytes, find_unused,
                                     /*gradient_as_bucket_view=*/false, names, first_bucket_bytes,
                                     /*skip_all_reduce_unused_params=*/false,
                                     /*use_python_reducer=*/false, std::vector<int64_t>{});
  }
}

}  // namespace

std::shared_ptr<c10d::Reducer> make_reducer(const std::vector<at::Tensor>& params,
                                            const GroupPtr& group, int64_t bucket_bytes,
                                            int64_t first_bucket_bytes,
                                            bool find_unused_parameters) {
  const std::vector<size_t> limits{static_cast<size_t>(first_bucket_bytes),
                                   static_cast<size_t>(bucket_bytes)};
  const std::vector<bool> sparse(params.size(), false);
  // As DistributedDataParallel does: buckets follow the reverse order of the parameters, the
  // order in which a backward pass usually finishes their gradients.
  auto assignment = c10d::compute_bucket_assignment_by_size(params, limits, sparse);
  Indices indices = std::get<0>(assignment);
  std::vector<size_t> per_bucket = std::get<1>(assignment);
  std::reverse(indices.begin(), indices.end());
  std::reverse(per_bucket.begin(), per_bucket.end());
  return construct_reducer<c10d::Reducer>(params, indices, per_bucket, group, bucket_bytes,
                                          first_bucket_bytes, find_unused_parameters);
}

}  // namespace compat
}  // namespace ckpt
