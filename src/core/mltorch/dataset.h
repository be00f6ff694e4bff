/* -*- c++ -*- ----------------------------------------------------------
   ML-TORCH: machine-learned potentials for LAMMPS.
   Part of the LAMMPS-independent core (no LAMMPS, no MPI): labelled
   configurations from extended XYZ frames (mltorch/labels.h) made ready
   for the training pass: each one's folded periodic graph in the model's
   species (mltorch/periodic_graph.h), its labels in the run's units, and
   the trivial owner exchange of a configuration that one rank holds whole.
   The torch/train command trains on them.
------------------------------------------------------------------------- */

#ifndef MLTORCH_CORE_DATASET_H
#define MLTORCH_CORE_DATASET_H

#include "mltorch/halo.h"
#include "mltorch/labels.h"
#include "mltorch/periodic_graph.h"

#include <cstdint>
#include <string>
#include <vector>

namespace MLTorch {

struct LabelledConfiguration {
  PeriodicGraph graph;
  std::vector<double> fref;       // [natoms][3] run units (zeros without forces)
  double e_ref = 0.0;             // run units (0 without energy)
  double w_ref[6] = {0, 0, 0, 0, 0, 0};    // virial W = -stress V, xx yy zz xy xz yz
  std::vector<double> counts;     // atoms of each species (energy_shift)
  bool has_energy = false, has_forces = false, has_stress = false;
  // the frame's own weight of its loss (its `config_weight` or `weight`
  // key, as MACE's and ASE's files name it; 1 without)
  double weight = 1.0;
  std::string where;              // "FILE frame K" for messages
  double natoms() const { return static_cast<double>(graph.natoms); }
};

// what the loss needs of every configuration (weights > 0)
struct DatasetNeeds {
  bool energy = false, forces = false, stress = false;
};

// the frames as configurations of a model with `elements` and `cutoff`:
// energies times `energy_unit` (eV -> the run's energy unit), lengths in
// Angstrom. LabelsError naming the frame for an element the model does not
// have, a label the weights need and the frame lacks, or graphs that pass
// `max_bytes` in all
std::vector<LabelledConfiguration> make_configurations(const std::vector<LabelFrame> &frames,
                                                       const std::string &source,
                                                       const std::vector<std::string> &elements,
                                                       double cutoff, double energy_unit,
                                                       const DatasetNeeds &needs, double max_bytes);

// the owners of a configuration one rank holds whole: every node is owned
class WholeConfiguration : public HaloExchange {
 public:
  explicit WholeConfiguration(int64_t n) : n_(n) {}
  void forward(const double *owned, double *all, int width) override;
  void reverse(const double *all, double *owned, int width) override;

 private:
  int64_t n_;
};

}    // namespace MLTorch

#endif
