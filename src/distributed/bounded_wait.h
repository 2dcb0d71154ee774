#pragma once

// Waits on rank 0's TCPStore that end at a deadline. c10d's TCPStore client waits for its
// server's answers without a timeout (1.13: in add; 2.x: in the constructor's ping), so a server
// that accepts connections but never answers (a rank 0 stopped by SIGSTOP, a port held by another
// program) would block a joining rank forever.

#include <sys/socket.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace ckpt {
namespace detail {

/// The addresses `host`:`port` resolves to (IPv4 and IPv6), as a TCP client tries them. Raises
/// an error that names the address when it does not resolve.
std::vector<sockaddr_storage> resolve_tcp(const std::string& host, int port);

/// Runs `operation` on a thread of its own and waits for it at most `limit`; returns, or throws
/// what it threw, when it ends in time. Past the limit, the sockets that the operation opened to
/// `store` are shut down, which ends c10d's wait with an error, and `on_timeout(connected)` raises
/// the caller's error (it must throw); `connected` says whether such a socket was open. An
/// operation that still does not end is left running, detached: it must own what it uses.
void run_bounded(std::chrono::milliseconds limit, const std::vector<sockaddr_storage>& store,
                 std::function<void()> operation,
                 const std::function<void(bool connected)>& on_timeout);

}  // namespace detail
}  // namespace ckpt
