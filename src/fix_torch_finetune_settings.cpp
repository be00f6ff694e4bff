/* ----------------------------------------------------------------------
   LAMMPS - Large-scale Atomic/Molecular Massively Parallel Simulator
   https://www.lammps.org/, Sandia National Laboratories
   LAMMPS development team: developers@lammps.org

   ML-TORCH package: TorchScript machine-learned potentials.
   Distributed under the GNU General Public License, version 2.
------------------------------------------------------------------------- */

/* ----------------------------------------------------------------------
   fix torch/finetune: its arguments (doc/fix_torch_finetune.rst) into
   the core's settings struct, every value checked where it is read
------------------------------------------------------------------------- */

#include "fix_torch_finetune.h"
#include "finetune_keywords.h"

#include "error.h"
#include "lmp_compat.h"

#include "mltorch/finetune.h"

#include <cctype>
#include <cmath>

using namespace LAMMPS_NS;


/* ----------------------------------------------------------------------
   the keywords fix torch/finetune and the torch/train command share (the
   loss weights, the optimizer, its schedule, clipping, what trains, the
   energy reference): the index after the keyword's values, or `iarg` when
   arg[iarg] is none of them. `who` begins the ERRORs ("Fix torch/finetune")
------------------------------------------------------------------------- */

int LAMMPS_NS::parse_training_keyword(LAMMPS *lmp, const std::string &who, int narg, char **arg,
                                      int iarg, MLTorch::FinetuneSettings &s,
                                      const std::function<bool(const char *)> &is_keyword)
{
  Error *error = lmp->error;
  std::string lower = who;
  lower[0] = static_cast<char>(std::tolower(lower[0]));
  auto number = [&](int i, const char *what) {
    if (i >= narg) MLTorchLmp::missing_args(FLERR, lower + " " + what, error);
    return utils::numeric(FLERR, arg[i], false, lmp);
  };
  auto integer = [&](int i, const char *what) {
    if (i >= narg) MLTorchLmp::missing_args(FLERR, lower + " " + what, error);
    return utils::inumeric(FLERR, arg[i], false, lmp);
  };
  const std::string kw = arg[iarg];
  if (kw == "weights") {
    s.w_energy = number(iarg + 1, "weights");
    s.w_force = number(iarg + 2, "weights");
    s.w_stress = number(iarg + 3, "weights");
    if (s.w_energy < 0 || s.w_force < 0 || s.w_stress < 0 || s.w_energy + s.w_force + s.w_stress <= 0)
      error->all(FLERR,
                 "{} weights {} {} {}: energy, force and stress weights must be "
                 ">= 0 and not all zero",
                 who, s.w_energy, s.w_force, s.w_stress);
    iarg += 4;
  } else if (kw == "lr") {
    s.opt.lr = number(iarg + 1, "lr");
    if (!(s.opt.lr > 0.0) || !std::isfinite(s.opt.lr))
      error->all(FLERR, "{} learning rate {} must be > 0", who, arg[iarg + 1]);
    iarg += 2;
  } else if (kw == "optimizer") {
    if (iarg + 2 > narg) MLTorchLmp::missing_args(FLERR, lower + " optimizer", error);
    s.opt.kind = arg[iarg + 1];
    if (s.opt.kind != "adam" && s.opt.kind != "adamw" && s.opt.kind != "sgd")
      error->all(FLERR, "{} optimizer {} is unknown: use adam, adamw or sgd", who, s.opt.kind);
    iarg += 2;
  } else if (kw == "weight_decay") {
    s.opt.weight_decay = number(iarg + 1, "weight_decay");
    if (s.opt.weight_decay < 0) error->all(FLERR, "{} weight_decay must be >= 0", who);
    iarg += 2;
  } else if (kw == "anchor") {
    s.opt.anchor = number(iarg + 1, "anchor");
    if (!(s.opt.anchor >= 0.0) || !std::isfinite(s.opt.anchor))
      error->all(FLERR, "{} anchor {} must be >= 0", who, arg[iarg + 1]);
    iarg += 2;
  } else if (kw == "momentum") {
    s.opt.momentum = number(iarg + 1, "momentum");
    if (s.opt.momentum < 0 || s.opt.momentum >= 1)
      error->all(FLERR, "{} momentum must be in [0,1)", who);
    iarg += 2;
  } else if (kw == "schedule") {
    if (iarg + 2 > narg) MLTorchLmp::missing_args(FLERR, lower + " schedule", error);
    auto &sch = s.schedule;
    sch.kind = arg[iarg + 1];
    if (sch.kind == "constant") {
      iarg += 2;
    } else if (sch.kind == "exp") {
      sch.a = number(iarg + 2, "schedule exp");
      if (!(sch.a > 0 && sch.a <= 1))
        error->all(FLERR, "{} schedule exp gamma must be in (0,1]", who);
      iarg += 3;
    } else if (sch.kind == "step") {
      sch.a = integer(iarg + 2, "schedule step");
      sch.b = number(iarg + 3, "schedule step");
      if (sch.a < 1 || !(sch.b > 0 && sch.b <= 1))
        error->all(FLERR, "{} schedule step needs an interval >= 1 and a factor in (0,1]",
                   who);
      iarg += 4;
    } else if (sch.kind == "cosine") {
      sch.a = integer(iarg + 2, "schedule cosine");
      sch.b = number(iarg + 3, "schedule cosine");
      if (sch.a < 1 || sch.b < 0)
        error->all(FLERR, "{} schedule cosine needs a length >= 1 update and a "
                          "final learning rate >= 0", who);
      iarg += 4;
    } else {
      error->all(FLERR, "{} schedule {} is unknown: use constant, exp, step or cosine", who,
                 sch.kind);
    }
  } else if (kw == "clip") {
    s.clip = number(iarg + 1, "clip");
    if (!(s.clip > 0)) error->all(FLERR, "{} clip must be > 0", who);
    iarg += 2;
  } else if (kw == "train" || kw == "freeze") {
    auto &list = (kw == "train") ? s.train_prefixes : s.freeze_prefixes;
    ++iarg;
    while (iarg < narg && !is_keyword(arg[iarg])) list.emplace_back(arg[iarg++]);
    if (list.empty())
      error->all(FLERR, "{} {} needs parameter name prefixes, e.g. {} nets", who, kw, kw);
  } else if (kw == "energy_shift") {
    if (iarg + 2 > narg) MLTorchLmp::missing_args(FLERR, lower + " energy_shift", error);
    const std::string v = arg[iarg + 1];
    if (v != "fit" && v != "none")
      error->all(FLERR, "{} energy_shift must be fit or none, not '{}'", who, v);
    s.energy_shift = v == "fit" ? 1 : 0;
    iarg += 2;
  }
  return iarg;
}

