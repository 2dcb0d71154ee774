#include "process_group_impl.h"

#include "bounded_wait.h"

#include <ATen/ops/empty_like.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/comm.hpp>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace ckpt {
namespace {

using compat::StorePtr;

std::string seconds_text(std::chrono::milliseconds timeout) {
  std::ostringstream text;
  text << static_cast<double>(timeout.count()) / 1000.0 << " s";
  return text.str();
}

std::string address_text(const RendezvousOptions& options) {
  return options.master_addr() + ":" + std::to_string(options.master_port());
}

void check_options(const RendezvousOptions& options) {
  TORCH_CHECK(options.world_size() >= 1,
              "ckpt::ProcessGroup::join: the world size must be at least 1, but got ",
              options.world_size(), ". Pass the number of processes of the group.");
  TORCH_CHECK(options.rank() >= 0 && options.rank() < options.world_size(),
              "ckpt::ProcessGroup::join: rank ", options.rank(),
              " is out of range for a world of size ", options.world_size(),
              ": ranks go from 0 to ", options.world_size() - 1,
              ". Give each process its own rank in that range.");
  TORCH_CHECK(options.master_port() >= 0 && options.master_port() <= 65535,
              "ckpt::ProcessGroup::join: the port must be in [0, 65535], but got ",
              options.master_port());
  TORCH_CHECK(options.master_port() != 0 || options.world_size() == 1,
              "ckpt::ProcessGroup::join: port 0 (any free port) only works for a world of one "
              "process: the other ranks could not know which port rank 0 got. Pass a port.");
  TORCH_CHECK(!options.master_addr().empty(),
              "ckpt::ProcessGroup::join: the master address is empty. Pass rank 0's address.");
  TORCH_CHECK(options.timeout().count() > 0,
              "ckpt::ProcessGroup::join: the timeout must be positive, but got ",
              options.timeout().count(), " ms");
}

bool mentions_port_in_use(const std::string& message) {
  return message.find("in use") != std::string::npos ||
         message.find("EADDRINUSE") != std::string::npos;
}

StorePtr connect_store(const RendezvousOptions& options) {
  const bool server = options.rank() == 0;
  try {
    return compat::make_tcp_store(options.master_addr(), options.master_port(), server,
                                  options.world_size(), options.timeout());
  } catch (const std::exception& error) {
    const std::string what = error.what();
    const std::string first_line = what.substr(0, what.find('\n'));
    TORCH_CHECK(!(server && mentions_port_in_use(what)), "ckpt::ProcessGroup::join: rank 0 cannot ",
                "serve the rendezvous at ", address_text(options),
                ": the port is in use by another process. Pick a free port (--master-port), or "
                "stop the process that holds it.");
    TORCH_CHECK(!server, "ckpt::ProcessGroup::join: rank 0 cannot serve the rendezvous at ",
                address_text(options), " (", first_line,
                "). Check that the address is one of this machine's.");
    TORCH_CHECK(false, "ckpt::ProcessGroup::join: rank ", options.rank(),
                " could not reach rank 0's store at ", address_text(options), " within ",
                seconds_text(options.timeout()), " (", first_line,
                "). Check that rank 0 runs, with the same master address and port.");
  }
}

std::vector<uint8_t> to_bytes(int value) {
  const std::string text = std::to_string(value);
  return std::vector<uint8_t>(text.begin(), text.end());
}

int from_bytes(const std::vector<uint8_t>& bytes) {
  return std::atoi(std::string(bytes.begin(), bytes.end()).c_str());
}

std::string world_key(int rank) {
  return "ckpt/world_size/" + std::to_string(rank);
}

// Rank 0 waits for the others' announcements, at most the timeout, and names the missing.
void wait_for_ranks(c10d::Store& store, const RendezvousOptions& options) {
  const int world = options.world_size();
  std::vector<std::string> keys;
  for (int other = 1; other < world; ++other) keys.push_back(world_key(other));
  try {
    store.wait(keys, options.timeout());
  } catch (const std::exception&) {
    std::string missing;
    for (int other = 1; other < world; ++other) {
      if (!store.check({world_key(other)})) missing += " " + std::to_string(other);
    }
    TORCH_CHECK(false, "ckpt::ProcessGroup::join: rank 0 waited ", seconds_text(options.timeout()),
                " at ", address_text(options), " for a world of ", world,
                " processes, but these ranks did not join:", missing,
                ". Start them, with the same master address, port and world size.");
  }
}

// A store operation of the rendezvous; a failure says what probably happened.
template <class Operation>
auto with_store(const RendezvousOptions& options, Operation&& operation) {
  try {
    return operation();
  } catch (const std::exception& error) {
    const std::string what = error.what();
    TORCH_CHECK(false, "ckpt::ProcessGroup::join: rank ", options.rank(),
                " lost rank 0's store at ", address_text(options), " during the rendezvous (",
                what.substr(0, what.find('\n')),
                "). Rank 0 has probably stopped with an error (world sizes that disagree, "
                "say: see its message), or did not answer within the timeout of ",
                seconds_text(options.timeout()), ".");
  }
}

// Every rank announces its world size; rank 0 waits for all and compares, the others compare
// with rank 0's. A rank claimed twice is caught by the counter of its key.
void rendezvous(c10d::Store& store, const RendezvousOptions& options) {
  const int rank = options.rank();
  const int world = options.world_size();
  const int64_t claims =
      with_store(options, [&] { return store.add("ckpt/rank/" + std::to_string(rank), 1); });
  TORCH_CHECK(claims == 1, "ckpt::ProcessGroup::join: rank ", rank,
              " was already taken by another process at ", address_text(options),
              ". Give each process its own rank.");
  with_store(options, [&] { store.set(world_key(rank), to_bytes(world)); });
  if (rank != 0) {
    const int world_of_rank0 =
        from_bytes(with_store(options, [&] { return store.get(world_key(0)); }));
    TORCH_CHECK(world_of_rank0 == world, "ckpt::ProcessGroup::join: this process (rank ", rank,
                ") was given a world size of ", world, ", but rank 0 was given ", world_of_rank0,
                ". Start every process of the group with the same world size.");
    return;
  }
  wait_for_ranks(store, options);
  for (int other = 1; other < world; ++other) {
    const int theirs = from_bytes(store.get(world_key(other)));
    TORCH_CHECK(theirs == world, "ckpt::ProcessGroup::join: rank ", other,
                " was given a world size of ", theirs, ", but rank 0 was given ", world,
                ". Start every process of the group with the same world size.");
  }
}

// Rank 0's store and the rendezvous, as seen from another rank, within the timeout (plus a
// margin, so that c10d's own errors come first where it has them): c10d's client would wait for
// ever on a rank 0 that accepts connections but never answers (bounded_wait.h).
StorePtr join_store_within_timeout(const RendezvousOptions& options,
                                   const std::vector<sockaddr_storage>& store_addresses) {
  auto store = std::make_shared<StorePtr>();
  auto abandoned = std::make_shared<std::atomic<bool>>(false);
  detail::run_bounded(
      options.timeout() + std::chrono::seconds(2), store_addresses,
      [store, options, abandoned] {
        StorePtr connected = connect_store(options);
        if (abandoned->load()) return;  // too late: the caller has given up
        rendezvous(*connected, options);
        *store = std::move(connected);
      },
      [&](bool connected) {
        abandoned->store(true);
        TORCH_CHECK(!connected, "ckpt::ProcessGroup::join: rank ", options.rank(),
                    " connected to rank 0's store at ", address_text(options),
                    ", but it did not answer within ", seconds_text(options.timeout()),
                    ": the process there is stopped (SIGSTOP, a debugger) or hung, or the port "
                    "belongs to another program. Check that rank 0 runs, and that this is its "
                    "master address and port.");
        TORCH_CHECK(false, "ckpt::ProcessGroup::join: rank ", options.rank(),
                    " could not reach rank 0's store at ", address_text(options), " within ",
                    seconds_text(options.timeout()),
                    ". Check that rank 0 runs, with the same master address and port.");
      });
  return *store;
}

// The address of this machine's interface that leads to `host`: what the others can reach this
// rank at, if they reach rank 0 the same way (a UDP "connect" only picks the route; nothing is
// sent). GLOO_SOCKET_IFNAME, as torch.distributed reads it, is left to the caller. Empty when
// there is no route.
std::string local_address_towards(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return "";
  std::string address;
  const int fd = socket(AF_INET, SOCK_DGRAM, 0);
  sockaddr_in local{};
  socklen_t length = sizeof local;
  char text[INET_ADDRSTRLEN] = {};
  if (fd >= 0 && connect(fd, found->ai_addr, found->ai_addrlen) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0 &&
      inet_ntop(AF_INET, &local.sin_addr, text, sizeof text) != nullptr) {
    address = text;
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(found);
  return address;
}

}  // namespace

RendezvousOptions RendezvousOptions::from_environment() {
  const auto read = [](const char* name) {
    const char* value = std::getenv(name);
    TORCH_CHECK(value != nullptr && *value != '\0',
                "ckpt::RendezvousOptions::from_environment: ", name,
                " is not set. torchrun sets MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE; set "
                "all four, or pass the options explicitly.");
    return std::string(value);
  };
  const auto integer = [&](const char* name) {
    const std::string text = read(name);
    char* end = nullptr;
    errno = 0;
    const long value = std::strtol(text.c_str(), &end, 10);
    TORCH_CHECK(errno == 0 && end != text.c_str() && *end == '\0' && value >= 0 && value <= 1 << 30,
                "ckpt::RendezvousOptions::from_environment: ", name,
                " must be a non-negative integer, but is '", text, "'");
    return static_cast<int>(value);
  };
  return RendezvousOptions()
      .master_addr(read("MASTER_ADDR"))
      .master_port(integer("MASTER_PORT"))
      .rank(integer("RANK"))
      .world_size(integer("WORLD_SIZE"));
}

bool backend_available(Backend backend) {
  return backend == Backend::Gloo || compat::nccl_compiled();
}

namespace {

// A peer that dies closes its sockets, and Gloo writes to them without MSG_NOSIGNAL: with
// SIGPIPE's default action, that write kills this process instead of failing with EPIPE, which
// c10d turns into an error naming the collective. Python ignores SIGPIPE at start-up, so
// torch.distributed never meets it; a C++ program must. A handler the program installed itself
// is left alone.
void ignore_sigpipe_unless_handled() {
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
    std::signal(SIGPIPE, SIG_IGN);
  }
}

}  // namespace

