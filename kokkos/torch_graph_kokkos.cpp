/* ----------------------------------------------------------------------
   LAMMPS - Large-scale Atomic/Molecular Massively Parallel Simulator
   https://www.lammps.org/, Sandia National Laboratories
   LAMMPS development team: developers@lammps.org

   ML-TORCH package: TorchScript machine-learned potentials.
   Distributed under the GNU General Public License, version 2.
------------------------------------------------------------------------- */

/* ----------------------------------------------------------------------
   the graph of pair_style torch/kk on KOKKOS data: built on the style's
   execution space from the Kokkos full neighbor list (count, scan, fill
   with the cutoff filter), handed to LibTorch without a copy (from_blob
   on the same memory), edge gradients scattered into forces and virials
   on the device, the per-layer halo exchange on device rows
------------------------------------------------------------------------- */

#include "torch_graph_kokkos.h"

#include "atom_kokkos.h"
#include "atom_masks.h"
#include "comm.h"
#include "error.h"
#include "pair.h"
#include "neigh_list_kokkos.h"
#include "update.h"

#include "mltorch/contract.h"

#include <algorithm>
#include <type_traits>

using namespace LAMMPS_NS;

template <class DeviceType>
TorchGraphKokkos<DeviceType>::TorchGraphKokkos(LAMMPS *lmp, Pair *pair, CommRows &comm_rows) :
    TorchGraph(lmp, pair, comm_rows)
{
}

/* ----------------------------------------------------------------------
   buffers: grow to 1.5x when too small, never shrink; with fixed pads a
   configuration that does not fit is an error, not a reallocation
------------------------------------------------------------------------- */

template <class DeviceType>
void TorchGraphKokkos<DeviceType>::ensure_capacity(int64_t nodes, int64_t edges)
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
// models; the rule of TorchGraph::ghost_reach, evaluated in the kernels)
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

template <class DeviceType> void TorchGraphKokkos<DeviceType>::build_device(NeighList *list)
{
  // positions and types on this execution space (the caller synced them)
  x = atomKK->k_x.template view<DeviceType>();
  type = atomKK->k_type.template view<DeviceType>();
  auto *k_list = static_cast<NeighListKokkos<DeviceType> *>(list);
  auto d_ilist = k_list->d_ilist;
  auto d_numneigh = k_list->d_numneigh;
  auto d_neighbors = k_list->d_neighbors;
  const int inum = list->inum;
  ncentres = inum + (shape.ghost_lists ? list->gnum : 0);
  nnodes_real = atom->nlocal + atom->nghost;

  ensure_capacity(nnodes_real, 0);
  auto lx = x;
  auto count = d_count;
  const double rcsq = shape.cutoff * shape.cutoff;
  // ghost centres that cannot reach a local energy build no edges (see
  // TorchGraph::ghost_reach; the same rule as the CPU style)
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
    const double far = 2.0 * shape.cutoff;
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
  size[0] = static_cast<double>(nnodes_real);
  size[1] = static_cast<double>(nedges_real);
  ncounted = atom->nlocal;
}

/* ----------------------------------------------------------------------
   the model's input: the device buffers with the padded sizes. LibTorch
   reads them on its own stream: the kernels that filled them must be
   finished, whatever streams the two libraries use
------------------------------------------------------------------------- */

template <class DeviceType> void TorchGraphKokkos<DeviceType>::input(MLTorch::GraphInput &in) const
{
  in.n_nodes = nnodes_model;
  in.n_local = atom->nlocal;
  in.n_edges = nedges_model;
  in.edge_vectors = d_edge_vec.data();
  in.edge_index = d_edge_index.data();
  in.species = d_species.data();
  in.on_model_device = !std::is_same<typename DeviceType::memory_space, Kokkos::HostSpace>::value;
  in.halo = exchanger();
  typename DeviceType::execution_space().fence("torch/kk: graph ready for LibTorch");
}

/* ----------------------------------------------------------------------
   the force scatter of the device graph, written once for this back end:
   F_i += g_ij, F_j -= g_ij; W = -sum r_ij (x) g_ij (per atom half/half)
------------------------------------------------------------------------- */

template <class DeviceType>
int64_t TorchGraphKokkos<DeviceType>::scatter_device(typename KK::t_f f, typename KK::t_vatom vatom,
                                                     bool per_atom_virial, bool want_virial,
                                                     double *vsum)
{
  auto lf = f;
  auto vec = d_edge_vec;
  auto grad = d_edge_grad;
  auto index = d_edge_index;
  const int64_t second = nedges_model;
  auto vatom_d = vatom;
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
  return nonfinite;
}

/* ----------------------------------------------------------------------
   for fix torch/finetune and the committee deviation: the real (unpadded)
   graph of the current step in the base class's host buffers
------------------------------------------------------------------------- */

template <class DeviceType>
void TorchGraphKokkos<DeviceType>::host_graph(NeighList *list, MLTorch::GraphInput &in)
{
  atomKK->sync(ExecutionSpaceFromDevice<DeviceType>::space, X_MASK | TYPE_MASK);
  build_device(list);
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
  folded = false;
  TorchGraph::input(in);
}

/* ----------------------------------------------------------------------
   the per-layer halo exchange on KOKKOS data. Features live by atom in
   k_halo ([nall][width], grown 1.5x, never shrunk). In compute() the graph
   rows are device memory (zero-copy tensors); for fix torch/finetune and
   the committee deviation (training_graph) they are host memory. Local
   node n is atom n; other nodes map to atoms through d_atom_of.
------------------------------------------------------------------------- */

