/* -*- c++ -*- ----------------------------------------------------------
   LAMMPS - Large-scale Atomic/Molecular Massively Parallel Simulator
   https://www.lammps.org/, Sandia National Laboratories
   LAMMPS development team: developers@lammps.org

   ML-TORCH package: TorchScript machine-learned potentials.
   Distributed under the GNU General Public License, version 2.
------------------------------------------------------------------------- */

#ifndef LMP_TORCH_GRAPH_KOKKOS_H
#define LMP_TORCH_GRAPH_KOKKOS_H

#include "kokkos_type.h"
#include "lmp_compat.h"
#include "torch_graph.h"

namespace LAMMPS_NS {

// The graph of pair_style torch/kk: TorchGraph on KOKKOS data. It is built
// on the style's execution space from the Kokkos full neighbor list (count,
// scan, fill with the cutoff filter); its buffers go to LibTorch without a
// copy; the edge gradients are scattered into forces and virials on the
// device; the halo exchange moves device rows. Nodes are the local atoms
// (node i = atom i) followed by the ghost atoms that some edge touches.
// With 'pad' the buffers keep fixed shapes, padded with a dummy atom.
// Members are public: CUDA's extended lambdas need public enclosing methods.
template <class DeviceType> class TorchGraphKokkos : public TorchGraph {
 public:
  using KK = MLTorchLmp::KokkosTypes<DeviceType>;

  TorchGraphKokkos(class LAMMPS *lmp, class Pair *owner, CommRows &rows);

  // the device graph of the current step from the Kokkos neighbor list
  void build_device(class NeighList *list);
  // the model's input on the device graph (padded sizes)
  void input(MLTorch::GraphInput &in) const override;
  // the real (unpadded) graph of the current step in the host buffers
  void host_graph(class NeighList *list, MLTorch::GraphInput &in) override;
  // F_i += g_ij, F_j -= g_ij from the device edge gradients; the per-atom
  // virial into `vatom` when asked, the global one into vsum when asked;
  // returns the count of non-finite gradient components
  int64_t scatter_device(typename KK::t_f f, typename KK::t_vatom vatom, bool per_atom_virial,
                         bool want_virial, double *vsum);

  void halo_forward(const double *owned, double *all, int width) override;
  void halo_reverse(const double *all, double *owned, int width) override;
  void halo_rows_in(const double *rows, int64_t nrows, int width, bool scatter);
  void halo_rows_out(double *rows, int64_t nrows, int width, bool gather);
  void ensure_capacity(int64_t nodes, int64_t edges);
  void ensure_halo_capacity(int width);
  double memory_usage() const override;

  typename KK::t_x x;
  typename ArrayTypes<DeviceType>::t_int_1d type;
  Kokkos::View<int *, DeviceType> d_type2species;

  // graph buffers: capacities grow geometrically and never shrink within
  // a run; with 'pad' the capacities are fixed and the tensors keep their
  // shapes, padded with masked dummy entries
  Kokkos::View<double *[3], Kokkos::LayoutRight, DeviceType> d_edge_vec, d_edge_grad;
  Kokkos::View<int64_t *, DeviceType> d_edge_index, d_species;
  Kokkos::View<double *, DeviceType> d_node_energy;
  Kokkos::View<int64_t *, DeviceType> d_count, d_offset;
  Kokkos::View<int *, DeviceType> d_node_of, d_atom_of;    // atom <-> graph node
  Kokkos::DualView<double *, DeviceType> k_halo;    // [nall][width] features by atom
  bool halo_device_rows = false;    // the exchange's rows are device memory (compute())
  int64_t node_capacity = 0, edge_capacity = 0;
  int64_t pad_nodes = 0, pad_edges = 0;    // fixed capacities (0 = grow)
  double capacity_changes = 0.0;           // number of buffer (re)allocations
  int64_t nnodes_real = 0, nedges_real = 0, nnodes_model = 0, nedges_model = 0;
  int ncentres = 0;

  // smallest capacities: a rank without atoms still hands LibTorch real buffers
  static constexpr int64_t MIN_CAPACITY = 16;
};

}    // namespace LAMMPS_NS

#endif
