/* -*- c++ -*- ----------------------------------------------------------
   ML-TORCH: machine-learned potentials for LAMMPS.
   Part of the LAMMPS-independent core: the shard of a dataset that one of
   R workers takes in an epoch, exactly as PyTorch's
   torch.utils.data.DistributedSampler takes it (shuffle=True): a
   permutation from torch.randperm with a generator seeded with seed +
   epoch, padded by repeating its start to a multiple of R (or cut to one,
   drop_last), and worker k takes the indices k, k + R, k + 2R, ... The
   shards depend on (n, R, seed, epoch) only.
------------------------------------------------------------------------- */

#ifndef MLTORCH_CORE_SAMPLER_H
#define MLTORCH_CORE_SAMPLER_H

#include <cstdint>
#include <vector>

namespace MLTorch {

// DistributedSampler(dataset of n, num_replicas, rank, shuffle, seed,
// drop_last) after set_epoch(epoch): its indices, in its order
std::vector<int64_t> distributed_shard(int64_t n, int num_replicas, int rank, uint64_t seed,
                                       int64_t epoch, bool shuffle = true, bool drop_last = false);

// the number of indices each worker takes per epoch (num_samples)
int64_t distributed_shard_size(int64_t n, int num_replicas, bool drop_last = false);

}    // namespace MLTorch

#endif
