/* ----------------------------------------------------------------------
   LAMMPS - Large-scale Atomic/Molecular Massively Parallel Simulator
   https://www.lammps.org/, Sandia National Laboratories
   LAMMPS development team: developers@lammps.org

   ML-TORCH package: TorchScript machine-learned potentials.
   Distributed under the GNU General Public License, version 2.
------------------------------------------------------------------------- */

/* ----------------------------------------------------------------------
   pair_style torch/kk: its forward and reverse communication, which moves
   the per-layer halo exchange of its graph (TorchGraphKokkos::halo_forward
   and halo_reverse) and the committee's member forces
------------------------------------------------------------------------- */

#include "pair_torch_kokkos.h"

#include <cstring>

using namespace LAMMPS_NS;

/* ----------------------------------------------------------------------
   the rows in flight (CommRows): the graph's device features (k_halo of
   TorchGraphKokkos, [nall][width]) by CommKokkos's device packing, or on
   the host with the package option 'comm host'; the committee's host rows
   by PairTorch's packing
------------------------------------------------------------------------- */

template <class DeviceType>
int PairTorchKokkos<DeviceType>::pack_forward_comm_kokkos(int n, DAT::tdual_int_1d k_sendlist,
                                                          DAT::tdual_double_1d &buf, int, int *)
{
  kgraph->k_halo.template sync<DeviceType>();
  auto list = k_sendlist.template view<DeviceType>();
  auto b = buf.template view<DeviceType>();
  auto d = kgraph->k_halo.template view<DeviceType>();
  const int w = comm_rows.width;
  Kokkos::parallel_for(
      "torch/kk:halo_pack_forward", Kokkos::RangePolicy<DeviceType>(0, n * w), KOKKOS_LAMBDA(int v) {
        b(v) = d(static_cast<int64_t>(list(v / w)) * w + v % w);
      });
  return n * w;
}

template <class DeviceType>
void PairTorchKokkos<DeviceType>::unpack_forward_comm_kokkos(int n, int first, DAT::tdual_double_1d &buf)
{
  auto b = buf.template view<DeviceType>();
  auto d = kgraph->k_halo.template view<DeviceType>();
  const int w = comm_rows.width;
  Kokkos::parallel_for(
      "torch/kk:halo_unpack_forward", Kokkos::RangePolicy<DeviceType>(0, n * w),
      KOKKOS_LAMBDA(int v) { d(static_cast<int64_t>(first) * w + v) = b(v); });
  kgraph->k_halo.template modify<DeviceType>();
}

template <class DeviceType>
int PairTorchKokkos<DeviceType>::pack_reverse_comm_kokkos(int n, int first, DAT::tdual_double_1d &buf)
{
  kgraph->k_halo.template sync<DeviceType>();
  auto b = buf.template view<DeviceType>();
  auto d = kgraph->k_halo.template view<DeviceType>();
  const int w = comm_rows.width;
  Kokkos::parallel_for(
      "torch/kk:halo_pack_reverse", Kokkos::RangePolicy<DeviceType>(0, n * w),
      KOKKOS_LAMBDA(int v) { b(v) = d(static_cast<int64_t>(first) * w + v); });
  return n * w;
}

template <class DeviceType>
void PairTorchKokkos<DeviceType>::unpack_reverse_comm_kokkos(int n, DAT::tdual_int_1d k_sendlist,
                                                             DAT::tdual_double_1d &buf)
{
  auto list = k_sendlist.template view<DeviceType>();
  auto b = buf.template view<DeviceType>();
  auto d = kgraph->k_halo.template view<DeviceType>();
  const int w = comm_rows.width;
  // the atoms of one swap are distinct: no two threads add to one value
  Kokkos::parallel_for(
      "torch/kk:halo_unpack_reverse", Kokkos::RangePolicy<DeviceType>(0, n * w),
      KOKKOS_LAMBDA(int v) { d(static_cast<int64_t>(list(v / w)) * w + v % w) += b(v); });
  kgraph->k_halo.template modify<DeviceType>();
}

