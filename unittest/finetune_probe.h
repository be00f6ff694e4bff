/* -*- c++ -*- ----------------------------------------------------------
   ML-TORCH tests: the tests' view of fix torch/finetune's internals (a
   friend of the fix, as LAMMPS's own tests reach style internals), so that
   the fix's public API stays what LAMMPS calls.
------------------------------------------------------------------------- */

#ifndef MLTORCH_TEST_FINETUNE_PROBE_H
#define MLTORCH_TEST_FINETUNE_PROBE_H

#include "finetune_dataset.h"
#include "finetune_replicas.h"
#include "fix_torch_finetune.h"
#include "modify.h"

#include "mltorch/distributed.h"
#include "mltorch/finetune.h"
#include "mltorch/model.h"
#include "mltorch/replay.h"

#include <string>
#include <vector>

namespace LAMMPS_NS {

class FixTorchFinetuneProbe {
 public:
  explicit FixTorchFinetuneProbe(Fix *fix) : f(dynamic_cast<FixTorchFinetune *>(fix)) {}
  // fix torch/finetune `id` of a LAMMPS instance (or none)
  static FixTorchFinetuneProbe of(LAMMPS *lmp, const char *id = "ft")
  {
    return FixTorchFinetuneProbe(lmp->modify->get_fix_by_id(id));
  }
  FixTorchFinetuneProbe *operator->() { return this; }
  explicit operator bool() const { return f != nullptr; }

  // the replica-averaged loss gradient of the last update (trainable
  // parameters, model order), before clipping
  const std::vector<double> &last_gradient() const { return f->trainer->last_grad; }
  bigint updates() const { return f->trainer->count.nupdates; }
  bigint checksums_compared() const { return f->replicas->checksums_compared(); }
  MLTorch::Model *model() const { return f->model_.get(); }
  MLTorch::Model *member(int m) const { return f->members[m].get(); }
  int member_count() const { return static_cast<int>(f->members.size()); }
  // the teacher's labels of the last labelled configuration: forces on this
  // rank's atoms (tags and [n][3] forces), energy and virial of the world
  const std::vector<tagint> &label_tags() const { return f->lab_tags; }
  const std::vector<double> &label_forces() const { return f->lab_forces; }
  double label_energy() const { return f->lab_energy; }
  const double *label_virial() const { return f->lab_virial; }
  int replay_size() const { return f->trainer->replay.size(); }
  // the dataset configurations this replica took, in order
  std::vector<int64_t> dataset_taken() const
  {
    return f->dataset ? f->dataset->taken() : std::vector<int64_t>{};
  }
  // the last good state a rollback returns to (empty without one)
  std::string good_parameters() const { return f->trainer->state().good_parameters(); }
  double replay_bytes() const { return f->trainer->replay.bytes(); }
  double compute_vector(int i) const { return f->compute_vector(i); }
  // energy_shift fit: the configurations the MD model's fit has learnt (0 without)
  int64_t energy_shift_configurations() const
  {
    return f->trainer->energy_shift.empty() ? 0 : f->trainer->energy_shift[0].configurations();
  }
  // energy_shift fit: the MD model's fitted per-element shifts (empty without)
  std::vector<double> energy_shift() const
  {
    if (f->trainer->energy_shift.empty()) return {};
    return f->trainer->energy_shift[0].shifts();
  }
  // the largest restart record the fix writes (lowered to reach its error)
  static std::size_t &max_restart_bytes() { return FixTorchFinetune::max_restart_bytes; }

 private:
  FixTorchFinetune *f;
};

}    // namespace LAMMPS_NS

#endif
