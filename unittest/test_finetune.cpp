/* ----------------------------------------------------------------------
   ML-TORCH: fix torch/finetune.
   - Gradient.*      the loss gradient on 1..4 ranks equals a 1-rank run
                     and an independent reference; replays after migration
   - Layered*        the per-layer exchange equals thick ghosts
   - Replay.*        the replay buffer's bounds and refilled pieces
   - TeacherLabels.* the labels of a message-passing teacher, per-atom residual
   Run under mpirun; replica tests split MPI_COMM_WORLD into one partition
   per rank (-partition Nx1).
------------------------------------------------------------------------- */

#include "finetune_fixtures.h"

/* ----------------------------------------------------------------------
   1. gradient exactness: energy + force + stress loss gradient on N ranks
   vs the same configuration on one rank (MPI_COMM_SELF)
------------------------------------------------------------------------- */

struct GradientCase {
  std::string name, model, shape;
};

static void PrintTo(const GradientCase &c, std::ostream *os)
{
  *os << c.name;
}

class Gradient : public ::testing::TestWithParam<GradientCase> {};

// the case's configuration and model with a fix training on every step with
// energy, force and stress terms (SGD: `extra` adds the learning rate etc.);
// no integrator, so the configuration stays put
static void gradient_setup(Lammps &l, const GradientCase &c, const std::string &extra)
{
  l.cmds(silicon(2, 777, c.shape));
  l.cmd("pair_style torch");
  l.cmd("pair_coeff * * " + c.model + " Si");
  l.cmd("fix ft all torch/finetune 1 " + teacher() + " weights 1.0 10.0 1.0 optimizer sgd log 0 " + extra);
}

static std::vector<double> loss_gradient(MPI_Comm comm, const GradientCase &c, double *loss)
{
  Lammps l(comm);
  gradient_setup(l, c, "lr 1e-12 check 1");
  l.cmd("run 1 post no");
  *loss = l.fix()->compute_vector(0);
  EXPECT_EQ(l.fix()->updates(), 1);
  return l.fix()->last_gradient();
}

TEST_P(Gradient, EqualsOneRank)
{
  const auto &c = GetParam();
  double loss_n = 0.0, loss_1 = 0.0;
  const auto g_n = loss_gradient(MPI_COMM_WORLD, c, &loss_n);
  if (me != 0) return;
  const auto g_1 = loss_gradient(MPI_COMM_SELF, c, &loss_1);
  ASSERT_EQ(g_n.size(), g_1.size());
  ASSERT_GT(g_1.size(), 1000u);
  const double scale = max_abs(g_1);
  const double dev = max_diff(g_n, g_1) / scale;
  std::printf("[ gradient ] %s on %d rank(s): loss %.10g (1 rank %.10g), |g|max %.4g, max "
              "relative deviation %.3g\n",
              c.name.c_str(), nprocs, loss_n, loss_1, scale, dev);
  EXPECT_GT(scale, 1e-3);
  EXPECT_LE(dev, 1e-12);    // the doc's 1e-12 (measured up to 4.3e-13, triclinic on 4 ranks)
  EXPECT_NEAR(loss_n, loss_1, 1e-12 * std::fabs(loss_1));
}

INSTANTIATE_TEST_SUITE_P(
    Systems, Gradient,
    ::testing::Values(GradientCase{"local_ortho", potentials + "/si_local.pt", "ortho"},
                      GradientCase{"local_triclinic", potentials + "/si_local.pt", "triclinic"},
                      GradientCase{"local_slab", potentials + "/si_local.pt", "slab"},
                      GradientCase{"mp2_ortho", potentials + "/si_mp2.pt", "ortho"},
                      GradientCase{"mp2_slab", potentials + "/si_mp2.pt", "slab"}),
    [](const ::testing::TestParamInfo<GradientCase> &info) { return info.param.name; });

/* ----------------------------------------------------------------------
   the same gradient without LAMMPS communication: teacher labels from
   native pair_style sw, the loss gradient of doc/fix_torch_finetune.rst evaluated by the
   core on an independent brute-force graph with explicit periodic images
------------------------------------------------------------------------- */

