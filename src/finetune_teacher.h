/* -*- c++ -*- ----------------------------------------------------------
   LAMMPS - Large-scale Atomic/Molecular Massively Parallel Simulator
   https://www.lammps.org/, Sandia National Laboratories
   LAMMPS development team: developers@lammps.org

   ML-TORCH package: TorchScript machine-learned potentials.
   Distributed under the GNU General Public License, version 2.
------------------------------------------------------------------------- */

#ifndef LMP_FINETUNE_TEACHER_H
#define LMP_FINETUNE_TEACHER_H

#include "pointers.h"

#include <functional>
#include <string>
#include <vector>

namespace LAMMPS_NS {

// The reference of fix torch/finetune: a private instance of a pair style
// (not the one the MD runs with), built from the fix's `teacher` keyword,
// with its own neighbor list. In a pair_style hybrid run it labels the
// whole system and the share of the other sub-styles is removed, so that
// the model learns its own.
class FinetuneTeacher : protected Pointers {
 public:
  // `style`: the pair style and its settings; `coeff`: pair_coeff lines
  // (without the command), separated by ';'
  FinetuneTeacher(class LAMMPS *, const std::string &style, const std::string &coeff);
  ~FinetuneTeacher() override;
  FinetuneTeacher(const FinetuneTeacher &) = delete;
  FinetuneTeacher &operator=(const FinetuneTeacher &) = delete;

  // at every init() of the fix: every type pair covered, the other hybrid
  // sub-styles besides `student`, its neighbor list and ghost cutoff
  void init(class Pair *student);
  // values per atom the teacher's own forward/reverse communication moves
  // (LAMMPS sizes its buffers from force->pair and the fixes only)
  int comm_forward() const;
  int comm_reverse() const;
  // the labels of the current configuration: the teacher's forces on the
  // owned atoms into fref[nlocal][3], its energy and virial on this rank.
  // `sum_to_owners` sums the ghost shares of atom->f onto their owners
  // (the fix's reverse communication). The MD forces are kept aside and put
  // back untouched.
  void label(double **fref, double &e_ref, double *w_ref, const std::function<void()> &sum_to_owners);
  const std::string &style() const { return style_; }

 private:
  std::string style_;
  class Pair *pair;
  std::vector<class Pair *> others;
  std::vector<double> fsave;
};

}    // namespace LAMMPS_NS

#endif