// host packing (the package option 'comm host', torch/kk/host): the host
// copy of k_halo; the committee's rows as PairTorch packs them
template <class DeviceType>
int PairTorchKokkos<DeviceType>::pack_forward_comm(int n, int *list, double *buf, int pbc_flag, int *pbc)
{
  if (!comm_rows.device) return PairTorch::pack_forward_comm(n, list, buf, pbc_flag, pbc);
  auto &k_halo = kgraph->k_halo;
  k_halo.sync_host();
  const std::size_t w = comm_rows.width;
  for (int i = 0; i < n; ++i)
    for (std::size_t k = 0; k < w; ++k) buf[i * w + k] = k_halo.view_host()(list[i] * w + k);
  return n * comm_rows.width;
}

template <class DeviceType>
void PairTorchKokkos<DeviceType>::unpack_forward_comm(int n, int first, double *buf)
{
  if (!comm_rows.device) {
    PairTorch::unpack_forward_comm(n, first, buf);
    return;
  }
  auto &k_halo = kgraph->k_halo;
  k_halo.sync_host();
  const std::size_t w = comm_rows.width;
  for (std::size_t v = 0; v < n * w; ++v) k_halo.view_host()(first * w + v) = buf[v];
  k_halo.modify_host();
}

template <class DeviceType> int PairTorchKokkos<DeviceType>::pack_reverse_comm(int n, int first, double *buf)
{
  if (!comm_rows.device) return PairTorch::pack_reverse_comm(n, first, buf);
  auto &k_halo = kgraph->k_halo;
  k_halo.sync_host();
  const std::size_t w = comm_rows.width;
  for (std::size_t v = 0; v < n * w; ++v) buf[v] = k_halo.view_host()(first * w + v);
  return n * comm_rows.width;
}

template <class DeviceType>
void PairTorchKokkos<DeviceType>::unpack_reverse_comm(int n, int *list, double *buf)
{
  if (!comm_rows.device) {
    PairTorch::unpack_reverse_comm(n, list, buf);
    return;
  }
  auto &k_halo = kgraph->k_halo;
  k_halo.sync_host();
  const std::size_t w = comm_rows.width;
  for (int i = 0; i < n; ++i)
    for (std::size_t k = 0; k < w; ++k) k_halo.view_host()(list[i] * w + k) += buf[i * w + k];
  k_halo.modify_host();
}

/* ----------------------------------------------------------------------
   the members defined here, for the device types pair_torch_kokkos.cpp
   instantiates the class with
------------------------------------------------------------------------- */

#define ML_TORCH_KOKKOS_HALO_MEMBERS(D)                                                              \
  template int PairTorchKokkos<D>::pack_forward_comm_kokkos(int, DAT::tdual_int_1d,                 \
                                                            DAT::tdual_double_1d &, int, int *);    \
  template void PairTorchKokkos<D>::unpack_forward_comm_kokkos(int, int, DAT::tdual_double_1d &);   \
  template int PairTorchKokkos<D>::pack_reverse_comm_kokkos(int, int, DAT::tdual_double_1d &);      \
  template void PairTorchKokkos<D>::unpack_reverse_comm_kokkos(int, DAT::tdual_int_1d,              \
                                                               DAT::tdual_double_1d &);             \
  template int PairTorchKokkos<D>::pack_forward_comm(int, int *, double *, int, int *);             \
  template void PairTorchKokkos<D>::unpack_forward_comm(int, int, double *);                        \
  template int PairTorchKokkos<D>::pack_reverse_comm(int, int, double *);                           \
  template void PairTorchKokkos<D>::unpack_reverse_comm(int, int *, double *);

namespace LAMMPS_NS {
ML_TORCH_KOKKOS_HALO_MEMBERS(LMPDeviceType)
#ifdef LMP_KOKKOS_GPU
ML_TORCH_KOKKOS_HALO_MEMBERS(LMPHostType)
#endif
}    // namespace LAMMPS_NS
