/* ----------------------------------------------------------------------
   LAMMPS - Large-scale Atomic/Molecular Massively Parallel Simulator
   https://www.lammps.org/, Sandia National Laboratories
   LAMMPS development team: developers@lammps.org

   ML-TORCH package: TorchScript machine-learned potentials.
   Distributed under the GNU General Public License, version 2.
------------------------------------------------------------------------- */

/* ----------------------------------------------------------------------
   fix torch/finetune `teacher ipi`: an external program labels the
   configurations through the i-PI socket protocol (MLTorch::IpiServer).
   The first rank of each replica is the server of that replica's client;
   the configuration is gathered there by atom ID, sent in atomic units,
   and the returned forces are scattered back to their owners by atom ID.
   doc/dft_teacher.md says how to start the clients.
------------------------------------------------------------------------- */

#include "finetune_teacher.h"

#include "atom.h"
#include "comm.h"
#include "domain.h"
#include "error.h"
#include "platform.h"
#include "finetune_replicas.h"
#include "mltorch_units.h"
#include "universe.h"
#include "update.h"

#include "mltorch/collectives.h"
#include "mltorch/ipi.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <ctime>

using namespace LAMMPS_NS;

using namespace LAMMPS_NS::MLTorchUnits;
// seconds at most that a client has to answer STATUS, INIT and GETFORCE
// (teacher_timeout when shorter); its calculation has no limit
static constexpr double kReplyLimit = 60.0;

/* ---------------------------------------------------------------------- */

IpiTeacher::IpiTeacher(LAMMPS *lmp, const std::string &address_in, double timeout) :
    FinetuneTeacher(lmp, "ipi " + address_in), timeout_s(timeout)
{
  const std::string address = substitute_variables(lmp, address_in);
  const auto words = utils::split_words(address);
  if (words.size() < 2 || words.size() > 3 || (words.size() == 3 && words[2] != "unix"))
    error->all(FLERR, "Fix torch/finetune teacher ipi needs \"ADDRESS PORT [unix]\" (the words of "
                      "fix ipi), e.g. teacher ipi \"si 31415 unix\"; got \"{}\"", address);
  const bool unix_socket = words.size() == 3;
  std::string name = words[0];
  int port = utils::inumeric(FLERR, words[1], false, lmp);
  // replica k of a -partition run: its own address
  if (universe->existflag && universe->nworlds > 1) {
    if (unix_socket)
      name += "_" + std::to_string(universe->iworld);
    else
      port += universe->iworld;
  }
  const std::string units = update->unit_style;
  if (units == "metal")
    hartree_ = kHartreeEv;
  else if (units == "real")
    hartree_ = kHartreeKcalMol;
  else
    error->all(FLERR, "Fix torch/finetune teacher ipi supports units metal and real, not '{}'",
               units);
  bohr_ = kBohrAngstrom;    // Angstrom in both
  if (domain->dimension != 3) error->all(FLERR, "Fix torch/finetune teacher ipi needs 3d");
  const std::string aperiodic = periodicity_failure();
  if (!aperiodic.empty()) error->all(FLERR, aperiodic);
  try {
    MLTorch::IpiServer probe(name, port, unix_socket);    // checks the address
    where = probe.where();
    host = name + (unix_socket ? " (unix)" : fmt::format(", port {}", port));
    if (comm->me == 0) {
      server = std::make_unique<MLTorch::IpiServer>(name, port, unix_socket);
      // replies other than the calculation's are due at once: a peer that
      // stays silent is not waited for longer than for a client to connect
      server->set_reply_timeout(std::min(timeout_s, kReplyLimit));
    }
  } catch (MLTorch::IpiError &e) {
    error->all(FLERR, "Fix torch/finetune teacher ipi: {}", e.what());
  }
  description = "ipi " + where;
}

IpiTeacher::~IpiTeacher()
{
  // the client is told to stop; the socket file goes with the server
  if (server) server->send_exit();
}

/* ----------------------------------------------------------------------
   the client is sent the box as a periodic cell: a shrink-wrapped or fixed
   boundary would put atoms next to their own images (empty: periodic)
------------------------------------------------------------------------- */

std::string IpiTeacher::periodicity_failure() const
{
  if (domain->xperiodic && domain->yperiodic && domain->zperiodic) return {};
  return "Fix torch/finetune teacher ipi needs periodic boundaries in x, y and z (boundary p p p): "
         "the client is sent the box as a periodic cell, and along a non-periodic boundary its "
         "atoms would sit next to their own images. For a cluster or a slab, make the box periodic "
         "with enough vacuum (change_box all boundary p p p, then grow the box)";
}

