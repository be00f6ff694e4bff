/* ----------------------------------------------------------------------
   ML-TORCH: machine-learned potentials for LAMMPS.
   The i-PI protocol's server side (mltorch/ipi.h). POSIX sockets: the
   protocol is a dozen fixed-size messages, and neither LibTorch nor LAMMPS
   has a socket server (LAMMPS's fix ipi is the client side), so it is
   written here, as i-PI's and ASE's servers are.
------------------------------------------------------------------------- */

#include "mltorch/ipi.h"

#include <algorithm>
#include <arpa/inet.h>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pwd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

namespace MLTorch {

static constexpr std::size_t kHeader = 12;
static const char *kUnixPrefix = "/tmp/ipi_";
// TCP keepalive: a client machine that died without closing is found after
// kKeepIdle + kKeepCount * kKeepInterval seconds of silence (2 minutes)
static constexpr int kKeepIdle = 60, kKeepInterval = 10, kKeepCount = 6;

static std::string errno_text()
{
  return std::strerror(errno);
}

using Clock = std::chrono::steady_clock;

// the 12 bytes of a header as text, its padding off; what a header may hold
// is printable ASCII (else say so, not print the bytes)
static std::string header_text(std::string h)
{
  h.erase(h.find_last_not_of(' ') + 1);
  for (char c : h)
    if (c < 32 || c > 126) return "<" + std::to_string(kHeader) + " bytes that are no header>";
  return h;
}

static double seconds_since(Clock::time_point t0)
{
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

static std::string seconds_text(double s)
{
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", s);
  return buf;
}

// "alice" for a uid (its number when the system has no name for it)
static std::string user_name(uid_t uid)
{
  passwd pw{}, *found = nullptr;
  char buf[4096];
  if (::getpwuid_r(uid, &pw, buf, sizeof(buf), &found) == 0 && found) return found->pw_name;
  return "uid " + std::to_string(uid);
}

IpiServer::IpiServer(const std::string &address, int port, bool unix_socket) :
    address_(address), port_(port), unix_(unix_socket)
{
  if (address.empty()) throw IpiError("the i-PI address is empty");
  if (unix_ && std::string(kUnixPrefix).size() + address.size() + 1 > sizeof(sockaddr_un::sun_path))
    throw IpiError("the i-PI Unix socket name " + std::string(kUnixPrefix) + address +
                   " is too long for a socket path; use a shorter address");
  if (unix_ && address.find('/') != std::string::npos)
    throw IpiError("the i-PI Unix socket name '" + address +
                   "' has a '/': it names the file /tmp/ipi_NAME; use a plain name");
  if (!unix_ && (port < 1 || port > 65535))
    throw IpiError("the i-PI port " + std::to_string(port) + " is not a TCP port (1-65535)");
}

IpiServer::~IpiServer()
{
  drop_client();
  for (int fd : listen_fds) ::close(fd);
  // only the file this server made: not one another run put there since
  struct stat st{};
  if (!path_.empty() && ::lstat(path_.c_str(), &st) == 0 && st.st_dev == path_dev &&
      st.st_ino == path_ino)
    ::unlink(path_.c_str());
}

std::string IpiServer::where() const
{
  return unix_ ? kUnixPrefix + address_ : address_ + ":" + std::to_string(port_);
}

std::vector<std::string> IpiServer::take_notes()
{
  std::vector<std::string> out;
  out.swap(notes);
  return out;
}

/* ---------------------------------------------------------------------- */

void IpiServer::open()
{
  if (!listen_fds.empty()) return;
  if (unix_)
    open_unix();
  else
    open_tcp();
}

static sockaddr_un unix_address(const std::string &path)
{
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  return addr;
}

void IpiServer::open_unix()
{
  const std::string path = where();
  sockaddr_un addr = unix_address(path);

  // what is there already: only a stale socket of this user is replaced
  struct stat st{};
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode))
      throw IpiError(path + " exists and is " +
                     (S_ISLNK(st.st_mode) ? "a symbolic link" : S_ISDIR(st.st_mode) ? "a folder" : "a file") +
                     ", not a socket; it is left as it is: remove it or use another address");
    if (st.st_uid != ::geteuid())
      throw IpiError("the i-PI socket " + path + " belongs to user " + user_name(st.st_uid) +
                     " (their server, or its stale file); it is left as it is: use another address");
    const int probe = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const bool live = probe >= 0 &&
        ::connect(probe, reinterpret_cast<sockaddr *>(&addr), sizeof(addr)) == 0;
    if (probe >= 0) ::close(probe);
    if (live)
      throw IpiError("another server is listening on the i-PI socket " + path +
                     " (another run, or i-PI itself); use another address");
    ::unlink(path.c_str());    // stale: a crashed server's
  }

  // listen on a private name, mode 0600, and only then give the socket its
  // public name (link() fails if the name exists: two runs started at once
  // cannot take each other's socket for a stale one)
  static std::atomic<int> counter{0};
  const std::string tmp = "/tmp/.ipi_" + std::to_string(::getpid()) + "_" + std::to_string(counter++);
  sockaddr_un taddr = unix_address(tmp);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw IpiError("cannot create a Unix socket: " + errno_text());
  ::unlink(tmp.c_str());
  auto give_up = [&](const std::string &what) {
    const std::string why = errno_text();
    ::close(fd);
    ::unlink(tmp.c_str());
    throw IpiError(what + ": " + why);
  };
  if (::bind(fd, reinterpret_cast<sockaddr *>(&taddr), sizeof(taddr)) != 0)
    give_up("cannot create the i-PI socket " + tmp);
  if (::chmod(tmp.c_str(), 0600) != 0) give_up("cannot make the i-PI socket " + tmp + " private");
  if (::listen(fd, 8) != 0) give_up("cannot listen on " + tmp);
  if (::link(tmp.c_str(), path.c_str()) != 0) {
    if (errno == EEXIST) {
      ::close(fd);
      ::unlink(tmp.c_str());
      throw IpiError("another server made the i-PI socket " + path +
                     " at the same moment (two runs started at once with one address); use "
                     "another address");
    }
    give_up("cannot create the i-PI socket " + path);
  }
  ::unlink(tmp.c_str());
  if (::lstat(path.c_str(), &st) == 0) {
    path_dev = st.st_dev;
    path_ino = st.st_ino;
  }
  path_ = path;
  listen_fds.push_back(fd);
}

