/* ----------------------------------------------------------------------
   LAMMPS - Large-scale Atomic/Molecular Massively Parallel Simulator
   https://www.lammps.org/, Sandia National Laboratories
   LAMMPS development team: developers@lammps.org

   ML-TORCH package: TorchScript machine-learned potentials.
   Distributed under the GNU General Public License, version 2.
------------------------------------------------------------------------- */

/* ----------------------------------------------------------------------
   fix torch/finetune: the stages of a labelling step and the update after
   a round. The gradient of a configuration spread over the ranks of a
   replica (doc/fix_torch_finetune.rst, "Exact distributed gradient"): every rank computes the partial forces of its graph,
   LAMMPS reverse communication sums them on the owners, owners form the
   residual weights, forward communication copies them to every ghost image,
   and each rank back-propagates its weighted share; the sum over ranks is
   the gradient of the loss, whatever the decomposition. The loss, the
   replay buffer and the update itself are the core's (src/core). Also the
   fix's per-atom communication these stages use, and the model file it saves.
------------------------------------------------------------------------- */

#include "fix_torch_finetune.h"

#include "atom.h"
#include "comm.h"
#include "error.h"
#include "finetune_labels.h"
#include "finetune_replicas.h"
#include "finetune_teacher.h"
#include "lmp_compat.h"
#include "torch_student.h"
#include "update.h"

#include "mltorch/committee.h"
#include "mltorch/distributed.h"
#include "mltorch/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>

using namespace LAMMPS_NS;

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
  return trainer->gate(gmx);
}

/* ----------------------------------------------------------------------
   the owners of the student's graph nodes for the core's distributed
   gradient (MLTorch::configuration_gradient), through this fix's LAMMPS
   communication: reverse sums every node's row into its atom (fpart) and
   the ghosts' into their owners; forward copies the owned nodes' rows
   (resid; 0 on atoms the model does not cover) to every image
------------------------------------------------------------------------- */

void FixTorchFinetune::OwnerComm::reverse(const double *all, double *owned, int width)
{
  if (width != 3) throw MLTorch::ModelError("fix torch/finetune: owner exchange of 3 values only");
  const int nall = fix.atom->nlocal + fix.atom->nghost;
  double **fpart = fix.fpart;
  if (nall > 0) std::memset(&fpart[0][0], 0, sizeof(double) * 3 * nall);
  for (int64_t n = 0; n < n_nodes; ++n)
    for (int k = 0; k < 3; ++k) fpart[node2atom[n]][k] += all[3 * n + k];
  fix.sum_to_owners(COMM_FPART);
  for (int64_t n = 0; n < n_local; ++n)
    for (int k = 0; k < 3; ++k) owned[3 * n + k] = fpart[node2atom[n]][k];
}

void FixTorchFinetune::OwnerComm::forward(const double *owned, double *all, int width)
{
  if (width != 3) throw MLTorch::ModelError("fix torch/finetune: owner exchange of 3 values only");
  const int nlocal = fix.atom->nlocal;
  double **resid = fix.resid;
  for (int i = 0; i < nlocal; ++i) resid[i][0] = resid[i][1] = resid[i][2] = 0.0;
  for (int64_t n = 0; n < n_local; ++n)
    for (int k = 0; k < 3; ++k) resid[node2atom[n]][k] = owned[3 * n + k];
  fix.copy_to_ghosts(COMM_RESID);
  for (int64_t n = 0; n < n_nodes; ++n)
    for (int k = 0; k < 3; ++k) all[3 * n + k] = resid[node2atom[n]][k];
}

/* ----------------------------------------------------------------------
   one labelled configuration: the current atoms
------------------------------------------------------------------------- */

