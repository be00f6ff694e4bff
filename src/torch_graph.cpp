/* ----------------------------------------------------------------------
   LAMMPS - Large-scale Atomic/Molecular Massively Parallel Simulator
   https://www.lammps.org/, Sandia National Laboratories
   LAMMPS development team: developers@lammps.org

   ML-TORCH package: TorchScript machine-learned potentials.
   Distributed under the GNU General Public License, version 2.
------------------------------------------------------------------------- */

/* ----------------------------------------------------------------------
   the graph of the model contract built from LAMMPS's neighbor list (local
   atoms, ghost atoms, edges within the cutoff), the fold of ghost images,
   the per-layer halo exchange of a layered model by the owning pair
   style's forward and reverse communication, and edge gradients as atom
   forces and virials: the CPU back end (torch/kk subclasses it)
------------------------------------------------------------------------- */

#include "torch_graph.h"

#include "atom.h"
#include "comm.h"
#include "domain.h"
#include "lmp_compat.h"
#include "mltorch_mpi.h"
#include "neigh_list.h"
#include "neighbor.h"
#include "platform.h"

#include "mltorch/contract.h"
#include "mltorch/halo.h"

#include <algorithm>
#include <cmath>
#include <cstring>

using namespace LAMMPS_NS;

using MLTorchLmp::join_words;

/* ----------------------------------------------------------------------
   the halo exchange a layered model calls between its layers: the graph's
   halo_forward and halo_reverse, timed
------------------------------------------------------------------------- */

struct TorchGraph::Exchange : public MLTorch::HaloExchange {
  explicit Exchange(TorchGraph *g) : graph(g) {}
  void forward(const double *owned, double *all, int width) override
  {
    const double t = platform::walltime();
    graph->halo_forward(owned, all, width);
    graph->time_halo += platform::walltime() - t;
  }
  void reverse(const double *all, double *owned, int width) override
  {
    const double t = platform::walltime();
    graph->halo_reverse(all, owned, width);
    graph->time_halo += platform::walltime() - t;
  }
  TorchGraph *graph;
};

TorchGraph::TorchGraph(LAMMPS *lmp, Pair *pair, CommRows &comm_rows) :
    Pointers(lmp), owner(pair), rows(comm_rows), exchange(std::make_unique<Exchange>(this))
{
}

TorchGraph::~TorchGraph() = default;

MLTorch::HaloExchange *TorchGraph::exchanger() const
{
  return shape.exchange ? exchange.get() : nullptr;
}

/* ---------------------------------------------------------------------- */

void TorchGraph::communicate(double *data, int width, bool reverse, bool device)
{
  rows.data = data;
  rows.width = width;
  rows.device = device;
  if (reverse)
    MLTorchLmp::reverse_comm(comm, owner, width);
  else
    MLTorchLmp::forward_comm(comm, owner, width);
  rows.data = nullptr;
  rows.device = false;
}

/* ----------------------------------------------------------------------
   graph from the neighbor list: nodes [0, ncounted) are the local atoms of
   this style (their energies count), then ghost-list centres, then any
   other neighbor; edges are all pairs closer than the model cutoff
------------------------------------------------------------------------- */

