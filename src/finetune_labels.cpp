/* ----------------------------------------------------------------------
   LAMMPS - Large-scale Atomic/Molecular Massively Parallel Simulator
   https://www.lammps.org/, Sandia National Laboratories
   LAMMPS development team: developers@lammps.org

   ML-TORCH package: TorchScript machine-learned potentials.
   Distributed under the GNU General Public License, version 2.
------------------------------------------------------------------------- */

/* ----------------------------------------------------------------------
   fix torch/finetune `labels FILE` (finetune_labels.h): the replica's
   labelled configurations gathered by atom ID onto its first rank and
   appended as extended XYZ frames (MLTorch::LabelWriter)
------------------------------------------------------------------------- */

#include "finetune_labels.h"

#include "atom.h"
#include "comm.h"
#include "domain.h"
#include "error.h"
#include "mltorch_units.h"
#include "platform.h"
#include "universe.h"
#include "update.h"

#include "mltorch/collectives.h"
#include "mltorch/labels.h"

#include <algorithm>
#include <cmath>
#include <numeric>

using namespace LAMMPS_NS;

// FILE, or with several replicas FILE with ".k" before its extension
static std::string replica_file(const std::string &file, int iworld, int nworlds)
{
  if (nworlds <= 1) return file;
  const std::size_t slash = file.rfind('/');
  const std::size_t dot = file.rfind('.');
  const std::string k = std::to_string(iworld);
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash) || dot == 0 ||
      (slash != std::string::npos && dot == slash + 1))
    return file + "." + k;
  return file.substr(0, dot) + "." + k + file.substr(dot);
}

FinetuneLabels::FinetuneLabels(LAMMPS *lmp, const std::string &file,
                               std::vector<std::string> elements, const std::string &teacher) :
    Pointers(lmp), teacher_(teacher), elements_(std::move(elements))
{
  path_ = replica_file(file, universe->iworld, universe->nworlds);
  const std::string units = update->unit_style;
  if (units == "metal")
    to_ev = 1.0;
  else if (units == "real")
    to_ev = MLTorchUnits::kKcalMolEv;
  else
    error->all(FLERR, "Fix torch/finetune labels writes eV and Angstrom and supports units metal "
                      "and real, not '{}'", units);
  for (int t = 1; t <= atom->ntypes; ++t)
    if (t >= static_cast<int>(elements_.size()) || elements_[t].empty())
      error->all(FLERR, "Fix torch/finetune labels needs an element for every atom type, but "
                        "pair_coeff maps type {} to none (NULL): a label file holds whole "
                        "configurations", t);
}

FinetuneLabels::~FinetuneLabels() = default;

void FinetuneLabels::resume(int64_t frames, int64_t bytes)
{
  keep_frames = frames;
  keep_bytes = bytes;
}

void FinetuneLabels::position(int64_t &frames, int64_t &bytes) const
{
  frames = writer ? writer->frames() : -1;
  bytes = writer ? writer->bytes() : -1;
}

std::string FinetuneLabels::open()
{
  std::string failure;
  if (comm->me == 0 && !writer) {
    try {
      writer = std::make_unique<MLTorch::LabelWriter>(path_, keep_bytes, keep_frames);
      std::string how = writer->frames() > 0
          ? fmt::format("appending to its {} frames", writer->frames())
          : std::string("a new file");
      if (keep_bytes >= 0 && writer->repaired() > 0)
        how += fmt::format(" (as the restart file found it: {} bytes of frames written after it "
                           "were cut off)", writer->repaired());
      else if (writer->repaired() > 0)
        how += fmt::format(" (a partial last frame of {} bytes, as a killed job leaves one, was "
                           "cut off)", writer->repaired());
      utils::logmesg(lmp, "fix torch/finetune: labels: writing every labelled configuration to {}, "
                          "{}\n", path_, how);
    } catch (MLTorch::LabelsError &e) {
      failure = fmt::format("Fix torch/finetune labels: {}", e.what());
    }
  }
  return MLTorch::first_failure(world, failure.empty(), failure);
}

/* ----------------------------------------------------------------------
   one frame: (tag, type, x - boxlo, fref) of every owned atom gathered on
   the first rank, in atom-ID order
------------------------------------------------------------------------- */

