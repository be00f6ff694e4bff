/* ----------------------------------------------------------------------
   ML-TORCH: pair_style torch against LAMMPS's native styles, through the
   LAMMPS library API.  Run under mpirun with 1..4 ranks (see CMakeLists).
   Energy, forces, global virial (compute pressure ... virial), per-atom
   energy and per-atom virial are compared at run 0 and after a short NVE run.
------------------------------------------------------------------------- */

#include "atom.h"
#include "force.h"
#include "input.h"
#include "lammps.h"
#include "pair.h"
#include "library.h"

#include "mltorch/model.h"
#include "reference_graph.h"

#include "lammps_session.h"
#include "mpi_test_main.h"

#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <ostream>
#include <string>
#include <vector>

using LAMMPS_NS::LAMMPS;
using MLTorchTest::max_rel_dev;

static const std::string potentials = ML_TORCH_POTENTIALS_DIR;
static const std::string lammps_potentials = ML_TORCH_LAMMPS_POTENTIALS_DIR;
static const std::string test_models = ML_TORCH_TEST_MODELS_DIR;
static int me = 0, nprocs = 1;
static bool verbose = false;    // --verbose-lammps shows LAMMPS's screen output

struct Snapshot {
  double pe = 0.0;
  std::vector<double> virial;    // compute pressure NULL virial, 6 components
  std::vector<double> f, x, peatom, satom, csatom, sums;
};

class Lammps : public LammpsSession {
 public:
  explicit Lammps(const std::vector<std::string> &extra_args = {}) :
      LammpsSession(MPI_COMM_WORLD, extra_args, verbose)
  {
  }
  std::vector<double> compute_vector(const char *id, int n)
  {
    auto *v = static_cast<double *>(lammps_extract_compute(lmp, id, LMP_STYLE_GLOBAL, LMP_TYPE_VECTOR));
    return v ? std::vector<double>(v, v + n) : std::vector<double>();
  }
};

/* ---------------------------------------------------------------------- */

struct System {
  std::string name;
  std::vector<std::string> setup;    // everything before the pair style
  std::string native;                // pair style + coeffs of the native style
  std::string torch;                 // pair style + coeffs with pair_style torch
  bool pairwise;                     // per-atom decomposition the same as LAMMPS's
  bool centroid = true;              // compute centroid/stress/atom is available
};

static std::vector<std::string> crystal(const std::string &lattice, double mass, bool triclinic,
                                        int nrep, bool slab = false, int ntypes = 1)
{
  const std::string n = std::to_string(nrep);
  std::vector<std::string> s{"units metal", "atom_modify map array",
                             slab ? "boundary f p p" : "boundary p p p", lattice};
  if (slab) {
    // atoms fill the lower half in x: with processors * 1 1 the upper ranks own none
    s.push_back("region box block 0 " + std::to_string(2 * nrep) + " 0 " + n + " 0 " + n);
    s.push_back("processors * 1 1");
    s.push_back("create_box " + std::to_string(ntypes) + " box");
    s.push_back("region atoms block 0.1 " + std::to_string(nrep - 0.1) + " 0 " + n + " 0 " + n);
    s.push_back("create_atoms 1 region atoms");
  } else {
    s.push_back(triclinic ? "region box prism 0 " + n + " 0 " + n + " 0 " + n + " 1 1 0"
                          : "region box block 0 " + n + " 0 " + n + " 0 " + n);
    s.push_back("create_box " + std::to_string(ntypes) + " box");
    s.push_back("create_atoms 1 box");
  }
  s.push_back("mass * " + std::to_string(mass));
  if (ntypes == 2) s.push_back("set type 1 type/fraction 2 0.5 8731");
  s.push_back("displace_atoms all random 0.1 0.1 0.1 12345 units box");
  s.push_back("velocity all create 600.0 4928459 loop geom");
  return s;
}

static System lj(bool tri, bool shift = false, bool slab = false)
{
  std::string mod = shift ? "\npair_modify shift yes" : "";
  return {std::string("lj") + (shift ? "-shift" : "") + (tri ? "-triclinic" : "") + (slab ? "-slab" : ""),
          crystal("lattice fcc 5.26", 39.948, tri, 3, slab),
          "pair_style lj/cut 8.5\npair_coeff 1 1 0.0104 3.40" + mod,
          "pair_style torch\npair_coeff * * " + potentials + (shift ? "/lj_Ar_shift.pt" : "/lj_Ar.pt") + " Ar",
          true};
}

