/* ----------------------------------------------------------------------
   ML-TORCH: fix torch/finetune's update decisions and optimizers.
   - Decisions.*     freeze, skip and rollback
   - Optimizers.*    each update against the optimizer's, the schedule's,
                     the momentum's and the clip's formula
------------------------------------------------------------------------- */

#include "finetune_fixtures.h"

#include <functional>

/* ----------------------------------------------------------------------
   train/freeze select parameters; skip and rollback decisions are taken
   from reduced values, so every rank and replica agrees (the checksum
   after every update would stop the run otherwise)
------------------------------------------------------------------------- */

TEST(Decisions, FreezeKeepsParametersFixed)
{
  Lammps l(MPI_COMM_WORLD);
  hot_student(l, 5);
  l.cmd("fix ft all torch/finetune 1 " + teacher() + " log 0 train nets freeze nets.0.4");
  const auto names = l.fix()->model()->parameter_names();
  const auto sizes = l.fix()->model()->parameter_sizes();
  const auto before = l.params();
  l.cmd("run 5 post no");
  const auto after = l.params();
  std::size_t off = 0;
  for (std::size_t k = 0; k < names.size(); ++k) {
    double change = 0.0;
    for (int64_t q = 0; q < sizes[k]; ++q) change = std::max(change, std::fabs(after[off + q] - before[off + q]));
    const bool trained = names[k].rfind("nets", 0) == 0 && names[k].rfind("nets.0.4", 0) != 0;
    if (trained)
      EXPECT_GT(change, 0.0) << names[k];
    else
      EXPECT_EQ(change, 0.0) << names[k];
    off += sizes[k];
  }
  EXPECT_EQ(l.fix()->last_gradient().size(), 32u * 80 + 32 + 32 * 32 + 32);
}

/* ----------------------------------------------------------------------
   the optimizers, schedules, momentum and clipping as the fix applies them:
   each update's parameter change against the textbook formula evaluated on
   the update's own gradient (the probe's last_gradient(), before clipping),
   with the learning rate of output 6 and the norm of output 5
------------------------------------------------------------------------- */

namespace {
struct Update {
  std::vector<std::vector<double>> before, after;    // per member
  std::vector<double> grad;                          // all members, model order
  double lr, gnorm, anchor;    // outputs 6, 5 and 18
};

// `n` updates of fix torch/finetune `args` (every step), one run each
std::vector<Update> updates_of(const std::string &args, int n, const std::string &files = student)
{
  Lammps l(MPI_COMM_WORLD);
  l.cmds(silicon(2, 5, "ortho"));
  l.cmds({"velocity all create 900 4928 loop geom", "pair_style torch", "pair_coeff * * " + files + " Si",
          "fix md all nve", "fix ft all torch/finetune 1 " + teacher() + " log 0 " + args});
  auto members = [&] {
    std::vector<std::vector<double>> p;
    for (int m = 0; m < l.fix()->member_count(); ++m) {
      // the parameters (all trainable here) come first, then the buffers
      const auto *model = l.fix()->member(m);
      EXPECT_EQ(model->num_trainable(), model->num_parameters());
      const std::string b = model->state_bytes();
      p.emplace_back(model->num_parameters());
      std::memcpy(p.back().data(), b.data(), p.back().size() * sizeof(double));
    }
    return p;
  };
  std::vector<Update> u;
  for (int k = 0; k < n; ++k) {
    Update up;
    up.before = members();
    l.cmd("run 1 post no");
    up.after = members();
    up.grad = l.fix()->last_gradient();
    up.lr = l.fix()->compute_vector(5);
    up.gnorm = l.fix()->compute_vector(4);
    up.anchor = l.fix()->compute_vector(17);
    EXPECT_EQ(l.fix()->updates(), k + 1);
    u.push_back(std::move(up));
  }
  return u;
}

double worst_step_error = 0.0;    // reported by each test

double norm(const std::vector<double> &v, std::size_t off = 0, std::size_t n = 0)
{
  if (n == 0) n = v.size() - off;
  double s = 0.0;
  for (std::size_t k = off; k < off + n; ++k) s += v[k] * v[k];
  return std::sqrt(s);
}

// largest |after - before - want| over the largest |want|, less the
// rounding of the parameter itself (after = before + step, rounded to
// half an ulp of the parameter, which is large beside small steps)
double step_error(const Update &u, const std::function<double(std::size_t, double)> &want, int m = 0,
                  std::size_t off = 0)
{
  const auto &b = u.before[m], &a = u.after[m];
  double err = 0.0, scale = 0.0;
  for (std::size_t k = 0; k < b.size(); ++k) {
    const double w = want(off + k, b[k]);
    const double rounding = 1.2e-16 * std::max(std::fabs(a[k]), std::fabs(b[k]));
    err = std::max(err, std::fabs(a[k] - b[k] - w) - rounding);
    scale = std::max(scale, std::fabs(w));
  }
  EXPECT_GT(scale, 0.0);
  worst_step_error = std::max(worst_step_error, err / scale);
  return err / scale;
}
}    // namespace