TEST_P(Gradient, MatchesIndependentReference)
{
  const auto &c = GetParam();
  if (c.shape != "ortho") GTEST_SKIP() << "the reference builds orthogonal periodic images only";
  if (me != 0) return;
  const double wE = 1.0, wF = 10.0, wS = 1.0;

  // labels: native SW on the same configuration
  Lammps t(MPI_COMM_SELF);
  t.cmds(silicon(2, 777, c.shape));
  t.cmds({"pair_style sw", "pair_coeff * * " + lammps_potentials + "/Si.sw Si", "run 0 post no"});
  const int n = static_cast<int>(lammps_get_natoms(t.lmp));
  std::vector<double> x(3 * n), fref(3 * n);
  lammps_gather(t.lmp, "x", 1, 3, x.data());
  lammps_gather(t.lmp, "f", 1, 3, fref.data());
  const double eref = t.lmp->force->pair->eng_vdwl;
  std::vector<double> wref(t.lmp->force->pair->virial, t.lmp->force->pair->virial + 6);
  const double L = 2 * 5.431;

  // the loss gradient on the brute-force graph, images mapped to their owners
  MLTorch::Model model(MLTorch::read_file(c.model), c.model, "cpu");
  std::vector<bool> all(model.parameter_names().size(), true);
  model.set_trainable(all);
  const std::array<std::array<double, 3>, 3> cell{{{L, 0, 0}, {0, L, 0}, {0, 0, L}}};
  const auto graph = MLTorchTest::build_reference_graph(x, std::vector<int64_t>(n, 0), cell,
                                                        {true, true, true}, 1, model.metadata().cutoff);
  const auto &owner = graph.owner;
  const int64_t m = static_cast<int64_t>(owner.size());
  const MLTorch::GraphInput in = graph.input();
  double e = 0.0, w[6];
  std::vector<double> nf;
  model.forward_train(in, e, nf, w);
  std::vector<double> F(3 * n, 0.0);
  for (int64_t a = 0; a < m; a++)
    for (int d = 0; d < 3; d++) F[3 * owner[a] + d] += nf[3 * a + d];
  // the training pass's energy, forces and virial are the MD pass's
  // (Model::evaluate: dE/dr_ij alone, scattered by evaluate_reference,
  // F_i += g, F_j -= g, W = -sum r (x) g): the reference below stands on both
  {
    const auto md = MLTorchTest::evaluate_reference(model, x, std::vector<int64_t>(n, 0), cell,
                                                    {true, true, true}, 1);
    double wmax = 0.0, dw = 0.0;
    for (int d = 0; d < 6; d++) {
      wmax = std::max(wmax, std::fabs(md.virial[d]));
      dw = std::max(dw, std::fabs(w[d] - md.virial[d]));
    }
    const double df = max_diff(F, md.forces) / max_abs(md.forces);
    std::printf("[ gradient ] %s training pass vs MD pass: energy %.2e, forces %.2e, virial %.2e "
                "relative\n", c.name.c_str(), std::fabs(e - md.energy) / std::fabs(md.energy), df,
                dw / wmax);
    EXPECT_NEAR(e, md.energy, 1e-13 * std::fabs(md.energy));
    EXPECT_LE(df, 1e-13);
    EXPECT_LE(dw, 1e-13 * wmax);
  }
  std::vector<double> weights(3 * m);
  for (int64_t a = 0; a < m; a++)
    for (int d = 0; d < 3; d++)
      weights[3 * a + d] = 2.0 * wF / (3.0 * n) * (F[3 * owner[a] + d] - fref[3 * owner[a] + d]);
  double cw[6];
  for (int k = 0; k < 6; k++) cw[k] = 2.0 * wS * (w[k] - wref[k]) / n / (6.0 * n);
  model.backward_train(weights, 2.0 * wE * (e - eref) / n / n, cw);
  const auto g_ref = model.flat_gradient(true);

  double loss = 0.0;
  const auto g_fix = loss_gradient(MPI_COMM_SELF, c, &loss);
  ASSERT_EQ(g_fix.size(), g_ref.size());
  const double dev = max_diff(g_fix, g_ref) / max_abs(g_ref);
  std::printf("[ gradient ] %s vs brute-force reference: max relative deviation %.3g\n",
              c.name.c_str(), dev);
  EXPECT_GT(max_abs(g_ref), 1e-3);
  EXPECT_LE(dev, 1e-12);
}

/* ----------------------------------------------------------------------
   replay: a configuration stored under one domain decomposition, replayed
   after every atom moved to another rank (shifted by half the box), gives
   the gradient it gave when fresh
------------------------------------------------------------------------- */

