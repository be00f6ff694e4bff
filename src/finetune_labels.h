/* -*- c++ -*- ----------------------------------------------------------
   LAMMPS - Large-scale Atomic/Molecular Massively Parallel Simulator
   https://www.lammps.org/, Sandia National Laboratories
   LAMMPS development team: developers@lammps.org

   ML-TORCH package: TorchScript machine-learned potentials.
   Distributed under the GNU General Public License, version 2.
------------------------------------------------------------------------- */

#ifndef LMP_FINETUNE_LABELS_H
#define LMP_FINETUNE_LABELS_H

#include "pointers.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace MLTorch {
class LabelWriter;
}

namespace LAMMPS_NS {

// fix torch/finetune's `labels FILE`: every labelled configuration of a
// replica appended to its own extended XYZ file (eV and Angstrom, atoms in
// atom-ID order, elements of the pair style's map) by the replica's first
// rank, one frame per label, synced (MLTorch::LabelWriter). With several
// replicas replica k writes FILE with ".k" before its extension
// (labels.xyz: labels.0.xyz, labels.1.xyz).
class FinetuneLabels : protected Pointers {
 public:
  // `elements`: the element of each atom type (index 1..ntypes; empty: a
  // type the model does not cover); `teacher`: the provenance text
  FinetuneLabels(class LAMMPS *, const std::string &file, std::vector<std::string> elements,
                 const std::string &teacher);
  ~FinetuneLabels() override;
  FinetuneLabels(const FinetuneLabels &) = delete;
  FinetuneLabels &operator=(const FinetuneLabels &) = delete;

  // the restart record's length of the file: the next open() cuts it back
  // to those frames (the run continues from the restart file)
  void resume(int64_t frames, int64_t bytes);
  // the file's frames and bytes now (-1 when it is not open); rank 0
  void position(int64_t &frames, int64_t &bytes) const;
  // at the start of every run, on every rank of the replica: open the file
  // (once); a failure the caller agrees on (empty: none)
  std::string open();
  // one labelled configuration, on every rank of the replica: the teacher's
  // forces on the owned atoms, and its energy and virial over the replica
  // (run units). `deviation` < 0: none; `shift`: the fitted energy
  // reference of this configuration (NaN: none). A failure (empty: none)
  std::string write(double **fref, double energy, const double *virial, double deviation,
                    double shift);
  // a line for the log at the end of a run (empty: none)
  std::string summary() const;
  const std::string &path() const { return path_; }

 private:
  std::string path_, teacher_;
  std::vector<std::string> elements_;
  std::unique_ptr<MLTorch::LabelWriter> writer;    // the replica's first rank
  int64_t keep_frames = -1, keep_bytes = -1;
  double to_ev = 1.0;
  bigint nwritten = 0, nskipped = 0;
  double time_write = 0.0;
  std::vector<double> sendbuf, allbuf;
  std::vector<int> counts, displs;
};

}    // namespace LAMMPS_NS

#endif
