/* -*- c++ -*- ----------------------------------------------------------
   ML-TORCH: TorchScript machine-learned potentials for LAMMPS.
   This file is part of the LAMMPS-independent core: it knows nothing of
   LAMMPS and exposes no LibTorch type.
------------------------------------------------------------------------- */

#ifndef MLTORCH_CORE_HALO_H
#define MLTORCH_CORE_HALO_H

#include <cstdint>

namespace MLTorch {

// The per-layer halo exchange of a layered model (doc/pair_torch.rst,
// "Layered models"): between two interaction layers the features of the
// graph's ghost nodes are set from their owners, which may live on another
// rank (or be periodic images of an owned atom on this one).
//
// The graph's nodes [0, n_local) are the owned atoms, nodes [n_local,
// n_nodes) ghost atoms. forward() is the linear map X: owned rows -> all
// rows (owned rows copied, ghost rows from their owners); reverse() is its
// adjoint X^T: all rows -> owned rows, each owner receiving its own row
// plus the sum of the rows of all its ghost copies. Both are collective:
// every rank of the communicator calls them, in the same order, also a
// rank without atoms. Buffers are row-major doubles in the memory space of
// the graph (host, or the model's device when GraphInput::on_model_device).
// forward() receives `all` zeroed: rows it does not know (padding beyond
// its atoms) may be left as they are.
class HaloExchange {
 public:
  virtual ~HaloExchange() = default;
  virtual void forward(const double *owned, double *all, int width) = 0;
  virtual void reverse(const double *all, double *owned, int width) = 0;
};

}    // namespace MLTorch

#endif