static bool is_loopback(const sockaddr *sa)
{
  if (sa->sa_family == AF_INET)
    return (ntohl(reinterpret_cast<const sockaddr_in *>(sa)->sin_addr.s_addr) >> 24) == 127;
  if (sa->sa_family == AF_INET6) {
    const in6_addr &a = reinterpret_cast<const sockaddr_in6 *>(sa)->sin6_addr;
    if (IN6_IS_ADDR_LOOPBACK(&a)) return true;
    if (IN6_IS_ADDR_V4MAPPED(&a)) return a.s6_addr[12] == 127;
  }
  return false;
}

void IpiServer::open_tcp()
{
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  const int rc = ::getaddrinfo(address_.c_str(), std::to_string(port_).c_str(), &hints, &res);
  if (rc != 0 || !res)
    throw IpiError("cannot resolve the i-PI address " + address_ + ": " + gai_strerror(rc));
  // every address the name has (localhost: 127.0.0.1 and, where the hosts
  // file says so, ::1), so that IPv4 and IPv6 clients both find the server
  std::string failure;
  for (addrinfo *ai = res; ai; ai = ai->ai_next) {
    const int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;    // an address family this machine lacks
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (ai->ai_family == AF_INET6) ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(fd, 8) != 0) {
      const int err = errno;
      ::close(fd);
      if (err == EADDRNOTAVAIL || err == EAFNOSUPPORT) continue;    // e.g. ::1 without IPv6
      failure = "cannot listen on " + where() + ": " + std::strerror(err) +
          (err == EADDRINUSE ? " (another program uses the port; choose another port)" : "");
      break;
    }
    listen_fds.push_back(fd);
    if (!is_loopback(ai->ai_addr)) network_reachable = true;
  }
  ::freeaddrinfo(res);
  if (failure.empty() && listen_fds.empty())
    failure = "cannot listen on " + where() + ": none of its addresses is on this machine";
  if (!failure.empty()) {
    for (int fd : listen_fds) ::close(fd);
    listen_fds.clear();
    network_reachable = false;
    throw IpiError(failure);
  }
}

/* ----------------------------------------------------------------------
   the owner of a TCP peer's socket on this machine: its line in
   /proc/net/tcp (tcp6), whose local address is the peer's and remote
   address ours; false when it is not there (a peer on another machine)
------------------------------------------------------------------------- */

