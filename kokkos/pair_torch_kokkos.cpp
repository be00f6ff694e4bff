/* ----------------------------------------------------------------------
   LAMMPS - Large-scale Atomic/Molecular Massively Parallel Simulator
   https://www.lammps.org/, Sandia National Laboratories
   LAMMPS development team: developers@lammps.org

   ML-TORCH package: TorchScript machine-learned potentials.
   Distributed under the GNU General Public License, version 2.
------------------------------------------------------------------------- */

/* ----------------------------------------------------------------------
   pair_style torch/kk: the model contract of pair_style torch on KOKKOS
   data. The graph is built on the style's execution space from the Kokkos
   full neighbor list (count, scan, fill with the cutoff filter); its
   buffers go to LibTorch without a copy (from_blob on the same memory);
   forces, per-atom energy and virial are accumulated on the device.
   Nodes are the local atoms (node i = atom i, they count in the energy)
   followed by the ghost atoms that some edge touches, as in pair_style torch.
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
    PairTorch(lmp), node_capacity(0), edge_capacity(0), pad_nodes(0), pad_edges(0),
    capacity_changes(0.0), nnodes_real(0), nedges_real(0), nnodes_model(0), nedges_model(0),
    ncentres(0)
{
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
  pad_nodes = pad_edges = 0;
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
    if (type2species[t] < 0)
      error->all(FLERR, "Pair style torch/kk: atom type {} is mapped to NULL; torch/kk needs an "
                        "element for every type (use pair_style torch inside pair_style hybrid)",
                 t);
  d_type2species = Kokkos::View<int *, DeviceType>("torch/kk:type2species", ntypes + 1);
  auto h = Kokkos::create_mirror_view(d_type2species);
  for (int t = 0; t <= ntypes; ++t) h(t) = type2species[t] < 0 ? 0 : type2species[t];
  Kokkos::deep_copy(d_type2species, h);
}

/* ----------------------------------------------------------------------
   buffers: grow to 1.5x when too small, never shrink; with fixed pads a
   configuration that does not fit is an error, not a reallocation
------------------------------------------------------------------------- */

template <class DeviceType>
void PairTorchKokkos<DeviceType>::ensure_capacity(int64_t nodes, int64_t edges)
{
  if (pad_nodes > 0) {
    // fixed shapes; a configuration that outgrows them gets larger fixed
    // shapes (with headroom) and a warning, rather than a stopped run
    if (nodes + 1 > pad_nodes || edges > pad_edges) {
      const int64_t new_nodes = std::max(pad_nodes, nodes + 1 + (nodes + 1) / 4);
      const int64_t new_edges = std::max(pad_edges, edges + edges / 4);
      error->warning(FLERR,
                     "Pair style torch/kk: {} atoms and {} edges on rank {} at step {} do not fit "
                     "'pad {} {}' (one slot is the dummy atom); padding grows to {} {} on this "
                     "rank. Raise the pad values to keep the shapes fixed",
                     nodes, edges, comm->me, update->ntimestep, pad_nodes, pad_edges, new_nodes,
                     new_edges);
      pad_nodes = new_nodes;
      pad_edges = new_edges;
    }
    nodes = pad_nodes;
    edges = pad_edges;
  }
  if (nodes > node_capacity || node_capacity == 0) {
    // 50% headroom over the need and over the old capacity: geometric growth,
    // and thermal fluctuations of the counts do not reallocate
    node_capacity = (pad_nodes > 0)
        ? nodes
        : std::max({nodes + nodes / 2, node_capacity + node_capacity / 2, MIN_CAPACITY});
    d_species = Kokkos::View<int64_t *, DeviceType>("torch/kk:species", node_capacity);
    d_node_energy = Kokkos::View<double *, DeviceType>("torch/kk:node_energy", node_capacity);
    d_count = Kokkos::View<int64_t *, DeviceType>("torch/kk:count", node_capacity);
    d_offset = Kokkos::View<int64_t *, DeviceType>("torch/kk:offset", node_capacity + 1);
    d_node_of = Kokkos::View<int *, DeviceType>("torch/kk:node_of", node_capacity);
    d_atom_of = Kokkos::View<int *, DeviceType>("torch/kk:atom_of", node_capacity);
    capacity_changes += 1.0;
  }
  if (edges > edge_capacity || edge_capacity == 0) {
    edge_capacity = (pad_edges > 0)
        ? edges
        : std::max({edges + edges / 2, edge_capacity + edge_capacity / 2, MIN_CAPACITY});
    d_edge_vec = Kokkos::View<double *[3], Kokkos::LayoutRight, DeviceType>("torch/kk:edge_vec",
                                                                            edge_capacity);
    d_edge_grad = Kokkos::View<double *[3], Kokkos::LayoutRight, DeviceType>("torch/kk:edge_grad",
                                                                             edge_capacity);
    d_edge_index = Kokkos::View<int64_t *, DeviceType>("torch/kk:edge_index", 2 * edge_capacity);
    capacity_changes += 1.0;
  }
}

