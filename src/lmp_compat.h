/* -*- c++ -*- ----------------------------------------------------------
   ML-TORCH package: the one place where LAMMPS version differences live.
   Code is written for the current LAMMPS API (>= 22 Jul 2025); the
   branches below adapt older trees (29 Sep 2021, used for the KOKKOS
   build with Debian's Kokkos 3.4) to it.  The build defines
   ML_TORCH_LAMMPS_LEGACY when LAMMPS's neighbor.h lacks add_request().
------------------------------------------------------------------------- */

#ifndef LMP_ML_TORCH_COMPAT_H
#define LMP_ML_TORCH_COMPAT_H

#include "neighbor.h"
#include "pair.h"

#ifdef ML_TORCH_LAMMPS_LEGACY
#include "neigh_request.h"
#endif

namespace LAMMPS_NS {
namespace MLTorchCompat {

  // request a full neighbor list, with neighbors of ghost atoms if asked
  inline void request_full_list(Neighbor *neighbor, Pair *pair, bool ghost)
  {
#ifdef ML_TORCH_LAMMPS_LEGACY
    const int irequest = neighbor->request(pair, pair->instance_me);
    neighbor->requests[irequest]->half = 0;
    neighbor->requests[irequest]->full = 1;
    if (ghost) neighbor->requests[irequest]->ghost = 1;
#else
    neighbor->add_request(pair, NeighConst::REQ_FULL | (ghost ? NeighConst::REQ_GHOST : 0));
#endif
  }

}    // namespace MLTorchCompat
}    // namespace LAMMPS_NS

#endif