// what the server has to say to the log (rank 0 of the replica)
void IpiTeacher::log_notes()
{
  if (!server) return;
  for (const auto &note : server->take_notes())
    utils::logmesg(lmp, "fix torch/finetune: teacher ipi: {}\n", note);
}

/* ----------------------------------------------------------------------
   the start of a run: the server listens and waits for its client
------------------------------------------------------------------------- */

std::string IpiTeacher::connect()
{
  std::string failure = periodicity_failure();
  if (failure.empty() && server && !server->connected()) {
    try {
      server->open();
      if (server->reachable_from_network())
        error->warning(FLERR, "Fix torch/finetune teacher ipi listens on {}, which other machines "
                              "can reach: whoever connects there first, from any machine that "
                              "reaches it, can be the client and feed labels to the training. "
                              "Where the client runs on this node, use a Unix socket or "
                              "localhost",
                       where);
      utils::logmesg(lmp, "fix torch/finetune: teacher ipi{}: waiting up to {} s for the i-PI "
                          "client on {}\n",
                     universe->nworlds > 1 ? fmt::format(" (replica {})", universe->iworld) : "",
                     timeout_s, where);
      server->accept_client(timeout_s);
      log_notes();
      utils::logmesg(lmp, "fix torch/finetune: teacher ipi: client connected on {} ({})\n", where,
                     server->client());
    } catch (MLTorch::IpiTimeout &e) {
      log_notes();
      failure = fmt::format("Fix torch/finetune teacher ipi: {}. Start the client when the server "
                            "listens: CP2K with RUN_TYPE DRIVER and &DRIVER HOST {}; Quantum "
                            "ESPRESSO with pw.x --ipi; LAMMPS with fix ipi; ASE with SocketClient "
                            "(doc/dft_teacher.md); or raise teacher_timeout",
                            e.what(), host);
    } catch (MLTorch::IpiError &e) {
      log_notes();
      failure = fmt::format("Fix torch/finetune teacher ipi: {}", e.what());
    }
  }
  lazy_wait(world);
  return MLTorch::first_failure(world, failure.empty(), failure);
}

void IpiTeacher::wait_for_replicas()
{
  if (universe->nworlds > 1) lazy_wait(universe->uworld);
}

std::string IpiTeacher::summary() const
{
  if (!server || nlabels == 0) return {};
  const double server_side = time_label - time_client;
  return fmt::format("fix torch/finetune: teacher ipi on {}: {} labels, {:.4g} s in the client, "
                     "{:.4g} s on the server side (gather, socket, checks, scatter: {:.3g}% of the "
                     "client's time, {:.3g} ms per label)\n",
                     where, nlabels, time_client, server_side,
                     time_client > 0 ? 100.0 * server_side / time_client : 0.0,
                     1e3 * server_side / static_cast<double>(nlabels));
}

/* ----------------------------------------------------------------------
   wait for the replica's first rank without a spinning MPI call
------------------------------------------------------------------------- */

void IpiTeacher::lazy_wait(MPI_Comm comm)
{
#ifdef MPI_STUBS
  // LAMMPS's MPI stubs (a serial build): one rank, nothing to wait for
  (void) comm;
#else
  MPI_Request req;
  MPI_Ibarrier(comm, &req);
  int done = 0;
  MPI_Test(&req, &done, MPI_STATUS_IGNORE);
  while (!done) {
    const timespec pause{0, 1000000};    // 1 ms
    nanosleep(&pause, nullptr);
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
  }
#endif
}

/* ----------------------------------------------------------------------
   one label: gather (tag, x) on the first rank, ask the client, check the
   answer, broadcast it, and keep each rank's owned atoms' forces
------------------------------------------------------------------------- */

