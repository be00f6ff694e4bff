/* ----------------------------------------------------------------------
   LAMMPS - Large-scale Atomic/Molecular Massively Parallel Simulator
   https://www.lammps.org/, Sandia National Laboratories
   LAMMPS development team: developers@lammps.org

   ML-TORCH package: TorchScript machine-learned potentials.
   Distributed under the GNU General Public License, version 2.
------------------------------------------------------------------------- */

#include "finetune_teacher.h"

#include "atom.h"
#include "comm.h"
#include "error.h"
#include "force.h"
#include "input.h"
#include "lmp_compat.h"
#include "memory.h"
#include "neighbor.h"
#include "pair.h"
#include "pair_torch.h"

#include <algorithm>
#include <cstring>

using namespace LAMMPS_NS;

/* ---------------------------------------------------------------------- */

std::unique_ptr<FinetuneTeacher> FinetuneTeacher::create(LAMMPS *lmp, const std::string &style,
                                                         const std::string &args, double timeout)
{
  if (style == "ipi") return std::make_unique<IpiTeacher>(lmp, args, timeout);
  return std::make_unique<PairTeacher>(lmp, style, args);
}

/* ----------------------------------------------------------------------
   LAMMPS leaves $ variables inside quotes alone; the teacher's second
   argument (pair_coeff lines, an i-PI address) is one quoted word, so it
   is substituted here, as print and fix print do with theirs (a potential
   file named by a variable, a job-specific socket, a world variable per
   replica)
------------------------------------------------------------------------- */

std::string FinetuneTeacher::substitute_variables(LAMMPS *lmp, const std::string &text)
{
  int maxcopy = static_cast<int>(text.size()) + 1, maxwork = maxcopy;
  auto *copy = static_cast<char *>(lmp->memory->smalloc(maxcopy, "torch/finetune:copy"));
  auto *work = static_cast<char *>(lmp->memory->smalloc(maxwork, "torch/finetune:work"));
  std::strcpy(copy, text.c_str());
  lmp->input->substitute(copy, work, maxcopy, maxwork, 0);
  std::string out(copy);
  lmp->memory->sfree(copy);
  lmp->memory->sfree(work);
  return out;
}

/* ---------------------------------------------------------------------- */

PairTeacher::PairTeacher(LAMMPS *lmp, const std::string &style_args, const std::string &coeff_in) :
    FinetuneTeacher(lmp, style_args), pair(nullptr)
{
  const std::string coeff = substitute_variables(lmp, coeff_in);
  auto style_words = utils::split_words(style_args);
  if (style_words.empty()) error->all(FLERR, "Fix torch/finetune teacher: empty pair style");
  const std::string &style = style_words[0];
  if (force->pair_map->find(style) == force->pair_map->end())
    error->all(FLERR, "Fix torch/finetune teacher: unknown pair style '{}' (is its package "
                      "installed in this LAMMPS?)", style);
  if (utils::strmatch(style, "^hybrid"))
    error->all(FLERR, "Fix torch/finetune teacher: pair style {} is not supported as a teacher",
               style);

  int sflag = 0;
  pair = force->new_pair(style, 0, sflag);
  std::vector<std::string> sargs(style_words.begin() + 1, style_words.end());
  std::vector<char *> sargv;
  for (auto &a : sargs) sargv.push_back(a.data());
  pair->settings(static_cast<int>(sargv.size()), sargv.data());

  // several pair_coeff lines are separated by ';'
  std::vector<std::string> lines{""};
  for (char c : coeff) {
    if (c == ';')
      lines.emplace_back();
    else
      lines.back() += c;
  }
  int ncoeff = 0;
  for (const auto &line : lines) {
    auto words = utils::split_words(line);
    if (words.empty()) continue;
    if (words.size() < 2)
      error->all(FLERR, "Fix torch/finetune teacher coefficients '{}' need at least the two "
                        "atom types, like a pair_coeff command", line);
    std::vector<char *> cargv;
    for (auto &w : words) cargv.push_back(w.data());
    pair->coeff(static_cast<int>(cargv.size()), cargv.data());
    ++ncoeff;
  }
  if (ncoeff == 0) error->all(FLERR, "Fix torch/finetune teacher: no pair coefficients given");
  // a torch teacher is a private instance, not a pair_style hybrid sub-style
  if (auto *t = dynamic_cast<PairTorch *>(pair)) t->set_private_instance();
}

PairTeacher::~PairTeacher()
{
  delete pair;
}

int PairTeacher::comm_forward() const
{
  return pair->comm_forward;
}

int PairTeacher::comm_reverse() const
{
  return pair->comm_reverse;
}

/* ---------------------------------------------------------------------- */

void FinetuneTeacher::init(Pair *student)
{
  // the teacher labels the whole system; in a pair_style hybrid run the
  // other sub-styles' forces, energy and virial are subtracted, so the
  // model learns its own share
  others.clear();
  if (utils::strmatch(force->pair_style, "^hybrid")) {
    // sub-styles by name (pair_match), every instance of each
    for (const auto &entry : *force->pair_map) {
      Pair *prev = nullptr;
      for (int n = 1;; ++n) {
        Pair *p = force->pair_match(entry.first, 1, n);
        if (!p || p == prev) break;
        prev = p;
        // (pair_match also answers "hybrid" with the hybrid style itself)
        if (p != student && p != force->pair &&
            std::find(others.begin(), others.end(), p) == others.end())
          others.push_back(p);
      }
    }
  }
}

