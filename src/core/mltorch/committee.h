/* -*- c++ -*- ----------------------------------------------------------
   ML-TORCH: machine-learned potentials for LAMMPS.
   Part of the LAMMPS-independent core: committee (ensemble) statistics and
   the decisions of uncertainty-gated labelling, from plain numbers.
------------------------------------------------------------------------- */

#ifndef MLTORCH_CORE_COMMITTEE_H
#define MLTORCH_CORE_COMMITTEE_H

namespace MLTorch {

// DeePMD-kit's model deviation of one atom over `members` models:
//   out[0] = sqrt(1/M sum_m |F_m - <F>|^2)    (forces: [members][3])
//   out[1] = sqrt(1/M sum_m (e_m - <e>)^2)    (atomic energies: [members];
//                                              nullptr gives 0)
void committee_atom_deviation(int members, const double *forces, const double *energies,
                              double *out);

// population standard deviation of n values (the committee's spread of a
// scalar such as the total energy)
double committee_std(int n, const double *values);

// uncertainty-gated labelling: a configuration whose deviation lies in
// [low, high) is labelled; below it the model knows it, at or above it the
// configuration is taken as unphysical and skipped
enum class Gate { Known, Label, Skip };
Gate gate(double deviation, double low, double high);

// how the replicas' configurations enter one update: the summed gradient
// of every labelled configuration of every replica, divided by their count
// (not by the number of replicas: a replica that labelled nothing adds
// nothing, as DDP's join does for uneven inputs). No configuration
// anywhere: no update (returns false and leaves `grad` alone).
bool average_gradient(double configurations, double *grad, long n);

}    // namespace MLTorch

#endif