TEST_P(Gradient, ReplayAfterMigrationIsExact)
{
  const auto &c = GetParam();
  if (c.shape == "triclinic") GTEST_SKIP() << "covered by the orthogonal cases";
  Lammps l(MPI_COMM_WORLD);
  gradient_setup(l, c, "lr 1e-16 replay 4 1");
  l.cmd("run 1 post no");
  const auto fresh = l.fix()->last_gradient();
  EXPECT_EQ(l.fix()->replay_size(), 1);
  EXPECT_EQ(l.fix()->compute_vector(9), 1.0);    // one configuration in the gradient
  // every atom moves by half a box along x and y: new owners, new ghosts
  l.cmd("displace_atoms all move 5.4 5.4 0 units box");
  l.cmd("run 1 post no");
  EXPECT_EQ(l.fix()->compute_vector(9), 2.0);    // fresh (translated copy) + replayed original
  EXPECT_EQ(l.fix()->replay_size(), 2);
  const auto mixed = l.fix()->last_gradient();
  const double dev = max_diff(mixed, fresh) / max_abs(fresh);
  if (me == 0)
    std::printf("[ replay ] %s on %d rank(s): replayed + translated vs fresh gradient %.3g\n",
                c.name.c_str(), nprocs, dev);
  EXPECT_LE(dev, 1e-12);
}

/* ----------------------------------------------------------------------
   layered models: the loss gradient through the per-layer halo exchange
   equals the thick-ghost gradient (1-4 ranks, 2 and 4 layers, with an
   empty rank); a 20-step MD run with an update on every step gives the same
   trajectory and parameters on 1 replica (FinetuneGradient_np*) and on 2
   replicas (FinetuneReplicas_np*)
------------------------------------------------------------------------- */

struct LayeredCase {
  std::string name, model, shape;
};

static void PrintTo(const LayeredCase &c, std::ostream *os)
{
  *os << c.name;
}

class LayeredGradient : public ::testing::TestWithParam<LayeredCase> {};

TEST_P(LayeredGradient, ExchangeEqualsThickGhosts)
{
  const auto &c = GetParam();
  std::vector<double> g[2];
  double loss[2];
  for (int thick = 0; thick < 2; ++thick) {
    Lammps l(MPI_COMM_WORLD);
    l.cmds(silicon(2, 777, c.shape));
    l.cmd(thick ? "pair_style torch halo thick" : "pair_style torch");
    l.cmd("pair_coeff * * " + c.model + " Si");
    l.cmd("fix ft all torch/finetune 1 " + teacher() +
          " weights 1.0 10.0 1.0 optimizer sgd log 0 lr 1e-12 check 1");
    l.cmd("run 1 post no");
    EXPECT_EQ(l.fix()->updates(), 1);
    loss[thick] = l.fix()->compute_vector(0);
    g[thick] = l.fix()->last_gradient();
  }
  ASSERT_EQ(g[0].size(), g[1].size());
  const double scale = max_abs(g[1]);
  const double dev = max_diff(g[0], g[1]) / scale;
  if (me == 0)
    std::printf("[ layered  ] %s on %d rank(s): loss %.12g (thick %.12g), gradient exchange vs thick "
                "%.3g\n", c.name.c_str(), nprocs, loss[0], loss[1], dev);
  EXPECT_GT(scale, 1e-3);
  EXPECT_LE(dev, 1e-12);
  EXPECT_NEAR(loss[0], loss[1], 1e-12 * std::fabs(loss[1]));
}

// 20 NVE steps with an update on every step, under `extra` LAMMPS arguments
static void layered_run(const std::string &model, const std::vector<std::string> &args, bool thick,
                        std::vector<double> &x, std::vector<double> &params, int &updates)
{
  Lammps l(MPI_COMM_WORLD, args);
  l.cmds(silicon(2, 31, "ortho"));
  l.cmd("velocity all create 900 " + std::to_string(4928 + l.lmp->universe->iworld) + " loop geom");
  l.cmd(thick ? "pair_style torch halo thick" : "pair_style torch");
  l.cmd("pair_coeff * * " + model + " Si");
  l.cmd("fix ft all torch/finetune 1 " + teacher() + " weights 1.0 10.0 0.1 lr 1e-3 log 0 check 1");
  l.cmd("fix md all nve");
  l.cmd("run 20 post no");
  updates = static_cast<int>(l.fix()->updates());
  x = l.gather("x", 3);
  params = l.params();
}

