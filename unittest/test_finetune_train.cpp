/* ----------------------------------------------------------------------
   ML-TORCH: fix torch/finetune.
   - Replicas.*      partitions hold bitwise-identical parameters
   - DDP.*           N replicas x 1 configuration == 1 replica x N accumulated
   - ChecksumGuard.* a desynchronised replica stops with the desync ERROR
   - Learn.*         distilling SW into a spoilt student cuts the force error
   - Restart.*       write_restart/read_restart continues the same training
   - Decisions.*     freeze, skip and rollback
   - Gated.*         uncertainty-gated labels over uneven replicas
   Run under mpirun; replica tests split MPI_COMM_WORLD into one partition
   per rank (-partition Nx1).
------------------------------------------------------------------------- */

#include "finetune_fixtures.h"

#include <filesystem>
#include <functional>

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
   4. distilling SW into the spoilt student halves the force error
------------------------------------------------------------------------- */

TEST(Learn, DistillationCutsForceError)
{
  if (nprocs > 1) GTEST_SKIP() << "runs on one rank";
  Lammps l(MPI_COMM_SELF);
  l.cmds(silicon(2, 4242, "ortho"));
  l.cmd("velocity all create 1200 4928 loop geom");
  l.cmd("pair_style torch");
  l.cmd("pair_coeff * * " + student + " Si");
  l.cmd("fix ft all torch/finetune 2 " + teacher() + " weights 1.0 10.0 0.1 lr 2e-3 log 0");
  l.cmd("fix md all nve");
  std::vector<double> f_rmse;
  for (int chunk = 0; chunk < 50; ++chunk) {    // 400 steps, 200 updates
    l.cmd("run 8 post no");
    f_rmse.push_back(l.fix()->compute_vector(2));
  }
  // force RMSE of fresh configurations, before the update that uses them
  const double first = (f_rmse[0] + f_rmse[1]) / 2.0;
  double last = 0.0;
  for (int k = 40; k < 50; ++k) last += f_rmse[k] / 10.0;
  std::printf("[ learn ] force RMSE vs SW: first updates %.4f eV/A, last 40 updates %.4f eV/A "
              "(ratio %.3f) after %lld updates\n",
              first, last, last / first, static_cast<long long>(l.fix()->updates()));
  EXPECT_EQ(l.fix()->updates(), 200);
  EXPECT_GT(first, 0.2);
  EXPECT_LT(last, 0.5 * first);
}

/* ----------------------------------------------------------------------
   the model as a pair_style hybrid sub-style: the teacher labels the whole
   system and the fix removes the other sub-styles' share. Argon atoms of
   two types: type 1-1 through the model (LJ as lj/cut 8.5 with trainable
   eps and sigma, unittest/models/lj_trainable_Ar.pt), the
   rest through lj/cut with the same parameters, and the teacher lj/cut on
   all pairs. The model's share of the labels is then exactly the model:
   every residual vanishes; the teacher's whole forces would leave the
   cross terms (review defect: the documented NULL-teacher route stopped
   with "All pair coeffs are not set")
------------------------------------------------------------------------- */

TEST(Learn, HybridSubStyleLearnsItsOwnShare)
{
  if (nprocs > 1) GTEST_SKIP() << "runs on one rank";
  Lammps l(MPI_COMM_SELF);
  l.cmds({"units metal", "atom_modify map array", "lattice fcc 5.26", "region box block 0 3 0 3 0 3",
          "create_box 2 box", "create_atoms 1 box", "mass * 39.948",
          "set type 1 type/fraction 2 0.3 1234", "displace_atoms all random 0.2 0.2 0.2 4321 units box",
          "pair_style hybrid torch lj/cut 8.5",
          "pair_coeff * * torch " + std::string(ML_TORCH_TEST_MODELS_DIR) + "/lj_trainable_Ar.pt Ar NULL",
          "pair_coeff 1 2 lj/cut 0.0104 3.40", "pair_coeff 2 2 lj/cut 0.0104 3.40",
          "fix ft all torch/finetune 1 teacher \"lj/cut 8.5\" \"* * 0.0104 3.40\" weights 1 1 1 "
          "optimizer sgd lr 1e-12 log 0",
          "fix md all nve", "run 1 post no"});
  ASSERT_EQ(l.fix()->updates(), 1);
  const double e_rmse = l.fix()->compute_vector(1), f_rmse = l.fix()->compute_vector(2),
               w_rmse = l.fix()->compute_vector(3);
  // the cross terms the subtraction removes: the type 1 - type 2 forces
  Lammps c(MPI_COMM_SELF);
  c.cmds({"units metal", "atom_modify map array", "lattice fcc 5.26", "region box block 0 3 0 3 0 3",
          "create_box 2 box", "create_atoms 1 box", "mass * 39.948",
          "set type 1 type/fraction 2 0.3 1234", "displace_atoms all random 0.2 0.2 0.2 4321 units box",
          "pair_style lj/cut 8.5", "pair_coeff * * 0.0 3.40", "pair_coeff 1 2 0.0104 3.40",
          "run 0 post no"});
  const auto fx = c.gather("f", 3);
  double cross = 0.0;
  for (double v : fx) cross = std::max(cross, std::fabs(v));
  std::printf("[ hybrid ] residuals of the model's share: energy %.2e eV/atom, force %.2e eV/A, "
              "virial %.2e eV/atom; cross-type forces removed up to %.3f eV/A\n",
              e_rmse, f_rmse, w_rmse, cross);
  EXPECT_GT(cross, 0.01);
  EXPECT_LE(f_rmse, 1e-12);
  EXPECT_LE(e_rmse, 1e-12);
  EXPECT_LE(w_rmse, 1e-12);
}

