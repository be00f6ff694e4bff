/* ----------------------------------------------------------------------
   LAMMPS - Large-scale Atomic/Molecular Massively Parallel Simulator
   https://www.lammps.org/, Sandia National Laboratories
   LAMMPS development team: developers@lammps.org

   ML-TORCH package: TorchScript machine-learned potentials.
   Distributed under the GNU General Public License, version 2.
------------------------------------------------------------------------- */

/* ----------------------------------------------------------------------
   fix torch/finetune: online fine-tuning of the pair_style torch model.

   Loss of one configuration of N atoms (the atoms the model covers):
     L = wE ((E - Eref)/N)^2 + wF/(3N) sum_i |F_i - Fref_i|^2
         + wS/6 sum_k ((W_k - Wref_k)/N)^2
   Its parameter gradient on a configuration spread over the ranks of a
   replica (DESIGN.md): every rank computes the partial forces of its graph
   (create_graph), LAMMPS reverse communication sums them on the owners,
   owners form the residual weights 2 wF/(3N) R_i, forward communication
   copies them to every ghost image, and each rank back-propagates
   sum_a w_a . partialF_a + cE E_rank + sum_k cW_k W_k,rank with the
   all-reduced energy and virial coefficients. The sum over ranks is the
   gradient of L, whatever the decomposition.

   Replicas (-partition): gradients are summed over the universe and
   divided by the number of configurations, as DistributedDataParallel
   averages over workers; every rank then takes the same optimizer step.
------------------------------------------------------------------------- */

#include "fix_torch_finetune.h"

#include "atom.h"
#include "comm.h"
#include "error.h"
#include "force.h"
#include "lmp_compat.h"
#include "memory.h"
#include "mltorch_mpi.h"
#include "modify.h"
#include "neighbor.h"
#include "pair.h"
#include "pair_torch.h"
#include "timer.h"
#include "universe.h"
#include "platform.h"
#include "update.h"

#include "committee.h"
#include "model.h"
#include "restart_record.h"
#include "training.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <iterator>
#include <limits>

using namespace LAMMPS_NS;
using namespace FixConst;

namespace {
constexpr std::size_t BUCKET_DOUBLES = 1 << 20;    // 8 MB per reduction bucket
constexpr int NSTATS = 7;                          // statistics appended to the gradient

// a failure of a labelling or update step that every rank of the replica
// has agreed on (FixTorchFinetune::fail_if), carried to the point where the
// replicas decide together (FixTorchFinetune::replicas_agree)
struct StepFailure : public std::runtime_error {
  using std::runtime_error::runtime_error;
};

bool starts_with(const std::string &name, const std::string &prefix)
{
  // "nets" selects "nets.0.weight" but not "netsx.weight"
  if (name == prefix) return true;
  return name.size() > prefix.size() && name.compare(0, prefix.size(), prefix) == 0 &&
      name[prefix.size()] == '.';
}
}    // namespace

/* ---------------------------------------------------------------------- */

struct FixTorchFinetune::Replay {
  // this rank's piece of the configuration's graph; nodes [0, n_local) are
  // the atoms this rank owned when the configuration was stored
  int64_t n_nodes = 0, n_local = 0, n_edges = 0;
  std::vector<double> edge_vec;
  std::vector<int64_t> edge_index, species;
  // ghost nodes grouped by the world rank that owned their atom
  std::vector<int64_t> ghost_nodes;
  std::vector<int> send_counts, send_displs;
  // node slots of this rank that every other rank holds ghost copies of
  std::vector<int> recv_slots, recv_counts, recv_displs;
  std::vector<double> fref;    // [n_local][3] teacher forces
  double e_ref = 0.0, w_ref[6] = {0, 0, 0, 0, 0, 0};
  double natoms = 0.0;    // covered atoms of the whole configuration
  // the exchange along this stored piece's owner map, by MPI_Alltoallv, as
  // LAMMPS's forward/reverse comm did when the configuration was stored: the
  // partial forces and residual weights of a replay (width 3), and a layered
  // model's features
  struct Halo : public MLTorch::HaloExchange {
    Halo(const Replay &piece, MPI_Comm comm) : r(piece), world(comm) {}
    void forward(const double *owned, double *all, int w) override
    {
      scale(w);
      out.resize(r.recv_slots.size() * w);
      in.resize(r.ghost_nodes.size() * w);
      for (std::size_t q = 0; q < r.recv_slots.size(); ++q)
        std::memcpy(&out[q * w], owned + static_cast<std::size_t>(r.recv_slots[q]) * w, sizeof(double) * w);
      MPI_Alltoallv(out.data(), rc.data(), rd.data(), MPI_DOUBLE, in.data(), sc.data(), sd.data(),
                    MPI_DOUBLE, world);
      if (r.n_local > 0) std::memcpy(all, owned, sizeof(double) * w * r.n_local);
      for (std::size_t g = 0; g < r.ghost_nodes.size(); ++g)
        std::memcpy(all + r.ghost_nodes[g] * w, &in[g * w], sizeof(double) * w);
    }
    void reverse(const double *all, double *owned, int w) override
    {
      scale(w);
      out.resize(r.recv_slots.size() * w);
      in.resize(r.ghost_nodes.size() * w);
      for (std::size_t g = 0; g < r.ghost_nodes.size(); ++g)
        std::memcpy(&in[g * w], all + r.ghost_nodes[g] * w, sizeof(double) * w);
      MPI_Alltoallv(in.data(), sc.data(), sd.data(), MPI_DOUBLE, out.data(), rc.data(), rd.data(),
                    MPI_DOUBLE, world);
      if (r.n_local > 0) std::memcpy(owned, all, sizeof(double) * w * r.n_local);
      for (std::size_t q = 0; q < r.recv_slots.size(); ++q)
        for (int k = 0; k < w; ++k) owned[static_cast<std::size_t>(r.recv_slots[q]) * w + k] += out[q * w + k];
    }
    // the plan's counts and displacements in values of width w
    void scale(int w)
    {
      const std::size_t np = r.send_counts.size();
      sc.resize(np), sd.resize(np), rc.resize(np), rd.resize(np);
      for (std::size_t p = 0; p < np; ++p) {
        sc[p] = w * r.send_counts[p];
        sd[p] = w * r.send_displs[p];
        rc[p] = w * r.recv_counts[p];
        rd[p] = w * r.recv_displs[p];
      }
    }
    const Replay &r;
    MPI_Comm world;
    std::vector<int> sc, sd, rc, rd;
    std::vector<double> out, in;
  };

  double bytes() const
  {
    return 8.0 * (edge_vec.size() + edge_index.size() + species.size() + ghost_nodes.size() +
                  fref.size()) +
        4.0 * (send_counts.size() + send_displs.size() + recv_slots.size() + recv_counts.size() +
               recv_displs.size()) +
        sizeof(Replay);
  }
};

// the loss of one configuration and its gradient coefficients from the
// configuration's global sums (see the top of this file)
struct LossTerms {
  double loss, de, se_w, cf, ce, dw[6], cw[6];
};

static LossTerms loss_terms(double wE, double wF, double wS, double e, double e_ref,
                            const double *w, const double *w_ref, double se_f, double natoms)
{
  LossTerms t;
  t.de = (e - e_ref) / natoms;
  t.se_w = 0.0;
  for (int k = 0; k < 6; ++k) {
    t.dw[k] = (w[k] - w_ref[k]) / natoms;
    t.se_w += t.dw[k] * t.dw[k];
    t.cw[k] = 2.0 * wS * t.dw[k] / (6.0 * natoms);
  }
  t.loss = wE * t.de * t.de + wF * se_f / (3.0 * natoms) + wS * t.se_w / 6.0;
  t.cf = 2.0 * wF / (3.0 * natoms);
  t.ce = 2.0 * wE * t.de / natoms;
  return t;
}

/* ---------------------------------------------------------------------- */

