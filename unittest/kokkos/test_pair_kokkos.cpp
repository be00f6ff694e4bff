/* ----------------------------------------------------------------------
   ML-TORCH: pair_style torch/kk (-k on -sf kk) against pair_style torch
   and LAMMPS's native styles; buffer capacities; fixed padding; empty
   ranks, threads, errors. fix torch/finetune on top of torch/kk:
   test_pair_kokkos_finetune.cpp. Run under mpirun (1 and 4 ranks).
------------------------------------------------------------------------- */

#include "kokkos_fixtures.h"

/* ----------------------------------------------------------------------
   torch/kk == torch (and == native) on the same input
------------------------------------------------------------------------- */

struct Case {
  std::string name;
  std::vector<std::string> setup;
  std::string model, element, native_pair, native_coeff;
  std::string kk_model = "";    // another file for torch/kk (a compiled package)
  std::string pair = "pair_style torch";
};

static void PrintTo(const Case &c, std::ostream *os)
{
  *os << c.name;
}

class KokkosVsCpu : public ::testing::TestWithParam<Case> {};

TEST_P(KokkosVsCpu, SameNumbers)
{
  const auto &c = GetParam();
  const System sys{c.name, c.setup, ""};
  const std::string coeff = "pair_coeff * * " + c.model + " " + c.element;
  const std::string kk_coeff =
      c.kk_model.empty() ? coeff : "pair_coeff * * " + c.kk_model + " " + c.element;
  Snapshot cpu, kk, native;
  {
    Lammps l(false);
    cpu = run(l, sys, c.pair, coeff, 20);
  }
  {
    Lammps l(true);
    kk = run(l, sys, c.pair, kk_coeff, 20);    // -sf kk makes it torch/kk
    EXPECT_NE(std::string(l.lmp->force->pair_style).find("torch/kk"), std::string::npos);
  }
  const double d[5] = {rel(kk.pe, cpu.pe), rel(kk.f, cpu.f), rel(kk.virial, cpu.virial),
                       rel(kk.pe_atom, cpu.pe_atom), rel(kk.s_atom, cpu.s_atom)};
  if (me == 0)
    std::printf("[ torch/kk ] %s on %d rank(s) vs torch after 20 steps: pe %.2g f %.2g virial %.2g "
                "pe/atom %.2g stress/atom %.2g\n",
                c.name.c_str(), nprocs, d[0], d[1], d[2], d[3], d[4]);
  for (double v : d) EXPECT_LE(v, 1e-12);
  EXPECT_GT(std::fabs(cpu.virial[0]), 1.0);    // a real pressure was compared
  if (!c.native_pair.empty()) {
    Lammps l(false);
    native = run(l, sys, c.native_pair, c.native_coeff, 20);
    const double n[3] = {rel(kk.pe, native.pe), rel(kk.f, native.f), rel(kk.virial, native.virial)};
    if (me == 0)
      std::printf("[ torch/kk ] %s vs native %s: pe %.2g f %.2g virial %.2g\n", c.name.c_str(),
                  c.native_pair.c_str(), n[0], n[1], n[2]);
    for (double v : n) EXPECT_LE(v, 1e-10);
  }
}

