/* -*- c++ -*- ----------------------------------------------------------
   LAMMPS - Large-scale Atomic/Molecular Massively Parallel Simulator
   https://www.lammps.org/, Sandia National Laboratories
   LAMMPS development team: developers@lammps.org

   ML-TORCH package: TorchScript machine-learned potentials.
   Distributed under the GNU General Public License, version 2.
------------------------------------------------------------------------- */

#ifdef PAIR_CLASS
// clang-format off
PairStyle(torch/kk,PairTorchKokkos<LMPDeviceType>);
PairStyle(torch/kk/device,PairTorchKokkos<LMPDeviceType>);
PairStyle(torch/kk/host,PairTorchKokkos<LMPHostType>);
// clang-format on
#else

#ifndef LMP_PAIR_TORCH_KOKKOS_H
#define LMP_PAIR_TORCH_KOKKOS_H

#include "kokkos_base.h"
#include "kokkos_type.h"
#include "lmp_compat.h"
#include "pair_torch.h"

namespace LAMMPS_NS {

template <class DeviceType> class PairTorchKokkos : public PairTorch, public KokkosBase {
 public:
  typedef DeviceType device_type;
  typedef ArrayTypes<DeviceType> AT;
  using KK = MLTorchLmp::KokkosTypes<DeviceType>;

  PairTorchKokkos(class LAMMPS *);
  ~PairTorchKokkos() override;

  void compute(int, int) override;
  // its force call always runs the model (fix torch/finetune then refreshes
  // the forces after an update instead)
  void defer_next_model_call() override {}
  void settings(int, char **) override;
  void init_style() override;
  void training_graph(MLTorch::GraphInput &in) override;
  void *extract(const char *, int &) override;
  double memory_usage() override;
  void sync_host_for_fix() override;
  void host_forces_modified() override;
  // the MD output lives in device buffers, not in the base class's output
  const MLTorch::GraphOutput *md_output() const override { return nullptr; }

  // the per-layer halo exchange on the device: features by atom in k_halo,
  // packed and unpacked by CommKokkos on the device (or on the host with
  // the package option 'comm host'), gathered from and into the graph's rows
  void halo_forward(const double *owned, double *all, int width) override;
  void halo_reverse(const double *all, double *owned, int width) override;
  int pack_forward_comm_kokkos(int, DAT::tdual_int_1d, DAT::tdual_double_1d &, int, int *) override;
  void unpack_forward_comm_kokkos(int, int, DAT::tdual_double_1d &) override;
  int pack_reverse_comm_kokkos(int, int, DAT::tdual_double_1d &) override;
  void unpack_reverse_comm_kokkos(int, DAT::tdual_int_1d, DAT::tdual_double_1d &) override;
  int pack_forward_comm(int, int *, double *, int, int *) override;
  void unpack_forward_comm(int, int, double *) override;
  int pack_reverse_comm(int, int, double *) override;
  void unpack_reverse_comm(int, int *, double *) override;

  // public for CUDA extended lambdas
  void build_graph_device();
  void halo_rows_in(const double *rows, int64_t nrows, int width, bool scatter);
  void halo_rows_out(double *rows, int64_t nrows, int width, bool gather);
  int64_t accumulate_device(bool want_virial, double *virial_sum);
  double add_members_device(const MLTorch::GraphInput &in, double energy);

 protected:
  typename KK::t_x x;
  typename KK::t_f f;
  typename AT::t_int_1d type;
  typename KK::k_eatom_t k_eatom;
  typename KK::k_vatom_t k_vatom;
  typename KK::t_eatom d_eatom;
  typename KK::t_vatom d_vatom;
  Kokkos::View<int *, DeviceType> d_type2species;

  // graph buffers: capacities grow geometrically and never shrink within
  // a run; with 'pad' the capacities are fixed and the tensors keep their
  // shapes, padded with masked dummy entries
  Kokkos::View<double *[3], Kokkos::LayoutRight, DeviceType> d_edge_vec, d_edge_grad;
  Kokkos::View<int64_t *, DeviceType> d_edge_index, d_species;
  Kokkos::View<double *, DeviceType> d_node_energy;
  // one more member's outputs (committee mean)
  Kokkos::View<double *[3], Kokkos::LayoutRight, DeviceType> d_edge_grad_m;
  Kokkos::View<double *, DeviceType> d_node_energy_m;
  Kokkos::View<int64_t *, DeviceType> d_count, d_offset;
  Kokkos::View<int *, DeviceType> d_node_of, d_atom_of;    // atom <-> graph node
  Kokkos::DualView<double *, DeviceType> k_halo;    // [nall][width] features by atom
  bool halo_device_rows = false;    // the exchange's rows are device memory (compute())
  int64_t node_capacity, edge_capacity;
  int64_t pad_nodes, pad_edges;    // fixed capacities (0 = grow)
  double capacity_changes;         // number of buffer (re)allocations, see extract()
  int64_t nnodes_real, nedges_real, nnodes_model, nedges_model;
  int ncentres;

  // smallest capacities: a rank without atoms still hands LibTorch real buffers
  static constexpr int64_t MIN_CAPACITY = 16;

  void ensure_capacity(int64_t nodes, int64_t edges);
  void ensure_halo_capacity(int width);
};

}    // namespace LAMMPS_NS

#endif
#endif