FixTorchFinetune::FixTorchFinetune(LAMMPS *lmp, int narg, char **arg) :
    Fix(lmp, narg, arg), w_energy(1.0), w_force(1.0), w_stress(0.0),
    opt(std::make_unique<MLTorch::OptimizerSettings>()),
    schedule(std::make_unique<MLTorch::Schedule>()), clip(0.0), accumulate(1), max_force_error(0.0), rollback_factor(0.0),
    save_every(0), log_every(100), check_every(10), replay_capacity(0), replay_mix(0),
    replay_mbytes(256.0), student(nullptr), teacher(nullptr), synced(false),
    pending(0), nupdates(0), nskipped(0), nrollbacks(0), nchecks(0), nconfigs(0), loss_ema(-1.0),
    acc_loss(0), acc_se_e(0), acc_se_f(0), acc_nf(0), acc_se_w(0), acc_n(0), nmax(0),
    fpart(nullptr), resid(nullptr), fref(nullptr), fsave(nullptr), resid_atom(nullptr),
    fmd(nullptr), reverse_target(nullptr),
    stored_this_round(0), replay_warned(false), acc_ngrad(0)
{
  // KOKKOS data masks (a fix's default is everything, synced to the host on
  // every step): empty, because the fix asks the pair for the host data on
  // the steps that label, and only then (post_force)
  datamask_read = 0;
  datamask_modify = 0;
  if (narg < 4) MLTorchCompat::missing_args(FLERR, "fix torch/finetune", error);
  if (igroup != 0)
    error->all(FLERR, "Fix torch/finetune trains on whole configurations: use group 'all', not '{}'",
               arg[1]);
  nevery = utils::inumeric(FLERR, arg[3], false, lmp);
  if (nevery < 1) error->all(FLERR, "Fix torch/finetune: training interval N = {} must be >= 1", nevery);

  auto number = [&](int i, const char *what) {
    if (i >= narg) MLTorchCompat::missing_args(FLERR, std::string("fix torch/finetune ") + what, error);
    return utils::numeric(FLERR, arg[i], false, lmp);
  };
  auto integer = [&](int i, const char *what) {
    if (i >= narg) MLTorchCompat::missing_args(FLERR, std::string("fix torch/finetune ") + what, error);
    return utils::inumeric(FLERR, arg[i], false, lmp);
  };
  static const std::vector<std::string> keywords{
      "teacher", "weights", "lr", "optimizer", "weight_decay", "momentum", "schedule", "clip",
      "accumulate", "max_force_error", "rollback", "save", "log", "check", "train", "freeze",
      "replay", "replay_memory", "uncertainty"};
  auto is_keyword = [&](const char *w) {
    for (const auto &k : keywords)
      if (k == w) return true;
    return false;
  };

  int iarg = 4;
  while (iarg < narg) {
    const std::string kw = arg[iarg];
    if (kw == "teacher") {
      if (iarg + 3 > narg)
        error->all(FLERR, "fix torch/finetune teacher needs a pair style and its coefficients, "
                          "e.g. teacher sw \"* * Si.sw Si\"");
      teacher_style = arg[iarg + 1];
      teacher_coeff = arg[iarg + 2];
      iarg += 3;
    } else if (kw == "weights") {
      w_energy = number(iarg + 1, "weights");
      w_force = number(iarg + 2, "weights");
      w_stress = number(iarg + 3, "weights");
      if (w_energy < 0 || w_force < 0 || w_stress < 0 || w_energy + w_force + w_stress <= 0)
        error->all(FLERR,
                   "Fix torch/finetune weights {} {} {}: energy, force and stress weights must be "
                   ">= 0 and not all zero",
                   w_energy, w_force, w_stress);
      iarg += 4;
    } else if (kw == "lr") {
      opt->lr = number(iarg + 1, "lr");
      if (!(opt->lr > 0.0) || !std::isfinite(opt->lr))
        error->all(FLERR, "Fix torch/finetune learning rate {} must be > 0", arg[iarg + 1]);
      iarg += 2;
    } else if (kw == "optimizer") {
      if (iarg + 2 > narg) MLTorchCompat::missing_args(FLERR, "fix torch/finetune optimizer", error);
      opt->kind = arg[iarg + 1];
      if (opt->kind != "adam" && opt->kind != "adamw" && opt->kind != "sgd")
        error->all(FLERR, "Fix torch/finetune optimizer {} is unknown: use adam, adamw or sgd",
                   opt->kind);
      iarg += 2;
    } else if (kw == "weight_decay") {
      opt->weight_decay = number(iarg + 1, "weight_decay");
      if (opt->weight_decay < 0) error->all(FLERR, "Fix torch/finetune weight_decay must be >= 0");
      iarg += 2;
    } else if (kw == "momentum") {
      opt->momentum = number(iarg + 1, "momentum");
      if (opt->momentum < 0 || opt->momentum >= 1)
        error->all(FLERR, "Fix torch/finetune momentum must be in [0,1)");
      iarg += 2;
    } else if (kw == "schedule") {
      if (iarg + 2 > narg) MLTorchCompat::missing_args(FLERR, "fix torch/finetune schedule", error);
      auto &sch = *schedule;
      sch.kind = arg[iarg + 1];
      if (sch.kind == "constant") {
        iarg += 2;
      } else if (sch.kind == "exp") {
        sch.a = number(iarg + 2, "schedule exp");
        if (!(sch.a > 0 && sch.a <= 1))
          error->all(FLERR, "Fix torch/finetune schedule exp gamma must be in (0,1]");
        iarg += 3;
      } else if (sch.kind == "step") {
        sch.a = integer(iarg + 2, "schedule step");
        sch.b = number(iarg + 3, "schedule step");
        if (sch.a < 1 || !(sch.b > 0 && sch.b <= 1))
          error->all(FLERR, "Fix torch/finetune schedule step needs an interval >= 1 and a "
                            "factor in (0,1]");
        iarg += 4;
      } else if (sch.kind == "cosine") {
        sch.a = integer(iarg + 2, "schedule cosine");
        sch.b = number(iarg + 3, "schedule cosine");
        if (sch.a < 1 || sch.b < 0)
          error->all(FLERR, "Fix torch/finetune schedule cosine needs a length >= 1 update and a "
                            "final learning rate >= 0");
        iarg += 4;
      } else {
        error->all(FLERR, "Fix torch/finetune schedule {} is unknown: use constant, exp, step or "
                          "cosine", sch.kind);
      }
    } else if (kw == "clip") {
      clip = number(iarg + 1, "clip");
      if (!(clip > 0)) error->all(FLERR, "Fix torch/finetune clip must be > 0");
      iarg += 2;
    } else if (kw == "accumulate") {
      accumulate = integer(iarg + 1, "accumulate");
      if (accumulate < 1) error->all(FLERR, "Fix torch/finetune accumulate must be >= 1");
      iarg += 2;
    } else if (kw == "max_force_error") {
      max_force_error = number(iarg + 1, "max_force_error");
      if (!(max_force_error > 0)) error->all(FLERR, "Fix torch/finetune max_force_error must be > 0");
      iarg += 2;
    } else if (kw == "rollback") {
      rollback_factor = number(iarg + 1, "rollback");
      if (!(rollback_factor > 1)) error->all(FLERR, "Fix torch/finetune rollback factor must be > 1");
      iarg += 2;
    } else if (kw == "save") {
      save_every = integer(iarg + 1, "save");
      if (iarg + 3 > narg) MLTorchCompat::missing_args(FLERR, "fix torch/finetune save", error);
      save_file = arg[iarg + 2];
      if (save_every < 0) error->all(FLERR, "Fix torch/finetune save interval must be >= 0");
      iarg += 3;
    } else if (kw == "log") {
      log_every = integer(iarg + 1, "log");
      if (log_every < 0) error->all(FLERR, "Fix torch/finetune log interval must be >= 0");
      iarg += 2;
    } else if (kw == "check") {
      check_every = integer(iarg + 1, "check");
      if (check_every < 0) error->all(FLERR, "Fix torch/finetune check interval must be >= 0");
      iarg += 2;
    } else if (kw == "train" || kw == "freeze") {
      auto &list = (kw == "train") ? train_prefixes : freeze_prefixes;
      ++iarg;
      while (iarg < narg && !is_keyword(arg[iarg])) list.emplace_back(arg[iarg++]);
      if (list.empty())
        error->all(FLERR, "Fix torch/finetune {} needs parameter name prefixes, e.g. {} nets", kw, kw);
    } else if (kw == "replay") {
      replay_capacity = integer(iarg + 1, "replay");
      replay_mix = integer(iarg + 2, "replay");
      if (replay_capacity < 0 || replay_mix < 0 || (replay_capacity == 0 && replay_mix > 0))
        error->all(FLERR, "Fix torch/finetune replay needs a capacity >= 0 and a mix count >= 0");
      iarg += 3;
    } else if (kw == "uncertainty") {
      gate_low = number(iarg + 1, "uncertainty");
      gate_high = number(iarg + 2, "uncertainty");
      if (!(gate_low >= 0.0) || !(gate_high > gate_low))
        error->all(FLERR, "Fix torch/finetune uncertainty {} {}: need 0 <= low < high (force "
                          "units: the committee's largest per-atom force deviation)",
                   arg[iarg + 1], arg[iarg + 2]);
      gated = true;
      iarg += 3;
    } else if (kw == "replay_memory") {
      replay_mbytes = number(iarg + 1, "replay_memory");
      if (!(replay_mbytes > 0)) error->all(FLERR, "Fix torch/finetune replay_memory must be > 0 MB");
      iarg += 2;
    } else {
      error->all(FLERR, "Unknown fix torch/finetune keyword: {}", kw);
    }
  }
  if (teacher_style.empty())
    error->all(FLERR, "Fix torch/finetune needs a reference: teacher <pair style> \"<pair_coeff "
                      "arguments>\"");

  // the student: the pair_style torch model the MD runs with
  student = dynamic_cast<PairTorch *>(force->pair_match("^torch", 0));
  if (!student && force->pair_match("^torch", 0, 2))
    error->all(FLERR, "Fix torch/finetune trains one model, but pair_style hybrid has several torch "
                      "sub-styles; train them in separate runs, each with one torch sub-style");
  if (!student || !student->model())
    error->all(FLERR, "Fix torch/finetune requires pair_style torch with its pair_coeff defined "
                      "before the fix");
  model_ = student->shared_model();
  model_path = student->model_path();
  model_hash = student->model_hash();
  for (int m = 0; m < student->committee_size(); ++m) {
    members.push_back(student->member(m));
    member_hashes.push_back(student->member_hash(m));
  }
  if (gated && members.size() < 2)
    error->all(FLERR, "Fix torch/finetune uncertainty needs a committee: list 2 or more model "
                      "files in pair_coeff (pair_coeff * * model1.pt model2.pt ... elements)");
  if (atom->torque_flag)
    error->all(FLERR, "Fix torch/finetune supports point particles only (this atom style has "
                      "torques)");

  parse_teacher();
  setup_trainable();

  vector_flag = 1;
  size_vector = 17;
  peratom_flag = 1;
  size_peratom_cols = 0;
  peratom_freq = nevery;
  grow_arrays(atom->nmax);
  atom->add_callback(Atom::GROW);
  for (int i = 0; i < atom->nmax; ++i) resid_atom[i] = 0.0;
  global_freq = nevery;
  extvector = 0;
  restart_global = 1;
  comm_forward = 3;
  comm_reverse = 3;
  maxexchange = 1;    // pack_exchange: the per-atom |F - F_ref|
  for (double &v : vec) v = 0.0;
}

