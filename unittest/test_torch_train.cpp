/* ----------------------------------------------------------------------
   ML-TORCH tests of the torch/train command: offline training of the pair
   style's model on an extended XYZ dataset, on fix torch/finetune's engine.
   - TorchTrain.*  the same model on 1, 2 and 4 ranks and on partitions
                   (1e-12), bitwise equal on every rank; one epoch over one
                   configuration is one fix update on it (local and
                   message-passing models); a resumed run continues
                   exactly; bad input is an ERROR naming frame and line
------------------------------------------------------------------------- */

#include "finetune_fixtures.h"

#include "mltorch/labels.h"
#include "mltorch/runtime.h"

#include <cstdio>
#include <fstream>

namespace {

// 16 labelled configurations of hot Si from sw (fix torch/finetune labels):
// 12 to train on with valid 0.25, which 1, 2 and 4 ranks divide (with
// others DistributedSampler pads the shards by repetition, and the
// batches, and so the model, depend on the rank count)
std::string dataset()
{
  static std::string file;
  if (!file.empty()) return file;
  file = shared_temp_file("train_set.xyz");
  if (me == 0) {
    std::remove(file.c_str());
    Lammps l(MPI_COMM_SELF);
    l.cmds(silicon(2, 4321, "triclinic"));
    l.cmds({"velocity all create 1200 4928 loop geom", "pair_style torch",
            "pair_coeff * * " + student + " Si", "fix md all nve",
            "fix ft all torch/finetune 1 " + teacher() + " lr 1e-9 log 0 check 0 labels " + file,
            "run 16 post no"});
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return file;
}

std::vector<std::string> model_setup(const std::string &model = student)
{
  return {"units metal", "atom_modify map array", "lattice diamond 5.431",
          "region box block 0 1 0 1 0 1", "create_box 1 box", "create_atoms 1 box",
          "mass 1 28.0855", "pair_style torch", "pair_coeff * * " + model + " Si"};
}

const std::string train_settings = " epochs 3 batch 4 seed 11 lr 2e-3 weights 1 1 0.1 valid 0.25";

std::vector<double> model_params(Lammps &l)
{
  auto *st = LAMMPS_NS::TorchStudent::of(l.lmp->force);
  const std::string s = st->model()->state_bytes();
  std::vector<double> v(s.size() / sizeof(double));
  std::memcpy(v.data(), s.data(), s.size());
  return v;
}

}    // namespace

/* ----------------------------------------------------------------------
   DDP: the same model whatever the ranks and partitions
------------------------------------------------------------------------- */

TEST(TorchTrain, SameModelOnAnyDecomposition)
{
  if (4 % nprocs != 0) GTEST_SKIP() << "batch 4 needs 1, 2 or 4 ranks";
  const std::string file = dataset();
  std::vector<double> ref;
  if (me == 0) {
    Lammps l(MPI_COMM_SELF);
    l.cmds(model_setup());
    const auto before = model_params(l);
    l.cmd("torch/train " + file + train_settings);
    ref = model_params(l);
    EXPECT_GT(rel_diff(ref, before), 1e-6);    // it trained
  }
  int nref = static_cast<int>(ref.size());
  MPI_Bcast(&nref, 1, MPI_INT, 0, MPI_COMM_WORLD);
  ref.resize(nref);
  MPI_Bcast(ref.data(), nref, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  for (const bool parts : {false, true}) {
    if (parts && nprocs < 2) continue;
    Lammps l(MPI_COMM_WORLD, parts ? partitions() : std::vector<std::string>{});
    l.cmds(model_setup());
    l.cmd("torch/train " + file + train_settings);
    const auto p = model_params(l);
    const double d = rel_diff(p, ref);
    // bitwise one model on every rank
    const std::string mine = MLTorch::content_hash(
        LAMMPS_NS::TorchStudent::of(l.lmp->force)->model()->state_bytes());
    std::vector<char> all(17 * nprocs);
    MPI_Allgather(mine.c_str(), 17, MPI_CHAR, all.data(), 17, MPI_CHAR, MPI_COMM_WORLD);
    for (int r = 0; r < nprocs; ++r) EXPECT_EQ(std::string(all.data() + 17 * r), mine) << "rank " << r;
    if (me == 0)
      std::printf("[ torch/train ] %d rank(s)%s vs 1 rank: parameters %.2e (relative), hash %s\n",
                  nprocs, parts ? " as partitions" : "", d, mine.c_str());
    EXPECT_LE(d, 1e-12);
  }
}

/* ----------------------------------------------------------------------
   one epoch over one configuration is one fix update on it: the fix
   labels a configuration (no MD: the atoms stay) and updates once;
   torch/train on the frame it wrote gives the same parameters. The two
   share MLTorch::configuration_gradient; the graphs differ (LAMMPS's with
   ghosts or folded, the core's folded), not the gradient
------------------------------------------------------------------------- */

TEST(TorchTrain, OneEpochOfOneConfigurationIsOneFixUpdate)
{
  for (const std::string model : {student, potentials + "/si_mp2.pt"}) {
    const std::string frame = shared_temp_file("one.xyz");
    if (me == 0) std::remove(frame.c_str());
    MPI_Barrier(MPI_COMM_WORLD);
    const std::string loss = " weights 1 1 0.1 lr 1e-3 optimizer adam";
    std::vector<double> p_fix;
    {
      Lammps l;
      l.cmds(silicon(2, 99, "triclinic"));
      l.cmds({"displace_atoms all random 0.15 0.15 0.15 77 units box", "pair_style torch",
              "pair_coeff * * " + model + " Si",
              "fix ft all torch/finetune 1 " + teacher() + loss + " log 0 check 0 labels " + frame,
              "run 1 post no"});
      ASSERT_EQ(l.fix()->updates(), 1);
      p_fix = l.params();
    }
    Lammps l(MPI_COMM_SELF);
    l.cmds(model_setup(model));
    l.cmd("torch/train " + frame + " epochs 1 batch 1" + loss);
    const double d = rel_diff(model_params(l), p_fix);
    if (me == 0)
      std::printf("[ torch/train ] %s: one epoch on the frame vs one fix update on %d rank(s): "
                  "parameters %.2e (relative)\n",
                  model.substr(model.rfind('/') + 1).c_str(), nprocs, d);
    EXPECT_LE(d, 1e-13);
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

/* ----------------------------------------------------------------------
   a checkpoint after 2 epochs and a resumed run of 2 more give the model
   of 4 epochs in one run
------------------------------------------------------------------------- */

TEST(TorchTrain, ResumeContinuesExactly)
{
  if (4 % nprocs != 0) GTEST_SKIP() << "batch 4 needs 1, 2 or 4 ranks";
  const std::string file = dataset(), ckpt = shared_temp_file("train.ckpt");
  const std::string rest = " batch 4 seed 11 lr 2e-3 weights 1 1 0.1 energy_shift fit";
  std::vector<double> straight, resumed;
  {
    Lammps l;
    l.cmds(model_setup());
    l.cmd("torch/train " + file + " epochs 4" + rest);
    straight = model_params(l);
  }
  {
    Lammps l;
    l.cmds(model_setup());
    l.cmd("torch/train " + file + " epochs 2 checkpoint 1 " + ckpt + rest);
  }
  {
    Lammps l;
    l.cmds(model_setup());
    l.cmd("torch/train " + file + " epochs 4 resume " + ckpt + rest);
    resumed = model_params(l);
  }
  const double d = rel_diff(resumed, straight);
  if (me == 0) std::printf("[ torch/train ] 2 epochs + checkpoint + 2 vs 4: parameters %.2e\n", d);
  EXPECT_LE(d, 1e-14);
  // another batch cannot continue it: the shards would differ
  Lammps l;
  l.cmds(model_setup());
  const std::string err = l.error_of({"torch/train " + file + " epochs 4 resume " + ckpt +
                                      " batch 8 seed 11 lr 2e-3 weights 1 1 0.1 energy_shift fit"});
  EXPECT_NE(err.find("cannot resume from " + ckpt + ": it was written with batch 4 where this run "
                     "has 8"), std::string::npos) << err;
  MPI_Barrier(MPI_COMM_WORLD);
  if (me == 0) std::remove(ckpt.c_str());
}

/* ----------------------------------------------------------------------
   bad input: an ERROR before any update, naming the frame (and line)
------------------------------------------------------------------------- */

TEST(TorchTrain, BadInputIsAnError)
{
  const std::string good = dataset();
  std::string text;
  {
    std::ifstream in(good);
    text.assign((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  const std::size_t second = text.find("\n64\n") + 1;    // frame 2 starts here
  auto variant = [&](const std::string &name, const std::string &content) {
    const std::string f = shared_temp_file(name);
    if (me == 0) std::ofstream(f) << content;
    MPI_Barrier(MPI_COMM_WORLD);
    return f;
  };
  auto error_of = [&](const std::string &file, const std::string &extra = " epochs 1") {
    Lammps l;
    l.cmds(model_setup());
    const auto before = model_params(l);
    const std::string err = l.error_of({"torch/train " + file + extra});
    if (!err.empty()) EXPECT_EQ(model_params(l), before) << "an update was made before the ERROR";
    return err;
  };
  std::string t = text;
  // an element the model does not have, in frame 2
  t.replace(text.find("\nSi ", second), 4, "\nGe ");
  std::string err = error_of(variant("ge.xyz", t));
  EXPECT_NE(err.find("frame 2: atom 1 is Ge, which the model does not have (its elements: Si)"),
            std::string::npos) << err;
  // no forces where the force weight needs them
  t = text;
  for (std::size_t p; (p = t.find(":forces:R:3")) != std::string::npos;) t.erase(p, 11);
  err = error_of(variant("noforces.xyz", t));
  EXPECT_NE(err.find("frame 1 has no forces (no forces:R:3 column), but the force weight is > 0"),
            std::string::npos) << err;
  EXPECT_EQ(error_of(variant("noforces2.xyz", t), " epochs 1 weights 1 0 0"), "");
  // a malformed number, and a non-finite one
  t = text;
  t.replace(t.find(' ', t.find("\nSi ", second) + 4), 1, " x");
  err = error_of(variant("bad.xyz", t));
  EXPECT_NE(err.find("frame 2 (line 69): 'pos' holds"), std::string::npos) << err;
  t = text;
  const std::size_t e = t.find("energy=", second) + 7;
  t.replace(e, t.find(' ', e) - e, "nan");
  err = error_of(variant("nan.xyz", t));
  EXPECT_NE(err.find("frame 2 (line 68): 'energy' holds a non-finite value (nan)"), std::string::npos)
      << err;
  // a truncated last frame
  err = error_of(variant("cut.xyz", text.substr(0, text.size() - 200)));
  EXPECT_NE(err.find("cut.xyz: frame 16 (line 10"), std::string::npos) << err;
  // the memory bound, the batch, no epochs, no model
  err = error_of(good, " epochs 1 memory 0.01");
  EXPECT_NE(err.find("need more than 0 MB per rank"), std::string::npos) << err;
  if (nprocs > 1) {
    err = error_of(good, " epochs 1 batch 3");
    EXPECT_NE(err.find("must be a multiple of the"), std::string::npos) << err;
  }
  err = error_of(good, "");
  EXPECT_NE(err.find("torch/train needs the number of epochs"), std::string::npos) << err;
  Lammps l;
  l.cmds({"units metal", "region box block 0 1 0 1 0 1", "create_box 1 box"});
  err = l.error_of({"torch/train " + good + " epochs 1"});
  EXPECT_NE(err.find("torch/train trains the model of pair_style torch"), std::string::npos) << err;
}

/* ----------------------------------------------------------------------
   fix torch/finetune dataset FILE M: each replica takes its
   DistributedSampler shard, M per update, epoch after epoch
------------------------------------------------------------------------- */

#include "mltorch/sampler.h"

static std::vector<std::string> dataset_run(const std::string &file, const std::string &extra = "")
{
  auto c = silicon(2, 31, "ortho");
  c.insert(c.end(), {"velocity all create 900 1001 loop geom", "pair_style torch",
                     "pair_coeff * * " + student + " Si", "fix md all nve",
                     "fix ft all torch/finetune 2 " + teacher() + " lr 1e-3 log 0 check 1 dataset " +
                         file + " 3 dataset_seed 5 dataset_weight 0.5" + extra,
                     "run 8 post no"});
  return c;
}

TEST(TorchTrain, FixDatasetShardsAreTheSamplers)
{
  const std::string file = dataset();
  Lammps l(MPI_COMM_WORLD, nprocs > 1 ? partitions() : std::vector<std::string>{});
  l.cmds(dataset_run(file));
  const int R = nprocs > 1 ? nprocs : 1, k = nprocs > 1 ? me : 0;
  EXPECT_EQ(l.fix()->updates(), 4);
  std::vector<int64_t> want;
  for (int64_t e = 0; want.size() < 12; ++e) {
    const auto shard = MLTorch::distributed_shard(16, R, k, 5, e);
    want.insert(want.end(), shard.begin(), shard.end());
  }
  want.resize(12);
  EXPECT_EQ(l.fix()->dataset_taken(), want) << "replica " << k << " of " << R;
  if (me == 0)
    std::printf("[ dataset ] %d replica(s): 4 updates x 3 configurations each, the shards of "
                "DistributedSampler(16, %d, seed 5) epoch after epoch\n", R, R);
}

// the replicas' shards depend on the replicas, not on their ranks: 2
// replicas of 1 rank and of 2 ranks train the same model
TEST(TorchTrain, FixDatasetSameOnAnyRanksPerReplica)
{
  if (nprocs != 4) GTEST_SKIP() << "needs 4 ranks";
  const std::string file = dataset();
  MPI_Comm two;
  MPI_Comm_split(MPI_COMM_WORLD, me < 2 ? 0 : 1, me, &two);
  std::vector<double> ref;
  if (me < 2) {
    Lammps l(two, {"-partition", "2x1", "-plog", "none", "-pscreen", "none", "-in", "none"});
    l.cmds(dataset_run(file));
    ref = l.params();
  }
  MPI_Comm_free(&two);
  int nref = static_cast<int>(ref.size());
  MPI_Bcast(&nref, 1, MPI_INT, 0, MPI_COMM_WORLD);
  ref.resize(nref);
  MPI_Bcast(ref.data(), nref, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  Lammps l(MPI_COMM_WORLD, {"-partition", "2x2", "-plog", "none", "-pscreen", "none", "-in", "none"});
  l.cmds(dataset_run(file));
  const double d = rel_diff(l.params(), ref);
  if (me == 0)
    std::printf("[ dataset ] 2 replicas x 2 ranks vs 2 x 1: parameters %.2e (relative)\n", d);
  EXPECT_LE(d, 1e-10);
}

TEST(TorchTrain, FixDatasetBadInputIsAnError)
{
  const std::string good = dataset();
  std::string text;
  {
    std::ifstream in(good);
    text.assign((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  const std::string bad = shared_temp_file("fix_ge.xyz");
  if (me == 0) {
    std::string t = text;
    t.replace(t.find("\nSi "), 4, "\nGe ");
    std::ofstream(bad) << t;
  }
  MPI_Barrier(MPI_COMM_WORLD);
  Lammps l;
  l.cmds(silicon(2, 1, "ortho"));
  l.cmds({"pair_style torch", "pair_coeff * * " + student + " Si"});
  const std::string err = l.error_of({"fix ft all torch/finetune 2 " + teacher() + " dataset " + bad + " 2"});
  EXPECT_NE(err.find("Fix torch/finetune dataset: " + bad + " frame 1: atom 1 is Ge, which the model "
                     "does not have"), std::string::npos) << err;
}

// a restart file keeps the sampler's place: 2 updates + restart + 2 take
// the configurations (and give the parameters) of 4 updates in one run
TEST(TorchTrain, FixDatasetRestartContinuesTheSampler)
{
  if (nprocs > 1) GTEST_SKIP() << "one rank";
  const std::string file = dataset(), restart = shared_temp_file("dataset.restart");
  std::vector<int64_t> straight_taken;
  std::vector<double> straight;
  {
    Lammps l;
    l.cmds(dataset_run(file));
    straight_taken = l.fix()->dataset_taken();
    straight = l.params();
  }
  {
    Lammps l;
    auto c = dataset_run(file);
    c.back() = "run 4 post no";
    c.push_back("write_restart " + restart);
    l.cmds(c);
  }
  Lammps l;
  l.cmds({"read_restart " + restart, "pair_style torch", "pair_coeff * * " + student + " Si",
          "fix md all nve",
          "fix ft all torch/finetune 2 " + teacher() + " lr 1e-3 log 0 check 1 dataset " + file +
              " 3 dataset_seed 5 dataset_weight 0.5",
          "run 4 post no"});
  std::vector<int64_t> taken(straight_taken.begin(), straight_taken.begin() + 6);
  const auto after = l.fix()->dataset_taken();
  taken.insert(taken.end(), after.begin(), after.end());
  EXPECT_EQ(taken, straight_taken);
  const double d = rel_diff(l.params(), straight);
  std::printf("[ dataset ] 2 updates + restart + 2 vs 4: the same 12 configurations, parameters "
              "%.2e\n", d);
  EXPECT_LE(d, 1e-12);
  std::remove(restart.c_str());
}

// a frame's own weight (config_weight, as MACE names it) scales its loss:
// a frame of weight 2 trains as the frame given twice in one batch
TEST(TorchTrain, FrameWeightScalesItsLoss)
{
  // every rank makes the names and the dataset (collectives), rank 0 trains
  const std::string good = dataset();
  const std::string twice = shared_temp_file("twice.xyz"), weighted = shared_temp_file("weighted.xyz");
  if (me != 0) return;
  const auto frames = MLTorch::read_extxyz(good);
  {
    std::ofstream a(twice), b(weighted);
    MLTorch::LabelFrame f0 = frames[0], f1 = frames[1];
    a << MLTorch::format_frame(f0) << MLTorch::format_frame(f0) << MLTorch::format_frame(f1);
    f0.info.emplace_back("config_weight", "2");
    MLTorch::LabelFrame f1w = f1;
    f1w.info.emplace_back("config_weight", "1");
    b << MLTorch::format_frame(f0) << MLTorch::format_frame(f1w);
  }
  std::vector<double> p[2];
  // one SGD update each on the mean gradient: (2 g0 + g1) / 3 with lr 3e-3
  // against (2 g0 + g1) / 2 with lr 2e-3, the same step
  for (int k = 0; k < 2; ++k) {
    Lammps l(MPI_COMM_SELF);
    l.cmds(model_setup());
    l.cmd("torch/train " + (k ? weighted : twice) + " epochs 1 batch " + (k ? "2" : "3") +
          " optimizer sgd lr " + (k ? "2e-3" : "3e-3") + " weights 1 1 0.1");
    p[k] = model_params(l);
  }
  const double d = rel_diff(p[1], p[0]);
  std::printf("[ torch/train ] a frame of config_weight 2 vs the frame twice: parameters %.2e\n", d);
  EXPECT_LE(d, 1e-13);
  std::remove(twice.c_str());
  std::remove(weighted.c_str());
}

// energy_shift fit learns the dataset's energies too: 4 updates of 1 fresh
// label and 3 dataset configurations each make 16 configurations in the fit
TEST(TorchTrain, FixDatasetEnergiesJoinTheFit)
{
  const std::string file = dataset();
  Lammps l(MPI_COMM_WORLD, nprocs > 1 ? partitions() : std::vector<std::string>{});
  l.cmds(dataset_run(file, " energy_shift fit"));
  EXPECT_EQ(l.fix()->updates(), 4);
  EXPECT_EQ(l.fix()->energy_shift_configurations(), 16);
  ASSERT_EQ(l.fix()->energy_shift().size(), 1u);
  EXPECT_TRUE(std::isfinite(l.fix()->energy_shift()[0]));
}
