/* ----------------------------------------------------------------------
   LAMMPS - Large-scale Atomic/Molecular Massively Parallel Simulator
   https://www.lammps.org/, Sandia National Laboratories
   LAMMPS development team: developers@lammps.org

   ML-TORCH package: TorchScript machine-learned potentials.
   Distributed under the GNU General Public License, version 2.
------------------------------------------------------------------------- */

/* ----------------------------------------------------------------------
   fix torch/finetune: online fine-tuning of the pair_style torch model.
   The LAMMPS side: arguments (fix_torch_finetune_settings.cpp), the hooks,
   the stages of a labelling step with LAMMPS's communication, per-atom
   data and restart records. The teacher (finetune_teacher.cpp) and the
   agreement of replicas (finetune_replicas.cpp) are classes beside it; the
   loss, the update policy, the replay buffer and the distributed update
   are the core's (src/core, doc/architecture.md). DESIGN.md derives the
   distributed gradient: partial forces of every rank's graph summed on the
   owners by reverse communication, residual weights copied to the ghost
   images by forward communication, one weighted backward pass per rank.
------------------------------------------------------------------------- */

#include "fix_torch_finetune.h"

#include "atom.h"
#include "comm.h"
#include "error.h"
#include "finetune_replicas.h"
#include "finetune_teacher.h"
#include "force.h"
#include "lmp_compat.h"
#include "memory.h"
#include "mltorch_mpi.h"
#include "modify.h"
#include "pair_torch.h"
#include "platform.h"
#include "universe.h"
#include "update.h"

#include "mltorch/collectives.h"
#include "mltorch/committee.h"
#include "mltorch/distributed.h"
#include "mltorch/finetune.h"
#include "mltorch/model.h"
#include "mltorch/replay.h"
#include "mltorch/restart_record.h"
#include "mltorch/training.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <iterator>
#include <limits>

using namespace LAMMPS_NS;
using namespace FixConst;

/* ---------------------------------------------------------------------- */

