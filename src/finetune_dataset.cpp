/* ----------------------------------------------------------------------
   LAMMPS - Large-scale Atomic/Molecular Massively Parallel Simulator
   https://www.lammps.org/, Sandia National Laboratories
   LAMMPS development team: developers@lammps.org

   ML-TORCH package: TorchScript machine-learned potentials.
   Distributed under the GNU General Public License, version 2.
------------------------------------------------------------------------- */

/* ----------------------------------------------------------------------
   fix torch/finetune `dataset FILE M` (finetune_dataset.h)
------------------------------------------------------------------------- */

#include "finetune_dataset.h"

#include "comm.h"
#include "error.h"
#include "mltorch_units.h"
#include "universe.h"
#include "update.h"

#include "mltorch/collectives.h"
#include "mltorch/dataset.h"
#include "mltorch/distributed.h"
#include "mltorch/finetune.h"
#include "mltorch/model.h"
#include "mltorch/runtime.h"
#include "mltorch/sampler.h"

using namespace LAMMPS_NS;

std::vector<MLTorch::LabelledConfiguration> LAMMPS_NS::read_dataset(
    LAMMPS *lmp, const std::string &who, const std::string &file, const MLTorch::Model &model,
    const MLTorch::FinetuneSettings &set, double memory_mb, std::string *hash)
{
  Error *error = lmp->error;
  const std::string units = lmp->update->unit_style;
  double energy_unit = 1.0;    // eV in the run's energy unit
  if (units == "real")
    energy_unit = 1.0 / MLTorchUnits::kKcalMolEv;
  else if (units != "metal")
    error->all(FLERR, "{} reads eV and Angstrom and supports units metal and real, not '{}'", who,
               units);
  MPI_Comm uw = lmp->universe->uworld;
  std::string text, failure;
  if (lmp->universe->me == 0) {
    try {
      text = MLTorch::read_file(file);
    } catch (std::exception &e) {
      failure = e.what();
    }
  }
  failure = MLTorch::first_failure(uw, failure.empty(), failure, false);
  if (!failure.empty()) error->all(FLERR, "{}: cannot read {}: {}", who, file, failure);
  MLTorch::broadcast_bytes(text, 0, uw);
  if (hash) *hash = MLTorch::content_hash(text);
  try {
    const auto frames = MLTorch::parse_extxyz(text, file);
    if (frames.empty()) throw MLTorch::LabelsError(file + " holds no frame");
    MLTorch::DatasetNeeds needs;
    needs.energy = set.w_energy > 0;
    needs.forces = set.w_force > 0;
    needs.stress = set.w_stress > 0;
    const auto &meta = model.metadata();
    return MLTorch::make_configurations(frames, file, meta.elements, meta.cutoff, energy_unit, needs,
                                        memory_mb * 1e6);
  } catch (std::exception &e) {
    // every rank parsed the same text: every rank stops with the same message
    error->all(FLERR, "{}: {}", who, e.what());
  }
}

FinetuneDataset::FinetuneDataset(LAMMPS *lmp, const std::string &file, int per_update_in,
                                 double weight, uint64_t seed_in, double memory_mb,
                                 const MLTorch::Model &model, const MLTorch::FinetuneSettings &set) :
    Pointers(lmp), weighted(std::make_unique<MLTorch::FinetuneSettings>(set)),
    per_update(per_update_in), seed(seed_in)
{
  weighted->w_energy *= weight;
  weighted->w_force *= weight;
  weighted->w_stress *= weight;
  configs = read_dataset(lmp, "Fix torch/finetune dataset", file, model, set, memory_mb);
  refill();
  if (comm->me == 0)
    utils::logmesg(lmp, "fix torch/finetune: dataset: {} configurations from {}, {} per update and "
                        "replica (weight {}), sharded over {} replica(s) as DistributedSampler "
                        "shards them ({} per replica and epoch, seed {})\n",
                   configs.size(), file, per_update, weight, universe->nworlds, shard.size(), seed);
}

FinetuneDataset::~FinetuneDataset() = default;

int64_t FinetuneDataset::size() const
{
  return static_cast<int64_t>(configs.size());
}

void FinetuneDataset::refill()
{
  shard = MLTorch::distributed_shard(size(), universe->nworlds, universe->iworld, seed, epoch);
}

void FinetuneDataset::position(int64_t &e, int64_t &n) const
{
  e = epoch;
  n = next;
}

void FinetuneDataset::resume(int64_t e, int64_t n)
{
  epoch = e;
  next = n;
  refill();
  if (next < 0 || next > static_cast<int64_t>(shard.size()))
    error->all(FLERR, "Fix torch/finetune dataset: the restart file's position {} in epoch {} is "
                      "not in this replica's shard of {} configurations: is it the same dataset "
                      "and replica count?", next, epoch, shard.size());
}

std::string FinetuneDataset::add_gradients(const std::vector<std::shared_ptr<MLTorch::Model>> &members,
                                           std::vector<MLTorch::EnergyShift> *shifts,
                                           const std::string &prefix, int &count)
{
  // this update's M configurations of the replica's shard, in order
  std::vector<int64_t> items;
  for (int j = 0; j < per_update; ++j) {
    if (next >= static_cast<int64_t>(shard.size())) {
      ++epoch;
      next = 0;
      refill();
    }
    items.push_back(shard[next++]);
  }
  taken_.insert(taken_.end(), items.begin(), items.end());
  count = per_update;
  // item j on rank j % nprocs of the replica; every member learns them
  std::string failure;
  const int nm = static_cast<int>(members.size());
  std::vector<double> residual(static_cast<std::size_t>(nm) * items.size(), 0.0);
  for (std::size_t j = 0; j < items.size() && failure.empty(); ++j) {
    if (static_cast<int>(j % comm->nprocs) != comm->me) continue;
    const auto &c = configs[items[j]];
    for (int m = 0; m < nm && failure.empty(); ++m) {
      const double shift = shifts && !shifts->empty() ? (*shifts)[m].shift_of(c.counts) : 0.0;
      MLTorch::ConfigurationGradient g;
      failure = MLTorch::whole_configuration_gradient(*members[m], c, c.e_ref - shift, *weighted,
                                                      prefix, g);
      if (!failure.empty()) failure += " (dataset, " + c.where + ")";
      residual[m * items.size() + j] = c.e_ref - g.e_part;
    }
  }
  failure = MLTorch::first_failure(world, failure.empty(), failure);
  if (!failure.empty()) return failure;
  // the energy reference learns the dataset's energies, alike on every rank
  if (shifts && !shifts->empty()) {
    residual = MLTorch::sum_everywhere(residual, world);
    for (int m = 0; m < nm; ++m)
      for (std::size_t j = 0; j < items.size(); ++j)
        (*shifts)[m].add(configs[items[j]].counts, residual[m * items.size() + j]);
  }
  return {};
}
