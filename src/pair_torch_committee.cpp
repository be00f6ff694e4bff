/* ----------------------------------------------------------------------
   LAMMPS - Large-scale Atomic/Molecular Massively Parallel Simulator
   https://www.lammps.org/, Sandia National Laboratories
   LAMMPS development team: developers@lammps.org

   ML-TORCH package: TorchScript machine-learned potentials.
   Distributed under the GNU General Public License, version 2.
------------------------------------------------------------------------- */

/* ----------------------------------------------------------------------
   pair_style torch with several model files (a committee): the MD model
   (member 0 or the members' mean) and the committee deviation of
   DeePMD-kit's model deviation, which fix torch/finetune and compute
   torch/deviation read
------------------------------------------------------------------------- */

#include "pair_torch.h"

#include "atom.h"
#include "comm.h"
#include "error.h"
#include "lmp_compat.h"
#include "update.h"

#include "mltorch/committee.h"
#include "mltorch/model.h"

#include <cmath>
#include <cstring>
#include <exception>

using namespace LAMMPS_NS;

/* ----------------------------------------------------------------------
   the MD forces: member 0, or the mean of the committee (whose members'
   outputs are then kept for the deviation of this step)
------------------------------------------------------------------------- */

void PairTorch::evaluate_md(const MLTorch::GraphInput &in, MLTorch::GraphOutput &out)
{
  const int nm = static_cast<int>(members.size());
  try {
    if (!committee_mean || nm == 1) {
      // node energies always come back (O(N) copy): they locate non-finite output
      model_->evaluate(in, out, true);
      return;
    }
    member_out.resize(nm);
    for (int m = 0; m < nm; ++m) members[m]->evaluate(in, member_out[m], true);
  } catch (std::exception &e) {
    model_error(e);
  }
  const double w = 1.0 / nm;
  out.energy = 0.0;
  out.edge_grad.assign(member_out[0].edge_grad.size(), 0.0);
  out.node_energy.assign(member_out[0].node_energy.size(), 0.0);
  out.edge_moment.assign(member_out[0].edge_moment.size(), 0.0);
  for (int m = 0; m < nm; ++m) {
    out.energy += w * member_out[m].energy;
    for (std::size_t k = 0; k < out.edge_moment.size(); ++k)
      out.edge_moment[k] += w * member_out[m].edge_moment[k];
    for (std::size_t k = 0; k < out.edge_grad.size(); ++k)
      out.edge_grad[k] += w * member_out[m].edge_grad[k];
    for (std::size_t k = 0; k < out.node_energy.size(); ++k)
      out.node_energy[k] += w * member_out[m].node_energy[k];
  }
}

/* ----------------------------------------------------------------------
   committee deviation of the current configuration, as DeePMD-kit defines
   its model deviation: for each owned atom i, over the M members m,
     devi_f(i) = sqrt( 1/M sum_m |F_m(i) - <F(i)>|^2 )
     devi_e(i) = sqrt( 1/M sum_m (e_m(i) - <e(i)>)^2 )
   with <.> the committee mean and e the atomic energies. Each member's
   forces on owned atoms include the ghost images' share (reverse comm).
------------------------------------------------------------------------- */

const PairTorch::Deviation &PairTorch::committee_deviation()
{
  if (stamp_deviation == ncompute && ncompute > 0) return deviation;
  const int nm = static_cast<int>(members.size());
  const int nlocal = atom->nlocal;
  const int nall = nlocal + atom->nghost;
  // the graph of the current neighbor list and positions (the same as the
  // last force call's, unless atoms moved since)
  MLTorch::GraphInput in;
  deviation_graph(in);
  if (stamp_members != ncompute || ncompute == 0) {
    member_out.resize(nm);
    try {
      for (int m = 0; m < nm; ++m)
        if (m == 0 && !committee_mean && stamp_output == ncompute && ncompute > 0)
          member_out[0] = *output;    // this force call's member-0 output
        else {
          members[m]->evaluate(in, member_out[m], true);
          model_calls[2] += 1.0;
        }
    } catch (std::exception &e) {
      model_error(e, " (committee deviation)");
    }
    stamp_members = ncompute;
  }
  const int width = 3 * nm;
  member_force.assign(static_cast<std::size_t>(nall) * width, 0.0);
  for (int m = 0; m < nm; ++m)
    add_edge_forces(member_out[m].edge_grad.data(), member_force.data() + 3 * m, width);
  if (nm > 1) comm->reverse_comm(this);

  deviation.atom.assign(2 * static_cast<std::size_t>(nlocal), 0.0);
  deviation.force_mean.assign(nlocal, 0.0);
  std::vector<double> e_atom(nm);
  for (int n = 0; n < ncounted; ++n) {
    const int i = node2atom[n];
    const double *fi = &member_force[static_cast<std::size_t>(i) * width];
    for (int m = 0; m < nm; ++m) e_atom[m] = member_out[m].node_energy[n];
    MLTorch::committee_atom_deviation(nm, fi, e_atom.data(), &deviation.atom[2 * i]);
    double mean[3] = {0.0, 0.0, 0.0};
    for (int m = 0; m < nm; ++m)
      for (int k = 0; k < 3; ++k) mean[k] += fi[3 * m + k] / nm;
    deviation.force_mean[i] = std::sqrt(mean[0] * mean[0] + mean[1] * mean[1] + mean[2] * mean[2]);
  }
  // every member's energy and full virial tensor on this rank, then summed
  std::vector<double> energy(10 * nm + 1, 0.0), sum(10 * nm + 1, 0.0);
  for (int m = 0; m < nm; ++m) {
    energy[m] = member_out[m].energy;
    const double *g = member_out[m].edge_grad.data();
    double *w = &energy[nm + 1 + 9 * m];
    for (int64_t e = 0; e < in.n_edges; ++e)
      for (int a = 0; a < 3; ++a)
        for (int b = 0; b < 3; ++b) w[3 * a + b] -= in.edge_vectors[3 * e + a] * g[3 * e + b];
  }
  energy[nm] = ncounted;
  MPI_Allreduce(energy.data(), sum.data(), 10 * nm + 1, MPI_DOUBLE, MPI_SUM, world);
  deviation.member_energy.assign(sum.begin(), sum.begin() + nm);
  deviation.natoms = sum[nm];
  deviation.member_virial.assign(sum.begin() + nm + 1, sum.end());
  stamp_deviation = ncompute;
  return deviation;
}
