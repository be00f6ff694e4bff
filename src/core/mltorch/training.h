/* -*- c++ -*- ----------------------------------------------------------
   ML-TORCH: machine-learned potentials for LAMMPS.
   Part of the LAMMPS-independent core: the state fix torch/finetune trains
   (one model or a committee, an optimizer for each, the learning-rate
   schedule, the last good state for rollbacks), so that unit tests reach it
   without LAMMPS. The fix keeps what needs LAMMPS: arguments,
   communication, the teacher, outputs and restart records.
------------------------------------------------------------------------- */

#ifndef MLTORCH_CORE_TRAINING_H
#define MLTORCH_CORE_TRAINING_H

#include "mltorch/model.h"
#include "mltorch/optimizer.h"

#include <memory>
#include <string>
#include <vector>

namespace MLTorch {

// learning rate after `updates` optimizer steps
struct Schedule {
  std::string kind = "constant";    // constant, exp (a = gamma), step (a = K, b = gamma),
  double a = 0.0, b = 0.0;          // cosine (a = K, b = final lr)
  double lr(double base, long long updates) const;
};

class TrainingState {
 public:
  // every member gets its own optimizer; their trainable sets are fixed here
  TrainingState(std::vector<std::shared_ptr<Model>> members, const OptimizerSettings &settings);
  ~TrainingState();
  TrainingState(const TrainingState &) = delete;
  TrainingState &operator=(const TrainingState &) = delete;

  int size() const { return static_cast<int>(members.size()); }
  Model &member(int m) { return *members[m]; }
  // trainable scalars of all members: the length of the flat gradient
  long long gradient_size() const;
  // the members' parameter gradients (trainable only), concatenated in member order
  std::vector<double> gradient() const;
  void zero_grad();
  // one optimizer step of every member on its slice of `grad` (already
  // averaged), each clipped to max_norm (<= 0: no clipping) by its own
  // 2-norm; returns the norms before clipping
  std::vector<double> step(const std::vector<double> &grad, double lr, double max_norm);
  // the members' anchor terms (OptimizerSettings::anchor), summed
  double anchor_term() const;

  // rollback: remember the current state as good, or return to it
  void keep_good();
  bool has_good() const { return !good_params.empty(); }
  void restore_good();
  void forget_good() { good_params.clear(); good_optimizer.clear(); }

  // parameters and buffers, optimizer state, and the good copies of all
  // members, as byte strings (what restart files store and replicas
  // broadcast). One member: exactly that member's state_bytes() and
  // ModelOptimizer::state(), the format of single-model restart files.
  std::string parameters() const;
  void load_parameters(const std::string &bytes);
  std::string optimizer_state() const;
  void load_optimizer_state(const std::string &bytes);
  const std::string &good_parameters() const { return good_params; }
  const std::string &good_optimizer_state() const { return good_optimizer; }
  void load_good(const std::string &params, const std::string &optimizer);

 private:
  std::vector<std::shared_ptr<Model>> members;
  std::vector<std::unique_ptr<ModelOptimizer>> trainers;
  std::string good_params, good_optimizer;
};

// several byte strings in one (count and lengths first); one string is
// stored as itself
std::string pack_strings(const std::vector<std::string> &parts);
std::vector<std::string> unpack_strings(const std::string &bytes, int expected);

}    // namespace MLTorch

#endif
