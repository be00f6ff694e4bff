/* -*- c++ -*- ----------------------------------------------------------
   ML-TORCH tests: a LAMMPS instance driven through the library interface
   (works with the current LAMMPS and with 29 Sep 2021).
------------------------------------------------------------------------- */

#ifndef MLTORCH_TEST_LAMMPS_SESSION_H
#define MLTORCH_TEST_LAMMPS_SESSION_H

#include "input.h"
#include "lammps.h"
#include "library.h"

#include <mpi.h>

#include <exception>
#include <string>
#include <vector>

class LammpsSession {
 public:
  // quiet (no log, no echo; no screen unless `verbose`) plus `extra` arguments
  LammpsSession(MPI_Comm comm, const std::vector<std::string> &extra, bool verbose)
  {
    std::vector<std::string> args{"lmp", "-log", "none", "-echo", "none", "-nocite"};
    if (!verbose) args.insert(args.end(), {"-screen", "none"});
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char *> argv;
    for (auto &a : args) argv.push_back(&a[0]);
    lmp = new LAMMPS_NS::LAMMPS(static_cast<int>(argv.size()), argv.data(), comm);
  }
  ~LammpsSession() { delete lmp; }
  LammpsSession(const LammpsSession &) = delete;
  LammpsSession &operator=(const LammpsSession &) = delete;

  void cmd(const std::string &line) { lmp->input->one(line); }
  void cmds(const std::vector<std::string> &lines)
  {
    for (const auto &l : lines) cmd(l);
  }
  // the ERROR text (exception message) the commands end with, or "" if none
  std::string error_of(const std::vector<std::string> &lines)
  {
    try {
      cmds(lines);
    } catch (std::exception &e) {
      return e.what();
    }
    return "";
  }
  std::size_t natoms() const { return static_cast<std::size_t>(lammps_get_natoms(lmp)); }
  double thermo(const char *key) { return lammps_get_thermo(lmp, key); }
  // per-atom property or compute/fix value, `count` per atom, in atom-ID order
  std::vector<double> gather(const char *name, int count)
  {
    std::vector<double> data(natoms() * count);
    std::string n = name;    // older LAMMPS takes a non-const name
    lammps_gather(lmp, &n[0], 1, count, data.data());
    return data;
  }

  LAMMPS_NS::LAMMPS *lmp;
};

#endif