/* ----------------------------------------------------------------------
   the same input twice gives bitwise the same trajectory and model (one
   rank, fixed thread count); write_data + read_data reproduces the state
------------------------------------------------------------------------- */

TEST(Learn, SameInputTwiceIsBitwiseIdentical)
{
  if (nprocs > 1) GTEST_SKIP() << "runs on one rank";
  const std::string data = ::testing::TempDir() + "/twice.data";
  std::vector<double> f[2], p[2];
  double pe[2] = {0, 0};
  for (int k = 0; k < 2; ++k) {
    Lammps l(MPI_COMM_SELF);
    l.cmds(silicon(2, 4242, "ortho"));
    l.cmds({"velocity all create 1200 4928 loop geom", "pair_style torch",
            "pair_coeff * * " + student + " Si",
            "fix ft all torch/finetune 2 " + teacher() + " weights 1.0 10.0 0.1 lr 2e-3 log 0",
            "fix md all nve", "run 20 post no"});
    pe[k] = l.thermo("pe");
    f[k] = l.gather("f", 3);
    p[k] = l.params();
    if (k == 1) l.cmd("write_data " + data);
  }
  EXPECT_EQ(pe[0], pe[1]);
  EXPECT_EQ(f[0], f[1]);
  EXPECT_EQ(p[0], p[1]);
  // the data file holds the positions at full precision: the trained
  // parameters on the read state give the forces of the run that wrote it
  Lammps r(MPI_COMM_SELF);
  r.cmds({"units metal", "atom_modify map array", "read_data " + data, "pair_style torch",
          "pair_coeff * * " + student + " Si",
          "fix ft all torch/finetune 2 " + teacher() + " weights 1.0 10.0 0.1 lr 2e-3 log 0"});
  r.fix()->model()->load_state_bytes(
      std::string(reinterpret_cast<const char *>(p[1].data()), p[1].size() * sizeof(double)));
  r.cmd("run 0 post no");
  const auto fr = r.gather("f", 3);
  double dev = 0.0, scale = 0.0;
  for (std::size_t i = 0; i < fr.size(); ++i) {
    dev = std::max(dev, std::fabs(fr[i] - f[1][i]));
    scale = std::max(scale, std::fabs(f[1][i]));
  }
  std::printf("[ determinism ] two runs: pe, forces and %zu parameters bitwise equal; write_data + "
              "read_data: forces to %.2e relative\n", p[0].size(), dev / scale);
  EXPECT_LE(dev / scale, 1e-12);
  std::remove(data.c_str());
}

/* ----------------------------------------------------------------------
   a step that ends in an update runs the model once for MD: the force call
   leaves it out and the fix adds the updated model's forces after the
   update (the energy and virial of the configuration from the training
   pass). The same run with a post_force fix defined before fix
   torch/finetune (fix addforce 0 0 0, which changes no force), or with
   per-atom energies asked for on every update step (a dump of pe/atom),
   takes the other path, a full force call and the refresh after the
   update: all give the same pressure, energy, forces, positions and
   parameters, and forces equal to a fresh force call (the pair style's
   own scatter) of the updated model
------------------------------------------------------------------------- */