void TorchGraph::build(NeighList *list, bool may_fold)
{
  // x is one contiguous block: x0[3 * j] saves the row pointer load per pair
  const double *x0 = atom->x[0];
  const int *type = atom->type;
  const int nall = atom->nlocal + atom->nghost;
  const int inum = list->inum;
  const int ncentre = inum + (shape.ghost_lists ? list->gnum : 0);
  const int *ilist = list->ilist;
  const int *numneigh = list->numneigh;
  int **firstneigh = list->firstneigh;
  const double cutsq_model = shape.cutoff * shape.cutoff;
  const std::vector<int> &type2species = shape.type2species;
  // with NULL types (pair_style hybrid) their atoms are no neighbours
  bool all_typed = true;
  for (int t = 1; t <= atom->ntypes; ++t) all_typed = all_typed && type2species[t] >= 0;

  atom2node.assign(nall, -1);
  node2atom.clear();
  species.clear();
  auto node_of = [&](int a) {
    if (atom2node[a] < 0) {
      atom2node[a] = static_cast<int>(node2atom.size());
      node2atom.push_back(a);
      species.push_back(type2species[type[a]]);
    }
    return atom2node[a];
  };
  // centres: the local atoms, then the ghost centres that can reach a local energy
  const GhostReach reach = ghost_reach();
  centres.clear();
  for (int ii = 0; ii < ncentre; ii++)
    if (ii < inum || reach.needed(atom->x[ilist[ii]])) {
      centres.push_back(ilist[ii]);
      node_of(ilist[ii]);
    }
  ncounted = inum;

  edge_vec.clear();
  edge_index.clear();    // centres first; neighbours gathered in edge_nbr
  edge_nbr.clear();
  for (const int i : centres) {
    const int64_t ni = atom2node[i];
    const double xi = x0[3 * i], yi = x0[3 * i + 1], zi = x0[3 * i + 2];
    const int *jlist = firstneigh[i];
    const int jnum = numneigh[i];
    for (int jj = 0; jj < jnum; jj++) {
      const int j = jlist[jj] & NEIGHMASK;
      if (!all_typed && type2species[type[j]] < 0) continue;
      const double dx = x0[3 * j] - xi, dy = x0[3 * j + 1] - yi, dz = x0[3 * j + 2] - zi;
      if (dx * dx + dy * dy + dz * dz >= cutsq_model) continue;
      edge_vec.insert(edge_vec.end(), {dx, dy, dz});
      edge_index.push_back(ni);
      edge_nbr.push_back(node_of(j));
    }
  }
  edge_index.insert(edge_index.end(), edge_nbr.begin(), edge_nbr.end());
  folded = may_fold && fold_possible() && fold_ghosts();
  size[0] = static_cast<double>(folded ? ncounted : node2atom.size());
  size[1] = static_cast<double>(edge_nbr.size());
}

/* ----------------------------------------------------------------------
   folding (fold_images): on a single rank every ghost atom is a periodic
   image of an owned atom. A layered model then needs no halo exchange: each
   edge's neighbour becomes the owner's node (the edge keeps its vector to
   the image), and the model runs once on the owned atoms, as on a periodic
   graph. edge_nbr keeps the ghost, so the forces still go to the image and
   reach the owner by LAMMPS's reverse communication, and per-atom virials
   split as before. The model's energy and edge gradients are those of the
   exchange: the exchange sets a ghost's features from its owner; folding
   reads the owner's features directly.
------------------------------------------------------------------------- */

bool TorchGraph::fold_possible() const
{
  return shape.fold && shape.exchange && comm->nprocs == 1;
}

/* ----------------------------------------------------------------------
   the owner of every ghost atom by LAMMPS's own forward communication:
   each owned atom sends its local index, and every image (a copy of a
   copy included) receives its owner's. This needs no atom map (LAMMPS
   makes one only for molecular atom styles or 'atom_modify map'), leaves
   the global atom state as it was, and is what forward communication
   already does each step for the layer features. Local indices change only
   when LAMMPS reneighbours (sorting, exchange), so the result is kept until
   the next neighbour list build of this run (init_style() forgets it:
   LAMMPS counts the builds from zero again in every run).
------------------------------------------------------------------------- */

void TorchGraph::find_ghost_owners()
{
  const int nlocal = atom->nlocal;
  const int nall = nlocal + atom->nghost;
  const bigint built = neighbor->ncalls;
  if (built == owners_built && static_cast<int>(ghost_owner.size()) == nall) return;
  halo_buf.assign(nall, -1.0);
  for (int i = 0; i < nlocal; ++i) halo_buf[i] = static_cast<double>(i);
  communicate(halo_buf.data(), 1, false);
  ghost_owner.resize(nall);
  for (int i = 0; i < nall; ++i) ghost_owner[i] = static_cast<int>(halo_buf[i]);
  owners_built = built;
}

