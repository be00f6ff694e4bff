/* ----------------------------------------------------------------------
   ML-TORCH: TorchScript machine-learned potentials for LAMMPS.
   LAMMPS-independent core: layered models and the per-layer halo exchange
   as an autograd operator.
------------------------------------------------------------------------- */

#include "mltorch/layered.h"

#include <torch/torch.h>

#include <string>

namespace MLTorch {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

  // the exchange on doubles in the memory the HaloExchange works in; the
  // result comes back in the dtype and on the device of the input
  torch::Tensor exchange(const torch::Tensor &in, HaloExchange *halo, int64_t rows_out, bool forward,
                         bool host_buffers)
  {
    const int64_t width = in.size(1);
    auto buf_opts = in.options().dtype(torch::kFloat64).requires_grad(false);
    if (host_buffers) buf_opts = buf_opts.device(torch::kCPU);
    auto src = in.detach().to(buf_opts.device(), torch::kFloat64).contiguous();
    // forward(): rows the exchange does not write (torch/kk's padding rows
    // beyond its atoms) must read as zeros, not as a recycled block's old
    // values (a NaN there times a zero cutoff weight is a NaN)
    auto dst = forward ? torch::zeros({rows_out, width}, buf_opts) : torch::empty({rows_out, width}, buf_opts);
    if (forward)
      halo->forward(src.data_ptr<double>(), dst.data_ptr<double>(), static_cast<int>(width));
    else
      halo->reverse(src.data_ptr<double>(), dst.data_ptr<double>(), static_cast<int>(width));
    return dst.to(in.device(), in.scalar_type());
  }

  // what either operator's backward needs: the exchange, the row count of
  // its input (the output rows of the adjoint) and where the buffers live
  void remember(AutogradContext *ctx, int64_t halo, int64_t rows, bool host_buffers)
  {
    ctx->saved_data["halo"] = halo;
    ctx->saved_data["rows"] = rows;
    ctx->saved_data["host"] = host_buffers;
  }

  // the adjoint operator applied to the incoming gradient
  template <class Adjoint> variable_list adjoint(AutogradContext *ctx, const variable_list &grad)
  {
    auto g = Adjoint::apply(grad[0], ctx->saved_data["halo"].toInt(), ctx->saved_data["rows"].toInt(),
                            ctx->saved_data["host"].toBool());
    return {g, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }

  struct HaloReverseOp;

  // X: owned rows -> all rows
  struct HaloForwardOp : public torch::autograd::Function<HaloForwardOp> {
    static torch::Tensor forward(AutogradContext *ctx, const torch::Tensor &owned, int64_t halo,
                                 int64_t n_nodes, bool host_buffers)
    {
      remember(ctx, halo, owned.size(0), host_buffers);
      return exchange(owned, reinterpret_cast<HaloExchange *>(halo), n_nodes, true, host_buffers);
    }
    static variable_list backward(AutogradContext *ctx, variable_list grad);
  };

  // X^T: all rows -> owned rows (ghost rows summed into their owners)
  struct HaloReverseOp : public torch::autograd::Function<HaloReverseOp> {
    static torch::Tensor forward(AutogradContext *ctx, const torch::Tensor &all, int64_t halo,
                                 int64_t n_local, bool host_buffers)
    {
      remember(ctx, halo, all.size(0), host_buffers);
      return exchange(all, reinterpret_cast<HaloExchange *>(halo), n_local, false, host_buffers);
    }
    static variable_list backward(AutogradContext *ctx, variable_list grad)
    {
      // (X^T)^T = X, itself differentiable: third derivatives stay exact too
      return adjoint<HaloForwardOp>(ctx, grad);
    }
  };

  variable_list HaloForwardOp::backward(AutogradContext *ctx, variable_list grad)
  {
    return adjoint<HaloReverseOp>(ctx, grad);
  }

}    // namespace

torch::Tensor halo_exchange_rows(const torch::Tensor &in, HaloExchange *halo, int64_t rows_out,
                                 bool forward, bool host_buffers)
{
  return exchange(in, halo, rows_out, forward, host_buffers);
}

torch::Tensor halo_exchange_op(const torch::Tensor &owned, HaloExchange *halo, int64_t n_nodes,
                               bool host_buffers)
{
  return HaloForwardOp::apply(owned, reinterpret_cast<int64_t>(halo), n_nodes, host_buffers);
}


torch::Tensor run_layered(torch::jit::Module &module, const Metadata &meta,
                          const torch::Tensor &edge_vec, const torch::Tensor &edge_index,
                          const torch::Tensor &species, int64_t n_local, HaloExchange *halo,
                          bool host_buffers, const torch::Tensor &anchor, const std::string &source)
{
  const int64_t n_nodes = species.size(0);
  auto call = [&](const char *stage, std::vector<torch::jit::IValue> args) {
    torch::jit::IValue result;
    try {
      result = module.get_method(stage)(std::move(args));
    } catch (std::exception &e) {
      throw ModelError("Model " + source + " failed in " + stage + "(): " + e.what());
    }
    if (!result.isTensor())
      throw ModelError("Model " + source + ": " + stage + "() must return a tensor");
    return result.toTensor();
  };
  auto expect = [&](const torch::Tensor &t, const std::string &stage, int64_t width) {
    if (t.dim() != 2 || t.size(0) != n_local || (width > 0 && t.size(1) != width))
      throw ModelError("Model " + source + ": " + stage + " returned features of shape " +
                       c10::str(t.sizes()) + ", expected [" + std::to_string(n_local) + ", " +
                       (width > 0 ? std::to_string(width) : std::string("width")) +
                       "] (the owned atoms' features; the metadata's feature_widths)");
  };
  const int nlayers = static_cast<int>(meta.feature_widths.size());
  auto h = call("stage_embed", {edge_vec, edge_index, species, n_local});
  expect(h, "stage_embed()", nlayers > 0 ? meta.feature_widths[0] : 0);
  for (int k = 0; k < nlayers; ++k) {
    auto all = halo_exchange_op(h + anchor, halo, n_nodes, host_buffers);
    h = call("stage_interaction", {int64_t(k), all, edge_vec, edge_index, species, n_local});
    expect(h, "stage_interaction(" + std::to_string(k) + ")", k + 1 < nlayers ? meta.feature_widths[k + 1] : 0);
  }
  auto energy = call("stage_readout", {h, species, n_local});
  if (energy.dim() != 1 || energy.size(0) != n_local)
    throw ModelError("Model " + source + ": stage_readout() returned a tensor of shape " +
                     c10::str(energy.sizes()) + ", expected per-atom energies of shape [" +
                     std::to_string(n_local) + "]");
  return energy;
}

}    // namespace MLTorch
