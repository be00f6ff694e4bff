/* -*- c++ -*- ----------------------------------------------------------
   LAMMPS - Large-scale Atomic/Molecular Massively Parallel Simulator
   https://www.lammps.org/, Sandia National Laboratories
   LAMMPS development team: developers@lammps.org

   ML-TORCH package: TorchScript machine-learned potentials.
   Distributed under the GNU General Public License, version 2.
------------------------------------------------------------------------- */

#ifndef LMP_FINETUNE_KEYWORDS_H
#define LMP_FINETUNE_KEYWORDS_H

#include "pointers.h"

#include <functional>
#include <string>

namespace MLTorch {
struct FinetuneSettings;
}

namespace LAMMPS_NS {

// the training keywords fix torch/finetune and torch/train share (weights,
// lr, optimizer, weight_decay, anchor, momentum, schedule, clip, train, freeze,
// energy_shift) into `s`: the index after the keyword at arg[iarg] and its
// values, or `iarg` when it is none of them; `who` begins the ERRORs, and
// `is_keyword` ends the prefix lists of train and freeze
int parse_training_keyword(class LAMMPS *lmp, const std::string &who, int narg, char **arg,
                           int iarg, MLTorch::FinetuneSettings &s,
                           const std::function<bool(const char *)> &is_keyword);

}    // namespace LAMMPS_NS

#endif
