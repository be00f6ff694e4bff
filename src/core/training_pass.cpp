/* ----------------------------------------------------------------------
   ML-TORCH: TorchScript machine-learned potentials for LAMMPS.
   LAMMPS-independent core: the two passes of the distributed
   gradient (doc/fix_torch_finetune.rst, "Exact distributed gradient") on a model, and its parameter gradients.
------------------------------------------------------------------------- */

#include "model_impl.h"

#include <cstring>

namespace MLTorch {

// a training pass that fails leaves no training graph and parameters that
// do not require gradients: MD goes on as before it
void Model::Impl::end_training_pass()
{
  train_energy = torch::Tensor();
  train_forces = torch::Tensor();
  train_virial = torch::Tensor();
  set_params_require_grad(false);
}

void Model::forward_train(const GraphInput &in, double &energy, std::vector<double> &node_forces,
                          double *virial)
{
  try {
    forward_train_pass(in, energy, node_forces, virial);
  } catch (...) {
    impl->end_training_pass();
    throw;
  }
}

void Model::forward_train_pass(const GraphInput &in, double &energy, std::vector<double> &node_forces,
                               double *virial)
{
  impl->train_virial = torch::Tensor();
  impl->set_params_require_grad(true);
  auto fp = run_forward(impl->module, impl->meta, in, impl->device, impl->dtype, impl->source);
  auto &edge_vec = fp.edge_vec;
  auto &edge_index = fp.edge_index;
  auto total = fp.local_energy.sum();

  // partial forces with create_graph, so that they stay differentiable in the parameters
  torch::Tensor forces = torch::zeros({in.n_nodes, 3}, edge_vec.options().requires_grad(false));
  if (fp.anchor.defined() || (in.n_edges > 0 && total.requires_grad())) {
    auto g = torch::autograd::grad({total}, fp.grad_inputs(), {}, /*retain_graph=*/true,
                                   /*create_graph=*/true, /*allow_unused=*/true)[0];
    if (g.defined()) {
      forces = forces.index_add(0, edge_index[0], g).index_add(0, edge_index[1], -g);
      // W = -sum_e r_e (x) g_e; r_e is data here, g_e depends on the parameters
      auto r = edge_vec.detach();
      auto rg = -(r.unsqueeze(2) * g.unsqueeze(1)).sum(0);    // [3][3]
      impl->train_virial = torch::stack({rg[0][0], rg[1][1], rg[2][2], rg[0][1], rg[0][2], rg[1][2]});
    }
  }
  if (!impl->train_virial.defined() || in.n_edges == 0)
    impl->train_virial = torch::zeros({6}, edge_vec.options().requires_grad(false));
  if (virial) {
    auto v = impl->train_virial.detach().to(torch::kCPU, torch::kFloat64).contiguous();
    for (int k = 0; k < 6; ++k) virial[k] = v.data_ptr<double>()[k];
  }
  impl->train_energy = total;
  impl->train_forces = forces;
  energy = total.item<double>();
  auto host = forces.detach().to(torch::kCPU, torch::kFloat64).contiguous();
  node_forces.assign(host.data_ptr<double>(), host.data_ptr<double>() + 3 * in.n_nodes);
}

void Model::backward_train(const std::vector<double> &node_force_weights, double energy_weight,
                           const double *virial_weights)
{
  if (!impl->train_energy.defined()) throw ModelError("backward_train() without forward_train()");
  auto &F = impl->train_forces;
  // checked before the weights are wrapped (from_blob reads F.numel() values)
  if (static_cast<int64_t>(node_force_weights.size()) != F.numel()) {
    const int64_t n = F.numel();
    impl->end_training_pass();
    throw ModelError("backward_train(): " + std::to_string(node_force_weights.size()) +
                     " force weights for " + std::to_string(n) + " force components");
  }
  auto w = torch::from_blob(const_cast<double *>(node_force_weights.data()), F.sizes(),
                            torch::TensorOptions().dtype(torch::kFloat64))
               .to(F.device(), F.scalar_type());
  auto objective = (w * F).sum() + energy_weight * impl->train_energy;
  if (virial_weights) {
    auto c = torch::from_blob(const_cast<double *>(virial_weights), {6},
                              torch::TensorOptions().dtype(torch::kFloat64))
                 .to(F.device(), F.scalar_type());
    objective = objective + (c * impl->train_virial).sum();
  }
  try {
    if (objective.requires_grad()) objective.backward();
  } catch (...) {
    impl->end_training_pass();
    throw;
  }
  impl->train_energy = torch::Tensor();
  impl->train_forces = torch::Tensor();
  impl->train_virial = torch::Tensor();
}

int64_t Model::num_parameters() const
{
  int64_t n = 0;
  for (const auto &p : impl->module.parameters()) n += p.numel();
  return n;
}

void Model::zero_grad()
{
  for (auto p : impl->module.parameters())
    if (p.grad().defined()) p.mutable_grad().zero_();
}

std::vector<double> Model::flat_gradient(bool trainable_only) const
{
  std::vector<double> out;
  out.reserve(num_parameters());
  std::size_t k = 0;
  for (const auto &p : impl->module.parameters()) {
    if (trainable_only && !impl->trainable[k++]) continue;
    // an unused parameter contributes zeros, so every rank reduces the same layout
    auto g = p.grad().defined() ? p.grad() : torch::zeros_like(p);
    auto h = g.detach().to(torch::kCPU, torch::kFloat64).contiguous().flatten();
    out.insert(out.end(), h.data_ptr<double>(), h.data_ptr<double>() + h.numel());
  }
  return out;
}


/* ---------------------------------------------------------------------- */

}    // namespace MLTorch
