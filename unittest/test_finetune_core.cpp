/* ----------------------------------------------------------------------
   ML-TORCH core tests (no LAMMPS, no MPI): what fix torch/finetune decides
   (src/core/mltorch/finetune.h): the loss of a configuration and its
   gradient coefficients, the statistics of an update round, the
   trainable-parameter selection, the update policy, the settings'
   fingerprint and the committee's file names.
------------------------------------------------------------------------- */

#include "mltorch/finetune.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

using MLTorch::UpdateAction;

// the loss of doc/fix_torch_finetune.rst from hand-computed sums, and its coefficients as
// derivatives of the loss (central differences in E, F_i and W_k)
TEST(Loss, TermsAreTheLossAndItsDerivatives)
{
  const double wE = 0.7, wF = 1.3, wS = 0.4, N = 5.0;
  const double e = -12.0, e_ref = -12.6;
  const double w[6] = {1.0, -2.0, 0.5, 0.1, 0.0, -0.3}, w_ref[6] = {0.8, -2.2, 0.7, 0.0, 0.1, -0.3};
  const std::vector<double> F = {0.3, -0.1, 0.2}, Fref = {0.1, 0.0, 0.25};
  auto loss_of = [&](double e_, const double *w_, const std::vector<double> &F_) {
    double se_f = 0.0;
    for (int k = 0; k < 3; ++k) se_f += (F_[k] - Fref[k]) * (F_[k] - Fref[k]);
    return MLTorch::loss_terms(wE, wF, wS, e_, e_ref, w_, w_ref, se_f, N);
  };
  const auto t = loss_of(e, w, F);
  double se_w = 0.0;
  for (int k = 0; k < 6; ++k) se_w += (w[k] - w_ref[k]) * (w[k] - w_ref[k]) / (N * N);
  const double se_f = 0.04 + 0.01 + 0.0025;
  EXPECT_NEAR(t.loss, wE * 0.6 * 0.6 / 25.0 + wF * se_f / 15.0 + wS * se_w / 6.0, 1e-15);
  EXPECT_NEAR(t.de, 0.6 / N, 1e-15);
  const double h = 1e-6;
  EXPECT_NEAR(t.ce, (loss_of(e + h, w, F).loss - loss_of(e - h, w, F).loss) / (2 * h), 1e-8);
  for (int k = 0; k < 3; ++k) {
    auto Fp = F, Fm = F;
    Fp[k] += h;
    Fm[k] -= h;
    EXPECT_NEAR(t.cf * (F[k] - Fref[k]), (loss_of(e, w, Fp).loss - loss_of(e, w, Fm).loss) / (2 * h), 1e-8);
  }
  for (int k = 0; k < 6; ++k) {
    double wp[6], wm[6];
    for (int j = 0; j < 6; ++j) wp[j] = wm[j] = w[j];
    wp[k] += h;
    wm[k] -= h;
    EXPECT_NEAR(t.cw[k], (loss_of(e, wp, F).loss - loss_of(e, wm, F).loss) / (2 * h), 1e-8);
  }
}

TEST(Loss, RoundStatisticsPackAndGiveTheErrors)
{
  const double w0[6] = {0, 0, 0, 0, 0, 0}, w1[6] = {6, 0, 0, 0, 0, 0};
  MLTorch::RoundStats s;
  // two configurations of 2 and 4 atoms
  s.add(MLTorch::loss_terms(1, 1, 1, 2.0, 0.0, w1, w0, 0.5, 2.0), 0.5, 2.0);
  s.add(MLTorch::loss_terms(1, 1, 1, 0.0, 4.0, w0, w0, 1.5, 4.0), 1.5, 4.0);
  s.ngrad += 1.0;    // a replayed configuration
  double packed[MLTorch::RoundStats::SIZE];
  s.pack(packed);
  const auto u = MLTorch::RoundStats::unpack(packed);
  EXPECT_EQ(u.n, 2.0);
  EXPECT_EQ(u.ngrad, 3.0);
  EXPECT_DOUBLE_EQ(u.energy_rmse(), std::sqrt((1.0 + 1.0) / 2.0));    // per-atom errors 1 and -1
  EXPECT_DOUBLE_EQ(u.force_rmse(), std::sqrt(2.0 / 18.0));
  EXPECT_DOUBLE_EQ(u.virial_rmse(), std::sqrt((9.0 / 6.0) / 2.0));
  EXPECT_DOUBLE_EQ(u.mean_loss(), s.loss / 2.0);
}

