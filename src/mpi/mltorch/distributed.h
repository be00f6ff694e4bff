/* -*- c++ -*- ----------------------------------------------------------
   ML-TORCH: machine-learned potentials for LAMMPS.
   Part of the MPI library of the core (mltorch_mpi: MPI and the model, no
   LAMMPS): the steps of distributed training that fix torch/finetune runs
   and that need nothing of LAMMPS. The loss gradient of a stored (replayed)
   configuration spread over the ranks of a replica, and the update: the
   gradients and round statistics of every rank of every replica summed in
   buckets (as DistributedDataParallel does), averaged over the
   configurations, the update policy's decision and the optimizer step.
   Every function is collective over the communicators it is given.
------------------------------------------------------------------------- */

#ifndef MLTORCH_CORE_DISTRIBUTED_H
#define MLTORCH_CORE_DISTRIBUTED_H

#include "mltorch/finetune.h"
#include "mltorch/halo.h"
#include "mltorch/replay.h"
#include "mltorch/restart_record.h"

#include <mpi.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace MLTorch {

class Model;
class TrainingState;

// The halo exchange of a training pass, made safe against a failure on
// one rank between two exchanges (e.g. out of memory in the double backward
// on the busiest rank): before every exchange the ranks agree that none has
// failed, with the very collective agreed_failure() ends with, so a rank
// that failed and left its pass meets the others at their next exchange,
// and all of them leave with the same message (the exchange throws it).
class AgreedExchange : public HaloExchange {
 public:
  AgreedExchange(HaloExchange *inner, MPI_Comm comm) : inner_(inner), comm_(comm) {}
  void forward(const double *owned, double *all, int width) override;
  void reverse(const double *all, double *owned, int width) override;
  // the exchange learnt of a failure (every rank then holds message())
  bool tripped() const { return tripped_; }
  const std::string &message() const { return message_; }

 private:
  HaloExchange *inner_;
  MPI_Comm comm_;
  bool tripped_ = false;
  std::string message_;
  void agree();
};

// run `work` on every rank of `comm`; the failure of the lowest failing rank
// (its exception's text after `prefix`) on every rank, or empty: ranks then
// take the same branch, and none is left waiting in a collective that a
// failing one skips. `guard`: the AgreedExchange `work` runs its exchanges
// through (a failure it learnt of is already agreed)
std::string agreed_failure(MPI_Comm comm, const std::string &prefix,
                           const std::function<void()> &work,
                           const AgreedExchange *guard = nullptr);

// the loss gradient of a stored configuration (this rank's piece of it) with
// `model`, added to the model's parameter gradients, with `exchange` (the
// piece's own) between a layered model's stages when `layered`. Returns the
// agreed failure of the replica's ranks (empty on success).
std::string replay_gradient(ReplayPiece &piece, Model &model, const FinetuneSettings &set,
                            bool layered, MPI_Comm world);

// the loss of a labelled configuration spread over the ranks of a replica,
// from this rank's shares: its energy, the teacher's energy, its virial (6),
// the teacher's virial (6), its covered atoms and its squared force
// residual. The sums over `world` and the loss with its coefficients.
struct ConfigurationLoss {
  LossTerms terms;
  double e = 0.0, e_ref = 0.0, w[6] = {0}, w_ref[6] = {0}, natoms = 0.0, se_f = 0.0;
};
ConfigurationLoss configuration_loss(double e, double e_ref, const double *w, const double *w_ref,
                                     double natoms, double se_f, const FinetuneSettings &set,
                                     MPI_Comm world);

// The distributed loss gradient of one labelled configuration
// (doc/fix_torch_finetune.rst, "the exact distributed gradient"), the one
// place it is written: fix torch/finetune calls it for a fresh
// configuration, the replay for a stored one. On every rank of `world`,
// each with its graph `in` (nodes [0, n_local) the atoms it owns, a layered
// model's feature exchange in in.halo):
//   1. the training pass: this graph's energy, virial and partial forces
//      on every node, differentiable in the parameters;
//   2. partial forces summed to the owners by `owners` (reverse: every
//      node's row to its atom's owner), the squared force residual;
//   3. the configuration's loss from every rank's shares (configuration_loss);
//   4. residual weights on the owned nodes, copied to every node of the same
//      atom by `owners` (forward), and the weighted backward pass, which
//      adds this rank's share of the loss gradient to the parameters'
//      gradients (the sum over ranks is the whole gradient).
// Model passes agree on failure (AgreedExchange, agreed_failure): the
// lowest failing rank's message after `prefix` on every rank, or empty.
struct LabelShares {
  const double *fref = nullptr;           // [n_local][3] teacher forces on the owned nodes
  const double *w_ref = nullptr;          // this rank's share of the teacher's virial (6)
  double natoms = 0.0;                    // this rank's share of the atoms the model covers
  // this rank's share of the teacher's energy, given this rank's model
  // energy (collective: an energy reference fitted on the fly sums them)
  std::function<double(double e_part)> e_ref;
};
struct ConfigurationGradient {
  double e_part = 0.0, w_part[6] = {0, 0, 0, 0, 0, 0};    // this rank's shares
  std::vector<double> forces;    // [n_local][3] the model's forces on the owned nodes
  ConfigurationLoss loss;
};
std::string configuration_gradient(Model &model, const GraphInput &in, HaloExchange &owners,
                                   const LabelShares &labels, const FinetuneSettings &set,
                                   MPI_Comm world, const std::string &prefix,
                                   ConfigurationGradient &out);

