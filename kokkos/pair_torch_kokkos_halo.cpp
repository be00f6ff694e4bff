/* ----------------------------------------------------------------------
   LAMMPS - Large-scale Atomic/Molecular Massively Parallel Simulator
   https://www.lammps.org/, Sandia National Laboratories
   LAMMPS development team: developers@lammps.org

   ML-TORCH package: TorchScript machine-learned potentials.
   Distributed under the GNU General Public License, version 2.
------------------------------------------------------------------------- */

/* ----------------------------------------------------------------------
   pair_style torch/kk: the per-layer halo exchange of a layered model on
   KOKKOS data, through this style's (device) forward and reverse
   communication
------------------------------------------------------------------------- */

#include "pair_torch_kokkos.h"

#include "atom_kokkos.h"
#include "atom_masks.h"
#include "comm.h"
#include "error.h"
#include "kokkos.h"
#include "memory_kokkos.h"
#include "platform.h"

#include <algorithm>
#include <cstring>

using namespace LAMMPS_NS;

/* ----------------------------------------------------------------------
   the per-layer halo exchange on KOKKOS data. Features live by atom in
   k_halo ([nall][width], grown 1.5x, never shrunk). In compute() the graph
   rows are device memory (zero-copy tensors); for fix torch/finetune and
   the committee deviation (training_graph) they are host memory. Local
   node n is atom n; other nodes map to atoms through d_atom_of.
------------------------------------------------------------------------- */

