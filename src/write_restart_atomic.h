/* -*- c++ -*- ----------------------------------------------------------
   LAMMPS - Large-scale Atomic/Molecular Massively Parallel Simulator
   https://www.lammps.org/, Sandia National Laboratories
   LAMMPS development team: developers@lammps.org

   ML-TORCH package: machine-learned potentials in PyTorch.
   Distributed under the GNU General Public License, version 2.
------------------------------------------------------------------------- */

#ifdef COMMAND_CLASS
// clang-format off
CommandStyle(write_restart/atomic,WriteRestartAtomic);
// clang-format on
#else

#ifndef LMP_WRITE_RESTART_ATOMIC_H
#define LMP_WRITE_RESTART_ATOMIC_H

#include "command.h"

namespace LAMMPS_NS {

// write_restart that never leaves a torn file: LAMMPS's writer fills a
// temporary file beside the target, which is synced and renamed over it
class WriteRestartAtomic : public Command {
 public:
  WriteRestartAtomic(class LAMMPS *lmp) : Command(lmp) {}
  void command(int, char **) override;
};

}    // namespace LAMMPS_NS

#endif
#endif