// the loss gradient of a labelled configuration that this rank holds whole
// (MLTorch::LabelledConfiguration: its folded periodic graph, every node
// owned), with `e_label` its energy label: configuration_gradient on one
// rank. fix torch/finetune's dataset and the torch/train command use it.
struct LabelledConfiguration;
std::string whole_configuration_gradient(Model &model, const LabelledConfiguration &c,
                                         double e_label, const FinetuneSettings &set,
                                         const std::string &prefix, ConfigurationGradient &out);

// The training state of fix torch/finetune and its update: the members and
// their optimizers, the counters, the round's statistics, the replay buffer
// and the update policy, with the update that every rank of every replica
// runs together after a round.
class DistributedTrainer {
 public:
  static constexpr int NSTATS = 11;    // the fix's output vector of the last update
  // `partition`: this replica's index among the replicas of `universe`
  DistributedTrainer(const FinetuneSettings &set, std::vector<std::shared_ptr<Model>> members,
                     MPI_Comm world, MPI_Comm universe, int partition);
  ~DistributedTrainer();
  DistributedTrainer(const DistributedTrainer &) = delete;
  DistributedTrainer &operator=(const DistributedTrainer &) = delete;

  TrainingState &state() { return *training; }
  FinetuneCounters count;
  RoundStats round;       // this replica's, since the last update
  ReplayBuffer replay;    // this rank's pieces
  UpdatePolicy policy;
  std::vector<double> last_grad;    // the replica-averaged gradient of the last update
  double stats[NSTATS] = {0};       // loss, E/F/W RMSE, |grad|, lr, counts, configs, replay size
  double time_reduce = 0.0;         // seconds of this rank in the gradient reduction
  // energy_shift fit: each member's fitted energy reference (this replica's
  // labels; empty without the keyword)
  std::vector<EnergyShift> energy_shift;

  struct Outcome {
    bool empty = false;    // no replica labelled anything: no update
    UpdateAction action = UpdateAction::Step;
    RoundStats all;        // the round of all replicas
    double gnorm = 0.0, lr = 0.0;
    bool finite = true;
    // a failure every rank of every replica stops with (replay or step)
    std::string failure;
  };
  // the update after a round: with uncertainty gating, none where no replica
  // labelled a configuration; else the replayed configurations' gradients
  // (picked alike on every rank), the gradients and statistics summed over
  // the universe (the round counted once per replica, by `replica_root`)
  // and averaged over all configurations, the policy's decision and the
  // optimizer step, rollback or skip. `layered`: replays run a layered
  // model with the exchange. Failures carry `prefix`. Ends the round.
  Outcome update(bool replica_root, bool layered, const std::string &prefix);
  void end_round();
  // uncertainty gating: label a configuration whose committee deviation
  // lies in the window (counts the others)
  bool gate(double deviation);
  // what replicas must share before a run: the models (their file hashes,
  // the trainable set), the settings, the counters, `pending` configurations
  // and the `phase` of the labelling interval
  std::string fingerprint(const std::vector<std::string> &hashes, int pending, long long phase) const;
  // the record restart files keep, and back (throws on a state that does
  // not fit the members)
  TrainingRecord record(const std::string &model_hash, const std::vector<std::string> &hashes) const;
  void restore(const TrainingRecord &r);
  double bytes() const;

 private:
  const FinetuneSettings &set;
  std::vector<std::shared_ptr<Model>> members;
  std::unique_ptr<TrainingState> training;
  MPI_Comm world, universe;
  int partition;
};

}    // namespace MLTorch

#endif