bool TorchGraph::fold_ghosts()
{
  const int nlocal = atom->nlocal;
  find_ghost_owners();
  const std::size_t nedges = edge_nbr.size();
  for (std::size_t e = 0; e < nedges; ++e) {
    const int a = node2atom[edge_nbr[e]];
    if (a < nlocal) continue;
    const int owner = ghost_owner[a];
    // an owner that is no centre of this style (pair_style hybrid): keep the exchange
    const int node = (owner >= 0 && owner < nlocal) ? atom2node[owner] : -1;
    if (node < 0 || node >= ncounted) {
      std::copy(edge_nbr.begin(), edge_nbr.end(), edge_index.begin() + nedges);
      if (!fold_refusal_logged && comm->me == 0)
        utils::logmesg(lmp, "pair_style torch: ghosts are not folded onto their owners: atom {} "
                            "has an image among the neighbours but is no centre of this style "
                            "(pair_style hybrid with NULL types); the halo exchange runs instead\n",
                       atom->tag[a]);
      fold_refusal_logged = true;
      return false;
    }
    edge_index[nedges + e] = node;
  }
  return true;
}

/* ----------------------------------------------------------------------
   which ghost centres can feed a local energy: with L message-passing
   layers information travels at most L edges (each shorter than the
   cutoff), so edges centred on a ghost atom farther than (L-1) cutoffs from
   every local atom never reach a local energy, and are not built. Local
   atoms stay within skin/2 of this subdomain between neighbor list builds,
   so "farther than (L-1) rc + skin from the subdomain box" is safe.
   Triclinic boxes keep every ghost centre (the box is not orthogonal).
------------------------------------------------------------------------- */

TorchGraph::GhostReach TorchGraph::ghost_reach() const
{
  GhostReach r;
  r.prune = shape.ghost_lists && shape.nlayers > 1 && !domain->triclinic;
  const double reach = (shape.nlayers - 1) * shape.cutoff + neighbor->skin;
  r.reach_sq = reach * reach;
  for (int d = 0; d < 3; ++d) {
    r.lo[d] = domain->sublo[d];
    r.hi[d] = domain->subhi[d];
  }
  return r;
}

/* ---------------------------------------------------------------------- */

void TorchGraph::input(MLTorch::GraphInput &in) const
{
  in.n_nodes = folded ? ncounted : static_cast<int64_t>(node2atom.size());
  in.n_local = ncounted;
  in.n_edges = static_cast<int64_t>(edge_nbr.size());
  in.edge_vectors = edge_vec.data();
  in.edge_index = edge_index.data();
  in.species = species.data();
  in.halo = folded ? nullptr : exchanger();
}

/* ---------------------------------------------------------------------- */

void TorchGraph::host_graph(NeighList *list, MLTorch::GraphInput &in)
{
  build(list);
  input(in);
}

/* ----------------------------------------------------------------------
   every node's position in this rank's frame (the edge moments of the
   atomic virial of a message-passing model)
------------------------------------------------------------------------- */

const double *TorchGraph::node_positions()
{
  const std::size_t n = node2atom.size();
  positions.resize(3 * n);
  for (std::size_t i = 0; i < n; ++i)
    for (int k = 0; k < 3; ++k) positions[3 * i + k] = atom->x[node2atom[i]][k];
  return positions.data();
}

/* ----------------------------------------------------------------------
   the force scatter of the host graph, written once for the CPU back end
   (the MD force call, the committee's member forces and the fix's forces
   of an updated model all use it): F_i += g_ij, F_j -= g_ij for edge ij
   (centre i, neighbour j) into rows of `stride` doubles of dst. With
   tallies (the MD force call), the virial W = -sum r_ij (x) g_ij, split
   half and half per atom (compute stress/atom), and the atomic virial
   (compute centroid/stress/atom) as doc/pair_torch.rst derives it
------------------------------------------------------------------------- */

