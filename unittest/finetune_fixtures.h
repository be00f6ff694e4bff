/* -*- c++ -*- ----------------------------------------------------------
   ML-TORCH tests of fix torch/finetune: what test_finetune*.cpp share (a
   LAMMPS session, silicon inputs, the teacher, the committee files)
------------------------------------------------------------------------- */

#ifndef MLTORCH_TEST_FINETUNE_FIXTURES_H
#define MLTORCH_TEST_FINETUNE_FIXTURES_H

#include "atom.h"
#include "finetune_probe.h"
#include "force.h"
#include "input.h"
#include "lammps.h"
#include "library.h"
#include "modify.h"

#include "mltorch/model.h"
#include "mltorch/runtime.h"
#include "pair.h"
#include "pair_torch.h"
#include "reference_graph.h"
#include "universe.h"

#include "lammps_session.h"
#include "mpi_test_main.h"

#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <unistd.h>
#include <cstdio>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

using LAMMPS_NS::LAMMPS;

inline const std::string potentials = ML_TORCH_POTENTIALS_DIR;
inline const std::string lammps_potentials = ML_TORCH_LAMMPS_POTENTIALS_DIR;
inline const std::string student = ML_TORCH_EXAMPLES_DIR "/finetune/si_student.pt";
inline const std::string test_models = ML_TORCH_TEST_MODELS_DIR;

// a committee of two Si models (si_local and a perturbed copy)
inline std::string committee_files()
{
  return potentials + "/si_local.pt " + test_models + "/si_local_perturbed.pt";
}
inline int me = 0, nprocs = 1;
inline bool verbose = false;

class Lammps : public LammpsSession {
 public:
  explicit Lammps(MPI_Comm comm = MPI_COMM_WORLD, const std::vector<std::string> &extra = {}) :
      LammpsSession(comm, extra, verbose)
  {
  }
  LAMMPS_NS::FixTorchFinetuneProbe fix(const char *id = "ft")
  {
    return LAMMPS_NS::FixTorchFinetuneProbe::of(lmp, id);
  }
  // the model's parameters and buffers (float64 models) as doubles
  std::vector<double> params()
  {
    const std::string s = fix()->model()->state_bytes();
    std::vector<double> v(s.size() / sizeof(double));
    std::memcpy(v.data(), s.data(), s.size());
    return v;
  }
};

// one partition per MPI rank
inline std::vector<std::string> partitions()
{
  return {"-partition", std::to_string(nprocs) + "x1", "-plog", "none", "-pscreen", "none", "-in", "none"};
}

inline std::string teacher()
{
  return "teacher sw \"* * " + lammps_potentials + "/Si.sw Si\"";
}

// 64 (or 2^3 x 8 n^3) Si atoms, displaced from the diamond lattice
inline std::vector<std::string> silicon(int n, int seed, const std::string &shape = "ortho")
{
  const std::string s = std::to_string(n);
  std::vector<std::string> c{"units metal", "atom_modify map array", "lattice diamond 5.431"};
  if (shape == "slab") {
    // atoms fill half of the box in x: with processors * 1 1 some ranks own none
    c.push_back("region box block 0 " + std::to_string(2 * n) + " 0 " + s + " 0 " + s);
    c.push_back("processors * 1 1");
    c.push_back("create_box 1 box");
    c.push_back("region atoms block 0.1 " + std::to_string(n - 0.1) + " 0 " + s + " 0 " + s);
    c.push_back("create_atoms 1 region atoms");
  } else if (shape == "triclinic") {
    c.push_back("region box prism 0 " + s + " 0 " + s + " 0 " + s + " 1 1 0");
    c.push_back("create_box 1 box");
    c.push_back("create_atoms 1 box");
  } else {
    c.push_back("region box block 0 " + s + " 0 " + s + " 0 " + s);
    c.push_back("create_box 1 box");
    c.push_back("create_atoms 1 box");
  }
  c.push_back("mass 1 28.0855");
  c.push_back("displace_atoms all random 0.12 0.12 0.12 " + std::to_string(seed) + " units box");
  return c;
}

inline double max_abs(const std::vector<double> &v)
{
  double m = 0.0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

inline double max_diff(const std::vector<double> &a, const std::vector<double> &b)
{
  double m = 0.0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

// the largest difference relative to the largest |b|
inline double rel_diff(const std::vector<double> &a, const std::vector<double> &b)
{
  return max_diff(a, b) / std::max(max_abs(b), 1e-300);
}

// a file name in the test's temporary folder, the same on every rank (rank
// 0's process id), so that tests that run side by side do not meet
inline std::string shared_temp_file(const std::string &name)
{
  long pid = static_cast<long>(getpid());
  MPI_Bcast(&pid, 1, MPI_LONG, 0, MPI_COMM_WORLD);
  return ::testing::TempDir() + "/mlt" + std::to_string(pid) + "_" + name;
}

// the spoilt student running NVE on a 900 K 64-atom Si crystal
inline void hot_student(Lammps &l, int seed)
{
  l.cmds(silicon(2, seed, "ortho"));
  l.cmds({"velocity all create 900 4928 loop geom", "pair_style torch",
          "pair_coeff * * " + student + " Si", "fix md all nve"});
}


#endif
