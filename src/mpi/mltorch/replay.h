/* -*- c++ -*- ----------------------------------------------------------
   ML-TORCH: machine-learned potentials for LAMMPS.
   Part of the MPI library of the core (mltorch_mpi: needs MPI, not LAMMPS,
   nor LibTorch): the replay buffer of fix torch/finetune.

   Every rank keeps its own piece of each stored configuration: its graph
   (nodes [0, n_local) are the atoms it owned when the configuration was
   stored, the others ghost copies) and the teacher's labels of its atoms.
   LAMMPS's ghost exchange pattern of that step is gone once atoms move, so
   a piece records, for each ghost node, the rank and node slot of its owner
   (its exchange plan); replays exchange partial forces, residual weights
   and a layered model's features along it with MPI_Alltoallv: the same
   sums LAMMPS's reverse and forward communication did when it was stored.
------------------------------------------------------------------------- */

#ifndef MLTORCH_CORE_REPLAY_H
#define MLTORCH_CORE_REPLAY_H

#include "mltorch/model.h"    // GraphInput, HaloExchange (no LibTorch type)

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace MLTorch {

struct ReplayPiece {
  int64_t n_nodes = 0, n_local = 0, n_edges = 0;
  std::vector<double> edge_vec;
  std::vector<int64_t> edge_index, species;
  std::vector<double> fref;    // [n_local][3] teacher forces
  double e_ref = 0.0, w_ref[6] = {0, 0, 0, 0, 0, 0};
  double natoms = 0.0;         // covered atoms of the whole configuration
  // the exchange plan: ghost nodes grouped by the rank that owns their atom,
  // and the node slots of this rank that other ranks hold ghost copies of
  std::vector<int64_t> ghost_nodes;
  std::vector<int> send_counts, send_displs;
  std::vector<int> recv_slots, recv_counts, recv_displs;

  // copy the graph (vectors keep 25% headroom, so that a refilled piece
  // takes a slightly larger graph without going back to malloc); fref is
  // sized [n_local][3] for the caller to fill
  void set_graph(const GraphInput &in);
  // the exchange plan from the owner (rank, node slot) of every ghost node
  // n_local + g: local, empty on success, else what is wrong (then the
  // caller decides collectively before plan_exchange)
  std::string group_ghosts(const std::vector<int> &owner_rank, const std::vector<int> &owner_slot,
                           int nprocs);
  // collective over comm: the other side of the plan
  void plan_exchange(MPI_Comm comm);
  // the stored graph, to evaluate a model on (host buffers)
  GraphInput graph() const;
  double bytes() const;

 private:
  std::vector<int> send_slots;    // owner slots of ghost_nodes, until plan_exchange
};

// the exchange along a piece's plan, by MPI_Alltoallv (collective over comm)
class ReplayExchange : public HaloExchange {
 public:
  ReplayExchange(const ReplayPiece &piece, MPI_Comm comm) : r(piece), world(comm) {}
  void forward(const double *owned, double *all, int width) override;
  void reverse(const double *all, double *owned, int width) override;

 private:
  void scale(int width);
  const ReplayPiece &r;
  MPI_Comm world;
  std::vector<int> sc, sd, rc, rd;
  std::vector<double> out, in;
};

// this rank's pieces, the oldest first, bounded in count and bytes. Every
// rank of the communicator holds pieces of the same configurations: the
// eviction decisions are collective.
class ReplayBuffer {
 public:
  ReplayBuffer(int capacity, double max_bytes) : capacity_(capacity), max_bytes_(max_bytes) {}

  // a piece to fill: the last one evicted (the buffer's vectors then stop
  // going back to malloc: freeing and allocating pieces of slightly
  // different sizes at every update fragments the heap, and the resident
  // size creeps up over a long run), or a new one
  std::unique_ptr<ReplayPiece> spare();
  // store a filled piece, evicting the oldest pieces (the same on every
  // rank of comm) to stay within the capacity and the memory bound.
  // Collective. false (and nothing stored) when the piece of some rank
  // alone exceeds the memory bound.
  bool store(std::unique_ptr<ReplayPiece> piece, MPI_Comm comm);

  int size() const { return static_cast<int>(pieces.size()); }
  ReplayPiece &operator[](int k) { return *pieces[k]; }
  double bytes() const;
  // pieces stored since the last new_round() (not eligible for replay yet)
  int fresh() const { return fresh_; }
  void new_round() { fresh_ = 0; }

 private:
  int capacity_;
  double max_bytes_;
  int fresh_ = 0;
  std::vector<std::unique_ptr<ReplayPiece>> pieces;
  std::unique_ptr<ReplayPiece> spare_;
};

// replay selection: which of the `eligible` stored configurations (indices
// [0, eligible)) the update after `events` updates, skips and rollbacks mixes
// in, at most `mix` of them (a splitmix64 hash: the same picks on every rank)
std::vector<int> replay_picks(long long events, int eligible, int mix);

}    // namespace MLTorch

#endif
