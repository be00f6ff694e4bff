/* ----------------------------------------------------------------------
   LAMMPS - Large-scale Atomic/Molecular Massively Parallel Simulator
   https://www.lammps.org/, Sandia National Laboratories
   LAMMPS development team: developers@lammps.org

   ML-TORCH package: machine-learned potentials in PyTorch.
   Distributed under the GNU General Public License, version 2.
------------------------------------------------------------------------- */

#include "compute_torch_deviation.h"

#include "atom.h"
#include "comm.h"
#include "error.h"
#include "force.h"
#include "lmp_compat.h"
#include "memory.h"
#include "torch_student.h"
#include "update.h"

#include "mltorch/committee.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

using namespace LAMMPS_NS;

/* ----------------------------------------------------------------------
   compute ID group torch/deviation
------------------------------------------------------------------------- */

ComputeTorchDeviation::ComputeTorchDeviation(LAMMPS *lmp, int narg, char **arg) :
    Compute(lmp, narg, arg), nmax(0), devi(nullptr), relative(-1.0), relative_v(-1.0)
{
  // compute ID group torch/deviation [relative level] [relative_v level]
  for (int iarg = 3; iarg < narg; iarg += 2) {
    const bool f = strcmp(arg[iarg], "relative") == 0, v = strcmp(arg[iarg], "relative_v") == 0;
    if (!f && !v)
      error->all(FLERR, "Illegal compute torch/deviation keyword {} (expected relative or "
                        "relative_v)", arg[iarg]);
    if (iarg + 2 > narg) MLTorchLmp::missing_args(FLERR, "compute torch/deviation", error);
    const double level = utils::numeric(FLERR, arg[iarg + 1], false, lmp);
    if (!(level > 0.0))
      error->all(FLERR, "Illegal compute torch/deviation {} level {}: must be > 0", arg[iarg],
                 arg[iarg + 1]);
    (f ? relative : relative_v) = level;
  }
  vector_flag = 1;
  size_vector = 10;
  extvector = 0;
  peratom_flag = 1;
  size_peratom_cols = 2;
  vector = new double[size_vector];
  for (int k = 0; k < size_vector; ++k) vector[k] = 0.0;
}

ComputeTorchDeviation::~ComputeTorchDeviation()
{
  delete[] vector;
  memory->destroy(devi);
}

/* ---------------------------------------------------------------------- */

TorchCommitteeView *ComputeTorchDeviation::find_pair()
{
  auto *p = TorchCommitteeView::of(force);
  if (!p)
    error->all(FLERR, "Compute torch/deviation needs pair_style torch (alone or in pair_style "
                      "hybrid) with a committee: pair_coeff * * model1.pt model2.pt ... elements");
  if (p->committee_size() < 2)
    error->all(FLERR,
               "Compute torch/deviation needs a committee of at least 2 models: list several "
               "model files in pair_coeff (pair_coeff * * model1.pt model2.pt ... elements)");
  return p;
}

void ComputeTorchDeviation::init()
{
  find_pair();    // its ERRORs at the start of a run
}

/* ----------------------------------------------------------------------
   1-3: max, min, mean over the group's atoms of devi_f (force units)
   4-6: the same of devi_e (atomic energies, energy units)
   7:   committee standard deviation of the total energy per atom
   8-10: max, min, root mean square over the 9 components of the virial deviation
         (std over members of the virial tensor component / atoms)
------------------------------------------------------------------------- */

