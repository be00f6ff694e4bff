/* -*- c++ -*- ----------------------------------------------------------
   ML-TORCH package: the one place where LAMMPS version differences live.
   Code is written for the current LAMMPS API (>= 22 Jul 2025); the
   branches below adapt older trees (29 Sep 2021, used for the KOKKOS
   build with Debian's Kokkos 3.4) to it.  The build defines
   ML_TORCH_LAMMPS_LEGACY when LAMMPS's neighbor.h lacks add_request().
------------------------------------------------------------------------- */

#ifndef LMP_ML_TORCH_COMPAT_H
#define LMP_ML_TORCH_COMPAT_H

#include "comm.h"
#include "error.h"
#include "neigh_request.h"
#include "neighbor.h"
#include "pair.h"
#include "utils.h"

#include <string>

namespace LAMMPS_NS {
namespace MLTorchLmp {

  // "missing argument(s)" ERROR of a command
  inline void missing_args(const std::string &file, int line, const std::string &cmd,
                           Error *error)
  {
#ifdef ML_TORCH_LAMMPS_LEGACY
    error->all(file, line, "Illegal " + cmd + " command: missing argument(s)");
#else
    utils::missing_cmd_args(file, line, cmd, error);
#endif
  }

  // forward / reverse communication of a fix's per-atom data
  template <class F> inline void forward_comm(Comm *comm, F *fix)
  {
#ifdef ML_TORCH_LAMMPS_LEGACY
    comm->forward_comm_fix(fix);
#else
    comm->forward_comm(fix);
#endif
  }
  template <class F> inline void reverse_comm(Comm *comm, F *fix)
  {
#ifdef ML_TORCH_LAMMPS_LEGACY
    comm->reverse_comm_fix(fix);
#else
    comm->reverse_comm(fix);
#endif
  }

  // the same for a pair style's data of `size` values per atom (at most its
  // comm_forward / comm_reverse); LAMMPS 2021 takes the pair's own sizes
  template <class P> inline void forward_comm(Comm *comm, P *pair, int size)
  {
#ifdef ML_TORCH_LAMMPS_LEGACY
    (void) size;
    comm->forward_comm_pair(pair);
#else
    comm->forward_comm(pair, size);
#endif
  }
  template <class P> inline void reverse_comm(Comm *comm, P *pair, int size)
  {
#ifdef ML_TORCH_LAMMPS_LEGACY
    (void) size;
    comm->reverse_comm_pair(pair);
#else
    comm->reverse_comm(pair, size);
#endif
  }

  // give the neighbor request of `requestor` (made in its init_style) a cutoff
  // of its own; returns false when it has no request
  inline bool set_request_cutoff(Neighbor *neighbor, void *requestor, double cutoff)
  {
#ifdef ML_TORCH_LAMMPS_LEGACY
    for (int i = 0; i < neighbor->nrequest; i++)
      if (neighbor->requests[i]->requestor == requestor) {
        neighbor->requests[i]->cut = 1;
        neighbor->requests[i]->cutoff = cutoff;
        return true;
      }
    return false;
#else
    auto *req = neighbor->find_request(requestor);
    if (!req) return false;
    req->set_cutoff(cutoff);
    return true;
#endif
  }

  // request a full neighbor list, with neighbors of ghost atoms if asked
  inline void request_full_list(Neighbor *neighbor, Pair *pair, bool ghost, int instance)
  {
#ifdef ML_TORCH_LAMMPS_LEGACY
    const int irequest = neighbor->request(pair, instance);
    neighbor->requests[irequest]->half = 0;
    neighbor->requests[irequest]->full = 1;
    if (ghost) neighbor->requests[irequest]->ghost = 1;
#else
    neighbor->add_request(pair, NeighConst::REQ_FULL | (ghost ? NeighConst::REQ_GHOST : 0));
    (void) instance;
#endif
  }

}    // namespace MLTorchLmp
}    // namespace LAMMPS_NS

#endif

/* ----------------------------------------------------------------------
   KOKKOS differences, compiled where kokkos_type.h was included first
------------------------------------------------------------------------- */

