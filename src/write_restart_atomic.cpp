/* ----------------------------------------------------------------------
   LAMMPS - Large-scale Atomic/Molecular Massively Parallel Simulator
   https://www.lammps.org/, Sandia National Laboratories
   LAMMPS development team: developers@lammps.org

   ML-TORCH package: machine-learned potentials in PyTorch.
   Distributed under the GNU General Public License, version 2.
------------------------------------------------------------------------- */

#include "write_restart_atomic.h"

#include "comm.h"
#include "domain.h"
#include "error.h"
#include "update.h"
#include "write_restart.h"

#include "mltorch_mpi.h"
#include "mltorch/model.h"
#include "mltorch/runtime.h"

#include <cstdio>
#include <string>
#include <unistd.h>
#include <vector>

using namespace LAMMPS_NS;

/* ----------------------------------------------------------------------
   write_restart/atomic file keyword value ...

   The keywords are write_restart's. LAMMPS's writer (WriteRestart, unchanged)
   fills `file.tmp.PID` in the target's folder; rank 0 then syncs it to disk
   and renames it over `file`. A job killed at any moment leaves either the
   previous restart file or the new one, whole; never a torn one.
------------------------------------------------------------------------- */

void WriteRestartAtomic::command(int narg, char **arg)
{
  if (narg < 1) utils::missing_cmd_args(FLERR, "write_restart/atomic", error);
  if (domain->box_exist == 0)
    error->all(FLERR, "Write_restart/atomic command before simulation box is defined");

  std::string file = arg[0];
  if (file.find('%') != std::string::npos)
    error->all(FLERR,
               "write_restart/atomic writes one file, but {} asks for one file per process "
               "('%'): a set of files cannot be replaced at once; use write_restart for it",
               file);
  const auto star = file.find('*');
  if (star != std::string::npos) file.replace(star, 1, std::to_string(update->ntimestep));

  // a name of this job (rank 0's process id), the same on every rank, in
  // the target's folder so that the rename stays on one file system
  long pid = static_cast<long>(::getpid());
  MPI_Bcast(&pid, 1, MPI_LONG, 0, world);
  std::string tmp = file + ".tmp." + std::to_string(pid);

  std::vector<char *> args(arg, arg + narg);
  args[0] = &tmp[0];
  try {
    WriteRestart writer(lmp);
    writer.command(narg, args.data());    // returns after rank 0 closed the file
  } catch (...) {
    if (comm->me == 0) std::remove(tmp.c_str());
    throw;
  }

  bool ok = true;
  std::string why;
  if (comm->me == 0) {
    try {
      MLTorch::commit_file(tmp, file);
    } catch (std::exception &e) {
      ok = false;
      why = fmt::format("write_restart/atomic: {}; the previous {} is unchanged", e.what(), file);
    }
  }
  MLTorchLmp::stop_collectively(error, world, ok, why);
}
