/* -*- c++ -*- ----------------------------------------------------------
   LAMMPS - Large-scale Atomic/Molecular Massively Parallel Simulator
   https://www.lammps.org/, Sandia National Laboratories
   LAMMPS development team: developers@lammps.org

   ML-TORCH package: TorchScript machine-learned potentials.
   Distributed under the GNU General Public License, version 2.
------------------------------------------------------------------------- */

#ifndef LMP_MLTORCH_UNITS_H
#define LMP_MLTORCH_UNITS_H

namespace LAMMPS_NS {
namespace MLTorchUnits {

// CODATA 2018 (as NIST lists it): the Bohr radius in Angstrom, the Hartree
// energy in eV and in kcal/mol (2625.4996394799 kJ/mol / 4.184). The i-PI
// teacher converts atomic units with them, and the label files (always eV
// and Angstrom) convert units real with their ratio, so that a label read
// back gives what the teacher sent
static constexpr double kBohrAngstrom = 0.529177210903;
static constexpr double kHartreeEv = 27.211386245988;
static constexpr double kHartreeKcalMol = 627.50947406;
static constexpr double kKcalMolEv = kHartreeEv / kHartreeKcalMol;

}    // namespace MLTorchUnits
}    // namespace LAMMPS_NS

#endif
