/* ----------------------------------------------------------------------
   ML-TORCH: pair_style torch through the LAMMPS library API, part two
   (the same test program as test_pair_lammps.cpp): NVE energy conservation,
   the per-layer halo exchange against thick ghosts, committees and their
   deviation.
------------------------------------------------------------------------- */

#include "pair_fixtures.h"

#include "comm.h"

#include <algorithm>

/* ----------------------------------------------------------------------
   energy conservation with the shipped Si model: 512 atoms, 1 fs, 5 ps NVE
   (run by its own ctest entry: --gtest_filter=NVE.*). The bound is
   LAMMPS's own: the same run with native sw (the potential si_local was
   trained on, so of similar stiffness) sets the scale of velocity Verlet's
   energy error at this timestep
------------------------------------------------------------------------- */

namespace {
struct Conservation {
  double drift, worst, temp;
};

Conservation nve_5ps(const std::string &pair_style, const std::string &pair_coeff)
{
  Lammps l;
  l.cmds({"units metal", "atom_modify map array", "boundary p p p", "lattice diamond 5.431",
          "region box block 0 4 0 4 0 4", "create_box 1 box", "create_atoms 1 box",
          "mass 1 28.0855", "velocity all create 600.0 87287 loop geom", pair_style, pair_coeff,
          "neighbor 1.0 bin", "timestep 0.001", "fix nve all nve", "thermo 100",
          "thermo_style custom step temp pe etotal", "run 0 post no"});
  const double natoms = static_cast<double>(l.natoms());
  const double e0 = l.thermo("etotal");
  double worst = 0.0;
  for (int block = 0; block < 50; block++) {
    l.cmd("run 100 post no");
    worst = std::max(worst, std::fabs(l.thermo("etotal") - e0) / natoms);
  }
  return {(l.thermo("etotal") - e0) / natoms, worst, l.thermo("temp")};
}
}    // namespace

TEST(NVE, SiliconLocalModelConservesEnergy)
{
  const auto model = nve_5ps("pair_style torch", "pair_coeff * * " + potentials + "/si_local.pt Si");
  const auto native = nve_5ps("pair_style sw", "pair_coeff * * " + lammps_potentials + "/Si.sw Si");
  if (me == 0)
    std::printf("[ NVE      ] 512 Si atoms, 5 ps at 1 fs: si_local drift %.3e eV/atom, largest "
                "excursion %.3e eV/atom, final T %.1f K; native sw %.3e and %.3e eV/atom\n",
                model.drift, model.worst, model.temp, native.drift, native.worst);
  // within a few times what LAMMPS's own sw does with the same integrator
  EXPECT_LT(model.worst, 3.0 * native.worst);
  EXPECT_LT(std::fabs(model.drift), 3.0 * native.worst);
  EXPECT_GT(model.temp, 100.0);    // the crystal really moved
}

/* ---------------------------------------------------------------------- */

/* ----------------------------------------------------------------------
   per-layer halo exchange vs thick ghosts, the same layered model: energy,
   forces, global and per-atom virial, per-atom energy at set-up and after
   NVE steps (atoms migrate, lists are rebuilt), orthogonal and triclinic,
   with an empty rank (slab), and in a box so small that a rank holds
   periodic images of its own atoms; 1-4 ranks (ctest HaloExchange_np*)
------------------------------------------------------------------------- */

// two runs of the same system agree to 1e-12 relative in energy, virial,
// forces, positions, per-atom energy and per-atom virial
static void expect_same(const Snapshot &a, const Snapshot &b, const std::string &tag)
{
  const double tol = 1e-12;
  const auto d = expect_global_within(a, b, tol, tag);
  const double dpa = max_rel_dev(a.peatom, b.peatom);
  const double dsa = max_rel_dev(a.satom, b.satom);
  EXPECT_LE(dpa, tol) << tag << " per-atom energy";
  EXPECT_LE(dsa, tol) << tag << " per-atom virial";
  report(tag + " pe", d.pe);
  report(tag + " f", d.f);
  report(tag + " virial", d.virial);
  report(tag + " pe/atom", dpa);
  report(tag + " stress/atom", dsa);
}

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
  for (int k = 0; k < 2; k++) expect_same(exchange[k], thick[k], c.name + (k == 0 ? " run0" : " run5"));
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
   folded ghosts (fold yes, the default with the exchange on one rank): the
   model runs once on the owned atoms, edges to ghosts pointing at their
   owners; the same energy, forces, virial and per-atom terms as the
   exchange (fold no) at set-up and after NVE steps, and graphs of exactly
   the owned atoms on one rank (on more ranks nothing is folded)
------------------------------------------------------------------------- */

class FoldedGhosts : public ::testing::TestWithParam<HaloCase> {};