static std::vector<Case> cases()
{
  const std::string sw = "pair_coeff * * " + lammps_potentials + "/Si.sw Si";
  return {
      {"lj", lattice("lattice fcc 5.26", 39.948, 4, false), potentials + "/lj_Ar.pt", "Ar",
       "pair_style lj/cut 8.5", "pair_coeff * * 0.0104 3.40"},
      {"sw", lattice("lattice diamond 5.431", 28.0855, 3, false), potentials + "/sw_Si.pt", "Si",
       "pair_style sw", sw},
      {"sw_triclinic", lattice("lattice diamond 5.431", 28.0855, 3, true), potentials + "/sw_Si.pt",
       "Si", "pair_style sw", sw},
      {"si_local", lattice("lattice diamond 5.431", 28.0855, 3, false), potentials + "/si_local.pt",
       "Si", "", ""},
      {"si_mp2", lattice("lattice diamond 5.431", 28.0855, 3, false), potentials + "/si_mp2.pt", "Si",
       "", ""},
      // layered models: the per-layer halo exchange on the device (default), and thick ghosts
      {"si_mp4_exchange", lattice("lattice diamond 5.431", 28.0855, 3, true),
       test_models + "/si_mp4_layered.pt", "Si", "", ""},
      {"si_mp2_thick", lattice("lattice diamond 5.431", 28.0855, 3, false), potentials + "/si_mp2.pt",
       "Si", "", "", "", "pair_style torch halo thick"},
      // compiled packages (tools/compile_models.sh) on torch/kk vs their TorchScript models on torch
      {"si_local_compiled", lattice("lattice diamond 5.431", 28.0855, 3, false),
       potentials + "/si_local.pt", "Si", "", "", potentials + "/si_local.pt2"},
      {"si_mp2_compiled", lattice("lattice diamond 5.431", 28.0855, 3, false),
       potentials + "/si_mp2.pt", "Si", "", "", potentials + "/si_mp2.pt2"},
      // a committee: MD on the mean of two members' forces
      {"si_committee_mean", lattice("lattice diamond 5.431", 28.0855, 3, false),
       potentials + "/si_local.pt " + test_models + "/si_local_perturbed.pt", "Si", "", "", "",
       "pair_style torch committee mean"},
  };
}

INSTANTIATE_TEST_SUITE_P(Models, KokkosVsCpu, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case> &info) { return info.param.name; });

/* ----------------------------------------------------------------------
   torch/kk as a sub-style of KOKKOS's hybrid/overlay/kk, with sw/kk on
   top (as a D3 correction sits on a model): the sum of the two styles run
   alone, and pair_style torch inside the CPU hybrid after 20 NVE steps;
   the layers' halo exchange and thick ghosts
------------------------------------------------------------------------- */

static Snapshot operator+(Snapshot a, const Snapshot &b)
{
  a.pe += b.pe;
  for (auto [x, y] : {std::pair{&a.f, &b.f}, {&a.pe_atom, &b.pe_atom}, {&a.s_atom, &b.s_atom},
                      {&a.virial, &b.virial}})
    for (std::size_t i = 0; i < x->size() && i < y->size(); ++i) (*x)[i] += (*y)[i];
  return a;
}

