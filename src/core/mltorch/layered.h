/* -*- c++ -*- ----------------------------------------------------------
   ML-TORCH: TorchScript machine-learned potentials for LAMMPS.
   Core-internal (LibTorch types): the stage-by-stage evaluation of a
   layered model with the per-layer halo exchange as an autograd operator.
   Not included by LAMMPS styles.
------------------------------------------------------------------------- */

#ifndef MLTORCH_CORE_LAYERED_H
#define MLTORCH_CORE_LAYERED_H

#include "mltorch/model.h"

#include <torch/script.h>

namespace MLTorch {

// Per-atom energies of nodes [0, n_local) of a layered model:
//   h = stage_embed(...); for each layer k: h = stage_interaction(k, X(h + anchor), ...);
//   stage_readout(h, ...)
// where X is the halo exchange (an autograd operator whose backward is the
// reverse exchange X^T, and X^T's backward is X, so that derivatives of any
// order are exact across ranks). `anchor` is a scalar zero that requires
// grad: it makes every exchange lie on a path of the autograd graph on
// every rank, also where a rank holds no atom or no edge, so that every
// rank takes part in every exchange of every backward pass (see
// doc/pair_torch.rst on the order of the exchanges). `host_buffers`: the
// exchange reads and writes host memory (else the tensors' device).
torch::Tensor run_layered(torch::jit::Module &module, const Metadata &meta,
                          const torch::Tensor &edge_vec, const torch::Tensor &edge_index,
                          const torch::Tensor &species, int64_t n_local, HaloExchange *halo,
                          bool host_buffers, const torch::Tensor &anchor, const std::string &source);

// The exchange X as the autograd operator run_layered() uses (its backward
// is X^T, whose backward is X): owned rows [n_local][w] -> all rows [n_nodes][w]
torch::Tensor halo_exchange_op(const torch::Tensor &owned, HaloExchange *halo, int64_t n_nodes,
                               bool host_buffers);

// The exchange without autograd (X when `forward`, else X^T): the compiled
// stages of a layered package chain their backward pass by hand with it.
torch::Tensor halo_exchange_rows(const torch::Tensor &in, HaloExchange *halo, int64_t rows_out,
                                 bool forward, bool host_buffers);

}    // namespace MLTorch

#endif