TEST(Trainable, PrefixesSelectWholeNames)
{
  const std::vector<std::string> names = {"nets.0.weight", "nets.0.bias", "netsx.weight", "out"};
  EXPECT_TRUE(MLTorch::under_prefix("nets.0.weight", "nets"));
  EXPECT_TRUE(MLTorch::under_prefix("nets", "nets"));
  EXPECT_FALSE(MLTorch::under_prefix("netsx.weight", "nets"));
  EXPECT_EQ(MLTorch::select_trainable(names, {}, {}), std::vector<bool>(4, true));
  EXPECT_EQ(MLTorch::select_trainable(names, {"nets"}, {}),
            (std::vector<bool>{true, true, false, false}));
  EXPECT_EQ(MLTorch::select_trainable(names, {"nets", "out"}, {"nets.0.bias"}),
            (std::vector<bool>{true, false, false, true}));
  EXPECT_EQ(MLTorch::select_trainable(names, {}, {"netsx"}),
            (std::vector<bool>{true, true, false, true}));
  try {
    MLTorch::select_trainable(names, {"net"}, {});
    FAIL() << "a prefix that selects nothing must be refused";
  } catch (MLTorch::SelectionError &e) {
    EXPECT_EQ(std::string(e.what()), "train net: no model parameter is named net or net.*; "
                                     "parameters: nets.0.weight nets.0.bias netsx.weight out");
  }
  EXPECT_THROW(MLTorch::select_trainable(names, {}, {"nets.1"}), MLTorch::SelectionError);
}

TEST(UpdatePolicy, SkipsRollsBackAndAverages)
{
  MLTorch::FinetuneCounters c;
  MLTorch::UpdatePolicy p(0.5, 2.0);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(p.decide(nan, 0.1, false, true, c), UpdateAction::SkipNonFinite);
  EXPECT_EQ(p.decide(1.0, 0.6, true, true, c), UpdateAction::SkipForceError);
  EXPECT_EQ(c.nskipped, 2);
  EXPECT_LT(p.loss_average(), 0.0);    // skips do not start the average
  EXPECT_EQ(p.decide(1.0, 0.1, true, false, c), UpdateAction::Step);
  EXPECT_DOUBLE_EQ(p.loss_average(), 1.0);
  EXPECT_EQ(p.decide(2.0, 0.1, true, true, c), UpdateAction::Step);    // not above 2 x 1.0
  EXPECT_DOUBLE_EQ(p.loss_average(), 0.9 * 1.0 + 0.1 * 2.0);
  EXPECT_EQ(p.decide(2.5, 0.1, true, false, c), UpdateAction::Step);    // no good state kept
  const double avg = 0.9 * 1.1 + 0.1 * 2.5;
  EXPECT_DOUBLE_EQ(p.loss_average(), avg);
  EXPECT_EQ(p.decide(2.0 * avg + 0.1, 0.1, true, true, c), UpdateAction::Rollback);
  EXPECT_DOUBLE_EQ(p.loss_average(), 2.0 * avg + 0.1);    // the new baseline
  EXPECT_EQ(c.nupdates, 3);
  EXPECT_EQ(c.nrollbacks, 1);
  EXPECT_EQ(c.events(), 6);
  EXPECT_TRUE(p.keeps_good());
  // without rollback there is no average and never a rollback
  MLTorch::UpdatePolicy plain(0.0, 0.0);
  EXPECT_EQ(plain.decide(1e30, 1e30, true, true, c), UpdateAction::Step);
  EXPECT_FALSE(plain.keeps_good());
  EXPECT_LT(plain.loss_average(), 0.0);
  EXPECT_STREQ(MLTorch::describe(UpdateAction::Rollback), "rolled back to the last good parameters");
}

