/* ----------------------------------------------------------------------
   ML-TORCH: the trained state of fix torch/finetune (see training.h)
------------------------------------------------------------------------- */

#include "mltorch/training.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace MLTorch {

double Schedule::lr(double base, long long updates) const
{
  const double t = static_cast<double>(updates);
  if (kind == "exp") return base * std::pow(a, t);
  if (kind == "step") return base * std::pow(b, std::floor(t / a));
  if (kind == "cosine") {
    const double x = std::min(t / a, 1.0);
    return b + 0.5 * (base - b) * (1.0 + std::cos(M_PI * x));
  }
  return base;
}

TrainingState::TrainingState(std::vector<std::shared_ptr<Model>> models,
                             const OptimizerSettings &settings) :
    members(std::move(models))
{
  for (auto &m : members) trainers.push_back(std::make_unique<ModelOptimizer>(*m, settings));
}

TrainingState::~TrainingState() = default;

long long TrainingState::gradient_size() const
{
  long long n = 0;
  for (const auto &m : members) n += m->num_trainable();
  return n;
}

std::vector<double> TrainingState::gradient() const
{
  if (members.size() == 1) return members[0]->flat_gradient(true);
  std::vector<double> g;
  g.reserve(static_cast<std::size_t>(gradient_size()));
  for (const auto &m : members) {
    const auto gm = m->flat_gradient(true);
    g.insert(g.end(), gm.begin(), gm.end());
  }
  return g;
}

void TrainingState::zero_grad()
{
  for (auto &m : members) m->zero_grad();
}

std::vector<double> TrainingState::step(const std::vector<double> &grad, double lr, double max_norm)
{
  if (static_cast<long long>(grad.size()) != gradient_size())
    throw ModelError("TrainingState::step(): the gradient has " + std::to_string(grad.size()) +
                     " values, the members train " + std::to_string(gradient_size()));
  std::vector<double> norms;
  std::size_t off = 0;
  for (std::size_t m = 0; m < members.size(); ++m) {
    const auto n = static_cast<std::size_t>(members[m]->num_trainable());
    if (members.size() == 1) {
      norms.push_back(trainers[m]->step(grad, lr, max_norm));
    } else {
      const std::vector<double> slice(grad.begin() + off, grad.begin() + off + n);
      norms.push_back(trainers[m]->step(slice, lr, max_norm));
    }
    off += n;
  }
  return norms;
}

double TrainingState::anchor_term() const
{
  double sum = 0.0;
  for (const auto &t : trainers) sum += t->anchor_term();
  return sum;
}

void TrainingState::keep_good()
{
  good_params = parameters();
  good_optimizer = optimizer_state();
}

void TrainingState::restore_good()
{
  load_parameters(good_params);
  load_optimizer_state(good_optimizer);
}

void TrainingState::load_good(const std::string &params, const std::string &optimizer)
{
  good_params = params;
  good_optimizer = optimizer;
}

std::string TrainingState::parameters() const
{
  std::vector<std::string> parts;
  for (const auto &m : members) parts.push_back(m->state_bytes());
  return pack_strings(parts);
}

void TrainingState::load_parameters(const std::string &bytes)
{
  const auto parts = unpack_strings(bytes, size());
  for (std::size_t m = 0; m < members.size(); ++m) members[m]->load_state_bytes(parts[m]);
}

std::string TrainingState::optimizer_state() const
{
  std::vector<std::string> parts;
  for (const auto &t : trainers) parts.push_back(t->state());
  return pack_strings(parts);
}

void TrainingState::load_optimizer_state(const std::string &bytes)
{
  const auto parts = unpack_strings(bytes, size());
  for (std::size_t m = 0; m < trainers.size(); ++m) trainers[m]->load_state(parts[m]);
}

std::string pack_strings(const std::vector<std::string> &parts)
{
  if (parts.size() == 1) return parts[0];
  std::string out;
  const int64_t n = static_cast<int64_t>(parts.size());
  out.append(reinterpret_cast<const char *>(&n), sizeof(n));
  for (const auto &p : parts) {
    const int64_t len = static_cast<int64_t>(p.size());
    out.append(reinterpret_cast<const char *>(&len), sizeof(len));
  }
  for (const auto &p : parts) out += p;
  return out;
}

std::vector<std::string> unpack_strings(const std::string &bytes, int expected)
{
  if (expected == 1) return {bytes};
  auto fail = [&]() {
    return ModelError("committee state: expected " + std::to_string(expected) +
                      " members' data, the bytes hold something else (" +
                      std::to_string(bytes.size()) + " bytes)");
  };
  int64_t n = 0;
  if (bytes.size() < sizeof(n)) throw fail();
  std::memcpy(&n, bytes.data(), sizeof(n));
  if (n != expected) throw fail();
  const std::size_t head = sizeof(n) * static_cast<std::size_t>(1 + n);
  if (bytes.size() < head) throw fail();
  std::vector<std::string> parts;
  std::size_t off = head;
  for (int64_t k = 0; k < n; ++k) {
    int64_t len = 0;
    std::memcpy(&len, bytes.data() + sizeof(n) * (1 + k), sizeof(len));
    if (len < 0 || off + static_cast<std::size_t>(len) > bytes.size()) throw fail();
    parts.emplace_back(bytes.substr(off, static_cast<std::size_t>(len)));
    off += static_cast<std::size_t>(len);
  }
  if (off != bytes.size()) throw fail();
  return parts;
}

}    // namespace MLTorch