// pair_style hybrid with torch covering type 1 only (NULL for type 2)
static System lj_hybrid_null()
{
  return {"lj-hybrid-null", crystal("lattice fcc 5.26", 39.948, false, 3, false, 2),
          "pair_style lj/cut 8.5\npair_coeff * * 0.0104 3.40",
          "pair_style hybrid torch lj/cut 8.5\npair_coeff * * torch " + potentials +
              "/lj_Ar.pt Ar NULL\npair_coeff 1 2 lj/cut 0.0104 3.40\npair_coeff 2 2 lj/cut 0.0104 3.40",
          true};
}

static System morse(bool tri)
{
  return {std::string("morse") + (tri ? "-triclinic" : ""), crystal("lattice fcc 3.615", 63.546, tri, 4),
          "pair_style morse 6.0\npair_coeff 1 1 0.3429 1.3588 2.866",
          "pair_style torch\npair_coeff * * " + potentials + "/morse_Cu.pt Cu", true};
}

static System sw(bool tri, bool slab = false)
{
  return {std::string("sw") + (tri ? "-triclinic" : "") + (slab ? "-slab" : ""),
          crystal("lattice diamond 5.431", 28.0855, tri, 3, slab),
          "pair_style sw\npair_coeff * * " + lammps_potentials + "/Si.sw Si",
          "pair_style torch\npair_coeff * * " + potentials + "/sw_Si.pt Si", false};
}