TEST(KokkosHybrid, OverlayEqualsSumAndCpuHybrid)
{
  const std::string sw = "pair_coeff * * sw " + lammps_potentials + "/Si.sw Si";
  struct HybridCase {
    std::string name, model, halo;
    bool triclinic;
  };
  const HybridCase hcases[] = {{"si_mp2_exchange", potentials + "/si_mp2.pt", "", false},
                               {"si_mp4_exchange_triclinic", test_models + "/si_mp4_layered.pt", "",
                                true},
                               {"si_mp2_thick", potentials + "/si_mp2.pt", " halo thick", false}};
  for (const auto &c : hcases) {
    const System sys{c.name, lattice("lattice diamond 5.431", 28.0855, 3, c.triclinic), ""};
    const std::string torch = "pair_style torch" + c.halo;
    const std::string hybrid = "pair_style hybrid/overlay torch" + c.halo + " sw";
    const std::string hcoeff = "pair_coeff * * torch " + c.model + " Si\n" + sw;
    Snapshot alone, both, cpu, kk;
    {
      Lammps l(true);
      alone = run(l, sys, torch, "pair_coeff * * " + c.model + " Si", 0);
    }
    {
      Lammps l(true);
      alone = alone + run(l, sys, "pair_style sw", "pair_coeff * * " + lammps_potentials + "/Si.sw Si", 0);
    }
    {
      Lammps l(true);
      both = run(l, sys, hybrid, hcoeff, 0);
      EXPECT_EQ(std::string(l.lmp->force->pair_style), "hybrid/overlay/kk");
      const auto *sub = l.lmp->force->pair_match("torch", 1);
      ASSERT_NE(sub, nullptr);
      EXPECT_EQ(sub->kokkosable, 1) << "the torch sub-style is not torch/kk";
    }
    {
      Lammps l(false);
      cpu = run(l, sys, hybrid, hcoeff, 20);
    }
    {
      Lammps l(true);
      kk = run(l, sys, hybrid, hcoeff, 20);
    }
    const double s[5] = {rel(both.pe, alone.pe), rel(both.f, alone.f), rel(both.virial, alone.virial),
                         rel(both.pe_atom, alone.pe_atom), rel(both.s_atom, alone.s_atom)};
    const double d[5] = {rel(kk.pe, cpu.pe), rel(kk.f, cpu.f), rel(kk.virial, cpu.virial),
                         rel(kk.pe_atom, cpu.pe_atom), rel(kk.s_atom, cpu.s_atom)};
    if (me == 0)
      std::printf("[ hybrid/kk ] %s on %d rank(s): overlay vs the styles alone: pe %.2g f %.2g "
                  "virial %.2g pe/atom %.2g stress/atom %.2g; after 20 steps vs the CPU hybrid: pe "
                  "%.2g f %.2g virial %.2g pe/atom %.2g stress/atom %.2g\n",
                  c.name.c_str(), nprocs, s[0], s[1], s[2], s[3], s[4], d[0], d[1], d[2], d[3],
                  d[4]);
    for (double v : s) EXPECT_LE(v, 1e-12) << c.name;
    for (double v : d) EXPECT_LE(v, 1e-12) << c.name;
    EXPECT_GT(std::fabs(alone.virial[0]), 1.0);
  }
}

/* ----------------------------------------------------------------------
   committee deviation with torch/kk (evaluated on the host graph of the
   device data) == with torch, after 10 NVE steps on the first member
------------------------------------------------------------------------- */

TEST(KokkosCommittee, DeviationEqualsCpuStyle)
{
  std::vector<double> dev[2], vec[2];
  for (int kokkos = 0; kokkos < 2; ++kokkos) {
    Lammps l(kokkos == 1);
    l.cmds(lattice("lattice diamond 5.431", 28.0855, 3, false));
    l.cmds({"pair_style torch",
            "pair_coeff * * " + potentials + "/si_local.pt " + test_models + "/si_local_perturbed.pt Si",
            "compute dev all torch/deviation", "thermo_style custom step pe c_dev[*]",
            "fix md all nve", "run 10 post no"});
    dev[kokkos] = l.gather("c_dev", 2);
    auto *v = static_cast<double *>(lammps_extract_compute(l.lmp, "dev", LMP_STYLE_GLOBAL, LMP_TYPE_VECTOR));
    vec[kokkos].assign(v, v + 10);
  }
  const double dd = rel(dev[1], dev[0]), dv = rel(vec[1], vec[0]);
  if (me == 0)
    std::printf("[ torch/kk ] committee deviation on %d rank(s) vs torch: per atom %.2g, "
                "statistics %.2g (max devi_f %.4g)\n", nprocs, dd, dv, vec[0][0]);
  EXPECT_GT(vec[0][0], 1e-3);
  // doc/compute_torch_deviation.rst: 1e-13 (measured 1.9e-14 per atom, 4.4e-15 statistics)
  EXPECT_LE(dd, 1e-13);
  EXPECT_LE(dv, 1e-13);
}

/* ----------------------------------------------------------------------
   committee mean with torch/kk == with torch: the MD on the members' mean
   energy and forces (10 NVE steps), which is not the first member's
------------------------------------------------------------------------- */

