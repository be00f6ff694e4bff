/* ----------------------------------------------------------------------
   ML-TORCH: machine-learned potentials for LAMMPS.
   The folded graph of a whole periodic configuration (periodic_graph.h).
   Written here: the configurations are not LAMMPS's atoms, so LAMMPS's
   neighbor lists cannot build it, and LibTorch has no neighbour search.
   The search is direct, every pair of atoms in every image that can reach
   the cutoff: O(N^2 x images), a few milliseconds for the few hundred
   atoms of a DFT configuration, done once per configuration of a dataset.
------------------------------------------------------------------------- */

#include "mltorch/periodic_graph.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace MLTorch {

GraphInput PeriodicGraph::input() const
{
  GraphInput in;
  in.n_nodes = in.n_local = natoms;
  in.n_edges = static_cast<int64_t>(edge_vectors.size() / 3);
  in.edge_vectors = edge_vectors.data();
  in.edge_index = edge_index.data();
  in.species = species.data();
  return in;
}

std::size_t PeriodicGraph::bytes() const
{
  return edge_vectors.size() * sizeof(double) + (edge_index.size() + species.size()) * sizeof(int64_t);
}

static void cross(const double *a, const double *b, double *c)
{
  c[0] = a[1] * b[2] - a[2] * b[1];
  c[1] = a[2] * b[0] - a[0] * b[2];
  c[2] = a[0] * b[1] - a[1] * b[0];
}

PeriodicGraph periodic_graph(const double *cell, const bool *pbc, const double *positions,
                             const std::vector<int64_t> &species, double cutoff)
{
  PeriodicGraph g;
  const int64_t n = static_cast<int64_t>(species.size());
  g.natoms = n;
  g.species = species;
  const double *h = cell;
  double bc[3], ca[3], ab[3];
  cross(h + 3, h + 6, bc);
  cross(h + 6, h, ca);
  cross(h, h + 3, ab);
  const double vol = h[0] * bc[0] + h[1] * bc[1] + h[2] * bc[2];
  const bool any_pbc = pbc[0] || pbc[1] || pbc[2];
  if (any_pbc && !(std::fabs(vol) > 0.0))
    throw ModelError("the cell has no volume (its vectors are not independent)");
  const double rc2 = cutoff * cutoff;

  // fractional coordinates s = x H^-1 (rows of H^-1 transposed: bc, ca, ab / vol)
  std::vector<double> s(3 * n);
  const double *inv[3] = {bc, ca, ab};
  for (int64_t i = 0; i < n; ++i)
    for (int d = 0; d < 3; ++d) {
      const double *x = positions + 3 * i;
      s[3 * i + d] = (x[0] * inv[d][0] + x[1] * inv[d][1] + x[2] * inv[d][2]) / vol;
    }
  // image layers per direction: the cutoff over the distance between the
  // lattice planes, plus the spread of the atoms' fractional coordinates
  // (atoms need not be inside the cell)
  int layers[3] = {0, 0, 0};
  for (int d = 0; d < 3; ++d) {
    if (!pbc[d]) continue;
    const double *c = inv[d];
    const double spacing = std::fabs(vol) / std::sqrt(c[0] * c[0] + c[1] * c[1] + c[2] * c[2]);
    double lo = 0.0, hi = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      lo = std::min(lo, s[3 * i + d]);
      hi = std::max(hi, s[3 * i + d]);
    }
    layers[d] = static_cast<int>(std::ceil(cutoff / spacing + (hi - lo)));
  }
  for (int nx = -layers[0]; nx <= layers[0]; ++nx)
    for (int ny = -layers[1]; ny <= layers[1]; ++ny)
      for (int nz = -layers[2]; nz <= layers[2]; ++nz) {
        const double shift[3] = {nx * h[0] + ny * h[3] + nz * h[6], nx * h[1] + ny * h[4] + nz * h[7],
                                 nx * h[2] + ny * h[5] + nz * h[8]};
        const bool zero = nx == 0 && ny == 0 && nz == 0;
        for (int64_t i = 0; i < n; ++i) {
          const double *xi = positions + 3 * i;
          for (int64_t j = 0; j < n; ++j) {
            if (zero && i == j) continue;
            const double *xj = positions + 3 * j;
            const double r[3] = {xj[0] + shift[0] - xi[0], xj[1] + shift[1] - xi[1],
                                 xj[2] + shift[2] - xi[2]};
            const double r2 = r[0] * r[0] + r[1] * r[1] + r[2] * r[2];
            if (r2 >= rc2) continue;
            g.edge_vectors.insert(g.edge_vectors.end(), r, r + 3);
            g.edge_index.push_back(i);
            g.edge_index.push_back(j);
          }
        }
      }
  // [2][E]: centres, then neighbours
  const std::size_t ne = g.edge_index.size() / 2;
  std::vector<int64_t> idx(2 * ne);
  for (std::size_t e = 0; e < ne; ++e) {
    idx[e] = g.edge_index[2 * e];
    idx[ne + e] = g.edge_index[2 * e + 1];
  }
  g.edge_index.swap(idx);
  return g;
}

void graph_forces_virial(const PeriodicGraph &g, const std::vector<double> &edge_grad,
                         std::vector<double> &forces, double *virial)
{
  const std::size_t ne = g.edge_vectors.size() / 3;
  forces.assign(3 * static_cast<std::size_t>(g.natoms), 0.0);
  for (int k = 0; k < 6; ++k) virial[k] = 0.0;
  for (std::size_t e = 0; e < ne; ++e) {
    const int64_t i = g.edge_index[e], j = g.edge_index[ne + e];
    const double *gr = &edge_grad[3 * e], *r = &g.edge_vectors[3 * e];
    for (int k = 0; k < 3; ++k) {
      forces[3 * i + k] += gr[k];
      forces[3 * j + k] -= gr[k];
    }
    virial[0] -= r[0] * gr[0];
    virial[1] -= r[1] * gr[1];
    virial[2] -= r[2] * gr[2];
    virial[3] -= r[0] * gr[1];
    virial[4] -= r[0] * gr[2];
    virial[5] -= r[1] * gr[2];
  }
}

}    // namespace MLTorch