TEST_P(FoldedGhosts, EqualsExchange)
{
  const HaloCase &c = GetParam();
  const std::string coeff = "\npair_coeff * * " + c.model + " Si";
  auto setup = crystal("lattice diamond 5.431", 28.0855, c.triclinic, c.nrep, c.slab);
  // the ordinary input has no atom map (LAMMPS makes one for molecular
  // atom styles only): folding must not need one; "_map" cases keep it
  if (c.name.find("_map") == std::string::npos)
    setup.erase(std::remove(setup.begin(), setup.end(), std::string("atom_modify map array")),
                setup.end());
  System sys{c.name, setup, "pair_style torch fold no" + coeff, "pair_style torch" + coeff, true, false};
  const auto exchange = simulate(sys, false, 5);
  const auto folded = simulate(sys, true, 5);
  for (int k = 0; k < 2; k++)
    expect_same(folded[k], exchange[k], c.name + (k == 0 ? " run0" : " run5") + " folded");

  // the graph the model saw: the owned atoms alone when folded
  auto nodes = [&](const std::string &style) {
    Lammps l;
    l.cmds(setup);
    l.cmds({style, "pair_coeff * * " + c.model + " Si", "run 0 post no"});
    int dim = 0;
    const auto *size = static_cast<double *>(l.lmp->force->pair->extract("graph_size", dim));
    return std::make_pair(size[0], static_cast<double>(l.lmp->atom->nlocal));
  };
  const auto fold = nodes("pair_style torch"), keep = nodes("pair_style torch fold no");
  if (nprocs == 1) {
    EXPECT_EQ(fold.first, fold.second) << c.name;
    EXPECT_GT(keep.first, keep.second) << c.name;
  } else {
    EXPECT_EQ(fold.first, keep.first) << c.name;
  }
  if (me == 0)
    std::printf("[ folded   ] %s on %d rank(s), rank 0: graph nodes %.0f folded, %.0f with the "
                "exchange, for %.0f owned atoms\n", c.name.c_str(), nprocs, fold.first, keep.first,
                fold.second);
}

INSTANTIATE_TEST_SUITE_P(Layered, FoldedGhosts,
                         ::testing::Values(HaloCase{"mp2", mp2, 3, false, false},
                                           HaloCase{"mp2_map", mp2, 3, false, false},
                                           HaloCase{"mp2_self_images", mp2, 1, false, false},
                                           HaloCase{"mp4_triclinic", mp4, 2, true, false},
                                           HaloCase{"mp4_slab", mp4, 2, false, true}),
                         [](const auto &info) { return info.param.name; });

/* ----------------------------------------------------------------------
   folding across runs: LAMMPS counts neighbour list builds from zero in
   every run, so ghost owners found in one run must not be taken for the
   next; atoms moved between runs (displace_atoms: new owners, sorting)
   give the numbers of the exchange (fold no)
------------------------------------------------------------------------- */

TEST(FoldAcrossRuns, DisplacedAtomsGetTheirOwners)
{
  std::vector<double> f[2];
  double pe[2];
  for (int fold = 0; fold < 2; ++fold) {
    Lammps l;
    auto setup = crystal("lattice diamond 5.431", 28.0855, false, 2);
    setup.erase(std::remove(setup.begin(), setup.end(), std::string("atom_modify map array")),
                setup.end());
    l.cmds(setup);
    l.cmds({"displace_atoms all random 0.1 0.1 0.1 77 units box",
            fold ? "pair_style torch" : "pair_style torch fold no", "pair_coeff * * " + mp2 + " Si",
            "thermo_modify format float %.17g", "run 0 post no",
            "displace_atoms all move 5.4 5.4 0 units box", "run 0 post no"});
    f[fold] = l.gather("f", 3);
    pe[fold] = l.thermo("pe");
  }
  const double df = max_rel_dev(f[1], f[0]);
  if (me == 0)
    std::printf("[ folded   ] after displace_atoms between runs, %d rank(s): forces folded vs exchange "
                "%.2e, pe %.2e\n", nprocs, df, std::fabs(pe[1] - pe[0]) / std::fabs(pe[0]));
  EXPECT_LE(df, 1e-12);
  EXPECT_NEAR(pe[1], pe[0], 1e-12 * std::fabs(pe[0]));
}

/* ----------------------------------------------------------------------
   a re-issued pair_style torch after a run takes effect in the next run:
   'halo thick' makes ghost neighbour lists and thick ghosts (more graph
   nodes), 'fold no' keeps the exchange's ghost nodes on one rank, and
   back to the defaults gives the first run's graph and numbers again
------------------------------------------------------------------------- */

