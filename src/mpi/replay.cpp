/* ----------------------------------------------------------------------
   ML-TORCH: machine-learned potentials for LAMMPS.
   The replay buffer of fix torch/finetune (replay.h).
------------------------------------------------------------------------- */

#include "mltorch/replay.h"

#include <algorithm>
#include <cstring>

namespace MLTorch {

namespace {
template <typename V> void room(V &vec, std::size_t n)
{
  if (vec.capacity() < n) vec.reserve(n + n / 4);
}
template <typename V, typename T> void fill(V &vec, const T *first, std::size_t n)
{
  room(vec, n);
  vec.assign(first, first + n);
}
}    // namespace

void ReplayPiece::set_graph(const GraphInput &in)
{
  n_nodes = in.n_nodes;
  n_local = in.n_local;
  n_edges = in.n_edges;
  fill(edge_vec, in.edge_vectors, 3 * in.n_edges);
  fill(edge_index, in.edge_index, 2 * in.n_edges);
  fill(species, in.species, in.n_nodes);
  room(fref, 3 * in.n_local);
  fref.resize(3 * in.n_local);
}

std::string ReplayPiece::group_ghosts(const std::vector<int> &owner_rank,
                                      const std::vector<int> &owner_slot, int nprocs)
{
  const int64_t nghost = n_nodes - n_local;
  if (static_cast<int64_t>(owner_rank.size()) != nghost ||
      static_cast<int64_t>(owner_slot.size()) != nghost)
    return "replay buffer: an owner is needed for each of the " + std::to_string(nghost) +
        " ghost nodes";
  send_counts.assign(nprocs, 0);
  send_displs.assign(nprocs, 0);
  for (int64_t g = 0; g < nghost; ++g) {
    if (owner_rank[g] < 0 || owner_rank[g] >= nprocs || owner_slot[g] < 0)
      return "replay buffer: ghost atom without an owner slot";
    ++send_counts[owner_rank[g]];
  }
  for (int p = 1; p < nprocs; ++p) send_displs[p] = send_displs[p - 1] + send_counts[p - 1];
  // ghost nodes by owner rank (stable: in node order within a rank)
  ghost_nodes.resize(nghost);
  send_slots.resize(nghost);
  std::vector<int> next(send_displs);
  for (int64_t g = 0; g < nghost; ++g) {
    const int q = next[owner_rank[g]]++;
    ghost_nodes[q] = n_local + g;
    send_slots[q] = owner_slot[g];
  }
  return {};
}

void ReplayPiece::plan_exchange(MPI_Comm comm)
{
  const int nprocs = static_cast<int>(send_counts.size());
  recv_counts.resize(nprocs);
  recv_displs.resize(nprocs);
  MPI_Alltoall(send_counts.data(), 1, MPI_INT, recv_counts.data(), 1, MPI_INT, comm);
  int nrecv = 0;
  for (int p = 0; p < nprocs; ++p) {
    recv_displs[p] = nrecv;
    nrecv += recv_counts[p];
  }
  recv_slots.resize(nrecv);
  MPI_Alltoallv(send_slots.data(), send_counts.data(), send_displs.data(), MPI_INT,
                recv_slots.data(), recv_counts.data(), recv_displs.data(), MPI_INT, comm);
  send_slots.clear();
}

GraphInput ReplayPiece::graph() const
{
  GraphInput in;
  in.n_nodes = n_nodes;
  in.n_local = n_local;
  in.n_edges = n_edges;
  in.edge_vectors = edge_vec.data();
  in.edge_index = edge_index.data();
  in.species = species.data();
  return in;
}

double ReplayPiece::bytes() const
{
  return 8.0 * (edge_vec.size() + edge_index.size() + species.size() + ghost_nodes.size() +
                fref.size()) +
      4.0 * (send_counts.size() + send_displs.size() + recv_slots.size() + recv_counts.size() +
             recv_displs.size()) +
      sizeof(ReplayPiece);
}

/* ---------------------------------------------------------------------- */

void ReplayExchange::scale(int w)
{
  const std::size_t np = r.send_counts.size();
  sc.resize(np), sd.resize(np), rc.resize(np), rd.resize(np);
  for (std::size_t p = 0; p < np; ++p) {
    sc[p] = w * r.send_counts[p];
    sd[p] = w * r.send_displs[p];
    rc[p] = w * r.recv_counts[p];
    rd[p] = w * r.recv_displs[p];
  }
  out.resize(r.recv_slots.size() * w);
  in.resize(r.ghost_nodes.size() * w);
}

void ReplayExchange::forward(const double *owned, double *all, int w)
{
  scale(w);
  for (std::size_t q = 0; q < r.recv_slots.size(); ++q)
    std::memcpy(&out[q * w], owned + static_cast<std::size_t>(r.recv_slots[q]) * w,
                sizeof(double) * w);
  MPI_Alltoallv(out.data(), rc.data(), rd.data(), MPI_DOUBLE, in.data(), sc.data(), sd.data(),
                MPI_DOUBLE, world);
  if (r.n_local > 0) std::memcpy(all, owned, sizeof(double) * w * r.n_local);
  for (std::size_t g = 0; g < r.ghost_nodes.size(); ++g)
    std::memcpy(all + r.ghost_nodes[g] * w, &in[g * w], sizeof(double) * w);
}

void ReplayExchange::reverse(const double *all, double *owned, int w)
{
  scale(w);
  for (std::size_t g = 0; g < r.ghost_nodes.size(); ++g)
    std::memcpy(&in[g * w], all + r.ghost_nodes[g] * w, sizeof(double) * w);
  MPI_Alltoallv(in.data(), sc.data(), sd.data(), MPI_DOUBLE, out.data(), rc.data(), rd.data(),
                MPI_DOUBLE, world);
  if (r.n_local > 0) std::memcpy(owned, all, sizeof(double) * w * r.n_local);
  for (std::size_t q = 0; q < r.recv_slots.size(); ++q)
    for (int k = 0; k < w; ++k)
      owned[static_cast<std::size_t>(r.recv_slots[q]) * w + k] += out[q * w + k];
}

/* ---------------------------------------------------------------------- */

std::unique_ptr<ReplayPiece> ReplayBuffer::spare()
{
  return spare_ ? std::move(spare_) : std::make_unique<ReplayPiece>();
}

bool ReplayBuffer::store(std::unique_ptr<ReplayPiece> piece, MPI_Comm comm)
{
  // bounded memory: the oldest pieces go first, the same ones on every rank
  const double need = piece->bytes();
  double total = bytes();
  int evict = 0;
  if (need > max_bytes_) {
    evict = -1;    // this piece alone is too big for the bound
  } else {
    while (total + need > max_bytes_ && evict < size()) total -= pieces[evict++]->bytes();
  }
  int too_big = (evict < 0) ? 1 : 0, any_too_big = 0, evict_all = 0;
  MPI_Allreduce(&too_big, &any_too_big, 1, MPI_INT, MPI_MAX, comm);
  if (any_too_big) {
    spare_ = std::move(piece);
    return false;
  }
  MPI_Allreduce(&evict, &evict_all, 1, MPI_INT, MPI_MAX, comm);
  if (size() - evict_all >= capacity_) evict_all = size() - capacity_ + 1;
  if (evict_all > 0) spare_ = std::move(pieces.front());
  pieces.erase(pieces.begin(), pieces.begin() + evict_all);
  pieces.push_back(std::move(piece));
  ++fresh_;
  return true;
}

double ReplayBuffer::bytes() const
{
  double b = 0.0;
  for (const auto &p : pieces) b += p->bytes();
  return b;
}

std::vector<int> replay_picks(long long events, int eligible, int mix)
{
  std::vector<int> picks;
  const int n = std::min(mix, std::max(eligible, 0));
  for (int j = 0; j < n; ++j) {
    std::uint64_t z = static_cast<std::uint64_t>(events) * 0x9E3779B97F4A7C15ULL +
        static_cast<std::uint64_t>(j + 1) * 0xBF58476D1CE4E5B9ULL;
    z ^= z >> 31;
    z *= 0x94D049BB133111EBULL;
    z ^= z >> 29;
    picks.push_back(static_cast<int>(z % static_cast<std::uint64_t>(eligible)));
  }
  return picks;
}

}    // namespace MLTorch