void FixTorchFinetune::parse_settings(LAMMPS *lmp, int narg, char **arg,
                                      MLTorch::FinetuneSettings &s)
{
  Error *error = lmp->error;
  if (narg < 4) MLTorchLmp::missing_args(FLERR, "fix torch/finetune", error);
  s.nevery = utils::inumeric(FLERR, arg[3], false, lmp);
  if (s.nevery < 1)
    error->all(FLERR, "Fix torch/finetune: training interval N = {} must be >= 1", s.nevery);

  auto number = [&](int i, const char *what) {
    if (i >= narg) MLTorchLmp::missing_args(FLERR, std::string("fix torch/finetune ") + what, error);
    return utils::numeric(FLERR, arg[i], false, lmp);
  };
  auto integer = [&](int i, const char *what) {
    if (i >= narg) MLTorchLmp::missing_args(FLERR, std::string("fix torch/finetune ") + what, error);
    return utils::inumeric(FLERR, arg[i], false, lmp);
  };
  static const std::vector<std::string> keywords{
      "teacher", "weights", "lr", "optimizer", "weight_decay", "anchor", "momentum", "schedule", "clip",
      "accumulate", "max_force_error", "rollback", "save", "log", "check", "train", "freeze",
      "replay", "replay_memory", "uncertainty", "teacher_timeout", "energy_shift", "labels", "dataset", "dataset_weight", "dataset_seed",
      "dataset_memory"};
  auto is_keyword = [&](const char *w) {
    for (const auto &k : keywords)
      if (k == w) return true;
    return false;
  };

  int iarg = 4, next = 0;
  while (iarg < narg) {
    const std::string kw = arg[iarg];
    if (kw == "teacher") {
      if (iarg + 3 > narg)
        error->all(FLERR, "fix torch/finetune teacher needs a pair style and its coefficients, "
                          "e.g. teacher sw \"* * Si.sw Si\", or an i-PI address, e.g. teacher "
                          "ipi \"si 31415 unix\"");
      s.teacher_style = arg[iarg + 1];
      s.teacher_coeff = arg[iarg + 2];
      iarg += 3;
    } else if ((next = parse_training_keyword(lmp, "Fix torch/finetune", narg, arg, iarg, s, is_keyword)) > iarg) {
      iarg = next;
    } else if (kw == "accumulate") {
      s.accumulate = integer(iarg + 1, "accumulate");
      if (s.accumulate < 1) error->all(FLERR, "Fix torch/finetune accumulate must be >= 1");
      iarg += 2;
    } else if (kw == "max_force_error") {
      s.max_force_error = number(iarg + 1, "max_force_error");
      if (!(s.max_force_error > 0)) error->all(FLERR, "Fix torch/finetune max_force_error must be > 0");
      iarg += 2;
    } else if (kw == "rollback") {
      s.rollback_factor = number(iarg + 1, "rollback");
      if (!(s.rollback_factor > 1)) error->all(FLERR, "Fix torch/finetune rollback factor must be > 1");
      iarg += 2;
    } else if (kw == "save") {
      s.save_every = integer(iarg + 1, "save");
      if (iarg + 3 > narg) MLTorchLmp::missing_args(FLERR, "fix torch/finetune save", error);
      s.save_file = arg[iarg + 2];
      if (s.save_every < 0) error->all(FLERR, "Fix torch/finetune save interval must be >= 0");
      iarg += 3;
    } else if (kw == "dataset") {
      if (iarg + 3 > narg) MLTorchLmp::missing_args(FLERR, "fix torch/finetune dataset", error);
      s.dataset_file = arg[iarg + 1];
      s.dataset_per_update = integer(iarg + 2, "dataset");
      if (s.dataset_per_update < 1)
        error->all(FLERR, "Fix torch/finetune dataset {} {}: the configurations per update and "
                          "replica must be >= 1", arg[iarg + 1], arg[iarg + 2]);
      iarg += 3;
    } else if (kw == "dataset_weight") {
      s.dataset_weight = number(iarg + 1, "dataset_weight");
      if (!(s.dataset_weight > 0) || !std::isfinite(s.dataset_weight))
        error->all(FLERR, "Fix torch/finetune dataset_weight must be > 0");
      iarg += 2;
    } else if (kw == "dataset_seed") {
      const bigint seed = utils::bnumeric(FLERR, arg[std::min(iarg + 1, narg - 1)], false, lmp);
      if (iarg + 2 > narg || seed < 0) error->all(FLERR, "Fix torch/finetune dataset_seed must be >= 0");
      s.dataset_seed = static_cast<uint64_t>(seed);
      iarg += 2;
    } else if (kw == "dataset_memory") {
      s.dataset_mbytes = number(iarg + 1, "dataset_memory");
      if (!(s.dataset_mbytes > 0)) error->all(FLERR, "Fix torch/finetune dataset_memory must be > 0 MB");
      iarg += 2;
    } else if (kw == "labels") {
      if (iarg + 2 > narg) MLTorchLmp::missing_args(FLERR, "fix torch/finetune labels", error);
      s.labels_file = arg[iarg + 1];
      iarg += 2;
    } else if (kw == "log") {
      s.log_every = integer(iarg + 1, "log");
      if (s.log_every < 0) error->all(FLERR, "Fix torch/finetune log interval must be >= 0");
      iarg += 2;
    } else if (kw == "check") {
      s.check_every = integer(iarg + 1, "check");
      if (s.check_every < 0) error->all(FLERR, "Fix torch/finetune check interval must be >= 0");
      iarg += 2;
    } else if (kw == "replay") {
      s.replay_capacity = integer(iarg + 1, "replay");
      s.replay_mix = integer(iarg + 2, "replay");
      if (s.replay_capacity < 0 || s.replay_mix < 0 || (s.replay_capacity == 0 && s.replay_mix > 0))
        error->all(FLERR, "Fix torch/finetune replay needs a capacity >= 0 and a mix count >= 0");
      iarg += 3;
    } else if (kw == "uncertainty") {
      s.gate_low = number(iarg + 1, "uncertainty");
      s.gate_high = number(iarg + 2, "uncertainty");
      if (!(s.gate_low >= 0.0) || !(s.gate_high > s.gate_low))
        error->all(FLERR, "Fix torch/finetune uncertainty {} {}: need 0 <= low < high (force "
                          "units: the committee's largest per-atom force deviation)",
                   arg[iarg + 1], arg[iarg + 2]);
      s.gated = true;
      iarg += 3;
    } else if (kw == "teacher_timeout") {
      s.teacher_timeout = number(iarg + 1, "teacher_timeout");
      if (!(s.teacher_timeout > 0) || !std::isfinite(s.teacher_timeout))
        error->all(FLERR, "Fix torch/finetune teacher_timeout must be > 0 seconds");
      iarg += 2;
    } else if (kw == "replay_memory") {
      s.replay_mbytes = number(iarg + 1, "replay_memory");
      if (!(s.replay_mbytes > 0)) error->all(FLERR, "Fix torch/finetune replay_memory must be > 0 MB");
      iarg += 2;
    } else {
      error->all(FLERR, "Unknown fix torch/finetune keyword: {}", kw);
    }
  }
  if (s.teacher_style.empty())
    error->all(FLERR, "Fix torch/finetune needs a reference: teacher <pair style> \"<pair_coeff "
                      "arguments>\" or teacher ipi \"ADDRESS PORT [unix]\"");
  // an external code's total energy has its own zero (pseudopotentials,
  // functional): per-element shifts are fitted unless the user says none
  if (s.energy_shift < 0) s.energy_shift = s.teacher_style == "ipi" ? 1 : 0;
}