static double max_abs(const std::vector<double> &v)
{
  double m = v.empty() ? -1.0 : 0.0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

static Snapshot snapshot(Lammps &l, bool centroid)
{
  Snapshot s;
  s.pe = l.thermo("pe");
  s.virial = l.compute_vector("press", 6);
  s.sums = l.compute_vector("sums", 7);
  s.f = l.gather("f", 3);
  s.x = l.gather("x", 3);
  s.peatom = l.gather("c_peatom", 1);
  s.satom = l.gather("c_satom", 6);
  if (centroid) s.csatom = l.gather("c_csatom", 9);    // full 3x3 tensor
  // a failed gather leaves zeros: make sure every array holds real data
  for (const auto *v : {&s.f, &s.x, &s.peatom, &s.satom, &s.virial})
    EXPECT_GT(max_abs(*v), 0.0);
  if (centroid) EXPECT_GT(max_abs(s.csatom), 0.0);
  return s;
}

static std::vector<Snapshot> simulate(const System &sys, bool use_torch, int nsteps)
{
  Lammps l;
  l.cmds(sys.setup);
  for (const auto &line : {use_torch ? sys.torch : sys.native}) {
    std::size_t start = 0;
    while (start <= line.size()) {
      const auto end = line.find('\n', start);
      l.cmd(line.substr(start, end - start));
      if (end == std::string::npos) break;
      start = end + 1;
    }
  }
  const bool centroid = sys.pairwise && sys.centroid;
  // the reductions in the thermo output make LAMMPS tally the per-atom
  // quantities on every thermo step
  l.cmds({"neighbor 1.0 bin", "compute peatom all pe/atom", "compute satom all stress/atom NULL virial",
          "compute press all pressure NULL virial",
          "compute sums all reduce sum c_peatom c_satom[1] c_satom[2] c_satom[3] c_satom[4] "
          "c_satom[5] c_satom[6]",
          "fix nve all nve", "timestep 0.002"});
  if (centroid)
    l.cmds({"compute csatom all centroid/stress/atom NULL virial",
            "compute csums all reduce sum c_csatom[1] c_csatom[2] c_csatom[3]",
            "thermo_style custom step pe press c_press[*] c_sums[*] c_csums[*]"});
  else
    l.cmd("thermo_style custom step pe press c_press[*] c_sums[*]");
  l.cmd("run 0 post no");
  if (sys.name.find("slab") != std::string::npos && nprocs > 1) {
    // the slab layout must really leave a rank without atoms
    int mine = l.lmp->atom->nlocal, fewest = 0;
    MPI_Allreduce(&mine, &fewest, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    EXPECT_EQ(fewest, 0) << sys.name;
  }
  std::vector<Snapshot> out{snapshot(l, centroid)};
  l.cmd("run " + std::to_string(nsteps) + " post no");
  out.push_back(snapshot(l, centroid));
  return out;
}

static void report(const std::string &what, double dev)
{
  if (me == 0)
    std::printf("[ DEV      ] %-26s np=%d  max relative deviation %.3e\n", what.c_str(), nprocs, dev);
}

class NativeComparison : public ::testing::TestWithParam<System> {};

TEST_P(NativeComparison, MatchesNativeStyle)
{
  const System &sys = GetParam();
  const auto native = simulate(sys, false, 20);
  const auto torch = simulate(sys, true, 20);
  const double tol = 1e-10;
  for (int k = 0; k < 2; k++) {
    const auto &a = torch[k], &b = native[k];
    const std::string tag = sys.name + (k == 0 ? " run0" : " run20");
    ASSERT_GT(a.f.size(), 0u);
    const double dpe = std::fabs(a.pe - b.pe) / std::fabs(b.pe);
    const double dvir = max_rel_dev(a.virial, b.virial);
    const double df = max_rel_dev(a.f, b.f);
    const double dx = max_rel_dev(a.x, b.x);
    EXPECT_LE(dpe, tol) << tag << " energy " << a.pe << " vs " << b.pe;
    EXPECT_LE(dvir, tol) << tag << " virial";
    EXPECT_LE(df, tol) << tag << " forces";
    EXPECT_LE(dx, tol) << tag << " positions";
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
    report(tag + " pe", dpe);
    report(tag + " f", df);
    report(tag + " virial", dvir);
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
   centroid (atomic) virial: for a strictly local model W_i is the sum of
   -r_ij (x) dE/dr_ij over the edges centred on i, computed here from the
   model on the brute-force graph (review defect: the style used to declare
   the pairwise half/half split, 11% off for si_local); message-passing
   models have no such decomposition and are refused
------------------------------------------------------------------------- */

TEST(CentroidStress, LocalModelGivesAtomicVirialOfCentres)
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
  // W_i over the edges centred on original atom i, as LAMMPS's stress/atom
  // reports it: -W_i * nktv2p, order xx yy zz xy xz yz yx zx zy
  std::vector<double> ref(9 * n, 0.0), ref_sum(6, 0.0), sa_sum(6, 0.0);
  const int comp[9][2] = {{0, 0}, {1, 1}, {2, 2}, {0, 1}, {0, 2}, {1, 2}, {1, 0}, {2, 0}, {2, 1}};
  for (std::size_t e = 0; e < g.centre.size(); ++e) {
    if (g.centre[e] >= g.n_local) continue;    // image-centred edges carry no energy
    const double *r = &g.edge_vectors[3 * e];
    const double *gr = &out.edge_grad[3 * e];
    for (int k = 0; k < 9; ++k)
      ref[9 * g.centre[e] + k] += nktv2p * r[comp[k][0]] * gr[comp[k][1]];
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
  report("si_local centroid/stress/atom vs atomic virial", d);
  report("si_local stress/atom (half/half) vs atomic virial", dsplit);
  EXPECT_LE(d, 1e-10);
  EXPECT_GE(dsplit, 1e-3);
  EXPECT_LE(dsum, 1e-10);
}

TEST(CentroidStress, MessagePassingModelIsRefused)
{
  Lammps l;
  l.cmds(crystal("lattice diamond 5.431", 28.0855, false, 2));
  l.cmds({"pair_style torch", "pair_coeff * * " + potentials + "/si_mp2.pt Si",
          "compute cs all centroid/stress/atom NULL virial", "thermo_style custom step pe"});
  const std::string msg = l.error_of({"run 0 post no"});
  EXPECT_NE(msg.find("Pair style does not support compute centroid/stress/atom"), std::string::npos)
      << "got: " << msg;
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
}

/* ----------------------------------------------------------------------
   energy conservation with the shipped Si model: 512 atoms, 1 fs, 5 ps NVE
   (run by its own ctest entry: --gtest_filter=NVE.*)
------------------------------------------------------------------------- */

TEST(NVE, SiliconLocalModelConservesEnergy)
{
  Lammps l;
  l.cmds({"units metal", "atom_modify map array", "boundary p p p", "lattice diamond 5.431",
          "region box block 0 4 0 4 0 4", "create_box 1 box", "create_atoms 1 box",
          "mass 1 28.0855", "velocity all create 600.0 87287 loop geom", "pair_style torch",
          "pair_coeff * * " + potentials + "/si_local.pt Si", "neighbor 1.0 bin",
          "timestep 0.001", "fix nve all nve", "thermo 100", "thermo_style custom step temp pe etotal",
          "run 0 post no"});
  const double natoms = static_cast<double>(l.natoms());
  const double e0 = l.thermo("etotal");
  double worst = 0.0;
  for (int block = 0; block < 50; block++) {
    l.cmd("run 100 post no");
    worst = std::max(worst, std::fabs(l.thermo("etotal") - e0) / natoms);
  }
  const double drift = (l.thermo("etotal") - e0) / natoms;
  if (me == 0)
    std::printf("[ NVE      ] 512 Si atoms, 5 ps at 1 fs: drift %.3e eV/atom, largest excursion %.3e eV/atom, "
                "final T %.1f K\n", drift, worst, l.thermo("temp"));
  EXPECT_LT(std::fabs(drift), 1e-4);
  EXPECT_LT(worst, 1e-4);
  EXPECT_GT(l.thermo("temp"), 100.0);    // the crystal really moved
}

/* ---------------------------------------------------------------------- */

/* ----------------------------------------------------------------------
   per-layer halo exchange vs thick ghosts, the same layered model: energy,
   forces, global and per-atom virial, per-atom energy at set-up and after
   NVE steps (atoms migrate, lists are rebuilt), orthogonal and triclinic,
   with an empty rank (slab), and in a box so small that a rank holds
   periodic images of its own atoms; 1-4 ranks (ctest HaloExchange_np*)
------------------------------------------------------------------------- */

struct HaloCase {
  std::string name, model;
  int nrep;
  bool triclinic, slab;
};

static void PrintTo(const HaloCase &c, std::ostream *os)
{
  *os << c.name;
}

class HaloExchange : public ::testing::TestWithParam<HaloCase> {};

TEST_P(HaloExchange, EqualsThickGhosts)
{
  const HaloCase &c = GetParam();
  const std::string coeff = "\npair_coeff * * " + c.model + " Si";
  System sys{c.name, crystal("lattice diamond 5.431", 28.0855, c.triclinic, c.nrep, c.slab),
             "pair_style torch halo thick" + coeff, "pair_style torch" + coeff, true, false};
  const auto thick = simulate(sys, false, 5);
  const auto exchange = simulate(sys, true, 5);
  const double tol = 1e-12;
  for (int k = 0; k < 2; k++) {
    const auto &a = exchange[k], &b = thick[k];
    const std::string tag = c.name + (k == 0 ? " run0" : " run5");
    const double dpe = std::fabs(a.pe - b.pe) / std::fabs(b.pe);
    const double dvir = max_rel_dev(a.virial, b.virial);
    const double df = max_rel_dev(a.f, b.f);
    const double dx = max_rel_dev(a.x, b.x);
    const double dpa = max_rel_dev(a.peatom, b.peatom);
    const double dsa = max_rel_dev(a.satom, b.satom);
    EXPECT_LE(dpe, tol) << tag << " energy " << a.pe << " vs " << b.pe;
    EXPECT_LE(dvir, tol) << tag << " virial";
    EXPECT_LE(df, tol) << tag << " forces";
    EXPECT_LE(dx, tol) << tag << " positions";
    EXPECT_LE(dpa, tol) << tag << " per-atom energy";
    EXPECT_LE(dsa, tol) << tag << " per-atom virial";
    report(tag + " pe", dpe);
    report(tag + " f", df);
    report(tag + " virial", dvir);
    report(tag + " pe/atom", dpa);
    report(tag + " stress/atom", dsa);
  }
}

static const std::string mp2 = potentials + "/si_mp2.pt", mp4 = test_models + "/si_mp4_layered.pt";
INSTANTIATE_TEST_SUITE_P(Layered, HaloExchange,
                         ::testing::Values(HaloCase{"mp2", mp2, 3, false, false},
                                           HaloCase{"mp2_triclinic", mp2, 3, true, false},
                                           HaloCase{"mp2_slab", mp2, 3, false, true},
                                           HaloCase{"mp2_self_images", mp2, 1, false, false},
                                           HaloCase{"mp4", mp4, 2, false, false},
                                           HaloCase{"mp4_triclinic", mp4, 2, true, false},
                                           HaloCase{"mp4_slab", mp4, 2, false, true},
                                           HaloCase{"mp4_self_images", mp4, 1, true, false}),
                         [](const auto &info) { return info.param.name; });

/* ----------------------------------------------------------------------
   a committee of 3 and 4 members inside pair_style hybrid/overlay: its
   per-member reverse communication (3 values per member and atom) needs
   more than the buffers pair_style hybrid sized from its sub-styles' flags
   before pair_coeff; the deviation equals the plain committee's
------------------------------------------------------------------------- */

TEST(CommitteeInHybrid, DeviationEqualsPlainCommittee)
{
  const std::string c = potentials + "/si_crystal_c";
  for (const std::string files : {c + "0.pt " + c + "1.pt " + c + "2.pt ",
                                  c + "0.pt " + c + "1.pt " + c + "2.pt " + potentials + "/si_local.pt "}) {
    std::vector<double> dev[2], vec[2];
    for (int hybrid = 0; hybrid < 2; ++hybrid) {
      Lammps l;
      l.cmds(crystal("lattice diamond 5.431", 28.0855, false, 2));
      if (hybrid)
        l.cmds({"pair_style hybrid/overlay torch zero 4.0", "pair_coeff * * torch " + files + "Si",
                "pair_coeff * * zero"});
      else
        l.cmds({"pair_style torch", "pair_coeff * * " + files + "Si"});
      l.cmds({"compute dev all torch/deviation", "thermo_style custom step pe c_dev[*]",
              "run 0 post no"});
      EXPECT_GE(l.lmp->force->pair->comm_reverse, 9);
      dev[hybrid] = l.gather("c_dev", 2);
      vec[hybrid] = l.compute_vector("dev", 10);
    }
    const double d = max_rel_dev(dev[1], dev[0]), dv = max_rel_dev(vec[1], vec[0]);
    if (me == 0)
      std::printf("[ hybrid   ] committee in hybrid/overlay, %d rank(s): per-atom deviation %.2e, "
                  "statistics %.2e vs the plain committee\n", nprocs, d, dv);
    EXPECT_LE(d, 1e-12);
    EXPECT_LE(dv, 1e-12);
    EXPECT_GT(vec[0][0], 0.0);
  }
}

/* ----------------------------------------------------------------------
   forces through the exchange are the derivatives of the energy: a
   five-point central difference of the total energy by atom positions
   (h = 1e-3 A), for atoms owned by different ranks, 4-layer model
------------------------------------------------------------------------- */

TEST(HaloFiniteDifferences, ForcesAreEnergyDerivatives)
{
  Lammps l;
  l.cmds(crystal("lattice diamond 5.431", 28.0855, true, 2));
  l.cmds({"pair_style torch", "pair_coeff * * " + mp4 + " Si", "thermo_modify format float %.17g",
          "run 0 post no"});
  const auto f = l.gather("f", 3);
  const double h = 1e-3;
  double worst = 0.0, fmax = 0.0;
  for (int id : {1, 22, 47, 64})
    for (int d = 0; d < 3; ++d) {
      double e[4];
      const double steps[4] = {-2 * h, -h, h, 2 * h};
      for (int k = 0; k < 4; ++k) {
        const std::string mv = std::to_string(steps[k]);
        const std::string v[3] = {d == 0 ? mv : "0", d == 1 ? mv : "0", d == 2 ? mv : "0"};
        l.cmds({"group one id " + std::to_string(id),
                "displace_atoms one move " + v[0] + " " + v[1] + " " + v[2] + " units box",
                "run 0 post no"});
        e[k] = l.lmp->force->pair->eng_vdwl;
        double sum = 0.0;
        MPI_Allreduce(&e[k], &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        e[k] = sum;
        const std::string back = std::to_string(-steps[k]);
        const std::string b[3] = {d == 0 ? back : "0", d == 1 ? back : "0", d == 2 ? back : "0"};
        l.cmds({"displace_atoms one move " + b[0] + " " + b[1] + " " + b[2] + " units box",
                "group one delete"});
      }
      const double fd = -(e[0] - 8 * e[1] + 8 * e[2] - e[3]) / (12 * h);
      worst = std::max(worst, std::fabs(fd - f[3 * (id - 1) + d]));
      fmax = std::max(fmax, std::fabs(f[3 * (id - 1) + d]));
    }
  if (me == 0)
    std::printf("[ halo FD  ] 4 layers, 64 atoms, %d rank(s): forces vs -dE/dx %.2e eV/A (largest "
                "force %.3g)\n", nprocs, worst, fmax);
  EXPECT_GT(fmax, 0.1);
  EXPECT_LE(worst, 1e-8 * std::max(1.0, fmax));
}

/* ----------------------------------------------------------------------
   the exchange's ghost shell is one cutoff (+ skin) whatever the depth;
   thick ghosts grow with it; the log says which is used
------------------------------------------------------------------------- */

TEST(HaloGhosts, OneCutoffOfGhostsWhateverTheDepth)
{
  auto ghosts = [](const std::string &style, const std::string &model) {
    Lammps l;
    l.cmds(crystal("lattice diamond 5.431", 28.0855, false, 3));
    l.cmds({style, "pair_coeff * * " + model + " Si", "run 0 post no"});
    double mine = l.lmp->atom->nghost, sum = 0.0;
    MPI_Allreduce(&mine, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    return sum;
  };
  const double g2 = ghosts("pair_style torch", mp2), g4 = ghosts("pair_style torch", mp4);
  const double t2 = ghosts("pair_style torch halo thick", mp2),
               t4 = ghosts("pair_style torch halo thick", mp4);
  const double local = ghosts("pair_style torch", potentials + "/si_local.pt");
  if (me == 0)
    std::printf("[ ghosts   ] 216 Si atoms, %d rank(s): exchange %.0f (2 layers) %.0f (4 layers), "
                "thick %.0f / %.0f, one-cutoff model %.0f\n", nprocs, g2, g4, t2, t4, local);
  EXPECT_EQ(g2, local);
  EXPECT_EQ(g4, local);
  EXPECT_GT(t2, 1.5 * g2);
  EXPECT_GT(t4, 1.5 * t2);
}

int main(int argc, char **argv)
{
  return mpi_test_main(argc, argv, me, nprocs, verbose);
}

/* ----------------------------------------------------------------------
   committee: the deviation of compute torch/deviation (per atom and its
   group statistics) equals DeePMD-kit's model deviation computed here from
   the members on the independent brute-force graph; 'committee mean' runs
   MD on the mean of the members' forces
------------------------------------------------------------------------- */

struct CommitteeCase {
  std::string name;
  std::vector<std::string> files;
  int layers;
};

static void PrintTo(const CommitteeCase &c, std::ostream *os)
{
  *os << c.name;
}

class Committee : public ::testing::TestWithParam<CommitteeCase> {};

TEST_P(Committee, DeviationEqualsIndependentEvaluation)
{
  const auto &c = GetParam();
  std::string files;
  for (const auto &f : c.files) files += f + " ";
  for (const std::string mode : {"first", "mean"}) {
    Lammps l;
    l.cmds(crystal("lattice diamond 5.431", 28.0855, false, 2));
    l.cmds({"pair_style torch committee " + mode, "pair_coeff * * " + files + "Si",
            "compute dev all torch/deviation", "thermo_style custom step pe c_dev[*]",
            "run 0 post no"});
    const auto dev = l.gather("c_dev", 2);
    const auto vec = l.compute_vector("dev", 10);
    const auto x = l.gather("x", 3);
    const auto f = l.gather("f", 3);
    const std::size_t n = l.natoms();
    ASSERT_EQ(n, 64u);
    const auto *boxlo = static_cast<double *>(lammps_extract_global(l.lmp, "boxlo"));
    const auto *boxhi = static_cast<double *>(lammps_extract_global(l.lmp, "boxhi"));
    std::array<std::array<double, 3>, 3> cell{
        {{boxhi[0] - boxlo[0], 0, 0}, {0, boxhi[1] - boxlo[1], 0}, {0, 0, boxhi[2] - boxlo[2]}}};
    const std::vector<int64_t> species(n, 0);
    const int nm = static_cast<int>(c.files.size());
    std::vector<std::vector<double>> forces(nm), energies(nm);
    std::vector<double> etot(nm), fmean(3 * n, 0.0), wtot(9 * nm, 0.0);
    for (int m = 0; m < nm; ++m) {
      MLTorch::Model model(MLTorch::read_file(c.files[m]), c.files[m], "cpu");
      const auto g = MLTorchTest::build_reference_graph(x, species, cell, {true, true, true}, 1,
                                                        model.metadata().cutoff);
      MLTorch::GraphOutput out;
      model.evaluate(g.input(), out, true);
      forces[m].assign(3 * n, 0.0);
      for (std::size_t e = 0; e < g.centre.size(); ++e)
        for (int d = 0; d < 3; ++d) {
          forces[m][3 * g.owner[g.centre[e]] + d] += out.edge_grad[3 * e + d];
          forces[m][3 * g.owner[g.neighbour[e]] + d] -= out.edge_grad[3 * e + d];
          for (int b = 0; b < 3; ++b)
            wtot[9 * m + 3 * d + b] -= g.edge_vectors[3 * e + d] * out.edge_grad[3 * e + b];
        }
      energies[m] = out.node_energy;
      etot[m] = out.energy;
      for (std::size_t k = 0; k < 3 * n; ++k) fmean[k] += forces[m][k] / nm;
    }
    // the definition, written out independently of the core's helper
    std::vector<double> ref(2 * n);
    double stats[6] = {-1, 1e300, 0, -1, 1e300, 0};
    for (std::size_t i = 0; i < n; ++i) {
      double vf = 0.0, ve = 0.0, em = 0.0;
      for (int m = 0; m < nm; ++m) em += energies[m][i] / nm;
      for (int m = 0; m < nm; ++m) {
        for (int d = 0; d < 3; ++d) vf += std::pow(forces[m][3 * i + d] - fmean[3 * i + d], 2) / nm;
        ve += std::pow(energies[m][i] - em, 2) / nm;
      }
      ref[2 * i] = std::sqrt(vf);
      ref[2 * i + 1] = std::sqrt(ve);
      for (int k = 0; k < 2; ++k) {
        stats[3 * k] = std::max(stats[3 * k], ref[2 * i + k]);
        stats[3 * k + 1] = std::min(stats[3 * k + 1], ref[2 * i + k]);
        stats[3 * k + 2] += ref[2 * i + k] / n;
      }
    }
    double emean = 0.0, evar = 0.0;
    for (int m = 0; m < nm; ++m) emean += etot[m] / nm;
    for (int m = 0; m < nm; ++m) evar += std::pow(etot[m] - emean, 2) / nm;
    std::vector<double> ref_vec(stats, stats + 6);
    ref_vec.push_back(std::sqrt(evar) / n);
    // virial deviation: std over members of each of the 9 components, / N
    double vstat[3] = {-1.0, 1e300, 0.0};
    for (int k = 0; k < 9; ++k) {
      double mean = 0.0, var = 0.0;
      for (int m = 0; m < nm; ++m) mean += wtot[9 * m + k] / nm;
      for (int m = 0; m < nm; ++m) var += std::pow(wtot[9 * m + k] - mean, 2) / nm;
      const double dv = std::sqrt(var) / n;
      vstat[0] = std::max(vstat[0], dv);
      vstat[1] = std::min(vstat[1], dv);
      vstat[2] += dv * dv;
    }
    // DeePMD-kit's avg_devi_v: np.linalg.norm(devi_v) / 3 (root mean square)
    vstat[2] = std::sqrt(vstat[2]) / 3.0;
    ref_vec.insert(ref_vec.end(), vstat, vstat + 3);

    const double dd = max_rel_dev(dev, ref);
    const double dv = max_rel_dev(vec, ref_vec);
    report(c.name + " " + mode + " per-atom deviation", dd);
    report(c.name + " " + mode + " deviation statistics", dv);
    EXPECT_LE(dd, 1e-10);
    EXPECT_LE(dv, 1e-10);
    // a committee that agrees would make the check empty
    EXPECT_GE(ref_vec[0], 1e-3) << "members agree too closely for a meaningful test";
    const double df = max_rel_dev(f, mode == "mean" ? fmean : forces[0]);
    report(c.name + " " + mode + " MD forces vs reference", df);
    EXPECT_LE(df, 1e-10);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Models, Committee,
    ::testing::Values(
        CommitteeCase{"si_crystal_committee",
                      {potentials + "/si_crystal_c0.pt", potentials + "/si_crystal_c1.pt",
                       potentials + "/si_crystal_c2.pt"},
                      1},
        CommitteeCase{"si_mp2_perturbed",
                      {potentials + "/si_mp2.pt", test_models + "/si_mp2_perturbed.pt"}, 2}),
    [](const auto &info) { return info.param.name; });