/* ---------------------------------------------------------------------- */

FixTorchFinetune::~FixTorchFinetune()
{
  if (modify->get_fix_by_id(id)) atom->delete_callback(id, Atom::GROW);
  memory->destroy(resid_atom);
  delete teacher;
  memory->destroy(fpart);
  memory->destroy(resid);
  memory->destroy(fref);
  memory->destroy(fsave);
  memory->destroy(fmd);
}

/* ---------------------------------------------------------------------- */

int FixTorchFinetune::setmask()
{
  // PRE_FORCE only for setup_pre_force(): the replicas' collective check at
  // the start of every run (pre_force itself does nothing)
  return PRE_FORCE | POST_FORCE;
}

/* ----------------------------------------------------------------------
   the teacher: a private pair style instance, not the one MD runs with
------------------------------------------------------------------------- */

void FixTorchFinetune::parse_teacher()
{
  auto style_words = utils::split_words(teacher_style);
  if (style_words.empty()) error->all(FLERR, "Fix torch/finetune teacher: empty pair style");
  const std::string &style = style_words[0];
  if (force->pair_map->find(style) == force->pair_map->end())
    error->all(FLERR, "Fix torch/finetune teacher: unknown pair style '{}' (is its package "
                      "installed in this LAMMPS?)", style);
  if (utils::strmatch(style, "^hybrid"))
    error->all(FLERR, "Fix torch/finetune teacher: pair style {} is not supported as a teacher",
               style);

  int sflag = 0;
  teacher = force->new_pair(style, 0, sflag);
  std::vector<std::string> sargs(style_words.begin() + 1, style_words.end());
  std::vector<char *> sargv;
  for (auto &a : sargs) sargv.push_back(a.data());
  teacher->settings(static_cast<int>(sargv.size()), sargv.data());

  // several pair_coeff lines are separated by ';'
  int ncoeff = 0;
  std::vector<std::string> lines{""};
  for (char c : teacher_coeff) {
    if (c == ';')
      lines.emplace_back();
    else
      lines.back() += c;
  }
  for (const auto &line : lines) {
    auto words = utils::split_words(line);
    if (words.empty()) continue;
    if (words.size() < 2)
      error->all(FLERR, "Fix torch/finetune teacher coefficients '{}' need at least the two "
                        "atom types, like a pair_coeff command", line);
    std::vector<char *> cargv;
    for (auto &w : words) cargv.push_back(w.data());
    teacher->coeff(static_cast<int>(cargv.size()), cargv.data());
    ++ncoeff;
  }
  if (ncoeff == 0) error->all(FLERR, "Fix torch/finetune teacher: no pair coefficients given");
  // a torch teacher is a private instance, not a pair_style hybrid sub-style
  if (auto *t = dynamic_cast<PairTorch *>(teacher)) t->set_private_instance();
}

/* ----------------------------------------------------------------------
   trainable parameters from the train/freeze prefixes
------------------------------------------------------------------------- */

void FixTorchFinetune::setup_trainable()
{
  const auto names = model_->parameter_names();
  std::vector<bool> mask(names.size(), train_prefixes.empty());
  for (const auto &pre : train_prefixes) {
    bool found = false;
    for (std::size_t k = 0; k < names.size(); ++k)
      if (starts_with(names[k], pre)) mask[k] = found = true;
    if (!found)
      error->all(FLERR, "Fix torch/finetune train {}: no model parameter is named {} or {}.*; "
                        "parameters: {}", pre, pre, pre, MLTorchMPI::join_words(names));
  }
  for (const auto &pre : freeze_prefixes) {
    bool found = false;
    for (std::size_t k = 0; k < names.size(); ++k)
      if (starts_with(names[k], pre)) {
        mask[k] = false;
        found = true;
      }
    if (!found)
      error->all(FLERR, "Fix torch/finetune freeze {}: no model parameter is named {} or {}.*; "
                        "parameters: {}", pre, pre, pre, MLTorchMPI::join_words(names));
  }
  for (auto &m : members) {
    if (m->parameter_names() != names)
      error->all(FLERR, "Fix torch/finetune: committee member {} has other parameters than the "
                        "first model; a committee it trains needs models of one architecture",
                 student->member_path(static_cast<int>(&m - members.data())));
    m->set_trainable(mask);
  }
  const bigint ntrain = model_->num_trainable();
  if (ntrain == 0)
    error->all(FLERR, "Fix torch/finetune: nothing to train: model {} has {} parameters and the "
                      "train/freeze keywords and the file's own frozen parameters (requires_grad "
                      "false) leave none trainable",
               model_path, model_->num_parameters());
  try {
    training = std::make_unique<MLTorch::TrainingState>(members, *opt);
  } catch (std::exception &e) {
    error->all(FLERR, "Fix torch/finetune: {}", e.what());
  }
  if (comm->me == 0) {
    utils::logmesg(lmp, "fix torch/finetune: training {} of {} parameters of {} with {} "
                        "(lr {}), every {} steps, {} configuration(s) per update and replica\n",
                   ntrain, model_->num_parameters(), model_path, opt->kind, opt->lr,
                   nevery, accumulate);
    if (members.size() > 1)
      utils::logmesg(lmp, "fix torch/finetune: all {} committee members train on the labels, "
                          "each with its own optimizer\n", members.size());
    if (gated)
      utils::logmesg(lmp, "fix torch/finetune: labels only configurations whose committee force "
                          "deviation lies in [{}, {})\n", gate_low, gate_high);
  }
}

/* ----------------------------------------------------------------------
   DDP set-up: same model and same settings on every replica, then the
   parameters of universe rank 0 everywhere
------------------------------------------------------------------------- */

void FixTorchFinetune::check_replicas_consistent(bool broadcast)
{
  // a command that stops one partition by itself (its own clock, its own
  // condition) would leave the other replicas waiting in the next gradient
  // reduction: refused with replicas, decided over the universe because one
  // partition alone may hold it
  if (universe->nworlds > 1) {
    std::string stopper;
    if (timer->has_timeout()) stopper = "timer timeout";
    for (int i = 0; i < modify->nfix; ++i)
      if (utils::strmatch(modify->fix[i]->style, "^halt"))
        stopper = fmt::format("fix {} ({})", modify->fix[i]->id, modify->fix[i]->style);
    int mine = stopper.empty() ? 0 : 1, any = 0;
    MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, universe->uworld);
    if (any)
      error->all(FLERR,
                 "Fix torch/finetune with {} partitions: {} stops one partition on its own, so "
                 "the replicas would leave the run at different steps and the others would wait "
                 "forever in the next gradient reduction; with replicas, stop all of them at one "
                 "step (a run length that every partition computes alike, e.g. from a file that "
                 "partition 0 writes one chunk ahead: examples/slurm/in.finetune)",
                 universe->nworlds, stopper.empty() ? "'timer timeout' or fix halt in another partition" : stopper);
  }
  // everything that decides when a universe-wide collective happens or what
  // the optimizer does: the model, the settings, the counters and the phase
  // of the training schedule (collectives of replicas must pair up)
  std::string mask;
  for (bool t : model_->trainable()) mask += t ? '1' : '0';
  std::string hashes;
  for (const auto &h : member_hashes) hashes += h + " ";
  std::string mine = fmt::format(
      "model {} trainable {} | uncertainty {} {} {} | N {} accumulate {} replay {} check {} save {} {} | {} lr {} wd {} "
      "momentum {} schedule {} {} {} clip {} max_force_error {} rollback {} weights {} {} {} | "
      "updates {} skipped {} rollbacks {} pending {} phase {} | run {} steps from {} to {}",
      hashes, MLTorch::content_hash(mask), gated ? 1 : 0, gate_low, gate_high, nevery, accumulate, replay_mix,
      check_every, save_every, save_file.empty() ? 0 : 1, opt->kind, opt->lr, opt->weight_decay,
      opt->momentum, schedule->kind, schedule->a, schedule->b, clip, max_force_error, rollback_factor, w_energy,
      w_force, w_stress, nupdates, nskipped, nrollbacks, pending, update->ntimestep % nevery,
      update->nsteps, update->firststep, update->laststep);
  std::string first, other;
  const int r = MLTorchMPI::first_differing_rank(mine, universe->uworld, first, other);
  if (r >= 0)
    error->all(FLERR,
               "Fix torch/finetune: replicas disagree on the model, the training settings or "
               "the training state ('{}' on universe rank 0, '{}' on universe rank {}); every "
               "partition must load the same model file, use the same fix settings and run "
               "the same steps",
               utils::trim(first), utils::trim(other), r);
  if (!broadcast) return;

  // parameters, buffers and optimizer/rollback state of universe rank 0
  // (DDP's initial broadcast)
  std::string state = training->parameters(), optim = training->optimizer_state();
  std::string good = training->good_parameters(), good_opt = training->good_optimizer_state();
  for (std::string *bytes : {&state, &optim, &good, &good_opt})
    MLTorchMPI::broadcast_bytes(*bytes, 0, universe->uworld);
  MPI_Bcast(&loss_ema, 1, MPI_DOUBLE, 0, universe->uworld);
  std::string failure;
  try {
    training->load_parameters(state);
    training->load_optimizer_state(optim);
    training->load_good(good, good_opt);
  } catch (std::exception &e) {
    failure = fmt::format("Fix torch/finetune: cannot take the parameters of universe rank 0: {}",
                          e.what());
  }
  MLTorchMPI::stop_collectively(error, universe->uworld, failure.empty(), failure);
}