void FixTorchFinetune::train_current(const MLTorch::GraphInput &in)
{
  const int nlocal = atom->nlocal;
  const int *type = atom->type;
  const auto &node2atom = student->graph_atoms();

  // the labels, once for all members
  double e_ref_part = 0.0, w_ref_part[6];
  teacher->label(fref, e_ref_part, w_ref_part, [this] { sum_to_owners(COMM_F); });
  ++trainer->count.ncalls;
  // energy_shift fit: the replica's element counts of this configuration
  std::vector<double> counts;
  if (!trainer->energy_shift.empty()) {
    std::vector<double> mine(trainer->energy_shift[0].nspecies(), 0.0);
    for (int i = 0; i < nlocal; ++i) {
      const int s = student->species_of_type(type[i]);
      if (s >= 0) mine[s] += 1.0;
    }
    counts.resize(mine.size());
    MPI_Allreduce(mine.data(), counts.data(), static_cast<int>(mine.size()), MPI_DOUBLE, MPI_SUM,
                  world);
  }

  // this rank's shares of the labels for the core's distributed gradient:
  // the teacher forces on the owned nodes, the covered atoms
  const int64_t n_own = in.n_local;
  auto &fref_nodes = node_buf;
  fref_nodes.resize(3 * n_own);
  for (int64_t n = 0; n < n_own; ++n)
    for (int k = 0; k < 3; ++k) fref_nodes[3 * n + k] = fref[node2atom[n]][k];
  double covered = 0.0;
  for (int i = 0; i < nlocal; ++i)
    if (student->species_of_type(type[i]) >= 0) covered += 1.0;
  OwnerComm owners(*this, node2atom, in.n_local, in.n_nodes);

  // every member learns the labels (the last one treated is member 1, the
  // MD model: fpart keeps its forces and the statistics are its own)
  MLTorch::LossTerms terms{};
  double se_f = 0.0, natoms = 0.0;
  for (int m = static_cast<int>(members.size()) - 1; m >= 0; --m) {
    MLTorch::LabelShares labels;
    labels.fref = fref_nodes.data();
    labels.w_ref = w_ref_part;
    labels.natoms = covered;
    // the energy label relative to this member's fitted reference
    // (MLTorch::EnergyShift): the fit takes this configuration's residual
    labels.e_ref = [&](double e_part) {
      double e_ref_m = e_ref_part;
      if (trainer->energy_shift.empty()) return e_ref_m;
      double two[2] = {e_part, e_ref_part};    // not const: MPI stubs take void *
      double sums[2];
      MPI_Allreduce(two, sums, 2, MPI_DOUBLE, MPI_SUM, world);
      auto &shift = trainer->energy_shift[m];
      shift.add(counts, sums[1] - sums[0]);
      if (comm->me == 0) e_ref_m -= shift.shift_of(counts);
      return e_ref_m;
    };
    MLTorch::ConfigurationGradient g;
    const std::string failure = MLTorch::configuration_gradient(
        *members[m], in, owners, labels, *set, world,
        fmt::format("Fix torch/finetune on step {}: ", update->ntimestep), g);
    if (!failure.empty()) throw StepFailure(failure);
    if (m > 0) continue;

    const auto &c = g.loss;
    terms = c.terms;
    se_f = c.se_f;
    natoms = c.natoms;
    md_energy_part = g.e_part;
    std::copy(g.w_part, g.w_part + 6, md_virial_part);
    // the labels (tests and tools) and the per-atom residual of member 1
    // (fpart holds its forces on the owners: OwnerComm::reverse)
    lab_energy = c.e_ref;
    std::copy(c.w_ref, c.w_ref + 6, lab_virial);
    lab_tags.assign(atom->tag, atom->tag + nlocal);
    lab_forces.assign(&fref[0][0], &fref[0][0] + 3 * nlocal);
    for (int i = 0; i < nlocal; ++i) {
      double r2 = 0.0;
      for (int k = 0; k < 3; ++k) r2 += (fpart[i][k] - fref[i][k]) * (fpart[i][k] - fref[i][k]);
      resid_atom[i] = student->species_of_type(type[i]) >= 0 ? std::sqrt(r2) : 0.0;
    }
    if (set->replay_capacity > 0) store_replay(in, c.e_ref, c.w_ref, natoms);
  }

  // the label file: the teacher's energy and virial over the replica, as it gave them
  if (labels) {
    double mine[7] = {e_ref_part, w_ref_part[0], w_ref_part[1], w_ref_part[2],
                      w_ref_part[3], w_ref_part[4], w_ref_part[5]};
    double sums[7];
    MPI_Allreduce(mine, sums, 7, MPI_DOUBLE, MPI_SUM, world);
    const double shift =
        trainer->energy_shift.empty() ? NAN : trainer->energy_shift[0].shift_of(counts);
    const std::string failure =
        labels->write(fref, sums[0], sums + 1, set->gated ? last_devi : -1.0, shift);
    if (!failure.empty()) throw StepFailure(failure);
  }

  trainer->round.add(terms, se_f, natoms);
  ++trainer->count.nconfigs;
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
  auto piece = trainer->replay.spare();
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
  copy_to_ghosts(COMM_RESID);
  std::vector<int> owner_rank, owner_slot;
  for (int64_t n = in.n_local; n < in.n_nodes; ++n) {
    owner_rank.push_back(static_cast<int>(resid[node2atom[n]][0]));
    owner_slot.push_back(static_cast<int>(resid[node2atom[n]][1]));
  }
  const std::string failure = piece->group_ghosts(owner_rank, owner_slot, comm->nprocs);
  replicas->fail_if(failure.empty() ? failure : "Fix torch/finetune: " + failure);
  piece->plan_exchange(world);
  if (!trainer->replay.store(std::move(piece), world)) {
    if (!replay_warned && comm->me == 0)
      error->warning(FLERR, "Fix torch/finetune: one configuration needs more than the replay "
                            "memory bound of {} MB on a rank; the replay buffer stays empty "
                            "(raise replay_memory)", set->replay_mbytes);
    replay_warned = true;
  }
}

