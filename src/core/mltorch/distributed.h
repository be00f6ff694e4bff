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

#include <mpi.h>

#include <functional>
#include <string>
#include <vector>

namespace MLTorch {

class Model;
class TrainingState;
struct ReplayPiece;

// run `work` on every rank of `comm`; the failure of the lowest failing rank
// (its exception's text after `prefix`) on every rank, or empty: ranks then
// take the same branch, and none is left waiting in a collective that a
// failing one skips
std::string agreed_failure(MPI_Comm comm, const std::string &prefix,
                           const std::function<void()> &work);

// the loss gradient of a stored configuration (this rank's piece of it) with
// `model`, added to the model's parameter gradients, with `exchange` (the
// piece's own) between a layered model's stages when `layered`. Returns the
// agreed failure of the replica's ranks (empty on success).
std::string replay_gradient(ReplayPiece &piece, Model &model, const FinetuneSettings &set,
                            bool layered, MPI_Comm world);

// what an update did
struct UpdateOutcome {
  UpdateAction action = UpdateAction::Step;
  RoundStats all;          // the round's statistics of all replicas
  double gnorm = 0.0;      // gradient norm of member 0 before clipping (steps only)
  double lr = 0.0;
  bool finite = true;
  double t_reduce = 0.0;   // seconds in the reduction
  std::string failure;     // the optimizer step failed (every rank of every replica)
};

// the update after a round: the members' gradients (in `training`) and this
// replica's statistics `mine` (counted once per replica: by `replica_root`)
// summed over `universe`, averaged over all configurations into `grad`; the
// policy's decision; then the optimizer step, rollback or skip. The
// gradients are zeroed. Bitwise the same on every rank of every replica.
UpdateOutcome update(TrainingState &training, UpdatePolicy &policy, FinetuneCounters &count,
                     const FinetuneSettings &set, const RoundStats &mine, bool replica_root,
                     MPI_Comm universe, std::vector<double> &grad);

}    // namespace MLTorch

#endif
