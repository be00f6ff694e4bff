/* -*- c++ -*- ----------------------------------------------------------
   LAMMPS - Large-scale Atomic/Molecular Massively Parallel Simulator
   https://www.lammps.org/, Sandia National Laboratories
   LAMMPS development team: developers@lammps.org

   ML-TORCH package: TorchScript machine-learned potentials.
   Distributed under the GNU General Public License, version 2.
------------------------------------------------------------------------- */

#ifdef FIX_CLASS
// clang-format off
FixStyle(torch/finetune,FixTorchFinetune);
// clang-format on
#else

#ifndef LMP_FIX_TORCH_FINETUNE_H
#define LMP_FIX_TORCH_FINETUNE_H

#include "fix.h"

#include <memory>
#include <string>
#include <vector>

namespace MLTorch {
struct GraphInput;
class Model;
class Trainer;
struct OptimizerSettings;
}    // namespace MLTorch

namespace LAMMPS_NS {

class FixTorchFinetune : public Fix {
 public:
  FixTorchFinetune(class LAMMPS *, int, char **);
  ~FixTorchFinetune() override;

  int setmask() override;
  void init() override;
  void setup(int) override;
  void setup_pre_force(int) override;
  void post_force(int) override;
  void post_run() override;
  double compute_vector(int) override;
  void write_restart(FILE *) override;
  // the largest restart record LAMMPS stores for a fix (an int byte count);
  // a test lowers it to reach the error without a 2 GB model
  static std::size_t max_restart_bytes;
  void restart(char *) override;
  double memory_usage() override;

  int pack_forward_comm(int, int *, double *, int, int *) override;
  void unpack_forward_comm(int, int, double *) override;
  int pack_reverse_comm(int, int, double *) override;
  void unpack_reverse_comm(int, int *, double *) override;

  // for tests and tools: the replica-averaged loss gradient of the last
  // update (trainable parameters, model order), before clipping
  const std::vector<double> &last_gradient() const { return last_grad; }
  bigint updates() const { return nupdates; }
  bigint checksums_compared() const { return nchecks; }
  MLTorch::Model *model() { return model_.get(); }
  int replay_size() const { return static_cast<int>(replay.size()); }
  double replay_bytes() const;

 protected:
  // --- settings ---
  std::string teacher_style, teacher_coeff;
  double w_energy, w_force, w_stress;
  std::unique_ptr<MLTorch::OptimizerSettings> opt;
  std::string schedule;    // constant, exp, step, cosine
  double sched_a, sched_b;
  double clip;
  int accumulate;
  double max_force_error;    // skip updates above this force RMSE (0 = never)
  double rollback_factor;    // roll back when the loss exceeds factor x running loss (0 = never)
  int save_every, log_every, check_every;
  std::string save_file;
  std::vector<std::string> train_prefixes, freeze_prefixes;
  int replay_capacity, replay_mix;
  double replay_mbytes;

  // --- state ---
  // the pair style running the model: set when the fix is defined and by
  // every init(); between runs it may be gone (another pair_style), so only
  // run-time code uses it
  class PairTorch *student;
  // the model, shared with the pair style that loaded it: it stays valid for
  // the fix (restart files, saves) whatever happens to the pair style
  std::shared_ptr<MLTorch::Model> model_;
  std::string model_path, model_hash;    // of the student's model file
  std::unique_ptr<MLTorch::Trainer> trainer;
  class Pair *teacher;
  // in a pair_style hybrid run: the sub-styles other than the model, whose
  // share the fix removes from the teacher's labels of the whole system
  std::vector<class Pair *> others;
  bool synced;
  int pending;    // configurations accumulated since the last update
  bigint nupdates, nskipped, nrollbacks, nchecks, nconfigs;
  double loss_ema;
  std::string good_params, good_optimizer;    // last parameters with an acceptable loss

  // statistics of the configurations accumulated since the last update,
  // this replica only (identical on its ranks)
  double acc_loss, acc_se_e, acc_se_f, acc_nf, acc_se_w;
  double acc_n;
  // thermo vector of the last update
  double vec[11];
  // wall seconds of this rank in labelling + training + updates, and in the
  // cross-replica gradient reduction (output vector elements 12 and 13)
  double time_update = 0.0, time_reduce = 0.0;
  std::vector<double> last_grad;

  // --- per-atom work arrays ---
  int nmax;
  double **fpart;    // partial model forces -> full forces on owners (reverse comm)
  double **resid;    // force-loss weights on owners -> ghost copies (forward comm)
  double **fref;     // teacher forces on owners
  double **fsave;    // the MD forces, kept while the teacher runs
  int commflag;
  std::vector<double> node_buf, weight_buf;    // per-node forces and weights, reused

  // --- replay buffer: this rank's share of past labelled configurations ---
  struct Replay;
  std::vector<std::unique_ptr<Replay>> replay;
  int stored_this_round;    // fresh configurations stored since the last update
  bool replay_warned;
  double acc_ngrad;         // configurations (fresh + replayed) in the pending gradient

  void parse_teacher();
  void setup_trainable();
  void check_replicas_consistent(bool broadcast);
  void grow_arrays();
  void teacher_labels(double &e_ref, double *w_ref);
  void train_current(const MLTorch::GraphInput &in);
  void train_replay(Replay &r);
  void store_replay(const MLTorch::GraphInput &in, double e_ref, const double *w_ref,
                    double natoms);
  void take_step();
  void refresh_forces(const MLTorch::GraphInput &in);
  double learning_rate() const;
  void checksum_guard();
  void save_model(const std::string &path);
};

}    // namespace LAMMPS_NS

#endif
#endif