static std::string proc_net_address(const sockaddr_storage &ss)
{
  char buf[64];
  if (ss.ss_family == AF_INET) {
    const auto &a = reinterpret_cast<const sockaddr_in &>(ss);
    std::uint32_t word;
    std::memcpy(&word, &a.sin_addr, 4);
    std::snprintf(buf, sizeof(buf), "%08X:%04X", word, ntohs(a.sin_port));
  } else {
    const auto &a = reinterpret_cast<const sockaddr_in6 &>(ss);
    std::uint32_t w[4];
    std::memcpy(w, &a.sin6_addr, 16);
    std::snprintf(buf, sizeof(buf), "%08X%08X%08X%08X:%04X", w[0], w[1], w[2], w[3],
                  ntohs(a.sin6_port));
  }
  return buf;
}

static bool tcp_peer_uid(const sockaddr_storage &peer, const sockaddr_storage &self, uid_t &uid)
{
  const std::string local = proc_net_address(peer), remote = proc_net_address(self);
  std::ifstream in(peer.ss_family == AF_INET ? "/proc/net/tcp" : "/proc/net/tcp6");
  std::string line;
  std::getline(in, line);    // the header
  while (std::getline(in, line)) {
    std::istringstream w(line);
    std::string slot, l, r, st, queues, timer, retr;
    unsigned long u = 0;
    if (!(w >> slot >> l >> r >> st >> queues >> timer >> retr >> u)) continue;
    if (l == local && r == remote) {
      uid = static_cast<uid_t>(u);
      return true;
    }
  }
  return false;
}

static std::string peer_address_text(const sockaddr_storage &ss)
{
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (ss.ss_family == AF_INET) {
    const auto &a = reinterpret_cast<const sockaddr_in &>(ss);
    ::inet_ntop(AF_INET, &a.sin_addr, host, sizeof(host));
    port = ntohs(a.sin_port);
    return std::string(host) + ":" + std::to_string(port);
  }
  const auto &a = reinterpret_cast<const sockaddr_in6 &>(ss);
  ::inet_ntop(AF_INET6, &a.sin6_addr, host, sizeof(host));
  port = ntohs(a.sin6_port);
  return "[" + std::string(host) + "]:" + std::to_string(port);
}

/* ----------------------------------------------------------------------
   accept one pending peer of `lfd`: its descriptor (-1: none pending, or
   refused, then `refused` says why), and `peer` names it
------------------------------------------------------------------------- */

int IpiServer::accept_one(int lfd, std::string &peer, std::string &refused)
{
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  const int fd = ::accept4(lfd, reinterpret_cast<sockaddr *>(&ss), &len, SOCK_CLOEXEC);
  if (fd < 0) {
    // a peer that went before we took it, a signal, nothing pending: wait on
    if (errno == EINTR || errno == ECONNABORTED || errno == EAGAIN || errno == EWOULDBLOCK ||
        errno == EPROTO)
      return -1;
    throw IpiError("cannot accept a client on " + where() + ": " + errno_text());
  }
  const uid_t me = ::geteuid();
  if (unix_) {
    ucred cred{};
    socklen_t clen = sizeof(cred);
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0) {
      refused = "a peer whose user cannot be told (" + errno_text() + ")";
    } else {
      peer = "pid " + std::to_string(cred.pid) + ", user " + user_name(cred.uid);
      if (cred.uid != me) refused = "a peer of another user (" + peer + ")";
    }
  } else {
    peer = peer_address_text(ss);
    sockaddr_storage self{};
    socklen_t slen = sizeof(self);
    ::getsockname(fd, reinterpret_cast<sockaddr *>(&self), &slen);
    if (is_loopback(reinterpret_cast<sockaddr *>(&ss))) {
      uid_t uid = 0;
      if (!tcp_peer_uid(ss, self, uid)) {
        refused = "a loopback peer whose user cannot be told (" + peer + ")";
      } else {
        peer += ", user " + user_name(uid);
        if (uid != me) refused = "a peer of another user (" + peer + ")";
      }
    } else {
      peer += " (another machine: its user cannot be told)";
    }
    const int one = 1;    // the protocol's many small messages: no Nagle delay
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
    ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &kKeepIdle, sizeof(kKeepIdle));
    ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &kKeepInterval, sizeof(kKeepInterval));
    ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &kKeepCount, sizeof(kKeepCount));
  }
  if (!refused.empty()) {
    ::close(fd);
    return -1;
  }
  return fd;
}