TEST(Deferred, OneModelCallPerUpdateStep)
{
  std::vector<double> f[3], x[3], p[3];
  double pe[3] = {0, 0, 0}, press[3] = {0, 0, 0}, calls[3][2] = {{0, 0}, {0, 0}, {0, 0}};
  for (int k = 0; k < 3; ++k) {
    Lammps l;
    l.cmds(silicon(2, 4242, "ortho"));
    l.cmds({"velocity all create 1200 4928 loop geom", "pair_style torch",
            "pair_coeff * * " + student + " Si"});
    if (k == 1) l.cmd("fix zero all addforce 0.0 0.0 0.0");
    if (k == 2) l.cmds({"compute pa all pe/atom", "dump d all custom 2 /dev/null id c_pa"});
    l.cmds({"fix ft all torch/finetune 2 " + teacher() + " weights 1.0 10.0 0.1 lr 2e-3 log 0",
            "fix md all nve", "thermo_style custom step pe press", "run 20 post no"});
    pe[k] = l.thermo("pe");
    press[k] = l.thermo("press");
    f[k] = l.gather("f", 3);
    x[k] = l.gather("x", 3);
    p[k] = l.params();
    int dim = -1;
    const auto *c = static_cast<double *>(l.lmp->force->pair->extract("model_calls", dim));
    ASSERT_NE(c, nullptr);
    ASSERT_EQ(dim, 1);
    calls[k][0] = c[0];
    calls[k][1] = c[1];
    // step 20 ended with an update: the forces the fix left for the last
    // half-kick are those of a fresh force call of the updated model
    l.cmds({"unfix ft", "run 0 post no"});
    const auto fresh = l.gather("f", 3);
    const double dfresh = max_diff(f[k], fresh) / max_abs(fresh);
    if (me == 0)
      std::printf("[ deferred ] path %d: forces after the last update vs a fresh force call: "
                  "%.2e relative\n", k, dfresh);
    EXPECT_LE(dfresh, 1e-13);
  }
  // the set-up and the 10 steps without an update run the model; the 10
  // update steps (every 2nd) leave it to the fix
  EXPECT_EQ(calls[0][0], 11.0);
  EXPECT_EQ(calls[0][1], 10.0);
  for (int k = 1; k < 3; ++k) {
    EXPECT_EQ(calls[k][0], 21.0);
    EXPECT_EQ(calls[k][1], 0.0);
    const double df = max_diff(f[0], f[k]) / max_abs(f[k]);
    const double dx = max_diff(x[0], x[k]);
    const double dp = max_diff(p[0], p[k]) / max_abs(p[k]);
    if (me == 0)
      std::printf("[ deferred ] one model call vs force call + refresh (%s), 10 updates: pe %.2e, "
                  "press %.2e relative; forces %.2e relative, positions %.2e A, parameters %.2e "
                  "relative\n", k == 1 ? "earlier post_force fix" : "per-atom energy",
                  std::fabs(pe[0] - pe[k]) / std::fabs(pe[k]),
                  std::fabs(press[0] - press[k]) / std::fabs(press[k]), df, dx, dp);
    // the doc's "checked to 1e-14" (measured: pe 1.3e-16, press 7.3e-16,
    // forces 9.9e-15 of the largest, positions 1.8e-15 A, parameters 3.9e-19)
    EXPECT_NEAR(pe[0], pe[k], 1e-14 * std::fabs(pe[k]));
    EXPECT_NEAR(press[0], press[k], 1e-14 * std::fabs(press[k]));
    EXPECT_LE(df, 2e-14);
    EXPECT_LE(dx, 1e-14);
    EXPECT_LE(dp, 1e-16);
  }
}

/* ----------------------------------------------------------------------
   a compiled student (potentials/si_local.pt2): training runs its TorchScript
   twin, and every update reaches the compiled code without a reload. After
   10 updates the compiled forces equal the TorchScript model's forces with
   the updated parameters; the model saved by the fix is TorchScript again
------------------------------------------------------------------------- */

