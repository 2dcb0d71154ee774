#pragma once

// How the supported LibTorch releases differ in c10d (Debian's 1.13.1 and 2.x): the stores, the
// Gloo and NCCL backends and the Reducer. The distributed library calls these names and has no
// version test of its own. Part of the ckpt_distributed target only.

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/comm.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ckpt {
namespace compat {

using GroupPtr = c10::intrusive_ptr<c10d::ProcessGroup>;
using StorePtr = c10::intrusive_ptr<c10d::Store>;

/// A TCPStore client of `host:port`, or its server when `is_server` (port 0: a free one).
StorePtr make_tcp_store(const std::string& host, int port, bool is_server, int world_size,
                        std::chrono::milliseconds timeout);

/// The port a TCPStore listens on or connects to.
int tcp_store_port(const StorePtr& store);

/// Where Gloo listens: a network interface by name, or an address (empty: the address of this
/// machine's host name, falling back to the loopback, as torch.distributed does).
struct GlooDevice {
  enum Kind { Interface, Address } kind = Address;
  std::string name;
};

/// A process group whose CPU collectives go through Gloo, on `device`.
GroupPtr make_gloo_group(const StorePtr& store, int rank, int size,
                         std::chrono::milliseconds timeout, const GlooDevice& device);

/// Whether this build has the NCCL backend (a LibTorch with CUDA and NCCL).
bool nccl_compiled();

/// A process group whose CUDA collectives go through NCCL; raises an error without NCCL.
GroupPtr make_nccl_group(const StorePtr& store, int rank, int size,
                         std::chrono::milliseconds timeout);

/// A Reducer over `params` with buckets of at most `bucket_bytes` (the first `first_bucket_bytes`)
/// that averages dense gradients, with the unused-parameter search when `find_unused_parameters`.
std::shared_ptr<c10d::Reducer> make_reducer(const std::vector<at::Tensor>& params,
                                            const GroupPtr& group, int64_t bucket_bytes,
                                            int64_t first_bucket_bytes,
                                            bool find_unused_parameters);

}  // namespace compat
}  // namespace ckpt
