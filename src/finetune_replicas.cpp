/* ----------------------------------------------------------------------
   LAMMPS - Large-scale Atomic/Molecular Massively Parallel Simulator
   https://www.lammps.org/, Sandia National Laboratories
   LAMMPS development team: developers@lammps.org

   ML-TORCH package: TorchScript machine-learned potentials.
   Distributed under the GNU General Public License, version 2.
------------------------------------------------------------------------- */

#include "finetune_replicas.h"

#include "comm.h"
#include "error.h"
#include "fix.h"
#include "mltorch_mpi.h"
#include "modify.h"
#include "timer.h"
#include "universe.h"
#include "update.h"

#include "mltorch/collectives.h"
#include "mltorch/distributed.h"
#include "mltorch/finetune.h"
#include "mltorch/model.h"
#include "mltorch/runtime.h"
#include "mltorch/training.h"

#include <exception>

using namespace LAMMPS_NS;

/* ---------------------------------------------------------------------- */

void FinetuneReplicas::check_consistent(const std::string &fingerprint, bool broadcast,
                                        MLTorch::TrainingState &training,
                                        MLTorch::UpdatePolicy &policy)
{
  // a command that stops one partition by itself (its own clock, its own
  // condition) would leave the other replicas waiting in the next gradient
  // reduction: refused with replicas, decided over the universe because one
  // partition alone may hold it
  if (universe->nworlds > 1) {
    std::string stopper;
    if (timer->has_timeout()) stopper = "timer timeout";
    for (int i = 0; i < modify->nfix; ++i)
      if (utils::strmatch(modify->fix[i]->style, "^halt"))
        stopper = fmt::format("fix {} ({})", modify->fix[i]->id, modify->fix[i]->style);
    int mine = stopper.empty() ? 0 : 1, any = 0;
    MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, universe->uworld);
    if (any)
      error->all(FLERR,
                 "Fix torch/finetune with {} partitions: {} stops one partition on its own, so "
                 "the replicas would leave the run at different steps and the others would wait "
                 "forever in the next gradient reduction; with replicas, stop all of them at one "
                 "step (a run length that every partition computes alike, e.g. from a file that "
                 "partition 0 writes one chunk ahead: examples/slurm/in.finetune)",
                 universe->nworlds,
                 stopper.empty() ? "'timer timeout' or fix halt in another partition" : stopper);
  }
  std::string first, other;
  const int r = MLTorch::first_differing_rank(fingerprint, universe->uworld, first, other);
  if (r >= 0)
    error->all(FLERR,
               "Fix torch/finetune: replicas disagree on the model, the training settings or "
               "the training state ('{}' on universe rank 0, '{}' on universe rank {}); every "
               "partition must load the same model file, use the same fix settings and run "
               "the same steps",
               utils::trim(first), utils::trim(other), r);
  if (!broadcast) return;

  // parameters, buffers and optimizer/rollback state of universe rank 0
  // (DDP's initial broadcast)
  std::string state = training.parameters(), optim = training.optimizer_state();
  std::string good = training.good_parameters(), good_opt = training.good_optimizer_state();
  for (std::string *bytes : {&state, &optim, &good, &good_opt})
    MLTorch::broadcast_bytes(*bytes, 0, universe->uworld);
  double ema = policy.loss_average();
  MPI_Bcast(&ema, 1, MPI_DOUBLE, 0, universe->uworld);
  policy.set_loss_average(ema);
  std::string failure;
  try {
    training.load_parameters(state);
    training.load_optimizer_state(optim);
    training.load_good(good, good_opt);
  } catch (std::exception &e) {
    failure = fmt::format("Fix torch/finetune: cannot take the parameters of universe rank 0: {}",
                          e.what());
  }
  MLTorchLmp::stop_collectively(error, universe->uworld, failure.empty(), failure);
}

/* ---------------------------------------------------------------------- */

void FinetuneReplicas::fail_if(const std::string &mine)
{
  const std::string text = MLTorch::first_failure(world, mine.empty(), mine);
  if (!text.empty()) throw StepFailure(text);
}

void FinetuneReplicas::agreed_call(const char *what, const std::function<void()> &work,
                                   const MLTorch::AgreedExchange *guard)
{
  const std::string text = MLTorch::agreed_failure(
      world, fmt::format("Fix torch/finetune{} on step {}: ", what, update->ntimestep), work, guard);
  if (!text.empty()) throw StepFailure(text);
}

void FinetuneReplicas::agree(const std::string &agreed)
{
  const std::string text = MLTorch::replicas_failure(world, universe->uworld, universe->iworld, agreed);
  if (!text.empty()) error->all(FLERR, text);
}

/* ---------------------------------------------------------------------- */

void FinetuneReplicas::checksum_guard(MLTorch::TrainingState &training, bigint nupdates)
{
  std::string first, other;
  const int r = MLTorch::first_differing_rank(MLTorch::content_hash(training.parameters()),
                                              universe->uworld, first, other);
  ++nchecks;
  // the same gathered data on every rank: all of them stop here together
  if (r >= 0)
    error->all(FLERR,
               "Fix torch/finetune: model parameters differ between ranks/replicas after "
               "update {} (checksum {} on universe rank 0, {} on universe rank {}); "
               "replicas must run the same number of steps with the same fix settings",
               nupdates, first, other, r);
}

/* ---------------------------------------------------------------------- */

void FinetuneReplicas::save(const std::string &path,
                            const std::vector<std::shared_ptr<MLTorch::Model>> &members,
                            const std::vector<std::string> &parents,
                            const std::vector<std::string> &parent_hashes,
                            const std::string &teacher, bigint nupdates, bool log)
{
  std::string message;
  const int nm = static_cast<int>(members.size());
  if (universe->me == 0) {
    for (int m = 0; message.empty() && m < nm; ++m) {
      try {
        const std::string prov = MLTorch::provenance_json(parents[m], parent_hashes[m], nupdates,
                                                          update->ntimestep, teacher);
        MLTorch::write_file_atomic(MLTorch::member_file(path, m), members[m]->file_bytes(prov));
      } catch (std::exception &e) {
        message = fmt::format("Fix torch/finetune: cannot save the model: {}", e.what());
      }
    }
  }
  // replicas wait for each other in reductions: an error on one of them
  // alone would leave the others hanging
  MLTorchLmp::stop_collectively(error, universe->uworld, message.empty(), message);
  // the replicas hold the same model: the first partition's file is theirs
  if (log && universe->me == 0)    // rank 0 of partition 1
    utils::logmesg(lmp, "fix torch/finetune: saved {} after {} updates to {}{}\n",
                   nm > 1 ? "the committee" : "model", nupdates, path,
                   nm > 1 ? " ... " + MLTorch::member_file(path, nm - 1) : "");
  else if (comm->me == 0 && log)
    utils::logmesg(lmp, "fix torch/finetune: {} after {} updates saved by partition 1 (the "
                        "replicas' models are identical), not by this replica\n",
                   nm > 1 ? "the committee" : "model", nupdates);
}
