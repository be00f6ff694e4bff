/* ----------------------------------------------------------------------
   LAMMPS - Large-scale Atomic/Molecular Massively Parallel Simulator
   https://www.lammps.org/, Sandia National Laboratories
   LAMMPS development team: developers@lammps.org

   ML-TORCH package: TorchScript machine-learned potentials.
   Distributed under the GNU General Public License, version 2.
------------------------------------------------------------------------- */

/* ----------------------------------------------------------------------
   pair_style torch/kk: the model contract of pair_style torch on KOKKOS
   data. Its graph (TorchGraphKokkos) is built and scattered on the style's
   execution space and handed to LibTorch without a copy; this file holds
   the LAMMPS pair style around it: keywords, the force call (build ->
   evaluate -> scatter), the committee mean on the device, per-atom arrays.
------------------------------------------------------------------------- */

#include "pair_torch_kokkos.h"

#include "atom_kokkos.h"
#include "atom_masks.h"
#include "compute.h"
#include "error.h"
#include "force.h"
#include "kokkos.h"
#include "memory_kokkos.h"
#include "modify.h"
#include "neigh_list_kokkos.h"
#include "neigh_request.h"
#include "neighbor.h"
#include "platform.h"
#include "torch_committee.h"
#include "update.h"

#include "mltorch/model.h"
#include "mltorch/runtime.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <type_traits>

using namespace LAMMPS_NS;

/* ---------------------------------------------------------------------- */

template <class DeviceType>
PairTorchKokkos<DeviceType>::PairTorchKokkos(LAMMPS *lmp) :
    PairTorch(lmp), kgraph(new TorchGraphKokkos<DeviceType>(lmp, this, comm_rows))
{
  graph.reset(kgraph);
  respa_enable = 0;
  kokkosable = 1;
  // no device centroid virial yet: compute centroid/stress/atom refuses torch/kk
  // rather than getting a pairwise split (use pair_style torch for it)
  centroid_supported = false;
  // its graphs are built on the device, with the exchange on any rank count
  fold_supported = false;
  centroidstressflag = CENTROID_NOTAVAIL;
  atomKK = (AtomKokkos *) atom;
  execution_space = ExecutionSpaceFromDevice<DeviceType>::space;
  // the per-atom arrays compute() reads and writes
  datamask_read = X_MASK | F_MASK | TYPE_MASK;
  datamask_modify = F_MASK;
}

template <class DeviceType> PairTorchKokkos<DeviceType>::~PairTorchKokkos()
{
  if (copymode) return;
  memoryKK->destroy_kokkos(k_eatom, eatom);
  memoryKK->destroy_kokkos(k_vatom, vatom);
  eatom = nullptr;
  vatom = nullptr;
}

/* ----------------------------------------------------------------------
   pair_style torch/kk [threads N] [device D] [pad Natoms Nedges]
------------------------------------------------------------------------- */

template <class DeviceType> void PairTorchKokkos<DeviceType>::settings(int narg, char **arg)
{
  std::vector<char *> rest;
  int64_t pad_nodes = 0, pad_edges = 0;
  bool device_given = false;
  for (int i = 0; i < narg; ++i) {
    if (strcmp(arg[i], "pad") == 0) {
      if (i + 3 > narg) MLTorchLmp::missing_args(FLERR, "pair_style torch/kk pad", error);
      pad_nodes = utils::bnumeric(FLERR, arg[i + 1], false, lmp);
      pad_edges = utils::bnumeric(FLERR, arg[i + 2], false, lmp);
      if (pad_nodes < 2 || pad_edges < 1)
        error->all(FLERR, "Illegal pair_style torch/kk pad {} {}: need at least 2 atoms and 1 edge",
                   pad_nodes, pad_edges);
      i += 2;
    } else {
      if (strcmp(arg[i], "device") == 0) device_given = true;
      rest.push_back(arg[i]);
    }
  }
  PairTorch::settings(static_cast<int>(rest.size()), rest.data());
  kgraph->pad_nodes = pad_nodes;
  kgraph->pad_edges = pad_edges;
  // On a device execution space the graph buffers are device memory, so the
  // model runs on the GPU Kokkos uses (LAMMPS maps ranks to GPUs with
  // -k on g N). An explicit other device cannot work without host copies:
  // refuse it rather than silently replace it.
  const bool device_space = !std::is_same<typename DeviceType::memory_space, Kokkos::HostSpace>::value;
  if (device_space) {
    const std::string kokkos_device = MLTorchLmp::kokkos_torch_device<DeviceType>();
    if (device_given && device_name != kokkos_device && device_name != "cuda")
      error->all(FLERR,
                 "Pair style torch/kk on the Kokkos device runs the model where the atoms are "
                 "({}); 'device {}' is not possible here. Use pair_style torch/kk/host or "
                 "pair_style torch for a model on another device",
                 kokkos_device, device_name);
    device_name = kokkos_device;
  }
}

