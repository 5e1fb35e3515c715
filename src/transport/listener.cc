#include "listener.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

namespace atl::transport {
namespace {

using Steady = std::chrono::steady_clock;

StatusOr<std::pair<std::string, std::string>> SplitAddress(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon + 1 == address.size()) {
    return InvalidArgumentError("listen address '" + address + "' is not host:port");
  }
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  const std::string port = address.substr(colon + 1);
  if (port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos || std::stoi(port) > 65535) {
    return InvalidArgumentError("listen address '" + address + "': the port must be a number in [0, 65535]");
  }
  return std::make_pair(host, port);
}

// A listening socket as gRPC makes its own: SO_REUSEADDR, TCP_NODELAY (accepted sockets inherit
// it), dual-stack on an IPv6 wildcard.
int ListenOn(const addrinfo& a, bool listen) {
  const int fd = ::socket(a.ai_family, a.ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a.ai_protocol);
  if (fd < 0) return -1;
  int yes = 1, no = 0;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof(yes));
  if (a.ai_family == AF_INET6) ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &no, sizeof(no));
  if (::bind(fd, a.ai_addr, a.ai_addrlen) != 0 || (listen && ::listen(fd, SOMAXCONN) != 0)) {
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

StatusOr<std::unique_ptr<GrpcListener>> GrpcListener::Bind(const std::string& address, int max_connections,
                                                           bool listen) {
  if (max_connections < 1) return InvalidArgumentError("max_connections must be ≥ 1");
  ATOLL_ASSIGN_OR_RETURN(auto host_port, SplitAddress(address));
  const auto& [host, port] = host_port;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &res) != 0 || res == nullptr) {
    return UnavailableError("cannot listen on " + address + ": the host does not resolve");
  }
  int fd = -1;
  for (const addrinfo* a = res; a != nullptr && fd < 0; a = a->ai_next) fd = ListenOn(*a, listen);
  ::freeaddrinfo(res);
  if (fd < 0) return UnavailableError("cannot listen on " + address + " (address in use or invalid?)");
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  const int bound = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                                   : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  auto listener = std::unique_ptr<GrpcListener>(new GrpcListener(fd, bound, max_connections));
  listener->listening_ = listen;
  if (::pipe2(listener->wake_, O_NONBLOCK | O_CLOEXEC) != 0) {
    return InternalError(std::string("pipe for the gRPC listener: ") + std::strerror(errno));
  }
  return listener;
}

GrpcListener::GrpcListener(int fd, int port, int max_connections)
    : listen_fd_(fd), port_(port), max_connections_(max_connections) {}

GrpcListener::~GrpcListener() {
  Stop();
  for (int fd : {listen_fd_, wake_[0], wake_[1]}) {
    if (fd >= 0) ::close(fd);
  }
}

void GrpcListener::Start(std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor) {
  acceptor_ = std::move(acceptor);
  thread_ = std::thread([this] { AcceptLoop(); });
}

Status GrpcListener::Listen() {
  if (listening_) return Status::Ok();
  if (::listen(listen_fd_, SOMAXCONN) != 0) {
    return UnavailableError(std::string("cannot listen on port ") + std::to_string(port_) + ": " +
                            std::strerror(errno));
  }
  listening_ = true;
  return Status::Ok();
}

void GrpcListener::Stop() {
  if (stopping_.exchange(true)) return;
  const char byte = 1;
  (void)!::write(wake_[1], &byte, 1);
  if (thread_.joinable()) thread_.join();
}

int GrpcListener::CountOpen() {
  std::erase_if(handed_, [](const Handed& h) {
    struct stat st {};
    return ::fstat(h.fd, &st) != 0 || static_cast<uint64_t>(st.st_dev) != h.dev ||
           static_cast<uint64_t>(st.st_ino) != h.ino;
  });
  open_ = static_cast<int>(handed_.size());
  return open_;
}

void GrpcListener::AcceptLoop() {
  Steady::time_point paused_until{}, last_count{};
  while (!stopping_) {
    const bool paused = Steady::now() < paused_until;
    pollfd fds[2] = {{wake_[0], POLLIN, 0}, {paused ? -1 : listen_fd_, POLLIN, 0}};
    if (::poll(fds, 2, paused ? 100 : -1) < 0 && errno != EINTR) return;
    if (stopping_ || fds[1].revents == 0) continue;
    for (int i = 0; i < 64; ++i) {  // then look at the wake pipe again
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        // Out of descriptors or memory: the backlog stays readable, so wait instead of spinning.
        if (errno != EAGAIN && errno != EWOULDBLOCK) paused_until = Steady::now() + std::chrono::milliseconds(100);
        break;
      }
      // At the cap, count again (at most every 20 ms: a flood must not make each accept O(open)).
      bool full = static_cast<int>(handed_.size()) >= max_connections_;
      if (full && Steady::now() - last_count >= std::chrono::milliseconds(20)) {
        last_count = Steady::now();
        full = CountOpen() >= max_connections_;
      }
      struct stat st {};
      if (full || ::fstat(fd, &st) != 0) {
        ::close(fd);
        ++refused_;
        continue;
      }
      handed_.push_back({fd, static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)});
      open_ = static_cast<int>(handed_.size());
      grpc::experimental::ExternalConnectionAcceptor::NewConnectionParameters p;
      p.listener_fd = listen_fd_;
      p.fd = fd;  // gRPC's from here on
      acceptor_->HandleNewConnection(&p);
    }
  }
}

}  // namespace atl::transport
