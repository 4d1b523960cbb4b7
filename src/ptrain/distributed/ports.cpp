#include "ptrain/distributed/ports.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "ptrain/core/error.h"

namespace ptrain::distributed {

namespace {

// Binds a new socket of `family` to the wildcard address and `port`; returns the socket, or -1 with errno.
int bind_wildcard(int family, int port) {
  const int fd = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  const int on = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
  int result;
  if (family == AF_INET6) {
    sockaddr_in6 address{};
    address.sin6_family = AF_INET6;
    address.sin6_addr = in6addr_any;
    address.sin6_port = htons(static_cast<uint16_t>(port));
    result = ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address);
  } else {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_ANY);
    address.sin_port = htons(static_cast<uint16_t>(port));
    result = ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address);
  }
  if (result != 0) {
    const int error = errno;
    ::close(fd);
    errno = error;
    return -1;
  }
  return fd;
}

}  // namespace

int free_tcp_port() {
  const int fd = bind_wildcard(AF_INET, 0);
  if (fd < 0) throw Error(std::string("launch: cannot find a free TCP port: ") + std::strerror(errno));
  sockaddr_in address{};
  socklen_t length = sizeof address;
  const int named = ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  const int error = errno;
  ::close(fd);
  if (named != 0) throw Error(std::string("launch: cannot find a free TCP port: ") + std::strerror(error));
  return ntohs(address.sin_port);
}

bool tcp_port_in_use(int port) {
  for (const int family : {AF_INET6, AF_INET}) {
    const int fd = bind_wildcard(family, port);
    if (fd >= 0) {
      ::close(fd);
    } else if (errno == EADDRINUSE) {
      return true;
    }
  }
  return false;
}

}  // namespace ptrain::distributed