/* ---------------------------------------------------------------------- */

template <class DeviceType> void PairTorchKokkos<DeviceType>::init_style()
{
  // KOKKOS's default on GPUs is newton off with half lists; the model contract
  // needs ghost forces summed back to their owners
  if (force->newton_pair == 0)
    error->all(FLERR, "Pair style torch/kk requires newton pair on: run with "
                      "'-pk kokkos newton on neigh half' (KOKKOS sets newton off on GPUs by "
                      "default) or use 'package kokkos newton on neigh half' in the input");
  PairTorch::init_style();
  MLTorchLmp::kokkos_request<DeviceType>(neighbor, this);
  // LAMMPS would stop with "Pair style does not support compute
  // centroid/stress/atom"; say what does
  for (const auto *c : modify->get_compute_by_style("^centroid/stress/atom"))
    error->all(FLERR,
               "Pair style torch/kk does not compute the atomic (centroid) virial that compute {} "
               "(centroid/stress/atom, and compute heat/flux on it) needs; run those steps with "
               "pair_style torch (without -sf kk), which gives it exactly for every model",
               c->id);

  const int ntypes = atom->ntypes;
  for (int t = 1; t <= ntypes; ++t)
    if (species_of_type(t) < 0)
      error->all(FLERR, "Pair style torch/kk: atom type {} is mapped to NULL; torch/kk needs an "
                        "element for every type (use pair_style torch inside pair_style hybrid)",
                 t);
  auto &t2s = kgraph->d_type2species;
  t2s = Kokkos::View<int *, DeviceType>("torch/kk:type2species", ntypes + 1);
  auto h = Kokkos::create_mirror_view(t2s);
  for (int t = 0; t <= ntypes; ++t) h(t) = species_of_type(t) < 0 ? 0 : species_of_type(t);
  Kokkos::deep_copy(t2s, h);
}

/* ---------------------------------------------------------------------- */

template <class DeviceType> void PairTorchKokkos<DeviceType>::compute(int eflag_in, int vflag_in)
{
  const double t_start = platform::walltime();
  ev_init(eflag_in, vflag_in, 0);
  MLTorch::set_num_threads(torch_threads);
  MLTorch::tensor_blocks_step();
  if (eflag_atom && (int) k_eatom.extent(0) < maxeatom) {
    memoryKK->destroy_kokkos(k_eatom, eatom);
    memoryKK->create_kokkos(k_eatom, eatom, maxeatom, "pair:eatom");
    kgraph->capacity_changes += 1.0;
  }
  if (vflag_atom && (int) k_vatom.extent(0) < maxvatom) {
    memoryKK->destroy_kokkos(k_vatom, vatom);
    memoryKK->create_kokkos(k_vatom, vatom, maxvatom, "pair:vatom");
    kgraph->capacity_changes += 1.0;
  }
  if (eflag_atom) {
    d_eatom = k_eatom.template view<DeviceType>();
    Kokkos::deep_copy(d_eatom, 0.0);
  }
  if (vflag_atom) {
    d_vatom = k_vatom.template view<DeviceType>();
    Kokkos::deep_copy(d_vatom, 0.0);
  }

  atomKK->sync(execution_space, datamask_read);
  if (eflag_in || vflag_in)
    atomKK->modified(execution_space, datamask_modify);
  else
    atomKK->modified(execution_space, F_MASK);
  f = atomKK->k_f.template view<DeviceType>();

  require_all_type_pairs();
  kgraph->build_device(list);
  if (log_ghosts) kgraph->log_ghost_counts(static_cast<double>(kgraph->nnodes_real));
  log_ghosts = false;

  MLTorch::GraphInput in;
  kgraph->input(in);
  kgraph->halo_device_rows = in.on_model_device;
  double energy = 0.0;
  ++ncompute;
  const double t_model = platform::walltime();
  try {
    energy = model()->evaluate_into(in, kgraph->d_edge_grad.data(),
                                   eflag_atom ? kgraph->d_node_energy.data() : nullptr);
    if (committee->mean && committee->size() > 1) energy = add_members_device(in, energy);
  } catch (std::exception &e) {
    committee->model_error(e);
  }
  kgraph->halo_device_rows = false;
  time_model += platform::walltime() - t_model;

  double vsum[6] = {0, 0, 0, 0, 0, 0};
  const int64_t nonfinite = kgraph->scatter_device(f, d_vatom, vflag_atom, vflag_global, vsum);
  if (nonfinite > 0 || !std::isfinite(energy))
    nonfinite_error(fmt::format(" ({} non-finite edge gradient component(s) on rank {})",
                                nonfinite, comm->me));
  if (eflag_global) eng_vdwl += energy;
  if (vflag_global)
    for (int k = 0; k < 6; ++k) virial[k] += vsum[k];
  if (eflag_atom) {
    auto eatom_d = d_eatom;
    auto ne = kgraph->d_node_energy;
    Kokkos::parallel_for(
        "torch/kk:eatom", Kokkos::RangePolicy<DeviceType>(0, atom->nlocal),
        KOKKOS_LAMBDA(int i) { eatom_d(i) += ne(i); });
  }

  if (eflag_atom) MLTorchLmp::modified_sync_host<DeviceType>(k_eatom);
  if (vflag_atom) MLTorchLmp::modified_sync_host<DeviceType>(k_vatom);
  time_pair += platform::walltime() - t_start;
}

