/* -*- c++ -*- ----------------------------------------------------------
   ML-TORCH: machine-learned potentials for LAMMPS.
   Part of the MPI library of the core (mltorch_mpi: needs MPI, not LAMMPS,
   nor LibTorch): the collectives that keep the ranks of a replica, and the
   replicas of a run, in step. Every function is collective over its
   communicator: every rank calls it, at the same point.
------------------------------------------------------------------------- */

#ifndef MLTORCH_CORE_COLLECTIVES_H
#define MLTORCH_CORE_COLLECTIVES_H

#include <mpi.h>

#include <cstddef>
#include <string>
#include <vector>

namespace MLTorch {

// the message of the lowest rank of `comm` that is not ok, followed by
// " (on MPI rank R)" when `where` and R > 0, on every rank; empty when all
// are ok (one reduction, and two broadcasts on a failure)
std::string first_failure(MPI_Comm comm, bool ok, const std::string &message, bool where = true);

// the failure every rank of every replica stops with: `agreed` is what the
// ranks of this replica (`world`) agreed on (empty: none; the same on all
// of them); with several replicas (`universe` larger than `world`) the
// lowest failing replica's, marked " (in partition P)" with this replica's
// `partition` (0-based); empty when none failed. Collective over `universe`
// when it holds several replicas.
std::string replicas_failure(MPI_Comm world, MPI_Comm universe, int partition,
                             const std::string &agreed);

// the bytes of rank `root` on every rank of `comm`, in chunks below 2 GB
void broadcast_bytes(std::string &bytes, int root, MPI_Comm comm);

// compare a string across all ranks of `comm` (a fingerprint of what must be
// equal everywhere): the lowest rank whose string differs from rank 0's
// (then `first` and `other` hold both), or -1. Ranks compare a 64-bit hash
// with rank 0's (one broadcast and one reduction, whatever the rank count);
// the strings travel only on a mismatch.
int first_differing_rank(const std::string &mine, MPI_Comm comm, std::string &first,
                         std::string &other);

// the sum of `values` over `comm`, bitwise the same on every rank: reduced
// to rank 0 and broadcast, in buckets of `bucket` doubles (as
// DistributedDataParallel reduces its gradient buckets), so that no message
// passes 2 GB and a reduction of a large model does not need one huge buffer
std::vector<double> sum_everywhere(std::vector<double> &values, MPI_Comm comm,
                                   std::size_t bucket = std::size_t(1) << 20);

}    // namespace MLTorch

#endif
