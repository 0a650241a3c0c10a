// Implementation of runtime/server/client_connection.h: a scan of /proc/self/fd for the socket
// with the request's addresses, and a non-blocking poll + MSG_PEEK probe of it.
#include "runtime/server/client_connection.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <netinet/in.h>

#include <array>
#include <cerrno>
#include <charconv>
#include <filesystem>

namespace moestream {

namespace {
// The numeric address and port of a socket end, formatted as httplib formats them
// (getnameinfo with NI_NUMERICHOST), so that the strings compare equal.
bool address_of(int fd, bool peer, std::string& ip, int& port) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  const int rc = peer ? getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len)
                      : getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  if (rc != 0) return false;
  if (addr.ss_family == AF_INET) port = ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  else if (addr.ss_family == AF_INET6) port = ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  else return false;
  std::array<char, NI_MAXHOST> host{};
  if (getnameinfo(reinterpret_cast<sockaddr*>(&addr), len, host.data(), socklen_t(host.size()), nullptr, 0,
                  NI_NUMERICHOST) != 0)
    return false;
  ip = host.data();
  return true;
}
}  // namespace

ClientConnection ClientConnection::find(const std::string& local_addr, int local_port,
                                        const std::string& remote_addr, int remote_port) {
  if (remote_port < 0) return ClientConnection(-1);
  std::error_code ec;
  // A handful of descriptors (listening socket, HTTP threads' connections, model files): a scan
  // per request costs microseconds.
  for (std::filesystem::directory_iterator it("/proc/self/fd", ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    int fd = -1;
    if (std::from_chars(name.data(), name.data() + name.size(), fd).ec != std::errc()) continue;
    struct stat st{};
    if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    std::string ip;
    int port = -1;
    if (!address_of(fd, /*peer=*/true, ip, port) || port != remote_port || ip != remote_addr) continue;
    if (local_port >= 0 && (!address_of(fd, /*peer=*/false, ip, port) || port != local_port || ip != local_addr))
      continue;
    return ClientConnection(fd);
  }
  return ClientConnection(-1);
}

bool ClientConnection::alive() const {
  if (fd_ < 0) return true;
  pollfd p{fd_, POLLIN, 0};
  const int n = poll(&p, 1, 0);
  if (n == 0) return true;  // nothing to read: still connected
  if (n < 0) return errno == EINTR;
  if (p.revents & POLLNVAL) return false;
  // Readable: data (alive), end of stream (closed) or an error such as a reset (closed).
  char c;
  const ssize_t got = recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (got > 0) return true;
  if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return true;
  return false;
}

}  // namespace moestream