TEST(Learn, CompiledStudentRunsUpdatedParameters)
{
  if (nprocs > 1) GTEST_SKIP() << "runs on one rank";
  const std::string data = ::testing::TempDir() + "/compiled.data";
  const std::string saved = ::testing::TempDir() + "/compiled_trained.pt";
  std::vector<double> f_compiled, f_start, p;
  {
    Lammps l(MPI_COMM_SELF);
    l.cmds(silicon(2, 4242, "ortho"));
    l.cmds({"velocity all create 1200 4928 loop geom", "pair_style torch",
            "pair_coeff * * " + potentials + "/si_local.pt2 Si"});
    ASSERT_TRUE(dynamic_cast<LAMMPS_NS::PairTorch *>(l.lmp->force->pair)->model()->is_compiled());
    l.cmds({"fix ft all torch/finetune 2 " + teacher() + " weights 1.0 10.0 0.1 lr 2e-3 log 0 save 20 " +
                saved,
            "fix md all nve", "run 20 post no"});
    EXPECT_EQ(l.fix()->model(), dynamic_cast<LAMMPS_NS::PairTorch *>(l.lmp->force->pair)->model());
    l.cmds({"unfix ft", "run 0 post no"});    // forces of the compiled code, updated parameters
    f_compiled = l.gather("f", 3);
    l.cmd("write_data " + data);
    Lammps s(MPI_COMM_SELF);    // the untrained compiled model on the same positions
    s.cmds({"units metal", "atom_modify map array", "read_data " + data, "pair_style torch",
            "pair_coeff * * " + potentials + "/si_local.pt2 Si", "run 0 post no"});
    f_start = s.gather("f", 3);
  }
  // the TorchScript model with the trained parameters, read from the fix's save
  Lammps r(MPI_COMM_SELF);
  r.cmds({"units metal", "atom_modify map array", "read_data " + data, "pair_style torch",
          "pair_coeff * * " + saved + " Si", "run 0 post no"});
  ASSERT_FALSE(dynamic_cast<LAMMPS_NS::PairTorch *>(r.lmp->force->pair)->model()->is_compiled());
  const auto f_twin = r.gather("f", 3);
  const double scale = max_abs(f_twin);
  const double dev = max_diff(f_compiled, f_twin) / scale;
  const double moved = max_diff(f_start, f_twin) / scale;
  std::printf("[ compiled ] after 10 updates: compiled vs TorchScript forces %.2e relative; the updates "
              "moved the forces by %.2e\n", dev, moved);
  EXPECT_LE(dev, 1e-10);
  EXPECT_GT(moved, 1e-4);    // the updates really changed the model
  std::remove(data.c_str());
  std::remove(saved.c_str());
}

/* ----------------------------------------------------------------------
   5. 200 steps == 100 steps + write_restart + read_restart + 100 steps
------------------------------------------------------------------------- */

static std::string restart_fix(const std::string &extra = "")
{
  return "fix ft all torch/finetune 2 " + teacher() +
      " weights 1.0 10.0 0.1 lr 1e-3 optimizer adamw weight_decay 1e-4 schedule exp 0.99 clip 10 "
      "rollback 50 log 0" + extra;
}

// `tol`: the parameters' largest relative difference allowed (about 10x
// what was measured: 4.1e-19 for the student, 7.0e-19 compiled, 4.8e-20
// for the gated committee, 1.2e-15 with rollbacks at a learning rate 50x
// too large, where the parameters grow and cancel)
static void restart_continues_exactly(const std::string &model_file, const std::string &extra = "",
                                      int min_updates = 45, int min_rollbacks = 0, double tol = 5e-18)
{
  const std::string file = ::testing::TempDir() + "/finetune.restart";
  std::vector<std::string> setup = silicon(2, 99, "ortho");
  setup.push_back("velocity all create 900 4928 loop geom");

  Lammps a(MPI_COMM_SELF);
  a.cmds(setup);
  a.cmds({"pair_style torch", "pair_coeff * * " + model_file + " Si", restart_fix(extra),
          "fix md all nve", "run 200 post no"});
  const auto pa = a.params();
  const std::string all_a = a.fix()->member(a.fix()->member_count() - 1)->state_bytes();
  const double pe_a = a.thermo("pe"), ke_a = a.thermo("ke");
  const auto updates_a = a.fix()->updates();
  std::vector<double> va;
  for (int k = 0; k < 17; ++k)
    if (k != 11 && k != 12) va.push_back(a.fix()->compute_vector(k));

  decltype(a.fix()->updates()) updates_b1 = 0;
  std::string good_b1;
  {
    Lammps b1(MPI_COMM_SELF);
    b1.cmds(setup);
    b1.cmds({"pair_style torch", "pair_coeff * * " + model_file + " Si", restart_fix(extra),
             "fix md all nve", "run 100 post no", "write_restart " + file});
    updates_b1 = b1.fix()->updates();
    good_b1 = b1.fix()->good_parameters();
  }
  // one update every 2 steps, less any the fix skipped (a spike or rollback)
  EXPECT_GE(updates_b1, min_updates);
  EXPECT_LE(updates_b1, 50);
  // rollbacks before and after the restart: the loss average and the last
  // good parameters and optimizer state must come through it
  if (min_rollbacks > 0) {
    EXPECT_GE(va[8], min_rollbacks) << "rollbacks in the uninterrupted run";
  }
  Lammps b2(MPI_COMM_SELF);
  b2.cmds({"read_restart " + file, "pair_style torch", "pair_coeff * * " + model_file + " Si",
           restart_fix(extra), "fix md all nve"});
  EXPECT_EQ(b2.fix()->updates(), updates_b1);
  // the state the next rollback returns to, bitwise (the continued run
  // alone may not show it: the first update after the restart that is a
  // step keeps a new one)
  EXPECT_EQ(b2.fix()->good_parameters(), good_b1);
  if (min_rollbacks > 0) EXPECT_FALSE(good_b1.empty());
  b2.cmd("run 100 post no");
  const auto pb = b2.params();
  std::vector<double> vb;
  for (int k = 0; k < 17; ++k)
    if (k != 11 && k != 12) vb.push_back(b2.fix()->compute_vector(k));
  // the last committee member too (the same as the first for one model)
  const auto as_doubles = [](const std::string &bytes) {
    std::vector<double> v(bytes.size() / sizeof(double));
    std::memcpy(v.data(), bytes.data(), v.size() * sizeof(double));
    return v;
  };
  const auto last_a = as_doubles(all_a);
  const auto last_b = as_doubles(b2.fix()->member(b2.fix()->member_count() - 1)->state_bytes());
  EXPECT_LE(max_diff(last_a, last_b) / max_abs(last_a), 1e-10);

  if (extra.find("uncertainty") != std::string::npos) {
    // the gate both labelled and saved teacher calls (outputs 14 and 15)
    std::printf("[ restart ] gated: %g teacher calls made, %g saved\n", b2.fix()->compute_vector(13),
                b2.fix()->compute_vector(14));
    EXPECT_GT(b2.fix()->compute_vector(13), 10.0);
    EXPECT_GT(b2.fix()->compute_vector(14), 10.0);
  }
  const double dp = max_diff(pa, pb) / max_abs(pa);
  std::printf("[ restart ] parameters %.3g (max relative), pe %.12g vs %.12g, loss %.10g vs %.10g\n",
              dp, pe_a, b2.thermo("pe"), va[0], vb[0]);
  EXPECT_EQ(b2.fix()->updates(), updates_a);
  EXPECT_LE(dp, tol);
  EXPECT_NEAR(b2.thermo("pe"), pe_a, 1e-10 * std::fabs(pe_a));
  EXPECT_NEAR(b2.thermo("ke"), ke_a, 1e-9 * std::fabs(ke_a));
  for (std::size_t k = 0; k < va.size(); ++k)
    EXPECT_NEAR(vb[k], va[k], 1e-8 * std::fabs(va[k]) + 1e-14) << k;
  std::remove(file.c_str());
}