/* ----------------------------------------------------------------------
   failures inside the collective sequences of a labelling or update step
   (the model's own exceptions, out of memory, data no model covers):
   decided collectively, so that in library or Python mode, where an ERROR
   throws instead of aborting, no rank or replica is left waiting in a
   collective that the failing one skips. fail_if() is called by every rank
   of the replica at the same point: when any failed, all throw StepFailure
   with the lowest failing rank's message. replicas_agree() is called by
   every rank of every replica at the same point with what they agreed:
   when one replica failed, every replica stops with its message.
------------------------------------------------------------------------- */

void FixTorchFinetune::fail_if(const std::string &mine)
{
  const std::string text = MLTorchMPI::first_failure(world, mine.empty(), mine);
  if (!text.empty()) throw StepFailure(text);
}

void FixTorchFinetune::agreed_call(const char *what, const std::function<void()> &work)
{
  std::string failure;
  try {
    work();
  } catch (std::exception &e) {
    failure = fmt::format("Fix torch/finetune{} on step {}: {}", what, update->ntimestep, e.what());
  }
  fail_if(failure);
}

void FixTorchFinetune::replicas_agree(const std::string &agreed)
{
  // one replica: its ranks agreed already, no further collective needed
  if (universe->nworlds == 1) {
    if (!agreed.empty()) error->all(FLERR, agreed);
    return;
  }
  const std::string text =
      agreed.empty() ? agreed : fmt::format("{} (in partition {})", agreed, universe->iworld + 1);
  MLTorchMPI::stop_collectively(error, universe->uworld, text.empty(), text, false);
}

/* ---------------------------------------------------------------------- */

void FixTorchFinetune::init()
{
  // the pair style must still run the model this fix trains (the same
  // object: a reloaded file, another pair style in between, or a new
  // pair_coeff all give another one)
  auto *pair = dynamic_cast<PairTorch *>(force->pair_match("^torch", 0));
  bool same = pair && pair->committee_size() == static_cast<int>(members.size());
  for (std::size_t m = 0; same && m < members.size(); ++m)
    same = pair->member(static_cast<int>(m)) == members[m];
  if (!same)
    error->all(FLERR, "Fix torch/finetune: the pair_style torch model changed after the fix was "
                      "defined; unfix and define the fix again after the new pair_coeff");
  student = pair;
  if (force->newton_pair == 0)
    error->all(FLERR, "Fix torch/finetune requires newton pair on");
  // the fix acts on the full force of a step (post_force); rRESPA splits it
  if (utils::strmatch(update->integrate_style, "^respa"))
    error->all(FLERR, "Fix torch/finetune does not support run_style respa; use run_style verlet");

  // The teacher labels the whole system; in a pair_style hybrid run the fix
  // subtracts the other sub-styles' forces, energy and virial, so the model
  // learns its own share. So the teacher needs every type pair.
  const int ntypes = atom->ntypes;
  for (int i = 1; i <= ntypes; ++i)
    for (int j = i; j <= ntypes; ++j)
      if (!teacher->setflag[i][j])    // (LAMMPS sets the i <= j half only)
        error->all(FLERR,
                   "Fix torch/finetune teacher: its coefficients leave atom types {} and {} "
                   "without interaction; the teacher must describe the whole system (no NULL "
                   "elements): with pair_style hybrid the fix removes the other sub-styles' share",
                   i, j);
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

  // the teacher gets its own neighbor list; it must fit in the ghost shell
  teacher->init();
  // LAMMPS sizes its communication buffers from force->pair and the fixes:
  // the teacher (not force->pair) communicates through them too (e.g. eam
  // 1/1, meam 38/30 values per atom, a layered torch model its features)
  comm_forward = std::max(3, teacher->comm_forward);
  comm_reverse = std::max(3, teacher->comm_reverse);
  const double skin = neighbor->skin;
  const double cut_student = force->pair->cutforce;
  const double cut_teacher = teacher->cutforce;
  if (cut_teacher > cut_student && teacher->ghostneigh)
    error->all(FLERR,
               "Fix torch/finetune: teacher {} needs neighbors of ghost atoms and has cutoff {}, "
               "longer than the model's {}; LAMMPS builds ghost-atom lists to the MD pair style's "
               "cutoff only: use a teacher with a cutoff <= {}",
               teacher_style, cut_teacher, cut_student, cut_student);
  if (cut_teacher > cut_student) {
    const double need = cut_teacher + skin;
    const double have = MAX(comm->cutghostuser, cut_student + skin);
    if (have < need)
      error->all(FLERR,
                 "Fix torch/finetune: teacher {} has cutoff {} but the model's cutoff is {}: ghost "
                 "atoms reach only {}; add 'comm_modify cutoff {}' (teacher cutoff + skin) to the "
                 "input before the run",
                 teacher_style, cut_teacher, cut_student, have, need);
    MLTorchCompat::set_request_cutoff(neighbor, teacher, cut_teacher);
  }

  // fixes that overwrite forces in post_force must act after this fix,
  // which adds the updated model's force change to f
  bool after = false;
  for (int i = 0; i < modify->nfix; ++i) {
    if (modify->fix[i] == this) {
      after = true;
      continue;
    }
    if (after) continue;
    const std::string style = modify->fix[i]->style;
    for (const char *s : {"setforce", "aveforce", "freeze", "lineforce", "planeforce", "enforce2d"})
      if (utils::strmatch(style, std::string("^") + s) && comm->me == 0)
        error->warning(FLERR, "Fix torch/finetune: fix {} ({}) is defined before it and sets "
                              "forces; define fix torch/finetune first so that it acts on the "
                              "forces of the updated model", modify->fix[i]->id, style);
  }
}

/* ---------------------------------------------------------------------- */

void FixTorchFinetune::setup(int /*vflag*/)
{
  grow_work();
}

/* ----------------------------------------------------------------------
   the start of a run, before its first forces: the only place besides the
   updates where all replicas meet (DDP also needs them in step here).
   init() must not meet them: write_restart, write_data, velocity, run 0 ...
   call it, and an input may issue those in some partitions only.
   Every run: the replicas still agree, including on the length of this run
   (a replica out of step meets the others' next run and stops with an
   ERROR); the first run also takes the parameters and optimizer state of
   universe rank 0, before the forces are computed with them
------------------------------------------------------------------------- */

void FixTorchFinetune::setup_pre_force(int /*vflag*/)
{
  check_replicas_consistent(!synced);
  synced = true;
}

/* ---------------------------------------------------------------------- */

void FixTorchFinetune::grow_work()
{
  if (atom->nmax > nmax) {
    nmax = atom->nmax;
    memory->destroy(fpart);
    memory->destroy(resid);
    memory->destroy(fref);
    memory->destroy(fsave);
    memory->destroy(fmd);
    memory->create(fmd, nmax, 3, "torch/finetune:fmd");
    memory->create(fpart, nmax, 3, "torch/finetune:fpart");
    memory->create(resid, nmax, 3, "torch/finetune:resid");
    memory->create(fref, nmax, 3, "torch/finetune:fref");
    memory->create(fsave, nmax, 3, "torch/finetune:fsave");
  }
}

/* ----------------------------------------------------------------------
   reference labels: the teacher's forces on the owned atoms (ghost
   contributions reverse-communicated), its energy and virial on this rank.
   The MD forces are set aside and put back untouched.
------------------------------------------------------------------------- */

