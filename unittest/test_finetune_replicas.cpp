/* ----------------------------------------------------------------------
   ML-TORCH: fix torch/finetune across replicas (-partition).
   - Replicas.*      partitions hold bitwise-identical parameters
   - DDP.*           N replicas x 1 configuration == 1 replica x N accumulated
   - ChecksumGuard.* a desynchronised replica stops with the desync ERROR
   - Gated.*         uncertainty-gated labels over uneven replicas
   Run under mpirun; replica tests split MPI_COMM_WORLD into one partition
   per rank (-partition Nx1).
------------------------------------------------------------------------- */

#include "finetune_fixtures.h"

/* ----------------------------------------------------------------------
   2. replicas at different temperatures keep bitwise-identical parameters
------------------------------------------------------------------------- */

TEST(Replicas, BitwiseIdenticalAfterEveryUpdate)
{
  if (nprocs < 2) GTEST_SKIP() << "needs >= 2 MPI ranks";
  Lammps l(MPI_COMM_WORLD, partitions());
  std::string temps, seeds;
  for (int w = 0; w < nprocs; ++w) {
    temps += " " + std::to_string(300 + 400 * w);
    seeds += " " + std::to_string(1001 + w);
  }
  l.cmd("variable T world" + temps);
  l.cmd("variable seed world" + seeds);
  l.cmds(silicon(2, 31, "ortho"));
  l.cmd("velocity all create ${T} ${seed} loop geom");
  l.cmd("pair_style torch");
  l.cmd("pair_coeff * * " + student + " Si");
  l.cmd("fix ft all torch/finetune 1 " + teacher() + " weights 1.0 10.0 0.1 lr 2e-3 log 0 check 1");
  l.cmd("fix md all nve");
  const auto before = l.params();
  l.cmd("run 200 post no");
  const auto after = l.params();

  EXPECT_EQ(l.fix()->updates(), 200);
  EXPECT_EQ(l.fix()->checksums_compared(), 200);    // the checksum compared after every update
  EXPECT_GT(max_diff(before, after), 1e-4);         // training really changed the model

  // bitwise identical on every rank of every partition
  const std::string mine = MLTorch::content_hash(l.fix()->model()->state_bytes());
  std::vector<char> all(17 * nprocs);
  MPI_Allgather(mine.c_str(), 17, MPI_CHAR, all.data(), 17, MPI_CHAR, MPI_COMM_WORLD);
  for (int r = 0; r < nprocs; ++r) EXPECT_EQ(std::string(all.data() + 17 * r), mine) << "rank " << r;

  // ... although the replicas ran different trajectories
  const double temp = l.thermo("temp");
  std::vector<double> temps_all(nprocs);
  MPI_Allgather(&temp, 1, MPI_DOUBLE, temps_all.data(), 1, MPI_DOUBLE, MPI_COMM_WORLD);
  for (int r = 1; r < nprocs; ++r) EXPECT_NE(temps_all[r], temps_all[0]);
  if (me == 0) std::printf("[ replicas ] %d partitions, 200 updates, parameter hash %s\n", nprocs, mine.c_str());

  // outputs 12 and 13: seconds in the fix's steps, of which in the reduction
  const double in_fix = l.fix()->compute_vector(11), in_reduce = l.fix()->compute_vector(12);
  EXPECT_GT(in_fix, 0.0);
  EXPECT_GT(in_reduce, 0.0);
  EXPECT_LT(in_reduce, in_fix);
  if (me == 0)
    std::printf("[ replicas ] the fix took %.3f s on rank 0, %.1f%% of it in the cross-replica reduction\n",
                in_fix, 100.0 * in_reduce / in_fix);
}

// the anchor term (L2-SP) adds its gradient on each replica after the
// reduction: the replicas stay bitwise identical
TEST(Replicas, AnchorKeepsThemIdentical)
{
  if (nprocs < 2) GTEST_SKIP() << "needs >= 2 MPI ranks";
  Lammps l(MPI_COMM_WORLD, partitions());
  int world = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world);    // one rank per partition
  l.cmds(silicon(2, 700 + world, "ortho"));
  l.cmds({"velocity all create 900 4928 loop geom", "pair_style torch", "pair_coeff * * " + student + " Si",
          "fix ft all torch/finetune 1 " + teacher() + " weights 1.0 10.0 0.1 lr 2e-3 anchor 20 log 0 check 1",
          "fix md all nve", "run 50 post no"});
  EXPECT_EQ(l.fix()->checksums_compared(), 50);
  const double term = l.fix()->compute_vector(17);
  EXPECT_GT(term, 0.0);
  const std::string mine = MLTorch::content_hash(l.fix()->model()->state_bytes());
  std::vector<char> all(17 * nprocs);
  MPI_Allgather(mine.c_str(), 17, MPI_CHAR, all.data(), 17, MPI_CHAR, MPI_COMM_WORLD);
  for (int r = 0; r < nprocs; ++r) EXPECT_EQ(std::string(all.data() + 17 * r), mine) << "rank " << r;
  if (me == 0)
    std::printf("[ replicas ] anchor 20, %d partitions, 50 updates: anchor term %.3g, parameter hash %s\n",
                nprocs, term, mine.c_str());
}

