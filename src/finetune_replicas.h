/* -*- c++ -*- ----------------------------------------------------------
   LAMMPS - Large-scale Atomic/Molecular Massively Parallel Simulator
   https://www.lammps.org/, Sandia National Laboratories
   LAMMPS development team: developers@lammps.org

   ML-TORCH package: TorchScript machine-learned potentials.
   Distributed under the GNU General Public License, version 2.
------------------------------------------------------------------------- */

#ifndef LMP_FINETUNE_REPLICAS_H
#define LMP_FINETUNE_REPLICAS_H

#include "pointers.h"

#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace MLTorch {
class AgreedExchange;
class Model;
class TrainingState;
class UpdatePolicy;
}    // namespace MLTorch

namespace LAMMPS_NS {

// a failure of a labelling or update step that every rank of the replica
// has agreed on (FinetuneReplicas::fail_if), carried to the point where
// the replicas decide together (FinetuneReplicas::agree)
struct StepFailure : public std::runtime_error {
  using std::runtime_error::runtime_error;
};

// What keeps the ranks of a replica and the replicas of a run (-partition)
// in step for fix torch/finetune, as DistributedDataParallel does: they
// agree at the start of every run on the model, the settings and the
// training state, take universe rank 0's state on the first, decide
// failures together (so that in library or Python mode, where an ERROR
// throws instead of aborting, no rank or replica is left waiting in a
// collective that a failing one skips), compare checksums of the
// parameters, and save the models from one rank.
class FinetuneReplicas : protected Pointers {
 public:
  explicit FinetuneReplicas(class LAMMPS *lmp) : Pointers(lmp) {}

  // the start of a run: refuse commands that stop one partition alone, then
  // compare `fingerprint` over the universe; with `broadcast`, every rank
  // takes universe rank 0's parameters, optimizer and rollback state
  void check_consistent(const std::string &fingerprint, bool broadcast,
                        MLTorch::TrainingState &training, MLTorch::UpdatePolicy &policy);
  // called by every rank of the replica at the same point with its own
  // failure (empty: none): when any failed, all throw StepFailure with the
  // lowest failing rank's message
  void fail_if(const std::string &mine);
  // run `work` on every rank of the replica; a failure (prefixed with what
  // and the step) as fail_if
  // `guard`: the exchange `work` runs its halo exchanges through
  void agreed_call(const char *what, const std::function<void()> &work,
                   const MLTorch::AgreedExchange *guard = nullptr);
  // called by every rank of every replica at the same point with what its
  // replica agreed (empty: no failure): one failing replica stops all
  void agree(const std::string &agreed);
  // every rank of every replica holds bitwise the same parameters
  void checksum_guard(MLTorch::TrainingState &training, bigint nupdates);
  bigint checksums_compared() const { return nchecks; }
  // the members as pair_style torch files (member_file names), written
  // atomically by universe rank 0 with their provenance
  void save(const std::string &path, const std::vector<std::shared_ptr<MLTorch::Model>> &members,
            const std::vector<std::string> &parents, const std::vector<std::string> &parent_hashes,
            const std::string &teacher, bigint nupdates, bool log);

 private:
  bigint nchecks = 0;
};

}    // namespace LAMMPS_NS

#endif
