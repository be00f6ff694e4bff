/* ----------------------------------------------------------------------
   ML-TORCH: machine-learned potentials for LAMMPS.
   The collectives of the core's MPI library (collectives.h).
------------------------------------------------------------------------- */

#include "mltorch/collectives.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>

namespace MLTorch {

std::string first_failure(MPI_Comm comm, bool ok, const std::string &message, bool where)
{
  int me = 0, nprocs = 1;
  MPI_Comm_rank(comm, &me);
  MPI_Comm_size(comm, &nprocs);
  int first_bad = ok ? nprocs : me;
  int bad_rank = nprocs;
  MPI_Allreduce(&first_bad, &bad_rank, 1, MPI_INT, MPI_MIN, comm);
  if (bad_rank == nprocs) return {};
  int len = (me == bad_rank) ? static_cast<int>(message.size()) : 0;
  MPI_Bcast(&len, 1, MPI_INT, bad_rank, comm);
  std::string text(len, ' ');
  if (me == bad_rank) text = message;
  if (len > 0) MPI_Bcast(&text[0], len, MPI_CHAR, bad_rank, comm);
  if (text.empty()) text = "(no message)";
  if (where && nprocs > 1 && bad_rank > 0) text += " (on MPI rank " + std::to_string(bad_rank) + ")";
  return text;
}

std::string replicas_failure(MPI_Comm world, MPI_Comm universe, int partition,
                             const std::string &agreed)
{
  int nworld = 1, nuniverse = 1;
  MPI_Comm_size(world, &nworld);
  MPI_Comm_size(universe, &nuniverse);
  // one replica: its ranks agreed already, no further collective needed
  if (nuniverse == nworld) return agreed;
  const std::string text =
      agreed.empty() ? agreed : agreed + " (in partition " + std::to_string(partition + 1) + ")";
  return first_failure(universe, text.empty(), text, false);
}

void broadcast_bytes(std::string &bytes, int root, MPI_Comm comm)
{
  static constexpr long long CHUNK = 1LL << 30;
  long long n = static_cast<long long>(bytes.size());
  MPI_Bcast(&n, 1, MPI_LONG_LONG, root, comm);
  bytes.resize(n);
  for (long long off = 0; off < n; off += CHUNK) {
    const int chunk = static_cast<int>(std::min(n - off, CHUNK));
    MPI_Bcast(&bytes[off], chunk, MPI_CHAR, root, comm);
  }
}

int first_differing_rank(const std::string &mine, MPI_Comm comm, std::string &first,
                         std::string &other)
{
  int me = 0;
  MPI_Comm_rank(comm, &me);
  long long hash = static_cast<long long>(std::hash<std::string>{}(mine)), hash0 = hash;
  MPI_Bcast(&hash0, 1, MPI_LONG_LONG, 0, comm);
  int mismatch = (hash != hash0) ? me : std::numeric_limits<int>::max();
  int r = mismatch;
  MPI_Allreduce(&mismatch, &r, 1, MPI_INT, MPI_MIN, comm);
  if (r == std::numeric_limits<int>::max()) return -1;
  first = mine;
  broadcast_bytes(first, 0, comm);
  other = mine;
  broadcast_bytes(other, r, comm);
  return r;
}

std::vector<double> sum_everywhere(std::vector<double> &values, MPI_Comm comm, std::size_t bucket)
{
  // MPI_Allreduce may sum in a different order on different ranks (and so
  // give sums that differ in the last bit); a reduction to one rank and a
  // broadcast of its result cannot
  std::vector<double> sum(values.size());
  bucket = std::max<std::size_t>(bucket, 1);
  for (std::size_t off = 0; off < values.size(); off += bucket) {
    const int n = static_cast<int>(std::min(bucket, values.size() - off));
    MPI_Reduce(values.data() + off, sum.data() + off, n, MPI_DOUBLE, MPI_SUM, 0, comm);
    MPI_Bcast(sum.data() + off, n, MPI_DOUBLE, 0, comm);
  }
  return sum;
}

}    // namespace MLTorch