FixTorchFinetune::FixTorchFinetune(LAMMPS *lmp, int narg, char **arg) :
    Fix(lmp, narg, arg), set(std::make_unique<MLTorch::FinetuneSettings>()), student(nullptr),
    count(std::make_unique<MLTorch::FinetuneCounters>()),
    round(std::make_unique<MLTorch::RoundStats>()), synced(false), pending(0), nmax(0),
    fpart(nullptr), resid(nullptr), fref(nullptr), fmd(nullptr), resid_atom(nullptr),
    reverse_target(nullptr)
{
  // KOKKOS data masks (a fix's default is everything, synced to the host on
  // every step): empty, because the fix asks the pair for the host data on
  // the steps that label, and only then (post_force)
  datamask_read = 0;
  datamask_modify = 0;
  if (narg > 1 && igroup != 0)
    error->all(FLERR, "Fix torch/finetune trains on whole configurations: use group 'all', not '{}'",
               arg[1]);
  parse_settings(lmp, narg, arg, *set);
  nevery = set->nevery;
  policy = std::make_unique<MLTorch::UpdatePolicy>(set->max_force_error, set->rollback_factor);
  replay = std::make_unique<MLTorch::ReplayBuffer>(set->replay_capacity,
                                                   set->replay_mbytes * 1024.0 * 1024.0);

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
  if (set->gated && members.size() < 2)
    error->all(FLERR, "Fix torch/finetune uncertainty needs a committee: list 2 or more model "
                      "files in pair_coeff (pair_coeff * * model1.pt model2.pt ... elements)");
  if (atom->torque_flag)
    error->all(FLERR, "Fix torch/finetune supports point particles only (this atom style has "
                      "torques)");

  teacher = std::make_unique<FinetuneTeacher>(lmp, set->teacher_style, set->teacher_coeff);
  replicas = std::make_unique<FinetuneReplicas>(lmp);
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
  memory->destroy(fpart);
  memory->destroy(resid);
  memory->destroy(fref);
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
   trainable parameters from the train/freeze prefixes
------------------------------------------------------------------------- */

void FixTorchFinetune::setup_trainable()
{
  const auto names = model_->parameter_names();
  std::vector<bool> mask;
  try {
    mask = MLTorch::select_trainable(names, set->train_prefixes, set->freeze_prefixes);
  } catch (MLTorch::SelectionError &e) {
    error->all(FLERR, "Fix torch/finetune {}", e.what());
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
    training = std::make_unique<MLTorch::TrainingState>(members, set->opt);
  } catch (std::exception &e) {
    error->all(FLERR, "Fix torch/finetune: {}", e.what());
  }
  if (comm->me == 0) {
    utils::logmesg(lmp, "fix torch/finetune: training {} of {} parameters of {} with {} "
                        "(lr {}), every {} steps, {} configuration(s) per update and replica\n",
                   ntrain, model_->num_parameters(), model_path, set->opt.kind, set->opt.lr,
                   nevery, set->accumulate);
    if (members.size() > 1)
      utils::logmesg(lmp, "fix torch/finetune: all {} committee members train on the labels, "
                          "each with its own optimizer\n", members.size());
    if (set->gated)
      utils::logmesg(lmp, "fix torch/finetune: labels only configurations whose committee force "
                          "deviation lies in [{}, {})\n", set->gate_low, set->gate_high);
  }
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

  teacher->init(student);
  // LAMMPS sizes its communication buffers from force->pair and the fixes:
  // the teacher (not force->pair) communicates through them too (e.g. eam
  // 1/1, meam 38/30 values per atom, a layered torch model its features)
  comm_forward = std::max(3, teacher->comm_forward());
  comm_reverse = std::max(3, teacher->comm_reverse());

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
  // everything that decides when a universe-wide collective happens or what
  // the optimizer does: the model, the settings, the counters and the phase
  // of the training schedule (collectives of replicas must pair up)
  std::string mask;
  for (bool t : model_->trainable()) mask += t ? '1' : '0';
  const std::string fingerprint = fmt::format(
      "model {} trainable {} | {} | updates {} skipped {} rollbacks {} pending {} phase {} | run "
      "{} steps from {} to {}",
      MLTorchMPI::join_words(member_hashes), MLTorch::content_hash(mask), set->fingerprint(),
      count->nupdates, count->nskipped, count->nrollbacks, pending, update->ntimestep % nevery,
      update->nsteps, update->firststep, update->laststep);
  replicas->check_consistent(fingerprint, !synced, *training, *policy);
  synced = true;
}

/* ---------------------------------------------------------------------- */

void FixTorchFinetune::grow_work()
{
  if (atom->nmax <= nmax) return;
  nmax = atom->nmax;
  for (double ***a : {&fpart, &resid, &fref, &fmd}) {
    memory->destroy(*a);
    memory->create(*a, nmax, 3, "torch/finetune:work");
  }
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
    if (!set->gated || gate_says_label()) {
      student->training_graph(in);
      built = true;
      train_current(in);
      labelled = true;
    }
  } catch (StepFailure &e) {
    failure = e.what();
  }
  // before any reduction of the replicas: a failure in one stops all
  replicas->agree(failure);
  if (++pending >= set->accumulate) {
    if (!built) student->training_graph(in);
    // the MD model's forces before the update: from labelling (member 1 is
    // the MD model) or from the pair style's force call of this step
    double **before = fpart;
    if (!labelled || student->md_on_mean()) {
      md_forces(in, fmd, student->md_output());
      before = fmd;
    }
    const bigint before_events = count->nupdates + count->nrollbacks;
    take_step();
    if (count->nupdates + count->nrollbacks != before_events) refresh_forces(in, before);
  }
  student->host_forces_modified();
  time_update += platform::walltime() - t_start;
}

/* ----------------------------------------------------------------------
   the fix's reverse communication of a per-atom [3] array: ghost shares
   summed onto the owners (forces only, on the host: the atom style's
   reverse comm would also sum torques or other per-atom data, and with
   KOKKOS device communication CommKokkos would sum the device copy of f)
------------------------------------------------------------------------- */