TEST(Optimizers, SgdSchedulesAndMomentum)
{
  if (nprocs > 1) GTEST_SKIP() << "one process";
  worst_step_error = 0.0;
  const double lr = 1e-3;
  // the schedules' learning rates, update u = 0, 1, ...
  struct Case {
    std::string args;
    std::function<double(int)> lr_of;
  };
  const std::vector<Case> cases{
      {"schedule exp 0.5", [&](int u) { return lr * std::pow(0.5, u); }},
      {"schedule step 2 0.1", [&](int u) { return lr * std::pow(0.1, u / 2); }},
      {"schedule cosine 3 1e-4",
       [&](int u) { return u >= 3 ? 1e-4 : 1e-4 + 0.5 * (lr - 1e-4) * (1 + std::cos(M_PI * u / 3.0)); }}};
  for (const auto &c : cases) {
    const auto ups = updates_of("optimizer sgd lr 1e-3 " + c.args, 5);
    ASSERT_EQ(ups[0].grad.size(), ups[0].before[0].size()) << "every parameter trained";
    for (int u = 0; u < 5; ++u) {
      EXPECT_NEAR(ups[u].lr, c.lr_of(u), 1e-18) << c.args << " update " << u;
      EXPECT_NEAR(ups[u].gnorm, norm(ups[u].grad), 1e-12 * ups[u].gnorm);
      // plain SGD: p -= lr g
      const double e = step_error(ups[u], [&](std::size_t k, double) { return -c.lr_of(u) * ups[u].grad[k]; });
      EXPECT_LE(e, 1e-14) << c.args << " update " << u;
    }
  }
  // momentum mu (PyTorch's SGD, no dampening): b = mu b + g, p -= lr b
  const double mu = 0.9;
  const auto ups = updates_of("optimizer sgd lr 1e-3 momentum 0.9", 3);
  std::vector<double> b(ups[0].grad.size(), 0.0);
  for (int u = 0; u < 3; ++u) {
    for (std::size_t k = 0; k < b.size(); ++k) b[k] = (u == 0 ? 0.0 : mu * b[k]) + ups[u].grad[k];
    EXPECT_LE(step_error(ups[u], [&](std::size_t k, double) { return -lr * b[k]; }), 1e-14) << "update " << u;
  }
  const double worst = worst_step_error;
  // the same updates without the momentum term are another trajectory
  EXPECT_GT(step_error(ups[2], [&](std::size_t k, double) { return -lr * ups[2].grad[k]; }), 0.1);
  std::printf("[ optim    ] sgd, 3 schedules and momentum: step vs formula %.1e\n", worst);
}

