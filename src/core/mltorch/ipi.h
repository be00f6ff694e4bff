/* -*- c++ -*- ----------------------------------------------------------
   ML-TORCH: machine-learned potentials for LAMMPS.
   Part of the LAMMPS-independent core (no LAMMPS, no MPI, no LibTorch):
   the server side of the i-PI socket protocol, through which an external
   program (CP2K, Quantum ESPRESSO, FHI-aims, DFTB+, any ASE calculator,
   LAMMPS's own fix ipi) returns energy, forces and virial of positions it
   is sent. fix torch/finetune's `teacher ipi` uses it (doc/dft_teacher.md).

   The protocol (i-PI's, as its clients implement it): 12-byte space-padded
   headers. The server asks STATUS; a client answers NEEDINIT (then gets
   INIT: bead index, a string), READY or HAVEDATA. POSDATA sends the cell
   matrix h (cell vectors as columns, row-major, Bohr), its inverse, the
   atom count (int32) and the positions (atom-major, Bohr). After STATUS ->
   HAVEDATA, GETFORCE is answered by FORCEREADY, the energy (Hartree), the
   atom count, the forces (Hartree/Bohr), the virial (3x3, Hartree) and an
   "extra" string. Everything is in the machine's byte order (clients and
   server share a machine or an architecture, as i-PI assumes).
------------------------------------------------------------------------- */

#ifndef MLTORCH_CORE_IPI_H
#define MLTORCH_CORE_IPI_H

#include <stdexcept>
#include <string>
#include <vector>

namespace MLTorch {

// any failure of the socket or the protocol; the text says what happened
// and, where it helps, what to do
class IpiError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
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
  // i-PI and its clients; `port` unused); else TCP on `address`:`port`
  IpiServer(const std::string &address, int port, bool unix_socket);
  ~IpiServer();    // closes the connection and removes the socket file
  IpiServer(const IpiServer &) = delete;
  IpiServer &operator=(const IpiServer &) = delete;

  // where clients connect, as a client is told: "/tmp/ipi_NAME" or "HOST:PORT"
  std::string where() const;

  // bind and listen. A Unix socket file that exists is reused when no
  // server answers on it (a stale file a crashed run left behind) and
  // refused (IpiError) when another server is listening there; a busy TCP
  // port is refused
  void open();
  // wait up to `timeout_s` seconds for a client (no-op when one is
  // connected); IpiError on timeout
  void accept_client(double timeout_s);
  bool connected() const { return client_fd >= 0; }

  // one evaluation: `cell` the 3x3 matrix h (cell vectors as columns,
  // row-major) and `positions` [natoms][3], both in Bohr. Blocks while the
  // client computes (DFT may take hours: no timeout); a client that closes
  // the connection or dies gives IpiError at once, and the connection is
  // dropped (connected() is false after any IpiError)
  IpiResult evaluate(const double *cell, const double *positions, int natoms);

  // tell the client to stop (EXIT) and close the connection; no error
  void send_exit();

 private:
  std::string address_;
  int port_;
  bool unix_;
  int listen_fd = -1, client_fd = -1;
  std::string path_;    // the Unix socket file this server made

  void send_all(const void *data, std::size_t n);
  void recv_all(void *data, std::size_t n);
  void send_header(const char *h);
  std::string recv_header();
  void drop_client();
};

}    // namespace MLTorch

#endif
