/* -*- c++ -*- ----------------------------------------------------------
   LAMMPS - Large-scale Atomic/Molecular Massively Parallel Simulator
   https://www.lammps.org/, Sandia National Laboratories
   LAMMPS development team: developers@lammps.org

   ML-TORCH package: TorchScript machine-learned potentials.
   Distributed under the GNU General Public License, version 2.
------------------------------------------------------------------------- */

#ifndef LMP_FINETUNE_DATASET_H
#define LMP_FINETUNE_DATASET_H

#include "pointers.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace MLTorch {
class EnergyShift;
class Model;
struct FinetuneSettings;
struct LabelledConfiguration;
}    // namespace MLTorch

namespace LAMMPS_NS {

// fix torch/finetune's `dataset FILE M`: the user's labelled configurations
// (extended XYZ) mixed into every update beside the fresh labels, M per
// update and replica. The replicas share the dataset as DDP workers share
// one through PyTorch's DistributedSampler: each epoch replica k takes its
// shard (MLTorch::distributed_shard with R = the replicas, seed
// `dataset_seed`), M configurations per update, and the next epoch begins
// when its shard is used up. The shards depend on the replicas only, not
// on their ranks; a replica spreads its M configurations over its ranks,
// each held whole by one rank (its folded periodic graph).
// the labelled configurations of an extended XYZ file for `model`, as
// fix torch/finetune's dataset and torch/train read them: the universe's
// first rank reads the file, every rank parses the same text and keeps
// every configuration (energies in the run's units; the labels `set`'s
// weights need must be there; graphs within `memory_mb` per rank). An
// ERROR beginning with `who` otherwise, the same on every rank. `hash`:
// the file's content hash
std::vector<MLTorch::LabelledConfiguration> read_dataset(class LAMMPS *lmp, const std::string &who,
                                                         const std::string &file,
                                                         const MLTorch::Model &model,
                                                         const MLTorch::FinetuneSettings &set,
                                                         double memory_mb, std::string *hash = nullptr);

class FinetuneDataset : protected Pointers {
 public:
  FinetuneDataset(class LAMMPS *, const std::string &file, int per_update, double weight,
                  uint64_t seed, double memory_mb, const MLTorch::Model &model,
                  const MLTorch::FinetuneSettings &set);
  ~FinetuneDataset() override;
  FinetuneDataset(const FinetuneDataset &) = delete;
  FinetuneDataset &operator=(const FinetuneDataset &) = delete;

  // this update's configurations of the replica: their loss gradients
  // added to every member's parameter gradients on the rank that holds
  // each, and (energy_shift fit) their energies to each member's fit, on
  // every rank alike. Collective over the replica; returns its agreed
  // failure (empty: none) and the configurations' count
  std::string add_gradients(const std::vector<std::shared_ptr<MLTorch::Model>> &members,
                            std::vector<MLTorch::EnergyShift> *shifts, const std::string &prefix,
                            int &count);
  // where the sampler stands (restart files keep it), and back
  void position(int64_t &epoch, int64_t &next) const;
  void resume(int64_t epoch, int64_t next);
  int64_t size() const;
  // every configuration index this replica took, in order (tests)
  const std::vector<int64_t> &taken() const { return taken_; }

 private:
  std::vector<MLTorch::LabelledConfiguration> configs;
  std::unique_ptr<MLTorch::FinetuneSettings> weighted;    // the loss weights times `weight`
  int per_update;
  uint64_t seed;
  int64_t epoch = 0, next = 0;
  std::vector<int64_t> shard, taken_;
  void refill();
};

}    // namespace LAMMPS_NS

#endif
