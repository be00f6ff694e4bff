/* -*- c++ -*- ----------------------------------------------------------
   LAMMPS - Large-scale Atomic/Molecular Massively Parallel Simulator
   https://www.lammps.org/, Sandia National Laboratories
   LAMMPS development team: developers@lammps.org

   ML-TORCH package: TorchScript machine-learned potentials.
   Distributed under the GNU General Public License, version 2.
------------------------------------------------------------------------- */

#ifndef LMP_FINETUNE_TEACHER_H
#define LMP_FINETUNE_TEACHER_H

#include "pointers.h"

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace MLTorch {
class IpiServer;
}

namespace LAMMPS_NS {

// The reference of fix torch/finetune (its `teacher` keyword): labels of
// the current configuration of a replica. Two kinds: a private instance of
// a LAMMPS pair style (PairTeacher), and an external program through the
// i-PI socket protocol (IpiTeacher: DFT codes, ASE calculators, another
// LAMMPS). In a pair_style hybrid run the teacher labels the whole system
// and the share of the other sub-styles is removed here, for both kinds,
// so that the model learns its own.
class FinetuneTeacher : protected Pointers {
 public:
  // `style`: the teacher keyword's first word and the rest of it ("sw" or
  // "ipi"); `args`: its second argument (pair_coeff lines, or the i-PI
  // address); `timeout`: seconds to wait for an i-PI client
  static std::unique_ptr<FinetuneTeacher> create(class LAMMPS *, const std::string &style,
                                                 const std::string &args, double timeout);
  ~FinetuneTeacher() override = default;
  // `text` with its $ variables substituted (the teacher's quoted argument)
  static std::string substitute_variables(class LAMMPS *, const std::string &text);
  FinetuneTeacher(const FinetuneTeacher &) = delete;
  FinetuneTeacher &operator=(const FinetuneTeacher &) = delete;

  // at every init() of the fix: the other hybrid sub-styles besides `student`
  virtual void init(class Pair *student);
  // at the start of every run, on every rank of the replica: be ready to
  // label (an i-PI teacher waits for its client); a failure (empty: none)
  // the caller agrees on across ranks and replicas
  virtual std::string connect() { return {}; }
  // values per atom the teacher's own forward/reverse communication moves
  // (LAMMPS sizes its buffers from force->pair and the fixes only)
  virtual int comm_forward() const { return 0; }
  virtual int comm_reverse() const { return 0; }
  // the labels of the current configuration: forces on the owned atoms into
  // fref[nlocal][3], this rank's share of the energy and virial (summed over
  // the replica's ranks they are the configuration's). `sum_to_owners` sums
  // the ghost shares of atom->f onto their owners (the fix's reverse
  // communication). atom->f is kept aside and put back untouched.
  // A failure agreed by the replica's ranks throws StepFailure.
  void label(double **fref, double &e_ref, double *w_ref, const std::function<void()> &sum_to_owners);
  // what the log, provenance and restart checks call it
  const std::string &describe() const { return description; }
  // before the replicas agree on a labelling step (a universe collective):
  // an external teacher waits there without spinning, so that the clients
  // still computing keep their cores
  virtual void wait_for_replicas() {}
  // a line for the log at the end of a run (empty: none)
  virtual std::string summary() const { return {}; }

 protected:
  FinetuneTeacher(class LAMMPS *lmp, const std::string &what) : Pointers(lmp), description(what) {}
  // the whole system's labels (as label(), without the hybrid share)
  virtual void reference(double **fref, double &e_ref, double *w_ref,
                         const std::function<void()> &sum_to_owners) = 0;
  std::string description;

 private:
  std::vector<class Pair *> others;
  std::vector<double> fsave, fothers;
};

// a private instance of a pair style (not the one the MD runs with), built
// from `teacher <style args> "<pair_coeff lines>"`, with its own neighbor list
class PairTeacher : public FinetuneTeacher {
 public:
  // `style`: the pair style and its settings; `coeff`: pair_coeff lines
  // (without the command), separated by ';'
  PairTeacher(class LAMMPS *, const std::string &style, const std::string &coeff);
  ~PairTeacher() override;
  void init(class Pair *student) override;
  int comm_forward() const override;
  int comm_reverse() const override;

 protected:
  void reference(double **fref, double &e_ref, double *w_ref,
                 const std::function<void()> &sum_to_owners) override;

 private:
  class Pair *pair;
};

// an external program through the i-PI protocol (`teacher ipi "ADDRESS
// PORT [unix]"`): the replica's first rank is the server, the configuration
// is gathered there by atom ID and sent in atomic units, the labels come
// back and are scattered to the owners by atom ID (finetune_teacher_ipi.cpp)
class IpiTeacher : public FinetuneTeacher {
 public:
  IpiTeacher(class LAMMPS *, const std::string &address, double timeout);
  ~IpiTeacher() override;
  std::string connect() override;
  void wait_for_replicas() override;
  // labels, the client's computing time, the server side (gather, socket,
  // checks, scatter) of this replica, since the fix was defined
  std::string summary() const override;
  // the conversion constants (CODATA 2018) into this run's units
  double hartree() const { return hartree_; }
  double bohr() const { return bohr_; }

 protected:
  void reference(double **fref, double &e_ref, double *w_ref,
                 const std::function<void()> &sum_to_owners) override;

 private:
  std::unique_ptr<MLTorch::IpiServer> server;    // the replica's first rank only
  std::string where;    // the socket path or host:port, as the log says it
  std::string host;     // what a client is given (CP2K's &DRIVER HOST, fix ipi's address)
  double timeout_s;
  double hartree_ = 0.0, bohr_ = 0.0;
  bigint natoms_seen = -1;
  std::vector<double> sendbuf, allbuf, labels;
  bigint nlabels = 0;
  double time_label = 0.0, time_client = 0.0;    // wall seconds on the first rank
  std::vector<int> counts, displs;
  std::string periodicity_failure() const;
  void log_notes();
  // ranks other than the server wait for it without spinning (a DFT call
  // takes seconds to hours, and a spinning MPI wait takes the client's cores)
  void lazy_wait(MPI_Comm comm);
};

}    // namespace LAMMPS_NS

#endif
