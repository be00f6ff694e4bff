/* ----------------------------------------------------------------------
   ML-TORCH: message-passing models inside pair_style hybrid/overlay, the
   D3 dispersion correction on top of them as SevenNet's and MACE's
   foundation models are run. The overlay equals the sum of its two styles
   run alone on the same configuration: energy, forces, global and per-atom
   virial, per-atom energy, after NVE steps (atoms migrate, lists are
   rebuilt), for the halo exchange, folded ghosts and thick ghosts, on 1-4
   ranks (ctest HybridOverlay_np*)
------------------------------------------------------------------------- */

#include "pair_fixtures.h"


struct HybridCase {
  std::string name, model, halo;
  int nrep;
  bool triclinic, slab;
};

static void PrintTo(const HybridCase &c, std::ostream *os)
{
  *os << c.name;
}

class HybridOverlay : public ::testing::TestWithParam<HybridCase> {};

// D3(BJ) with PBE's parameters; cutoffs small enough for a quick test
static const std::string d3 = "dispersion/d3 bj pbe 12.0 8.0";

TEST_P(HybridOverlay, EqualsSumOfStyles)
{
  const HybridCase &c = GetParam();
  Lammps l;
  l.cmds(crystal("lattice diamond 5.431", 28.0855, c.triclinic, c.nrep, c.slab));
  l.cmds({"neighbor 1.0 bin", "compute peatom all pe/atom", "compute satom all stress/atom NULL virial",
          "compute press all pressure NULL virial",
          "compute sums all reduce sum c_peatom c_satom[1] c_satom[2] c_satom[3] c_satom[4] "
          "c_satom[5] c_satom[6]",
          "thermo_style custom step pe press c_press[*] c_sums[*]", "fix nve all nve",
          "timestep 0.002"});
  const std::string torch = "torch" + std::string(c.halo.empty() ? "" : " " + c.halo);
  l.cmds({"pair_style hybrid/overlay " + torch + " " + d3, "pair_coeff * * torch " + c.model + " Si",
          "pair_coeff * * dispersion/d3 Si", "run 5 post no"});
  // thick ghosts: the hybrid style asks Neighbor for the ghost lists
  EXPECT_EQ(l.lmp->force->pair->ghostneigh, c.halo == "halo thick" ? 1 : 0) << c.name;
  const auto overlay = snapshot(l, false);
  // the two styles alone, on the configuration the overlay reached
  l.cmds({"pair_style " + torch, "pair_coeff * * " + c.model + " Si", "run 0 post no"});
  const auto model = snapshot(l, false);
  l.cmds({"pair_style " + d3, "pair_coeff * * Si", "run 0 post no"});
  const auto disp = snapshot(l, false);

  auto sum = [](std::vector<double> a, const std::vector<double> &b) {
    for (std::size_t i = 0; i < a.size(); ++i) a[i] += b[i];
    return a;
  };
  Snapshot both = model;
  // the same atoms by construction (run 0 moves none; it only wraps into
  // the box those that had left it): no position to compare
  both.x = overlay.x;
  both.pe = model.pe + disp.pe;
  both.virial = sum(model.virial, disp.virial);
  both.f = sum(model.f, disp.f);
  both.peatom = sum(model.peatom, disp.peatom);
  both.satom = sum(model.satom, disp.satom);
  const double tol = 1e-12;
  const auto d = expect_global_within(overlay, both, tol, c.name);
  const double dpa = max_rel_dev(overlay.peatom, both.peatom);
  const double dsa = max_rel_dev(overlay.satom, both.satom);
  EXPECT_LE(dpa, tol) << c.name << " per-atom energy";
  EXPECT_LE(dsa, tol) << c.name << " per-atom virial";
  // the correction is there to be seen: D3 binds, a share of the total
  EXPECT_LT(disp.pe, -1e-3 * std::fabs(model.pe)) << c.name;
  EXPECT_GT(max_abs(disp.f), 1e-3 * max_abs(model.f)) << c.name;
  if (me == 0)
    std::printf("[ hybrid   ] %-16s np=%d  overlay vs model + D3: pe %.1e, f %.1e, virial %.1e, "
                "pe/atom %.1e, stress/atom %.1e (D3 %.4f of %.4f eV)\n",
                c.name.c_str(), nprocs, d.pe, d.f, d.virial, dpa, dsa, disp.pe, model.pe);
}

static const std::string mp2 = potentials + "/si_mp2.pt", mp4 = test_models + "/si_mp4_layered.pt";
INSTANTIATE_TEST_SUITE_P(
    Layered, HybridOverlay,
    ::testing::Values(HybridCase{"mp2", mp2, "", 3, false, false},
                      HybridCase{"mp2_fold_no", mp2, "fold no", 3, false, false},
                      HybridCase{"mp2_thick", mp2, "halo thick", 3, false, false},
                      HybridCase{"mp2_compiled", potentials + "/si_mp2.pt2", "", 3, true, false},
                      HybridCase{"mp2_slab", mp2, "", 3, false, true},
                      HybridCase{"mp4_triclinic", mp4, "", 2, true, false},
                      HybridCase{"mp4_thick", mp4, "halo thick", 2, true, false},
                      HybridCase{"mp4_self_images", mp4, "", 1, false, false}),
    [](const auto &info) { return info.param.name; });