void TorchGraph::scatter(const double *g, double *dst, int stride, const Tallies *t) const
{
  const std::size_t nedges = edge_nbr.size();
  const double *r = edge_vec.data();
  for (std::size_t e = 0; e < nedges; ++e) {
    const int i = node2atom[edge_index[e]];
    const int j = node2atom[edge_nbr[e]];
    const double *ge = g + 3 * e;
    double *fi = dst + static_cast<std::size_t>(i) * stride;
    double *fj = dst + static_cast<std::size_t>(j) * stride;
    for (int k = 0; k < 3; ++k) {
      fi[k] += ge[k];
      fj[k] -= ge[k];
    }
    if (!t) continue;
    const double *re = r + 3 * e;
    const double v[6] = {-re[0] * ge[0], -re[1] * ge[1], -re[2] * ge[2],
                         -re[0] * ge[1], -re[0] * ge[2], -re[1] * ge[2]};
    if (t->virial)
      for (int k = 0; k < 6; k++) t->virial[k] += v[k];
    if (t->vatom)
      for (int k = 0; k < 6; k++) {
        t->vatom[i][k] += 0.5 * v[k];
        t->vatom[j][k] += 0.5 * v[k];
      }
    if (t->cvatom) {
      // LAMMPS's order of the full tensor: xx yy zz xy xz yz yx zx zy,
      // component (a, b) = position a, derivative b
      static constexpr int ca[9] = {0, 1, 2, 0, 0, 1, 1, 2, 2};
      static constexpr int cb[9] = {0, 1, 2, 1, 2, 2, 0, 0, 1};
      double **cv = t->cvatom;
      if (!t->moments) {
        // strictly local: edge e enters only its centre's energy E_i, so
        // dE_i/dx_j = g_ij and W_j += (x_i - x_j) (x) g_ij = -r_ij (x) g_ij,
        // on the neighbour j (the centre's own term is (x_i - x_i) = 0)
        for (int k = 0; k < 9; k++) cv[j][k] -= re[ca[k]] * ge[cb[k]];
      } else {
        // W_j += P_e - x_j (x) g_e, W_i -= P_e - x_i (x) g_e
        const double *P = t->moments + 9 * e;
        double **x = t->x;
        for (int k = 0; k < 9; k++) {
          const double p = P[3 * ca[k] + cb[k]];
          cv[j][k] += p - x[j][ca[k]] * ge[cb[k]];
          cv[i][k] -= p - x[i][ca[k]] * ge[cb[k]];
        }
      }
    }
  }
}

/* ----------------------------------------------------------------------
   a model can return NaN/Inf (e.g. atoms far outside its training data):
   the atoms involved, for the ERROR that stops the run
------------------------------------------------------------------------- */

bool TorchGraph::finite(const MLTorch::GraphOutput &out, std::string &where) const
{
  const double *g = out.edge_grad.data();
  const int64_t n = static_cast<int64_t>(edge_nbr.size());
  // NaN and inf have all exponent bits set: an integer test the compiler
  // vectorizes (a floating-point sum could not be reordered)
  constexpr uint64_t exponent = 0x7ff0000000000000ULL;
  uint64_t nonfinite = 0;
  for (int64_t k = 0; k < 3 * n; k++) {
    uint64_t bits;
    std::memcpy(&bits, g + k, sizeof(bits));
    nonfinite |= static_cast<uint64_t>((bits & exponent) == exponent);
  }
  if (std::isfinite(out.energy) && !nonfinite) return true;

  std::vector<tagint> bad;
  for (std::size_t k = 0; k < out.node_energy.size() && bad.size() < 10; k++)
    if (!std::isfinite(out.node_energy[k])) bad.push_back(atom->tag[node2atom[k]]);
  for (int64_t e = 0; e < n && bad.size() < 10; e++)
    if (!std::isfinite(g[3 * e]) || !std::isfinite(g[3 * e + 1]) || !std::isfinite(g[3 * e + 2])) {
      const tagint id = atom->tag[node2atom[edge_index[e]]];
      if (std::find(bad.begin(), bad.end(), id) == bad.end()) bad.push_back(id);
    }
  where = bad.empty() ? "" : " near atom IDs " + join_words(bad);
  return false;
}

