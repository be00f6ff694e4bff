/* -*- c++ -*- ----------------------------------------------------------
   ML-TORCH tests of pair_style torch/kk: LAMMPS instances with and
   without the KOKKOS suffix, the systems they run and a snapshot of their
   numbers (test_pair_kokkos*.cpp).
------------------------------------------------------------------------- */

#ifndef MLTORCH_TEST_KOKKOS_FIXTURES_H
#define MLTORCH_TEST_KOKKOS_FIXTURES_H

#include "atom.h"
#include "comm.h"
#include "../finetune_probe.h"
#include "force.h"
#include "input.h"
#include "lammps.h"
#include "library.h"
#include "modify.h"
#include "pair.h"

#include "mltorch/model.h"
#include "mltorch/runtime.h"

#include "../lammps_session.h"
#include "../mpi_test_main.h"

#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

using LAMMPS_NS::LAMMPS;

inline const std::string potentials = ML_TORCH_POTENTIALS_DIR;
inline const std::string lammps_potentials = ML_TORCH_LAMMPS_POTENTIALS_DIR;
inline const std::string test_models = ML_TORCH_TEST_MODELS_DIR;
inline int me = 0, nprocs = 1;

// Kokkos threads per rank (-k on t N): ctest runs the suite with 1 and,
// on an OpenMP Kokkos, 2 threads
inline std::string kokkos_threads()
{
  const char *t = std::getenv("ML_TORCH_KOKKOS_THREADS");
  return t ? t : "1";
}

// with `kokkos`: -k on t N -sf kk, so pair_style torch becomes torch/kk
class Lammps : public LammpsSession {
 public:
  explicit Lammps(bool kokkos, const std::vector<std::string> &package = {}) :
      LammpsSession(MPI_COMM_WORLD, args(kokkos, package), false)
  {
  }
  static std::vector<std::string> args(bool kokkos, const std::vector<std::string> &package)
  {
    if (!kokkos) return {};
    std::vector<std::string> a{"-k", "on", "t", kokkos_threads(), "-sf", "kk"};
    if (!package.empty()) {
      a.insert(a.end(), {"-pk", "kokkos"});
      a.insert(a.end(), package.begin(), package.end());
    }
    return a;
  }
  double capacity_changes()
  {
    int dim = 0;
    auto *p = static_cast<double *>(lmp->force->pair->extract("capacity_changes", dim));
    return p ? *p : -1.0;
  }
};

struct Snapshot {
  double pe, press;
  std::vector<double> f, pe_atom, s_atom, virial;
};

inline double rel(const std::vector<double> &a, const std::vector<double> &b)
{
  double num = 0.0, den = 0.0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    num = std::max(num, std::fabs(a[i] - b[i]));
    den = std::max(den, std::fabs(b[i]));
  }
  if (a.size() != b.size()) return INFINITY;
  return den > 0 ? num / den : num;
}

inline double rel(double a, double b)
{
  return std::fabs(a - b) / std::max(std::fabs(b), 1e-300);
}

struct System {
  std::string name;
  std::vector<std::string> setup;
  std::string style;    // pair_style + pair_coeff lines, ';'-separated, with "torch"
};

inline std::vector<std::string> lattice(const std::string &lat, double mass, int n, bool tri)
{
  const std::string s = std::to_string(n);
  return {"units metal", "atom_modify map array", "newton on", lat,
          tri ? "region box prism 0 " + s + " 0 " + s + " 0 " + s + " 1 0 0"
              : "region box block 0 " + s + " 0 " + s + " 0 " + s,
          "create_box 1 box", "create_atoms 1 box", "mass 1 " + std::to_string(mass),
          "displace_atoms all random 0.1 0.1 0.1 4321 units box",
          "velocity all create 600 4928 loop geom"};
}

inline Snapshot run(Lammps &l, const System &s, const std::string &pair, const std::string &coeff,
                    int steps)
{
  l.cmds(s.setup);
  l.cmd(pair);
  std::istringstream coeffs(coeff);    // one pair_coeff per line (pair_style hybrid)
  for (std::string line; std::getline(coeffs, line);) l.cmd(line);
  l.cmds({"compute pea all pe/atom", "compute sa all stress/atom NULL virial",
          "compute vir all pressure NULL virial",
          "thermo_style custom step pe press c_vir[1]",
          "fix md all nve", "run " + std::to_string(steps) + " post no"});
  Snapshot r;
  r.pe = l.thermo("pe");
  r.press = l.thermo("press");
  // the virial part of the pressure tensor (pair only: no kinetic term)
  auto *vir = static_cast<double *>(lammps_extract_compute(l.lmp, "vir", LMP_STYLE_GLOBAL, LMP_TYPE_VECTOR));
  r.virial.assign(vir, vir + 6);
  r.f = l.gather("f", 3);
  r.pe_atom = l.gather("c_pea", 1);
  r.s_atom = l.gather("c_sa", 6);
  return r;
}

#endif
