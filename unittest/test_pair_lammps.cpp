/* ----------------------------------------------------------------------
   ML-TORCH: pair_style torch against LAMMPS's native styles, through the
   LAMMPS library API.  Run under mpirun with 1..4 ranks (see CMakeLists).
   Energy, forces, global virial (compute pressure ... virial), per-atom
   energy and per-atom virial are compared at run 0 and after a short NVE run.
------------------------------------------------------------------------- */

#include "pair_fixtures.h"

#include "comm.h"

class NativeComparison : public ::testing::TestWithParam<System> {};

TEST_P(NativeComparison, MatchesNativeStyle)
{
  const System &sys = GetParam();
  const auto native = simulate(sys, false, 20);
  const auto torch = simulate(sys, true, 20);
  // a compiled package against its TorchScript model: the doc's 1e-12
  // (measured up to 5e-13, sic_local's forces); native styles 1e-10
  const bool is_compiled = sys.name.rfind("compiled-", 0) == 0;
  const double tol = is_compiled ? 1e-12 : 1e-10;
  for (int k = 0; k < 2; k++) {
    const auto &a = torch[k], &b = native[k];
    const std::string tag = sys.name + (k == 0 ? " run0" : " run20");
    ASSERT_GT(a.f.size(), 0u);
    const auto d = expect_global_within(a, b, tol, tag);
    // per-atom energy and virial must sum to the global values
    EXPECT_NEAR(a.sums[0], a.pe, 1e-10 * std::fabs(a.pe)) << tag;
    double dpa = 0.0, dsa = 0.0, dcs = 0.0;
    if (sys.pairwise) {
      dpa = max_rel_dev(a.peatom, b.peatom);
      dsa = max_rel_dev(a.satom, b.satom);
      EXPECT_LE(dpa, tol) << tag << " per-atom energy";
      EXPECT_LE(dsa, tol) << tag << " per-atom virial";
      if (sys.centroid) {
        dcs = max_rel_dev(a.csatom, b.csatom);
        EXPECT_LE(dcs, tol) << tag << " centroid per-atom virial";
      }
    } else {
      // many-body: LAMMPS's sw splits each three-body term in thirds over
      // i, j, k; torch assigns atomic energies (see doc/pair_torch.rst).
      // The sums must still agree with the native style's.
      std::vector<double> ssum(a.sums.begin() + 1, a.sums.end()), nsum(b.sums.begin() + 1, b.sums.end());
      dsa = max_rel_dev(ssum, nsum);
      EXPECT_LE(dsa, tol) << tag << " summed per-atom virial";
      EXPECT_NEAR(b.sums[0], a.pe, 1e-10 * std::fabs(a.pe)) << tag;
    }
    report(tag + " pe", d.pe);
    report(tag + " f", d.f);
    report(tag + " virial", d.virial);
    if (sys.pairwise) {
      report(tag + " pe/atom", dpa);
      report(tag + " stress/atom", dsa);
      report(tag + " centroid", dcs);
    } else {
      report(tag + " sum stress/atom", dsa);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Styles, NativeComparison,
                         ::testing::Values(lj(false), lj(true), lj(false, true), lj(false, false, true),
                                           lj_hybrid_null(), morse(false), morse(true), sw(false), sw(true),
                                           sw(false, true)),
                         [](const auto &info) {
                           std::string n = info.param.name;
                           for (auto &c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

/* ----------------------------------------------------------------------
   a compiled package (mltorch-compile, potentials/*.pt2) gives the numbers of
   its TorchScript model: energy, forces, global, per-atom and centroid
   virial, per-atom energy, over 20 NVE steps, on 1-4 ranks; the slab leaves
   ranks without atoms (the compiled code's smallest graphs fall back to the
   TorchScript twin there)
------------------------------------------------------------------------- */

static std::vector<std::string> zincblende_sic(bool tri);

static System compiled(const std::string &model, const std::string &elements, bool slab = false,
                       bool centroid = true)
{
  std::vector<std::string> setup;
  if (model == "lj_Ar")
    setup = crystal("lattice fcc 5.26", 39.948, false, 3, slab);
  else if (model == "sic_local")
    setup = zincblende_sic(false);
  else
    setup = crystal("lattice diamond 5.431", 28.0855, false, 3, slab);
  const std::string coeff = "pair_style torch\npair_coeff * * " + potentials + "/" + model;
  return {"compiled-" + model + (slab ? "-slab" : ""), setup, coeff + ".pt " + elements,
          coeff + ".pt2 " + elements, true, centroid};
}

INSTANTIATE_TEST_SUITE_P(Compiled, NativeComparison,
                         ::testing::Values(compiled("lj_Ar", "Ar"), compiled("si_local", "Si"),
                                           compiled("si_local", "Si", true),
                                           compiled("si_mp2", "Si", false, false),
                                           compiled("si_mp2", "Si", true, false),
                                           compiled("sic_local", "Si C")),
                         [](const auto &info) {
                           std::string n = info.param.name;
                           for (auto &c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

/* ----------------------------------------------------------------------
   a float32 export runs in single precision and still tracks the native style
------------------------------------------------------------------------- */

TEST(Float32, StillingerWeber)
{
  System sys = sw(false);
  const auto native = simulate(sys, false, 20);
  sys.torch = "pair_style torch\npair_coeff * * " + potentials + "/sw_Si_f32.pt Si";
  const auto single = simulate(sys, true, 20);
  const double dpe = std::fabs(single[0].pe - native[0].pe) / std::fabs(native[0].pe);
  const double df = max_rel_dev(single[0].f, native[0].f);
  EXPECT_LE(dpe, 1e-6);
  EXPECT_LE(df, 1e-4);
  EXPECT_GT(df, 1e-12);    // it really ran in float32
  report("sw float32 run0 pe", dpe);
  report("sw float32 run0 f", df);
}

/* ----------------------------------------------------------------------
   models (analytic toy and the shipped ML models) on N ranks against the
   brute-force graph with explicit periodic images, evaluated by the core
   directly: an independent neighbor search on the gathered configuration
------------------------------------------------------------------------- */

struct ReferenceCase {
  std::string name, model, elements;
  std::vector<std::string> setup;
  int nshell;
};

static std::vector<std::string> zincblende_sic(bool tri)
{
  return {"units metal", "atom_modify map array", "boundary p p p", "lattice diamond 4.3596",
          tri ? "region box prism 0 2 0 2 0 2 1 1 0" : "region box block 0 2 0 2 0 2",
          "create_box 2 box",
          "create_atoms 2 box basis 1 1 basis 2 1 basis 3 1 basis 4 1 basis 5 2 basis 6 2 basis 7 2 basis 8 2",
          "mass 1 28.0855", "mass 2 12.011", "displace_atoms all random 0.1 0.1 0.1 12345 units box",
          "velocity all create 600.0 4928459 loop geom"};
}

static std::vector<ReferenceCase> reference_cases()
{
  std::vector<ReferenceCase> cases;
  for (bool tri : {false, true}) {
    const std::string t = tri ? "_triclinic" : "";
    auto si = crystal("lattice diamond 5.431", 28.0855, tri, 2);
    cases.push_back({"toy_mp2" + t, "toy_mp2_Si.pt", "Si", si, 2});
    cases.push_back({"si_local" + t, "si_local.pt", "Si", si, 1});
    cases.push_back({"si_mp2" + t, "si_mp2.pt", "Si", si, 2});
    cases.push_back({"sic_local" + t, "sic_local.pt", "Si C", zincblende_sic(tri), 1});
  }
  return cases;
}

class ReferenceGraph : public ::testing::TestWithParam<ReferenceCase> {};

TEST_P(ReferenceGraph, MatchesBruteForceGraph)
{
  const auto &rc = GetParam();
  Lammps l;
  l.cmds(rc.setup);
  l.cmds({"pair_style torch", "pair_coeff * * " + potentials + "/" + rc.model + " " + rc.elements,
          "compute press all pressure NULL virial", "thermo_style custom step pe vol c_press[*]",
          "run 0 post no"});
  const double pe = l.thermo("pe");
  const auto press = l.compute_vector("press", 6);
  const auto f = l.gather("f", 3);
  const auto x = l.gather("x", 3);
  std::vector<int> type(l.natoms());
  lammps_gather(l.lmp, "type", 0, 1, type.data());
  const double vol = l.thermo("vol");
  const double nktv2p = l.lmp->force->nktv2p;

  const auto *boxlo = static_cast<double *>(lammps_extract_global(l.lmp, "boxlo"));
  const auto *boxhi = static_cast<double *>(lammps_extract_global(l.lmp, "boxhi"));
  const double xy = *static_cast<double *>(lammps_extract_global(l.lmp, "xy"));
  const double xz = *static_cast<double *>(lammps_extract_global(l.lmp, "xz"));
  const double yz = *static_cast<double *>(lammps_extract_global(l.lmp, "yz"));
  std::array<std::array<double, 3>, 3> cell{
      {{boxhi[0] - boxlo[0], 0, 0}, {xy, boxhi[1] - boxlo[1], 0}, {xz, yz, boxhi[2] - boxlo[2]}}};
  MLTorch::Model model(MLTorch::read_file(potentials + "/" + rc.model), rc.model, "cpu");
  std::vector<int64_t> species(type.begin(), type.end());
  for (auto &sp : species) sp -= 1;    // types listed in the model's element order
  const auto ref = MLTorchTest::evaluate_reference(model, x, species, cell, {true, true, true}, rc.nshell);
  std::vector<double> vref(ref.virial.begin(), ref.virial.end()), v(press);
  for (auto &c : v) c *= vol / nktv2p;

  const double dpe = std::fabs(pe - ref.energy) / std::fabs(ref.energy);
  const double df = max_rel_dev(f, ref.forces);
  const double dv = max_rel_dev(v, vref);
  EXPECT_GT(max_abs(f), 0.0);
  EXPECT_LE(dpe, 1e-9);
  EXPECT_LE(df, 1e-9);
  EXPECT_LE(dv, 1e-9);
  report(rc.name + " pe", dpe);
  report(rc.name + " f", df);
  report(rc.name + " virial", dv);
}

INSTANTIATE_TEST_SUITE_P(Models, ReferenceGraph, ::testing::ValuesIn(reference_cases()),
                         [](const auto &info) { return info.param.name; });

/* ----------------------------------------------------------------------
   centroid (atomic) virial of a strictly local model: edge i -> j enters
   only E_i, so dE_i/dr_j = g_ij and W_j gets -r_ij (x) g_ij, on the
   neighbour (its owner, for an image), computed here from the model on the
   brute-force graph. The full Jacobian reference of every model kind and
   halo mode is ctest HeatFlux (unittest/test_heatflux.py).
------------------------------------------------------------------------- */

TEST(CentroidStress, LocalModelGivesAtomicVirialOnNeighbours)
{
  Lammps l;
  l.cmds(crystal("lattice diamond 5.431", 28.0855, false, 2));
  l.cmds({"pair_style torch", "pair_coeff * * " + potentials + "/si_local.pt Si",
          "compute cs all centroid/stress/atom NULL virial", "compute sa all stress/atom NULL virial",
          "compute press all pressure NULL virial", "thermo_style custom step pe c_press[*]",
          "run 0 post no"});
  const auto cs = l.gather("c_cs", 9);
  const auto sa = l.gather("c_sa", 6);
  const auto x = l.gather("x", 3);
  const std::size_t n = l.natoms();
  ASSERT_EQ(n, 64u);
  const double nktv2p = l.lmp->force->nktv2p;
  const auto *boxlo = static_cast<double *>(lammps_extract_global(l.lmp, "boxlo"));
  const auto *boxhi = static_cast<double *>(lammps_extract_global(l.lmp, "boxhi"));
  std::array<std::array<double, 3>, 3> cell{
      {{boxhi[0] - boxlo[0], 0, 0}, {0, boxhi[1] - boxlo[1], 0}, {0, 0, boxhi[2] - boxlo[2]}}};
  MLTorch::Model model(MLTorch::read_file(potentials + "/si_local.pt"), "si_local.pt", "cpu");
  const std::vector<int64_t> species(n, 0);
  const auto g = MLTorchTest::build_reference_graph(x, species, cell, {true, true, true}, 1,
                                                    model.metadata().cutoff);
  MLTorch::GraphOutput out;
  model.evaluate(g.input(), out, false);
  // W_j from the edges of original centres, on their neighbours' owners, as
  // LAMMPS's centroid/stress/atom reports it: -W * nktv2p, order xx yy zz
  // xy xz yz yx zx zy
  std::vector<double> ref(9 * n, 0.0), ref_sum(6, 0.0), sa_sum(6, 0.0);
  const int comp[9][2] = {{0, 0}, {1, 1}, {2, 2}, {0, 1}, {0, 2}, {1, 2}, {1, 0}, {2, 0}, {2, 1}};
  for (std::size_t e = 0; e < g.centre.size(); ++e) {
    if (g.centre[e] >= g.n_local) continue;    // image-centred edges carry no energy
    const double *r = &g.edge_vectors[3 * e];
    const double *gr = &out.edge_grad[3 * e];
    const int j = g.owner[g.neighbour[e]];
    for (int k = 0; k < 9; ++k) ref[9 * j + k] += nktv2p * r[comp[k][0]] * gr[comp[k][1]];
  }
  const double d = MLTorchTest::max_rel_dev(cs, ref);
  // and the half/half split of stress/atom differs from it (the test would
  // not tell the two apart otherwise), while both sum to the same virial
  std::vector<double> sa9(9 * n);
  for (std::size_t i = 0; i < n; ++i)
    for (int k = 0; k < 9; ++k) sa9[9 * i + k] = sa[6 * i + (k < 6 ? k : k - 3)];
  for (std::size_t i = 0; i < n; ++i)
    for (int k = 0; k < 6; ++k) {
      ref_sum[k] += ref[9 * i + k];
      sa_sum[k] += sa[6 * i + k];
    }
  const double dsplit = MLTorchTest::max_rel_dev(sa9, ref);
  const double dsum = MLTorchTest::max_rel_dev(sa_sum, ref_sum);
  // compute stress/atom keeps its documented convention: each edge's
  // virial -r (x) g half on the centre's owner and half on the neighbour's
  std::vector<double> ref_sa(6 * n, 0.0);
  for (std::size_t e = 0; e < g.centre.size(); ++e) {
    if (g.centre[e] >= g.n_local) continue;
    const double *r = &g.edge_vectors[3 * e];
    const double *gr = &out.edge_grad[3 * e];
    for (const int a : {g.owner[g.centre[e]], g.owner[g.neighbour[e]]})
      for (int k = 0; k < 6; ++k) ref_sa[6 * a + k] += 0.5 * nktv2p * r[comp[k][0]] * gr[comp[k][1]];
  }
  const double dhalf = MLTorchTest::max_rel_dev(sa, ref_sa);
  report("si_local centroid/stress/atom vs atomic virial", d);
  report("si_local stress/atom vs its half/half reference", dhalf);
  report("si_local stress/atom (half/half) vs atomic virial", dsplit);
  EXPECT_LE(d, 1e-14);        // measured 2.1e-15 (1 rank), 2.5e-15 (3)
  EXPECT_LE(dhalf, 1e-14);    // measured 1.6e-15, 1.5e-15
  EXPECT_GE(dsplit, 1e-3);
  EXPECT_LE(dsum, 1e-10);
}

// a message-passing model gives its atomic virial (exactness: ctest
// HeatFlux); here, on every rank count, it sums to the global virial
TEST(CentroidStress, MessagePassingModelSumsToTheVirial)
{
  Lammps l;
  l.cmds(crystal("lattice diamond 5.431", 28.0855, false, 2));
  l.cmds({"pair_style torch", "pair_coeff * * " + potentials + "/si_mp2.pt Si",
          "compute cs all centroid/stress/atom NULL virial",
          "compute sum all reduce sum c_cs[1] c_cs[2] c_cs[3] c_cs[4] c_cs[5] c_cs[6]",
          "compute press all pressure NULL virial",
          "thermo_style custom step pe vol c_sum[*] c_press[*]", "run 0 post no"});
  const double vol = l.thermo("vol");
  const auto *sum = static_cast<double *>(
      lammps_extract_compute(l.lmp, "sum", LMP_STYLE_GLOBAL, LMP_TYPE_VECTOR));
  const auto *press = static_cast<double *>(
      lammps_extract_compute(l.lmp, "press", LMP_STYLE_GLOBAL, LMP_TYPE_VECTOR));
  ASSERT_NE(sum, nullptr);
  ASSERT_NE(press, nullptr);
  double worst = 0.0, scale = 0.0;
  for (int k = 0; k < 6; ++k) {
    worst = std::max(worst, std::fabs(sum[k] + press[k] * vol));
    scale = std::max(scale, std::fabs(press[k] * vol));
  }
  report("si_mp2 sum of centroid/stress/atom vs global virial", worst / scale);
  EXPECT_GT(scale, 1.0);
  EXPECT_LE(worst, 1e-12 * scale);
}

/* ----------------------------------------------------------------------
   message-passing models: edges centred on ghost atoms that cannot reach a
   local energy are not built (the ReferenceGraph tests check that the
   numbers do not change); here the saving is measured against every ghost
   centre's edges, counted by brute force on the same atoms
------------------------------------------------------------------------- */

TEST(GhostPruning, MessagePassingModelBuildsFewerEdges)
{
  Lammps l;
  l.cmds(crystal("lattice diamond 5.431", 28.0855, false, 3));
  l.cmds({"pair_style torch", "pair_coeff * * " + potentials + "/si_mp2.pt Si", "run 0 post no"});
  int dim = 0;
  const auto *size = static_cast<double *>(l.lmp->force->pair->extract("graph_size", dim));
  ASSERT_NE(size, nullptr);
  const int nall = l.lmp->atom->nlocal + l.lmp->atom->nghost;
  double **x = l.lmp->atom->x;
  const double rc = l.lmp->force->pair->cutforce;    // the model's cutoff
  double all = 0.0;    // edges of every local and ghost centre
  for (int i = 0; i < nall; ++i)
    for (int j = 0; j < nall; ++j) {
      if (i == j) continue;
      const double dx = x[j][0] - x[i][0], dy = x[j][1] - x[i][1], dz = x[j][2] - x[i][2];
      if (dx * dx + dy * dy + dz * dz < rc * rc) all += 1.0;
    }
  double mine[2] = {size[1], all}, sum[2];
  MPI_Allreduce(mine, sum, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  if (me == 0)
    std::printf("[ pruning ] si_mp2, 216 atoms, %d rank(s): %.0f edges built, %.0f with every ghost "
                "centre (%.1f%%)\n", nprocs, sum[0], sum[1], 100.0 * sum[0] / sum[1]);
  EXPECT_LT(sum[0], 0.8 * sum[1]);
}

/* ----------------------------------------------------------------------
   the tensor block cache under a growing atom count (fix deposit): the
   blocks the growing graph outgrew go back to malloc, so what the cache
   holds stays within a few times the largest step's tensors. Run in a
   process of its own (ctest TensorBlocksDeposit): the counts are the
   process's
------------------------------------------------------------------------- */

TEST(TensorBlocks, DepositKeepsOnlyRecentBlocks)
{
  if (nprocs != 1) GTEST_SKIP() << "the block cache of one process";
  Lammps l;
  l.cmds({"units metal", "region box block 0 22 0 22 0 22", "create_box 1 box",
          "create_atoms 1 random 64 4821 NULL overlap 2.3 maxtry 200", "mass 1 28.0855",
          "pair_style torch", "pair_coeff * * " + potentials + "/si_local.pt Si",
          "velocity all create 600 5", "fix nve all nve", "fix heat all langevin 600 600 0.1 7",
          "fix grow all deposit 400 1 4 991 region box near 2.3 attempt 200",
          "timestep 0.001", "thermo 0", "run 1700 post no"});
  const auto stats = MLTorch::tensor_block_stats();
  const double held = static_cast<double>(stats.free_bytes + stats.live_bytes);
  std::printf("[ blocks   ] fix deposit, 64 -> %zu atoms in 1700 steps: the cache holds %.0f KB, "
              "%.2f times the most in tensors at once (%.0f KB)\n",
              l.natoms(), held / 1024, held / stats.peak_live_bytes, stats.peak_live_bytes / 1024.0);
  EXPECT_EQ(l.natoms(), 464u);
  EXPECT_GT(stats.peak_live_bytes, 0u);
  EXPECT_LE(held, 2.5 * stats.peak_live_bytes);    // 1.65 measured; 3.29 without the sweep
}

/* ----------------------------------------------------------------------
   a re-issued pair_style torch takes its new settings (omitted keywords go
   back to their defaults), and the thread count is set before every step
   (LibTorch's count is per process)
------------------------------------------------------------------------- */

TEST(Settings, ReissuedPairStyleTakesNewThreads)
{
  Lammps l;
  l.cmds(crystal("lattice diamond 5.431", 28.0855, false, 2));
  l.cmds({"pair_style torch threads 3", "pair_coeff * * " + potentials + "/si_local.pt Si",
          "run 0 post no"});
  EXPECT_EQ(MLTorch::get_num_threads(), 3);
  MLTorch::set_num_threads(2);    // someone else (a torch teacher) changes it
  l.cmd("run 0 post no");
  EXPECT_EQ(MLTorch::get_num_threads(), 3);
  l.cmds({"pair_style torch", "run 0 post no"});    // default: OMP_NUM_THREADS=1 (ctest)
  EXPECT_EQ(MLTorch::get_num_threads(), 1);
  // without the keyword the count comes from OMP_NUM_THREADS (read at init)
  const char *before = std::getenv("OMP_NUM_THREADS");
  const std::string saved = before ? before : "";
  setenv("OMP_NUM_THREADS", "2", 1);
  l.cmds({"pair_style torch", "run 0 post no"});
  EXPECT_EQ(MLTorch::get_num_threads(), 2);
  if (before)
    setenv("OMP_NUM_THREADS", saved.c_str(), 1);
  else
    unsetenv("OMP_NUM_THREADS");
  l.cmds({"pair_style torch", "run 0 post no"});
  EXPECT_EQ(MLTorch::get_num_threads(), before ? std::atoi(saved.c_str()) : 1);
  // the thread count LAMMPS was given wins over OMP_NUM_THREADS: -pk omp N
  // (the OPENMP package, not in this build) and -k on t N (ctest
  // KokkosCurrent, KokkosThreads.*) set comm->nthreads, set here by hand
  setenv("OMP_NUM_THREADS", "3", 1);
  l.lmp->comm->nthreads = 2;
  l.cmds({"pair_style torch", "run 0 post no"});
  EXPECT_EQ(MLTorch::get_num_threads(), 2);
  l.lmp->comm->nthreads = 1;
  if (before)
    setenv("OMP_NUM_THREADS", saved.c_str(), 1);
  else
    unsetenv("OMP_NUM_THREADS");
}

int main(int argc, char **argv)
{
  return mpi_test_main(argc, argv, me, nprocs, verbose);
}
