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
#include <functional>
#include <string>
#include <vector>

namespace MLTorch {
struct GraphInput;
struct GraphOutput;
class Model;
class TrainingState;
struct OptimizerSettings;
struct Schedule;
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

  // per-atom |F - F_ref| of the last labelled configuration, following the atoms
  void grow_arrays(int) override;
  void copy_arrays(int, int, int) override;
  int pack_exchange(int, double *) override;
  int unpack_exchange(int, double *) override;

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
  MLTorch::Model *member(int m);
  int member_count() const { return static_cast<int>(members.size()); }
  // the teacher's labels of the last labelled configuration: forces on this
  // rank's atoms (tags and [n][3] forces), energy and virial of the world
  const std::vector<tagint> &label_tags() const { return lab_tags; }
  const std::vector<double> &label_forces() const { return lab_forces; }
  double label_energy() const { return lab_energy; }
  const double *label_virial() const { return lab_virial; }
  int replay_size() const { return static_cast<int>(replay.size()); }
  double replay_bytes() const;

 protected:
  // --- settings ---
  std::string teacher_style, teacher_coeff;
  double w_energy, w_force, w_stress;
  std::unique_ptr<MLTorch::OptimizerSettings> opt;
  std::unique_ptr<MLTorch::Schedule> schedule;    // learning rate after u updates
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
  // the trained models (the pair style's committee, or its one model), an
  // optimizer each, the rollback copies: the LAMMPS-independent core
  std::unique_ptr<MLTorch::TrainingState> training;
  std::vector<std::shared_ptr<MLTorch::Model>> members;
  std::vector<std::string> member_hashes;
  class Pair *teacher;
  // in a pair_style hybrid run: the sub-styles other than the model, whose
  // share the fix removes from the teacher's labels of the whole system
  std::vector<class Pair *> others;
  bool synced;
  int pending;    // configurations accumulated since the last update
  bigint nupdates, nskipped, nrollbacks, nchecks, nconfigs;
  double loss_ema;
  // uncertainty gating: label only configurations whose committee force
  // deviation (max over atoms) lies in [gate_low, gate_high)
  bool gated = false;
  double gate_low = 0.0, gate_high = 0.0;
  bigint ncalls = 0, nknown = 0, nabove = 0, nempty = 0;    // this replica's checks; empty updates
  double last_devi = 0.0;

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
  double *resid_atom;    // per atom |F - F_ref| of the last labelled configuration (member 1)
  std::vector<tagint> lab_tags;
  std::vector<double> lab_forces;
  double lab_energy = 0.0, lab_virial[6] = {0, 0, 0, 0, 0, 0};
  double **fmd;      // the MD model's forces before an update (when not in fpart)
  double **reverse_target;    // the array reverse comm sums into
  std::vector<double> node_buf, weight_buf;    // per-node forces and weights, reused

  // --- replay buffer: this rank's share of past labelled configurations ---
  struct Replay;
  std::vector<std::unique_ptr<Replay>> replay;
  std::unique_ptr<Replay> spare_replay;    // the last evicted piece, refilled by the next store
  int stored_this_round;    // fresh configurations stored since the last update
  bool replay_warned;
  double acc_ngrad;         // configurations (fresh + replayed) in the pending gradient

  void parse_teacher();
  void setup_trainable();
  void check_replicas_consistent(bool broadcast);
  void grow_work();
  void teacher_labels(double &e_ref, double *w_ref);
  void train_current(const MLTorch::GraphInput &in);
  // collective decisions on failures inside a step (see the .cpp)
  void fail_if(const std::string &mine);
  void agreed_call(const char *what, const std::function<void()> &work);
  void replicas_agree(const std::string &agreed);
  bool gate_says_label();
  void train_replay(Replay &r);
  void train_replay(Replay &r, MLTorch::Model &model);
  void store_replay(const MLTorch::GraphInput &in, double e_ref, const double *w_ref,
                    double natoms);
  void take_step();
  void clear_round();
  void refresh_forces(const MLTorch::GraphInput &in, double **before);
  void md_forces(const MLTorch::GraphInput &in, double **dst, const MLTorch::GraphOutput *given);
  double learning_rate() const;
  void checksum_guard();
  void save_model(const std::string &path);
  static std::string member_file(const std::string &path, int m);
};

}    // namespace LAMMPS_NS

#endif
#endif