ProcessGroup ProcessGroup::join(const RendezvousOptions& options, Backend backend) {
  check_options(options);
  // An address that does not resolve fails here, at once, not after c10d's retries.
  const auto store_addresses = detail::resolve_tcp(options.master_addr(), options.master_port());
  ignore_sigpipe_unless_handled();
  auto impl = std::make_shared<Impl>();
  impl->rank = options.rank();
  impl->world_size = options.world_size();
  impl->backend = backend;
  impl->timeout = options.timeout();
  if (options.rank() == 0) {  // the store is this process's own
    impl->store = connect_store(options);
    rendezvous(*impl->store, options);
  } else {
    impl->store = join_store_within_timeout(options, store_addresses);
  }
  impl->port = compat::tcp_store_port(impl->store);
  if (backend == Backend::Nccl) {
    impl->group =
        compat::make_nccl_group(impl->store, impl->rank, impl->world_size, options.timeout());
  } else {
    // Gloo binds to the interface that leads to rank 0 (the loopback for a local group), or to
    // GLOO_SOCKET_IFNAME's as in torch.distributed; without a route, to the host name's address.
    const char* interface = std::getenv("GLOO_SOCKET_IFNAME");
    impl->group = compat::make_gloo_group(
        impl->store, impl->rank, impl->world_size, options.timeout(),
        interface != nullptr && *interface != '\0'
            ? compat::GlooDevice{compat::GlooDevice::Interface, interface}
            : compat::GlooDevice{
                  compat::GlooDevice::Address,
                  local_address_towards(options.master_addr(), options.master_port())});
  }
  return ProcessGroup(std::move(impl));
}