TEST(KokkosCommittee, MeanEqualsCpuStyle)
{
  double pe[2] = {0, 0}, pe0 = 0.0;
  std::vector<double> f[2], pe_atom[2];
  const std::string coeff =
      "pair_coeff * * " + potentials + "/si_local.pt " + test_models + "/si_local_perturbed.pt Si";
  for (int kokkos = 0; kokkos < 2; ++kokkos) {
    Lammps l(kokkos == 1);
    l.cmds(lattice("lattice diamond 5.431", 28.0855, 3, false));
    l.cmds({"pair_style torch committee mean", coeff, "compute pa all pe/atom",
            "dump d all custom 1 /dev/null id c_pa", "run 0 post no"});
    if (kokkos == 0) pe0 = l.thermo("pe");
    l.cmds({"fix md all nve", "run 10 post no"});
    pe[kokkos] = l.thermo("pe");
    f[kokkos] = l.gather("f", 3);
    pe_atom[kokkos] = l.gather("c_pa", 1);
  }
  double pe_first = 0.0;
  {
    Lammps l(false);
    l.cmds(lattice("lattice diamond 5.431", 28.0855, 3, false));
    l.cmds({"pair_style torch committee first", coeff, "run 0 post no"});
    pe_first = l.thermo("pe");
  }
  const double de = std::fabs(pe[1] - pe[0]) / std::fabs(pe[0]);
  const double df = rel(f[1], f[0]), da = rel(pe_atom[1], pe_atom[0]);
  if (me == 0)
    std::printf("[ torch/kk ] committee mean on %d rank(s) vs torch: pe %.2g, forces %.2g, pe/atom "
                "%.2g (at step 0: mean %.8g, first member %.8g)\n",
                nprocs, de, df, da, pe0, pe_first);
  EXPECT_GT(std::fabs(pe0 - pe_first), 1e-4 * std::fabs(pe_first));    // the mean is not member 0
  EXPECT_LE(de, 1e-12);
  EXPECT_LE(df, 1e-12);
  EXPECT_LE(da, 1e-12);
}

/* ----------------------------------------------------------------------
   steady state allocates nothing; growth when atoms are added
------------------------------------------------------------------------- */

TEST(KokkosCapacity, NoAllocationInSteadyStateAndGrowth)
{
  const std::string data = ::testing::TempDir() + "/grown.data";
  Lammps l(true);
  // atoms fill two thirds of the box; more are added later
  l.cmds({"units metal", "atom_modify map array", "newton on", "lattice fcc 5.26",
          "region box block 0 3 0 3 0 3", "create_box 1 box", "region first block 0 1.9 0 3 0 3",
          "region rest block 1.9 3 0 3 0 3", "create_atoms 1 region first", "mass 1 39.948",
          "displace_atoms all random 0.1 0.1 0.1 4321 units box", "velocity all create 60 4928 loop geom",
          "pair_style torch", "pair_coeff * * " + potentials + "/lj_Ar.pt Ar", "fix md all nve",
          "run 100 post no"});
  const double warm = l.capacity_changes();
  l.cmd("run 1000 post no");
  const double steady = l.capacity_changes() - warm;
  l.cmd("create_atoms 1 region rest");
  l.cmd("run 5 post no");
  const double added = l.capacity_changes() - warm - steady;
  l.cmd("change_box all x scale 0.85 y scale 0.85 z scale 0.85 remap");
  l.cmd("run 0 post no");    // forces of the compressed state (a run would blow it apart)
  const double denser = l.capacity_changes() - warm - steady - added;
  if (me == 0)
    std::printf("[ capacity ] allocations: %g in warm-up, %g in 1000 steady steps, %g after "
                "create_atoms, %g after compression\n", warm, steady, added, denser);
  EXPECT_GE(warm, 2.0);
  EXPECT_EQ(steady, 0.0);
  EXPECT_GT(added, 0.0);
  EXPECT_GT(denser, 0.0);
  // the grown buffers give the CPU style's numbers on the same atoms
  l.cmd("write_data " + data);
  l.cmd("run 0 post no");
  const double pe_kk = l.thermo("pe"), p_kk = l.thermo("press");
  Lammps c(false);
  c.cmds({"units metal", "atom_modify map array", "read_data " + data, "pair_style torch",
          "pair_coeff * * " + potentials + "/lj_Ar.pt Ar", "run 0 post no"});
  EXPECT_LE(rel(pe_kk, c.thermo("pe")), 1e-12);
  EXPECT_LE(rel(p_kk, c.thermo("press")), 1e-11);
  std::remove(data.c_str());
}

