/* ----------------------------------------------------------------------
   ML-TORCH: fix torch/finetune on top of pair_style torch/kk: labels and
   the loss gradient in every comm mode, and a trajectory with updates,
   against pair_style torch. Run under mpirun (1 and 4 ranks).
------------------------------------------------------------------------- */

#include "kokkos_fixtures.h"

/* ----------------------------------------------------------------------
   fix torch/finetune on top of torch/kk: the same gradient as on torch
------------------------------------------------------------------------- */

static std::vector<double> finetune_gradient(bool kokkos, const std::string &model = "si_local.pt",
                                             const std::vector<std::string> &package = {},
                                             std::vector<double> *labels = nullptr)
{
  Lammps l(kokkos, package);
  l.cmds(lattice("lattice diamond 5.431", 28.0855, 2, false));
  l.cmds({"pair_style torch", "pair_coeff * * " + potentials + "/" + model + " Si",
          "fix ft all torch/finetune 1 teacher sw \"* * " + lammps_potentials +
              "/Si.sw Si\" weights 1.0 10.0 1.0 optimizer sgd lr 1e-12 log 0",
          "run 1 post no"});
  auto fix = LAMMPS_NS::FixTorchFinetuneProbe::of(l.lmp);
  if (labels && fix) {
    // by atom ID over all ranks (the rank's local order may differ)
    const auto &tags = fix->label_tags();
    const auto &fl = fix->label_forces();
    std::vector<double> mine(3 * l.natoms(), 0.0);
    for (std::size_t i = 0; i < tags.size(); ++i)
      for (int k = 0; k < 3; ++k) mine[3 * (tags[i] - 1) + k] = fl[3 * i + k];
    labels->assign(mine.size(), 0.0);
    MPI_Allreduce(mine.data(), labels->data(), static_cast<int>(mine.size()), MPI_DOUBLE, MPI_SUM,
                  MPI_COMM_WORLD);
  }
  return fix ? fix->last_gradient() : std::vector<double>();
}

/* ----------------------------------------------------------------------
   teacher labels and the gradient (of a layered model, through the device
   halo exchange) are the same for every KOKKOS communication mode: the
   labels are summed by the fix's own reverse communication on the host
------------------------------------------------------------------------- */

TEST(KokkosFinetune, LabelsAndGradientForEveryCommMode)
{
  std::vector<double> labels_cpu;
  const auto g_cpu = finetune_gradient(false, "si_mp2.pt", {}, &labels_cpu);
  ASSERT_GT(g_cpu.size(), 1000u);
  ASSERT_GT(labels_cpu.size(), 0u);
  for (const std::string mode : {"device", "host", "no"}) {
    std::vector<double> labels;
    const auto g = finetune_gradient(true, "si_mp2.pt", {"comm", mode}, &labels);
    const double dg = rel(g, g_cpu), dl = rel(labels, labels_cpu);
    if (me == 0)
      std::printf("[ finetune ] -pk kokkos comm %s: labels %.3g, gradient %.3g vs torch\n",
                  mode.c_str(), dl, dg);
    EXPECT_LE(dl, 1e-12) << mode;
    EXPECT_LE(dg, 1e-10) << mode;
  }
}

TEST(KokkosFinetune, GradientEqualsCpuStyle)
{
  const auto g_cpu = finetune_gradient(false);
  const auto g_kk = finetune_gradient(true);
  ASSERT_GT(g_cpu.size(), 1000u);
  const double d = rel(g_kk, g_cpu);
  if (me == 0) std::printf("[ finetune ] gradient with torch/kk vs torch: %.3g\n", d);
  EXPECT_LE(d, 1e-10);
}

/* ----------------------------------------------------------------------
   a run with real updates: fix torch/finetune reads and changes forces on
   the host on its labelling steps only (empty KOKKOS masks); the trajectory
   equals the one on pair_style torch
------------------------------------------------------------------------- */

static Snapshot finetune_run(bool kokkos)
{
  Lammps l(kokkos);
  l.cmds(lattice("lattice diamond 5.431", 28.0855, 2, false));
  l.cmds({"pair_style torch", "pair_coeff * * " + potentials + "/si_local.pt Si",
          "fix ft all torch/finetune 5 teacher sw \"* * " + lammps_potentials +
              "/Si.sw Si\" weights 1.0 10.0 0.0 optimizer adam lr 1e-3 log 0",
          "fix md all nve", "thermo_style custom step pe press f_ft[1]", "run 20 post no"});
  Snapshot r;
  r.pe = l.thermo("pe");
  r.press = l.thermo("press");
  r.f = l.gather("f", 3);
  auto fix = LAMMPS_NS::FixTorchFinetuneProbe::of(l.lmp);
  // the loss of the last update, and the number of updates
  r.virial = {fix ? fix->compute_vector(0) : -1.0, fix ? static_cast<double>(fix->updates()) : -1.0};
  return r;
}

TEST(KokkosFinetune, TrajectoryWithUpdatesEqualsCpuStyle)
{
  const auto cpu = finetune_run(false);
  const auto kk = finetune_run(true);
  const double d[3] = {rel(kk.pe, cpu.pe), rel(kk.f, cpu.f), rel(kk.virial, cpu.virial)};
  if (me == 0)
    std::printf("[ finetune ] 20 steps, 4 updates, torch/kk vs torch: pe %.2g f %.2g loss %.2g\n",
                d[0], d[1], d[2]);
  EXPECT_GT(cpu.virial[0], 0.0);    // a real loss
  EXPECT_EQ(cpu.virial[1], 4.0);    // updates on steps 5, 10, 15 and 20
  for (double v : d) EXPECT_LE(v, 1e-9);
}