template <class DeviceType>
void PairTorchKokkos<DeviceType>::halo_rows_in(const double *rows, int64_t nrows, int width,
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
void PairTorchKokkos<DeviceType>::halo_rows_out(double *rows, int64_t nrows, int width, bool gather)
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
template <class DeviceType> void PairTorchKokkos<DeviceType>::ensure_halo_capacity(int width)
{
  const int64_t need = static_cast<int64_t>(atom->nlocal + atom->nghost) * width;
  if (static_cast<int64_t>(k_halo.extent(0)) < need || k_halo.extent(0) == 0) {
    k_halo = Kokkos::DualView<double *, DeviceType>(
        "torch/kk:halo", std::max<int64_t>({need + need / 2, MIN_CAPACITY}));
    capacity_changes += 1.0;
  }
}

template <class DeviceType>
void PairTorchKokkos<DeviceType>::halo_forward(const double *owned, double *all, int width)
{
  ensure_halo_capacity(width);
  halo_rows_in(owned, atom->nlocal, width, false);
  commflag = COMM_FEATURES;
  comm_width = width;
  MLTorchLmp::forward_comm(comm, static_cast<Pair *>(this), width);
  commflag = COMM_MEMBER_FORCES;
  halo_rows_out(all, halo_device_rows ? nnodes_model : nnodes_real, width, true);
}

template <class DeviceType>
void PairTorchKokkos<DeviceType>::halo_reverse(const double *all, double *owned, int width)
{
  ensure_halo_capacity(width);
  k_halo.template sync<DeviceType>();
  Kokkos::deep_copy(k_halo.template view<DeviceType>(), 0.0);
  halo_rows_in(all, halo_device_rows ? nnodes_model : nnodes_real, width, true);
  commflag = COMM_FEATURES;
  comm_width = width;
  // device packing for this reverse communication only: the committee's
  // member forces travel through the host buffers
  reverse_comm_device = 1;
  MLTorchLmp::reverse_comm(comm, static_cast<Pair *>(this), width);
  reverse_comm_device = 0;
  commflag = COMM_MEMBER_FORCES;
  halo_rows_out(owned, atom->nlocal, width, false);
}

template <class DeviceType>
int PairTorchKokkos<DeviceType>::pack_forward_comm_kokkos(int n, DAT::tdual_int_1d k_sendlist,
                                                          DAT::tdual_double_1d &buf, int, int *)
{
  k_halo.template sync<DeviceType>();
  auto list = k_sendlist.template view<DeviceType>();
  auto b = buf.template view<DeviceType>();
  auto d = k_halo.template view<DeviceType>();
  const int w = comm_width;
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
  auto d = k_halo.template view<DeviceType>();
  const int w = comm_width;
  Kokkos::parallel_for(
      "torch/kk:halo_unpack_forward", Kokkos::RangePolicy<DeviceType>(0, n * w),
      KOKKOS_LAMBDA(int v) { d(static_cast<int64_t>(first) * w + v) = b(v); });
  k_halo.template modify<DeviceType>();
}

template <class DeviceType>
int PairTorchKokkos<DeviceType>::pack_reverse_comm_kokkos(int n, int first, DAT::tdual_double_1d &buf)
{
  k_halo.template sync<DeviceType>();
  auto b = buf.template view<DeviceType>();
  auto d = k_halo.template view<DeviceType>();
  const int w = comm_width;
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
  auto d = k_halo.template view<DeviceType>();
  const int w = comm_width;
  // the atoms of one swap are distinct: no two threads add to one value
  Kokkos::parallel_for(
      "torch/kk:halo_unpack_reverse", Kokkos::RangePolicy<DeviceType>(0, n * w),
      KOKKOS_LAMBDA(int v) { d(static_cast<int64_t>(list(v / w)) * w + v % w) += b(v); });
  k_halo.template modify<DeviceType>();
}

// host packing (the package option 'comm host', torch/kk/host): the host copy of k_halo
template <class DeviceType>
int PairTorchKokkos<DeviceType>::pack_forward_comm(int n, int *list, double *buf, int, int *)
{
  k_halo.sync_host();
  const std::size_t w = comm_width;
  for (int i = 0; i < n; ++i)
    for (std::size_t k = 0; k < w; ++k) buf[i * w + k] = k_halo.view_host()(list[i] * w + k);
  return n * comm_width;
}

template <class DeviceType>
void PairTorchKokkos<DeviceType>::unpack_forward_comm(int n, int first, double *buf)
{
  k_halo.sync_host();
  const std::size_t w = comm_width;
  for (std::size_t v = 0; v < n * w; ++v) k_halo.view_host()(first * w + v) = buf[v];
  k_halo.modify_host();
}

template <class DeviceType> int PairTorchKokkos<DeviceType>::pack_reverse_comm(int n, int first, double *buf)
{
  if (commflag != COMM_FEATURES) return PairTorch::pack_reverse_comm(n, first, buf);
  k_halo.sync_host();
  const std::size_t w = comm_width;
  for (std::size_t v = 0; v < n * w; ++v) buf[v] = k_halo.view_host()(first * w + v);
  return n * comm_width;
}

template <class DeviceType>
void PairTorchKokkos<DeviceType>::unpack_reverse_comm(int n, int *list, double *buf)
{
  if (commflag != COMM_FEATURES) {
    PairTorch::unpack_reverse_comm(n, list, buf);
    return;
  }
  k_halo.sync_host();
  const std::size_t w = comm_width;
  for (int i = 0; i < n; ++i)
    for (std::size_t k = 0; k < w; ++k) k_halo.view_host()(list[i] * w + k) += buf[i * w + k];
  k_halo.modify_host();
}

/* ----------------------------------------------------------------------
   the members defined here, for the device types pair_torch_kokkos.cpp
   instantiates the class with
------------------------------------------------------------------------- */

#define ML_TORCH_KOKKOS_HALO_MEMBERS(D)                                                              \
  template void PairTorchKokkos<D>::halo_rows_in(const double *, int64_t, int, bool);               \
  template void PairTorchKokkos<D>::halo_rows_out(double *, int64_t, int, bool);                    \
  template void PairTorchKokkos<D>::ensure_halo_capacity(int);                                      \
  template void PairTorchKokkos<D>::halo_forward(const double *, double *, int);                    \
  template void PairTorchKokkos<D>::halo_reverse(const double *, double *, int);                    \
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
