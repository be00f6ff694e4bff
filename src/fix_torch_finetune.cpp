/* ----------------------------------------------------------------------
   LAMMPS - Large-scale Atomic/Molecular Massively Parallel Simulator
   https://www.lammps.org/, Sandia National Laboratories
   LAMMPS development team: developers@lammps.org

   ML-TORCH package: TorchScript machine-learned potentials.
   Distributed under the GNU General Public License, version 2.
------------------------------------------------------------------------- */

/* ----------------------------------------------------------------------
   fix torch/finetune: online fine-tuning of the pair_style torch model.
   This file: the fix's LAMMPS hooks (construction, init, the start of a
   run, post_force, restart records, per-atom data and communication).
   Beside it: its arguments (fix_torch_finetune_settings.cpp), the stages
   of a labelling step and the update (fix_torch_finetune_step.cpp), the
   teacher (finetune_teacher.cpp) and the replicas' agreement
   (finetune_replicas.cpp); the loss, the update policy, the replay buffer
   and the distributed update are the core's (src/core;
   doc/architecture.md).
------------------------------------------------------------------------- */

#include "fix_torch_finetune.h"

#include "atom.h"
#include "comm.h"
#include "error.h"
#include "finetune_replicas.h"
#include "finetune_teacher.h"
#include "input.h"
#include "finetune_dataset.h"
#include "finetune_labels.h"
#include "force.h"
#include "lmp_compat.h"
#include "memory.h"
#include "mltorch_mpi.h"
#include "modify.h"
#include "torch_student.h"
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
#if defined(__GLIBC__)
#include <malloc.h>    // malloc_usable_size
#endif
#include <exception>
#include <iterator>
#include <limits>

using namespace LAMMPS_NS;
using namespace FixConst;

/* ---------------------------------------------------------------------- */

