/* -*- c++ -*- ----------------------------------------------------------
   ML-TORCH tests of pair_style torch through the LAMMPS library API: what
   test_pair_lammps.cpp and test_pair_halo.cpp share (a LAMMPS session,
   crystals of the native styles' systems, snapshots of a short NVE run)
------------------------------------------------------------------------- */

#ifndef MLTORCH_TEST_PAIR_FIXTURES_H
#define MLTORCH_TEST_PAIR_FIXTURES_H

#include "atom.h"
#include "force.h"
#include "input.h"
#include "lammps.h"
#include "pair.h"
#include "library.h"

#include "mltorch/model.h"
#include "mltorch/runtime.h"
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

inline const std::string potentials = ML_TORCH_POTENTIALS_DIR;
inline const std::string lammps_potentials = ML_TORCH_LAMMPS_POTENTIALS_DIR;
inline const std::string test_models = ML_TORCH_TEST_MODELS_DIR;
inline int me = 0, nprocs = 1;
inline bool verbose = false;    // --verbose-lammps shows LAMMPS's screen output

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

inline std::vector<std::string> crystal(const std::string &lattice, double mass, bool triclinic,
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

inline System lj(bool tri, bool shift = false, bool slab = false)
{
  std::string mod = shift ? "\npair_modify shift yes" : "";
  return {std::string("lj") + (shift ? "-shift" : "") + (tri ? "-triclinic" : "") + (slab ? "-slab" : ""),
          crystal("lattice fcc 5.26", 39.948, tri, 3, slab),
          "pair_style lj/cut 8.5\npair_coeff 1 1 0.0104 3.40" + mod,
          "pair_style torch\npair_coeff * * " + potentials + (shift ? "/lj_Ar_shift.pt" : "/lj_Ar.pt") + " Ar",
          true};
}

// pair_style hybrid with torch covering type 1 only (NULL for type 2)
inline System lj_hybrid_null()
{
  return {"lj-hybrid-null", crystal("lattice fcc 5.26", 39.948, false, 3, false, 2),
          "pair_style lj/cut 8.5\npair_coeff * * 0.0104 3.40",
          "pair_style hybrid torch lj/cut 8.5\npair_coeff * * torch " + potentials +
              "/lj_Ar.pt Ar NULL\npair_coeff 1 2 lj/cut 0.0104 3.40\npair_coeff 2 2 lj/cut 0.0104 3.40",
          true};
}

inline System morse(bool tri)
{
  return {std::string("morse") + (tri ? "-triclinic" : ""), crystal("lattice fcc 3.615", 63.546, tri, 4),
          "pair_style morse 6.0\npair_coeff 1 1 0.3429 1.3588 2.866",
          "pair_style torch\npair_coeff * * " + potentials + "/morse_Cu.pt Cu", true};
}

inline System sw(bool tri, bool slab = false)
{
  return {std::string("sw") + (tri ? "-triclinic" : "") + (slab ? "-slab" : ""),
          crystal("lattice diamond 5.431", 28.0855, tri, 3, slab),
          "pair_style sw\npair_coeff * * " + lammps_potentials + "/Si.sw Si",
          "pair_style torch\npair_coeff * * " + potentials + "/sw_Si.pt Si", false};
}

inline double max_abs(const std::vector<double> &v)
{
  double m = v.empty() ? -1.0 : 0.0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

inline Snapshot snapshot(Lammps &l, bool centroid)
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

inline std::vector<Snapshot> simulate(const System &sys, bool use_torch, int nsteps)
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

inline void report(const std::string &what, double dev)
{
  if (me == 0)
    std::printf("[ DEV      ] %-26s np=%d  max relative deviation %.3e\n", what.c_str(), nprocs, dev);
}

// largest relative deviations of run a from run b in the global quantities
struct GlobalDeviation {
  double pe, virial, f, x;
};

// a agrees with b within tol (relative) in energy, virial, forces and
// positions; the deviations, for report()
inline GlobalDeviation expect_global_within(const Snapshot &a, const Snapshot &b, double tol,
                                            const std::string &tag)
{
  const GlobalDeviation d{std::fabs(a.pe - b.pe) / std::fabs(b.pe), max_rel_dev(a.virial, b.virial),
                          max_rel_dev(a.f, b.f), max_rel_dev(a.x, b.x)};
  EXPECT_LE(d.pe, tol) << tag << " energy " << a.pe << " vs " << b.pe;
  EXPECT_LE(d.virial, tol) << tag << " virial";
  EXPECT_LE(d.f, tol) << tag << " forces";
  EXPECT_LE(d.x, tol) << tag << " positions";
  return d;
}


#endif