TEST(ReissuedPairStyle, HaloAndFoldTakeEffect)
{
  Lammps l;
  l.cmds(crystal("lattice diamond 5.431", 28.0855, false, 2));
  l.cmds({"velocity all create 900.0 4928 loop geom", "pair_style torch",
          "pair_coeff * * " + mp2 + " Si", "thermo_modify format float %.17g", "run 0 post no"});
  auto nodes = [&] {
    int dim = 0;
    return static_cast<double *>(l.lmp->force->pair->extract("graph_size", dim))[0];
  };
  const double natoms = static_cast<double>(l.natoms());
  const double n_default = nodes(), pe_default = l.thermo("pe");
  const auto f_default = l.gather("f", 3);
  l.cmds({"pair_style torch halo thick", "run 0 post no"});
  const double n_thick = nodes(), pe_thick = l.thermo("pe");
  EXPECT_EQ(l.lmp->force->pair->ghostneigh, 1);
  l.cmds({"pair_style torch fold no", "run 0 post no"});
  const double n_nofold = nodes();
  EXPECT_EQ(l.lmp->force->pair->ghostneigh, 0);
  l.cmds({"pair_style torch", "run 0 post no"});
  const double n_again = nodes();
  const double df = max_rel_dev(l.gather("f", 3), f_default);
  if (me == 0)
    std::printf("[ reissue  ] %d rank(s): graph nodes %.0f (default), %.0f (halo thick), %.0f "
                "(fold no), %.0f (default again) for %.0f atoms; pe thick vs exchange %.2e\n",
                nprocs, n_default, n_thick, n_nofold, n_again, natoms,
                std::fabs(pe_thick - pe_default) / std::fabs(pe_default));
  EXPECT_GT(n_thick, n_nofold);    // thick ghosts: two cutoffs deep, not one
  if (nprocs == 1) {
    EXPECT_EQ(n_default, natoms);
    EXPECT_GT(n_nofold, natoms);
  }
  EXPECT_EQ(n_again, n_default);
  EXPECT_LE(std::fabs(pe_thick - pe_default), 1e-12 * std::fabs(pe_default));
  EXPECT_LE(df, 1e-12);
}

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

// thick ghosts raise the ghost cutoff to L cutoffs plus the skin, and keep
// a user's larger comm_modify cutoff (doc/pair_torch.rst)
TEST(HaloGhosts, LargerUserGhostCutoffKept)
{
  auto ghost_cutoff = [](const std::string &user) {
    Lammps l;
    l.cmds(crystal("lattice diamond 5.431", 28.0855, false, 2));
    if (!user.empty()) l.cmd("comm_modify cutoff " + user);
    l.cmds({"pair_style torch halo thick", "pair_coeff * * " + mp2 + " Si", "run 0 post no"});
    return std::make_pair(l.lmp->comm->cutghostuser, l.lmp->force->pair->cutforce);
  };
  const auto [raised, rc] = ghost_cutoff("");
  const double skin = 2.0;    // metal units' default
  EXPECT_NEAR(raised, 2 * rc + skin, 1e-12);
  EXPECT_EQ(ghost_cutoff("5.0").first, raised);    // a smaller user setting is raised
  EXPECT_EQ(ghost_cutoff("25.0").first, 25.0);     // a larger one is kept
}

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
            "compute dev all torch/deviation", "compute pv all pressure NULL virial",
            "thermo_style custom step pe c_pv c_dev[*]", "run 0 post no"});
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
    // doc/compute_torch_deviation.rst: 1e-13 (measured up to 2.9e-14, 1 and 4 ranks)
    EXPECT_LE(dd, 1e-13);
    EXPECT_LE(dv, 1e-13);
    // a committee that agrees would make the check empty
    EXPECT_GE(ref_vec[0], 1e-3) << "members agree too closely for a meaningful test";
    const double df = max_rel_dev(f, mode == "mean" ? fmean : forces[0]);
    report(c.name + " " + mode + " MD forces vs reference", df);
    EXPECT_LE(df, 1e-14);    // measured up to 1.9e-15
    // the MD energy and pressure: the mean's with 'committee mean', the
    // first member's otherwise (the members' energies differ by more than
    // the tolerance, so a mean that reported member 0's would fail)
    const double pe = l.thermo("pe");
    const double e_want = mode == "mean" ? emean : etot[0];
    EXPECT_GT(std::fabs(etot[0] - emean), 1e-6 * std::fabs(emean));
    EXPECT_NEAR(pe, e_want, 1e-14 * std::fabs(e_want)) << c.name << " " << mode;    // measured 2.1e-16
    double w_want = 0.0;
    for (int m = 0; m < nm; ++m)
      if (mode == "mean" || m == 0) w_want += (wtot[9 * m] + wtot[9 * m + 4] + wtot[9 * m + 8]) /
            (mode == "mean" ? nm : 1);
    const double vol = (boxhi[0] - boxlo[0]) * (boxhi[1] - boxlo[1]) * (boxhi[2] - boxlo[2]);
    // the virial pressure (no kinetic part): trace(W) / (3V), in bar
    const double p_want = w_want / (3.0 * vol) * l.lmp->force->nktv2p;
    const double pv = *static_cast<double *>(
        lammps_extract_compute(l.lmp, "pv", LMP_STYLE_GLOBAL, LMP_TYPE_SCALAR));
    EXPECT_NEAR(pv, p_want, 1e-9 * std::fabs(p_want)) << c.name << " " << mode;
    report(c.name + " " + mode + " energy vs reference", std::fabs(pe - e_want) / std::fabs(e_want));
  }
}

