/* ----------------------------------------------------------------------
   ML-TORCH: TorchScript machine-learned potentials for LAMMPS.
   LAMMPS-independent core: a model's optimizer (LibTorch's Adam,
   AdamW or SGD) on its trainable parameters, and its state.
------------------------------------------------------------------------- */

#include "model_impl.h"

#include <sstream>

namespace MLTorch {

struct ModelOptimizer::Impl {
  std::vector<torch::Tensor> params;    // trainable parameters, model order
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  double anchor = 0.0;
  std::vector<torch::Tensor> start;    // theta0 of the anchor term
};

ModelOptimizer::ModelOptimizer(Model &model, const OptimizerSettings &s) : impl(std::make_unique<Impl>())
{
  std::size_t k = 0;
  for (const auto &p : model.impl->module.parameters())
    if (model.impl->trainable[k++]) impl->params.push_back(p);
  if (impl->params.empty()) throw ModelError("the model has no trainable parameter");
  impl->anchor = s.anchor;
  if (s.anchor > 0.0)
    for (const auto &p : impl->params) impl->start.push_back(p.detach().clone());
  if (s.kind == "adam") {
    impl->optimizer = std::make_unique<torch::optim::Adam>(
        impl->params, torch::optim::AdamOptions(s.lr).betas({s.beta1, s.beta2}).eps(s.eps).weight_decay(
                          s.weight_decay));
  } else if (s.kind == "adamw") {
    impl->optimizer = std::make_unique<torch::optim::AdamW>(
        impl->params, torch::optim::AdamWOptions(s.lr).betas({s.beta1, s.beta2}).eps(s.eps).weight_decay(
                          s.weight_decay));
  } else if (s.kind == "sgd") {
    impl->optimizer = std::make_unique<torch::optim::SGD>(
        impl->params, torch::optim::SGDOptions(s.lr).momentum(s.momentum).weight_decay(s.weight_decay));
  } else {
    throw ModelError("unknown optimizer '" + s.kind + "' (use adam, adamw or sgd)");
  }
}

ModelOptimizer::~ModelOptimizer() = default;

double ModelOptimizer::step(const std::vector<double> &grad, double lr, double max_norm)
{
  std::size_t off = 0;
  for (auto &p : impl->params) {
    const auto n = static_cast<std::size_t>(p.numel());
    if (off + n > grad.size()) throw ModelError("ModelOptimizer::step(): gradient too short");
    auto g = torch::from_blob(const_cast<double *>(grad.data() + off), p.sizes(),
                              torch::TensorOptions().dtype(torch::kFloat64))
                 .to(p.device(), p.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
    p.mutable_grad() = g;
    off += n;
  }
  if (off != grad.size()) throw ModelError("ModelOptimizer::step(): gradient too long");
  // the anchor term's gradient, anchor (theta - theta0), on every replica
  // alike (it needs no reduction: the parameters are the replicas' own)
  if (impl->anchor > 0.0) {
    torch::NoGradGuard no_grad;
    for (std::size_t k = 0; k < impl->params.size(); ++k)
      impl->params[k].mutable_grad().add_(impl->params[k].detach() - impl->start[k], impl->anchor);
  }
  const double limit = max_norm > 0.0 ? max_norm : std::numeric_limits<double>::infinity();
  const double norm = torch::nn::utils::clip_grad_norm_(impl->params, limit);
  for (auto &group : impl->optimizer->param_groups()) group.options().set_lr(lr);
  impl->optimizer->step();
  for (auto &p : impl->params) p.mutable_grad() = torch::Tensor();
  return norm;
}

double ModelOptimizer::anchor_term() const
{
  if (impl->anchor <= 0.0) return 0.0;
  torch::NoGradGuard no_grad;
  double sum = 0.0;
  for (std::size_t k = 0; k < impl->params.size(); ++k)
    sum += (impl->params[k].detach() - impl->start[k]).to(torch::kFloat64).square().sum().item<double>();
  return 0.5 * impl->anchor * sum;
}

std::string ModelOptimizer::state() const
{
  torch::serialize::OutputArchive archive;
  impl->optimizer->save(archive);
  // theta0 comes with the state: a restart or a resumed training keeps its anchor
  for (std::size_t k = 0; k < impl->start.size(); ++k)
    archive.write("mltorch_anchor_" + std::to_string(k), impl->start[k], /*is_buffer=*/true);
  std::ostringstream os;
  archive.save_to(os);
  return os.str();
}

void ModelOptimizer::load_state(const std::string &bytes)
{
  torch::serialize::InputArchive archive;
  std::istringstream is(bytes);
  try {
    archive.load_from(is);
    impl->optimizer->load(archive);
    for (std::size_t k = 0; k < impl->start.size(); ++k)
      if (!archive.try_read("mltorch_anchor_" + std::to_string(k), impl->start[k], /*is_buffer=*/true))
        throw ModelError("the saved optimizer state has no anchor parameters: it was written "
                         "by a run without anchor; continue it without anchor, or define the "
                         "fix afresh (without read_restart) to anchor to its model");
  } catch (std::exception &e) {
    throw ModelError("cannot restore the optimizer state: " + first_line(e.what()));
  }
}

/* ---------------------------------------------------------------------- */

}    // namespace MLTorch