void IpiTeacher::reference(double **fref, double &e_ref, double *w_ref,
                           const std::function<void()> & /*sum_to_owners*/)
{
  const double t_start = platform::walltime();
  const int nlocal = atom->nlocal;
  const bigint natoms = atom->natoms;
  std::string failure;
  if (natoms_seen >= 0 && natoms != natoms_seen)
    failure = fmt::format("the number of atoms changed from {} to {} during the run; an i-PI "
                          "client keeps its own atom list, so this is not supported (restart the "
                          "client with the new system and run again)",
                          natoms_seen, natoms);
  if (natoms > MAXSMALLINT / 4)
    failure = fmt::format("{} atoms is more than an i-PI message can hold", natoms);
  // atom IDs 1..N, each once: i-PI sends positions in atom-ID order
  tagint maxtag = 0, mytag = 0;
  for (int i = 0; i < nlocal; ++i) mytag = MAX(mytag, atom->tag[i]);
  MPI_Allreduce(&mytag, &maxtag, 1, MPI_LMP_TAGINT, MPI_MAX, world);
  if (failure.empty() && maxtag != natoms)
    failure = fmt::format("atom IDs must be 1 to {} (the largest is {}); the client is sent the "
                          "atoms in atom-ID order: use reset_atoms id",
                          natoms, maxtag);
  if (!failure.empty())
    throw StepFailure(MLTorch::first_failure(world, false, "Fix torch/finetune teacher ipi: " + failure));
  natoms_seen = natoms;
  const int n = static_cast<int>(natoms);

  // gather (tag, x - boxlo) on the first rank
  sendbuf.resize(4 * static_cast<std::size_t>(nlocal));
  for (int i = 0; i < nlocal; ++i) {
    sendbuf[4 * i] = static_cast<double>(atom->tag[i]);
    for (int k = 0; k < 3; ++k) sendbuf[4 * i + 1 + k] = atom->x[i][k] - domain->boxlo[k];
  }
  const int nprocs = comm->nprocs;
  counts.assign(nprocs, 0);
  displs.assign(nprocs, 0);
  int mine = 4 * nlocal;    // not const: MPI stubs take void *
  MPI_Gather(&mine, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, world);
  for (int p = 1; p < nprocs; ++p) displs[p] = displs[p - 1] + counts[p - 1];
  if (comm->me == 0) allbuf.resize(4 * static_cast<std::size_t>(n));
  MPI_Gatherv(sendbuf.data(), mine, MPI_DOUBLE, allbuf.data(), counts.data(), displs.data(),
              MPI_DOUBLE, 0, world);

  // [energy, virial 6, forces 3N] in this run's units, from the first rank
  labels.assign(7 + 3 * static_cast<std::size_t>(n), 0.0);
  if (server) {
    std::vector<double> pos(3 * static_cast<std::size_t>(n), 0.0);
    std::vector<int> seen(n, 0);
    for (int a = 0; a < n; ++a) {
      const int t = static_cast<int>(allbuf[4 * a]) - 1;
      seen[t]++;
      for (int k = 0; k < 3; ++k) pos[3 * t + k] = allbuf[4 * a + 1 + k] / bohr_;
    }
    for (int t = 0; t < n && failure.empty(); ++t)
      if (seen[t] != 1)
        failure = fmt::format("atom ID {} appears {} times; atom IDs must be unique", t + 1, seen[t]);
    // h: the cell vectors a, b, c (LAMMPS's restricted triclinic) as columns
    const double cell[9] = {domain->xprd / bohr_, domain->xy / bohr_, domain->xz / bohr_,
                            0.0, domain->yprd / bohr_, domain->yz / bohr_,
                            0.0, 0.0, domain->zprd / bohr_};
    if (failure.empty()) {
      try {
        const auto r = server->evaluate(cell, pos.data(), n);
        time_client += r.wait_seconds;
        bool finite = std::isfinite(r.energy);
        for (double v : r.forces) finite = finite && std::isfinite(v);
        for (double v : r.virial) finite = finite && std::isfinite(v);
        if (!finite)
          failure = fmt::format("the client on {} returned non-finite values (NaN or inf) for "
                                "step {}: did its calculation fail? No update is made with them",
                                where, update->ntimestep);
        const double fconv = hartree_ / bohr_;
        labels[0] = r.energy * hartree_;
        // the virial as i-PI reads it: the upper triangle (LAMMPS's fix ipi
        // sends only that; CP2K and others the full symmetric tensor)
        const int upper[6] = {0, 4, 8, 1, 2, 5};
        for (int k = 0; k < 6; ++k) labels[1 + k] = r.virial[upper[k]] * hartree_;
        for (std::size_t j = 0; j < r.forces.size(); ++j) labels[7 + j] = r.forces[j] * fconv;
      } catch (MLTorch::IpiError &e) {
        failure = fmt::format("{} (on step {}). The models and restart files written so far are "
                              "whole: start a new client and continue from them",
                              e.what(), update->ntimestep);
      }
      log_notes();
    }
  }
  lazy_wait(world);
  const std::string agreed = MLTorch::first_failure(world, failure.empty(), failure);
  if (!agreed.empty()) throw StepFailure("Fix torch/finetune teacher ipi: " + agreed);
  MPI_Bcast(labels.data(), static_cast<int>(labels.size()), MPI_DOUBLE, 0, world);

  for (int i = 0; i < nlocal; ++i) {
    const std::size_t t = static_cast<std::size_t>(atom->tag[i] - 1);
    for (int k = 0; k < 3; ++k) fref[i][k] = labels[7 + 3 * t + k];
  }
  e_ref = comm->me == 0 ? labels[0] : 0.0;
  for (int k = 0; k < 6; ++k) w_ref[k] = comm->me == 0 ? labels[1 + k] : 0.0;
  ++nlabels;
  time_label += platform::walltime() - t_start;
}
