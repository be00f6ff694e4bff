/* ----------------------------------------------------------------------
   ML-TORCH: machine-learned potentials for LAMMPS.
   What fix torch/finetune decides (finetune.h).
------------------------------------------------------------------------- */

#include "mltorch/finetune.h"

#include <torch/torch.h>

#include <charconv>
#include <cstring>
#include <stdexcept>
#include <cmath>
#include <sstream>

namespace MLTorch {

namespace {
// the shortest text that reads back as v (as fmt's "{}")
std::string num(double v)
{
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
}
}    // namespace

std::string FinetuneSettings::fingerprint() const
{
  std::ostringstream s;
  s << "uncertainty " << (gated ? 1 : 0) << ' ' << num(gate_low) << ' ' << num(gate_high)
    << " | N " << nevery << " accumulate " << accumulate << " replay " << replay_mix << " check "
    << check_every << " save " << save_every << ' ' << (save_file.empty() ? 0 : 1) << " | "
    << opt.kind << " lr " << num(opt.lr) << " wd " << num(opt.weight_decay) << " anchor " << num(opt.anchor) << " momentum "
    << num(opt.momentum) << " schedule " << schedule.kind << ' ' << num(schedule.a) << ' '
    << num(schedule.b) << " clip " << num(clip) << " max_force_error " << num(max_force_error)
    << " rollback " << num(rollback_factor) << " weights " << num(w_energy) << ' ' << num(w_force)
    << ' ' << num(w_stress) << " | dataset " << dataset_per_update << ' ' << num(dataset_weight)
    << ' ' << dataset_seed << ' ' << (dataset_file.empty() ? 0 : 1);
  return s.str();
}

LossTerms loss_terms(double wE, double wF, double wS, double e, double e_ref, const double *w,
                     const double *w_ref, double se_f, double natoms)
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

void RoundStats::add(const LossTerms &t, double se_f_config, double natoms)
{
  loss += t.loss;
  se_e += t.de * t.de;
  se_f += se_f_config;
  nf += 3.0 * natoms;
  se_w += t.se_w / 6.0;
  n += 1.0;
  ngrad += 1.0;
}

void RoundStats::pack(double *out) const
{
  const double v[SIZE] = {loss, se_e, se_f, nf, se_w, n, ngrad};
  for (int k = 0; k < SIZE; ++k) out[k] = v[k];
}

RoundStats RoundStats::unpack(const double *in)
{
  RoundStats s;
  s.loss = in[0];
  s.se_e = in[1];
  s.se_f = in[2];
  s.nf = in[3];
  s.se_w = in[4];
  s.n = in[5];
  s.ngrad = in[6];
  return s;
}

double RoundStats::energy_rmse() const { return std::sqrt(se_e / n); }
double RoundStats::force_rmse() const { return std::sqrt(se_f / nf); }
double RoundStats::virial_rmse() const { return std::sqrt(se_w / n); }

bool under_prefix(const std::string &name, const std::string &prefix)
{
  if (name == prefix) return true;
  return name.size() > prefix.size() && name.compare(0, prefix.size(), prefix) == 0 &&
      name[prefix.size()] == '.';
}

std::vector<bool> select_trainable(const std::vector<std::string> &names,
                                   const std::vector<std::string> &train,
                                   const std::vector<std::string> &freeze)
{
  std::string all;
  for (const auto &n : names) all += (all.empty() ? "" : " ") + n;
  auto fail = [&](const char *kw, const std::string &pre) {
    throw SelectionError(std::string(kw) + " " + pre + ": no model parameter is named " + pre +
                         " or " + pre + ".*; parameters: " + all);
  };
  std::vector<bool> mask(names.size(), train.empty());
  for (const auto &pre : train) {
    bool found = false;
    for (std::size_t k = 0; k < names.size(); ++k)
      if (under_prefix(names[k], pre)) mask[k] = found = true;
    if (!found) fail("train", pre);
  }
  for (const auto &pre : freeze) {
    bool found = false;
    for (std::size_t k = 0; k < names.size(); ++k)
      if (under_prefix(names[k], pre)) {
        mask[k] = false;
        found = true;
      }
    if (!found) fail("freeze", pre);
  }
  return mask;
}

const char *describe(UpdateAction a)
{
  switch (a) {
    case UpdateAction::SkipNonFinite:
      return "skipped (non-finite loss or gradient)";
    case UpdateAction::SkipForceError:
      return "skipped (force error above max_force_error)";
    case UpdateAction::Rollback:
      return "rolled back to the last good parameters";
    default:
      return "update";
  }
}

UpdateAction UpdatePolicy::decide(double loss, double f_rmse, bool finite, bool can_roll_back,
                                  FinetuneCounters &c)
{
  if (!finite) {
    ++c.nskipped;
    return UpdateAction::SkipNonFinite;
  }
  if (max_force_error_ > 0.0 && f_rmse > max_force_error_) {
    ++c.nskipped;
    return UpdateAction::SkipForceError;
  }
  if (rollback_factor_ > 0.0 && loss_ema_ > 0.0 && loss > rollback_factor_ * loss_ema_ &&
      can_roll_back) {
    // the current parameters made the loss jump: back to the last good
    // ones, with this loss as the new baseline, so that a real change of
    // the data is learnt next time
    ++c.nrollbacks;
    loss_ema_ = loss;
    return UpdateAction::Rollback;
  }
  if (rollback_factor_ > 0.0) loss_ema_ = (loss_ema_ < 0.0) ? loss : 0.9 * loss_ema_ + 0.1 * loss;
  ++c.nupdates;
  return UpdateAction::Step;
}

std::string member_file(const std::string &path, int m)
{
  if (m == 0) return path;
  const auto slash = path.find_last_of('/');
  const auto dot = path.find_last_of('.');
  const bool has_ext = dot != std::string::npos && (slash == std::string::npos || dot > slash);
  const std::string tag = ".c" + std::to_string(m);
  return has_ext ? path.substr(0, dot) + tag + path.substr(dot) : path + tag;
}

/* ---------------------------------------------------------------------- */

void EnergyShift::resize(int nspecies)
{
  ns = nspecies;
  nconf = 0;
  ata.assign(static_cast<std::size_t>(ns) * ns, 0.0);
  atb.assign(ns, 0.0);
  mu.assign(ns, 0.0);
}

void EnergyShift::add(const std::vector<double> &counts, double residual)
{
  if (static_cast<int>(counts.size()) != ns)
    throw std::invalid_argument("EnergyShift::add: " + std::to_string(counts.size()) +
                                " element counts for " + std::to_string(ns) + " elements");
  for (int a = 0; a < ns; ++a) {
    for (int b = 0; b < ns; ++b) ata[a * ns + b] += counts[a] * counts[b];
    atb[a] += counts[a] * residual;
  }
  ++nconf;
  refit();
}

void EnergyShift::refit()
{
  // the minimum-norm least-squares solution: LibTorch's pseudo-inverse of
  // the (symmetric) normal matrix; singular values below 1e-12 of the
  // largest are compositions never seen
  auto opts = torch::TensorOptions().dtype(torch::kFloat64);
  auto A = torch::from_blob(ata.data(), {ns, ns}, opts).clone();
  auto b = torch::from_blob(atb.data(), {ns, 1}, opts).clone();
  auto x = torch::matmul(torch::linalg_pinv(A, 1e-12, /*hermitian=*/true), b).contiguous();
  std::memcpy(mu.data(), x.data_ptr<double>(), sizeof(double) * ns);
}

double EnergyShift::shift_of(const std::vector<double> &counts) const
{
  double s = 0.0;
  for (int a = 0; a < ns && a < static_cast<int>(counts.size()); ++a) s += counts[a] * mu[a];
  return s;
}

std::string EnergyShift::pack() const
{
  if (nconf == 0) return {};
  std::string out;
  auto put = [&](const void *p, std::size_t n) { out.append(static_cast<const char *>(p), n); };
  const int32_t n = ns;
  put(&n, sizeof(n));
  put(&nconf, sizeof(nconf));
  put(ata.data(), sizeof(double) * ata.size());
  put(atb.data(), sizeof(double) * atb.size());
  return out;
}

void EnergyShift::unpack(const std::string &bytes)
{
  if (bytes.empty()) {
    resize(ns);
    return;
  }
  int32_t n = 0;
  if (bytes.size() < sizeof(n) + sizeof(nconf)) throw std::runtime_error("energy shift state truncated");
  std::memcpy(&n, bytes.data(), sizeof(n));
  if (n != ns)
    throw std::runtime_error("the energy shift state has " + std::to_string(n) +
                             " elements, the model " + std::to_string(ns));
  const std::size_t need = sizeof(n) + sizeof(nconf) + sizeof(double) * (static_cast<std::size_t>(n) * n + n);
  if (bytes.size() != need) throw std::runtime_error("energy shift state has the wrong size");
  const char *p = bytes.data() + sizeof(n);
  std::memcpy(&nconf, p, sizeof(nconf));
  p += sizeof(nconf);
  std::memcpy(ata.data(), p, sizeof(double) * ata.size());
  p += sizeof(double) * ata.size();
  std::memcpy(atb.data(), p, sizeof(double) * atb.size());
  refit();
}

}    // namespace MLTorch
