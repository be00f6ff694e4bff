/* ----------------------------------------------------------------------
   ML-TORCH: machine-learned potentials for LAMMPS.
   The steps of distributed training (distributed.h).
------------------------------------------------------------------------- */

#include "mltorch/distributed.h"

#include "mltorch/collectives.h"
#include "mltorch/committee.h"
#include "mltorch/model.h"
#include "mltorch/replay.h"
#include "mltorch/training.h"

#include <cmath>
#include <exception>

namespace MLTorch {

std::string agreed_failure(MPI_Comm comm, const std::string &prefix,
                           const std::function<void()> &work)
{
  std::string failure;
  try {
    work();
  } catch (std::exception &e) {
    failure = prefix + e.what();
  }
  return first_failure(comm, failure.empty(), failure);
}

std::string replay_gradient(ReplayPiece &r, Model &model, const FinetuneSettings &set,
                            bool layered, MPI_Comm world)
{
  GraphInput in = r.graph();
  // a piece stored under the halo exchange holds ghosts one cutoff deep;
  // partial forces and residual weights travel along the same owner map
  ReplayExchange exchange(r, world);
  if (layered) in.halo = &exchange;
  double e_part = 0.0, w_part[6];
  std::vector<double> nf;
  std::string failure = agreed_failure(world, "replay: ", [&] {
    model.forward_train(in, e_part, nf, w_part);
  });
  if (!failure.empty()) return failure;

  // partial forces of ghost nodes -> owners: the piece's reverse exchange
  std::vector<double> F(3 * r.n_local);
  exchange.reverse(nf.data(), F.data(), 3);
  double local[8] = {e_part, w_part[0], w_part[1], w_part[2], w_part[3], w_part[4], w_part[5], 0.0};
  for (int64_t n = 0; n < 3 * r.n_local; ++n) {
    const double d = F[n] - r.fref[n];
    local[7] += d * d;
  }
  double sum[8];
  MPI_Allreduce(local, sum, 8, MPI_DOUBLE, MPI_SUM, world);
  const auto t = loss_terms(set.w_energy, set.w_force, set.w_stress, sum[0], r.e_ref, sum + 1,
                            r.w_ref, sum[7], r.natoms);

  // residual weights: own nodes directly, ghost nodes from their owners
  std::vector<double> owned(3 * r.n_local), weights(3 * r.n_nodes);
  for (int64_t n = 0; n < 3 * r.n_local; ++n) owned[n] = t.cf * (F[n] - r.fref[n]);
  exchange.forward(owned.data(), weights.data(), 3);
  return agreed_failure(world, "replay: ", [&] { model.backward_train(weights, t.ce, t.cw); });
}

UpdateOutcome update(TrainingState &training, UpdatePolicy &policy, FinetuneCounters &count,
                     const FinetuneSettings &set, const RoundStats &mine, bool replica_root,
                     MPI_Comm universe, std::vector<double> &grad)
{
  UpdateOutcome out;
  std::vector<double> buf = training.gradient();
  const std::size_t ngrad = buf.size();
  buf.resize(ngrad + RoundStats::SIZE, 0.0);
  if (replica_root) mine.pack(buf.data() + ngrad);
  const double t0 = MPI_Wtime();
  const std::vector<double> sum = sum_everywhere(buf, universe);
  out.t_reduce = MPI_Wtime() - t0;
  training.zero_grad();

  out.all = RoundStats::unpack(sum.data() + ngrad);
  // the mean over the configurations (fresh and replayed) of all replicas
  grad.assign(sum.begin(), sum.begin() + ngrad);
  average_gradient(out.all.ngrad, grad.data(), static_cast<long>(grad.size()));
  out.finite = std::isfinite(out.all.mean_loss());
  for (std::size_t k = 0; out.finite && k < ngrad; ++k) out.finite = std::isfinite(grad[k]);

  out.lr = set.schedule.lr(set.opt.lr, count.nupdates);
  out.action = policy.decide(out.all.mean_loss(), out.all.force_rmse(), out.finite,
                             training.has_good(), count);
  if (out.action == UpdateAction::Rollback) {
    training.restore_good();
  } else if (out.action == UpdateAction::Step) {
    if (policy.keeps_good()) training.keep_good();
    out.failure = agreed_failure(universe, "optimizer step failed: ", [&] {
      out.gnorm = training.step(grad, out.lr, set.clip)[0];
    });
  }
  return out;
}

}    // namespace MLTorch