TEST(Restart, ContinuesExactly)
{
  if (nprocs > 1) GTEST_SKIP() << "runs on one rank";
  restart_continues_exactly(student);
}

// a compiled student: the restart file holds its TorchScript twin's state,
// which the compiled code reads after read_restart as after every update
// rollbacks firing on both sides of the restart (a learning rate far too
// large): the running loss average, the last good parameters and their
// optimizer state are in the restart record
TEST(Restart, RollbackStateContinuesExactly)
{
  if (nprocs > 1) GTEST_SKIP() << "runs on one rank";
  restart_continues_exactly(student, " lr 0.05 rollback 1.5", 0, 4, 1e-14);
}

TEST(Restart, CompiledStudentContinuesExactly)
{
  if (nprocs > 1) GTEST_SKIP() << "runs on one rank";
  restart_continues_exactly(potentials + "/si_local.pt2", "", 45, 0, 7e-18);
}

// a committee with uncertainty-gated labels: every member's parameters and
// optimizer state and the gating counters survive the restart
TEST(Restart, GatedCommitteeContinuesExactly)
{
  if (nprocs > 1) GTEST_SKIP() << "runs on one rank";
  restart_continues_exactly(potentials + "/si_local.pt " + test_models + "/si_local_perturbed.pt",
                            " uncertainty 0.08 1e6", 0, 0, 5e-19);
}

/* ----------------------------------------------------------------------
   train/freeze select parameters; skip and rollback decisions are taken
   from reduced values, so every rank and replica agrees (the checksum
   after every update would stop the run otherwise)
------------------------------------------------------------------------- */

TEST(Decisions, FreezeKeepsParametersFixed)
{
  Lammps l(MPI_COMM_WORLD);
  hot_student(l, 5);
  l.cmd("fix ft all torch/finetune 1 " + teacher() + " log 0 train nets freeze nets.0.4");
  const auto names = l.fix()->model()->parameter_names();
  const auto sizes = l.fix()->model()->parameter_sizes();
  const auto before = l.params();
  l.cmd("run 5 post no");
  const auto after = l.params();
  std::size_t off = 0;
  for (std::size_t k = 0; k < names.size(); ++k) {
    double change = 0.0;
    for (int64_t q = 0; q < sizes[k]; ++q) change = std::max(change, std::fabs(after[off + q] - before[off + q]));
    const bool trained = names[k].rfind("nets", 0) == 0 && names[k].rfind("nets.0.4", 0) != 0;
    if (trained)
      EXPECT_GT(change, 0.0) << names[k];
    else
      EXPECT_EQ(change, 0.0) << names[k];
    off += sizes[k];
  }
  EXPECT_EQ(l.fix()->last_gradient().size(), 32u * 80 + 32 + 32 * 32 + 32);
}