/* ----------------------------------------------------------------------
   the update after a round (MLTorch::DistributedTrainer): one optimizer
   step on the gradient averaged over all configurations of all replicas;
   every decision depends only on reduced values, so every rank of every
   replica takes the same branch
------------------------------------------------------------------------- */

void FixTorchFinetune::take_step()
{
  pending = 0;
  const auto out = trainer->update(comm->me == 0, student->halo_exchange(),
                                   fmt::format("Fix torch/finetune on step {}: ", update->ntimestep));
  if (!out.failure.empty()) error->all(FLERR, out.failure);
  const auto &c = trainer->count;
  if (out.empty) {
    if (set->log_every > 0 && (c.nempty - 1) % set->log_every == 0 && comm->me == 0)
      utils::logmesg(lmp, "fix torch/finetune: step {} no update: no replica labelled a "
                          "configuration since the last update ({} such updates so far)\n",
                     update->ntimestep, c.nempty);
    return;
  }
  const bigint nevents = c.events();
  if (set->log_every > 0 && (nevents % set->log_every == 0 || nevents == 1 || !out.finite) &&
      comm->me == 0) {
    const double *v = trainer->stats;
    utils::logmesg(lmp,
                   "fix torch/finetune: step {} {} {} loss {:.6g} E_rmse {:.6g} F_rmse {:.6g} "
                   "W_rmse {:.6g} |grad| {:.6g} lr {:.6g} configs {} replayed {}{}{}\n",
                   update->ntimestep, MLTorch::describe(out.action), c.nupdates, v[0], v[1], v[2],
                   v[3], out.gnorm, out.lr, static_cast<bigint>(out.all.n),
                   static_cast<bigint>(out.all.ngrad - out.all.n),
                   set->gated ? fmt::format(" | this replica: teacher calls {}, saved {}, above "
                                            "the window {}, empty updates {}",
                                            c.ncalls, c.nknown, c.nabove, c.nempty)
                              : std::string(),
                   energy_shift_text());
  }
  if (set->check_every > 0 && nevents % set->check_every == 0)
    replicas->checksum_guard(trainer->state(), c.nupdates);
  if (set->save_every > 0 && !set->save_file.empty() && c.nupdates > 0 &&
      nevents % set->save_every == 0)
    save_model(set->save_file);
}

/* ----------------------------------------------------------------------
   the MD model's forces on the owned atoms (ghost shares summed by reverse
   comm) from its output on this graph, evaluated here if not given
------------------------------------------------------------------------- */

void FixTorchFinetune::md_forces(const MLTorch::GraphInput &in, int which,
                                 const MLTorch::GraphOutput *given)
{
  const int nall = atom->nlocal + atom->nghost;
  MLTorch::GraphOutput out;
  if (!given) {
    student->evaluate_md(in, out);
    given = &out;
  }
  commflag = which;
  double **dst = comm_array();
  if (nall > 0) {
    std::memset(&dst[0][0], 0, sizeof(double) * 3 * nall);
    student->add_edge_forces(given->edge_grad.data(), &dst[0][0], 3);
  }
  sum_to_owners(which);
}

