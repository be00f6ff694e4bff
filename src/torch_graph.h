/* -*- c++ -*- ----------------------------------------------------------
   LAMMPS - Large-scale Atomic/Molecular Massively Parallel Simulator
   https://www.lammps.org/, Sandia National Laboratories
   LAMMPS development team: developers@lammps.org

   ML-TORCH package: TorchScript machine-learned potentials.
   Distributed under the GNU General Public License, version 2.
------------------------------------------------------------------------- */

#ifndef LMP_TORCH_GRAPH_H
#define LMP_TORCH_GRAPH_H

#include "pointers.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace MLTorch {
class HaloExchange;
struct GraphInput;
struct GraphOutput;
}    // namespace MLTorch

namespace LAMMPS_NS {

// per-atom rows [nall][width] in flight in one forward or reverse
// communication of the pair style that owns a TorchGraph: the pair style's
// pack/unpack methods copy (forward) or sum (reverse) these rows. `device`:
// the rows are a KOKKOS graph's device features (torch/kk)
struct CommRows {
  double *data = nullptr;
  int width = 0;
  bool device = false;
};

// The graph of the model contract for one pair style on this rank, built
// from LAMMPS's neighbour list: nodes (the local atoms first, then ghost
// atoms), edges within the model cutoff, the fold of ghost images onto
// their owners on a single rank, the per-layer halo exchange of a layered
// model (by the owning pair style's forward and reverse communication), and
// the scatter of edge gradients into atom forces and virials. pair_style
// torch owns one; torch/kk owns a TorchGraphKokkos, which overrides what
// runs on the device.
class TorchGraph : protected Pointers {
 public:
  TorchGraph(class LAMMPS *lmp, class Pair *owner, CommRows &rows);
  virtual ~TorchGraph();

  // what the graph follows from the model and the pair style's keywords
  struct Shape {
    double cutoff = 0.0;
    int nlayers = 1;
    bool ghost_lists = false;    // thick ghosts: ghost atoms are centres too
    bool exchange = false;       // the per-layer halo exchange
    bool fold = false;           // fold ghosts onto owners where possible ('fold yes')
    std::vector<int> type2species;    // LAMMPS type -> model species, -1 for NULL
  };
  Shape shape;
  bool fold_possible() const;    // this rank's graphs are folded (single rank, exchange)
  // LAMMPS's init(): the ghost owners are found again on the first build
  void new_run() { owners_built = -1; }

  // the graph from the neighbor list: nodes [0, n_counted()) are the local
  // atoms of this style (their energies count), then the ghost-list centres
  // that can reach a local energy, then any other neighbour; may_fold false
  // keeps the ghost nodes even where they could be folded
  void build(class NeighList *list, bool may_fold = true);
  // the model's input on the last graph (host buffers; torch/kk: device
  // buffers of its padded graph)
  virtual void input(MLTorch::GraphInput &in) const;
  // the last graph in host buffers (torch/kk copies its device graph)
  virtual void host_graph(class NeighList *list, MLTorch::GraphInput &in);

  int n_counted() const { return ncounted; }
  const std::vector<int> &node_atoms() const { return node2atom; }
  // every node's position in this rank's frame, [nodes][3] (the edge moments)
  const double *node_positions();
  double size[2] = {0.0, 0.0};    // nodes and edges of the last graph

  // the virial tallies of an MD force call (scatter); null: not asked
  struct Tallies {
    double *virial = nullptr;           // global, 6 components
    double **vatom = nullptr;           // compute stress/atom
    double **cvatom = nullptr;          // compute centroid/stress/atom, 9 components
    const double *moments = nullptr;    // GraphOutput::edge_moment of a message-passing model
    double **x = nullptr;               // positions, with moments
  };
  // edge gradients g of the host graph as atom forces, F_i += g_ij,
  // F_j -= g_ij, into rows of `stride` doubles of dst (local and ghost
  // atoms), with the virial tallies t asks for
  void scatter(const double *g, double *dst, int stride, const Tallies *t = nullptr) const;
  // whether the model's output on the host graph is finite; if not, `where`
  // names up to 10 atoms near the non-finite values (" near atom IDs ...")
  bool finite(const MLTorch::GraphOutput &out, std::string &where) const;

  // the per-layer halo exchange of a layered model on the current graph
  // (MLTorch::HaloExchange): owned rows [n_local][width] -> all nodes' rows
  // by forward communication, and its adjoint by reverse communication.
  // Collective. torch/kk overrides them for its device rows.
  virtual void halo_forward(const double *owned, double *all, int width);
  virtual void halo_reverse(const double *all, double *owned, int width);
  MLTorch::HaloExchange *exchanger() const;    // the exchange handed to models, if used
  // rows [nall][width] by atom through the owning pair style's forward
  // communication (owners' rows to their ghost copies) or reverse
  // communication (ghost copies' rows summed into their owners); `device`:
  // torch/kk's device features instead of `data`. Collective
  void communicate(double *data, int width, bool reverse, bool device = false);
  double time_halo = 0.0;                      // wall time in the exchange

  // first force call of a run with a message-passing model: ghost counts
  void log_ghost_counts(double nnodes);
  virtual double memory_usage() const;

  // ghost atoms whose edges can reach a local energy (message-passing
  // models); public because torch/kk captures it in device lambdas
  struct GhostReach {
    bool prune = false;
    double lo[3] = {0, 0, 0}, hi[3] = {0, 0, 0};
    double reach_sq = 0.0;
    bool needed(const double *xi) const
    {
      if (!prune) return true;
      double d2 = 0.0;
      for (int d = 0; d < 3; ++d) {
        const double out = (xi[d] < lo[d]) ? lo[d] - xi[d] : (xi[d] > hi[d] ? xi[d] - hi[d] : 0.0);
        d2 += out * out;
      }
      return d2 <= reach_sq;
    }
  };
  GhostReach ghost_reach() const;

 protected:
  class Pair *owner;    // whose forward/reverse communication moves rows
  CommRows &rows;
  // host graph buffers, grown and reused from step to step
  std::vector<int> atom2node, node2atom, centres;
  std::vector<int64_t> species, edge_index, edge_nbr;
  std::vector<double> edge_vec;
  int ncounted = 0;
  bool folded = false;
  std::vector<double> halo_buf;    // [nall][width] rows by atom
  std::vector<double> positions;   // [nodes][3] (node_positions)
  struct Exchange;
  std::unique_ptr<Exchange> exchange;    // the MLTorch::HaloExchange handed to the model

  // folding ('fold yes'): on a single rank every ghost atom is a periodic
  // image of an owned atom, and each edge to a ghost is re-pointed at its
  // owner's node; the owners come from LAMMPS's forward communication and
  // are kept until the next neighbour list build
  bool fold_ghosts();
  void find_ghost_owners();
  std::vector<int> ghost_owner;
  bigint owners_built = -1;
  bool fold_refusal_logged = false;
};

}    // namespace LAMMPS_NS

#endif
