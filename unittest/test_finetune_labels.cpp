/* ----------------------------------------------------------------------
   ML-TORCH tests of fix torch/finetune `labels FILE`: every labelled
   configuration as an extended XYZ frame.
   - Labels.*  the frames are the teacher's labels: each frame's
               configuration recomputed by the teacher pair style (sw) in a
               LAMMPS of its own equals the frame's energy, forces and
               stress to 1e-12 (orthogonal and triclinic, 1 to 3 ranks);
               a continued run (restart file) leaves the file exactly as
               the uninterrupted run; a partial last frame (a killed job's)
               is cut off; only gated labels are written; bad settings
               are ERRORs
------------------------------------------------------------------------- */

#include "finetune_fixtures.h"

#include "compute.h"
#include "domain.h"
#include "force.h"
#include "modify.h"
#include "mltorch/labels.h"

#include <cstdio>
#include <filesystem>
#include <sstream>
#include <fstream>

namespace {

std::vector<std::string> labelled_run(const std::string &shape, const std::string &file,
                                      const std::string &extra = "", int steps = 16)
{
  auto c = silicon(2, 4321, shape);
  c.insert(c.end(), {"velocity all create 900 4928 loop geom", "pair_style torch",
                     "pair_coeff * * " + student + " Si", "neighbor 1.0 bin", "fix md all nve",
                     "fix ft all torch/finetune 2 " + teacher() +
                         " weights 1 1 0.1 lr 1e-3 log 0 check 0 labels " + file + " " + extra,
                     "run " + std::to_string(steps) + " post no"});
  return c;
}

// a configuration in a LAMMPS of its own (cell rows a, b, c as LAMMPS's
// restricted triclinic; positions [n][3]; remapped into the box or, with
// `remap` false, required inside it) with `pair` ("style;coeff"): energy,
// forces in atom order, virial W (xx yy zz xy xz yz, energy units)
struct Recomputed {
  double energy;
  std::vector<double> forces;
  double virial[6];
  double stress[9];    // ASE's: -W / V
};

Recomputed lammps_labels(const double *h, const std::vector<double> &x, const std::string &style,
                         const std::string &coeff, bool remap)
{
  Lammps l(MPI_COMM_SELF);
  EXPECT_EQ(h[1], 0.0);
  EXPECT_EQ(h[2], 0.0);
  EXPECT_EQ(h[5], 0.0);
  char region[256];
  std::snprintf(region, sizeof(region), "region box prism 0 %.17g 0 %.17g 0 %.17g %.17g %.17g %.17g",
                h[0], h[4], h[8], h[3], h[6], h[7]);
  l.cmds({"units metal", "atom_modify map array", region, "create_box 1 box", "mass 1 28.0855"});
  const std::size_t n = x.size() / 3;
  for (std::size_t i = 0; i < n; ++i) {
    char line[256];
    std::snprintf(line, sizeof(line), "create_atoms 1 single %.17g %.17g %.17g units box remap %s",
                  x[3 * i], x[3 * i + 1], x[3 * i + 2], remap ? "yes" : "no");
    l.cmd(line);
  }
  l.cmds({"pair_style " + style, "pair_coeff * * " + coeff, "compute pv all pressure NULL virial",
          "run 0 post no"});
  Recomputed r;
  EXPECT_EQ(l.natoms(), n) << "an atom of the configuration is outside its cell";
  r.energy = l.thermo("pe");
  r.forces = l.gather("f", 3);
  // pressure P_ab = W_ab / V * nktv2p; ASE's stress is -W / V
  auto *pv = l.lmp->modify->get_compute_by_id("pv");
  pv->compute_vector();
  const double *p = pv->vector, vol = h[0] * h[4] * h[8];
  for (int k = 0; k < 6; ++k) r.virial[k] = p[k] * vol / l.lmp->force->nktv2p;
  const double full[9] = {p[0], p[3], p[4], p[3], p[1], p[5], p[4], p[5], p[2]};
  for (int k = 0; k < 9; ++k) r.stress[k] = -full[k] / l.lmp->force->nktv2p;
  return r;
}

// the teacher (sw) on a frame's configuration, which must lie in its cell
Recomputed recompute(const MLTorch::LabelFrame &f)
{
  return lammps_labels(f.cell, f.positions, "sw", lammps_potentials + "/Si.sw Si", false);
}

}    // namespace

/* ----------------------------------------------------------------------
   every frame is the teacher's labels of its configuration
------------------------------------------------------------------------- */