/* ----------------------------------------------------------------------
   3. DDP equivalence: N replicas with one configuration each == one
   replica accumulating the same N configurations
------------------------------------------------------------------------- */

static std::string ddp_fix(int accumulate)
{
  return "fix ft all torch/finetune 1 " + teacher() +
      " weights 1.0 10.0 0.5 optimizer sgd lr 1e-3 log 0 check 1 accumulate " + std::to_string(accumulate);
}

TEST(DDP, ReplicasEqualAccumulation)
{
  if (nprocs < 2) GTEST_SKIP() << "needs >= 2 MPI ranks";
  std::vector<double> initial, replicas;
  {
    Lammps l(MPI_COMM_WORLD, partitions());
    int world = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &world);    // one rank per partition
    l.cmds(silicon(2, 500 + world, "ortho"));
    l.cmd("pair_style torch");
    l.cmd("pair_coeff * * " + potentials + "/si_local.pt Si");
    l.cmd(ddp_fix(1));
    initial = l.params();
    l.cmd("run 1 post no");
    EXPECT_EQ(l.fix()->updates(), 1);
    EXPECT_GE(l.fix()->checksums_compared(), 1);
    replicas = l.params();
  }
  // every replica holds the same parameters, bitwise
  {
    std::vector<double> lo(replicas.size()), hi(replicas.size());
    MPI_Allreduce(replicas.data(), lo.data(), static_cast<int>(lo.size()), MPI_DOUBLE, MPI_MIN,
                  MPI_COMM_WORLD);
    MPI_Allreduce(replicas.data(), hi.data(), static_cast<int>(hi.size()), MPI_DOUBLE, MPI_MAX,
                  MPI_COMM_WORLD);
    EXPECT_EQ(max_diff(lo, hi), 0.0) << "the replicas' parameters differ";
  }
  if (me != 0) return;
  Lammps ref(MPI_COMM_SELF);
  ref.cmds(silicon(2, 500, "ortho"));
  ref.cmd("pair_style torch");
  ref.cmd("pair_coeff * * " + potentials + "/si_local.pt Si");
  ref.cmd(ddp_fix(nprocs));
  for (int w = 0; w < nprocs; ++w) {
    if (w > 0) {
      ref.cmd("delete_atoms group all");
      ref.cmd("create_atoms 1 box");
      ref.cmd("displace_atoms all random 0.12 0.12 0.12 " + std::to_string(500 + w) + " units box");
    }
    ref.cmd("run 1 post no");
    EXPECT_EQ(ref.fix()->updates(), w + 1 == nprocs ? 1 : 0);
  }
  const auto accumulated = ref.params();
  ASSERT_EQ(accumulated.size(), replicas.size());
  std::vector<double> d_rep(initial.size()), d_acc(initial.size());
  for (std::size_t k = 0; k < initial.size(); ++k) {
    d_rep[k] = replicas[k] - initial[k];
    d_acc[k] = accumulated[k] - initial[k];
  }
  const double dev = max_diff(replicas, accumulated) / max_abs(accumulated);
  const double dev_step = max_diff(d_rep, d_acc) / max_abs(d_acc);
  std::printf("[ DDP ] %d replicas x 1 vs 1 x %d accumulated: parameters %.3g, update step %.3g "
              "(max relative), largest step %.3g\n",
              nprocs, nprocs, dev, dev_step, max_abs(d_acc));
  EXPECT_GT(max_abs(d_acc), 1e-6);
  EXPECT_LE(dev, 1e-12);
  EXPECT_LE(dev_step, 1e-9);
}

/* ----------------------------------------------------------------------
   6. a replica whose parameters drift away stops every replica
------------------------------------------------------------------------- */

TEST(ChecksumGuard, DesyncedReplicaStopsTheRun)
{
  if (nprocs < 2) GTEST_SKIP() << "needs >= 2 MPI ranks";
  Lammps l(MPI_COMM_WORLD, partitions());
  l.cmds(silicon(2, 31, "ortho"));
  l.cmd("velocity all create 600 4928 loop geom");
  l.cmd("pair_style torch");
  l.cmd("pair_coeff * * " + student + " Si");
  l.cmd("fix ft all torch/finetune 1 " + teacher() + " log 0 check 1");
  l.cmd("fix md all nve");
  l.cmd("run 3 post no");
  if (me == nprocs - 1) {    // the last replica's parameters are changed behind its back
    std::string s = l.fix()->model()->state_bytes();
    double v;
    std::memcpy(&v, s.data(), sizeof(double));
    v *= 1.0 + 1e-12;
    std::memcpy(s.data(), &v, sizeof(double));
    l.fix()->model()->load_state_bytes(s);
  }
  std::string msg;
  try {
    l.cmd("run 3 post no");
  } catch (std::exception &e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("model parameters differ between ranks/replicas after update 4"),
            std::string::npos)
      << "got: '" << msg << "'";
}