/* ----------------------------------------------------------------------
   a peer becomes the client only when it answers as one: STATUS ->
   READY, or NEEDINIT, then INIT and STATUS -> READY, each within the reply
   limit. Peers are heard side by side, so that a silent one (nc, a port
   scanner, a second run probing the address) holds up no one: the first
   to answer READY is the client, the others are closed.
------------------------------------------------------------------------- */

namespace {
struct Candidate {
  int fd;
  std::string peer;
  std::string got;    // the bytes of the header being received
  bool init_sent = false;
  Clock::time_point asked;
};
}    // namespace


void IpiServer::accept_client(double timeout_s)
{
  if (client_fd >= 0) return;
  if (listen_fds.empty()) open();
  const auto t0 = Clock::now();
  std::vector<Candidate> cands;
  int dropped = 0;
  std::string last_drop;
  auto drop = [&](std::size_t i, const std::string &why) {
    ::close(cands[i].fd);
    ++dropped;
    last_drop = "a peer (" + cands[i].peer + ") that " + why;
    notes.push_back("dropped a peer (" + cands[i].peer + ") on " + where() + " that " + why +
                    "; waiting on for the client");
    cands.erase(cands.begin() + static_cast<std::ptrdiff_t>(i));
  };
  while (true) {
    const double left = timeout_s - seconds_since(t0);
    if (left <= 0.0) {
      for (auto &c : cands) ::close(c.fd);
      std::string text = "no i-PI client connected to " + where() + " within " +
          std::to_string(static_cast<long>(std::lround(timeout_s))) + " s";
      if (dropped > 0)
        text += " (" + std::to_string(dropped) + " peer" + (dropped > 1 ? "s" : "") +
            " connected and " + (dropped > 1 ? "were" : "was") + " dropped; the last: " +
            last_drop + ")";
      else if (!cands.empty())
        text += " (a peer connected and did not answer STATUS: " + cands.back().peer + ")";
      throw IpiTimeout(text);
    }
    // wake for the sooner of the accept deadline and a candidate's limit
    double wait = std::min(left, 1.0);
    for (auto &c : cands)
      wait = std::min(wait, std::max(0.0, reply_timeout_s - seconds_since(c.asked)));
    std::vector<pollfd> p;
    for (int fd : listen_fds) p.push_back({fd, POLLIN, 0});
    for (auto &c : cands) p.push_back({c.fd, POLLIN, 0});
    const int rc = ::poll(p.data(), p.size(), static_cast<int>(std::ceil(1000.0 * wait)));
    if (rc < 0 && errno != EINTR) throw IpiError("waiting for a client on " + where() + ": " + errno_text());
    // the candidates first (their indices shift as they go)
    for (std::size_t k = listen_fds.size(), i = 0; k < p.size(); ++k) {
      Candidate &c = cands[i];
      if (rc > 0 && (p[k].revents & (POLLIN | POLLHUP | POLLERR))) {
        char buf[kHeader];
        const ssize_t n = ::recv(c.fd, buf, kHeader - c.got.size(), MSG_DONTWAIT);
        if (n <= 0 && !(n < 0 && (errno == EAGAIN || errno == EINTR))) {
          drop(i, n == 0 ? "closed the connection before it answered STATUS"
                         : "failed before it answered STATUS (" + errno_text() + ")");
          continue;
        }
        if (n > 0) c.got.append(buf, static_cast<std::size_t>(n));
        if (c.got.size() == kHeader) {
          const std::string status = header_text(c.got);
          c.got.clear();
          try {
            if (status == "READY") {
              client_fd = c.fd;
              client_name = c.peer;
              cands.erase(cands.begin() + static_cast<std::ptrdiff_t>(i));
              for (auto &o : cands) {
                ::close(o.fd);
                notes.push_back("closed a peer (" + o.peer + ") on " + where() +
                                " that had not answered STATUS when the client (" + client_name +
                                ") did");
              }
              return;
            }
            if (status == "NEEDINIT" && !c.init_sent) {
              send_init(c.fd);
              send_header(c.fd, "STATUS");
              c.init_sent = true;
              c.asked = Clock::now();
              ++i;
              continue;
            }
            drop(i, "answered STATUS with '" + status + "', not " +
                        (c.init_sent ? "READY after INIT" : "READY or NEEDINIT") + ": no i-PI client");
            continue;
          } catch (IpiError &e) {
            drop(i, e.what());
            continue;
          }
        }
      }
      if (seconds_since(c.asked) >= reply_timeout_s) {
        drop(i, "sent no reply to STATUS within " + seconds_text(reply_timeout_s) +
                    " s (an i-PI client answers at once): it hangs, or it is no i-PI client");
        continue;
      }
      ++i;
    }
    if (rc <= 0) continue;
    for (std::size_t k = 0; k < listen_fds.size(); ++k) {
      if (!(p[k].revents & POLLIN)) continue;
      std::string peer, refused;
      const int fd = accept_one(p[k].fd, peer, refused);
      if (!refused.empty()) {
        ++dropped;
        last_drop = "refused " + refused;
        notes.push_back("refused " + refused + " on " + where() +
                        ": only the user who runs the server may be its client");
      }
      if (fd < 0) continue;
      try {
        send_header(fd, "STATUS");
      } catch (IpiError &) {
        ::close(fd);
        ++dropped;
        last_drop = "a peer (" + peer + ") that closed the connection at once";
        notes.push_back("dropped a peer (" + peer + ") on " + where() +
                        " that closed the connection before it answered STATUS; waiting on for "
                        "the client");
        continue;
      }
      cands.push_back({fd, peer, {}, false, Clock::now()});
    }
  }
}