class LabelsShapes : public ::testing::TestWithParam<std::string> {};

TEST_P(LabelsShapes, FramesAreTheTeachersLabels)
{
  const std::string shape = GetParam();
  const std::string file = shared_temp_file("labels_" + shape + ".xyz");
  if (me == 0) std::remove(file.c_str());
  Lammps l;
  l.cmds(labelled_run(shape, file));
  // the last frame's forces are the fix's own labels of the last configuration
  auto fx = l.fix();
  const auto &tags = fx->label_tags();
  const auto &lf = fx->label_forces();
  std::vector<double> mine(3 * l.natoms(), 0.0), fix_forces(3 * l.natoms());
  for (std::size_t i = 0; i < tags.size(); ++i)
    for (int k = 0; k < 3; ++k) mine[3 * (tags[i] - 1) + k] = lf[3 * i + k];
  MPI_Allreduce(mine.data(), fix_forces.data(), static_cast<int>(mine.size()), MPI_DOUBLE, MPI_SUM,
                MPI_COMM_WORLD);
  MPI_Barrier(MPI_COMM_WORLD);
  if (me != 0) return;
  const auto frames = MLTorch::read_extxyz(file);
  ASSERT_EQ(frames.size(), 8u);    // steps 2, 4, ..., 16
  double worst_e = 0.0, worst_f = 0.0, worst_s = 0.0;
  for (std::size_t k = 0; k < frames.size(); ++k) {
    const auto &f = frames[k];
    ASSERT_EQ(f.natoms(), 64u);
    EXPECT_EQ(*f.find("step"), std::to_string(2 * (k + 1)));
    EXPECT_EQ(*f.find("replica"), "0");
    EXPECT_EQ(*f.find("config_hash"), MLTorch::configuration_hash(f));
    EXPECT_TRUE(f.has_energy && f.has_stress);
    for (const auto &s : f.species) EXPECT_EQ(s, "Si");
    const Recomputed r = recompute(f);
    worst_e = std::max(worst_e, std::fabs(f.energy - r.energy) / std::fabs(r.energy));
    worst_f = std::max(worst_f, rel_diff(f.forces, r.forces));
    const std::vector<double> fs(f.stress, f.stress + 9), rs(r.stress, r.stress + 9);
    worst_s = std::max(worst_s, rel_diff(fs, rs));
  }
  std::printf("[ labels %s ] %zu frames on %d rank(s) vs sw recomputed from the file: energy %.2e, "
              "forces %.2e, stress %.2e (relative)\n",
              shape.c_str(), frames.size(), nprocs, worst_e, worst_f, worst_s);
  EXPECT_LE(worst_e, 1e-12);
  EXPECT_LE(worst_f, 1e-12);
  EXPECT_LE(worst_s, 1e-12);
  EXPECT_EQ(frames.back().forces, fix_forces);    // bitwise: %.17g reads back
  std::remove(file.c_str());
}

INSTANTIATE_TEST_SUITE_P(Labels, LabelsShapes, ::testing::Values("ortho", "triclinic"));

/* ----------------------------------------------------------------------
   a run continued from a restart file leaves the file as the uninterrupted
   run does: the frames written after the restart file (the job went on,
   then died) are cut off and written again
------------------------------------------------------------------------- */