FixTorchFinetune::FixTorchFinetune(LAMMPS *lmp, int narg, char **arg) :
    Fix(lmp, narg, arg), set(std::make_unique<MLTorch::FinetuneSettings>()), student(nullptr),
    synced(false), pending(0), nmax(0),
    fpart(nullptr), resid(nullptr), fref(nullptr), fmd(nullptr), resid_atom(nullptr)
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

  // the student: the pair_style torch model the MD runs with
  student = TorchStudent::of(force);
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

  teacher = FinetuneTeacher::create(lmp, set->teacher_style, set->teacher_coeff, set->teacher_timeout);
  replicas = std::make_unique<FinetuneReplicas>(lmp);
  setup_trainable();
  if (!set->labels_file.empty()) {
    std::vector<std::string> elements(atom->ntypes + 1);
    const auto &names = model_->metadata().elements;
    for (int t = 1; t <= atom->ntypes; ++t) {
      const int s = student->species_of_type(t);
      if (s >= 0 && s < static_cast<int>(names.size())) elements[t] = names[s];
    }
    // provenance: the teacher as the fix was given it
    const std::string what = set->teacher_style == "ipi"
        ? teacher->describe()
        : set->teacher_style + " " + FinetuneTeacher::substitute_variables(lmp, set->teacher_coeff);
    labels = std::make_unique<FinetuneLabels>(lmp, set->labels_file, elements, what);
  }
  if (!set->dataset_file.empty())
    dataset = std::make_unique<FinetuneDataset>(lmp, set->dataset_file, set->dataset_per_update,
                                                set->dataset_weight, set->dataset_seed,
                                                set->dataset_mbytes, *model_, *set);

  vector_flag = 1;
  size_vector = 18;
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
  // PRE_FORCE: setup_pre_force() is the replicas' collective check at the
  // start of every run; pre_force() asks the pair style to defer the model
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
    trainer = std::make_unique<MLTorch::DistributedTrainer>(*set, members, world, universe->uworld,
                                                             universe->iworld);
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
  auto *pair = TorchStudent::of(force);
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

  // rerun calls only end_of_step fixes: this fix would train on nothing
  if (input->command && strcmp(input->command, "rerun") == 0 && !rerun_warned) {
    if (comm->me == 0)
      error->warning(FLERR, "Fix torch/finetune trains nothing during rerun (LAMMPS invokes only "
                            "end_of_step fixes there); unfix it, or run MD to train");
    rerun_warned = true;
  }
  // minimize, neb (each partition an image) and fix box/relax invoke no
  // post_force fix: the model stays as it is while they run
  if (update->whichflag == 2 && !minimize_warned) {
    if (comm->me == 0)
      error->warning(FLERR, "Fix torch/finetune trains during MD only: it is idle during {} (an "
                            "energy minimization) and the model stays as it is",
                     input->command ? input->command : "the minimization");
    minimize_warned = true;
  }
  teacher->init(force->pair_match("^torch", 0));
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
    // fix pimd/* turns the forces into normal-mode forces (and takes the
    // virial from them) in its post_force: added after it, this fix's
    // Cartesian force change would be wrong for every bead
    if (utils::strmatch(style, "^pimd"))
      error->all(FLERR, "Fix torch/finetune must be defined before fix {} ({}), which transforms "
                        "the forces in its post_force; move the fix torch/finetune line above it",
                 modify->fix[i]->id, style);
    for (const char *s : {"setforce", "aveforce", "freeze", "lineforce", "planeforce", "enforce2d"})
      if (utils::strmatch(style, std::string("^") + s) && comm->me == 0)
        error->warning(FLERR, "Fix torch/finetune: fix {} ({}) is defined before it and sets "
                              "forces; define fix torch/finetune first so that it acts on the "
                              "forces of the updated model", modify->fix[i]->id, style);
  }

  // on a step that ends in an update the model's forces of the force call
  // are replaced by the updated model's: the force call may leave the model
  // out and this fix add it after the update (one model evaluation for MD
  // instead of two). Only where nothing reads the forces in between: the
  // student is the whole pair style (a pair_style hybrid would tally before
  // the model's share is in), no fix acts on forces before this one
  // (post_force earlier in the list, or pre_reverse), a single model drives
  // the MD and labels are not gated on the committee's deviation
  bool first = modify->n_pre_reverse == 0;
  for (int i = 0; first && i < modify->nfix && modify->fix[i] != this; ++i)
    first = !(modify->fmask[i] & FixConst::POST_FORCE);
  defer_ok = first && members.size() == 1 && !set->gated &&
      dynamic_cast<TorchStudent *>(force->pair) == student;
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
  // the optimizer does (collectives of replicas must pair up), and the run
  const std::string fingerprint =
      trainer->fingerprint(member_hashes, pending, update->ntimestep % nevery) +
      fmt::format(" | run {} steps from {} to {}", update->nsteps, update->firststep, update->laststep);
  replicas->check_consistent(fingerprint, !synced, trainer->state(), trainer->policy);
  synced = true;
  // an external teacher's client connects (all replicas agree on failures)
  replicas->agree(teacher->connect());
  if (labels) replicas->agree(labels->open());
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

void FixTorchFinetune::pre_force(int /*vflag*/)
{
  if (defer_ok && update->ntimestep % nevery == 0 && pending + 1 >= set->accumulate)
    student->defer_next_model_call();
}

/* ---------------------------------------------------------------------- */

void FixTorchFinetune::post_force(int /*vflag*/)
{
  if (update->ntimestep % nevery) return;
  // the force call left the model out: this step's labels, then the update,
  // then the model's forces with the parameters then current
  const bool deferred = student->model_deferred();
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
  teacher->wait_for_replicas();
  replicas->agree(failure);
  if (++pending >= set->accumulate) {
    if (!built) student->training_graph(in);
    // the MD model's forces before the update: from labelling (member 1 is
    // the MD model) or from the pair style's force call of this step
    double **before = fpart;
    if (!labelled || student->md_on_mean()) {
      md_forces(in, COMM_FMD, student->md_output());
      before = fmd;
    }
    // the dataset's configurations join the update's gradient
    if (dataset) {
      int nd = 0;
      const std::string why = dataset->add_gradients(
          members, trainer->energy_shift.empty() ? nullptr : &trainer->energy_shift,
          fmt::format("Fix torch/finetune on step {}: ", update->ntimestep), nd);
      teacher->wait_for_replicas();
      replicas->agree(why);
      trainer->round.ngrad += nd;
    }
    const bigint before_events = trainer->count.nupdates + trainer->count.nrollbacks;
    take_step();
    // a deferred force call left the model's share out of f: all of it now
    if (deferred || trainer->count.nupdates + trainer->count.nrollbacks != before_events) {
      refresh_forces(in, deferred ? nullptr : before);
      // with KOKKOS: the host forces changed (only here: the teacher's
      // labels leave f bitwise as it was), so they go back to the device
      student->host_forces_modified();
    }
    // its energy and virial: the training pass's, as the force call would have tallied
    if (deferred) student->complete_deferred(md_energy_part, md_virial_part);
  }
  time_update += platform::walltime() - t_start;
}