void FixTorchFinetune::teacher_labels(double &e_ref, double *w_ref)
{
  const int nall = atom->nlocal + atom->nghost;
  double **f = atom->f;
  if (nall > 0) {
    std::memcpy(&fsave[0][0], &f[0][0], sizeof(double) * 3 * nall);
    std::memset(&f[0][0], 0, sizeof(double) * 3 * nall);
  }
  // the other hybrid sub-styles go in first with the opposite sign: the
  // labels are the teacher's minus their share (their lists are this step's)
  double e_other = 0.0, w_other[6] = {0, 0, 0, 0, 0, 0};
  if (!others.empty()) {
    for (Pair *p : others) {
      p->compute(ENERGY_GLOBAL, VIRIAL_PAIR);
      e_other += p->eng_vdwl + p->eng_coul;
      for (int k = 0; k < 6; ++k) w_other[k] += p->virial[k];
    }
    for (int i = 0; i < nall; ++i)
      for (int k = 0; k < 3; ++k) f[i][k] = -f[i][k];
  }
  teacher->compute(ENERGY_GLOBAL, VIRIAL_PAIR);
  // the ghost shares of the labels to their owners by the fix's own reverse
  // communication: forces only (the atom style's reverse comm would also sum
  // torques or other per-atom data a second time), and on the host where the
  // teacher wrote them (with KOKKOS device communication CommKokkos would
  // sum the device copy of f instead)
  reverse_target = atom->f;
  MLTorchCompat::reverse_comm(comm, this);
  f = atom->f;
  if (atom->nlocal > 0) std::memcpy(&fref[0][0], &f[0][0], sizeof(double) * 3 * atom->nlocal);
  if (nall > 0) std::memcpy(&f[0][0], &fsave[0][0], sizeof(double) * 3 * nall);
  e_ref = teacher->eng_vdwl + teacher->eng_coul - e_other;
  for (int k = 0; k < 6; ++k) w_ref[k] = teacher->virial[k] - w_other[k];
}

/* ---------------------------------------------------------------------- */

void FixTorchFinetune::post_force(int /*vflag*/)
{
  if (update->ntimestep % nevery) return;
  const double t_start = platform::walltime();
  // with KOKKOS: per-atom data to the host on labelling steps only (the
  // fix's data masks are empty, so LAMMPS syncs nothing for it otherwise)
  student->sync_host_for_fix();
  grow_work();
  // this step's graph, built once; it stays valid through the update
  MLTorch::GraphInput in;
  bool built = false, labelled = false;
  std::string failure;
  try {
    if (!gated || gate_says_label()) {
      student->training_graph(in);
      built = true;
      train_current(in);
      labelled = true;
    }
  } catch (StepFailure &e) {
    failure = e.what();
  }
  // before any reduction of the replicas: a failure in one stops all
  replicas_agree(failure);
  if (++pending >= accumulate) {
    if (!built) student->training_graph(in);
    // the MD model's forces before the update: from labelling (member 1 is
    // the MD model) or from the pair style's force call of this step
    double **before = fpart;
    if (!labelled || student->md_on_mean()) {
      md_forces(in, fmd, student->md_output());
      before = fmd;
    }
    const bigint before_events = nupdates + nrollbacks;
    take_step();
    if (nupdates + nrollbacks != before_events) refresh_forces(in, before);
  }
  student->host_forces_modified();
  time_update += platform::walltime() - t_start;
}

/* ----------------------------------------------------------------------
   the MD model's forces on the owned atoms (ghost shares summed by reverse
   comm) from its output on this graph, evaluated here if not given
------------------------------------------------------------------------- */

void FixTorchFinetune::md_forces(const MLTorch::GraphInput &in, double **dst,
                                 const MLTorch::GraphOutput *given)
{
  const int nall = atom->nlocal + atom->nghost;
  MLTorch::GraphOutput out;
  if (!given) {
    student->evaluate_md(in, out);
    given = &out;
  }
  if (nall > 0) {
    std::memset(&dst[0][0], 0, sizeof(double) * 3 * nall);
    student->add_edge_forces(given->edge_grad.data(), &dst[0][0], 3);
  }
  reverse_target = dst;
  MLTorchCompat::reverse_comm(comm, this);
}

/* ----------------------------------------------------------------------
   uncertainty gating: the committee's largest per-atom force deviation of
   this replica's configuration decides (the same on all its ranks)
------------------------------------------------------------------------- */

bool FixTorchFinetune::gate_says_label()
{
  const auto &d = student->committee_deviation();
  const int nlocal = atom->nlocal;
  const int *type = atom->type;
  double mx = 0.0, gmx = 0.0;
  for (int i = 0; i < nlocal; ++i)
    if (student->species_of_type(type[i]) >= 0)
      mx = std::max(mx, std::isnan(d.atom[2 * i]) ? INFINITY : d.atom[2 * i]);
  MPI_Allreduce(&mx, &gmx, 1, MPI_DOUBLE, MPI_MAX, world);
  last_devi = gmx;
  switch (MLTorch::gate(gmx, gate_low, gate_high)) {
    case MLTorch::Gate::Known:
      ++nknown;
      return false;
    case MLTorch::Gate::Skip:
      ++nabove;
      return false;
    default:
      return true;
  }
}

/* ----------------------------------------------------------------------
   after the parameters changed: replace the model's share of this step's
   MD forces by the new model's, so the half-kicks use the model a fresh
   force call (e.g. the set-up of the next run) would give; the trajectory
   then does not depend on where runs or restarts split it
------------------------------------------------------------------------- */

void FixTorchFinetune::refresh_forces(const MLTorch::GraphInput &in, double **before)
{
  student->committee_changed();
  md_forces(in, resid, nullptr);
  double **f = atom->f;
  const int nlocal = atom->nlocal;
  for (int i = 0; i < nlocal; ++i)
    for (int k = 0; k < 3; ++k) f[i][k] += resid[i][k] - before[i][k];
}

/* ----------------------------------------------------------------------
   one labelled configuration: the current atoms
------------------------------------------------------------------------- */

void FixTorchFinetune::train_current(const MLTorch::GraphInput &in)
{
  const int nlocal = atom->nlocal;
  const int nall = nlocal + atom->nghost;
  const int *type = atom->type;
  const auto &node2atom = student->graph_atoms();

  // the labels, once for all members
  double e_ref_part = 0.0, w_ref_part[6];
  teacher_labels(e_ref_part, w_ref_part);
  ++ncalls;

  // every member learns the labels (the last one treated is member 1, the
  // MD model: fpart keeps its forces and the statistics are its own)
  double loss = 0.0, de = 0.0, se_w = 0.0, se_f = 0.0, natoms = 0.0;
  for (int m = static_cast<int>(members.size()) - 1; m >= 0; --m) {
    MLTorch::Model &model = *members[m];
    // stage 1: partial forces of this rank's graph
    double e_part = 0.0, w_part[6];
    auto &node_forces = node_buf;
    agreed_call("", [&] { model.forward_train(in, e_part, node_forces, w_part); });

    // full model forces on the owners: LAMMPS reverse communication
    if (nall > 0) std::memset(&fpart[0][0], 0, sizeof(double) * 3 * nall);
    for (int64_t n = 0; n < in.n_nodes; ++n) {
      const int a = node2atom[n];
      for (int k = 0; k < 3; ++k) fpart[a][k] += node_forces[3 * n + k];
    }
    reverse_target = fpart;
    MLTorchCompat::reverse_comm(comm, this);

    // per-replica sums: energies, virials, covered atoms, squared force residual
    double local[16] = {0.0};
    local[0] = e_part;
    local[1] = e_ref_part;
    for (int k = 0; k < 6; ++k) {
      local[2 + k] = w_part[k];
      local[8 + k] = w_ref_part[k];
    }
    for (int i = 0; i < nlocal; ++i) {
      if (student->species_of_type(type[i]) < 0) continue;
      local[14] += 1.0;
      for (int k = 0; k < 3; ++k) {
        const double r = fpart[i][k] - fref[i][k];
        local[15] += r * r;
      }
    }
    double sum[16];
    MPI_Allreduce(local, sum, 16, MPI_DOUBLE, MPI_SUM, world);
    natoms = sum[14];
    // the same sum on every rank of the replica, so all of them throw
    if (natoms < 1.0)
      throw StepFailure(fmt::format("Fix torch/finetune on step {}: no atom of a type the model "
                                    "covers; nothing to train on", update->ntimestep));
    const auto t = loss_terms(w_energy, w_force, w_stress, sum[0], sum[1], sum + 2, sum + 8,
                              sum[15], natoms);

    // stage 2: residual weights on owners, copied to ghost images by LAMMPS
    // forward communication, then the weighted backward pass on every rank
    for (int i = 0; i < nlocal; ++i) {
      const bool covered = student->species_of_type(type[i]) >= 0;
      for (int k = 0; k < 3; ++k) resid[i][k] = covered ? t.cf * (fpart[i][k] - fref[i][k]) : 0.0;
    }
    MLTorchCompat::forward_comm(comm, this);
    auto &weights = weight_buf;
    weights.resize(3 * in.n_nodes);
    for (int64_t n = 0; n < in.n_nodes; ++n)
      for (int k = 0; k < 3; ++k) weights[3 * n + k] = resid[node2atom[n]][k];
    agreed_call("", [&] { model.backward_train(weights, t.ce, t.cw); });
    if (m > 0) continue;

    loss = t.loss;
    de = t.de;
    se_w = t.se_w;
    se_f = sum[15];
    // the labels (tests and tools) and the per-atom residual of member 1
    lab_energy = sum[1];
    for (int k = 0; k < 6; ++k) lab_virial[k] = sum[8 + k];
    lab_tags.assign(atom->tag, atom->tag + nlocal);
    lab_forces.assign(&fref[0][0], &fref[0][0] + 3 * nlocal);
    for (int i = 0; i < nlocal; ++i) {
      double r2 = 0.0;
      for (int k = 0; k < 3; ++k) r2 += (fpart[i][k] - fref[i][k]) * (fpart[i][k] - fref[i][k]);
      resid_atom[i] = student->species_of_type(type[i]) >= 0 ? std::sqrt(r2) : 0.0;
    }
    if (replay_capacity > 0) store_replay(in, sum[1], sum + 8, natoms);
  }

  acc_loss += loss;
  acc_se_e += de * de;
  acc_se_f += se_f;
  acc_nf += 3.0 * natoms;
  acc_se_w += se_w / 6.0;
  acc_n += 1.0;
  acc_ngrad += 1.0;
  ++nconfigs;
}

