/* -*- c++ -*- ----------------------------------------------------------
   ML-TORCH package: small MPI and text helpers shared by the styles
   (pair_style torch, fix torch/finetune). Include from .cpp files only.
   Distributed under the GNU General Public License, version 2.
------------------------------------------------------------------------- */

#ifndef LMP_MLTORCH_MPI_H
#define LMP_MLTORCH_MPI_H

#include "error.h"
#include "lmptype.h"

#include <mpi.h>

#include <functional>
#include <limits>
#include <string>
#include <vector>

namespace LAMMPS_NS {
namespace MLTorchMPI {

  // space-separated list for messages (utils::join is not in every supported LAMMPS)
  template <typename T> std::string join_words(const std::vector<T> &items)
  {
    std::string out;
    for (const auto &item : items) out += (out.empty() ? "" : " ") + fmt::format("{}", item);
    return out;
  }

  // the message of the lowest rank of `comm` that is not ok, followed by
  // " (on MPI rank R)" when `where` and R > 0, on every rank; empty when
  // all are ok (one reduction, and two broadcasts on a failure)
  inline std::string first_failure(MPI_Comm comm, bool ok, const std::string &message,
                                   bool where = true)
  {
    int me = 0, nprocs = 1;
    MPI_Comm_rank(comm, &me);
    MPI_Comm_size(comm, &nprocs);
    int first_bad = ok ? nprocs : me;
    int bad_rank;
    MPI_Allreduce(&first_bad, &bad_rank, 1, MPI_INT, MPI_MIN, comm);
    if (bad_rank == nprocs) return {};
    int len = (me == bad_rank) ? static_cast<int>(message.size()) : 0;
    MPI_Bcast(&len, 1, MPI_INT, bad_rank, comm);
    std::string text(len, ' ');
    if (me == bad_rank) text = message;
    MPI_Bcast(&text[0], len, MPI_CHAR, bad_rank, comm);
    if (text.empty()) text = "(no message)";
    if (where && nprocs > 1 && bad_rank > 0) text += fmt::format(" (on MPI rank {})", bad_rank);
    return text;
  }

  // stop every rank of `comm` with the message of the lowest rank that is
  // not ok (a failure only some ranks can see would otherwise leave the
  // others waiting); returns when all are ok
  inline void stop_collectively(Error *error, MPI_Comm comm, bool ok, const std::string &message,
                                bool where = true)
  {
    const std::string text = first_failure(comm, ok, message, where);
    if (!text.empty()) error->all(FLERR, text);
  }

  // the bytes of rank `root` on every rank of `comm`, in chunks below 2 GB
  inline void broadcast_bytes(std::string &bytes, int root, MPI_Comm comm)
  {
    static constexpr bigint CHUNK = 1 << 30;
    bigint n = static_cast<bigint>(bytes.size());
    MPI_Bcast(&n, 1, MPI_LMP_BIGINT, root, comm);
    bytes.resize(n);
    for (bigint off = 0; off < n; off += CHUNK) {
      const int chunk = static_cast<int>(n - off < CHUNK ? n - off : CHUNK);
      MPI_Bcast(&bytes[off], chunk, MPI_CHAR, root, comm);
    }
  }

  // compare a string across all ranks of `comm`: the lowest rank whose
  // string differs from rank 0's (then `first` and `other` hold both), or -1.
  // Ranks compare a 64-bit hash with rank 0's (one broadcast and one
  // reduction, whatever the rank count); the strings travel only on a mismatch.
  inline int first_differing_rank(const std::string &mine, MPI_Comm comm, std::string &first,
                                  std::string &other)
  {
    int me = 0;
    MPI_Comm_rank(comm, &me);
    long long hash = static_cast<long long>(std::hash<std::string>{}(mine)), hash0 = hash;
    MPI_Bcast(&hash0, 1, MPI_LONG_LONG, 0, comm);
    const int mismatch = (hash != hash0) ? me : std::numeric_limits<int>::max();
    int r = mismatch;
    MPI_Allreduce(&mismatch, &r, 1, MPI_INT, MPI_MIN, comm);
    if (r == std::numeric_limits<int>::max()) return -1;
    first = mine;
    broadcast_bytes(first, 0, comm);
    other = mine;
    broadcast_bytes(other, r, comm);
    return r;
  }

}    // namespace MLTorchMPI
}    // namespace LAMMPS_NS

#endif