/* ----------------------------------------------------------------------
   after the parameters changed: replace the model's share of this step's
   MD forces by the new model's, so the half-kicks use the model a fresh
   force call (e.g. the set-up of the next run) would give; the trajectory
   then does not depend on where runs or restarts split it
------------------------------------------------------------------------- */

void FixTorchFinetune::refresh_forces(const MLTorch::GraphInput &in, double **before)
{
  // before == nullptr: f has no share of the model (a deferred force call)
  student->committee_changed();
  md_forces(in, COMM_RESID, nullptr);
  double **f = atom->f;
  const int nlocal = atom->nlocal;
  for (int i = 0; i < nlocal; ++i)
    for (int k = 0; k < 3; ++k) f[i][k] += before ? resid[i][k] - before[i][k] : resid[i][k];
}


/* ----------------------------------------------------------------------
   the fitted energy reference of the MD model (energy_shift fit) for the
   log: " | energy shift El1 mu1 El2 mu2 ..." per atom, in energy units
------------------------------------------------------------------------- */

std::string FixTorchFinetune::energy_shift_text() const
{
  if (trainer->energy_shift.empty()) return {};
  const auto &mu = trainer->energy_shift[0].shifts();
  const auto &el = model_->metadata().elements;
  std::string out = " | energy shift";
  for (std::size_t s = 0; s < mu.size() && s < el.size(); ++s)
    out += fmt::format(" {} {:.10g}", el[s], mu[s]);
  return out;
}

/* ----------------------------------------------------------------------
   the fix's communication of a per-atom [3] array: ghost shares summed
   onto the owners, owners' values copied to the ghosts (forces only, on
   the host: the atom style's reverse comm would also sum torques or other
   per-atom data, and with KOKKOS device communication CommKokkos would sum
   the device copy of f)
------------------------------------------------------------------------- */

void FixTorchFinetune::sum_to_owners(int which)
{
  commflag = which;
  MLTorchLmp::reverse_comm(comm, this);
}

void FixTorchFinetune::copy_to_ghosts(int which)
{
  commflag = which;
  MLTorchLmp::forward_comm(comm, this);
}

double **FixTorchFinetune::comm_array() const
{
  switch (commflag) {
    case COMM_F:
      return atom->f;
    case COMM_FPART:
      return fpart;
    case COMM_FMD:
      return fmd;
    default:
      return resid;
  }
}

int FixTorchFinetune::pack_forward_comm(int n, int *list, double *buf, int /*pbc_flag*/,
                                        int * /*pbc*/)
{
  double **a = comm_array();
  for (int i = 0; i < n; ++i)
    for (int k = 0; k < 3; ++k) buf[3 * i + k] = a[list[i]][k];
  return 3 * n;
}

void FixTorchFinetune::unpack_forward_comm(int n, int first, double *buf)
{
  double **a = comm_array();
  for (int i = 0; i < n; ++i)
    for (int k = 0; k < 3; ++k) a[first + i][k] = buf[3 * i + k];
}

int FixTorchFinetune::pack_reverse_comm(int n, int first, double *buf)
{
  double **a = comm_array();
  for (int i = 0; i < n; ++i)
    for (int k = 0; k < 3; ++k) buf[3 * i + k] = a[first + i][k];
  return 3 * n;
}

void FixTorchFinetune::unpack_reverse_comm(int n, int *list, double *buf)
{
  double **a = comm_array();
  for (int i = 0; i < n; ++i)
    for (int k = 0; k < 3; ++k) a[list[i]][k] += buf[3 * i + k];
}

/* ----------------------------------------------------------------------
   the fine-tuned model(s) to a file (atomically, by the replicas' rank 0)
------------------------------------------------------------------------- */

void FixTorchFinetune::save_model(const std::string &path)
{
  std::vector<std::string> parents;
  for (int m = 0; m < static_cast<int>(members.size()); ++m) parents.push_back(student->member_path(m));
  replicas->save(path, members, parents, member_hashes, teacher->describe(), trainer->count.nupdates,
                 set->log_every > 0);
}
