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
#include "torch_graph_kokkos.h"

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
  void *extract(const char *, int &) override;
  double memory_usage() override;
  void sync_host_for_fix() override;
  void host_forces_modified() override;
  // the MD output lives in the graph's device buffers, not in `output`
  const MLTorch::GraphOutput *md_output() const override { return nullptr; }

  // the communication of the graph's halo rows (the device features in
  // TorchGraphKokkos::k_halo, packed by CommKokkos on the device, or on the
  // host with the package option 'comm host') and of the committee's rows
  int pack_forward_comm_kokkos(int, DAT::tdual_int_1d, DAT::tdual_double_1d &, int, int *) override;
  void unpack_forward_comm_kokkos(int, int, DAT::tdual_double_1d &) override;
  int pack_reverse_comm_kokkos(int, int, DAT::tdual_double_1d &) override;
  void unpack_reverse_comm_kokkos(int, DAT::tdual_int_1d, DAT::tdual_double_1d &) override;
  int pack_forward_comm(int, int *, double *, int, int *) override;
  void unpack_forward_comm(int, int, double *) override;
  int pack_reverse_comm(int, int, double *) override;
  void unpack_reverse_comm(int, int *, double *) override;

  // public for CUDA extended lambdas
  double add_members_device(const MLTorch::GraphInput &in, double energy);

 protected:
  TorchGraphKokkos<DeviceType> *kgraph;    // the graph PairTorch owns
  typename KK::t_f f;
  typename KK::k_eatom_t k_eatom;
  typename KK::k_vatom_t k_vatom;
  typename KK::t_eatom d_eatom;
  typename KK::t_vatom d_vatom;
  // one more member's outputs (committee mean)
  Kokkos::View<double *[3], Kokkos::LayoutRight, DeviceType> d_edge_grad_m;
  Kokkos::View<double *, DeviceType> d_node_energy_m;
};

}    // namespace LAMMPS_NS

#endif
#endif