namespace {
// ghost centres whose edges cannot reach a local energy (message-passing
// models; the rule of PairTorch::ghost_reach, evaluated in the kernels)
// (GhostReach::needed is host code; its data is read here on the device)
template <class XView, class Reach> struct GhostCentreFilter {
  XView x;
  Reach reach;
  int nlocal_centres;
  KOKKOS_INLINE_FUNCTION bool skip(int ii, int i) const
  {
    if (!reach.prune || ii < nlocal_centres) return false;
    double d2 = 0.0;
    for (int d = 0; d < 3; ++d) {
      const double p = x(i, d);
      const double out = (p < reach.lo[d]) ? reach.lo[d] - p : (p > reach.hi[d] ? p - reach.hi[d] : 0.0);
      d2 += out * out;
    }
    return d2 > reach.reach_sq;
  }
};
}    // namespace

/* ----------------------------------------------------------------------
   edges from the Kokkos full neighbor list: count, scan, fill
------------------------------------------------------------------------- */

template <class DeviceType> void PairTorchKokkos<DeviceType>::build_graph_device()
{
  auto *k_list = static_cast<NeighListKokkos<DeviceType> *>(list);
  auto d_ilist = k_list->d_ilist;
  auto d_numneigh = k_list->d_numneigh;
  auto d_neighbors = k_list->d_neighbors;
  const int inum = list->inum;
  ncentres = inum + (ghostneigh ? list->gnum : 0);
  nnodes_real = atom->nlocal + atom->nghost;

  ensure_capacity(nnodes_real, 0);
  auto lx = x;
  auto count = d_count;
  const double rcsq = cutoff * cutoff;
  // ghost centres that cannot reach a local energy build no edges (see
  // PairTorch::ghost_reach; the same rule as the CPU style)
  const GhostCentreFilter<typename KK::t_x, GhostReach> ghost_filter{lx, ghost_reach(), inum};
  Kokkos::parallel_for(
      "torch/kk:count_edges", Kokkos::RangePolicy<DeviceType>(0, ncentres), KOKKOS_LAMBDA(int ii) {
        const int i = d_ilist(ii);
        int64_t n = 0;
        if (ghost_filter.skip(ii, i)) {
          count(ii) = 0;
          return;
        }
        for (int jj = 0; jj < d_numneigh(i); ++jj) {
          const int j = d_neighbors(i, jj) & NEIGHMASK;
          const double dx = lx(j, 0) - lx(i, 0), dy = lx(j, 1) - lx(i, 1), dz = lx(j, 2) - lx(i, 2);
          if (dx * dx + dy * dy + dz * dz < rcsq) ++n;
        }
        count(ii) = n;
      });
  auto offset = d_offset;
  int64_t total = 0;
  Kokkos::parallel_scan(
      "torch/kk:scan_edges", Kokkos::RangePolicy<DeviceType>(0, ncentres),
      KOKKOS_LAMBDA(int ii, int64_t &partial, bool final) {
        if (final) offset(ii) = partial;
        partial += count(ii);
      },
      total);
  nedges_real = total;
  ensure_capacity(nnodes_real, nedges_real);

  // the model sees the padded sizes in fixed-capacity mode
  nedges_model = (pad_edges > 0) ? pad_edges : nedges_real;
  const int64_t second = nedges_model;    // edge_index is [2][nedges_model]
  auto vec = d_edge_vec;
  auto index = d_edge_index;
  auto sp = d_species;
  auto t2s = d_type2species;
  auto ltype = type;
  Kokkos::parallel_for(
      "torch/kk:fill_edges", Kokkos::RangePolicy<DeviceType>(0, ncentres), KOKKOS_LAMBDA(int ii) {
        const int i = d_ilist(ii);
        if (ghost_filter.skip(ii, i)) return;
        int64_t e = offset(ii);
        for (int jj = 0; jj < d_numneigh(i); ++jj) {
          const int j = d_neighbors(i, jj) & NEIGHMASK;
          const double dx = lx(j, 0) - lx(i, 0), dy = lx(j, 1) - lx(i, 1), dz = lx(j, 2) - lx(i, 2);
          if (dx * dx + dy * dy + dz * dz >= rcsq) continue;
          vec(e, 0) = dx;
          vec(e, 1) = dy;
          vec(e, 2) = dz;
          index(e) = i;
          index(second + e) = j;
          ++e;
        }
      });
  // nodes: every local atom, then the ghost atoms that edges touch, in atom
  // order (mark, scan, renumber); untouched ghosts cost the model nothing
  const int nall = static_cast<int>(nnodes_real);
  const int nlocal = atom->nlocal;
  const int64_t nedges = nedges_real;
  auto node_of = d_node_of;
  auto atom_of = d_atom_of;
  Kokkos::parallel_for(
      "torch/kk:mark_nodes", Kokkos::RangePolicy<DeviceType>(0, nall),
      KOKKOS_LAMBDA(int i) { node_of(i) = (i < nlocal) ? 1 : 0; });
  Kokkos::parallel_for(
      "torch/kk:mark_edge_nodes", Kokkos::RangePolicy<DeviceType, Kokkos::IndexType<int64_t>>(0, nedges),
      KOKKOS_LAMBDA(int64_t e) {
        node_of(index(e)) = 1;
        node_of(index(second + e)) = 1;
      });
  int nnodes = 0;
  Kokkos::parallel_scan(
      "torch/kk:number_nodes", Kokkos::RangePolicy<DeviceType>(0, nall),
      KOKKOS_LAMBDA(int i, int &partial, bool final) {
        const int used = node_of(i);
        if (final) {
          node_of(i) = used ? partial : -1;
          if (used) atom_of(partial) = i;
        }
        partial += used;
      },
      nnodes);
  nnodes_real = nnodes;
  nnodes_model = (pad_nodes > 0) ? pad_nodes : nnodes_real;
  Kokkos::parallel_for(
      "torch/kk:renumber_edges", Kokkos::RangePolicy<DeviceType, Kokkos::IndexType<int64_t>>(0, nedges),
      KOKKOS_LAMBDA(int64_t e) {
        index(e) = node_of(index(e));
        index(second + e) = node_of(index(second + e));
      });
  const int64_t nreal = nnodes_real;
  Kokkos::parallel_for(
      "torch/kk:species", Kokkos::RangePolicy<DeviceType, Kokkos::IndexType<int64_t>>(0, nnodes_model),
      KOKKOS_LAMBDA(int64_t n) {
        sp(n) = (n < nreal) ? t2s(ltype(atom_of(n))) : 0;
      });
  if (nedges_model > nedges_real) {
    // padding: edges from the dummy atom to itself, beyond the cutoff; the
    // dummy's energy does not count and no real atom is connected to it
    const int64_t dummy = nnodes_real;
    const double far = 2.0 * cutoff;
    Kokkos::parallel_for(
        "torch/kk:pad_edges",
        Kokkos::RangePolicy<DeviceType, Kokkos::IndexType<int64_t>>(nedges_real, nedges_model),
        KOKKOS_LAMBDA(int64_t e) {
          vec(e, 0) = far;
          vec(e, 1) = 0.0;
          vec(e, 2) = 0.0;
          index(e) = dummy;
          index(second + e) = dummy;
        });
  }
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
    capacity_changes += 1.0;
  }
  if (vflag_atom && (int) k_vatom.extent(0) < maxvatom) {
    memoryKK->destroy_kokkos(k_vatom, vatom);
    memoryKK->create_kokkos(k_vatom, vatom, maxvatom, "pair:vatom");
    capacity_changes += 1.0;
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
  x = atomKK->k_x.template view<DeviceType>();
  f = atomKK->k_f.template view<DeviceType>();
  type = atomKK->k_type.template view<DeviceType>();

  build_graph_device();
  if (log_ghosts) log_ghost_counts(static_cast<double>(nnodes_real));

  MLTorch::GraphInput in;
  in.n_nodes = nnodes_model;
  in.n_local = atom->nlocal;
  in.n_edges = nedges_model;
  in.edge_vectors = d_edge_vec.data();
  in.edge_index = d_edge_index.data();
  in.species = d_species.data();
  in.on_model_device = !std::is_same<typename DeviceType::memory_space, Kokkos::HostSpace>::value;
  // LibTorch reads the buffers on its own stream: the kernels that fill them
  // must be finished, whatever streams the two libraries use. evaluate_into
  // returns after the model's work on the device is complete.
  typename DeviceType::execution_space().fence("torch/kk: graph ready for LibTorch");
  in.halo = halo_exchanger();
  halo_device_rows = in.on_model_device;
  double energy = 0.0;
  ++ncompute;
  const double t_model = platform::walltime();
  try {
    energy = model_->evaluate_into(in, d_edge_grad.data(), eflag_atom ? d_node_energy.data() : nullptr);
    if (committee_mean && members.size() > 1) energy = add_members_device(in, energy);
  } catch (std::exception &e) {
    model_error(e);
  }
  halo_device_rows = false;
  time_model += platform::walltime() - t_model;

  double vsum[6] = {0, 0, 0, 0, 0, 0};
  const int64_t nonfinite = accumulate_device(vflag_global, vsum);
  if (nonfinite > 0 || !std::isfinite(energy))
    nonfinite_error(fmt::format(" ({} non-finite edge gradient component(s) on rank {})",
                                nonfinite, comm->me));
  if (eflag_global) eng_vdwl += energy;
  if (vflag_global)
    for (int k = 0; k < 6; ++k) virial[k] += vsum[k];

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
  if (d_edge_grad_m.extent(0) != d_edge_grad.extent(0))
    d_edge_grad_m = Kokkos::View<double *[3], Kokkos::LayoutRight, DeviceType>(
        "torch/kk:edge_grad_m", d_edge_grad.extent(0));
  if (d_node_energy_m.extent(0) != d_node_energy.extent(0))
    d_node_energy_m = Kokkos::View<double *, DeviceType>("torch/kk:node_energy_m",
                                                         d_node_energy.extent(0));
  auto grad = d_edge_grad, grad_m = d_edge_grad_m;
  auto ne = d_node_energy, ne_m = d_node_energy_m;
  const bool atoms = eflag_atom;
  const int nm = static_cast<int>(members.size());
  for (int m = 1; m < nm; ++m) {
    energy += members[m]->evaluate_into(in, grad_m.data(), atoms ? ne_m.data() : nullptr);
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
   F_i += g_ij, F_j -= g_ij; W = -sum r_ij (x) g_ij (per atom half/half);
   per-atom energies of the local nodes
------------------------------------------------------------------------- */

template <class DeviceType>
int64_t PairTorchKokkos<DeviceType>::accumulate_device(bool want_virial, double *vsum)
{
  auto lf = f;
  auto vec = d_edge_vec;
  auto grad = d_edge_grad;
  auto index = d_edge_index;
  const int64_t second = nedges_model;
  const bool per_atom_virial = vflag_atom;
  auto vatom_d = d_vatom;
  auto atom_of = d_atom_of;
  // forces, and the per-atom virial when asked; counts non-finite gradients
  // (a model far outside its training data), checked every step as on the CPU
  using acc_t = typename std::remove_reference<decltype(lf(0, 0))>::type;
  int64_t nonfinite = 0;
  Kokkos::parallel_reduce(
      "torch/kk:forces", Kokkos::RangePolicy<DeviceType, Kokkos::IndexType<int64_t>>(0, nedges_real),
      KOKKOS_LAMBDA(int64_t e, int64_t &bad) {
        const int i = atom_of(index(e)), j = atom_of(index(second + e));
        for (int k = 0; k < 3; ++k) {
          // g - g is 0 for finite g, NaN for NaN or +-inf (Kokkos 3.4 has no
          // Kokkos::isfinite; LAMMPS builds without -ffast-math)
          if (!(grad(e, k) - grad(e, k) == 0.0)) ++bad;
          Kokkos::atomic_add(&lf(i, k), static_cast<acc_t>(grad(e, k)));
          Kokkos::atomic_add(&lf(j, k), static_cast<acc_t>(-grad(e, k)));
        }
        if (per_atom_virial) {
          const double v[6] = {-vec(e, 0) * grad(e, 0), -vec(e, 1) * grad(e, 1),
                               -vec(e, 2) * grad(e, 2), -vec(e, 0) * grad(e, 1),
                               -vec(e, 0) * grad(e, 2), -vec(e, 1) * grad(e, 2)};
          for (int k = 0; k < 6; ++k) {
            Kokkos::atomic_add(&vatom_d(i, k), static_cast<acc_t>(0.5 * v[k]));
            Kokkos::atomic_add(&vatom_d(j, k), static_cast<acc_t>(0.5 * v[k]));
          }
        }
      },
      nonfinite);
  if (want_virial) {
    EV_FLOAT ev;
    Kokkos::parallel_reduce(
        "torch/kk:virial", Kokkos::RangePolicy<DeviceType, Kokkos::IndexType<int64_t>>(0, nedges_real),
        KOKKOS_LAMBDA(int64_t e, EV_FLOAT &acc) {
          acc.v[0] -= vec(e, 0) * grad(e, 0);
          acc.v[1] -= vec(e, 1) * grad(e, 1);
          acc.v[2] -= vec(e, 2) * grad(e, 2);
          acc.v[3] -= vec(e, 0) * grad(e, 1);
          acc.v[4] -= vec(e, 0) * grad(e, 2);
          acc.v[5] -= vec(e, 1) * grad(e, 2);
        },
        ev);
    for (int k = 0; k < 6; ++k) vsum[k] = ev.v[k];
  }
  if (eflag_atom) {
    auto eatom_d = d_eatom;
    auto ne = d_node_energy;
    Kokkos::parallel_for(
        "torch/kk:eatom", Kokkos::RangePolicy<DeviceType>(0, atom->nlocal),
        KOKKOS_LAMBDA(int i) { eatom_d(i) += ne(i); });
  }
  return nonfinite;
}

/* ----------------------------------------------------------------------
   for fix torch/finetune: the real (unpadded) graph of the current step in
   the base class's host buffers
------------------------------------------------------------------------- */

template <class DeviceType> void PairTorchKokkos<DeviceType>::training_graph(MLTorch::GraphInput &in)
{
  atomKK->sync(execution_space, X_MASK | TYPE_MASK);
  x = atomKK->k_x.template view<DeviceType>();
  type = atomKK->k_type.template view<DeviceType>();
  build_graph_device();
  auto h_vec = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), d_edge_vec);
  auto h_index = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), d_edge_index);
  auto h_species = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), d_species);
  auto h_atom_of = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), d_atom_of);
  const int64_t second = nedges_model;
  edge_vec.resize(3 * nedges_real);
  edge_index.resize(nedges_real);
  edge_nbr.resize(nedges_real);
  for (int64_t e = 0; e < nedges_real; ++e) {
    for (int k = 0; k < 3; ++k) edge_vec[3 * e + k] = h_vec(e, k);
    edge_index[e] = h_index(e);
    edge_nbr[e] = h_index(second + e);
  }
  edge_index.insert(edge_index.end(), edge_nbr.begin(), edge_nbr.end());
  node2atom.resize(nnodes_real);
  species.resize(nnodes_real);
  for (int64_t i = 0; i < nnodes_real; ++i) {
    node2atom[i] = h_atom_of(i);
    species[i] = h_species(i);
  }
  ncounted = atom->nlocal;
  graph_input(in);
}

/* ----------------------------------------------------------------------
   "capacity_changes": buffer allocations so far (0-dim double); the
   steady state of a run makes none
------------------------------------------------------------------------- */

template <class DeviceType> void *PairTorchKokkos<DeviceType>::extract(const char *name, int &dim)
{
  dim = 0;
  if (strcmp(name, "capacity_changes") == 0) return (void *) &capacity_changes;
  if (strcmp(name, "graph_size") == 0) {
    dim = 1;
    graph_size[0] = static_cast<double>(nnodes_real);
    graph_size[1] = static_cast<double>(nedges_real);
    return (void *) graph_size;
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
  double bytes = PairTorch::memory_usage();
  bytes += (double) node_capacity * (2 * sizeof(int64_t) + 2 * sizeof(int) + sizeof(double));
  bytes += (double) edge_capacity * (6 * sizeof(double) + 2 * sizeof(int64_t));
  return bytes;
}

namespace LAMMPS_NS {
template class PairTorchKokkos<LMPDeviceType>;
#ifdef LMP_KOKKOS_GPU
template class PairTorchKokkos<LMPHostType>;
#endif
}    // namespace LAMMPS_NS