/* ----------------------------------------------------------------------
   peers that connect while the client is served are told EXIT
------------------------------------------------------------------------- */

void IpiServer::serve_latecomers()
{
  std::vector<pollfd> p;
  for (int fd : listen_fds) p.push_back({fd, POLLIN, 0});
  while (!p.empty() && ::poll(p.data(), p.size(), 0) > 0) {
    bool any = false;
    for (auto &q : p) {
      if (!(q.revents & POLLIN)) continue;
      std::string peer, refused;
      const int fd = accept_one(q.fd, peer, refused);
      if (!refused.empty()) {
        any = true;
        notes.push_back("refused " + refused + " on " + where() + " while the client is served");
      }
      if (fd < 0) continue;
      any = true;
      char buf[kHeader];
      std::memset(buf, ' ', kHeader);
      std::memcpy(buf, "EXIT", 4);
      (void) !::send(fd, buf, kHeader, MSG_NOSIGNAL | MSG_DONTWAIT);
      ::close(fd);
      notes.push_back("a second peer (" + peer + ") connected to " + where() +
                      " while the client (" + client_name +
                      ") is served: it was sent EXIT (one client per server; give each replica or "
                      "run its own address)");
    }
    if (!any) break;
    for (auto &q : p) q.revents = 0;
  }
}

/* ---------------------------------------------------------------------- */

void IpiServer::drop_client()
{
  if (client_fd >= 0) ::close(client_fd);
  client_fd = -1;
  client_name.clear();
}

void IpiServer::send_all(int fd, const void *data, std::size_t n)
{
  const char *p = static_cast<const char *>(data);
  while (n > 0) {
    // MSG_NOSIGNAL: a client that died gives EPIPE here, not SIGPIPE (which
    // would end the process without a message)
    const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0)
      throw IpiError("is gone (" + errno_text() + ")");
    p += k;
    n -= static_cast<std::size_t>(k);
  }
}

void IpiServer::recv_all(int fd, void *data, std::size_t n, double limit, const char *awaited)
{
  char *p = static_cast<char *>(data);
  while (n > 0) {
    if (limit >= 0.0) {
      // the limit counts from the last byte that arrived: a large message
      // that keeps coming is not cut
      pollfd q{fd, POLLIN, 0};
      int rc;
      do {
        rc = ::poll(&q, 1, static_cast<int>(std::ceil(1000.0 * limit)));
      } while (rc < 0 && errno == EINTR);
      if (rc == 0)
        throw IpiError("sent no reply to " + std::string(awaited) + " within " +
                       seconds_text(limit) +
                       " s (an i-PI client answers at once): it hangs, or it is no i-PI client");
    }
    const ssize_t k = ::recv(fd, p, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      const std::string why = k == 0 ? std::string("it closed the connection") : errno_text();
      throw IpiError("is gone (" + why + ")");
    }
    p += k;
    n -= static_cast<std::size_t>(k);
  }
}

void IpiServer::send_header(int fd, const char *h)
{
  char buf[kHeader];
  std::memset(buf, ' ', kHeader);
  std::memcpy(buf, h, std::min(kHeader, std::strlen(h)));
  send_all(fd, buf, kHeader);
}

