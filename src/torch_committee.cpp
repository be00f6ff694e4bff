/* ----------------------------------------------------------------------
   LAMMPS - Large-scale Atomic/Molecular Massively Parallel Simulator
   https://www.lammps.org/, Sandia National Laboratories
   LAMMPS development team: developers@lammps.org

   ML-TORCH package: TorchScript machine-learned potentials.
   Distributed under the GNU General Public License, version 2.
------------------------------------------------------------------------- */

/* ----------------------------------------------------------------------
   the models of a torch pair style: one file or a committee of several;
   the MD model (member 0 or the members' mean) and the committee deviation
   of DeePMD-kit's model deviation, which fix torch/finetune and compute
   torch/deviation read
------------------------------------------------------------------------- */

#include "torch_committee.h"

#include "atom.h"
#include "comm.h"
#include "error.h"
#include "lmp_compat.h"
#include "mltorch_mpi.h"
#include "torch_graph.h"
#include "universe.h"
#include "update.h"

#include "mltorch/committee.h"
#include "mltorch/model.h"
#include "mltorch/runtime.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>

using namespace LAMMPS_NS;

using MLTorchLmp::join_words;

TorchCommittee::TorchCommittee(LAMMPS *lmp) : Pointers(lmp) {}

TorchCommittee::~TorchCommittee() = default;

/* ----------------------------------------------------------------------
   pair_coeff's model files. Rank 0 finds each file (like other potential
   files, also through the LAMMPS_POTENTIALS folder), reads it once and
   broadcasts its bytes: no file-system storm when thousands of ranks start
------------------------------------------------------------------------- */

void TorchCommittee::load(const std::vector<std::string> &files, const std::string &device,
                          int ntypes, int nwords)
{
  const int nfiles = static_cast<int>(files.size());
  std::vector<std::shared_ptr<MLTorch::Model>> loaded_members;
  std::vector<std::string> found_paths, found_hashes;
  for (int m = 0; m < nfiles; ++m) {
    std::string bytes, message, path = files[m];
    bool ok = true;
    if (comm->me == 0) {
      const std::string found = utils::get_potential_file_path(path);
      if (!found.empty()) path = found;
      try {
        bytes = MLTorch::read_file(path);
      } catch (std::exception &e) {
        ok = false;
        message = e.what();
        // a misspelt element is read as a file name when the count is off
        if (nfiles > 1)
          message += fmt::format(" (pair_coeff read {} model files, because {} words follow "
                                 "'* *' and there are {} atom types)",
                                 nfiles, nwords, ntypes);
      }
    }
    MLTorchLmp::stop_collectively(error, world, ok, message);
    MLTorch::broadcast_bytes(path, 0, world);
    MLTorch::broadcast_bytes(bytes, 0, world);
    std::shared_ptr<MLTorch::Model> loaded;
    try {
      loaded = std::make_shared<MLTorch::Model>(bytes, path, device);
    } catch (std::exception &e) {
      ok = false;
      message = e.what();
    }
    MLTorchLmp::stop_collectively(error, world, ok, message);
    if (m > 0) {
      // a committee answers the same question: same elements, units,
      // cutoff and depth (so one graph serves all members)
      const auto &a = loaded_members[0]->metadata(), &b = loaded->metadata();
      std::string what;
      if (a.elements != b.elements)
        what = fmt::format("elements {} vs {}", join_words(a.elements), join_words(b.elements));
      else if (a.units != b.units)
        what = fmt::format("units {} vs {}", a.units, b.units);
      else if (a.cutoff != b.cutoff)
        what = fmt::format("cutoff {} vs {}", a.cutoff, b.cutoff);
      else if (a.num_interaction_layers != b.num_interaction_layers)
        what = fmt::format("{} vs {} interaction layers", a.num_interaction_layers,
                           b.num_interaction_layers);
      if (!what.empty())
        error->all(FLERR,
                   "Pair style torch: committee member {} ({}) does not match member 1 ({}): {}; "
                   "a committee needs models of the same elements, units, cutoff and depth",
                   m + 1, path, found_paths[0], what);
    }
    loaded_members.push_back(std::move(loaded));
    found_paths.push_back(path);
    found_hashes.push_back(MLTorch::content_hash(bytes));
  }
  members = std::move(loaded_members);
  paths = std::move(found_paths);
  hashes = std::move(found_hashes);
  member_out.clear();
  changed();
}

/* ----------------------------------------------------------------------
   the LibTorch device of this rank for pair_style torch's 'device'
   keyword: 'device cuda' gives the node-local
   ranks the node's GPUs in turn (rank k on a node uses GPU k mod #GPUs,
   as LAMMPS's GPU and KOKKOS packages do). The node-local rank is counted
   in the whole job (universe), not in this partition: with -partition the
   replicas on a node would otherwise all start at GPU 0. 'device cuda:N'
   is used as given.
------------------------------------------------------------------------- */

