/* ----------------------------------------------------------------------
   ML-TORCH core tests of the MPI library (no LAMMPS), under mpirun on 2
   and 4 ranks: the collectives that keep ranks and replicas in step
   (src/core/mltorch/collectives.h), the replay buffer's storage,
   eviction and exchange plan (src/core/mltorch/replay.h), and the
   distributed update of fix torch/finetune (src/core/mltorch/distributed.h).
------------------------------------------------------------------------- */

#include "mltorch/collectives.h"
#include "mltorch/distributed.h"
#include "mltorch/training.h"
#include "mltorch/runtime.h"
#include "mltorch/replay.h"

#include "mpi_test_main.h"

#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

static int me = 0, nprocs = 1;
static const std::string potentials = ML_TORCH_POTENTIALS_DIR;

TEST(Collectives, FirstFailureIsTheLowestFailingRanks)
{
  EXPECT_EQ(MLTorch::first_failure(MPI_COMM_WORLD, true, "unused"), "");
  // the ranks from 1 on fail, each with its own message
  const std::string mine = "rank " + std::to_string(me) + " failed";
  const std::string got = MLTorch::first_failure(MPI_COMM_WORLD, me == 0, mine);
  if (nprocs == 1) {
    EXPECT_EQ(got, "");
  } else {
    EXPECT_EQ(got, "rank 1 failed (on MPI rank 1)");
    EXPECT_EQ(MLTorch::first_failure(MPI_COMM_WORLD, me == 0, mine, false), "rank 1 failed");
  }
  // every rank failing: rank 0's message, without a rank
  EXPECT_EQ(MLTorch::first_failure(MPI_COMM_WORLD, false, mine), "rank 0 failed");
  EXPECT_EQ(MLTorch::first_failure(MPI_COMM_WORLD, me != nprocs - 1, ""),
            nprocs > 1 ? "(no message) (on MPI rank " + std::to_string(nprocs - 1) + ")"
                       : "(no message)");
}

TEST(Collectives, BroadcastAndCompare)
{
  std::string bytes = (me == nprocs - 1) ? std::string("a\0b", 3) + std::string(100000, 'x') : "";
  MLTorch::broadcast_bytes(bytes, nprocs - 1, MPI_COMM_WORLD);
  EXPECT_EQ(bytes.size(), 100003u);
  EXPECT_EQ(bytes.substr(0, 3), std::string("a\0b", 3));
  std::string first, other;
  EXPECT_EQ(MLTorch::first_differing_rank("same", MPI_COMM_WORLD, first, other), -1);
  // the last rank differs (or, on one rank, nothing can)
  const std::string mine = (me == nprocs - 1 && nprocs > 1) ? "lr 0.002" : "lr 0.001";
  const int r = MLTorch::first_differing_rank(mine, MPI_COMM_WORLD, first, other);
  if (nprocs == 1) {
    EXPECT_EQ(r, -1);
  } else {
    EXPECT_EQ(r, nprocs - 1);
    EXPECT_EQ(first, "lr 0.001");
    EXPECT_EQ(other, "lr 0.002");
  }
}

// the sum is bitwise the same on every rank (MPI may sum a bucket in an
// order that depends on its size, so buckets of another size agree to
// rounding only)
TEST(Collectives, SumEverywhereInBuckets)
{
  std::vector<double> v(1001);
  for (std::size_t k = 0; k < v.size(); ++k) v[k] = 1.0 / (3.0 + k + 7.0 * me) + 1e-17 * me;
  const auto whole = MLTorch::sum_everywhere(v, MPI_COMM_WORLD);
  const auto small = MLTorch::sum_everywhere(v, MPI_COMM_WORLD, 7);
  ASSERT_EQ(whole.size(), v.size());
  ASSERT_EQ(small.size(), v.size());
  for (std::size_t k = 0; k < v.size(); ++k) EXPECT_NEAR(small[k], whole[k], 1e-15);
  for (std::size_t k = 0; k < v.size(); k += 97) {
    double expect = 0.0;
    for (int p = 0; p < nprocs; ++p) expect += 1.0 / (3.0 + k + 7.0 * p) + 1e-17 * p;
    EXPECT_NEAR(whole[k], expect, 1e-15);
  }
  for (const auto *sum : {&whole, &small}) {
    std::vector<double> root(*sum);
    MPI_Bcast(root.data(), static_cast<int>(root.size()), MPI_DOUBLE, 0, MPI_COMM_WORLD);
    EXPECT_EQ(root, *sum);    // bitwise rank 0's
  }
  std::vector<double> none;
  EXPECT_TRUE(MLTorch::sum_everywhere(none, MPI_COMM_WORLD).empty());
}

