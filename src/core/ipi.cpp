/* ----------------------------------------------------------------------
   ML-TORCH: machine-learned potentials for LAMMPS.
   The i-PI protocol's server side (mltorch/ipi.h). POSIX sockets: the
   protocol is a dozen fixed-size messages, and neither LibTorch nor LAMMPS
   has a socket server (LAMMPS's fix ipi is the client side), so it is
   written here, as i-PI's and ASE's servers are.
------------------------------------------------------------------------- */

#include "mltorch/ipi.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

namespace MLTorch {

static constexpr std::size_t kHeader = 12;
static const char *kUnixPrefix = "/tmp/ipi_";

static std::string errno_text()
{
  return std::strerror(errno);
}

IpiServer::IpiServer(const std::string &address, int port, bool unix_socket) :
    address_(address), port_(port), unix_(unix_socket)
{
  if (address.empty()) throw IpiError("the i-PI address is empty");
  if (unix_ && std::string(kUnixPrefix).size() + address.size() + 1 > sizeof(sockaddr_un::sun_path))
    throw IpiError("the i-PI Unix socket name " + std::string(kUnixPrefix) + address +
                   " is too long for a socket path; use a shorter address");
  if (!unix_ && (port < 1 || port > 65535))
    throw IpiError("the i-PI port " + std::to_string(port) + " is not a TCP port (1-65535)");
}

IpiServer::~IpiServer()
{
  drop_client();
  if (listen_fd >= 0) ::close(listen_fd);
  if (!path_.empty()) ::unlink(path_.c_str());
}

std::string IpiServer::where() const
{
  return unix_ ? kUnixPrefix + address_ : address_ + ":" + std::to_string(port_);
}

/* ---------------------------------------------------------------------- */

void IpiServer::open()
{
  if (listen_fd >= 0) return;
  if (unix_) {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    const std::string path = where();
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    listen_fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    if (listen_fd < 0) throw IpiError("cannot create a Unix socket: " + errno_text());
    if (::bind(listen_fd, reinterpret_cast<sockaddr *>(&addr), sizeof(addr)) != 0) {
      if (errno != EADDRINUSE) {
        const std::string why = errno_text();
        ::close(listen_fd);
        listen_fd = -1;
        throw IpiError("cannot create the i-PI socket " + path + ": " + why);
      }
      // the file exists: a live server answers a connection, a stale file does not
      const int probe = ::socket(AF_UNIX, SOCK_STREAM, 0);
      const bool live = probe >= 0 &&
          ::connect(probe, reinterpret_cast<sockaddr *>(&addr), sizeof(addr)) == 0;
      if (probe >= 0) ::close(probe);
      if (live) {
        ::close(listen_fd);
        listen_fd = -1;
        throw IpiError("another server is listening on the i-PI socket " + path +
                       " (another run, or i-PI itself); use another address");
      }
      ::unlink(path.c_str());
      if (::bind(listen_fd, reinterpret_cast<sockaddr *>(&addr), sizeof(addr)) != 0) {
        const std::string why = errno_text();
        ::close(listen_fd);
        listen_fd = -1;
        throw IpiError("cannot reuse the stale i-PI socket file " + path + ": " + why);
      }
    }
    path_ = path;
  } else {
    addrinfo hints{}, *res = nullptr;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    const int rc = ::getaddrinfo(address_.c_str(), std::to_string(port_).c_str(), &hints, &res);
    if (rc != 0 || !res)
      throw IpiError("cannot resolve the i-PI address " + address_ + ": " + gai_strerror(rc));
    listen_fd = ::socket(res->ai_family, res->ai_socktype, res->ai_protocol);
    if (listen_fd < 0) {
      ::freeaddrinfo(res);
      throw IpiError("cannot create a TCP socket: " + errno_text());
    }
    const int one = 1;
    ::setsockopt(listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(listen_fd, res->ai_addr, res->ai_addrlen) != 0) {
      const std::string why = errno_text();
      ::freeaddrinfo(res);
      ::close(listen_fd);
      listen_fd = -1;
      throw IpiError("cannot listen on " + where() + ": " + why +
                     (why == std::strerror(EADDRINUSE) ? " (another program uses the port; choose "
                                                         "another port)"
                                                       : ""));
    }
    ::freeaddrinfo(res);
  }
  if (::listen(listen_fd, 1) != 0) throw IpiError("cannot listen on " + where() + ": " + errno_text());
}

void IpiServer::accept_client(double timeout_s)
{
  if (client_fd >= 0) return;
  if (listen_fd < 0) open();
  pollfd p{listen_fd, POLLIN, 0};
  const double deadline_ms = timeout_s * 1000.0;
  double waited = 0.0;
  while (true) {
    const int slice = static_cast<int>(std::min(1000.0, std::max(0.0, deadline_ms - waited)));
    const int rc = ::poll(&p, 1, slice);
    if (rc > 0) break;
    if (rc < 0 && errno != EINTR) throw IpiError("waiting for a client on " + where() + ": " + errno_text());
    waited += slice;
    if (waited >= deadline_ms)
      throw IpiError("no i-PI client connected to " + where() + " within " +
                     std::to_string(static_cast<long>(std::lround(timeout_s))) + " s");
  }
  client_fd = ::accept(listen_fd, nullptr, nullptr);
  if (client_fd < 0) throw IpiError("cannot accept the client on " + where() + ": " + errno_text());
  if (!unix_) {
    const int one = 1;    // the protocol's many small messages: no Nagle delay
    ::setsockopt(client_fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
}

/* ---------------------------------------------------------------------- */

void IpiServer::drop_client()
{
  if (client_fd >= 0) ::close(client_fd);
  client_fd = -1;
}

void IpiServer::send_all(const void *data, std::size_t n)
{
  const char *p = static_cast<const char *>(data);
  while (n > 0) {
    // MSG_NOSIGNAL: a client that died gives EPIPE here, not SIGPIPE (which
    // would end the process without a message)
    const ssize_t k = ::send(client_fd, p, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      const std::string why = errno_text();
      drop_client();
      throw IpiError("the i-PI client on " + where() + " is gone (" + why +
                     "): it stopped or crashed; see its own output");
    }
    p += k;
    n -= static_cast<std::size_t>(k);
  }
}

void IpiServer::recv_all(void *data, std::size_t n)
{
  char *p = static_cast<char *>(data);
  while (n > 0) {
    const ssize_t k = ::recv(client_fd, p, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      const std::string why = k == 0 ? std::string("it closed the connection") : errno_text();
      drop_client();
      throw IpiError("the i-PI client on " + where() + " is gone (" + why +
                     "): it stopped or crashed; see its own output");
    }
    p += k;
    n -= static_cast<std::size_t>(k);
  }
}

void IpiServer::send_header(const char *h)
{
  char buf[kHeader];
  std::memset(buf, ' ', kHeader);
  std::memcpy(buf, h, std::min(kHeader, std::strlen(h)));
  send_all(buf, kHeader);
}

std::string IpiServer::recv_header()
{
  char buf[kHeader];
  recv_all(buf, kHeader);
  std::string h(buf, kHeader);
  h.erase(h.find_last_not_of(' ') + 1);
  return h;
}

/* ---------------------------------------------------------------------- */

static double seconds_since(std::chrono::steady_clock::time_point t0)
{
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

IpiResult IpiServer::evaluate(const double *cell, const double *positions, int natoms)
{
  if (client_fd < 0) throw IpiError("no i-PI client is connected to " + where());
  const auto t_start = std::chrono::steady_clock::now();
  auto fail = [&](const std::string &what) {
    drop_client();
    throw IpiError("the i-PI client on " + where() + " " + what);
  };
  send_header("STATUS");
  std::string status = recv_header();
  if (status == "NEEDINIT") {
    const int bead = 0;
    const std::string init = "{}";
    const int len = static_cast<int>(init.size());
    send_header("INIT");
    send_all(&bead, sizeof(bead));
    send_all(&len, sizeof(len));
    send_all(init.data(), init.size());
    send_header("STATUS");
    status = recv_header();
  }
  if (status != "READY")
    fail("answered STATUS with '" + status + "' where READY was due (is it an i-PI client?)");

  // the inverse cell (clients that use it: fractional coordinates)
  const double *h = cell;
  double inv[9];
  const double det = h[0] * (h[4] * h[8] - h[5] * h[7]) - h[1] * (h[3] * h[8] - h[5] * h[6]) +
      h[2] * (h[3] * h[7] - h[4] * h[6]);
  if (!(std::fabs(det) > 0.0)) throw IpiError("the cell sent to the i-PI client is singular");
  inv[0] = (h[4] * h[8] - h[5] * h[7]) / det;
  inv[1] = (h[2] * h[7] - h[1] * h[8]) / det;
  inv[2] = (h[1] * h[5] - h[2] * h[4]) / det;
  inv[3] = (h[5] * h[6] - h[3] * h[8]) / det;
  inv[4] = (h[0] * h[8] - h[2] * h[6]) / det;
  inv[5] = (h[2] * h[3] - h[0] * h[5]) / det;
  inv[6] = (h[3] * h[7] - h[4] * h[6]) / det;
  inv[7] = (h[1] * h[6] - h[0] * h[7]) / det;
  inv[8] = (h[0] * h[4] - h[1] * h[3]) / det;
  send_header("POSDATA");
  send_all(cell, 9 * sizeof(double));
  send_all(inv, 9 * sizeof(double));
  send_all(&natoms, sizeof(natoms));
  send_all(positions, 3 * sizeof(double) * static_cast<std::size_t>(natoms));

  // the reply to STATUS comes when the calculation is done
  const auto t_sent = std::chrono::steady_clock::now();
  send_header("STATUS");
  status = recv_header();
  const double waited = seconds_since(t_sent);
  if (status != "HAVEDATA")
    fail("answered STATUS with '" + status + "' after the positions, where HAVEDATA was due");
  send_header("GETFORCE");
  status = recv_header();
  if (status != "FORCEREADY") fail("answered GETFORCE with '" + status + "', not FORCEREADY");

  IpiResult r;
  r.wait_seconds = waited;
  int n = 0;
  recv_all(&r.energy, sizeof(double));
  recv_all(&n, sizeof(n));
  if (n != natoms)
    fail("returned forces on " + std::to_string(n) + " atoms for the " + std::to_string(natoms) +
         " it was sent: its input describes another system");
  r.forces.resize(3 * static_cast<std::size_t>(n));
  recv_all(r.forces.data(), r.forces.size() * sizeof(double));
  recv_all(r.virial, sizeof(r.virial));
  int len = 0;
  recv_all(&len, sizeof(len));
  if (len < 0 || len > (1 << 26)) fail("sent an extra string of " + std::to_string(len) + " bytes");
  r.extra.resize(static_cast<std::size_t>(len));
  if (len > 0) recv_all(r.extra.data(), r.extra.size());
  r.total_seconds = seconds_since(t_start);
  return r;
}

void IpiServer::send_exit()
{
  if (client_fd < 0) return;
  try {
    send_header("EXIT");
  } catch (IpiError &) {
    // gone already: nothing to tell
  }
  drop_client();
}

}    // namespace MLTorch
