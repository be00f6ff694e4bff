/* ----------------------------------------------------------------------
   ML-TORCH: machine-learned potentials for LAMMPS.
   Labelled configurations for training (mltorch/dataset.h).
------------------------------------------------------------------------- */

#include "mltorch/dataset.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

namespace MLTorch {

void WholeConfiguration::forward(const double *owned, double *all, int width)
{
  std::memcpy(all, owned, sizeof(double) * static_cast<std::size_t>(n_) * width);
}

void WholeConfiguration::reverse(const double *all, double *owned, int width)
{
  std::memcpy(owned, all, sizeof(double) * static_cast<std::size_t>(n_) * width);
}

std::vector<LabelledConfiguration> make_configurations(const std::vector<LabelFrame> &frames,
                                                       const std::string &source,
                                                       const std::vector<std::string> &elements,
                                                       double cutoff, double energy_unit,
                                                       const DatasetNeeds &needs, double max_bytes)
{
  std::vector<LabelledConfiguration> out;
  out.reserve(frames.size());
  double bytes = 0.0;
  for (std::size_t k = 0; k < frames.size(); ++k) {
    const LabelFrame &f = frames[k];
    const std::string where = source + " frame " + std::to_string(k + 1);
    LabelledConfiguration c;
    c.where = where;
    std::vector<int64_t> species(f.natoms());
    c.counts.assign(elements.size(), 0.0);
    for (std::size_t i = 0; i < f.natoms(); ++i) {
      const auto it = std::find(elements.begin(), elements.end(), f.species[i]);
      if (it == elements.end()) {
        std::string list;
        for (const auto &e : elements) list += (list.empty() ? "" : " ") + e;
        throw LabelsError(where + ": atom " + std::to_string(i + 1) + " is " + f.species[i] +
                          ", which the model does not have (its elements: " + list + ")");
      }
      species[i] = it - elements.begin();
      c.counts[species[i]] += 1.0;
    }
    for (const char *key : {"config_weight", "weight"})
      if (const std::string *w = f.find(key)) {
        char *end = nullptr;
        c.weight = std::strtod(w->c_str(), &end);
        if (end == w->c_str() || *end != '\0' || !std::isfinite(c.weight) || c.weight < 0.0)
          throw LabelsError(where + ": its " + key + " '" + *w + "' is not a number >= 0");
        break;
      }
    c.has_energy = f.has_energy;
    c.has_forces = f.forces.size() == 3 * f.natoms();
    c.has_stress = f.has_stress;
    if (needs.energy && !c.has_energy)
      throw LabelsError(where + " has no energy, but the energy weight is > 0 (set it to 0, or "
                                "give every frame an energy)");
    if (needs.forces && !c.has_forces)
      throw LabelsError(where + " has no forces (no forces:R:3 column), but the force weight is "
                                "> 0 (set it to 0, or give every frame forces)");
    if (needs.stress && !c.has_stress)
      throw LabelsError(where + " has no stress (or virial), but the stress weight is > 0 (set "
                                "it to 0, or give every frame a stress)");
    for (int d = 0; d < 3; ++d)
      if (!f.pbc[d])
        throw LabelsError(where + " is not periodic along " + std::string(1, "xyz"[d]) +
                          " (pbc F): training takes periodic cells; put a cluster or a slab in "
                          "a periodic cell with vacuum");
    try {
      c.graph = periodic_graph(f.cell, f.pbc, f.positions.data(), species, cutoff);
    } catch (ModelError &e) {
      throw LabelsError(where + ": " + e.what());
    }
    bytes += static_cast<double>(c.graph.bytes());
    if (bytes > max_bytes)
      throw LabelsError("the graphs of " + source + " need more than " +
                        std::to_string(static_cast<long long>(max_bytes / 1e6)) + " MB per rank by "
                        "frame " + std::to_string(k + 1) + " of " + std::to_string(frames.size()) +
                        " (every rank keeps every configuration's graph); raise memory, or train on "
                        "fewer or smaller configurations");
    if (c.has_energy) c.e_ref = f.energy * energy_unit;
    if (c.has_forces) {
      c.fref = f.forces;
      for (double &v : c.fref) v *= energy_unit;
    } else {
      c.fref.assign(3 * f.natoms(), 0.0);
    }
    if (c.has_stress) {
      const double *h = f.cell;
      const double vol = std::fabs(h[0] * (h[4] * h[8] - h[5] * h[7]) - h[1] * (h[3] * h[8] - h[5] * h[6]) +
                                   h[2] * (h[3] * h[7] - h[4] * h[6]));
      const double *s = f.stress;
      const double w[6] = {s[0], s[4], s[8], 0.5 * (s[1] + s[3]), 0.5 * (s[2] + s[6]), 0.5 * (s[5] + s[7])};
      for (int j = 0; j < 6; ++j) c.w_ref[j] = -w[j] * vol * energy_unit;
    }
    out.push_back(std::move(c));
  }
  return out;
}

}    // namespace MLTorch
