#include "bounded_wait.h"

#include <c10/util/Exception.h>

#include <dirent.h>
#include <netdb.h>
#include <netinet/in.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <set>
#include <thread>

namespace ckpt {
namespace detail {
namespace {

// An IPv4 address mapped into IPv6 (::ffff:127.0.0.1, how c10d's dual-stack sockets see an IPv4
// peer), as IPv4; any other address as it is.
sockaddr_storage unmapped(const sockaddr_storage& address) {
  const auto& v6 = reinterpret_cast<const sockaddr_in6&>(address);
  if (address.ss_family != AF_INET6 || !IN6_IS_ADDR_V4MAPPED(&v6.sin6_addr)) return address;
  sockaddr_storage result{};
  auto& v4 = reinterpret_cast<sockaddr_in&>(result);
  v4.sin_family = AF_INET;
  v4.sin_port = v6.sin6_port;
  std::memcpy(&v4.sin_addr, v6.sin6_addr.s6_addr + 12, sizeof v4.sin_addr);
  return result;
}

bool same_endpoint(const sockaddr_storage& mapped_a, const sockaddr_storage& mapped_b) {
  const sockaddr_storage a = unmapped(mapped_a);
  const sockaddr_storage b = unmapped(mapped_b);
  if (a.ss_family != b.ss_family) return false;
  if (a.ss_family == AF_INET) {
    const auto& x = reinterpret_cast<const sockaddr_in&>(a);
    const auto& y = reinterpret_cast<const sockaddr_in&>(b);
    return x.sin_port == y.sin_port && x.sin_addr.s_addr == y.sin_addr.s_addr;
  }
  if (a.ss_family == AF_INET6) {
    const auto& x = reinterpret_cast<const sockaddr_in6&>(a);
    const auto& y = reinterpret_cast<const sockaddr_in6&>(b);
    return x.sin6_port == y.sin6_port &&
           std::memcmp(&x.sin6_addr, &y.sin6_addr, sizeof x.sin6_addr) == 0;
  }
  return false;
}

// This process's file descriptors. c10d keeps its sockets private, so this is how they are found.
std::set<int> open_descriptors() {
  std::set<int> fds;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return fds;
  const int own = dirfd(dir);
  while (const dirent* entry = readdir(dir)) {
    if (entry->d_name[0] == '.') continue;
    const int fd = std::atoi(entry->d_name);
    if (fd != own) fds.insert(fd);
  }
  closedir(dir);
  return fds;
}

// The sockets opened since `before` whose peer is one of `store`.
std::vector<int> new_sockets_to(const std::set<int>& before,
                                const std::vector<sockaddr_storage>& store) {
  std::vector<int> result;
  for (const int fd : open_descriptors()) {
    if (before.count(fd) != 0) continue;
    sockaddr_storage peer{};
    socklen_t length = sizeof peer;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &length) != 0) continue;
    for (const auto& address : store) {
      if (same_endpoint(peer, address)) {
        result.push_back(fd);
        break;
      }
    }
  }
  return result;
}

}  // namespace

std::vector<sockaddr_storage> resolve_tcp(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int status = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  TORCH_CHECK(status == 0, "ckpt::ProcessGroup::join: the master address '", host,
              "' does not resolve (", gai_strerror(status),
              "). Pass rank 0's IP address or host name.");
  std::vector<sockaddr_storage> addresses;
  for (const addrinfo* entry = found; entry != nullptr; entry = entry->ai_next) {
    sockaddr_storage address{};
    std::memcpy(&address, entry->ai_addr, std::min<size_t>(entry->ai_addrlen, sizeof address));
    addresses.push_back(address);
  }
  freeaddrinfo(found);
  return addresses;
}

void run_bounded(std::chrono::milliseconds limit, const std::vector<sockaddr_storage>& store,
                 std::function<void()> operation,
                 const std::function<void(bool connected)>& on_timeout) {
  const std::set<int> before = open_descriptors();
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> finished = done->get_future();
  std::thread worker([operation = std::move(operation), done] {
    try {
      operation();
      done->set_value();
    } catch (...) {
      done->set_exception(std::current_exception());
    }
  });
  if (finished.wait_for(limit) == std::future_status::ready) {
    worker.join();
    finished.get();
    return;
  }
  const std::vector<int> sockets = new_sockets_to(before, store);
  for (const int fd : sockets) shutdown(fd, SHUT_RDWR);
  // A wait on a socket that was shut down ends at once (c10d then raises an error, which is
  // dropped: the timeout is the news). Without such a socket (c10d still trying to connect), or
  // if it does not end, the operation is left behind.
  if (!sockets.empty() && finished.wait_for(std::chrono::seconds(5)) == std::future_status::ready) {
    worker.join();
  } else {
    worker.detach();
  }
  on_timeout(!sockets.empty());
  TORCH_INTERNAL_ASSERT(false, "run_bounded: on_timeout returned");
}

}  // namespace detail
}  // namespace ckpt