std::string TorchCommittee::rank_device(const std::string &device_name) const
{
  if (device_name != "cuda") return device_name;
  const int ngpu = MLTorch::cuda_device_count();
  if (ngpu < 1) return device_name;    // the model load reports the missing GPU
  int local = 0;
#ifndef MPI_STUBS
  MPI_Comm node;
  MPI_Comm_split_type(universe->uworld, MPI_COMM_TYPE_SHARED, universe->me, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &local);
  MPI_Comm_free(&node);
#endif
  return MLTorch::cuda_device_for_rank(local, ngpu);
}

/* ----------------------------------------------------------------------
   a re-issued pair_style may name another device: the models follow
------------------------------------------------------------------------- */

void TorchCommittee::to_device(const std::string &device)
{
  bool ok = true;
  std::string message;
  try {
    for (auto &m : members) m->to_device(device);
  } catch (std::exception &e) {
    ok = false;
    message = e.what();
  }
  MLTorchLmp::stop_collectively(error, world, ok, message);
}

bool TorchCommittee::all_layered(int &feature_width) const
{
  bool layered = true;
  feature_width = 0;
  for (const auto &m : members) {
    layered = layered && m->metadata().layered;
    if (m->metadata().layered)
      for (int w : m->metadata().feature_widths) feature_width = std::max(feature_width, w);
  }
  return layered;
}

void TorchCommittee::model_error(const std::exception &e, const char *what) const
{
  error->one(FLERR, "Pair style torch{} on step {}: {}", what, update->ntimestep, e.what());
}

/* ----------------------------------------------------------------------
   the MD forces: member 0, or the mean of the committee (whose members'
   outputs are then kept for the deviation of this step)
------------------------------------------------------------------------- */

void TorchCommittee::evaluate_md(const MLTorch::GraphInput &in, MLTorch::GraphOutput &out,
                                 long call)
{
  const int nm = static_cast<int>(members.size());
  try {
    if (!mean || nm == 1) {
      // node energies always come back (O(N) copy): they locate non-finite output
      members[0]->evaluate(in, out, true);
      return;
    }
    member_out.resize(nm);
    for (int m = 0; m < nm; ++m) members[m]->evaluate(in, member_out[m], true);
    // member_out holds this force call's outputs (a call < 0 is no force call)
    stamp_members = call;
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

const TorchStudent::Deviation &TorchCommittee::deviation(TorchGraph &graph,
                                                         const MLTorch::GraphInput &in, long call,
                                                         const MLTorch::GraphOutput *first)
{
  if (const TorchStudent::Deviation *known = known_deviation(call)) return *known;
  const int nm = static_cast<int>(members.size());
  const int nlocal = atom->nlocal;
  const int nall = nlocal + atom->nghost;
  if (stamp_members != call || call == 0) {
    member_out.resize(nm);
    try {
      for (int m = 0; m < nm; ++m)
        if (m == 0 && !mean && first)
          member_out[0] = *first;    // this force call's member-0 output
        else {
          members[m]->evaluate(in, member_out[m], true);
          evaluations += 1.0;
        }
    } catch (std::exception &e) {
      model_error(e, " (committee deviation)");
    }
    stamp_members = call;
  }
  const int width = 3 * nm;
  member_force.assign(static_cast<std::size_t>(nall) * width, 0.0);
  for (int m = 0; m < nm; ++m)
    graph.scatter(member_out[m].edge_grad.data(), member_force.data() + 3 * m, width);
  // each member's forces on owned atoms include the ghost images' share
  if (nm > 1) graph.communicate(member_force.data(), width, true);
  const std::vector<int> &node2atom = graph.node_atoms();
  const int ncounted = graph.n_counted();

  result.atom.assign(2 * static_cast<std::size_t>(nlocal), 0.0);
  result.force_mean.assign(nlocal, 0.0);
  std::vector<double> e_atom(nm);
  for (int n = 0; n < ncounted; ++n) {
    const int i = node2atom[n];
    const double *fi = &member_force[static_cast<std::size_t>(i) * width];
    for (int m = 0; m < nm; ++m) e_atom[m] = member_out[m].node_energy[n];
    MLTorch::committee_atom_deviation(nm, fi, e_atom.data(), &result.atom[2 * i]);
    double mean[3] = {0.0, 0.0, 0.0};
    for (int m = 0; m < nm; ++m)
      for (int k = 0; k < 3; ++k) mean[k] += fi[3 * m + k] / nm;
    result.force_mean[i] = std::sqrt(mean[0] * mean[0] + mean[1] * mean[1] + mean[2] * mean[2]);
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
  result.member_energy.assign(sum.begin(), sum.begin() + nm);
  result.natoms = sum[nm];
  result.member_virial.assign(sum.begin() + nm + 1, sum.end());
  stamp_deviation = call;
  return result;
}