void FixTorchFinetune::reverse_comm_into(double **target)
{
  reverse_target = target;
  MLTorchCompat::reverse_comm(comm, this);
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
  reverse_comm_into(dst);
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
  switch (MLTorch::gate(gmx, set->gate_low, set->gate_high)) {
    case MLTorch::Gate::Known:
      ++count->nknown;
      return false;
    case MLTorch::Gate::Skip:
      ++count->nabove;
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
  teacher->label(fref, e_ref_part, w_ref_part, [this] { reverse_comm_into(atom->f); });
  ++count->ncalls;

  // every member learns the labels (the last one treated is member 1, the
  // MD model: fpart keeps its forces and the statistics are its own)
  MLTorch::LossTerms terms{};
  double se_f = 0.0, natoms = 0.0;
  for (int m = static_cast<int>(members.size()) - 1; m >= 0; --m) {
    MLTorch::Model &model = *members[m];
    // stage 1: partial forces of this rank's graph
    double e_part = 0.0, w_part[6];
    auto &node_forces = node_buf;
    replicas->agreed_call("", [&] { model.forward_train(in, e_part, node_forces, w_part); });

    // full model forces on the owners: LAMMPS reverse communication
    if (nall > 0) std::memset(&fpart[0][0], 0, sizeof(double) * 3 * nall);
    for (int64_t n = 0; n < in.n_nodes; ++n) {
      const int a = node2atom[n];
      for (int k = 0; k < 3; ++k) fpart[a][k] += node_forces[3 * n + k];
    }
    reverse_comm_into(fpart);

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
    const auto t = MLTorch::loss_terms(set->w_energy, set->w_force, set->w_stress, sum[0], sum[1], sum + 2, sum + 8,
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
    replicas->agreed_call("", [&] { model.backward_train(weights, t.ce, t.cw); });
    if (m > 0) continue;

    terms = t;
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
    if (set->replay_capacity > 0) store_replay(in, sum[1], sum + 8, natoms);
  }

  round->add(terms, se_f, natoms);
  ++count->nconfigs;
}


/* ----------------------------------------------------------------------
   keep this rank's piece of the configuration just trained on for replay
   (MLTorch::ReplayBuffer): its graph, its labels, and the owner (rank,
   node slot) of each ghost node, learnt by forward communication
------------------------------------------------------------------------- */

void FixTorchFinetune::store_replay(const MLTorch::GraphInput &in, double e_ref,
                                    const double *w_ref, double natoms)
{
  const auto &node2atom = student->graph_atoms();
  const int nall = atom->nlocal + atom->nghost;
  auto piece = replay->spare();
  piece->set_graph(in);
  piece->e_ref = e_ref;
  std::copy(w_ref, w_ref + 6, piece->w_ref);
  piece->natoms = natoms;
  for (int64_t n = 0; n < in.n_local; ++n)
    for (int k = 0; k < 3; ++k) piece->fref[3 * n + k] = fref[node2atom[n]][k];

  // (owner rank, slot) of every atom, copied to its ghost images
  for (int i = 0; i < nall; ++i) resid[i][0] = resid[i][1] = resid[i][2] = -1.0;
  for (int64_t n = 0; n < in.n_local; ++n) {
    resid[node2atom[n]][0] = comm->me;
    resid[node2atom[n]][1] = static_cast<double>(n);
  }
  MLTorchCompat::forward_comm(comm, this);
  std::vector<int> owner_rank, owner_slot;
  for (int64_t n = in.n_local; n < in.n_nodes; ++n) {
    owner_rank.push_back(static_cast<int>(resid[node2atom[n]][0]));
    owner_slot.push_back(static_cast<int>(resid[node2atom[n]][1]));
  }
  const std::string failure = piece->group_ghosts(owner_rank, owner_slot, comm->nprocs);
  replicas->fail_if(failure.empty() ? failure : "Fix torch/finetune: " + failure);
  piece->plan_exchange(world);
  if (!replay->store(std::move(piece), world)) {
    if (!replay_warned && comm->me == 0)
      error->warning(FLERR, "Fix torch/finetune: one configuration needs more than the replay "
                            "memory bound of {} MB on a rank; the replay buffer stays empty "
                            "(raise replay_memory)", set->replay_mbytes);
    replay_warned = true;
  }
}

/* ----------------------------------------------------------------------
   one optimizer step on the gradient averaged over all configurations of
   all replicas (MLTorch::update); every decision depends only on reduced
   values, so every rank of every replica takes the same branch
------------------------------------------------------------------------- */

void FixTorchFinetune::take_step()
{
  // uncertainty gating: replicas label independently. Where no replica
  // labelled anything there is no update (nor replay): every rank of every
  // replica learns that from one reduced count
  if (set->gated) {
    const double mine = (comm->me == 0) ? round->n : 0.0;
    double all = 0.0;
    MPI_Allreduce(&mine, &all, 1, MPI_DOUBLE, MPI_SUM, universe->uworld);
    if (all == 0.0) {
      ++count->nempty;
      if (set->log_every > 0 && (count->nempty - 1) % set->log_every == 0 && comm->me == 0)
        utils::logmesg(lmp, "fix torch/finetune: step {} no update: no replica labelled a "
                            "configuration since the last update ({} such updates so far)\n",
                       update->ntimestep, count->nempty);
      clear_round();
      training->zero_grad();
      return;
    }
  }
  // replayed configurations join the gradient: deterministic picks among
  // those stored before this round, the same on every rank of the replica
  const int eligible = replay->size() - replay->fresh();
  std::string failure;
  for (int k : MLTorch::replay_picks(count->events(), eligible, set->replay_mix)) {
    for (auto &member : members)
      if (failure.empty())
        failure = MLTorch::replay_gradient((*replay)[k], *member, *set, student->halo_exchange(), world);
    round->ngrad += 1.0;
  }
  replicas->agree(failure.empty() ? failure
                                 : fmt::format("Fix torch/finetune on step {}: {}", update->ntimestep, failure));

  const auto out = MLTorch::update(*training, *policy, *count, *set, *round, comm->me == 0,
                                   universe->uworld, last_grad);
  time_reduce += out.t_reduce;
  // every rank of every replica took this branch (decided on reduced values)
  if (!out.failure.empty()) error->all(FLERR, "Fix torch/finetune: {}", out.failure);

  const double stats[] = {out.all.mean_loss(), out.all.energy_rmse(), out.all.force_rmse(),
                          out.all.virial_rmse(), out.gnorm, out.lr,
                          static_cast<double>(count->nupdates), static_cast<double>(count->nskipped),
                          static_cast<double>(count->nrollbacks), out.all.ngrad,
                          static_cast<double>(replay->size())};
  std::copy(std::begin(stats), std::end(stats), vec);
  const bigint nevents = count->events();
  if (set->log_every > 0 && (nevents % set->log_every == 0 || nevents == 1 || !out.finite) &&
      comm->me == 0)
    utils::logmesg(lmp,
                   "fix torch/finetune: step {} {} {} loss {:.6g} E_rmse {:.6g} F_rmse {:.6g} "
                   "W_rmse {:.6g} |grad| {:.6g} lr {:.6g} configs {} replayed {}{}\n",
                   update->ntimestep, MLTorch::describe(out.action), count->nupdates, vec[0],
                   vec[1], vec[2], vec[3], out.gnorm, out.lr, static_cast<bigint>(out.all.n),
                   static_cast<bigint>(out.all.ngrad - out.all.n),
                   set->gated ? fmt::format(" | this replica: teacher calls {}, saved {}, above "
                                            "the window {}, empty updates {}",
                                            count->ncalls, count->nknown, count->nabove, count->nempty)
                              : std::string());
  clear_round();
  if (set->check_every > 0 && nevents % set->check_every == 0) replicas->checksum_guard(*training, count->nupdates);
  if (set->save_every > 0 && !set->save_file.empty() && count->nupdates > 0 &&
      nevents % set->save_every == 0)
    save_model(set->save_file);
}

/* ----------------------------------------------------------------------
   the end of an update round: nothing accumulated, nothing fresh stored
------------------------------------------------------------------------- */

void FixTorchFinetune::clear_round()
{
  *round = MLTorch::RoundStats();
  pending = 0;
  replay->new_round();
}

/* ---------------------------------------------------------------------- */

void FixTorchFinetune::post_run()
{
  if (!set->save_file.empty() && count->nupdates > 0) save_model(set->save_file);
}

void FixTorchFinetune::save_model(const std::string &path)
{
  std::vector<std::string> parents;
  for (int m = 0; m < static_cast<int>(members.size()); ++m) parents.push_back(student->member_path(m));
  replicas->save(path, members, parents, member_hashes, set->teacher_style, count->nupdates,
                 set->log_every > 0);
}

/* ---------------------------------------------------------------------- */

double FixTorchFinetune::compute_vector(int i)
{
  if (i == 11) return time_update;
  if (i == 12) return time_reduce;
  if (i == 13) return static_cast<double>(count->ncalls);
  if (i == 14) return static_cast<double>(count->nknown);
  if (i == 15) return static_cast<double>(count->nabove);
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
    static_cast<MLTorch::FinetuneCounters &>(record) = *count;
    record.loss_ema = policy->loss_average();
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
  *count = r;
  policy->set_loss_average(r.loss_ema);
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
                        "updates\n", count->nupdates);
    if (set->replay_capacity > 0)
      error->warning(FLERR, "Fix torch/finetune: the replay buffer is not kept in restart files; "
                            "it starts empty");
  }
}