/* ----------------------------------------------------------------------
   committee mean: the other members' edge gradients (and node energies)
   added to member 1's in the device buffers, then divided by their number
------------------------------------------------------------------------- */

template <class DeviceType>
double PairTorchKokkos<DeviceType>::add_members_device(const MLTorch::GraphInput &in, double energy)
{
  auto grad = kgraph->d_edge_grad;
  auto ne = kgraph->d_node_energy;
  if (d_edge_grad_m.extent(0) != grad.extent(0))
    d_edge_grad_m = Kokkos::View<double *[3], Kokkos::LayoutRight, DeviceType>(
        "torch/kk:edge_grad_m", grad.extent(0));
  if (d_node_energy_m.extent(0) != ne.extent(0))
    d_node_energy_m = Kokkos::View<double *, DeviceType>("torch/kk:node_energy_m", ne.extent(0));
  auto grad_m = d_edge_grad_m;
  auto ne_m = d_node_energy_m;
  const bool atoms = eflag_atom;
  const int64_t nedges_model = kgraph->nedges_model;
  const int nm = committee->size();
  for (int m = 1; m < nm; ++m) {
    energy += committee->member(m)->evaluate_into(in, grad_m.data(), atoms ? ne_m.data() : nullptr);
    Kokkos::parallel_for(
        "torch/kk:committee_sum", Kokkos::RangePolicy<DeviceType, Kokkos::IndexType<int64_t>>(0, nedges_model),
        KOKKOS_LAMBDA(int64_t e) {
          for (int k = 0; k < 3; ++k) grad(e, k) += grad_m(e, k);
        });
    if (atoms)
      Kokkos::parallel_for(
          "torch/kk:committee_sum_e", Kokkos::RangePolicy<DeviceType>(0, atom->nlocal),
          KOKKOS_LAMBDA(int i) { ne(i) += ne_m(i); });
  }
  const double w = 1.0 / nm;
  Kokkos::parallel_for(
      "torch/kk:committee_mean", Kokkos::RangePolicy<DeviceType, Kokkos::IndexType<int64_t>>(0, nedges_model),
      KOKKOS_LAMBDA(int64_t e) {
        for (int k = 0; k < 3; ++k) grad(e, k) *= w;
      });
  if (atoms)
    Kokkos::parallel_for(
        "torch/kk:committee_mean_e", Kokkos::RangePolicy<DeviceType>(0, atom->nlocal),
        KOKKOS_LAMBDA(int i) { ne(i) *= w; });
  typename DeviceType::execution_space().fence("torch/kk: committee mean ready");
  return energy * w;
}

/* ----------------------------------------------------------------------
   "capacity_changes": buffer allocations so far (0-dim double); the
   steady state of a run makes none
------------------------------------------------------------------------- */

template <class DeviceType> void *PairTorchKokkos<DeviceType>::extract(const char *name, int &dim)
{
  dim = 0;
  if (strcmp(name, "capacity_changes") == 0) return (void *) &kgraph->capacity_changes;
  if (strcmp(name, "graph_size") == 0) {
    dim = 1;
    return (void *) kgraph->size;
  }
  return nullptr;
}

/* ----------------------------------------------------------------------
   fix torch/finetune works on the host on its labelling steps only (its
   KOKKOS data masks are empty, so other steps sync nothing for it)
------------------------------------------------------------------------- */

template <class DeviceType> void PairTorchKokkos<DeviceType>::sync_host_for_fix()
{
  // everything: the fix's teacher is any LAMMPS pair style, which may read
  // any per-atom data (charges, molecule IDs, ...) on the host
  atomKK->sync(Host, ALL_MASK);
}

template <class DeviceType> void PairTorchKokkos<DeviceType>::host_forces_modified()
{
  atomKK->modified(Host, F_MASK);
}

template <class DeviceType> double PairTorchKokkos<DeviceType>::memory_usage()
{
  return PairTorch::memory_usage();
}

namespace LAMMPS_NS {
template class PairTorchKokkos<LMPDeviceType>;
#ifdef LMP_KOKKOS_GPU
template class PairTorchKokkos<LMPHostType>;
#endif
}    // namespace LAMMPS_NS