static void layered_trajectories(const std::vector<std::string> &args, const char *what)
{
  for (const std::string model : {potentials + "/si_mp2.pt", test_models + "/si_mp4_layered.pt"}) {
    std::vector<double> x[2], p[2];
    int updates[2];
    for (int thick = 0; thick < 2; ++thick) layered_run(model, args, thick, x[thick], p[thick], updates[thick]);
    EXPECT_EQ(updates[0], 20);
    EXPECT_EQ(updates[1], 20);
    const double dx = max_diff(x[0], x[1]), dp = max_diff(p[0], p[1]) / max_abs(p[1]);
    if (me == 0)
      std::printf("[ layered  ] %s, %s, 20 steps with 20 updates: positions exchange vs thick %.3g A, "
                  "parameters %.3g relative\n", model.substr(model.rfind('/') + 1).c_str(), what, dx, dp);
    EXPECT_LE(dx, 1e-10);
    EXPECT_LE(dp, 1e-12);
  }
}

TEST(LayeredTrajectory, ExchangeEqualsThickGhosts)
{
  layered_trajectories({}, (std::to_string(nprocs) + " rank(s)").c_str());
}

// suspected in review: the double backward's exchanges in another order on a
// rank that owns no atom (a slab along x, processors * 1 1: the upper ranks
// are empty), with a model whose messages are linear in the features (fewer
// autograd paths through the exchanges). 200 steps with an update on every
// step, per-layer exchange vs thick ghosts: the same trajectory and model
// on any rank count, and no hang (ctest TIMEOUT)
TEST(LayeredTrajectory, EmptyRankLinearMessages)
{
  const std::string model = test_models + "/si_mp3_linear.pt";
  std::vector<double> x[2], p[2];
  int updates[2] = {0, 0};
  for (int thick = 0; thick < 2; ++thick) {
    Lammps l(MPI_COMM_WORLD);
    l.cmds(silicon(2, 17, "slab"));
    l.cmds({"velocity all create 900 4928 loop geom",
            thick ? "pair_style torch halo thick" : "pair_style torch",
            "pair_coeff * * " + model + " Si",
            "fix ft all torch/finetune 1 " + teacher() + " weights 1.0 10.0 0.1 lr 1e-3 log 0 check 10",
            "fix md all nve", "run 0 post no"});
    if (nprocs > 1) {
      // the slab leaves a rank empty (at the start: hot atoms cross the
      // periodic boundary into it later)
      int mine = l.lmp->atom->nlocal, fewest = 0;
      MPI_Allreduce(&mine, &fewest, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
      EXPECT_EQ(fewest, 0);
    }
    l.cmd("run 200 post no");
    updates[thick] = static_cast<int>(l.fix()->updates());
    x[thick] = l.gather("x", 3);
    p[thick] = l.params();
  }
  EXPECT_EQ(updates[0], 200);
  EXPECT_EQ(updates[1], 200);
  const double dx = max_diff(x[0], x[1]), dp = max_diff(p[0], p[1]) / max_abs(p[1]);
  if (me == 0)
    std::printf("[ layered  ] linear messages, slab, %d rank(s), 200 steps with 200 updates: positions "
                "exchange vs thick %.3g A, parameters %.3g relative\n", nprocs, dx, dp);
  EXPECT_LE(dx, 1e-9);
  EXPECT_LE(dp, 1e-11);
}

TEST(LayeredReplicas, ExchangeEqualsThickGhosts)
{
  if (nprocs < 2 || nprocs % 2) GTEST_SKIP() << "needs an even number of MPI ranks";
  layered_trajectories({"-partition", "2x" + std::to_string(nprocs / 2), "-plog", "none", "-pscreen",
                        "none", "-in", "none"},
                       ("2 replicas x " + std::to_string(nprocs / 2) + " rank(s)").c_str());
}

INSTANTIATE_TEST_SUITE_P(
    Layered, LayeredGradient,
    ::testing::Values(LayeredCase{"mp2_triclinic", potentials + "/si_mp2.pt", "triclinic"},
                      LayeredCase{"mp2_slab", potentials + "/si_mp2.pt", "slab"},
                      LayeredCase{"mp4_ortho", test_models + "/si_mp4_layered.pt", "ortho"},
                      LayeredCase{"mp4_slab", test_models + "/si_mp4_layered.pt", "slab"}),
    [](const ::testing::TestParamInfo<LayeredCase> &info) { return info.param.name; });

TEST(Replay, MemoryBoundAndCapacity)
{
  Lammps l(MPI_COMM_WORLD);
  hot_student(l, 5);
  l.cmd("fix ft all torch/finetune 1 " + teacher() + " log 0 replay 5 2");
  l.cmd("run 8 post no");
  EXPECT_EQ(l.fix()->replay_size(), 5);    // capacity
  EXPECT_EQ(l.fix()->compute_vector(9), 3.0);    // 1 fresh + 2 replayed per update
  const double one = l.fix()->replay_bytes() / 5;
  double per_rank_max = 0.0;
  const double mine = l.fix()->replay_bytes();
  MPI_Allreduce(&mine, &per_rank_max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  // a bound of 2.5 pieces of the largest rank keeps 2 configurations
  const double bound_mb = 2.5 * per_rank_max / 5 / (1024.0 * 1024.0);
  l.cmd("unfix ft");
  l.cmd("fix ft all torch/finetune 1 " + teacher() + " log 0 replay 5 2 replay_memory " +
        std::to_string(bound_mb));
  l.cmd("run 8 post no");
  double now_max = 0.0;
  const double now = l.fix()->replay_bytes();
  MPI_Allreduce(&now, &now_max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  EXPECT_LE(now_max, bound_mb * 1024.0 * 1024.0);
  EXPECT_GE(l.fix()->replay_size(), 1);
  EXPECT_LT(l.fix()->replay_size(), 5);
  EXPECT_GT(one, 0.0);
}

/* ----------------------------------------------------------------------
   a full buffer refills the piece it evicted (its vectors are reused, so
   that a long run does not fragment the heap): configurations replayed
   from refilled pieces, of other sizes than the pieces' first contents,
   give the gradients they gave when fresh
------------------------------------------------------------------------- */

TEST(Replay, RefilledPiecesReplayExactly)
{
  const int nsteps = 7;
  std::vector<std::vector<double>> fresh(nsteps + 1), mixed(nsteps + 1);
  std::vector<double> nconf(nsteps + 1);
  for (const bool with_replay : {false, true}) {
    Lammps l(MPI_COMM_WORLD);
    hot_student(l, 11);
    l.cmd("fix ft all torch/finetune 1 " + teacher() + " optimizer sgd lr 1e-16 log 0" +
          (with_replay ? " replay 2 1" : ""));
    for (int step = 1; step <= nsteps; ++step) {
      l.cmd("run 1 post no");
      (with_replay ? mixed : fresh)[step] = l.fix()->last_gradient();
      if (with_replay) nconf[step] = l.fix()->compute_vector(9);
    }
  }
  // pieces: steps 1-3 allocate, step 4 refills the piece of step 1, ...;
  // the update of step k replays step k-1, from a refilled piece from step 5 on
  double worst = 0.0;
  for (int step = 2; step <= nsteps; ++step) {
    ASSERT_EQ(nconf[step], 2.0) << "step " << step;
    std::vector<double> expect(fresh[step].size());
    for (std::size_t i = 0; i < expect.size(); ++i) expect[i] = 0.5 * (fresh[step][i] + fresh[step - 1][i]);
    const double dev = max_diff(mixed[step], expect) / max_abs(expect);
    worst = std::max(worst, dev);
    EXPECT_LE(dev, 1e-10) << "step " << step;
  }
  EXPECT_GT(max_diff(fresh[nsteps], fresh[nsteps - 1]), 1e-3 * max_abs(fresh[nsteps]));
  if (me == 0)
    std::printf("[ replay ] %d rank(s): refilled pieces replayed vs fresh gradients %.3g\n", nprocs, worst);
}

/* ----------------------------------------------------------------------
   a message-passing teacher (ghost-atom neighbor lists): its labels equal
   the same model run as the MD pair style, on 1-4 ranks
------------------------------------------------------------------------- */

TEST(TeacherLabels, MessagePassingTeacherEqualsPairStyle)
{
  Lammps l;
  l.cmds(silicon(2, 4242, "ortho"));
  l.cmds({"pair_style torch", "pair_coeff * * " + potentials + "/si_local.pt Si",
          "fix ft all torch/finetune 1 teacher torch \"* * " + potentials +
              "/si_mp2.pt Si\" log 0",
          "run 1 post no"});
  const auto tags = l.fix()->label_tags();
  const auto forces = l.fix()->label_forces();
  const double e_label = l.fix()->label_energy();
  std::vector<double> w_label(l.fix()->label_virial(), l.fix()->label_virial() + 6);
  ASSERT_EQ(forces.size(), 3 * tags.size());

  // the teacher's model as the MD pair style on the same atoms
  l.cmds({"unfix ft", "pair_style torch", "pair_coeff * * " + potentials + "/si_mp2.pt Si",
          "run 0 post no"});
  auto *atom = l.lmp->atom;
  double dmax = 0.0, fmax = 0.0;
  for (std::size_t n = 0; n < tags.size(); ++n) {
    const int i = atom->map(tags[n]);
    ASSERT_GE(i, 0);
    ASSERT_LT(i, atom->nlocal);
    for (int k = 0; k < 3; ++k) {
      dmax = std::max(dmax, std::fabs(atom->f[i][k] - forces[3 * n + k]));
      fmax = std::max(fmax, std::fabs(atom->f[i][k]));
    }
  }
  double red[2] = {dmax, fmax}, gred[2];
  MPI_Allreduce(red, gred, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  double e_md = 0.0, w_md[6];
  MPI_Allreduce(&l.lmp->force->pair->eng_vdwl, &e_md, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allreduce(l.lmp->force->pair->virial, w_md, 6, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  double dw = 0.0, wmax = 0.0;
  for (int k = 0; k < 6; ++k) {
    dw = std::max(dw, std::fabs(w_md[k] - w_label[k]));
    wmax = std::max(wmax, std::fabs(w_md[k]));
  }
  if (me == 0)
    std::printf("[ teacher ] si_mp2 as teacher vs as pair style on %d rank(s): forces %.3g, "
                "energy %.3g, virial %.3g (relative)\n",
                nprocs, gred[0] / gred[1], std::fabs(e_md - e_label) / std::fabs(e_md), dw / wmax);
  EXPECT_GT(gred[1], 0.1);
  EXPECT_LE(gred[0] / gred[1], 1e-12);
  EXPECT_LE(std::fabs(e_md - e_label), 1e-12 * std::fabs(e_md));
  EXPECT_LE(dw, 1e-12 * wmax);
}

/* ----------------------------------------------------------------------
   the fix's per-atom output: |F - F_ref| of the labelled configuration,
   against the student's and the teacher's forces computed separately
   (a learning rate of 1e-300 leaves the student's forces as they were)
------------------------------------------------------------------------- */

TEST(TeacherLabels, PerAtomResidual)
{
  std::vector<double> resid, f_student, f_teacher;
  {
    Lammps l;
    l.cmds(silicon(2, 4243, "ortho"));
    l.cmds({"pair_style torch", "pair_coeff * * " + potentials + "/si_local.pt Si",
            "fix ft all torch/finetune 1 " + teacher() + " optimizer sgd lr 1e-300 log 0",
            "run 1 post no"});
    resid = l.gather("f_ft", 1);
    f_student = l.gather("f", 3);
  }
  {
    Lammps l;
    l.cmds(silicon(2, 4243, "ortho"));
    l.cmds({"pair_style sw", "pair_coeff * * " + lammps_potentials + "/Si.sw Si", "run 0 post no"});
    f_teacher = l.gather("f", 3);
  }
  ASSERT_EQ(resid.size() * 3, f_student.size());
  std::vector<double> ref(resid.size());
  for (std::size_t i = 0; i < ref.size(); ++i)
    ref[i] = std::sqrt(std::pow(f_student[3 * i] - f_teacher[3 * i], 2) +
                       std::pow(f_student[3 * i + 1] - f_teacher[3 * i + 1], 2) +
                       std::pow(f_student[3 * i + 2] - f_teacher[3 * i + 2], 2));
  const double dev = max_diff(resid, ref) / max_abs(ref);
  if (me == 0)
    std::printf("[ teacher ] per-atom |F - F_ref| on %d rank(s) vs separate runs: %.3g "
                "(max relative), largest %.4g eV/A\n", nprocs, dev, max_abs(ref));
  EXPECT_GT(max_abs(ref), 0.01);    // a real residual (si_local against SW)
  EXPECT_LE(dev, 1e-10);
}


/* ---------------------------------------------------------------------- */

int main(int argc, char **argv)
{
  return mpi_test_main(argc, argv, me, nprocs, verbose);
}