TEST(Optimizers, AdamAndAdamWFollowTheirFormulas)
{
  if (nprocs > 1) GTEST_SKIP() << "one process";
  worst_step_error = 0.0;
  const double lr = 1e-3, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.01;
  for (const std::string kind : {"adam", "adamw"}) {
    const auto ups = updates_of("optimizer " + kind + " lr 1e-3 weight_decay 0.01", 3);
    const std::size_t n = ups[0].grad.size();
    std::vector<double> m(n, 0.0), v(n, 0.0);
    for (int u = 0; u < 3; ++u) {
      const auto &up = ups[u];
      const double bc1 = 1 - std::pow(b1, u + 1), bc2 = 1 - std::pow(b2, u + 1);
      const double e = step_error(up, [&](std::size_t k, double p) {
        // adam: L2 decay added to the gradient; adamw: decoupled, p *= 1 - lr wd first
        const double g = up.grad[k] + (kind == "adam" ? wd * p : 0.0);
        m[k] = b1 * m[k] + (1 - b1) * g;
        v[k] = b2 * v[k] + (1 - b2) * g * g;
        const double q = kind == "adamw" ? p * (1 - lr * wd) : p;
        return q - (lr / bc1) * m[k] / (std::sqrt(v[k]) / std::sqrt(bc2) + eps) - p;
      });
      EXPECT_LE(e, 1e-13) << kind << " update " << u;
    }
  }
  std::printf("[ optim    ] adam, adamw with weight decay: step vs formula %.1e\n", worst_step_error);
}

// anchor L (L2-SP): the loss gains (L/2) |theta - theta0|^2, theta0 the
// parameters the fix started from, so each step's gradient gains
// L (theta - theta0); output 18 is the term after the update
TEST(Optimizers, AnchorPullsTowardTheStart)
{
  if (nprocs > 1) GTEST_SKIP() << "one process";
  worst_step_error = 0.0;
  const double lr = 1e-3, anchor = 200.0;
  const auto ups = updates_of("optimizer sgd lr 1e-3 anchor 200", 4);
  const auto &start = ups[0].before[0];
  double worst_term = 0.0;
  for (int u = 0; u < 4; ++u) {
    const auto &up = ups[u];
    const double e = step_error(up, [&](std::size_t k, double p) {
      return -lr * (up.grad[k] + anchor * (p - start[k]));
    });
    EXPECT_LE(e, 1e-14) << "update " << u;
    double sum = 0.0;
    for (std::size_t k = 0; k < start.size(); ++k) sum += (up.after[0][k] - start[k]) * (up.after[0][k] - start[k]);
    const double term = 0.5 * anchor * sum;
    EXPECT_GT(term, 0.0);
    EXPECT_NEAR(up.anchor, term, 1e-12 * term) << "output 18 after update " << u;
    worst_term = std::max(worst_term, std::fabs(up.anchor - term) / term);
  }
  const double worst = worst_step_error;
  // without the pull the later steps are another trajectory
  EXPECT_GT(step_error(ups[2], [&](std::size_t k, double) { return -lr * ups[2].grad[k]; }), 0.1);
  std::printf("[ optim    ] anchor (L2-SP) with sgd: step vs formula %.1e, output 18 vs "
              "(L/2)|theta - theta0|^2 %.1e\n", worst, worst_term);
}

