/* -*- c++ -*- ----------------------------------------------------------
   ML-TORCH: machine-learned potentials for LAMMPS.
   Part of the LAMMPS-independent core (no LAMMPS, no MPI, no LibTorch
   type): what fix torch/finetune decides, so that unit tests reach it
   without LAMMPS. The settings of the fix and the replicas' fingerprint of
   them, the loss of one configuration and the statistics of an update
   round, the trainable-parameter selection, and the update policy (step,
   skip or roll back, and the loss average behind it). doc/fix_torch_finetune.rst
   documents the keywords, doc/fix_torch_finetune.rst the loss and its distributed gradient.
------------------------------------------------------------------------- */

#ifndef MLTORCH_CORE_FINETUNE_H
#define MLTORCH_CORE_FINETUNE_H

#include "mltorch/optimizer.h"   // OptimizerSettings
#include "mltorch/training.h"    // Schedule

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace MLTorch {

// the fix's keywords (doc/fix_torch_finetune.rst), with its defaults
struct FinetuneSettings {
  int nevery = 1;
  std::string teacher_style, teacher_coeff;
  double w_energy = 1.0, w_force = 1.0, w_stress = 0.0;
  OptimizerSettings opt;
  Schedule schedule;
  double clip = 0.0;               // gradient-norm clip (0 = none)
  int accumulate = 1;              // configurations per update and replica
  double max_force_error = 0.0;    // skip updates above this force RMSE (0 = never)
  double rollback_factor = 0.0;    // roll back above factor x the loss average (0 = never)
  int save_every = 0, log_every = 100, check_every = 10;
  std::string save_file;
  // labels FILE: every labelled configuration appended as extended XYZ
  std::string labels_file;
  // dataset FILE M: M configurations of FILE per update and replica
  std::string dataset_file;
  int dataset_per_update = 0;
  double dataset_weight = 1.0, dataset_mbytes = 4096.0;
  uint64_t dataset_seed = 0;
  std::vector<std::string> train_prefixes, freeze_prefixes;
  int replay_capacity = 0, replay_mix = 0;
  double replay_mbytes = 256.0;
  bool gated = false;              // uncertainty: label deviations in [gate_low, gate_high)
  double gate_low = 0.0, gate_high = 0.0;
  double teacher_timeout = 600.0;  // seconds an i-PI teacher waits for its client
  // per-element energy shifts fitted to the labels (1), none (0), or the
  // teacher's default (-1: fit for teacher ipi)
  int energy_shift = -1;

  // everything of the settings that decides when a collective between
  // replicas happens or what the optimizer does: replicas compare it
  std::string fingerprint() const;
};

// the counters of a training run (restart files keep them)
struct FinetuneCounters {
  int64_t nupdates = 0, nskipped = 0, nrollbacks = 0, nconfigs = 0;
  // uncertainty gating, this replica: teacher calls, configurations the
  // committee knew, above the window, updates without any label
  int64_t ncalls = 0, nknown = 0, nabove = 0, nempty = 0;
  // optimizer events: what the replay selection and the log count
  int64_t events() const { return nupdates + nskipped + nrollbacks; }
};

/* ---------------------------------------------------------------------- */

// The loss of one configuration of N atoms (the atoms the model covers)
//   L = wE ((E - Eref)/N)^2 + wF/(3N) sum_i |F_i - Fref_i|^2
//       + wS/6 sum_k ((W_k - Wref_k)/N)^2
// from its global sums (se_f = sum_i |F_i - Fref_i|^2), and the
// coefficients of its parameter gradient: dL/dF_i = cf (F_i - Fref_i),
// dL/dE = ce, dL/dW_k = cw[k]
struct LossTerms {
  double loss, de, se_w, cf, ce, dw[6], cw[6];
};
LossTerms loss_terms(double wE, double wF, double wS, double e, double e_ref, const double *w,
                     const double *w_ref, double se_f, double natoms);

// what an update round accumulated (this replica), summed over the replicas
// before the update
struct RoundStats {
  static constexpr int SIZE = 7;
  double loss = 0.0, se_e = 0.0, se_f = 0.0, nf = 0.0, se_w = 0.0;
  double n = 0.0;        // fresh configurations
  double ngrad = 0.0;    // fresh + replayed configurations in the gradient
  void add(const LossTerms &t, double se_f_config, double natoms);
  void pack(double *out) const;
  static RoundStats unpack(const double *in);
  double mean_loss() const { return loss / n; }
  double energy_rmse() const;    // per atom
  double force_rmse() const;
  double virial_rmse() const;    // per atom
};

/* ---------------------------------------------------------------------- */

// The energy reference of a teacher (energy_shift fit): a DFT code's total
// energy differs from the model's by per-element constants (pseudo-
// potentials, functional). Each labelled configuration c adds its element
// counts n_c and the residual d_c = Eref_c - E_c (E_c the model's energy);
// the shifts mu are the least-squares solution of n_c . mu = d_c over all
// configurations so far, of minimum norm (the pseudo-inverse of the normal
// equations: a single-composition run determines only n . mu). The energy
// label becomes Eref_c - n_c . mu. A teacher whose energies are another's
// plus n_c . s gives mu + P s (P projects onto the compositions seen), so
// the shifted labels, and the training, are the same.
class EnergyShift {
 public:
  explicit EnergyShift(int nspecies = 0) { resize(nspecies); }
  void resize(int nspecies);
  int nspecies() const { return ns; }
  // add a configuration and refit
  void add(const std::vector<double> &counts, double residual);
  const std::vector<double> &shifts() const { return mu; }
  double shift_of(const std::vector<double> &counts) const;
  int64_t configurations() const { return nconf; }
  // the state restart files keep (empty: nothing added), and back
  std::string pack() const;
  void unpack(const std::string &bytes);

 private:
  int ns = 0;
  int64_t nconf = 0;
  std::vector<double> ata, atb, mu;    // normal equations n n^T, n d; the fit
  void refit();
};

/* ---------------------------------------------------------------------- */

// a train/freeze prefix that selects no parameter
class SelectionError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
// parameter name `name` lies under `prefix`: "nets" selects "nets" and
// "nets.0.weight", not "netsx.weight"
bool under_prefix(const std::string &name, const std::string &prefix);
// which of `names` train: all when `train` is empty, else those under one of
// its prefixes; then those under a `freeze` prefix do not. SelectionError
// (naming the prefix) when a prefix selects nothing.
std::vector<bool> select_trainable(const std::vector<std::string> &names,
                                   const std::vector<std::string> &train,
                                   const std::vector<std::string> &freeze);

/* ---------------------------------------------------------------------- */

// what an update does with the replica-averaged gradient
enum class UpdateAction { Step, SkipNonFinite, SkipForceError, Rollback };
const char *describe(UpdateAction a);

class UpdatePolicy {
 public:
  UpdatePolicy(double max_force_error, double rollback_factor) :
      max_force_error_(max_force_error), rollback_factor_(rollback_factor)
  {
  }
  // the decision on the round's mean loss and force RMSE (the same reduced
  // values on every rank, so every rank decides alike); `can_roll_back`:
  // a good state is kept. Counts the event and moves the loss average:
  // a step after a rollback-enabled run takes `loss` into the average, a
  // rollback makes it the new baseline.
  UpdateAction decide(double loss, double f_rmse, bool finite, bool can_roll_back,
                      FinetuneCounters &counters);
  // the state must be kept as good before this step (rollback enabled)
  bool keeps_good() const { return rollback_factor_ > 0.0; }
  double loss_average() const { return loss_ema_; }
  void set_loss_average(double v) { loss_ema_ = v; }

 private:
  double max_force_error_, rollback_factor_;
  double loss_ema_ = -1.0;    // < 0: no average yet
};

// the file of committee member m: `path` for the first, then name.c1.pt,
// name.c2.pt ... (before the extension)
std::string member_file(const std::string &path, int m);

}    // namespace MLTorch

#endif