void PairTeacher::init(Pair *student)
{
  FinetuneTeacher::init(student);
  // the teacher labels the whole system, so it needs every type pair
  const int ntypes = atom->ntypes;
  for (int i = 1; i <= ntypes; ++i)
    for (int j = i; j <= ntypes; ++j)
      if (!pair->setflag[i][j])    // (LAMMPS sets the i <= j half only)
        error->all(FLERR,
                   "Fix torch/finetune teacher: its coefficients leave atom types {} and {} "
                   "without interaction; the teacher must describe the whole system (no NULL "
                   "elements): with pair_style hybrid the fix removes the other sub-styles' share",
                   i, j);

  // its own neighbor list; it must fit in the ghost shell
  pair->init();
  const double skin = neighbor->skin;
  const double cut_student = force->pair->cutforce;
  const double cut_teacher = pair->cutforce;
  if (cut_teacher > cut_student && pair->ghostneigh)
    error->all(FLERR,
               "Fix torch/finetune: teacher {} needs neighbors of ghost atoms and has cutoff {}, "
               "longer than the model's {}; LAMMPS builds ghost-atom lists to the MD pair style's "
               "cutoff only: use a teacher with a cutoff <= {}",
               description, cut_teacher, cut_student, cut_student);
  if (cut_teacher > cut_student) {
    const double need = cut_teacher + skin;
    const double have = MAX(comm->cutghostuser, cut_student + skin);
    if (have < need)
      error->all(FLERR,
                 "Fix torch/finetune: teacher {} has cutoff {} but the model's cutoff is {}: ghost "
                 "atoms reach only {}; add 'comm_modify cutoff {}' (teacher cutoff + skin) to the "
                 "input before the run",
                 description, cut_teacher, cut_student, have, need);
    MLTorchLmp::set_request_cutoff(neighbor, pair, cut_teacher);
  }
}

/* ---------------------------------------------------------------------- */

void FinetuneTeacher::label(double **fref, double &e_ref, double *w_ref,
                            const std::function<void()> &sum_to_owners)
{
  const int nlocal = atom->nlocal;
  const int nall = nlocal + atom->nghost;
  fsave.resize(3 * static_cast<std::size_t>(nall));
  double **f = atom->f;
  if (nall > 0) {
    std::memcpy(fsave.data(), &f[0][0], sizeof(double) * 3 * nall);
    std::memset(&f[0][0], 0, sizeof(double) * 3 * nall);
  }
  // the other hybrid sub-styles' share of this step (their lists are this
  // step's), summed onto the owners, to be taken off the labels
  double e_other = 0.0, w_other[6] = {0, 0, 0, 0, 0, 0};
  if (!others.empty()) {
    for (Pair *p : others) {
      p->compute(ENERGY_GLOBAL, VIRIAL_PAIR);
      e_other += p->eng_vdwl + p->eng_coul;
      for (int k = 0; k < 6; ++k) w_other[k] += p->virial[k];
    }
    sum_to_owners();
    f = atom->f;
    fothers.assign(3 * static_cast<std::size_t>(nlocal), 0.0);
    if (nlocal > 0) std::memcpy(fothers.data(), &f[0][0], sizeof(double) * 3 * nlocal);
    if (nall > 0) std::memset(&f[0][0], 0, sizeof(double) * 3 * nall);
  }
  try {
    reference(fref, e_ref, w_ref, sum_to_owners);
  } catch (...) {
    f = atom->f;
    if (nall > 0) std::memcpy(&f[0][0], fsave.data(), sizeof(double) * 3 * nall);
    throw;
  }
  if (!others.empty()) {
    for (int i = 0; i < nlocal; ++i)
      for (int k = 0; k < 3; ++k) fref[i][k] -= fothers[3 * i + k];
    e_ref -= e_other;
    for (int k = 0; k < 6; ++k) w_ref[k] -= w_other[k];
  }
  f = atom->f;
  if (nall > 0) std::memcpy(&f[0][0], fsave.data(), sizeof(double) * 3 * nall);
}

/* ----------------------------------------------------------------------
   the pair style's forces (ghost shares summed onto the owners), energy
   and virial; atom->f is zero on entry
------------------------------------------------------------------------- */

void PairTeacher::reference(double **fref, double &e_ref, double *w_ref,
                            const std::function<void()> &sum_to_owners)
{
  pair->compute(ENERGY_GLOBAL, VIRIAL_PAIR);
  sum_to_owners();
  double **f = atom->f;
  if (atom->nlocal > 0) std::memcpy(&fref[0][0], &f[0][0], sizeof(double) * 3 * atom->nlocal);
  e_ref = pair->eng_vdwl + pair->eng_coul;
  for (int k = 0; k < 6; ++k) w_ref[k] = pair->virial[k];
}