TEST(Labels, RestartContinuesTheFileExactly)
{
  const std::string a = shared_temp_file("straight.xyz"), b = shared_temp_file("continued.xyz");
  const std::string restart = shared_temp_file("labels.restart");
  if (me == 0) {
    std::remove(a.c_str());
    std::remove(b.c_str());
  }
  {
    Lammps l;
    l.cmds(labelled_run("ortho", a, "", 16));
  }
  {
    Lammps l;
    auto c = labelled_run("ortho", b, "", 8);
    c.push_back("write_restart " + restart);
    c.push_back("run 6 post no");    // 3 frames the restart file does not know
    l.cmds(c);
  }
  int64_t frames_before = 0;
  if (me == 0) frames_before = MLTorch::scan_frames(b).frames;
  {
    Lammps l;
    l.cmds({"read_restart " + restart, "pair_style torch", "pair_coeff * * " + student + " Si",
            "neighbor 1.0 bin", "fix md all nve",
            "fix ft all torch/finetune 2 " + teacher() +
                " weights 1 1 0.1 lr 1e-3 log 0 check 0 labels " + b,
            "run 8 post no"});
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (me != 0) return;
  EXPECT_EQ(frames_before, 7);
  const auto fa = MLTorch::read_extxyz(a), fb = MLTorch::read_extxyz(b);
  ASSERT_EQ(fa.size(), 8u);
  ASSERT_EQ(fb.size(), 8u);
  double worst = 0.0;
  for (std::size_t k = 0; k < fa.size(); ++k) {
    EXPECT_EQ(*fa[k].find("step"), *fb[k].find("step"));
    worst = std::max({worst, rel_diff(fa[k].positions, fb[k].positions),
                      rel_diff(fa[k].forces, fb[k].forces),
                      std::fabs(fa[k].energy - fb[k].energy) / std::fabs(fa[k].energy)});
  }
  std::printf("[ labels restart ] 8 frames straight vs 4 + restart (+3 cut) + 4: largest relative "
              "difference %.2e\n", worst);
  EXPECT_LE(worst, 1e-12);
  for (const auto &f : {a, b, restart}) std::remove(f.c_str());
}

/* ----------------------------------------------------------------------
   a partial last frame (a job killed inside a write) is cut off when the
   file is next opened; every complete frame stays
------------------------------------------------------------------------- */

TEST(Labels, PartialLastFrameIsCutOff)
{
  const std::string file = shared_temp_file("partial.xyz");
  if (me == 0) std::remove(file.c_str());
  {
    Lammps l;
    l.cmds(labelled_run("ortho", file, "", 4));
  }
  std::string whole;
  if (me == 0) {
    std::ifstream in(file, std::ios::binary);
    whole.assign((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    // half of a third frame, as a killed writer leaves it
    std::ofstream(file, std::ios::app | std::ios::binary) << whole.substr(0, whole.size() / 3);
    EXPECT_THROW(MLTorch::read_extxyz(file), MLTorch::LabelsError);
    const auto disk = MLTorch::scan_frames(file);
    EXPECT_EQ(disk.frames, 2);
    EXPECT_EQ(disk.bytes, static_cast<int64_t>(whole.size()));
  }
  MPI_Barrier(MPI_COMM_WORLD);
  {
    Lammps l;
    l.cmds(labelled_run("ortho", file, "", 4));
  }
  if (me == 0) {
    const auto frames = MLTorch::read_extxyz(file);
    EXPECT_EQ(frames.size(), 4u);
    std::remove(file.c_str());
  }
}

/* ----------------------------------------------------------------------
   gated labelling: only the configurations the teacher labelled, each
   with its committee deviation (inside the window)
------------------------------------------------------------------------- */

TEST(Labels, GatedRunWritesOnlyItsLabels)
{
  const std::string file = shared_temp_file("gated.xyz");
  if (me == 0) std::remove(file.c_str());
  Lammps l;
  auto c = silicon(2, 4321, "ortho");
  c.insert(c.end(), {"velocity all create 900 4928 loop geom", "pair_style torch",
                     "pair_coeff * * " + committee_files() + " Si", "fix md all nve",
                     "fix ft all torch/finetune 1 " + teacher() +
                         " log 0 check 0 uncertainty 0.08 1e6 labels " + file,
                     "run 30 post no"});
  l.cmds(c);
  const double calls = l.fix()->compute_vector(13), saved = l.fix()->compute_vector(14);
  MPI_Barrier(MPI_COMM_WORLD);
  if (me != 0) return;
  const auto frames = MLTorch::read_extxyz(file);
  std::printf("[ labels gated ] %zu frames, %g teacher calls, %g saved\n", frames.size(), calls, saved);
  EXPECT_EQ(static_cast<double>(frames.size()), calls);
  EXPECT_GT(saved, 0.0);
  for (const auto &f : frames) {
    ASSERT_NE(f.find("deviation"), nullptr);
    const double d = std::stod(*f.find("deviation"));
    EXPECT_GE(d, 0.08);
    EXPECT_LT(d, 1e6);
  }
  std::remove(file.c_str());
}

TEST(Labels, BadSettingsAreErrors)
{
  Lammps l;
  l.cmds(silicon(2, 1, "ortho"));
  l.cmds({"pair_style torch", "pair_coeff * * " + student + " Si"});
  std::string err = l.error_of({"fix ft all torch/finetune 2 " + teacher() + " labels"});
  EXPECT_NE(err.find("fix torch/finetune labels"), std::string::npos) << err;
  // a folder that does not exist: an ERROR at the run, nothing trained
  err = l.error_of({"fix ft all torch/finetune 2 " + teacher() + " labels /nonexistent/dir/l.xyz",
                    "run 2 post no"});
  EXPECT_NE(err.find("Fix torch/finetune labels: cannot open the label file /nonexistent/dir/l.xyz"),
            std::string::npos) << err;
}

/* ----------------------------------------------------------------------
   replicas (one partition per rank): replica k writes FILE with ".k"
   before the extension, its own trajectory's labels
------------------------------------------------------------------------- */

TEST(Labels, EachReplicaWritesItsOwnFile)
{
  if (nprocs < 2) GTEST_SKIP() << "needs >= 2 MPI ranks";
  const std::string base = shared_temp_file("replicas.xyz");
  const std::string stem = base.substr(0, base.size() - 4);
  auto mine_of = [&](int k) { return stem + "." + std::to_string(k) + ".xyz"; };
  std::remove(mine_of(me).c_str());
  MPI_Barrier(MPI_COMM_WORLD);
  {
    Lammps l(MPI_COMM_WORLD, partitions());
    std::string temps;
    for (int w = 0; w < nprocs; ++w) temps += " " + std::to_string(300 + 400 * w);
    l.cmd("variable T world" + temps);
    l.cmds(silicon(2, 31, "ortho"));
    l.cmds({"velocity all create ${T} 1001 loop geom", "pair_style torch",
            "pair_coeff * * " + student + " Si", "fix md all nve",
            "fix ft all torch/finetune 2 " + teacher() + " log 0 check 1 labels " + base,
            "run 16 post no"});
  }
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_FALSE(std::filesystem::exists(base));
  const auto frames = MLTorch::read_extxyz(mine_of(me));
  ASSERT_EQ(frames.size(), 8u) << mine_of(me);
  for (const auto &f : frames) EXPECT_EQ(*f.find("replica"), std::to_string(me));
  const Recomputed r = recompute(frames.back());
  EXPECT_LE(std::fabs(frames.back().energy - r.energy), 1e-12 * std::fabs(r.energy));
  EXPECT_LE(rel_diff(frames.back().forces, r.forces), 1e-12);
  // the replicas ran different trajectories
  double e = frames.back().energy, e0 = e;
  MPI_Bcast(&e0, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  if (me > 0) EXPECT_NE(e, e0);
  std::remove(mine_of(me).c_str());
}

/* ----------------------------------------------------------------------
   the core's periodic graph (no LAMMPS) against pair_style torch's graph
   of the same configuration: energy, forces and virial to 1e-12, for a
   local and a message-passing model, a displaced triclinic cell of 64
   atoms and a 2-atom cell smaller than the cutoff in every direction
------------------------------------------------------------------------- */

#include "mltorch/model.h"
#include "mltorch/periodic_graph.h"
#include "mltorch/runtime.h"

namespace {

struct Config {
  double cell[9];    // rows a, b, c (LAMMPS's restricted triclinic)
  std::vector<double> x;
};

}    // namespace

TEST(CoreGraph, EqualsPairStyle)
{
  if (me != 0) GTEST_SKIP() << "one rank";
  // a displaced triclinic cell of 64 atoms
  Config big;
  {
    Lammps l(MPI_COMM_SELF);
    l.cmds(silicon(2, 77, "triclinic"));
    l.cmds({"displace_atoms all random 0.2 0.2 0.2 991 units box"});
    auto *d = l.lmp->domain;
    const double cell[9] = {d->xprd, 0, 0, d->xy, d->yprd, 0, d->xz, d->yz, d->zprd};
    std::copy(cell, cell + 9, big.cell);
    big.x = l.gather("x", 3);
  }
  // the 2-atom primitive cell of diamond Si (|a| = 3.84 A < the 4 A cutoff),
  // as LAMMPS's restricted triclinic: a along x, b in the xy plane
  Config small;
  {
    const double a0 = 5.431, l = a0 / std::sqrt(2.0);
    const double bx = l * 0.5, by = l * std::sqrt(3.0) / 2.0;
    const double cx = l * 0.5, cy = l / (2.0 * std::sqrt(3.0)), cz = l * std::sqrt(2.0 / 3.0);
    const double cell[9] = {l, 0, 0, bx, by, 0, cx, cy, cz};
    std::copy(cell, cell + 9, small.cell);
    // fractional (0,0,0) and (1/4,1/4,1/4), the second displaced
    small.x = {0.0, 0.0, 0.0, 0.25 * (l + bx + cx) + 0.07, 0.25 * (by + cy) - 0.05, 0.25 * cz + 0.03};
  }
  const bool pbc[3] = {true, true, true};
  for (const std::string name : {"si_local.pt", "si_mp2.pt"}) {
    const std::string file = potentials + "/" + name;
    MLTorch::Model model(MLTorch::read_file(file), file, "cpu");
    for (const Config *c : {&big, &small}) {
      const Recomputed ref = lammps_labels(c->cell, c->x, "torch", file + " Si", true);
      const double e_l = ref.energy, *w_l = ref.virial;
      const std::vector<double> &f_l = ref.forces;
      const std::vector<int64_t> species(c->x.size() / 3, 0);
      const auto g = MLTorch::periodic_graph(c->cell, pbc, c->x.data(), species,
                                             model.metadata().cutoff);
      MLTorch::GraphOutput out;
      model.evaluate(g.input(), out, false);
      std::vector<double> f_c;
      double w_c[6];
      MLTorch::graph_forces_virial(g, out.edge_grad, f_c, w_c);
      const std::vector<double> wl(w_l, w_l + 6), wc(w_c, w_c + 6);
      const double de = std::fabs(out.energy - e_l) / std::fabs(e_l), df = rel_diff(f_c, f_l),
                   dw = rel_diff(wc, wl);
      std::printf("[ core graph ] %s, %zu atoms, %lld edges: energy %.2e, forces %.2e, virial %.2e "
                  "(relative, against pair_style torch)\n",
                  name.c_str(), species.size(), static_cast<long long>(g.input().n_edges), de, df, dw);
      EXPECT_LE(de, 1e-12);
      EXPECT_LE(df, 1e-12);
      EXPECT_LE(dw, 1e-12);
    }
  }
}

/* ----------------------------------------------------------------------
   the shards are torch.utils.data.DistributedSampler's own (PyTorch run
   beside the test): R = 1, 2, 3, with padding and with drop_last, several
   epochs and dataset sizes
------------------------------------------------------------------------- */

#include "mltorch/sampler.h"

#include "json.h"    // LAMMPS's copy of nlohmann/json

TEST(CoreSampler, EqualsDistributedSampler)
{
  if (me != 0) GTEST_SKIP() << "one rank";
  const char *py = std::getenv("ML_TORCH_PYTHON_EXE");
  ASSERT_NE(py, nullptr) << "ML_TORCH_PYTHON_EXE names the Python with torch";
  // rank 0 alone: names of its own, no collective
  const std::string out = ::testing::TempDir() + "/mlt" + std::to_string(getpid()) + "_sampler.json";
  const std::string code =
      "import json, torch\n"
      "from torch.utils.data import DistributedSampler\n"
      "res = {}\n"
      "for n in (1, 2, 7, 10, 12):\n"
      "  for R in (1, 2, 3):\n"
      "    for drop in (False, True):\n"
      "      for epoch in (0, 1, 5):\n"
      "        for k in range(R):\n"
      "          s = DistributedSampler(range(n), num_replicas=R, rank=k, shuffle=True, seed=42, drop_last=drop)\n"
      "          s.set_epoch(epoch)\n"
      "          res[f'{n} {R} {int(drop)} {epoch} {k}'] = list(s)\n"
      "json.dump(res, open('" + out + "', 'w'))\n";
  const std::string script = out + ".py";
  std::ofstream(script) << code;
  ASSERT_EQ(std::system((std::string(py) + " " + script).c_str()), 0);
  std::ifstream in(out);
  const auto want = LAMMPS_NS::json::parse(in);
  int compared = 0;
  for (auto it = want.begin(); it != want.end(); ++it) {
    std::istringstream key(it.key());
    int64_t n, epoch;
    int R, drop, k;
    key >> n >> R >> drop >> epoch >> k;
    const auto got = MLTorch::distributed_shard(n, R, k, 42, epoch, true, drop != 0);
    const std::vector<int64_t> expected = it.value().get<std::vector<int64_t>>();
    EXPECT_EQ(got, expected) << it.key();
    EXPECT_EQ(static_cast<int64_t>(got.size()), MLTorch::distributed_shard_size(n, R, drop != 0))
        << it.key();
    ++compared;
  }
  std::printf("[ sampler ] %d shards equal DistributedSampler's (n 1-12, R 1-3, padding and "
              "drop_last, epochs 0, 1, 5)\n", compared);
  EXPECT_EQ(compared, 5 * 6 * 2 * 3);
  std::remove(out.c_str());
  std::remove(script.c_str());
}