/* ---------------------------------------------------------------------- */

void FixTorchFinetune::post_run()
{
  const std::string line = teacher->summary();
  if (!line.empty()) utils::logmesg(lmp, line);
  if (labels) {
    const std::string written = labels->summary();
    if (!written.empty()) utils::logmesg(lmp, written);
  }
  if (!set->save_file.empty() && trainer->count.nupdates > 0) save_model(set->save_file);
}

/* ---------------------------------------------------------------------- */

double FixTorchFinetune::compute_vector(int i)
{
  if (i == 11) return time_update;
  if (i == 12) return trainer->time_reduce;
  if (i == 13) return static_cast<double>(trainer->count.ncalls);
  if (i == 14) return static_cast<double>(trainer->count.nknown);
  if (i == 15) return static_cast<double>(trainer->count.nabove);
  if (i == 16) return last_devi;
  if (i == 17) return trainer->state().anchor_term();
  return trainer->stats[i];
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
    auto record = trainer->record(model_hash, member_hashes);
    // where this replica's label file stands: a continued run cuts it back there
    if (labels) labels->position(record.labels_frames, record.labels_bytes);
    if (dataset) dataset->position(record.dataset_epoch, record.dataset_next);
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
               size / 1e9, trainer->state().has_good() ? " and rollback copies" : "",
               trainer->state().has_good() ? ", or drop 'rollback' to halve the state" : "");
  if (comm->me != 0) return;
  const int n = static_cast<int>(out.size());
  fwrite(&n, sizeof(int), 1, fp);
  fwrite(out.data(), 1, out.size(), fp);
}

void FixTorchFinetune::restart(char *buf)
{
  // LAMMPS gives a fix's restart() no size: the record's own frame gives it
  // (versions >= 3). The unframed versions 1 and 2 are read within a bound:
  // the size of the block LAMMPS allocated for the record (new char[n],
  // whose usable size the C library knows), so that a damaged length in an
  // old record cannot make the reader pass the block
  std::size_t bound = max_restart_bytes;
#if defined(__GLIBC__)
  bound = std::min(bound, static_cast<std::size_t>(malloc_usable_size(buf)));
#endif
  MLTorch::TrainingRecord r;
  try {
    r = MLTorch::unpack_record(buf, MLTorch::record_size(buf, bound),
                              MLTorch::DistributedTrainer::NSTATS);
  } catch (MLTorch::RecordError &e) {
    error->all(FLERR, "Fix torch/finetune: cannot read its restart record: {}", e.what());
  }
  const std::string mismatch = MLTorch::record_mismatch(r, model_path, model_hash, member_hashes);
  if (!mismatch.empty()) error->all(FLERR, "Fix torch/finetune: {}", mismatch);
  if (labels && r.labels_frames >= 0) labels->resume(r.labels_frames, r.labels_bytes);
  if (dataset && r.dataset_epoch >= 0) dataset->resume(r.dataset_epoch, r.dataset_next);
  try {
    trainer->restore(r);
  } catch (std::exception &e) {
    error->all(FLERR, "Fix torch/finetune: cannot restore the training state: {}", e.what());
  }
  if (comm->me == 0) {
    utils::logmesg(lmp, "fix torch/finetune: restored parameters and optimizer state after {} "
                        "updates\n", trainer->count.nupdates);
    if (set->replay_capacity > 0)
      error->warning(FLERR, "Fix torch/finetune: the replay buffer is not kept in restart files; "
                            "it starts empty");
  }
}

/* ---------------------------------------------------------------------- */

/* ---------------------------------------------------------------------- */

double FixTorchFinetune::memory_usage()
{
  double bytes = 4.0 * 3.0 * nmax * sizeof(double) + trainer->bytes();
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

