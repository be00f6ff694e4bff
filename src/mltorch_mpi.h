/* -*- c++ -*- ----------------------------------------------------------
   ML-TORCH package: small helpers the styles share that need LAMMPS (a
   collective ERROR, word lists); the MPI collectives themselves are the
   core's (mltorch/collectives.h). Include from .cpp files only.
   Distributed under the GNU General Public License, version 2.
------------------------------------------------------------------------- */

#ifndef LMP_MLTORCH_MPI_H
#define LMP_MLTORCH_MPI_H

#include "error.h"
#include "lmptype.h"

#include "mltorch/collectives.h"

#include <mpi.h>

#include <string>
#include <vector>

namespace LAMMPS_NS {
namespace MLTorchLmp {

  // space-separated list for messages (utils::join is not in every supported LAMMPS)
  template <typename T> std::string join_words(const std::vector<T> &items)
  {
    std::string out;
    for (const auto &item : items) out += (out.empty() ? "" : " ") + fmt::format("{}", item);
    return out;
  }

  // stop every rank of `comm` with the message of the lowest rank that is
  // not ok (a failure only some ranks can see would otherwise leave the
  // others waiting); returns when all are ok
  inline void stop_collectively(Error *error, MPI_Comm comm, bool ok, const std::string &message,
                                bool where = true)
  {
    const std::string text = MLTorch::first_failure(comm, ok, message, where);
    if (!text.empty()) error->all(FLERR, text);
  }

}    // namespace MLTorchLmp
}    // namespace LAMMPS_NS

#endif
