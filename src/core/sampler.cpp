/* ----------------------------------------------------------------------
   ML-TORCH: machine-learned potentials for LAMMPS.
   DistributedSampler's shards (mltorch/sampler.h), with LibTorch's own
   randperm and CPU generator, so that the permutation is PyTorch's.
------------------------------------------------------------------------- */

#include "mltorch/sampler.h"

#include "mltorch/contract.h"    // ModelError

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

namespace MLTorch {

int64_t distributed_shard_size(int64_t n, int num_replicas, bool drop_last)
{
  if (num_replicas < 1) throw ModelError("a sampler needs at least one worker");
  if (drop_last && n % num_replicas != 0) return (n - num_replicas + num_replicas - 1) / num_replicas;
  return (n + num_replicas - 1) / num_replicas;
}

std::vector<int64_t> distributed_shard(int64_t n, int num_replicas, int rank, uint64_t seed,
                                       int64_t epoch, bool shuffle, bool drop_last)
{
  if (rank < 0 || rank >= num_replicas)
    throw ModelError("sampler rank " + std::to_string(rank) + " is not in [0, " +
                     std::to_string(num_replicas) + ")");
  if (n <= 0) return {};
  const int64_t num_samples = distributed_shard_size(n, num_replicas, drop_last);
  const int64_t total = num_samples * num_replicas;
  std::vector<int64_t> indices(static_cast<std::size_t>(n));
  if (shuffle) {
    // torch.Generator().manual_seed(seed + epoch); torch.randperm(n, generator=g)
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed + static_cast<uint64_t>(epoch));
    const auto perm = torch::randperm(n, gen, torch::TensorOptions().dtype(torch::kLong));
    const int64_t *p = perm.data_ptr<int64_t>();
    for (int64_t i = 0; i < n; ++i) indices[i] = p[i];
  } else {
    for (int64_t i = 0; i < n; ++i) indices[i] = i;
  }
  if (!drop_last) {
    // indices += indices[:padding] (repeated as often as it takes)
    for (int64_t k = 0; static_cast<int64_t>(indices.size()) < total; ++k)
      indices.push_back(indices[static_cast<std::size_t>(k % n)]);
  } else {
    indices.resize(static_cast<std::size_t>(total));
  }
  std::vector<int64_t> out;
  out.reserve(static_cast<std::size_t>(num_samples));
  for (int64_t i = rank; i < total; i += num_replicas) out.push_back(indices[static_cast<std::size_t>(i)]);
  return out;
}

}    // namespace MLTorch