/* ----------------------------------------------------------------------
   the optimizers, schedules, momentum and clipping as the fix applies them:
   each update's parameter change against the textbook formula evaluated on
   the update's own gradient (the probe's last_gradient(), before clipping),
   with the learning rate of output 6 and the norm of output 5
------------------------------------------------------------------------- */

namespace {
struct Update {
  std::vector<std::vector<double>> before, after;    // per member
  std::vector<double> grad;                          // all members, model order
  double lr, gnorm;
};

// `n` updates of fix torch/finetune `args` (every step), one run each
std::vector<Update> updates_of(const std::string &args, int n, const std::string &files = student)
{
  Lammps l(MPI_COMM_WORLD);
  l.cmds(silicon(2, 5, "ortho"));
  l.cmds({"velocity all create 900 4928 loop geom", "pair_style torch", "pair_coeff * * " + files + " Si",
          "fix md all nve", "fix ft all torch/finetune 1 " + teacher() + " log 0 " + args});
  auto members = [&] {
    std::vector<std::vector<double>> p;
    for (int m = 0; m < l.fix()->member_count(); ++m) {
      // the parameters (all trainable here) come first, then the buffers
      const auto *model = l.fix()->member(m);
      EXPECT_EQ(model->num_trainable(), model->num_parameters());
      const std::string b = model->state_bytes();
      p.emplace_back(model->num_parameters());
      std::memcpy(p.back().data(), b.data(), p.back().size() * sizeof(double));
    }
    return p;
  };
  std::vector<Update> u;
  for (int k = 0; k < n; ++k) {
    Update up;
    up.before = members();
    l.cmd("run 1 post no");
    up.after = members();
    up.grad = l.fix()->last_gradient();
    up.lr = l.fix()->compute_vector(5);
    up.gnorm = l.fix()->compute_vector(4);
    EXPECT_EQ(l.fix()->updates(), k + 1);
    u.push_back(std::move(up));
  }
  return u;
}

double worst_step_error = 0.0;    // reported by each test

double norm(const std::vector<double> &v, std::size_t off = 0, std::size_t n = 0)
{
  if (n == 0) n = v.size() - off;
  double s = 0.0;
  for (std::size_t k = off; k < off + n; ++k) s += v[k] * v[k];
  return std::sqrt(s);
}

// largest |after - before - want| over the largest |want|, less the
// rounding of the parameter itself (after = before + step, rounded to
// half an ulp of the parameter, which is large beside small steps)
double step_error(const Update &u, const std::function<double(std::size_t, double)> &want, int m = 0,
                  std::size_t off = 0)
{
  const auto &b = u.before[m], &a = u.after[m];
  double err = 0.0, scale = 0.0;
  for (std::size_t k = 0; k < b.size(); ++k) {
    const double w = want(off + k, b[k]);
    const double rounding = 1.2e-16 * std::max(std::fabs(a[k]), std::fabs(b[k]));
    err = std::max(err, std::fabs(a[k] - b[k] - w) - rounding);
    scale = std::max(scale, std::fabs(w));
  }
  EXPECT_GT(scale, 0.0);
  worst_step_error = std::max(worst_step_error, err / scale);
  return err / scale;
}
}    // namespace

