/* -*- c++ -*- ----------------------------------------------------------
   ML-TORCH: machine-learned potentials for LAMMPS.
   Part of the LAMMPS-independent core (no LAMMPS, no MPI, no LibTorch):
   the server side of the i-PI socket protocol, through which an external
   program (CP2K, Quantum ESPRESSO, FHI-aims, DFTB+, any ASE calculator,
   i-PI's own drivers, LAMMPS's fix ipi) returns energy, forces and virial
   of positions it is sent. fix torch/finetune's `teacher ipi` uses it
   (doc/dft_teacher.md).

   The protocol (i-PI's, as its clients implement it): 12-byte space-padded
   headers. The server asks STATUS; a client answers NEEDINIT (then gets
   INIT: bead index, a string of one byte, as ASE sends it: Quantum
   ESPRESSO reads exactly one), READY or HAVEDATA. POSDATA sends the cell
   matrix h (cell vectors as columns, row-major, Bohr), its inverse, the
   atom count (int32) and the positions (atom-major, Bohr). After STATUS ->
   HAVEDATA, GETFORCE is answered by FORCEREADY, the energy (Hartree), the
   atom count, the forces (Hartree/Bohr), the virial (3x3, Hartree) and an
   "extra" string. Everything is in the machine's byte order (clients and
   server share a machine or an architecture, as i-PI assumes).

   Who may be the client. A peer becomes the client only after it answered
   STATUS (and INIT, if it asked) as an i-PI client does, within the reply
   limit; a peer that does not (a port scanner, nc, another run probing the
   address) is dropped and the server keeps listening. The Unix socket file
   is the user's only (mode 0600), and a peer of another user is refused
   (SO_PEERCRED; on TCP loopback the owner of the peer's socket, from
   /proc/net/tcp). Replies to STATUS, INIT and GETFORCE are due within the
   reply limit; the calculation after POSDATA has none (DFT takes hours),
   and over TCP keepalive finds a client machine that died.
------------------------------------------------------------------------- */

#ifndef MLTORCH_CORE_IPI_H
#define MLTORCH_CORE_IPI_H

#include <stdexcept>
#include <string>
#include <sys/types.h>
#include <vector>

namespace MLTorch {

// any failure of the socket or the protocol; the text says what happened
// and, where it helps, what to do
class IpiError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// no client (no peer that answered as one) within the accept timeout
class IpiTimeout : public IpiError {
 public:
  using IpiError::IpiError;
};

// what a client returned, in atomic units (Hartree, Bohr)
struct IpiResult {
  double energy = 0.0;
  std::vector<double> forces;    // [natoms][3]
  double virial[9] = {0, 0, 0, 0, 0, 0, 0, 0, 0};    // row-major, as sent
  std::string extra;
  // wall seconds the server waited for the client's calculation (from the
  // positions sent to its HAVEDATA), and the whole evaluate()
  double wait_seconds = 0.0, total_seconds = 0.0;
};

class IpiServer {
 public:
  // `unix_socket`: the Unix socket /tmp/ipi_<address> (the convention of
  // i-PI and its clients; `port` unused); else TCP on every address that
  // `address` resolves to (IPv4 and IPv6), port `port`
  IpiServer(const std::string &address, int port, bool unix_socket);
  ~IpiServer();    // closes the connection and removes the socket file it made
  IpiServer(const IpiServer &) = delete;
  IpiServer &operator=(const IpiServer &) = delete;

  // where clients connect, as a client is told: "/tmp/ipi_NAME" or "HOST:PORT"
  std::string where() const;

  // seconds a client has to answer STATUS, INIT and GETFORCE (and to
  // finish a message it started); default 60
  void set_reply_timeout(double seconds) { reply_timeout_s = seconds; }
  double reply_timeout() const { return reply_timeout_s; }

  // bind and listen. A Unix socket file of this user that no server
  // answers on (a crashed run's) is replaced; another server's socket, a
  // socket of another user and anything that is not a socket (a regular
  // file, a symbolic link) are refused with IpiError and left as they are.
  // The file appears only once the server listens, mode 0600. A busy TCP
  // port is refused. Every descriptor is close-on-exec.
  void open();
  // TCP on an address other machines can reach (not loopback): anyone who
  // reaches it can connect, and only loopback peers' users can be checked
  bool reachable_from_network() const { return network_reachable; }
  // wait up to `timeout_s` seconds for a client (no-op when one is
  // connected): peers that fail the checks are dropped (take_notes() says
  // why) and the wait goes on; IpiTimeout when none passed in time
  void accept_client(double timeout_s);
  bool connected() const { return client_fd >= 0; }
  // the client as the log names it: "pid 4242, user alice" (Unix socket),
  // "127.0.0.1:50312, user alice" (TCP); empty when none
  const std::string &client() const { return client_name; }

  // one evaluation: `cell` the 3x3 matrix h (cell vectors as columns,
  // row-major) and `positions` [natoms][3], both in Bohr. Blocks while the
  // client computes (DFT may take hours: no limit there); any other reply
  // is due within the reply limit. A client that closes the connection,
  // dies or misses the limit gives IpiError, and the connection is
  // dropped (connected() is false after any IpiError). Peers that connect
  // while a client is served are sent EXIT (take_notes()).
  IpiResult evaluate(const double *cell, const double *positions, int natoms);

  // tell the client to stop (EXIT) and close the connection; no error
  void send_exit();

  // what the log should say since the last call (peers dropped or sent
  // EXIT, and who they were), oldest first
  std::vector<std::string> take_notes();

 private:
  std::string address_;
  int port_;
  bool unix_;
  std::vector<int> listen_fds;
  int client_fd = -1;
  std::string client_name;
  double reply_timeout_s = 60.0;
  bool network_reachable = false;
  std::string path_;    // the Unix socket file this server made
  dev_t path_dev = 0;
  ino_t path_ino = 0;
  std::vector<std::string> notes;

  void open_unix();
  void open_tcp();
  int accept_one(int listen_fd, std::string &peer, std::string &refused);
  void serve_latecomers();
  void send_all(int fd, const void *data, std::size_t n);
  // `limit`: seconds to wait for each part of the message (< 0: none)
  void recv_all(int fd, void *data, std::size_t n, double limit, const char *awaited);
  void send_header(int fd, const char *h);
  void send_init(int fd);
  std::string recv_header(int fd, double limit, const char *awaited);
  [[noreturn]] void client_failed(const std::string &what);
  void drop_client();
};

}    // namespace MLTorch

#endif