template <class DeviceType>
void TorchGraphKokkos<DeviceType>::halo_rows_in(const double *rows, int64_t nrows, int width,
                                               bool scatter)
{
  const int64_t nv = nrows * width;
  Kokkos::View<const double *, DeviceType, Kokkos::MemoryTraits<Kokkos::Unmanaged>> src;
  Kokkos::View<double *, DeviceType> copy;
  if (halo_device_rows || nv == 0) {
    src = decltype(src)(rows, nv);
  } else {
    copy = Kokkos::View<double *, DeviceType>("torch/kk:halo_rows", nv);
    Kokkos::deep_copy(copy, Kokkos::View<const double *, Kokkos::HostSpace,
                                         Kokkos::MemoryTraits<Kokkos::Unmanaged>>(rows, nv));
    src = copy;
  }
  auto d = k_halo.template view<DeviceType>();
  auto atom_of = d_atom_of;
  const int64_t w = width;
  const int64_t nreal = scatter ? std::min<int64_t>(nrows, nnodes_real) : nrows;
  Kokkos::parallel_for(
      "torch/kk:halo_rows_in", Kokkos::RangePolicy<DeviceType, Kokkos::IndexType<int64_t>>(0, nreal * w),
      KOKKOS_LAMBDA(int64_t v) {
        const int64_t n = v / w, k = v % w;
        const int64_t a = scatter ? atom_of(n) : n;
        d(a * w + k) = src(v);
      });
  k_halo.template modify<DeviceType>();
}

template <class DeviceType>
void TorchGraphKokkos<DeviceType>::halo_rows_out(double *rows, int64_t nrows, int width, bool gather)
{
  const int64_t nv = nrows * width;
  if (nv == 0) return;
  k_halo.template sync<DeviceType>();
  Kokkos::View<double *, DeviceType, Kokkos::MemoryTraits<Kokkos::Unmanaged>> dst;
  Kokkos::View<double *, DeviceType> copy;
  if (halo_device_rows) {
    dst = decltype(dst)(rows, nv);
  } else {
    copy = Kokkos::View<double *, DeviceType>("torch/kk:halo_rows", nv);
    dst = copy;
  }
  auto d = k_halo.template view<DeviceType>();
  auto atom_of = d_atom_of;
  const int64_t w = width;
  const int64_t nreal = gather ? nnodes_real : nrows;
  Kokkos::parallel_for(
      "torch/kk:halo_rows_out", Kokkos::RangePolicy<DeviceType, Kokkos::IndexType<int64_t>>(0, nv),
      KOKKOS_LAMBDA(int64_t v) {
        const int64_t n = v / w, k = v % w;
        // padding rows (the dummy atom) get zeros
        dst(v) = (n < nreal) ? d((gather ? atom_of(n) : n) * w + k) : 0.0;
      });
  if (!halo_device_rows)
    Kokkos::deep_copy(Kokkos::View<double *, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(rows, nv),
                      copy);
  typename DeviceType::execution_space().fence("torch/kk: halo rows ready for LibTorch");
}

// k_halo holds [nall][width]: grown with 50% headroom, never shrunk
template <class DeviceType> void TorchGraphKokkos<DeviceType>::ensure_halo_capacity(int width)
{
  const int64_t need = static_cast<int64_t>(atom->nlocal + atom->nghost) * width;
  if (static_cast<int64_t>(k_halo.extent(0)) < need || k_halo.extent(0) == 0) {
    k_halo = Kokkos::DualView<double *, DeviceType>(
        "torch/kk:halo", std::max<int64_t>({need + need / 2, MIN_CAPACITY}));
    capacity_changes += 1.0;
  }
}

template <class DeviceType>
void TorchGraphKokkos<DeviceType>::halo_forward(const double *owned, double *all, int width)
{
  ensure_halo_capacity(width);
  halo_rows_in(owned, atom->nlocal, width, false);
  communicate(nullptr, width, false, true);
  halo_rows_out(all, halo_device_rows ? nnodes_model : nnodes_real, width, true);
}

template <class DeviceType>
void TorchGraphKokkos<DeviceType>::halo_reverse(const double *all, double *owned, int width)
{
  ensure_halo_capacity(width);
  k_halo.template sync<DeviceType>();
  Kokkos::deep_copy(k_halo.template view<DeviceType>(), 0.0);
  halo_rows_in(all, halo_device_rows ? nnodes_model : nnodes_real, width, true);
  // device packing for this reverse communication only: the committee's
  // member forces travel through the host buffers
  owner->reverse_comm_device = 1;
  communicate(nullptr, width, true, true);
  owner->reverse_comm_device = 0;
  halo_rows_out(owned, atom->nlocal, width, false);
}

template <class DeviceType> double TorchGraphKokkos<DeviceType>::memory_usage() const
{
  double bytes = TorchGraph::memory_usage();
  bytes += (double) node_capacity * (2 * sizeof(int64_t) + 2 * sizeof(int) + sizeof(double));
  bytes += (double) edge_capacity * (6 * sizeof(double) + 2 * sizeof(int64_t));
  bytes += (double) k_halo.extent(0) * sizeof(double);
  return bytes;
}

namespace LAMMPS_NS {
template class TorchGraphKokkos<LMPDeviceType>;
#ifdef LMP_KOKKOS_GPU
template class TorchGraphKokkos<LMPHostType>;
#endif
}    // namespace LAMMPS_NS
