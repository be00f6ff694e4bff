/* -*- c++ -*- ----------------------------------------------------------
   LAMMPS - Large-scale Atomic/Molecular Massively Parallel Simulator
   https://www.lammps.org/, Sandia National Laboratories
   LAMMPS development team: developers@lammps.org

   ML-TORCH package: machine-learned potentials in PyTorch.
   Distributed under the GNU General Public License, version 2.
------------------------------------------------------------------------- */

#ifdef COMPUTE_CLASS
// clang-format off
ComputeStyle(torch/deviation,ComputeTorchDeviation);
// clang-format on
#else

#ifndef LMP_COMPUTE_TORCH_DEVIATION_H
#define LMP_COMPUTE_TORCH_DEVIATION_H

#include "compute.h"

namespace LAMMPS_NS {

class ComputeTorchDeviation : public Compute {
 public:
  ComputeTorchDeviation(class LAMMPS *, int, char **);
  ~ComputeTorchDeviation() override;
  void init() override;
  void compute_vector() override;
  void compute_peratom() override;
  double memory_usage() override;

 private:
  int nmax;
  double **devi;    // per-atom devi_f, devi_e
  // DeePMD-kit's relative deviations: devi_f_i / (|<F_i>| + relative) and
  // devi_v / (|<virial>| / N + relative_v); negative: absolute deviations
  double relative, relative_v;
  class TorchCommitteeView *find_pair();
};

}    // namespace LAMMPS_NS

#endif
#endif