std::string IpiServer::recv_header(int fd, double limit, const char *awaited)
{
  char buf[kHeader];
  recv_all(fd, buf, kHeader, limit, awaited);
  return header_text(std::string(buf, kHeader));
}

void IpiServer::send_init(int fd)
{
  // a string of one byte, as ASE sends it: Quantum ESPRESSO reads exactly
  // one byte of it whatever its length says (its update_flags); CP2K, fix
  // ipi and i-PI's drivers read the length they are given
  const int bead = 0, len = 1;
  const char init = '\0';
  send_header(fd, "INIT");
  send_all(fd, &bead, sizeof(bead));
  send_all(fd, &len, sizeof(len));
  send_all(fd, &init, 1);
}

void IpiServer::client_failed(const std::string &what)
{
  const std::string who = client_name;
  drop_client();
  const bool gone = what.rfind("is gone", 0) == 0;
  throw IpiError("the i-PI client on " + where() + (who.empty() ? "" : " (" + who + ")") + " " + what +
                 (gone ? ": it stopped or crashed; see its own output" : ""));
}

/* ---------------------------------------------------------------------- */

IpiResult IpiServer::evaluate(const double *cell, const double *positions, int natoms)
{
  if (client_fd < 0) throw IpiError("no i-PI client is connected to " + where());
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

  serve_latecomers();
  const auto t_start = Clock::now();
  const double limit = reply_timeout_s;
  IpiResult r;
  std::string failure;
  try {
    send_header(client_fd, "STATUS");
    std::string status = recv_header(client_fd, limit, "STATUS");
    if (status == "NEEDINIT") {    // Quantum ESPRESSO asks before every configuration
      send_init(client_fd);
      send_header(client_fd, "STATUS");
      status = recv_header(client_fd, limit, "STATUS after INIT");
    }
    if (status != "READY") throw IpiError("answered STATUS with '" + status + "' where READY was due (is it an i-PI client?)");
    send_header(client_fd, "POSDATA");
    send_all(client_fd, cell, 9 * sizeof(double));
    send_all(client_fd, inv, 9 * sizeof(double));
    send_all(client_fd, &natoms, sizeof(natoms));
    send_all(client_fd, positions, 3 * sizeof(double) * static_cast<std::size_t>(natoms));

    // the reply to STATUS comes when the calculation is done: no limit
    const auto t_sent = Clock::now();
    send_header(client_fd, "STATUS");
    status = recv_header(client_fd, -1.0, "STATUS");
    r.wait_seconds = seconds_since(t_sent);
    if (status != "HAVEDATA")
      throw IpiError("answered STATUS with '" + status + "' after the positions, where HAVEDATA was due");
    send_header(client_fd, "GETFORCE");
    status = recv_header(client_fd, limit, "GETFORCE");
    if (status != "FORCEREADY") throw IpiError("answered GETFORCE with '" + status + "', not FORCEREADY");
    int n = 0;
    recv_all(client_fd, &r.energy, sizeof(double), limit, "GETFORCE");
    recv_all(client_fd, &n, sizeof(n), limit, "GETFORCE");
    if (n != natoms)
      throw IpiError("returned forces on " + std::to_string(n) + " atoms for the " +
                     std::to_string(natoms) + " it was sent: its input describes another system");
    r.forces.resize(3 * static_cast<std::size_t>(n));
    recv_all(client_fd, r.forces.data(), r.forces.size() * sizeof(double), limit, "GETFORCE");
    recv_all(client_fd, r.virial, sizeof(r.virial), limit, "GETFORCE");
    int len = 0;
    recv_all(client_fd, &len, sizeof(len), limit, "GETFORCE");
    if (len < 0 || len > (1 << 26)) throw IpiError("sent an extra string of " + std::to_string(len) + " bytes");
    r.extra.resize(static_cast<std::size_t>(len));
    if (len > 0) recv_all(client_fd, r.extra.data(), r.extra.size(), limit, "GETFORCE (its extra string)");
  } catch (IpiError &e) {
    failure = e.what();
  }
  if (!failure.empty()) client_failed(failure);
  r.total_seconds = seconds_since(t_start);
  return r;
}

void IpiServer::send_exit()
{
  if (client_fd < 0) return;
  try {
    serve_latecomers();
    send_header(client_fd, "EXIT");
  } catch (IpiError &) {
    // gone already: nothing to tell
  }
  drop_client();
}

}    // namespace MLTorch