/* ----------------------------------------------------------------------
   keep this rank's piece of the configuration just trained on for replay.
   LAMMPS's ghost exchange pattern of this step is gone once atoms move, so
   the piece records, for each ghost node, the world rank and node slot of
   its owner; replays exchange partial forces and residuals along that map
   with MPI_Alltoallv (the same sums LAMMPS's reverse/forward comm do now).
------------------------------------------------------------------------- */

void FixTorchFinetune::store_replay(const MLTorch::GraphInput &in, double e_ref,
                                    const double *w_ref, double natoms)
{
  const auto &node2atom = student->graph_atoms();
  const int nall = atom->nlocal + atom->nghost;
  const int nprocs = comm->nprocs;
  // The piece evicted by the previous store is refilled: in a full buffer
  // every store evicts one, so the buffer's vectors stop going back to
  // malloc. Freeing and allocating pieces of a slightly different size at
  // every update fragments the heap, and the resident size creeps up over a
  // long run. Vectors grow with 25% headroom, so that a piece a little
  // larger than the last fits too; the memory bound counts the values.
  std::unique_ptr<Replay> r = spare_replay ? std::move(spare_replay) : std::make_unique<Replay>();
  auto room = [](auto &vec, std::size_t n) {
    if (vec.capacity() < n) vec.reserve(n + n / 4);
  };
  auto fill = [&room](auto &vec, const auto *first, std::size_t n) {
    room(vec, n);
    vec.assign(first, first + n);
  };
  r->n_nodes = in.n_nodes;
  r->n_local = in.n_local;
  r->n_edges = in.n_edges;
  fill(r->edge_vec, in.edge_vectors, 3 * in.n_edges);
  fill(r->edge_index, in.edge_index, 2 * in.n_edges);
  fill(r->species, in.species, in.n_nodes);
  r->e_ref = e_ref;
  for (int k = 0; k < 6; ++k) r->w_ref[k] = w_ref[k];
  r->natoms = natoms;
  room(r->fref, 3 * in.n_local);
  r->fref.resize(3 * in.n_local);
  for (int64_t n = 0; n < in.n_local; ++n)
    for (int k = 0; k < 3; ++k) r->fref[3 * n + k] = fref[node2atom[n]][k];

  // (owner rank, slot) of every atom, copied to its ghost images
  for (int i = 0; i < nall; ++i) resid[i][0] = resid[i][1] = resid[i][2] = -1.0;
  for (int64_t n = 0; n < in.n_local; ++n) {
    resid[node2atom[n]][0] = comm->me;
    resid[node2atom[n]][1] = static_cast<double>(n);
  }
  MLTorchCompat::forward_comm(comm, this);

  std::vector<std::vector<int64_t>> by_owner(nprocs);
  std::vector<std::vector<int>> slots(nprocs);
  std::string failure;
  for (int64_t n = in.n_local; n < in.n_nodes; ++n) {
    const int a = node2atom[n];
    const int owner = static_cast<int>(resid[a][0]);
    if (owner < 0 || owner >= nprocs) {
      failure = "Fix torch/finetune: replay buffer: ghost atom without an owner slot";
      break;
    }
    by_owner[owner].push_back(n);
    slots[owner].push_back(static_cast<int>(resid[a][1]));
  }
  fail_if(failure);
  r->send_counts.resize(nprocs);
  r->send_displs.resize(nprocs);
  r->ghost_nodes.clear();
  std::vector<int> send_slots;
  for (int p = 0; p < nprocs; ++p) {
    r->send_counts[p] = static_cast<int>(by_owner[p].size());
    r->send_displs[p] = static_cast<int>(r->ghost_nodes.size());
    r->ghost_nodes.insert(r->ghost_nodes.end(), by_owner[p].begin(), by_owner[p].end());
    send_slots.insert(send_slots.end(), slots[p].begin(), slots[p].end());
  }
  r->recv_counts.resize(nprocs);
  r->recv_displs.resize(nprocs);
  MPI_Alltoall(r->send_counts.data(), 1, MPI_INT, r->recv_counts.data(), 1, MPI_INT, world);
  int nrecv = 0;
  for (int p = 0; p < nprocs; ++p) {
    r->recv_displs[p] = nrecv;
    nrecv += r->recv_counts[p];
  }
  r->recv_slots.resize(nrecv);
  MPI_Alltoallv(send_slots.data(), r->send_counts.data(), r->send_displs.data(), MPI_INT,
                r->recv_slots.data(), r->recv_counts.data(), r->recv_displs.data(), MPI_INT, world);

  // bounded memory: the oldest pieces go first, the same ones on every rank
  const double limit = replay_mbytes * 1024.0 * 1024.0;
  const double need = r->bytes();
  double total = replay_bytes();
  int evict = 0;
  if (need > limit) {
    evict = -1;    // this piece alone is too big for the bound
  } else {
    while (total + need > limit && evict < static_cast<int>(replay.size()))
      total -= replay[evict++]->bytes();
  }
  int evict_all = 0, too_big = (evict < 0) ? 1 : 0, any_too_big = 0;
  MPI_Allreduce(&too_big, &any_too_big, 1, MPI_INT, MPI_MAX, world);
  if (any_too_big) {
    if (!replay_warned && comm->me == 0)
      error->warning(FLERR, "Fix torch/finetune: one configuration needs more than the replay "
                            "memory bound of {} MB on a rank; the replay buffer stays empty "
                            "(raise replay_memory)", replay_mbytes);
    replay_warned = true;
    spare_replay = std::move(r);
    return;
  }
  MPI_Allreduce(&evict, &evict_all, 1, MPI_INT, MPI_MAX, world);
  if (static_cast<int>(replay.size()) - evict_all >= replay_capacity)
    evict_all = static_cast<int>(replay.size()) - replay_capacity + 1;
  if (evict_all > 0) spare_replay = std::move(replay.front());
  replay.erase(replay.begin(), replay.begin() + evict_all);
  replay.push_back(std::move(r));
  ++stored_this_round;
}

/* ----------------------------------------------------------------------
   the loss gradient of a stored configuration with the current model
------------------------------------------------------------------------- */

void FixTorchFinetune::train_replay(Replay &r)
{
  for (auto &member : members) train_replay(r, *member);
  acc_ngrad += 1.0;
}

void FixTorchFinetune::train_replay(Replay &r, MLTorch::Model &model)
{
  MLTorch::GraphInput in;
  in.n_nodes = r.n_nodes;
  in.n_local = r.n_local;
  in.n_edges = r.n_edges;
  in.edge_vectors = r.edge_vec.data();
  in.edge_index = r.edge_index.data();
  in.species = r.species.data();
  // a piece stored under the halo exchange holds ghosts one cutoff deep;
  // partial forces and residual weights travel along the same owner map
  Replay::Halo halo(r, world);
  if (student->halo_exchange()) in.halo = &halo;
  double e_part = 0.0, w_part[6];
  std::vector<double> nf;
  agreed_call(" replay", [&] { model.forward_train(in, e_part, nf, w_part); });

  // partial forces of ghost nodes -> owners: the piece's reverse exchange
  // (the same owner map a layered model's features travel along)
  std::vector<double> F(3 * r.n_local);
  halo.reverse(nf.data(), F.data(), 3);

  double local[8] = {e_part, w_part[0], w_part[1], w_part[2], w_part[3], w_part[4], w_part[5], 0.0};
  for (int64_t n = 0; n < 3 * r.n_local; ++n) {
    const double d = F[n] - r.fref[n];
    local[7] += d * d;
  }
  double sum[8];
  MPI_Allreduce(local, sum, 8, MPI_DOUBLE, MPI_SUM, world);
  const auto t = loss_terms(w_energy, w_force, w_stress, sum[0], r.e_ref, sum + 1, r.w_ref, sum[7],
                            r.natoms);

  // residual weights: own nodes directly, ghost nodes from their owners
  std::vector<double> owned(3 * r.n_local), weights(3 * r.n_nodes);
  for (int64_t n = 0; n < 3 * r.n_local; ++n) owned[n] = t.cf * (F[n] - r.fref[n]);
  halo.forward(owned.data(), weights.data(), 3);
  agreed_call(" replay", [&] { model.backward_train(weights, t.ce, t.cw); });
}