/* ----------------------------------------------------------------------
   fixed capacity (padding with masked dummy entries) == growing buffers
------------------------------------------------------------------------- */

// si_mp2 on torch/kk with `pad_args` against growing buffers: relative
// deviations of pe, f, virial, pe/atom, and the allocations with padding
static std::vector<double> padded_vs_growing(const std::string &pad_args, double &changes,
                                             const std::string &pad_model = "si_mp2.pt",
                                             std::string *log_text = nullptr)
{
  const System sys{"mp", lattice("lattice diamond 5.431", 28.0855, 3, false), ""};
  const std::string coeff = "pair_coeff * * " + potentials + "/si_mp2.pt Si";
  const std::string pad_coeff = "pair_coeff * * " + potentials + "/" + pad_model + " Si";
  Snapshot grow, pad;
  {
    Lammps l(true);
    grow = run(l, sys, "pair_style torch", coeff, 10);
  }
  {
    Lammps l(true);
    // the padded run's log (its WARNINGs), one file per rank's test process
    const std::string log =
        ::testing::TempDir() + "/padding." + std::to_string(static_cast<long>(getpid())) + ".log";
    if (log_text) l.cmd("log " + log);
    pad = run(l, sys, "pair_style torch " + pad_args, pad_coeff, 10);
    changes = l.capacity_changes();
    if (log_text) {
      l.cmd("log none");
      std::ifstream in(log);
      std::stringstream ss;
      ss << in.rdbuf();
      *log_text = ss.str();
      if (me == 0) std::remove(log.c_str());
    }
  }
  const std::vector<double> d{rel(pad.pe, grow.pe), rel(pad.f, grow.f), rel(pad.virial, grow.virial),
                              rel(pad.pe_atom, grow.pe_atom)};
  if (me == 0)
    std::printf("[ padding ] '%s' (%s) vs growing capacity: pe %.2g f %.2g virial %.2g pe/atom %.2g; "
                "allocations with padding: %g\n", pad_args.c_str(), pad_model.c_str(), d[0], d[1], d[2],
                d[3], changes);
  return d;
}

TEST(KokkosPadding, FixedCapacityEqualsGrowing)
{
  double changes = 0.0;
  for (double v : padded_vs_growing("pad 8000 120000", changes)) EXPECT_LE(v, 1e-12);
}

// the compiled package in fixed shapes (padded edges and the dummy node
// included) against the TorchScript model in growing buffers
TEST(KokkosPadding, CompiledFixedCapacityEqualsTorchScript)
{
  double changes = 0.0;
  for (double v : padded_vs_growing("pad 8000 120000", changes, "si_mp2.pt2")) EXPECT_LE(v, 1e-12);
}

/* ----------------------------------------------------------------------
   fixed shapes that a configuration outgrows grow, with a WARNING, and
   give the numbers of growing buffers (the run used to stop)
------------------------------------------------------------------------- */

TEST(KokkosPadding, OverflowGrowsWithWarning)
{
  double changes = 0.0;
  std::string log;
  for (double v : padded_vs_growing("pad 40 100", changes, "si_mp2.pt", &log))
    EXPECT_LE(v, 1e-12);    // far too small
  // the WARNING, as LAMMPS prints it (on rank 0: the log file is rank 0's)
  if (me == 0) {
    EXPECT_NE(log.find("WARNING: Pair style torch/kk:"), std::string::npos) << log;
    EXPECT_NE(log.find("do not fit 'pad 40 100'"), std::string::npos);
    EXPECT_NE(log.find("Raise the pad values to keep the shapes fixed"), std::string::npos);
  }
  EXPECT_GE(changes, 2.0);
  EXPECT_LE(changes, 6.0);    // grown once (with headroom), then fixed again
}