/* ----------------------------------------------------------------------
   a ring: rank p owns 3 atoms (nodes 0-2) and holds ghost copies of the
   first two atoms of rank p+1 (nodes 3, 4) and of the last atom of rank
   p-1 (node 5); on one rank these are periodic images of its own atoms
------------------------------------------------------------------------- */

static MLTorch::ReplayPiece ring_piece()
{
  MLTorch::ReplayPiece r;
  const std::vector<int64_t> species = {0, 0, 0, 0, 0, 0}, edges = {0, 1, 3, 5};
  const std::vector<double> vec = {1, 0, 0, 0, 1, 0};
  MLTorch::GraphInput in;
  in.n_nodes = 6;
  in.n_local = 3;
  in.n_edges = 2;
  in.species = species.data();
  in.edge_index = edges.data();
  in.edge_vectors = vec.data();
  r.set_graph(in);
  const int next = (me + 1) % nprocs, prev = (me + nprocs - 1) % nprocs;
  EXPECT_EQ(r.group_ghosts({next, next, prev}, {0, 1, 2}, nprocs), "");
  r.plan_exchange(MPI_COMM_WORLD);
  return r;
}

TEST(Replay, ExchangeAlongTheOwnerMap)
{
  auto r = ring_piece();
  EXPECT_EQ(r.fref.size(), 9u);
  const auto g = r.graph();
  EXPECT_EQ(g.n_nodes, 6);
  EXPECT_EQ(g.edge_index[2], 3);
  MLTorch::ReplayExchange x(r, MPI_COMM_WORLD);
  // forward: ghosts get their owners' rows (width 2)
  std::vector<double> owned(6), all(12, -1.0);
  for (int i = 0; i < 3; ++i) owned[2 * i] = 10 * me + i, owned[2 * i + 1] = -(10 * me + i);
  x.forward(owned.data(), all.data(), 2);
  const int next = (me + 1) % nprocs, prev = (me + nprocs - 1) % nprocs;
  const std::vector<double> expect = {10.0 * me,   -10.0 * me,       10.0 * me + 1, -(10.0 * me + 1),
                                      10.0 * me + 2, -(10.0 * me + 2), 10.0 * next,   -10.0 * next,
                                      10.0 * next + 1, -(10.0 * next + 1), 10.0 * prev + 2,
                                      -(10.0 * prev + 2)};
  EXPECT_EQ(all, expect);
  // reverse is the adjoint: <X a, b> = <a, X^T b> summed over the ranks
  std::vector<double> b(12), back(6);
  for (int n = 0; n < 12; ++n) b[n] = 0.5 + n + 3 * me;
  x.reverse(b.data(), back.data(), 2);
  double lhs = 0.0, rhs = 0.0, sums[2];
  for (int n = 0; n < 12; ++n) lhs += all[n] * b[n];
  for (int n = 0; n < 6; ++n) rhs += owned[n] * back[n];
  const double mine[2] = {lhs, rhs};
  MPI_Allreduce(mine, sums, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_NEAR(sums[0], sums[1], 1e-12 * std::abs(sums[0]));
  // atom 2 has one ghost copy (node 5 of rank next), atom 0 one (node 3 of rank prev)
  const double b_next5 = 0.5 + 10 + 3 * next, b_prev3 = 0.5 + 6 + 3 * prev;
  EXPECT_DOUBLE_EQ(back[4], b[4] + b_next5);
  EXPECT_DOUBLE_EQ(back[0], b[0] + b_prev3);
}

TEST(Replay, GhostWithoutOwnerIsReported)
{
  MLTorch::ReplayPiece r;
  const std::vector<int64_t> species = {0, 0};
  MLTorch::GraphInput in;
  in.n_nodes = 2;
  in.n_local = 1;
  in.species = species.data();
  r.set_graph(in);
  EXPECT_EQ(r.group_ghosts({-1}, {0}, nprocs), "replay buffer: ghost atom without an owner slot");
  EXPECT_EQ(r.group_ghosts({nprocs}, {0}, nprocs), "replay buffer: ghost atom without an owner slot");
  EXPECT_NE(r.group_ghosts({}, {}, nprocs), "");
}

TEST(Replay, BufferEvictsTheOldestOnEveryRank)
{
  const double one = ring_piece().bytes();
  // capacity 3, memory for 2.5 pieces on rank 0 and plenty elsewhere: every
  // rank keeps the 2 newest (the ranks evict together)
  MLTorch::ReplayBuffer buf(3, me == 0 ? 2.5 * one : 100 * one);
  for (int k = 0; k < 4; ++k) {
    auto p = buf.spare();
    *p = ring_piece();
    p->e_ref = k;
    EXPECT_TRUE(buf.store(std::move(p), MPI_COMM_WORLD));
  }
  EXPECT_EQ(buf.size(), 2);
  EXPECT_EQ(buf[0].e_ref, 2.0);
  EXPECT_EQ(buf[1].e_ref, 3.0);
  EXPECT_EQ(buf.fresh(), 4);
  buf.new_round();
  EXPECT_EQ(buf.fresh(), 0);
  EXPECT_DOUBLE_EQ(buf.bytes(), 2 * one);
  // the capacity alone
  MLTorch::ReplayBuffer cap(3, 100 * one);
  for (int k = 0; k < 5; ++k) {
    auto p = cap.spare();
    *p = ring_piece();
    p->e_ref = k;
    cap.store(std::move(p), MPI_COMM_WORLD);
  }
  EXPECT_EQ(cap.size(), 3);
  EXPECT_EQ(cap[0].e_ref, 2.0);
  // a piece too large on one rank is stored nowhere
  MLTorch::ReplayBuffer tiny(3, me == nprocs - 1 ? 0.5 * one : 100 * one);
  auto p = tiny.spare();
  *p = ring_piece();
  EXPECT_FALSE(tiny.store(std::move(p), MPI_COMM_WORLD));
  EXPECT_EQ(tiny.size(), 0);
}

TEST(Replay, PicksAreDeterministicAndInRange)
{
  const auto picks = MLTorch::replay_picks(7, 5, 3);
  ASSERT_EQ(picks.size(), 3u);
  for (int k : picks) EXPECT_TRUE(k >= 0 && k < 5);
  EXPECT_EQ(MLTorch::replay_picks(7, 5, 3), picks);
  EXPECT_NE(MLTorch::replay_picks(8, 5, 3), picks);
  EXPECT_EQ(MLTorch::replay_picks(7, 2, 3).size(), 2u);
  EXPECT_TRUE(MLTorch::replay_picks(7, 0, 3).empty());
  // the same picks on every rank
  std::vector<int> all(3 * nprocs);
  MPI_Allgather(picks.data(), 3, MPI_INT, all.data(), 3, MPI_INT, MPI_COMM_WORLD);
  for (int p = 0; p < nprocs; ++p)
    EXPECT_EQ(std::vector<int>(all.begin() + 3 * p, all.begin() + 3 * p + 3), picks);
}

/* ----------------------------------------------------------------------
   the update after a round, on the ring: a fresh configuration and the
   same one replayed give the mean of two equal gradients, i.e. the
   gradient of one (summed over the ranks), bitwise the same on every rank;
   the record restores the state it was taken from
------------------------------------------------------------------------- */

TEST(DistributedTrainer, UpdateAveragesOverRanksAndRestores)
{
  auto model = std::make_shared<MLTorch::Model>(MLTorch::read_file(potentials + "/si_local.pt"),
                                                "si_local.pt", "cpu");
  MLTorch::FinetuneSettings set;
  set.replay_capacity = 4;
  set.replay_mix = 1;
  set.opt.kind = "sgd";
  set.opt.lr = 1e-3;
  MLTorch::DistributedTrainer tr(set, {model}, MPI_COMM_WORLD, MPI_COMM_WORLD, 0);
  auto piece = tr.replay.spare();
  *piece = ring_piece();
  for (std::size_t k = 0; k < piece->fref.size(); ++k) piece->fref[k] = 0.1 * (k % 3) - 0.05 * me;
  piece->natoms = 3.0 * nprocs;
  piece->e_ref = -4.5 * piece->natoms;
  ASSERT_TRUE(tr.replay.store(std::move(piece), MPI_COMM_WORLD));
  tr.end_round();    // stored before this round: eligible for replay

  // the gradient of the stored configuration, summed over the ranks
  auto &state = tr.state();
  state.zero_grad();
  ASSERT_EQ(MLTorch::replay_gradient(tr.replay[0], *model, set, false, MPI_COMM_WORLD), "");
  std::vector<double> mine = state.gradient(), one(mine.size());
  MPI_Allreduce(mine.data(), one.data(), static_cast<int>(mine.size()), MPI_DOUBLE, MPI_SUM,
                MPI_COMM_WORLD);
  double norm = 0.0;
  for (double g : one) norm += g * g;
  ASSERT_GT(norm, 0.0);
  // it stands for this round's fresh configuration; the update replays it
  const double w0[6] = {0, 0, 0, 0, 0, 0};
  tr.round.add(MLTorch::loss_terms(1, 1, 0, 1.0, 0.5, w0, w0, 0.3, 6.0), 0.3, 6.0);
  const std::string before = state.parameters();
  const auto rec = tr.record("hash", {"hash"});
  const auto out = tr.update(me == 0, false, "step 1: ");
  ASSERT_EQ(out.failure, "");
  EXPECT_EQ(out.action, MLTorch::UpdateAction::Step);
  EXPECT_EQ(tr.count.nupdates, 1);
  EXPECT_EQ(out.all.n, 1.0);
  EXPECT_EQ(out.all.ngrad, 2.0);
  ASSERT_EQ(tr.last_grad.size(), one.size());
  for (std::size_t k = 0; k < one.size(); ++k)
    EXPECT_NEAR(tr.last_grad[k], one[k], 1e-12 * (1.0 + std::abs(one[k])));
  std::string first, other;
  const std::string bytes(reinterpret_cast<const char *>(tr.last_grad.data()),
                          sizeof(double) * tr.last_grad.size());
  EXPECT_EQ(MLTorch::first_differing_rank(bytes, MPI_COMM_WORLD, first, other), -1);
  EXPECT_EQ(MLTorch::first_differing_rank(state.parameters(), MPI_COMM_WORLD, first, other), -1);
  EXPECT_NE(state.parameters(), before);
  EXPECT_DOUBLE_EQ(tr.stats[5], 1e-3);    // the learning rate
  EXPECT_EQ(tr.replay.fresh(), 0);        // the round ended
  // back to the recorded state and counters
  tr.restore(rec);
  EXPECT_EQ(state.parameters(), before);
  EXPECT_EQ(tr.count.nupdates, 0);
  EXPECT_EQ(MLTorch::record_mismatch(rec, "m.pt", "hash", {"hash"}), "");
  EXPECT_NE(MLTorch::record_mismatch(rec, "m.pt", "other", {"hash"}).find("pair_coeff loaded m.pt (hash other)"),
            std::string::npos);
  EXPECT_NE(MLTorch::record_mismatch(rec, "m.pt", "hash", {"hash", "h2"}).find("a committee of 1 model(s)"),
            std::string::npos);
}

// uncertainty gating: counted per window; a round where no replica labelled
// anything is no update
TEST(DistributedTrainer, GatedRoundWithoutLabelsIsNoUpdate)
{
  auto model = std::make_shared<MLTorch::Model>(MLTorch::read_file(potentials + "/si_local.pt"),
                                                "si_local.pt", "cpu");
  MLTorch::FinetuneSettings set;
  set.gated = true;
  set.gate_low = 0.1;
  set.gate_high = 0.5;
  MLTorch::DistributedTrainer tr(set, {model}, MPI_COMM_WORLD, MPI_COMM_WORLD, 0);
  EXPECT_FALSE(tr.gate(0.05));
  EXPECT_TRUE(tr.gate(0.2));
  EXPECT_FALSE(tr.gate(0.5));
  EXPECT_EQ(tr.count.nknown, 1);
  EXPECT_EQ(tr.count.nabove, 1);
  const std::string before = tr.state().parameters();
  const auto out = tr.update(me == 0, false, "");
  EXPECT_TRUE(out.empty);
  EXPECT_EQ(tr.count.nempty, 1);
  EXPECT_EQ(tr.count.nupdates, 0);
  EXPECT_EQ(tr.state().parameters(), before);
  // the fingerprint sees the counters and the settings
  const std::string f0 = tr.fingerprint({"h"}, 0, 0);
  EXPECT_NE(f0.find(set.fingerprint()), std::string::npos);
  EXPECT_NE(tr.fingerprint({"h"}, 1, 0), f0);
}

int main(int argc, char **argv)
{
  bool verbose = false;
  return mpi_test_main(argc, argv, me, nprocs, verbose);
}