TEST(Settings, FingerprintSeesWhatReplicasMustShare)
{
  MLTorch::FinetuneSettings a, b;
  EXPECT_EQ(a.fingerprint(), b.fingerprint());
  b.opt.lr = 2e-3;
  EXPECT_NE(a.fingerprint(), b.fingerprint());
  EXPECT_NE(a.fingerprint().find("lr 0.001 "), std::string::npos) << a.fingerprint();
  b = a;
  b.accumulate = 2;
  EXPECT_NE(a.fingerprint(), b.fingerprint());
  b = a;
  b.gate_high = 0.3;
  EXPECT_NE(a.fingerprint(), b.fingerprint());
  b = a;
  b.opt.anchor = 10.0;
  EXPECT_NE(a.fingerprint(), b.fingerprint());
  // the teacher and the log interval are not part of it
  b = a;
  b.log_every = 7;
  b.teacher_style = "sw";
  EXPECT_EQ(a.fingerprint(), b.fingerprint());
}

TEST(Settings, CommitteeFileNames)
{
  EXPECT_EQ(MLTorch::member_file("out/model.pt", 0), "out/model.pt");
  EXPECT_EQ(MLTorch::member_file("out/model.pt", 2), "out/model.c2.pt");
  EXPECT_EQ(MLTorch::member_file("out.d/model", 1), "out.d/model.c1");
}

/* ----------------------------------------------------------------------
   energy_shift fit: the least-squares per-element shifts; a teacher offset
   by per-element constants moves them by exactly those constants, in the
   directions the compositions seen determine (minimum norm elsewhere);
   the state packs and unpacks
------------------------------------------------------------------------- */

TEST(EnergyShift, FitsPerElementConstants)
{
  // two elements, three compositions: residuals n . (1.5, -2.25) + noise-free
  MLTorch::EnergyShift fit(2), offset(2);
  const std::vector<std::vector<double>> n{{10, 6}, {8, 8}, {12, 2}};
  const double mu[2] = {1.5, -2.25}, c[2] = {-40.0, 7.5};
  for (const auto &k : n) {
    const double d = k[0] * mu[0] + k[1] * mu[1];
    fit.add(k, d);
    offset.add(k, d + k[0] * c[0] + k[1] * c[1]);
  }
  EXPECT_NEAR(fit.shifts()[0], mu[0], 1e-12);
  EXPECT_NEAR(fit.shifts()[1], mu[1], 1e-12);
  EXPECT_NEAR(offset.shifts()[0] - fit.shifts()[0], c[0], 1e-10);
  EXPECT_NEAR(offset.shifts()[1] - fit.shifts()[1], c[1], 1e-10);
  EXPECT_EQ(fit.configurations(), 3);

  // one composition only: n . mu is determined, the rest is minimum norm
  MLTorch::EnergyShift one(2);
  one.add({4, 4}, 12.0);
  EXPECT_NEAR(one.shift_of({4, 4}), 12.0, 1e-12);
  EXPECT_NEAR(one.shifts()[0], one.shifts()[1], 1e-12);

  MLTorch::EnergyShift back(2);
  back.unpack(fit.pack());
  EXPECT_EQ(back.shifts(), fit.shifts());
  EXPECT_EQ(back.configurations(), 3);
  EXPECT_TRUE(MLTorch::EnergyShift(2).pack().empty());
  EXPECT_THROW(MLTorch::EnergyShift(3).unpack(fit.pack()), std::runtime_error);
  EXPECT_THROW(fit.add({1.0}, 0.0), std::invalid_argument);
}