std::string FinetuneLabels::write(double **fref, double energy, const double *virial,
                                  double deviation, double shift)
{
  const double t0 = platform::walltime();
  const int nlocal = atom->nlocal;
  constexpr int W = 8;
  sendbuf.resize(static_cast<std::size_t>(W) * nlocal);
  for (int i = 0; i < nlocal; ++i) {
    double *b = &sendbuf[static_cast<std::size_t>(W) * i];
    b[0] = static_cast<double>(atom->tag[i]);
    b[1] = atom->type[i];
    // wrapped into the periodic cell (between reneighborings an atom may
    // have left the box): a configuration has one set of positions whatever
    // the run's history, and restart files (which wrap) continue it bitwise
    double x[3] = {atom->x[i][0], atom->x[i][1], atom->x[i][2]};
    imageint image = ((imageint) IMGMAX << IMG2BITS) | ((imageint) IMGMAX << IMGBITS) | IMGMAX;
    domain->remap(x, image);
    for (int k = 0; k < 3; ++k) {
      b[2 + k] = x[k] - domain->boxlo[k];
      b[5 + k] = fref[i][k];
    }
  }
  const int nprocs = comm->nprocs;
  counts.assign(nprocs, 0);
  displs.assign(nprocs, 0);
  int mine = W * nlocal;    // not const: MPI stubs take void *
  MPI_Gather(&mine, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, world);
  for (int p = 1; p < nprocs; ++p) displs[p] = displs[p - 1] + counts[p - 1];
  const std::size_t total = comm->me == 0 ? static_cast<std::size_t>(displs[nprocs - 1] + counts[nprocs - 1]) : 0;
  allbuf.resize(total);
  MPI_Gatherv(sendbuf.data(), mine, MPI_DOUBLE, allbuf.data(), counts.data(), displs.data(),
              MPI_DOUBLE, 0, world);

  std::string failure;
  if (comm->me == 0) {
    const std::size_t n = total / W;
    std::vector<std::size_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(),
              [&](std::size_t a, std::size_t b) { return allbuf[W * a] < allbuf[W * b]; });
    MLTorch::LabelFrame f;
    // the box vectors a, b, c (LAMMPS's restricted triclinic) as rows
    const double cell[9] = {domain->xprd, 0.0, 0.0, domain->xy, domain->yprd, 0.0,
                            domain->xz, domain->yz, domain->zprd};
    std::copy(cell, cell + 9, f.cell);
    f.species.resize(n);
    f.positions.resize(3 * n);
    f.forces.resize(3 * n);
    const double fconv = to_ev;    // energy per Angstrom
    bool finite = std::isfinite(energy);
    for (std::size_t j = 0; j < n; ++j) {
      const double *b = &allbuf[W * order[j]];
      f.species[j] = elements_[static_cast<int>(b[1])];
      for (int k = 0; k < 3; ++k) {
        f.positions[3 * j + k] = b[2 + k];
        f.forces[3 * j + k] = b[5 + k] * fconv;
        finite = finite && std::isfinite(b[5 + k]);
      }
    }
    for (int k = 0; k < 6; ++k) finite = finite && std::isfinite(virial[k]);
    f.has_energy = true;
    f.energy = energy * to_ev;
    // ASE's stress: -virial / volume (eV/A^3), where the teacher gave a
    // virial (an i-PI client that computes none sends zeros)
    bool any = false;
    for (int k = 0; k < 6; ++k) any = any || virial[k] != 0.0;
    if (any) {
      const double vol = domain->xprd * domain->yprd * domain->zprd;
      const double s = -to_ev / vol;
      // LAMMPS's order xx yy zz xy xz yz
      const double full[9] = {virial[0], virial[3], virial[4], virial[3], virial[1],
                              virial[5], virial[4], virial[5], virial[2]};
      for (int k = 0; k < 9; ++k) f.stress[k] = s * full[k];
      f.has_stress = true;
    }
    f.info.emplace_back("step", std::to_string(update->ntimestep));
    f.info.emplace_back("replica", std::to_string(universe->iworld));
    f.info.emplace_back("teacher", teacher_);
    f.info.emplace_back("config_hash", MLTorch::configuration_hash(f));
    if (std::isfinite(shift)) f.info.emplace_back("energy_shift", fmt::format("{:.17g}", shift * to_ev));
    if (deviation >= 0.0) f.info.emplace_back("deviation", fmt::format("{:.17g}", deviation * to_ev));
    if (!finite) {
      ++nskipped;
      utils::logmesg(lmp, "fix torch/finetune: labels: step {}: the teacher's labels are not "
                          "finite (NaN or inf); not written to {}\n",
                     update->ntimestep, path_);
    } else {
      try {
        writer->write(f);
        ++nwritten;
      } catch (MLTorch::LabelsError &e) {
        failure = fmt::format("Fix torch/finetune labels on step {}: {}. The frames written "
                              "before are whole", update->ntimestep, e.what());
      }
    }
  }
  time_write += platform::walltime() - t0;
  return MLTorch::first_failure(world, failure.empty(), failure);
}

std::string FinetuneLabels::summary() const
{
  if (comm->me != 0 || !writer) return {};
  return fmt::format("fix torch/finetune: labels: {} frames written to {} in this run and before "
                     "({} now), {:.3g} ms per frame (gather, text, write, sync){}\n",
                     nwritten, path_, writer->frames(),
                     nwritten > 0 ? 1e3 * time_write / static_cast<double>(nwritten) : 0.0,
                     nskipped > 0 ? fmt::format("; {} non-finite labels not written", nskipped)
                                  : std::string());
}