/* ----------------------------------------------------------------------
   the halo exchange on the current graph (nodes [0, ncounted) are the
   owned atoms): owners' rows to their ghost copies, periodic images on
   this rank included, by LAMMPS's forward communication; the adjoint sums
   every ghost copy's row into its owner by reverse communication
------------------------------------------------------------------------- */

void TorchGraph::halo_forward(const double *owned, double *all, int width)
{
  const int nall = atom->nlocal + atom->nghost;
  const std::size_t w = width;
  halo_buf.assign(static_cast<std::size_t>(nall) * w, 0.0);
  for (int n = 0; n < ncounted; ++n)
    std::memcpy(halo_buf.data() + node2atom[n] * w, owned + n * w, sizeof(double) * w);
  communicate(halo_buf.data(), width, false);
  const std::size_t nnodes = node2atom.size();
  for (std::size_t n = 0; n < nnodes; ++n)
    std::memcpy(all + n * w, halo_buf.data() + node2atom[n] * w, sizeof(double) * w);
}

void TorchGraph::halo_reverse(const double *all, double *owned, int width)
{
  const int nall = atom->nlocal + atom->nghost;
  const std::size_t w = width;
  halo_buf.assign(static_cast<std::size_t>(nall) * w, 0.0);
  const std::size_t nnodes = node2atom.size();
  for (std::size_t n = 0; n < nnodes; ++n)
    std::memcpy(halo_buf.data() + node2atom[n] * w, all + n * w, sizeof(double) * w);
  communicate(halo_buf.data(), width, true);
  for (int n = 0; n < ncounted; ++n)
    std::memcpy(owned + n * w, halo_buf.data() + node2atom[n] * w, sizeof(double) * w);
}

/* ----------------------------------------------------------------------
   first force call of a run with a message-passing model: the ghost atoms
   per rank (thick ghosts grow with the layer count, the exchange does not)
------------------------------------------------------------------------- */

void TorchGraph::log_ghost_counts(double nnodes)
{
  // not const: LAMMPS's MPI stubs (serial builds) take void * send buffers
  double mine[3] = {static_cast<double>(atom->nghost), nnodes, static_cast<double>(atom->nlocal)};
  double lo[3], hi[3], sum[3];
  MPI_Allreduce(mine, lo, 3, MPI_DOUBLE, MPI_MIN, world);
  MPI_Allreduce(mine, hi, 3, MPI_DOUBLE, MPI_MAX, world);
  MPI_Allreduce(mine, sum, 3, MPI_DOUBLE, MPI_SUM, world);
  if (comm->me == 0)
    utils::logmesg(lmp,
                   "pair_style torch: {}: ghost atoms per rank {:.0f} to {:.0f} (mean {:.1f}), "
                   "graph nodes per rank {:.0f} to {:.0f} for {:.0f} owned atoms\n",
                   folded ? "ghosts folded onto their owners"
                          : (shape.exchange ? "halo exchange" : "thick ghosts"),
                   lo[0], hi[0],
                   sum[0] / comm->nprocs, lo[1], hi[1], sum[2]);
}

double TorchGraph::memory_usage() const
{
  double bytes = (double) (atom2node.capacity() + node2atom.capacity() + centres.capacity()) * sizeof(int);
  bytes += (double) (species.capacity() + edge_index.capacity() + edge_nbr.capacity()) * sizeof(int64_t);
  bytes += (double) (edge_vec.capacity() + halo_buf.capacity() + positions.capacity()) * sizeof(double);
  return bytes;
}