/* ----------------------------------------------------------------------
   ranks that own no atom and hold no ghost: empty graphs, real buffers
------------------------------------------------------------------------- */

TEST(KokkosEmptyRanks, AtomsInOneCorner)
{
  // a non-periodic box four times wider than the crystal along x: with
  // 2 or 4 ranks along x the far ranks have neither atoms nor ghosts
  const std::vector<std::string> setup{
      "processors " + std::to_string(nprocs) + " 1 1",
      "units metal", "atom_modify map array", "newton on", "boundary f p p",
      "lattice diamond 5.431", "region box block 0 12 0 2 0 2", "create_box 1 box",
      "region crystal block 0.2 2.7 0 2 0 2", "create_atoms 1 region crystal", "mass 1 28.0855",
      "displace_atoms all random 0.1 0.1 0.1 4321 units box",
      "velocity all create 600 4928 loop geom"};
  const System sys{"corner", setup, ""};
  const std::string coeff = "pair_coeff * * " + potentials + "/si_local.pt Si";
  Snapshot cpu, kk;
  {
    Lammps l(false);
    cpu = run(l, sys, "pair_style torch", coeff, 10);
  }
  int empty = 0;
  {
    Lammps l(true);
    kk = run(l, sys, "pair_style torch", coeff, 10);
    const int mine = (l.lmp->atom->nlocal + l.lmp->atom->nghost == 0) ? 1 : 0;
    MPI_Allreduce(&mine, &empty, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  }
  if (nprocs == 4) EXPECT_EQ(empty, 2);    // ranks 2 and 3 hold no atom at all
  const double d[3] = {rel(kk.pe, cpu.pe), rel(kk.f, cpu.f), rel(kk.virial, cpu.virial)};
  if (me == 0)
    std::printf("[ empty ranks ] %d without atoms or ghosts;", empty);
  if (me == 0)
    std::printf("[ empty ranks ] %d rank(s), atoms in the first %s of the box: pe %.2g f %.2g "
                "virial %.2g\n", nprocs, "quarter", d[0], d[1], d[2]);
  for (double v : d) EXPECT_LE(v, 1e-12);
}

/* ----------------------------------------------------------------------
   LibTorch (the PyPI wheel brings its libgomp) and Kokkos OpenMP (built
   against the system's) in one process: one OpenMP runtime is loaded, and
   LibTorch's thread count is Kokkos's (-k on t N), so a rank uses N threads
------------------------------------------------------------------------- */

TEST(KokkosThreads, OneOpenMPRuntimeAndOneThreadCount)
{
  Lammps l(true);
  l.cmds(lattice("lattice fcc 5.26", 39.948, 3, false));
  l.cmds({"pair_style torch", "pair_coeff * * " + potentials + "/lj_Ar.pt Ar", "run 0 post no"});
  std::set<std::string> runtimes;
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    const auto slash = line.find('/');
    if (slash == std::string::npos) continue;
    const std::string path = line.substr(slash);
    const std::string base = path.substr(path.rfind('/') + 1);
    if (base.rfind("libgomp", 0) == 0 || base.rfind("libomp", 0) == 0 || base.rfind("libiomp", 0) == 0)
      runtimes.insert(path);
  }
  const int t = std::atoi(kokkos_threads().c_str());
  std::string list;
  for (const auto &r : runtimes) list += " " + r;
  if (me == 0)
    std::printf("[ threads ] -k on t %d: LAMMPS threads %d, LibTorch threads %d, OpenMP runtime(s):%s\n",
                t, l.lmp->comm->nthreads, MLTorch::get_num_threads(), list.c_str());
  EXPECT_EQ(runtimes.size(), 1u) << list;
  EXPECT_EQ(l.lmp->comm->nthreads, t);
  EXPECT_EQ(MLTorch::get_num_threads(), t);
}

