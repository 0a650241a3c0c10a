// Is the client of an HTTP request still connected? cpp-httplib 0.11 gives a handler neither the
// socket nor a way to ask, so the server-side socket is found by its TCP addresses and probed.
#pragma once

#include <string>

namespace moestream {

// The server's end of one TCP connection, seen from the thread that serves it. Not owning: the
// socket stays httplib's, which keeps it open until the handler returns, so the descriptor
// cannot be reused while a ClientConnection of it is in use on that thread.
class ClientConnection {
 public:
  // Finds the socket of this process whose own address is local_addr:local_port and whose peer
  // is remote_addr:remote_port (the strings and ports httplib puts in its Request; a local_port
  // of -1 matches any local address). Not found: found() is false and alive() always true.
  static ClientConnection find(const std::string& local_addr, int local_port,
                               const std::string& remote_addr, int remote_port);
  // Wraps a known socket (tests).
  explicit ClientConnection(int fd) : fd_(fd) {}

  bool found() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  // False once the peer closed (FIN: nothing more will come) or reset the connection. Bytes
  // already sent by the client (a pipelined request) count as alive. Never blocks.
  // The same rule as later cpp-httplib's Request::is_connection_closed (detail::is_socket_alive).
  bool alive() const;

 private:
  int fd_ = -1;
};

}  // namespace moestream