/* ----------------------------------------------------------------------
   uncertainty-gated labelling across replicas: each replica labels its
   configuration only when the committee is unsure of it (a perfect
   crystal, where every member's forces vanish by symmetry, is never
   labelled). With uneven label counts per replica, the update's gradient
   is the mean over the labelled configurations (weighted by counts, not
   by replicas) and equals one process accumulating the same
   configurations; an update round with no label anywhere changes nothing
------------------------------------------------------------------------- */

static std::string gated_fix(int accumulate, bool gated)
{
  return "fix ft all torch/finetune 1 " + teacher() +
      " weights 1.0 10.0 0.5 optimizer sgd lr 1e-3 log 0 check 1 accumulate " +
      std::to_string(accumulate) + (gated ? " uncertainty 1e-6 1e6" : "");
}

// a perfect crystal (seed 0) or one displaced with this seed
static void configuration(Lammps &l, int seed)
{
  l.cmd("delete_atoms group all");
  l.cmd("create_atoms 1 box");
  if (seed > 0)
    l.cmd("displace_atoms all random 0.12 0.12 0.12 " + std::to_string(seed) + " units box");
}

TEST(Gated, UnevenReplicasEqualOneProcess)
{
  if (nprocs < 2) GTEST_SKIP() << "needs >= 2 MPI ranks";
  // which of the 3 checks of the update each replica labels: 1, 3, 0, 1 labels
  const int plan[4][3] = {{1, 0, 0}, {1, 1, 1}, {0, 0, 0}, {0, 1, 0}};
  auto seed_of = [](int w, int k) { return 700 + 10 * w + k; };
  int world = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world);    // one rank per partition
  std::vector<double> initial, gated_grad, after_empty, before_empty;
  std::string hash;
  {
    Lammps l(MPI_COMM_WORLD, partitions());
    l.cmds(silicon(2, 1, "ortho"));
    l.cmd("pair_style torch");
    l.cmd("pair_coeff * * " + committee_files() + " Si");
    l.cmd(gated_fix(3, true));
    initial = l.params();
    for (int k = 0; k < 3; ++k) {
      configuration(l, plan[world % 4][k] ? seed_of(world % 4, k) : 0);
      l.cmd("run 1 post no");
    }
    EXPECT_EQ(l.fix()->updates(), 1);
    gated_grad = l.fix()->last_gradient();
    EXPECT_EQ(l.fix()->compute_vector(13), plan[world % 4][0] + plan[world % 4][1] + plan[world % 4][2]);

    // a round where no replica labels: no update, parameters bitwise unchanged
    before_empty = l.params();
    for (int k = 0; k < 3; ++k) {
      configuration(l, 0);
      l.cmd("run 1 post no");
    }
    EXPECT_EQ(l.fix()->updates(), 1);
    after_empty = l.params();
    EXPECT_EQ(std::memcmp(before_empty.data(), after_empty.data(),
                          before_empty.size() * sizeof(double)), 0);
    // identical parameters of both members on every rank of every replica
    hash = MLTorch::content_hash(l.fix()->model()->state_bytes() +
                                 l.fix()->member(1)->state_bytes());
  }
  std::vector<char> all(17 * nprocs);
  MPI_Allgather(hash.c_str(), 17, MPI_CHAR, all.data(), 17, MPI_CHAR, MPI_COMM_WORLD);
  for (int r = 0; r < nprocs; ++r) EXPECT_EQ(std::string(all.data() + 17 * r), hash) << "rank " << r;
  if (me != 0) return;

  // one process, no gating, accumulating exactly the labelled configurations
  int nlabels = 0;
  for (int w = 0; w < nprocs; ++w)
    for (int k = 0; k < 3; ++k) nlabels += plan[w % 4][k];
  Lammps ref(MPI_COMM_SELF);
  ref.cmds(silicon(2, 1, "ortho"));
  ref.cmd("pair_style torch");
  ref.cmd("pair_coeff * * " + committee_files() + " Si");
  ref.cmd(gated_fix(nlabels, false));
  for (int w = 0; w < nprocs; ++w)
    for (int k = 0; k < 3; ++k)
      if (plan[w % 4][k]) {
        configuration(ref, seed_of(w % 4, k));
        ref.cmd("run 1 post no");
      }
  EXPECT_EQ(ref.fix()->updates(), 1);
  const auto &g_ref = ref.fix()->last_gradient();
  ASSERT_EQ(g_ref.size(), gated_grad.size());
  // both members' gradients, concatenated
  ASSERT_EQ(g_ref.size(), static_cast<std::size_t>(2 * ref.fix()->model()->num_trainable()));
  const double dev = max_diff(gated_grad, g_ref) / max_abs(g_ref);
  std::printf("[ gated ] %d replicas labelled %d configurations unevenly: gradient vs one process "
              "%.3g (max relative), |g|max %.4g\n",
              nprocs, nlabels, dev, max_abs(g_ref));
  EXPECT_GT(max_abs(g_ref), 1e-3);
  EXPECT_LE(dev, 1e-14);    // doc/fix_torch_finetune.rst; measured 2.1e-16 (2 replicas), 6.8e-16 (4)
}