/* ---------------------------------------------------------------------- */

int FixTorchFinetune::pack_forward_comm(int n, int *list, double *buf, int /*pbc_flag*/,
                                        int * /*pbc*/)
{
  for (int i = 0; i < n; ++i)
    for (int k = 0; k < 3; ++k) buf[3 * i + k] = resid[list[i]][k];
  return 3 * n;
}

void FixTorchFinetune::unpack_forward_comm(int n, int first, double *buf)
{
  for (int i = 0; i < n; ++i)
    for (int k = 0; k < 3; ++k) resid[first + i][k] = buf[3 * i + k];
}

int FixTorchFinetune::pack_reverse_comm(int n, int first, double *buf)
{
  for (int i = 0; i < n; ++i)
    for (int k = 0; k < 3; ++k) buf[3 * i + k] = reverse_target[first + i][k];
  return 3 * n;
}

void FixTorchFinetune::unpack_reverse_comm(int n, int *list, double *buf)
{
  for (int i = 0; i < n; ++i)
    for (int k = 0; k < 3; ++k) reverse_target[list[i]][k] += buf[3 * i + k];
}

/* ---------------------------------------------------------------------- */

double FixTorchFinetune::memory_usage()
{
  double bytes = 4.0 * 3.0 * nmax * sizeof(double);
  bytes += replay->bytes();
  bytes += (double) (training->good_parameters().size() + training->good_optimizer_state().size());
  bytes += (double) atom->nmax * sizeof(double);
  return bytes;
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