int ProcessGroup::rank() const {
  return impl_->rank;
}

int ProcessGroup::world_size() const {
  return impl_->world_size;
}

Backend ProcessGroup::backend() const {
  return impl_->backend;
}

int ProcessGroup::port() const {
  return impl_->port;
}

void ProcessGroup::all_reduce_sum(at::Tensor& tensor) const {
  std::vector<at::Tensor> tensors{tensor};
  impl_->group->allreduce(tensors)->wait();
}

void ProcessGroup::broadcast(std::vector<at::Tensor> tensors, int root) const {
  TORCH_CHECK(root >= 0 && root < impl_->world_size, "ckpt::ProcessGroup::broadcast: root ", root,
              " is out of range for a world of size ", impl_->world_size);
  constexpr size_t kBufferBytes = size_t{256} << 20;  // as DistributedDataParallel's broadcast
  c10d::broadcast_coalesced(impl_->group, tensors, kBufferBytes, root);
}

void ProcessGroup::barrier() const {
  impl_->group->barrier()->wait();
}

std::vector<std::string> ProcessGroup::all_gather(const std::string& bytes) const {
  // Collectives need tensors of one size on every rank: the lengths first, then the bytes padded
  // to the longest. NCCL's tensors live on the GPU.
  const auto on =
      at::TensorOptions().device(impl_->backend == Backend::Nccl ? at::kCUDA : at::kCPU);
  const auto gather = [this](const at::Tensor& mine) {
    std::vector<std::vector<at::Tensor>> all(1);
    for (int r = 0; r < impl_->world_size; ++r) all[0].push_back(at::empty_like(mine));
    std::vector<at::Tensor> input{mine};
    impl_->group->allgather(all, input)->wait();
    for (auto& tensor : all[0]) tensor = tensor.cpu();
    return all[0];
  };
  const auto lengths =
      gather(at::full({1}, static_cast<int64_t>(bytes.size()), on.dtype(at::kLong)));
  int64_t longest = 1;
  for (const auto& length : lengths) longest = std::max(longest, length.item<int64_t>());
  at::Tensor padded = at::zeros({longest}, at::kByte);
  std::memcpy(padded.data_ptr<uint8_t>(), bytes.data(), bytes.size());
  const auto everyone = gather(padded.to(on.device()));
  std::vector<std::string> result;
  for (int r = 0; r < impl_->world_size; ++r) {
    const auto* data = everyone[r].data_ptr<uint8_t>();
    result.emplace_back(data, data + lengths[r].item<int64_t>());
  }
  return result;
}

}  // namespace ckpt
