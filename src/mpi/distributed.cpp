/* ----------------------------------------------------------------------
   ML-TORCH: machine-learned potentials for LAMMPS.
   The steps of distributed training (distributed.h).
------------------------------------------------------------------------- */

#include "mltorch/distributed.h"

#include "mltorch/dataset.h"

#include "mltorch/collectives.h"
#include "mltorch/committee.h"
#include "mltorch/model.h"
#include "mltorch/runtime.h"
#include "mltorch/replay.h"
#include "mltorch/training.h"

#include <algorithm>
#include <cstring>
#include <cmath>
#include <exception>

namespace MLTorch {

void AgreedExchange::agree()
{
  // first_failure(): what a rank that failed calls in agreed_failure()
  const std::string f = first_failure(comm_, true, "");
  if (!f.empty()) {
    tripped_ = true;
    message_ = f;
    throw std::runtime_error(f);
  }
}

void AgreedExchange::forward(const double *owned, double *all, int width)
{
  agree();
  inner_->forward(owned, all, width);
}

void AgreedExchange::reverse(const double *all, double *owned, int width)
{
  agree();
  inner_->reverse(all, owned, width);
}

std::string agreed_failure(MPI_Comm comm, const std::string &prefix,
                           const std::function<void()> &work, const AgreedExchange *guard)
{
  std::string failure;
  try {
    work();
  } catch (std::exception &e) {
    // a failure the exchange agreed on has been through first_failure()
    if (guard && guard->tripped()) return guard->message();
    failure = prefix + e.what();
  }
  return first_failure(comm, failure.empty(), failure);
}

ConfigurationLoss configuration_loss(double e, double e_ref, const double *w, const double *w_ref,
                                     double natoms, double se_f, const FinetuneSettings &set,
                                     MPI_Comm world)
{
  double local[16] = {e, e_ref};
  for (int k = 0; k < 6; ++k) {
    local[2 + k] = w[k];
    local[8 + k] = w_ref[k];
  }
  local[14] = natoms;
  local[15] = se_f;
  double sum[16];
  MPI_Allreduce(local, sum, 16, MPI_DOUBLE, MPI_SUM, world);
  ConfigurationLoss c;
  c.e = sum[0];
  c.e_ref = sum[1];
  std::copy(sum + 2, sum + 8, c.w);
  std::copy(sum + 8, sum + 14, c.w_ref);
  c.natoms = sum[14];
  c.se_f = sum[15];
  if (c.natoms >= 1.0)
    c.terms = loss_terms(set.w_energy, set.w_force, set.w_stress, c.e, c.e_ref, c.w, c.w_ref,
                         c.se_f, c.natoms);
  return c;
}

std::string whole_configuration_gradient(Model &model, const LabelledConfiguration &c,
                                         double e_label, const FinetuneSettings &set,
                                         const std::string &prefix, ConfigurationGradient &out)
{
  WholeConfiguration owners(c.graph.natoms);
  LabelShares labels;
  labels.fref = c.fref.data();
  labels.w_ref = c.w_ref;
  labels.natoms = c.natoms();
  labels.e_ref = [e_label](double) { return e_label; };
  if (c.weight == 1.0)
    return configuration_gradient(model, c.graph.input(), owners, labels, set, MPI_COMM_SELF,
                                  prefix, out);
  // the frame's own weight scales its loss
  FinetuneSettings weighted = set;
  weighted.w_energy *= c.weight;
  weighted.w_force *= c.weight;
  weighted.w_stress *= c.weight;
  return configuration_gradient(model, c.graph.input(), owners, labels, weighted, MPI_COMM_SELF,
                                prefix, out);
}

std::string configuration_gradient(Model &model, const GraphInput &in, HaloExchange &owners,
                                   const LabelShares &labels, const FinetuneSettings &set,
                                   MPI_Comm world, const std::string &prefix,
                                   ConfigurationGradient &out)
{
  // a layered model's exchanges agree first that no rank has failed: a rank
  // that fails between two exchanges leaves no other waiting in the next one
  AgreedExchange guard(in.halo, world);
  GraphInput gin = in;
  if (in.halo) gin.halo = &guard;
  std::vector<double> node_forces;
  std::string failure = agreed_failure(
      world, prefix, [&] { model.forward_train(gin, out.e_part, node_forces, out.w_part); }, &guard);
  if (!failure.empty()) return failure;

  // partial forces of every node -> the owners' full forces
  const int64_t nl3 = 3 * in.n_local;
  out.forces.assign(nl3, 0.0);
  owners.reverse(node_forces.data(), out.forces.data(), 3);
  const double *F = out.forces.data(), *fref = labels.fref;
  double se_f = 0.0;
  for (int64_t k = 0; k < nl3; ++k) se_f += (F[k] - fref[k]) * (F[k] - fref[k]);
  const double e_ref = labels.e_ref ? labels.e_ref(out.e_part) : 0.0;
  out.loss = configuration_loss(out.e_part, e_ref, out.w_part, labels.w_ref, labels.natoms, se_f,
                                set, world);
  // the same sum on every rank of the replica, so all of them return it
  if (out.loss.natoms < 1.0)
    return prefix + "no atom of a type the model covers; nothing to train on";
  const auto &t = out.loss.terms;

  // residual weights on the owned nodes, copied to every node of their atoms
  std::vector<double> owned(nl3), weights(3 * in.n_nodes);
  for (int64_t k = 0; k < nl3; ++k) owned[k] = t.cf * (F[k] - fref[k]);
  owners.forward(owned.data(), weights.data(), 3);
  return agreed_failure(
      world, prefix, [&] { model.backward_train(weights, t.ce, t.cw); }, &guard);
}

std::string replay_gradient(ReplayPiece &r, Model &model, const FinetuneSettings &set,
                            bool layered, MPI_Comm world)
{
  // a piece stored under the halo exchange holds ghosts one cutoff deep;
  // partial forces and residual weights travel along the same owner map
  ReplayExchange exchange(r, world);
  GraphInput in = r.graph();
  if (layered) in.halo = &exchange;
  // the stored labels and atom count are the configuration's (one rank
  // brings them into the sums)
  int me = 0;
  MPI_Comm_rank(world, &me);
  const double zero[6] = {0, 0, 0, 0, 0, 0};
  LabelShares labels;
  labels.fref = r.fref.data();
  labels.w_ref = me == 0 ? r.w_ref : zero;
  labels.natoms = me == 0 ? r.natoms : 0.0;
  labels.e_ref = [&](double) { return me == 0 ? r.e_ref : 0.0; };
  ConfigurationGradient g;
  return configuration_gradient(model, in, exchange, labels, set, world, "replay: ", g);
}

DistributedTrainer::DistributedTrainer(const FinetuneSettings &settings,
                                       std::vector<std::shared_ptr<Model>> models, MPI_Comm w,
                                       MPI_Comm u, int partition_index) :
    replay(settings.replay_capacity, settings.replay_mbytes * 1024.0 * 1024.0),
    policy(settings.max_force_error, settings.rollback_factor), set(settings),
    members(std::move(models)), training(std::make_unique<TrainingState>(members, settings.opt)),
    world(w), universe(u), partition(partition_index)
{
  if (settings.energy_shift == 1)
    energy_shift.assign(members.size(),
                        EnergyShift(static_cast<int>(members[0]->metadata().elements.size())));
}

DistributedTrainer::~DistributedTrainer() = default;

void DistributedTrainer::end_round()
{
  round = RoundStats();
  replay.new_round();
}

bool DistributedTrainer::gate(double deviation)
{
  switch (MLTorch::gate(deviation, set.gate_low, set.gate_high)) {
    case Gate::Known:
      ++count.nknown;
      return false;
    case Gate::Skip:
      ++count.nabove;
      return false;
    default:
      return true;
  }
}

std::string DistributedTrainer::fingerprint(const std::vector<std::string> &hashes, int pending,
                                            long long phase) const
{
  std::string mask, out = "model";
  for (bool t : members[0]->trainable()) mask += t ? '1' : '0';
  for (const auto &h : hashes) out += " " + h;
  return out + " trainable " + content_hash(mask) + " | " + set.fingerprint() + " | updates " +
      std::to_string(count.nupdates) + " skipped " + std::to_string(count.nskipped) +
      " rollbacks " + std::to_string(count.nrollbacks) + " pending " + std::to_string(pending) +
      " phase " + std::to_string(phase);
}

DistributedTrainer::Outcome DistributedTrainer::update(bool replica_root, bool layered,
                                                       const std::string &prefix)
{
  Outcome out;
  // uncertainty gating: replicas label independently. Where no replica
  // labelled anything there is no update (nor replay): every rank of every
  // replica learns that from one reduced count
  if (set.gated) {
    double mine = replica_root ? round.n : 0.0;    // not const: MPI stubs take void *
    double all = 0.0;
    MPI_Allreduce(&mine, &all, 1, MPI_DOUBLE, MPI_SUM, universe);
    if (all == 0.0) {
      ++count.nempty;
      end_round();
      training->zero_grad();
      out.empty = true;
      return out;
    }
  }
  // replayed configurations join the gradient: deterministic picks among
  // those stored before this round, the same on every rank of the replica;
  // a replica's failure stops every replica (before any reduction of theirs)
  std::string failure;
  for (int k : replay_picks(count.events(), replay.size() - replay.fresh(), set.replay_mix)) {
    for (auto &member : members)
      if (failure.empty()) failure = replay_gradient(replay[k], *member, set, layered, world);
    round.ngrad += 1.0;
  }
  failure = replicas_failure(world, universe, partition, failure.empty() ? failure : prefix + failure);
  if (!failure.empty()) {
    out.failure = failure;
    return out;
  }

  std::vector<double> buf = training->gradient();
  const std::size_t ngrad = buf.size();
  buf.resize(ngrad + RoundStats::SIZE, 0.0);
  if (replica_root) round.pack(buf.data() + ngrad);
  const double t0 = MPI_Wtime();
  const std::vector<double> sum = sum_everywhere(buf, universe);
  time_reduce += MPI_Wtime() - t0;
  training->zero_grad();

  out.all = RoundStats::unpack(sum.data() + ngrad);
  // the mean over the configurations (fresh and replayed) of all replicas
  last_grad.assign(sum.begin(), sum.begin() + ngrad);
  average_gradient(out.all.ngrad, last_grad.data(), static_cast<long>(last_grad.size()));
  out.finite = std::isfinite(out.all.mean_loss());
  for (std::size_t k = 0; out.finite && k < ngrad; ++k) out.finite = std::isfinite(last_grad[k]);

  out.lr = set.schedule.lr(set.opt.lr, count.nupdates);
  out.action = policy.decide(out.all.mean_loss(), out.all.force_rmse(), out.finite,
                             training->has_good(), count);
  if (out.action == UpdateAction::Rollback) {
    training->restore_good();
  } else if (out.action == UpdateAction::Step) {
    if (policy.keeps_good()) training->keep_good();
    out.failure = agreed_failure(universe, prefix + "optimizer step failed: ", [&] {
      out.gnorm = training->step(last_grad, out.lr, set.clip)[0];
    });
  }
  const double v[NSTATS] = {out.all.mean_loss(), out.all.energy_rmse(), out.all.force_rmse(),
                            out.all.virial_rmse(), out.gnorm, out.lr,
                            static_cast<double>(count.nupdates), static_cast<double>(count.nskipped),
                            static_cast<double>(count.nrollbacks), out.all.ngrad,
                            static_cast<double>(replay.size())};
  std::copy(v, v + NSTATS, stats);
  end_round();
  return out;
}

TrainingRecord DistributedTrainer::record(const std::string &model_hash,
                                          const std::vector<std::string> &hashes) const
{
  TrainingRecord r;
  static_cast<FinetuneCounters &>(r) = count;
  r.model_hash = model_hash;
  r.member_hashes = hashes;
  r.loss_ema = policy.loss_average();
  r.stats.assign(stats, stats + NSTATS);
  r.parameters = training->parameters();
  r.optimizer = training->optimizer_state();
  r.good_parameters = training->good_parameters();
  r.good_optimizer = training->good_optimizer_state();
  for (const auto &e : energy_shift) {
    const std::string b = e.pack();
    const int64_t n = static_cast<int64_t>(b.size());
    r.energy_shift.append(reinterpret_cast<const char *>(&n), sizeof(n));
    r.energy_shift += b;
  }
  return r;
}

void DistributedTrainer::restore(const TrainingRecord &r)
{
  training->load_parameters(r.parameters);
  training->load_optimizer_state(r.optimizer);
  training->load_good(r.good_parameters, r.good_optimizer);
  count = r;
  policy.set_loss_average(r.loss_ema);
  std::copy(r.stats.begin(), r.stats.end(), stats);
  // the energy references (a record without them, or a run without the
  // keyword, starts the fit afresh)
  std::size_t at = 0;
  for (auto &e : energy_shift) {
    int64_t n = 0;
    if (at + sizeof(n) > r.energy_shift.size()) {
      e.resize(e.nspecies());
      continue;
    }
    std::memcpy(&n, r.energy_shift.data() + at, sizeof(n));
    at += sizeof(n);
    if (n < 0 || at + static_cast<std::size_t>(n) > r.energy_shift.size())
      throw std::runtime_error("the restart record's energy shift state is damaged");
    e.unpack(r.energy_shift.substr(at, static_cast<std::size_t>(n)));
    at += static_cast<std::size_t>(n);
  }
}

double DistributedTrainer::bytes() const
{
  return replay.bytes() +
      static_cast<double>(training->good_parameters().size() + training->good_optimizer_state().size());
}

}    // namespace MLTorch