// a group other than all: the per-atom column is the all-group column in
// the group and 0 outside it, outputs 1-6 are its statistics over the
// group's atoms, outputs 7-10 (energy and virial) are the whole system's
TEST(CommitteeDeviation, GroupRestrictsPerAtomOutputs)
{
  Lammps l;
  l.cmds(crystal("lattice diamond 5.431", 28.0855, false, 2));
  l.cmds({"pair_style torch", "pair_coeff * * " + potentials + "/si_crystal_c0.pt " + potentials +
              "/si_crystal_c1.pt " + potentials + "/si_crystal_c2.pt Si",
          "group half id <= 24", "compute all all torch/deviation", "compute half half torch/deviation",
          "thermo_style custom step pe c_all[1] c_half[1]", "run 0 post no"});
  const auto all = l.gather("c_all", 2), half = l.gather("c_half", 2);
  const auto va = l.compute_vector("all", 10), vh = l.compute_vector("half", 10);
  const std::size_t n = l.natoms(), in = 24;
  ASSERT_EQ(n, 64u);
  double want[6] = {-1, 1e300, 0, -1, 1e300, 0};
  for (std::size_t i = 0; i < n; ++i)    // atom-ID order: IDs 1..24 are the group
    for (int c = 0; c < 2; ++c) {
      if (i < in) {
        EXPECT_EQ(half[2 * i + c], all[2 * i + c]) << "atom " << i + 1;
        want[3 * c] = std::max(want[3 * c], all[2 * i + c]);
        want[3 * c + 1] = std::min(want[3 * c + 1], all[2 * i + c]);
        want[3 * c + 2] += all[2 * i + c] / in;
      } else {
        EXPECT_EQ(half[2 * i + c], 0.0) << "atom " << i + 1;
      }
    }
  for (int k = 0; k < 6; ++k) EXPECT_NEAR(vh[k], want[k], 1e-14 * std::fabs(want[k])) << "output " << k + 1;
  for (int k = 6; k < 10; ++k) EXPECT_EQ(vh[k], va[k]) << "output " << k + 1;
  // the group's statistics are not the system's (its mean: the extremes
  // may fall in the group)
  EXPECT_NE(vh[2], va[2]);
  EXPECT_GT(want[0], 0.0);
}

// the members run only on the steps whose output asks for a deviation,
// once per step however many computes, dumps and thermo columns ask;
// with committee mean every force call has them already
TEST(CommitteeDeviation, MembersEvaluatedOncePerStepThatAsks)
{
  const std::string files = potentials + "/si_crystal_c0.pt " + potentials + "/si_crystal_c1.pt " +
      potentials + "/si_crystal_c2.pt Si";
  const std::string dump = ::testing::TempDir() + "/deviation.dump";
  for (const std::string mode : {"first", "mean"}) {
    Lammps l;
    l.cmds(crystal("lattice diamond 5.431", 28.0855, false, 2));
    l.cmds({"pair_style torch committee " + mode, "pair_coeff * * " + files,
            "compute dev1 all torch/deviation", "compute dev2 all torch/deviation relative 1.0",
            "thermo_style custom step pe c_dev1[1] c_dev2[1] c_dev1[8]", "thermo 5",
            "dump d all custom 5 " + dump + " id c_dev1[1] c_dev2[2]", "fix nve all nve",
            "run 10 post no"});
    int dim = 0;
    const auto *calls = static_cast<double *>(l.lmp->force->pair->extract("model_calls", dim));
    ASSERT_NE(calls, nullptr);
    EXPECT_EQ(calls[0], 11.0) << mode;    // steps 0-10
    // steps 0, 5, 10 ask; member 0 is the force call's own model
    EXPECT_EQ(calls[2], mode == "first" ? 3.0 * 2 : 0.0) << mode;
  }
  std::remove(dump.c_str());
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