TEST(Optimizers, ClipScalesEachMemberByItsOwnNorm)
{
  if (nprocs > 1) GTEST_SKIP() << "one process";
  worst_step_error = 0.0;
  const double lr = 1e-3, clip = 1e-4;
  // PyTorch's clip_grad_norm_: g * clip / (|g| + 1e-6) where |g| > clip
  const auto one = updates_of("optimizer sgd lr 1e-3 clip 1e-4", 2);
  for (const auto &up : one) {
    const double g = norm(up.grad);
    ASSERT_GT(g, 10 * clip);
    EXPECT_NEAR(up.gnorm, g, 1e-12 * g) << "output 5: the norm before clipping";
    EXPECT_LE(step_error(up, [&](std::size_t k, double) { return -lr * up.grad[k] * clip / (g + 1e-6); }), 1e-14);
  }
  // a committee: each member clipped by its own gradient's norm
  const auto two = updates_of("optimizer sgd lr 1e-3 clip 1e-4", 2, committee_files());
  for (const auto &up : two) {
    ASSERT_EQ(up.before.size(), 2u);
    const std::size_t n0 = up.before[0].size();
    const double g0 = norm(up.grad, 0, n0), g1 = norm(up.grad, n0);
    EXPECT_GT(std::fabs(g0 - g1), 1e-3 * g0) << "the members' norms differ";
    EXPECT_NEAR(up.gnorm, g0, 1e-12 * g0) << "output 5: the first member's norm";
    for (int m = 0; m < 2; ++m) {
      const double gm = m == 0 ? g0 : g1;
      EXPECT_LE(step_error(up, [&](std::size_t k, double) { return -lr * up.grad[k] * clip / (gm + 1e-6); }, m,
                           m == 0 ? 0 : n0),
                1e-14)
          << "member " << m;
    }
  }
  std::printf("[ optim    ] clip, one model and each committee member: step vs formula %.1e\n",
              worst_step_error);
}

TEST(Decisions, SkipAndRollbackAreCollective)
{
  const bool replicas = nprocs > 1;
  Lammps l(MPI_COMM_WORLD, replicas ? partitions() : std::vector<std::string>{});
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  hot_student(l, 40 + (replicas ? rank : 0));
  // every update's force error is above the threshold: all are skipped
  l.cmd("fix ft all torch/finetune 1 " + teacher() + " log 0 check 1 max_force_error 1e-6");
  const auto before = l.params();
  l.cmd("run 10 post no");
  EXPECT_EQ(l.fix()->compute_vector(7), 10.0);    // skipped
  EXPECT_EQ(l.fix()->updates(), 0);
  EXPECT_EQ(max_diff(before, l.params()), 0.0);
  l.cmd("unfix ft");
  // a learning rate far too large makes the loss jump: rollbacks restore the last good model
  // (atoms held still, so that the bad steps cannot wreck the trajectory)
  l.cmd("unfix md");
  l.cmd("fix ft all torch/finetune 1 " + teacher() + " log 0 check 1 lr 0.3 rollback 3");
  // step by step: a rollback must give back parameters of an earlier step
  // (the last good ones), not leave those it found (a restore that does
  // nothing would keep the previous step's parameters)
  std::vector<std::vector<double>> seen{l.params()};
  double counted = 0.0;
  int restored = 0;
  for (int step = 0; step < 30; ++step) {
    l.cmd("run 1 post no");
    const auto now = l.params();
    const double n = l.fix()->compute_vector(8);
    if (n > counted) {
      counted = n;
      EXPECT_GT(max_diff(now, seen.back()), 0.0) << "rollback on step " << step << " kept the parameters";
      bool earlier = false;
      for (std::size_t k = 0; k + 1 < seen.size(); ++k) earlier = earlier || max_diff(now, seen[k]) == 0.0;
      EXPECT_TRUE(earlier) << "rollback on step " << step << " restored no earlier parameters";
      restored += earlier ? 1 : 0;
    }
    seen.push_back(now);
  }
  const double rollbacks = l.fix()->compute_vector(8);
  EXPECT_GE(rollbacks, 1.0);
  EXPECT_EQ(restored, static_cast<int>(rollbacks));
  double rb_min = 0.0, rb_max = 0.0;
  MPI_Allreduce(&rollbacks, &rb_min, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&rollbacks, &rb_max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  EXPECT_EQ(rb_min, rb_max);
  if (me == 0)
    std::printf("[ decisions ] 10 of 10 updates skipped; %g rollback(s) in 30 updates, each back "
                "to an earlier step's parameters\n", rollbacks);
}
