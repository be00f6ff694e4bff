/* -*- c++ -*- ----------------------------------------------------------
   ML-TORCH tests: an independent, brute-force graph builder.  Periodic
   images are made explicit (every image within `nshell` cells), every node
   pair closer than the cutoff is an edge, and only the original atoms'
   energies count.  It shares no code with pair_style torch, so the two can
   check each other.
------------------------------------------------------------------------- */

#ifndef MLTORCH_TEST_REFERENCE_GRAPH_H
#define MLTORCH_TEST_REFERENCE_GRAPH_H

#include "mltorch/model.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

namespace MLTorchTest {

struct Result {
  double energy = 0.0;
  std::vector<double> forces;         // [n][3] on the original atoms
  std::array<double, 6> virial{};     // xx yy zz xy xz yz (LAMMPS order)
};

// the graph: originals first (nodes [0, n) count), then their images;
// owner[node] is the original atom of every node
struct Graph {
  std::vector<double> x, edge_vectors;
  std::vector<int64_t> species, edge_index, centre, neighbour;
  std::vector<int> owner;
  int64_t n_local = 0;
  MLTorch::GraphInput input() const
  {
    MLTorch::GraphInput in;
    in.n_nodes = static_cast<int64_t>(species.size());
    in.n_local = n_local;
    in.n_edges = static_cast<int64_t>(centre.size());
    in.edge_vectors = edge_vectors.data();
    in.edge_index = edge_index.data();
    in.species = species.data();
    return in;
  }
};

// cell rows a, b, c; periodic[d] says whether images are made along cell vector d
inline Graph build_reference_graph(const std::vector<double> &pos, const std::vector<int64_t> &species,
                                   const std::array<std::array<double, 3>, 3> &cell,
                                   const std::array<bool, 3> &periodic, int nshell, double rc)
{
  const int n = static_cast<int>(species.size());
  Graph g;
  g.n_local = n;
  for (int a = 0; a < n; a++) {    // originals first: nodes [0, n) count
    for (int d = 0; d < 3; d++) g.x.push_back(pos[3 * a + d]);
    g.species.push_back(species[a]);
    g.owner.push_back(a);
  }
  const int s0 = periodic[0] ? nshell : 0, s1 = periodic[1] ? nshell : 0,
            s2 = periodic[2] ? nshell : 0;
  for (int i = -s0; i <= s0; i++)
    for (int j = -s1; j <= s1; j++)
      for (int k = -s2; k <= s2; k++) {
        if (i == 0 && j == 0 && k == 0) continue;
        for (int a = 0; a < n; a++) {
          for (int d = 0; d < 3; d++)
            g.x.push_back(pos[3 * a + d] + i * cell[0][d] + j * cell[1][d] + k * cell[2][d]);
          g.species.push_back(species[a]);
          g.owner.push_back(a);
        }
      }
  const int64_t m = static_cast<int64_t>(g.species.size());
  const auto &x = g.x;
  for (int64_t a = 0; a < m; a++)
    for (int64_t b = 0; b < m; b++) {
      if (a == b) continue;
      const double dx = x[3 * b] - x[3 * a], dy = x[3 * b + 1] - x[3 * a + 1],
                   dz = x[3 * b + 2] - x[3 * a + 2];
      if (dx * dx + dy * dy + dz * dz >= rc * rc) continue;
      g.edge_vectors.insert(g.edge_vectors.end(), {dx, dy, dz});
      g.centre.push_back(a);
      g.neighbour.push_back(b);
    }
  g.edge_index = g.centre;
  g.edge_index.insert(g.edge_index.end(), g.neighbour.begin(), g.neighbour.end());
  return g;
}

inline Result evaluate_reference(const MLTorch::Model &model, const std::vector<double> &pos,
                                 const std::vector<int64_t> &species,
                                 const std::array<std::array<double, 3>, 3> &cell,
                                 const std::array<bool, 3> &periodic, int nshell)
{
  const int n = static_cast<int>(species.size());
  const Graph g = build_reference_graph(pos, species, cell, periodic, nshell, model.metadata().cutoff);
  const MLTorch::GraphInput in = g.input();
  const auto &ev = g.edge_vectors;
  const auto &ci = g.centre;
  const auto &cj = g.neighbour;
  const auto &owner = g.owner;
  MLTorch::GraphOutput out;
  model.evaluate(in, out, false);

  Result res;
  res.energy = out.energy;
  res.forces.assign(3 * n, 0.0);
  for (int64_t e = 0; e < in.n_edges; e++) {
    const double *g = &out.edge_grad[3 * e];
    const double *r = &ev[3 * e];
    for (int d = 0; d < 3; d++) {
      res.forces[3 * owner[ci[e]] + d] += g[d];
      res.forces[3 * owner[cj[e]] + d] -= g[d];
    }
    const double v[6] = {-r[0] * g[0], -r[1] * g[1], -r[2] * g[2],
                         -r[0] * g[1], -r[0] * g[2], -r[1] * g[2]};
    for (int k = 0; k < 6; k++) res.virial[k] += v[k];
  }
  return res;
}

// largest |a - b| relative to the largest |b| (a scale-aware relative error)
inline double max_rel_dev(const std::vector<double> &a, const std::vector<double> &b)
{
  double num = 0.0, den = 0.0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); i++) {
    num = std::max(num, std::fabs(a[i] - b[i]));
    den = std::max(den, std::fabs(b[i]));
  }
  if (a.size() != b.size()) return INFINITY;
  return den > 0.0 ? num / den : num;
}

}    // namespace MLTorchTest

#endif