/* ---------------------------------------------------------------------- */

double FixTorchFinetune::learning_rate() const
{
  return schedule->lr(opt->lr, nupdates);
}

/* ----------------------------------------------------------------------
   one optimizer step on the gradient averaged over all configurations of
   all replicas; every decision depends only on reduced values, so every
   rank of every replica takes the same branch
------------------------------------------------------------------------- */

void FixTorchFinetune::take_step()
{
  // uncertainty gating: replicas label independently. Where no replica
  // labelled anything there is no update (nor replay): every rank of every
  // replica learns that from one reduced count
  if (gated) {
    const double mine = (comm->me == 0) ? acc_n : 0.0;
    double all = 0.0;
    MPI_Allreduce(&mine, &all, 1, MPI_DOUBLE, MPI_SUM, universe->uworld);
    if (all == 0.0) {
      ++nempty;
      if (log_every > 0 && (nempty - 1) % log_every == 0 && comm->me == 0)
        utils::logmesg(lmp, "fix torch/finetune: step {} no update: no replica labelled a "
                            "configuration since the last update ({} such updates so far)\n",
                       update->ntimestep, nempty);
      clear_round();
      training->zero_grad();
      return;
    }
  }
  // replayed configurations join the gradient: deterministic picks among
  // those stored before this round, the same on every rank of the replica
  const int eligible = static_cast<int>(replay.size()) - stored_this_round;
  std::string failure;
  try {
    for (int k : MLTorch::replay_picks(nupdates + nskipped + nrollbacks, eligible, replay_mix))
      train_replay(*replay[k]);
  } catch (StepFailure &e) {
    failure = e.what();
  }
  replicas_agree(failure);

  std::vector<double> buf = training->gradient();
  const std::size_t ngrad_size = buf.size();
  // statistics once per replica
  const bool world_root = comm->me == 0;
  const double stats[NSTATS] = {acc_loss, acc_se_e, acc_se_f, acc_nf, acc_se_w, acc_n, acc_ngrad};
  for (double s : stats) buf.push_back(world_root ? s : 0.0);

  // sum over the universe in fixed-size buckets; reduce to one rank and
  // broadcast, so that every rank holds bitwise the same sum
  std::vector<double> red(buf.size());
  const double t_reduce = platform::walltime();
  for (std::size_t off = 0; off < buf.size(); off += BUCKET_DOUBLES) {
    const int n = static_cast<int>(std::min(BUCKET_DOUBLES, buf.size() - off));
    MPI_Reduce(buf.data() + off, red.data() + off, n, MPI_DOUBLE, MPI_SUM, 0, universe->uworld);
    MPI_Bcast(red.data() + off, n, MPI_DOUBLE, 0, universe->uworld);
  }
  time_reduce += platform::walltime() - t_reduce;
  training->zero_grad();

  const double *st = red.data() + ngrad_size;
  const double nconf = st[5];    // fresh configurations: the statistics
  const double ngrad = st[6];    // fresh + replayed: the gradient average
  const double loss = st[0] / nconf;
  const double e_rmse = std::sqrt(st[1] / nconf);
  const double f_rmse = std::sqrt(st[2] / st[3]);
  const double w_rmse = std::sqrt(st[4] / nconf);
  // the mean over the configurations of all replicas (weighted by counts)
  last_grad.assign(red.begin(), red.begin() + ngrad_size);
  MLTorch::average_gradient(ngrad, last_grad.data(), static_cast<long>(last_grad.size()));
  bool finite = std::isfinite(loss);
  for (std::size_t k = 0; finite && k < ngrad_size; ++k) finite = std::isfinite(last_grad[k]);

  const char *action = "update";
  double gnorm = 0.0;
  const double lr = learning_rate();
  if (!finite) {
    ++nskipped;
    action = "skipped (non-finite loss or gradient)";
  } else if (max_force_error > 0.0 && f_rmse > max_force_error) {
    ++nskipped;
    action = "skipped (force error above max_force_error)";
  } else if (rollback_factor > 0.0 && loss_ema > 0.0 && loss > rollback_factor * loss_ema &&
             training->has_good()) {
    // the current parameters made the loss jump: return to the last good ones
    training->restore_good();
    ++nrollbacks;
    loss_ema = loss;    // new baseline, so a real change of the data is learnt next time
    action = "rolled back to the last good parameters";
  } else {
    if (rollback_factor > 0.0) {
      training->keep_good();
      loss_ema = (loss_ema < 0.0) ? loss : 0.9 * loss_ema + 0.1 * loss;
    }
    try {
      gnorm = training->step(last_grad, lr, clip)[0];
    } catch (std::exception &e) {
      failure = fmt::format("Fix torch/finetune: optimizer step failed: {}", e.what());
    }
    // every rank of every replica takes this branch (decided on reduced values)
    MLTorchMPI::stop_collectively(error, universe->uworld, failure.empty(), failure);
    ++nupdates;
  }

  vec[0] = loss;
  vec[1] = e_rmse;
  vec[2] = f_rmse;
  vec[3] = w_rmse;
  vec[4] = gnorm;
  vec[5] = lr;
  vec[6] = static_cast<double>(nupdates);
  vec[7] = static_cast<double>(nskipped);
  vec[8] = static_cast<double>(nrollbacks);
  vec[9] = ngrad;
  vec[10] = static_cast<double>(replay.size());

  const bigint nevents = nupdates + nskipped + nrollbacks;
  if (log_every > 0 && (nevents % log_every == 0 || nevents == 1 || !finite) && comm->me == 0)
    utils::logmesg(lmp,
                   "fix torch/finetune: step {} {} {} loss {:.6g} E_rmse {:.6g} F_rmse {:.6g} "
                   "W_rmse {:.6g} |grad| {:.6g} lr {:.6g} configs {} replayed {}{}\n",
                   update->ntimestep, action, nupdates, loss, e_rmse, f_rmse, w_rmse, gnorm, lr,
                   static_cast<bigint>(nconf), static_cast<bigint>(ngrad - nconf),
                   gated ? fmt::format(" | this replica: teacher calls {}, saved {}, above the "
                                       "window {}, empty updates {}",
                                       ncalls, nknown, nabove, nempty)
                         : std::string());

  clear_round();

  if (check_every > 0 && nevents % check_every == 0) checksum_guard();
  if (save_every > 0 && !save_file.empty() && nupdates > 0 && nevents % save_every == 0)
    save_model(save_file);
}

/* ----------------------------------------------------------------------
   the end of an update round: nothing accumulated, nothing fresh stored
------------------------------------------------------------------------- */

void FixTorchFinetune::clear_round()
{
  acc_loss = acc_se_e = acc_se_f = acc_nf = acc_se_w = acc_n = acc_ngrad = 0.0;
  pending = 0;
  stored_this_round = 0;
}

/* ----------------------------------------------------------------------
   every rank of every replica must hold bitwise the same parameters
------------------------------------------------------------------------- */

void FixTorchFinetune::checksum_guard()
{
  std::string first, other;
  const int r = MLTorchMPI::first_differing_rank(MLTorch::content_hash(training->parameters()),
                                                 universe->uworld, first, other);
  ++nchecks;
  // the same gathered data on every rank: all of them stop here together
  if (r >= 0)
    error->all(FLERR,
               "Fix torch/finetune: model parameters differ between ranks/replicas after "
               "update {} (checksum {} on universe rank 0, {} on universe rank {}); "
               "replicas must run the same number of steps with the same fix settings",
               nupdates, first, other, r);
}

/* ----------------------------------------------------------------------
   the fine-tuned model as a pair_style torch file, written atomically by
   universe rank 0 (all replicas hold the same parameters)
------------------------------------------------------------------------- */

void FixTorchFinetune::save_model(const std::string &path)
{
  std::string message;
  bool ok = true;
  if (universe->me == 0) {
    for (std::size_t m = 0; ok && m < members.size(); ++m) {
      try {
        const std::string prov =
            fmt::format("{{\"parent_model\": \"{}\", \"parent_file_hash\": \"{}\", \"updates\": {}, "
                        "\"step\": {}, \"teacher\": \"{}\"}}",
                        student->member_path(static_cast<int>(m)), member_hashes[m], nupdates,
                        update->ntimestep, teacher_style);
        MLTorch::write_file_atomic(member_file(path, static_cast<int>(m)),
                                   members[m]->file_bytes(prov));
      } catch (std::exception &e) {
        ok = false;
        message = fmt::format("Fix torch/finetune: cannot save the model: {}", e.what());
      }
    }
  }
  // replicas wait for each other in reductions: an error on one of them
  // alone would leave the others hanging
  MLTorchMPI::stop_collectively(error, universe->uworld, ok, message);
  if (comm->me == 0 && log_every > 0)
    utils::logmesg(lmp, "fix torch/finetune: saved {} after {} updates to {}{}\n",
                   members.size() > 1 ? "the committee" : "model", nupdates, path,
                   members.size() > 1 ? fmt::format(" ... {}", member_file(path, static_cast<int>(members.size()) - 1)) : "");
}