TEST(Optimizers, SgdSchedulesAndMomentum)
{
  if (nprocs > 1) GTEST_SKIP() << "one process";
  worst_step_error = 0.0;
  const double lr = 1e-3;
  // the schedules' learning rates, update u = 0, 1, ...
  struct Case {
    std::string args;
    std::function<double(int)> lr_of;
  };
  const std::vector<Case> cases{
      {"schedule exp 0.5", [&](int u) { return lr * std::pow(0.5, u); }},
      {"schedule step 2 0.1", [&](int u) { return lr * std::pow(0.1, u / 2); }},
      {"schedule cosine 3 1e-4",
       [&](int u) { return u >= 3 ? 1e-4 : 1e-4 + 0.5 * (lr - 1e-4) * (1 + std::cos(M_PI * u / 3.0)); }}};
  for (const auto &c : cases) {
    const auto ups = updates_of("optimizer sgd lr 1e-3 " + c.args, 5);
    ASSERT_EQ(ups[0].grad.size(), ups[0].before[0].size()) << "every parameter trained";
    for (int u = 0; u < 5; ++u) {
      EXPECT_NEAR(ups[u].lr, c.lr_of(u), 1e-18) << c.args << " update " << u;
      EXPECT_NEAR(ups[u].gnorm, norm(ups[u].grad), 1e-12 * ups[u].gnorm);
      // plain SGD: p -= lr g
      const double e = step_error(ups[u], [&](std::size_t k, double) { return -c.lr_of(u) * ups[u].grad[k]; });
      EXPECT_LE(e, 1e-14) << c.args << " update " << u;
    }
  }
  // momentum mu (PyTorch's SGD, no dampening): b = mu b + g, p -= lr b
  const double mu = 0.9;
  const auto ups = updates_of("optimizer sgd lr 1e-3 momentum 0.9", 3);
  std::vector<double> b(ups[0].grad.size(), 0.0);
  for (int u = 0; u < 3; ++u) {
    for (std::size_t k = 0; k < b.size(); ++k) b[k] = (u == 0 ? 0.0 : mu * b[k]) + ups[u].grad[k];
    EXPECT_LE(step_error(ups[u], [&](std::size_t k, double) { return -lr * b[k]; }), 1e-14) << "update " << u;
  }
  const double worst = worst_step_error;
  // the same updates without the momentum term are another trajectory
  EXPECT_GT(step_error(ups[2], [&](std::size_t k, double) { return -lr * ups[2].grad[k]; }), 0.1);
  std::printf("[ optim    ] sgd, 3 schedules and momentum: step vs formula %.1e\n", worst);
}

TEST(Optimizers, AdamAndAdamWFollowTheirFormulas)
{
  if (nprocs > 1) GTEST_SKIP() << "one process";
  worst_step_error = 0.0;
  const double lr = 1e-3, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.01;
  for (const std::string kind : {"adam", "adamw"}) {
    const auto ups = updates_of("optimizer " + kind + " lr 1e-3 weight_decay 0.01", 3);
    const std::size_t n = ups[0].grad.size();
    std::vector<double> m(n, 0.0), v(n, 0.0);
    for (int u = 0; u < 3; ++u) {
      const auto &up = ups[u];
      const double bc1 = 1 - std::pow(b1, u + 1), bc2 = 1 - std::pow(b2, u + 1);
      const double e = step_error(up, [&](std::size_t k, double p) {
        // adam: L2 decay added to the gradient; adamw: decoupled, p *= 1 - lr wd first
        const double g = up.grad[k] + (kind == "adam" ? wd * p : 0.0);
        m[k] = b1 * m[k] + (1 - b1) * g;
        v[k] = b2 * v[k] + (1 - b2) * g * g;
        const double q = kind == "adamw" ? p * (1 - lr * wd) : p;
        return q - (lr / bc1) * m[k] / (std::sqrt(v[k]) / std::sqrt(bc2) + eps) - p;
      });
      EXPECT_LE(e, 1e-13) << kind << " update " << u;
    }
  }
  std::printf("[ optim    ] adam, adamw with weight decay: step vs formula %.1e\n", worst_step_error);
}

TEST(Optimizers, ClipScalesEachMemberByItsOwnNorm)
{
  if (nprocs > 1) GTEST_SKIP() << "one process";
  worst_step_error = 0.0;
  const double lr = 1e-3, clip = 1e-4;
  // PyTorch's clip_grad_norm_: g * clip / (|g| + 1e-6) where |g| > clip
  const auto one = updates_of("optimizer sgd lr 1e-3 clip 1e-4", 2);
  for (const auto &up : one) {
    const double g = norm(up.grad);
    ASSERT_GT(g, 10 * clip);
    EXPECT_NEAR(up.gnorm, g, 1e-12 * g) << "output 5: the norm before clipping";
    EXPECT_LE(step_error(up, [&](std::size_t k, double) { return -lr * up.grad[k] * clip / (g + 1e-6); }), 1e-14);
  }
  // a committee: each member clipped by its own gradient's norm
  const auto two = updates_of("optimizer sgd lr 1e-3 clip 1e-4", 2, committee_files());
  for (const auto &up : two) {
    ASSERT_EQ(up.before.size(), 2u);
    const std::size_t n0 = up.before[0].size();
    const double g0 = norm(up.grad, 0, n0), g1 = norm(up.grad, n0);
    EXPECT_GT(std::fabs(g0 - g1), 1e-3 * g0) << "the members' norms differ";
    EXPECT_NEAR(up.gnorm, g0, 1e-12 * g0) << "output 5: the first member's norm";
    for (int m = 0; m < 2; ++m) {
      const double gm = m == 0 ? g0 : g1;
      EXPECT_LE(step_error(up, [&](std::size_t k, double) { return -lr * up.grad[k] * clip / (gm + 1e-6); }, m,
                           m == 0 ? 0 : n0),
                1e-14)
          << "member " << m;
    }
  }
  std::printf("[ optim    ] clip, one model and each committee member: step vs formula %.1e\n",
              worst_step_error);
}