#if defined(LMP_LMPTYPE_KOKKOS_H) && !defined(LMP_ML_TORCH_COMPAT_KOKKOS_H)
#define LMP_ML_TORCH_COMPAT_KOKKOS_H

#include "kokkos.h"

#include <string>
#include <type_traits>

// the build reads the KOKKOS API from the LAMMPS tree (CMakeLists.txt): the
// precision layer goes with the current neighbor API, the 2021 views with
// the 2021 one; any other pairing is a tree this code was not written for
#if defined(ML_TORCH_KOKKOS_PRECISION_LAYER) && defined(ML_TORCH_LAMMPS_LEGACY)
#error "ML-TORCH: a LAMMPS tree with the KOKKOS precision layer but without neighbor->add_request()"
#endif
#if !defined(ML_TORCH_KOKKOS_PRECISION_LAYER) && !defined(ML_TORCH_LAMMPS_LEGACY)
#error "ML-TORCH: torch/kk supports LAMMPS >= 22 Jul 2025 (KK_FLOAT) and 29 Sep 2021; this tree is neither"
#endif

namespace LAMMPS_NS {
namespace MLTorchLmp {

  // view types of positions, forces and per-atom energy/virial
  template <class DeviceType> struct KokkosTypes {
    using AT = ArrayTypes<DeviceType>;
#ifndef ML_TORCH_KOKKOS_PRECISION_LAYER
    // LAMMPS 29 Sep 2021: F_FLOAT/E_FLOAT views
    using t_x = typename AT::t_x_array_randomread;
    using t_f = typename AT::t_f_array;
    using k_eatom_t = DAT::tdual_efloat_1d;
    using k_vatom_t = DAT::tdual_virial_array;
    using t_eatom = typename AT::t_efloat_1d;
    using t_vatom = typename AT::t_virial_array;
#else
    // precision layer (KK_FLOAT positions, KK_ACC_FLOAT accumulators)
    using t_x = typename AT::t_kkfloat_1d_3_lr_randomread;
    using t_f = typename AT::t_kkacc_1d_3;
    using k_eatom_t = DAT::ttransform_kkacc_1d;
    using k_vatom_t = DAT::ttransform_kkacc_1d_6;
    using t_eatom = typename AT::t_kkacc_1d;
    using t_vatom = typename AT::t_kkacc_1d_6;
#endif
  };

  // the pair's full neighbor list request, made in PairTorch::init_style,
  // becomes a Kokkos list on the style's memory space
  template <class DeviceType> inline void kokkos_request(Neighbor *neighbor, Pair *pair)
  {
    const bool host =
        std::is_same<DeviceType, LMPHostType>::value && !std::is_same<DeviceType, LMPDeviceType>::value;
    const bool device = std::is_same<DeviceType, LMPDeviceType>::value;
#ifdef ML_TORCH_LAMMPS_LEGACY
    auto *req = neighbor->requests[neighbor->nrequest - 1];
    req->kokkos_host = host;
    req->kokkos_device = device;
#else
    auto *req = neighbor->find_request(pair);
    req->set_kokkos_host(host);
    req->set_kokkos_device(device);
#endif
    (void) pair;
  }

  // the LibTorch device of the memory a Kokkos device type works in: the GPU
  // Kokkos selected for this rank (-k on g N maps node-local ranks to GPUs)
  template <class DeviceType> inline std::string kokkos_torch_device()
  {
#if defined(KOKKOS_ENABLE_CUDA) && defined(ML_TORCH_KOKKOS_PRECISION_LAYER)
    if (std::is_same<typename DeviceType::execution_space, Kokkos::Cuda>::value)
      return "cuda:" + std::to_string(Kokkos::device_id());
#endif
    return std::is_same<typename DeviceType::memory_space, Kokkos::HostSpace>::value ? "cpu"
                                                                                     : "cuda";
  }

  // per-atom DualView: device side modified, make the host side current
  template <class DeviceType, class DualView> inline void modified_sync_host(DualView &k)
  {
    k.template modify<DeviceType>();
#ifdef ML_TORCH_LAMMPS_LEGACY
    k.template sync<LMPHostType>();
#else
    k.sync_host();
#endif
  }

}    // namespace MLTorchLmp
}    // namespace LAMMPS_NS

#endif
