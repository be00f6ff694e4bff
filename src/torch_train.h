/* -*- c++ -*- ----------------------------------------------------------
   LAMMPS - Large-scale Atomic/Molecular Massively Parallel Simulator
   https://www.lammps.org/, Sandia National Laboratories
   LAMMPS development team: developers@lammps.org

   ML-TORCH package: TorchScript machine-learned potentials.
   Distributed under the GNU General Public License, version 2.
------------------------------------------------------------------------- */

#ifdef COMMAND_CLASS
// clang-format off
CommandStyle(torch/train,TorchTrain);
// clang-format on
#else

#ifndef LMP_TORCH_TRAIN_H
#define LMP_TORCH_TRAIN_H

#include "command.h"

namespace LAMMPS_NS {

// torch/train FILE epochs N [keywords]: trains the pair_style torch model
// on the labelled configurations of an extended XYZ file, without MD, with
// fix torch/finetune's loss, optimizers and distributed update: the
// configurations sharded over every MPI rank of every partition as
// PyTorch's DistributedSampler shards them, the gradients summed over all
// of them, one model everywhere (doc/torch_train.rst)
class TorchTrain : public Command {
 public:
  TorchTrain(class LAMMPS *lmp) : Command(lmp) {}
  void command(int, char **) override;
};

}    // namespace LAMMPS_NS

#endif
#endif