// committee save: the first member to the file, member k to file.ck.pt,
// each the member's current parameters
TEST(Learn, CommitteeSaveWritesEveryMember)
{
  if (nprocs > 1) GTEST_SKIP() << "one process";
  const std::string dir = ::testing::TempDir() + "/committee_save";
  std::filesystem::create_directories(dir);
  Lammps l(MPI_COMM_WORLD);
  l.cmds(silicon(2, 5, "ortho"));
  l.cmds({"pair_style torch", "pair_coeff * * " + committee_files() + " Si", "fix md all nve",
          "fix ft all torch/finetune 1 " + teacher() + " log 0 save 2 " + dir + "/si.pt", "run 3 post no"});
  ASSERT_EQ(l.fix()->member_count(), 2);
  const std::string files[2] = {dir + "/si.pt", dir + "/si.c1.pt"};
  for (int m = 0; m < 2; ++m) {
    ASSERT_TRUE(std::filesystem::exists(files[m])) << files[m];
    MLTorch::Model saved(MLTorch::read_file(files[m]), files[m], "cpu");
    EXPECT_EQ(saved.state_bytes(), l.fix()->member(m)->state_bytes()) << files[m];
  }
  // the members differ: each file holds its own member
  EXPECT_NE(l.fix()->member(0)->state_bytes(), l.fix()->member(1)->state_bytes());
  EXPECT_FALSE(std::filesystem::exists(dir + "/si.c2.pt"));
  std::filesystem::remove_all(dir);
}

TEST(Decisions, SkipAndRollbackAreCollective)
{
  const bool replicas = nprocs > 1;
  Lammps l(MPI_COMM_WORLD, replicas ? partitions() : std::vector<std::string>{});
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  hot_student(l, 40 + (replicas ? rank : 0));
  // every update's force error is above the threshold: all are skipped
  l.cmd("fix ft all torch/finetune 1 " + teacher() + " log 0 check 1 max_force_error 1e-6");
  const auto before = l.params();
  l.cmd("run 10 post no");
  EXPECT_EQ(l.fix()->compute_vector(7), 10.0);    // skipped
  EXPECT_EQ(l.fix()->updates(), 0);
  EXPECT_EQ(max_diff(before, l.params()), 0.0);
  l.cmd("unfix ft");
  // a learning rate far too large makes the loss jump: rollbacks restore the last good model
  // (atoms held still, so that the bad steps cannot wreck the trajectory)
  l.cmd("unfix md");
  l.cmd("fix ft all torch/finetune 1 " + teacher() + " log 0 check 1 lr 0.3 rollback 3");
  // step by step: a rollback must give back parameters of an earlier step
  // (the last good ones), not leave those it found (a restore that does
  // nothing would keep the previous step's parameters)
  std::vector<std::vector<double>> seen{l.params()};
  double counted = 0.0;
  int restored = 0;
  for (int step = 0; step < 30; ++step) {
    l.cmd("run 1 post no");
    const auto now = l.params();
    const double n = l.fix()->compute_vector(8);
    if (n > counted) {
      counted = n;
      EXPECT_GT(max_diff(now, seen.back()), 0.0) << "rollback on step " << step << " kept the parameters";
      bool earlier = false;
      for (std::size_t k = 0; k + 1 < seen.size(); ++k) earlier = earlier || max_diff(now, seen[k]) == 0.0;
      EXPECT_TRUE(earlier) << "rollback on step " << step << " restored no earlier parameters";
      restored += earlier ? 1 : 0;
    }
    seen.push_back(now);
  }
  const double rollbacks = l.fix()->compute_vector(8);
  EXPECT_GE(rollbacks, 1.0);
  EXPECT_EQ(restored, static_cast<int>(rollbacks));
  double rb_min = 0.0, rb_max = 0.0;
  MPI_Allreduce(&rollbacks, &rb_min, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&rollbacks, &rb_max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  EXPECT_EQ(rb_min, rb_max);
  if (me == 0)
    std::printf("[ decisions ] 10 of 10 updates skipped; %g rollback(s) in 30 updates, each back "
                "to an earlier step's parameters\n", rollbacks);
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
