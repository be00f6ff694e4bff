/* -*- c++ -*- ----------------------------------------------------------
   ML-TORCH: machine-learned potentials for LAMMPS.
   Part of the LAMMPS-independent core (no LAMMPS, no MPI; no LibTorch type
   in this header): the graph of a whole periodic configuration that is not
   LAMMPS's, for labelled configurations read from a file (fix
   torch/finetune's dataset, the torch/train command).

   The graph is folded, as pair_style torch's graph on one rank with `fold
   yes`: one node per atom, all of them local, and one edge from atom i to
   every periodic image of atom j within the cutoff, pointed at j itself
   with the image's vector (r_ij = x_j + n.H - x_i; i's own images too,
   not its zero shift). A message-passing model then runs in one call on
   the whole configuration: the images' features are their atoms'. Any
   cell: triclinic, and smaller than the cutoff in any direction (as many
   image layers as the cutoff needs); a direction without periodicity has
   no images.
------------------------------------------------------------------------- */

#ifndef MLTORCH_CORE_PERIODIC_GRAPH_H
#define MLTORCH_CORE_PERIODIC_GRAPH_H

#include "mltorch/contract.h"

#include <cstdint>
#include <vector>

namespace MLTorch {

struct PeriodicGraph {
  int64_t natoms = 0;
  std::vector<double> edge_vectors;    // [n_edges][3]
  std::vector<int64_t> edge_index;     // [2][n_edges]
  std::vector<int64_t> species;        // [natoms]
  // the contract's view of it (valid while the graph lives)
  GraphInput input() const;
  std::size_t bytes() const;
};

// `cell` the cell vectors a, b, c as rows (3x3), `positions` [n][3] and
// `species` [n] (the model's species indices): every edge shorter than
// `cutoff` (r^2 < cutoff^2, as LAMMPS's lists). ModelError for a cell
// without volume (periodic directions).
PeriodicGraph periodic_graph(const double *cell, const bool *pbc, const double *positions,
                             const std::vector<int64_t> &species, double cutoff);

// the forces [n][3] (F_i += g_ij, F_j -= g_ij) and the virial W =
// -sum_e r_e (x) g_e (6: xx yy zz xy xz yz) from the edge gradients
void graph_forces_virial(const PeriodicGraph &g, const std::vector<double> &edge_grad,
                         std::vector<double> &forces, double *virial);

}    // namespace MLTorch

#endif