/* ----------------------------------------------------------------------
   errors a GPU run meets first, shown on the host back end
------------------------------------------------------------------------- */

// the atomic virial of the heat flux: refused with what to use instead
TEST(KokkosErrors, CentroidVirialNamesTheCpuStyle)
{
  Lammps l(true);
  auto setup = lattice("lattice diamond 5.431", 28.0855, 2, false);
  setup.insert(setup.end(), {"pair_style torch", "pair_coeff * * " + potentials + "/si_mp2.pt Si",
                             "compute cv all centroid/stress/atom NULL virial",
                             "dump d all custom 1 /dev/null id c_cv[1]", "run 0 post no"});
  const std::string msg = l.error_of(setup);
  EXPECT_NE(msg.find("Pair style torch/kk does not compute the atomic (centroid) virial that "
                     "compute cv"),
            std::string::npos)
      << "got: " << msg;
  EXPECT_NE(msg.find("run those steps with pair_style torch (without -sf kk)"), std::string::npos);
}

// a message-passing torch/kk inside hybrid/kk that another sub-style took a
// type pair from: the same ERROR as pair_style torch's
TEST(KokkosErrors, MessagePassingInsideHybridNeedsEveryTypePair)
{
  Lammps l(true);
  auto setup = lattice("lattice diamond 5.431", 28.0855, 2, false);
  setup[5] = "create_box 2 box";
  setup.insert(setup.begin() + 7, "mass 2 28.0855");
  setup.insert(setup.end(), {"pair_style hybrid torch lj/cut 5.0",
                             "pair_coeff * * torch " + potentials + "/si_mp2.pt Si Si",
                             "pair_coeff 1 2 lj/cut 0.01 3.0", "run 0 post no"});
  const std::string msg = l.error_of(setup);
  EXPECT_NE(msg.find("(2 layers) inside pair_style hybrid must be given every type pair"),
            std::string::npos)
      << "got: " << msg;
}

TEST(KokkosErrors, NewtonOffNamesThePackageSetting)
{
  Lammps l(true);
  auto setup = lattice("lattice fcc 5.26", 39.948, 2, false);
  setup[2] = "newton off";
  setup.insert(setup.end(), {"pair_style torch", "pair_coeff * * " + potentials + "/lj_Ar.pt Ar",
                             "run 0 post no"});
  const std::string msg = l.error_of(setup);
  EXPECT_NE(msg.find("Pair style torch/kk requires newton pair on: run with '-pk kokkos newton on "
                     "neigh half'"),
            std::string::npos)
      << "got: " << msg;
}

TEST(KokkosErrors, NonFiniteForcesOnStepsWithoutVirial)
{
  // energies are finite, forces are not; thermo asks for no pressure, so no
  // step computes a virial: the edge gradients themselves must be checked
  Lammps l(true);
  auto setup = lattice("lattice fcc 5.26", 39.948, 2, false);
  setup.insert(setup.end(), {"pair_style torch",
                             "pair_coeff * * " + std::string(ML_TORCH_TEST_MODELS_DIR) +
                                 "/nanforce_Ar.pt Ar",
                             "thermo_style custom step temp", "fix md all nve", "run 3 post no"});
  const std::string msg = l.error_of(setup);
  EXPECT_NE(msg.find("returned a non-finite energy or force on step 0"), std::string::npos)
      << "got: " << msg;
  EXPECT_NE(msg.find("non-finite edge gradient component(s)"), std::string::npos) << "got: " << msg;
}

/* ---------------------------------------------------------------------- */

int main(int argc, char **argv)
{
  bool verbose = false;
  // Kokkos is initialised once per process (by the first -k on instance)
  // and must be finalised before MPI
  return mpi_test_main(argc, argv, me, nprocs, verbose, lammps_kokkos_finalize);
}