void ComputeTorchDeviation::compute_vector()
{
  invoked_vector = update->ntimestep;
  // found at every call: the pair style may have been replaced since init()
  TorchCommitteeView *pair = find_pair();
  const auto &d = pair->committee_deviation();
  const int nlocal = atom->nlocal;
  const int *mask = atom->mask;
  const int *type = atom->type;
  double mx[2] = {-1.0, -1.0}, mn[2] = {std::numeric_limits<double>::max(),
                                        std::numeric_limits<double>::max()};
  double sum[3] = {0.0, 0.0, 0.0};    // devi_f, devi_e, atoms
  for (int i = 0; i < nlocal; ++i) {
    if (!(mask[i] & groupbit) || pair->species_of_type(type[i]) < 0) continue;
    for (int c = 0; c < 2; ++c) {
      double v = d.atom[2 * i + c];
      if (c == 0 && relative > 0.0) v /= d.force_mean[i] + relative;
      mx[c] = std::max(mx[c], v);
      mn[c] = std::min(mn[c], v);
      sum[c] += v;
    }
    sum[2] += 1.0;
  }
  double gmx[2], gmn[2], gsum[3];
  MPI_Allreduce(mx, gmx, 2, MPI_DOUBLE, MPI_MAX, world);
  MPI_Allreduce(mn, gmn, 2, MPI_DOUBLE, MPI_MIN, world);
  MPI_Allreduce(sum, gsum, 3, MPI_DOUBLE, MPI_SUM, world);
  if (gsum[2] < 1.0) {
    for (int k = 0; k < 6; ++k) vector[k] = 0.0;
  } else {
    for (int c = 0; c < 2; ++c) {
      vector[3 * c] = gmx[c];
      vector[3 * c + 1] = gmn[c];
      vector[3 * c + 2] = gsum[c] / gsum[2];
    }
  }
  const int nm = pair->committee_size();
  vector[6] = d.natoms > 0.0
      ? MLTorch::committee_std(nm, d.member_energy.data()) / d.natoms
      : 0.0;
  // DeePMD-kit's virial deviation: per component of the virial tensor,
  // std over members / N; max, min, root mean square over the 9 components
  double vmax = 0.0, vmin = 0.0, vsum = 0.0;
  std::vector<double> comp(nm);
  // relative_v: divided by |<virial>| / N + level (the norm of the 9-component mean)
  double scale = 1.0;
  if (relative_v > 0.0 && d.natoms > 0.0) {
    double norm2 = 0.0;
    for (int k = 0; k < 9; ++k) {
      double mean = 0.0;
      for (int m = 0; m < nm; ++m) mean += d.member_virial[9 * m + k] / nm;
      norm2 += mean * mean;
    }
    scale = 1.0 / (std::sqrt(norm2) / d.natoms + relative_v);
  }
  for (int k = 0; k < 9; ++k) {
    for (int m = 0; m < nm; ++m) comp[m] = d.member_virial[9 * m + k];
    const double dv =
        d.natoms > 0.0 ? scale * MLTorch::committee_std(nm, comp.data()) / d.natoms : 0.0;
    vmax = (k == 0) ? dv : std::max(vmax, dv);
    vmin = (k == 0) ? dv : std::min(vmin, dv);
    vsum += dv * dv;
  }
  vector[7] = vmax;
  vector[8] = vmin;
  // DeePMD-kit's avg_devi_v: |devi_v|_2 / 3, the root mean square of the 9
  vector[9] = std::sqrt(vsum) / 3.0;
}

/* ---------------------------------------------------------------------- */

void ComputeTorchDeviation::compute_peratom()
{
  invoked_peratom = update->ntimestep;
  if (atom->nmax > nmax) {
    memory->destroy(devi);
    nmax = atom->nmax;
    memory->create(devi, nmax, 2, "torch/deviation:devi");
    array_atom = devi;
  }
  const auto &d = find_pair()->committee_deviation();
  const int nlocal = atom->nlocal;
  const int *mask = atom->mask;
  for (int i = 0; i < nlocal; ++i)
    for (int c = 0; c < 2; ++c) {
      double v = (mask[i] & groupbit) ? d.atom[2 * i + c] : 0.0;
      if (c == 0 && relative > 0.0) v /= d.force_mean[i] + relative;
      devi[i][c] = v;
    }
}

/* ---------------------------------------------------------------------- */

double ComputeTorchDeviation::memory_usage()
{
  return 2.0 * nmax * sizeof(double);
}