/* ----------------------------------------------------------------------
   the file of committee member m: the save file for the first, then
   name.c1.pt, name.c2.pt ... (before the extension)
------------------------------------------------------------------------- */

std::string FixTorchFinetune::member_file(const std::string &path, int m)
{
  if (m == 0) return path;
  const auto slash = path.find_last_of('/');
  const auto dot = path.find_last_of('.');
  const bool has_ext = dot != std::string::npos && (slash == std::string::npos || dot > slash);
  const std::string tag = fmt::format(".c{}", m);
  return has_ext ? path.substr(0, dot) + tag + path.substr(dot) : path + tag;
}

/* ---------------------------------------------------------------------- */

void FixTorchFinetune::post_run()
{
  if (!save_file.empty() && nupdates > 0) save_model(save_file);
}

/* ---------------------------------------------------------------------- */

double FixTorchFinetune::compute_vector(int i)
{
  if (i == 11) return time_update;
  if (i == 12) return time_reduce;
  if (i == 13) return static_cast<double>(ncalls);
  if (i == 14) return static_cast<double>(nknown);
  if (i == 15) return static_cast<double>(nabove);
  if (i == 16) return last_devi;
  return vec[i];
}

/* ----------------------------------------------------------------------
   restart: counters, parameters and optimizer state (identical on all
   ranks, so rank 0 writes them)
------------------------------------------------------------------------- */

std::size_t FixTorchFinetune::max_restart_bytes = std::numeric_limits<int>::max();

void FixTorchFinetune::write_restart(FILE *fp)
{
  if (pending > 0 && comm->me == 0)
    error->warning(FLERR, "Fix torch/finetune: write_restart between updates: the {} "
                          "configuration(s) accumulated since the last update are not stored",
                   pending);
  // every rank holds the same state: rank 0 alone packs it (the other ranks
  // learn its size, so that all of them stop together on a state too large)
  std::string out;
  if (comm->me == 0) {
    MLTorch::TrainingRecord record;
    record.model_hash = model_hash;
    record.member_hashes = member_hashes;
    record.ncalls = ncalls;
    record.nknown = nknown;
    record.nabove = nabove;
    record.nempty = nempty;
    record.nupdates = nupdates;
    record.nskipped = nskipped;
    record.nrollbacks = nrollbacks;
    record.nconfigs = nconfigs;
    record.loss_ema = loss_ema;
    record.stats.assign(std::begin(vec), std::end(vec));
    record.parameters = training->parameters();
    record.optimizer = training->optimizer_state();
    record.good_parameters = training->good_parameters();
    record.good_optimizer = training->good_optimizer_state();
    out = MLTorch::pack_record(record);
  }
  bigint size = static_cast<bigint>(out.size());
  MPI_Bcast(&size, 1, MPI_LMP_BIGINT, 0, world);
  // a fix's global restart record has an int size: parameters, two Adam
  // moments and the rollback copies pass 2 GB near 90 M float32 parameters
  if (static_cast<std::size_t>(size) > max_restart_bytes)
    error->all(FLERR,
               "Fix torch/finetune: its restart state ({:.2f} GB: parameters, optimizer state{}) "
               "exceeds the 2 GB a LAMMPS restart file holds per fix; keep the model with the "
               "'save' keyword instead of write_restart{}",
               size / 1e9, training->has_good() ? " and rollback copies" : "",
               training->has_good() ? ", or drop 'rollback' to halve the state" : "");
  if (comm->me != 0) return;
  const int n = static_cast<int>(out.size());
  fwrite(&n, sizeof(int), 1, fp);
  fwrite(out.data(), 1, out.size(), fp);
}

void FixTorchFinetune::restart(char *buf)
{
  // LAMMPS gives a fix's restart() no size: the record's own frame gives it
  MLTorch::TrainingRecord r;
  try {
    r = MLTorch::unpack_record(buf, MLTorch::record_size(buf, max_restart_bytes),
                              static_cast<int>(std::size(vec)));
  } catch (MLTorch::RecordError &e) {
    error->all(FLERR, "Fix torch/finetune: cannot read its restart record: {}", e.what());
  }
  if (r.model_hash != model_hash)
    error->all(FLERR,
               "Fix torch/finetune: the restart file was written while training a model with file "
               "hash {}, but pair_coeff loaded {} (hash {}); load the same model file that the "
               "run which wrote the restart file started from",
               r.model_hash, model_path, model_hash);
  if (r.member_hashes != member_hashes)
    error->all(FLERR,
               "Fix torch/finetune: the restart file was written while training a committee of {} "
               "model(s) ({}), but pair_coeff loaded {} ({}); load the same model files",
               r.member_hashes.size(), MLTorchMPI::join_words(r.member_hashes),
               member_hashes.size(), MLTorchMPI::join_words(member_hashes));
  ncalls = r.ncalls;
  nknown = r.nknown;
  nabove = r.nabove;
  nempty = r.nempty;
  nupdates = r.nupdates;
  nskipped = r.nskipped;
  nrollbacks = r.nrollbacks;
  nconfigs = r.nconfigs;
  loss_ema = r.loss_ema;
  std::copy(r.stats.begin(), r.stats.end(), vec);
  try {
    training->load_parameters(r.parameters);
    training->load_optimizer_state(r.optimizer);
    training->load_good(r.good_parameters, r.good_optimizer);
  } catch (std::exception &e) {
    error->all(FLERR, "Fix torch/finetune: cannot restore the training state: {}", e.what());
  }
  if (comm->me == 0) {
    utils::logmesg(lmp, "fix torch/finetune: restored parameters and optimizer state after {} "
                        "updates\n", nupdates);
    if (replay_capacity > 0)
      error->warning(FLERR, "Fix torch/finetune: the replay buffer is not kept in restart files; "
                            "it starts empty");
  }
}

/* ---------------------------------------------------------------------- */

int FixTorchFinetune::pack_forward_comm(int n, int *list, double *buf, int /*pbc_flag*/,
                                        int * /*pbc*/)
{
  int m = 0;
  for (int i = 0; i < n; ++i) {
    const int j = list[i];
    buf[m++] = resid[j][0];
    buf[m++] = resid[j][1];
    buf[m++] = resid[j][2];
  }
  return m;
}

void FixTorchFinetune::unpack_forward_comm(int n, int first, double *buf)
{
  int m = 0;
  for (int i = first; i < first + n; ++i) {
    resid[i][0] = buf[m++];
    resid[i][1] = buf[m++];
    resid[i][2] = buf[m++];
  }
}

int FixTorchFinetune::pack_reverse_comm(int n, int first, double *buf)
{
  double **a = reverse_target;
  int m = 0;
  for (int i = first; i < first + n; ++i) {
    buf[m++] = a[i][0];
    buf[m++] = a[i][1];
    buf[m++] = a[i][2];
  }
  return m;
}

void FixTorchFinetune::unpack_reverse_comm(int n, int *list, double *buf)
{
  double **a = reverse_target;
  int m = 0;
  for (int i = 0; i < n; ++i) {
    const int j = list[i];
    a[j][0] += buf[m++];
    a[j][1] += buf[m++];
    a[j][2] += buf[m++];
  }
}

/* ---------------------------------------------------------------------- */

double FixTorchFinetune::memory_usage()
{
  double bytes = 5.0 * 3.0 * nmax * sizeof(double);
  bytes += replay_bytes();
  bytes += (double) (training->good_parameters().size() + training->good_optimizer_state().size());
  bytes += (double) atom->nmax * sizeof(double);
  return bytes;
}

double FixTorchFinetune::replay_bytes() const
{
  double b = 0.0;
  for (const auto &r : replay) b += r->bytes();
  return b;
}

/* ----------------------------------------------------------------------
   per-atom |F - F_ref| (the fix's per-atom vector): grown with the atom
   arrays and carried along when atoms migrate
------------------------------------------------------------------------- */

void FixTorchFinetune::grow_arrays(int n)
{
  memory->grow(resid_atom, n, "torch/finetune:resid_atom");
  vector_atom = resid_atom;
}

void FixTorchFinetune::copy_arrays(int i, int j, int /*delflag*/)
{
  resid_atom[j] = resid_atom[i];
}

int FixTorchFinetune::pack_exchange(int i, double *buf)
{
  buf[0] = resid_atom[i];
  return 1;
}

int FixTorchFinetune::unpack_exchange(int nlocal, double *buf)
{
  resid_atom[nlocal] = buf[0];
  return 1;
}

/* ---------------------------------------------------------------------- */

MLTorch::Model *FixTorchFinetune::member(int m)
{
  return members[m].get();
}
