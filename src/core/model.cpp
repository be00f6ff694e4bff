/* ----------------------------------------------------------------------
   ML-TORCH: TorchScript machine-learned potentials for LAMMPS.
   LAMMPS-independent core: model loading and evaluation, parameters and
   their state.
------------------------------------------------------------------------- */

#include "model_impl.h"

#include "mltorch/layered.h"

#include <caffe2/serialize/inline_container.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <limits>
#include <sstream>

namespace MLTorch {

static torch::Device parse_device(const std::string &name, const std::string &source)
{
  torch::Device dev(torch::kCPU);
  try {
    dev = torch::Device(name);
  } catch (std::exception &) {
    throw ModelError("Unknown torch device '" + name + "' for model " + source +
                     "; use cpu, cuda or cuda:N");
  }
  if (dev.is_cuda()) {
    if (!torch::cuda::is_available())
      throw ModelError("Torch device '" + name + "' requested for model " + source +
                       " but this LibTorch sees no CUDA device; use 'device cpu'");
    const int n = static_cast<int>(torch::cuda::device_count());
    if (dev.has_index() && dev.index() >= n)
      throw ModelError("Torch device '" + name + "' requested for model " + source + " but only " +
                       std::to_string(n) + " CUDA device(s) exist");
  } else if (!dev.is_cpu()) {
    throw ModelError("Torch device '" + name + "' is not supported; use cpu, cuda or cuda:N");
  }
  return dev;
}


std::string first_line(const std::string &what)
{
  return what.substr(0, what.find('\n'));
}

Model::Model(const std::string &bytes, const std::string &source, const std::string &device) :
    impl(std::make_unique<Impl>())
{
  impl->source = source;
  impl->device = parse_device(device, source);

  if (bytes.empty())
    throw ModelError("Model file " + source + " is empty (0 bytes); was it written completely?");
  std::string twin;
  impl->compiled = open_package(bytes, source, twin, impl->device);
  const std::string &script = impl->compiled ? twin : bytes;
  torch::jit::ExtraFilesMap extra{{kMetadataName, ""}};
  try {
    std::istringstream in(script);
    impl->module = torch::jit::load(in, impl->device, extra);
  } catch (std::exception &e) {
    throw ModelError("Cannot load " + source + " as a TorchScript model: " + first_line(e.what()));
  }
  if (extra[kMetadataName].empty())
    throw ModelError("Model file " + source + " has no ML-TORCH metadata (" + kMetadataName +
                     "); export it with mltorch.export (potentials/mltorch)");
  impl->meta = parse_metadata(extra[kMetadataName], source);
  impl->dtype = impl->meta.dtype == "float32" ? torch::kFloat32 : torch::kFloat64;
  if (!impl->module.find_method("forward"))
    throw ModelError("Model file " + source + " has no forward() method");
  if (impl->meta.layered)
    for (const char *stage : {"stage_embed", "stage_interaction", "stage_readout"})
      if (!impl->module.find_method(stage))
        throw ModelError("Model file " + source + " says it is layered but has no " + stage +
                         "() method; export it with mltorch.export from a module with "
                         "@torch.jit.export stage_embed, stage_interaction and stage_readout");
  // a broken checkpoint (NaN or inf weights) fails here, not as NaN forces later
  for (const auto &p : impl->module.named_parameters(/*recurse=*/true))
    if (p.value.is_floating_point() && !torch::isfinite(p.value).all().item<bool>())
      throw ModelError("Model file " + source + ": parameter '" + p.name +
                       "' holds NaN or infinite values; the file is broken");
  for (const auto &b : impl->module.named_buffers(/*recurse=*/true))
    if (b.value.is_floating_point() && !torch::isfinite(b.value).all().item<bool>())
      throw ModelError("Model file " + source + ": buffer '" + b.name +
                       "' holds NaN or infinite values; the file is broken");
  impl->module.eval();
  for (const auto &p : impl->module.parameters()) impl->declared.push_back(p.requires_grad());
  impl->trainable = impl->declared;
  impl->set_params_require_grad(false);
  impl->bind_compiled_state();
}

Model::~Model() = default;

const Metadata &Model::metadata() const
{
  return impl->meta;
}

std::string Model::device() const
{
  return impl->device.str();
}

void Model::to_device(const std::string &device)
{
  const torch::Device dev = parse_device(device, impl->source);
  if (dev == impl->device) return;
  check_compiled_device(impl->compiled.get(), dev, impl->source);
  impl->module.to(dev);
  impl->device = dev;
  impl->bind_compiled_state();
}

bool Model::parameters_require_grad() const
{
  for (const auto &p : impl->module.parameters())
    if (p.requires_grad()) return true;
  return false;
}

bool Model::is_compiled() const
{
  return impl->compiled != nullptr;
}

bool Model::compiled_stages() const
{
  return impl->compiled && !impl->compiled->stages.empty();
}

int Model::compiled_threads() const
{
  return impl->compiled ? impl->compiled->threads : 0;
}


GraphTensors wrap_graph(const GraphInput &in, const torch::Device &dev, torch::Dtype dtype)
{
  auto i64 = torch::TensorOptions().dtype(torch::kInt64);
  auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
  if (in.on_model_device) {
    i64 = i64.device(dev);
    f64 = f64.device(dev);
  }
  // from_blob wraps the caller's buffers without copying; .to() copies only
  // when the dtype or device differs from the host double/int64 layout
  // (a rank may hold no atom or no edge: empty tensors are made, never
  // wrapped, since a null or foreign pointer is not a valid blob on a GPU)
  auto wrap = [](const void *p, c10::IntArrayRef shape, const torch::TensorOptions &o) {
    for (auto n : shape)
      if (n == 0) return torch::empty(shape, o);
    return torch::from_blob(const_cast<void *>(p), shape, o);
  };
  GraphTensors g;
  g.edge_vec = wrap(in.edge_vectors, {in.n_edges, 3}, f64).to(dev, dtype);
  g.edge_index = wrap(in.edge_index, {2, in.n_edges}, i64).to(dev);
  g.species = wrap(in.species, {in.n_nodes}, i64).to(dev);
  return g;
}

ForwardPass run_forward(torch::jit::Module &module, const Metadata &meta, const GraphInput &in,
                               const torch::Device &dev, torch::Dtype dtype, const std::string &source)
{
  auto g = wrap_graph(in, dev, dtype);
  ForwardPass fp;
  fp.edge_vec = g.edge_vec.requires_grad_(true);
  fp.edge_index = g.edge_index;
  if (meta.layered && in.halo) {
    fp.anchor = torch::zeros({}, g.edge_vec.options().requires_grad(true));
    fp.local_energy = run_layered(module, meta, fp.edge_vec, fp.edge_index, g.species, in.n_local,
                                  in.halo, !in.on_model_device, fp.anchor, source);
    if (fp.local_energy.scalar_type() != dtype)
      throw ModelError("Model " + source + ": stage_readout() returned " +
                       std::string(c10::toString(fp.local_energy.scalar_type())) +
                       " energies, but its metadata says " + meta.dtype);
    return fp;
  }

  std::vector<torch::jit::IValue> args{fp.edge_vec, fp.edge_index, g.species, in.n_local};
  torch::Tensor node_energy;
  try {
    auto result = module.forward(args);
    if (!result.isTensor())
      throw ModelError("Model " + source + ": forward() must return a tensor of per-atom energies");
    node_energy = result.toTensor();
  } catch (ModelError &) {
    throw;
  } catch (std::exception &e) {
    std::string what = e.what();
    throw ModelError("Model " + source + " failed in forward(): " + what);
  }
  if (!node_energy.is_floating_point() || node_energy.scalar_type() != dtype)
    throw ModelError("Model " + source + ": forward() returned " +
                     std::string(c10::toString(node_energy.scalar_type())) +
                     " energies, but its metadata says " +
                     (dtype == torch::kFloat32 ? "float32" : "float64") +
                     "; compute and return the energies in the model's dtype");
  if (node_energy.dim() != 1 || node_energy.size(0) < in.n_local)
    throw ModelError("Model " + source + ": forward() returned a tensor of shape " +
                     c10::str(node_energy.sizes()) + ", expected per-atom energies of shape [" +
                     std::to_string(in.n_local) + "] or [" + std::to_string(in.n_nodes) + "]");
  fp.local_energy = node_energy.slice(0, 0, in.n_local);
  return fp;
}

void Model::evaluate(const GraphInput &in, GraphOutput &out, bool want_node_energy) const
{
  out.edge_grad.resize(3 * in.n_edges);
  if (want_node_energy) out.node_energy.resize(in.n_local);
  if (in.atomic_virial) {
    evaluate_centroid(in, out);
    return;
  }
  out.energy =
      evaluate_into(in, out.edge_grad.data(), want_node_energy ? out.node_energy.data() : nullptr);
}

/* ----------------------------------------------------------------------
   the halo exchange of the atomic-virial passes (Model::evaluate_centroid).
   A ghost node sits in its rank's frame, its owner in another: x_g = x_o + s
   (a periodic image, on this rank or another). The backward pass of
   X_a = sum_j x_j[a] E_j brings to a ghost row the gradient
   sum_j x_j[a] dE_j/dh_g with this rank's positions; its owner needs it in
   its own frame, sum_j (x_j[a] - s[a]) dE_j/dh_g. So the reverse exchanges
   of pass a (1..3) subtract s[a] times the ghost rows the reverse exchange
   of the same layer carried in pass 0 (the energy's); the autograd engine
   runs the exchanges of every pass in the same order (doc/pair_torch.rst,
   "Layered models"). s comes from one forward exchange of the owners'
   positions (the exchange copies values, it does not shift them).
------------------------------------------------------------------------- */

namespace {
class CentroidHalo : public HaloExchange {
 public:
  CentroidHalo(HaloExchange *inner, const double *pos, int64_t n_local, int64_t n_nodes) :
      inner(inner), n_local(n_local), n_nodes(n_nodes), shift(3 * n_nodes, 0.0)
  {
    std::vector<double> owner(3 * n_nodes, 0.0);
    inner->forward(pos, owner.data(), 3);
    for (int64_t k = 3 * n_local; k < 3 * n_nodes; ++k) shift[k] = pos[k] - owner[k];
  }
  void start_pass(int p)
  {
    pass = p;
    call = 0;
  }
  void forward(const double *owned, double *all, int width) override
  {
    inner->forward(owned, all, width);
  }
  void reverse(const double *all, double *owned, int width) override
  {
    const std::size_t n = static_cast<std::size_t>(n_nodes) * width;
    if (pass == 0) {
      energy_rows.emplace_back(all, all + n);
      inner->reverse(all, owned, width);
      return;
    }
    const auto &e = energy_rows.at(call++);
    std::vector<double> framed(all, all + n);
    for (int64_t r = n_local; r < n_nodes; ++r) {
      const double s = shift[3 * r + pass - 1];
      if (s == 0.0) continue;
      for (int c = 0; c < width; ++c) framed[r * width + c] -= s * e[r * width + c];
    }
    inner->reverse(framed.data(), owned, width);
  }

 private:
  HaloExchange *inner;
  int64_t n_local, n_nodes;
  std::vector<double> shift;                       // [n_nodes][3], s = x_ghost - x_owner
  std::vector<std::vector<double>> energy_rows;    // pass 0's ghost rows, one per exchange
  int pass = 0;
  std::size_t call = 0;
};
}    // namespace

/* ----------------------------------------------------------------------
   the energy, its edge gradient and the edge moments of the atomic virial:
   with X_a = sum_{j < n_local} x_j[a] E_j (the positions held fixed), one
   forward pass and four backward passes of the autograd graph, for E and
   X_x, X_y, X_z. A compiled package runs its TorchScript twin here (its
   compiled code returns the edge gradient of E alone): on the steps that
   ask for the atomic virial only.
------------------------------------------------------------------------- */

void Model::evaluate_centroid(const GraphInput &in_given, GraphOutput &out) const
{
  GraphInput in = in_given;
  const bool layered = impl->meta.layered && in.halo;
  std::unique_ptr<CentroidHalo> framed;
  if (layered) {
    framed = std::make_unique<CentroidHalo>(in.halo, in.centroid_positions, in.n_local, in.n_nodes);
    in.halo = framed.get();
  }
  if (!impl->train_energy.defined()) impl->set_params_require_grad(false);
  auto fp = run_forward(impl->module, impl->meta, in, impl->device, impl->dtype, impl->source);
  auto local = fp.local_energy;
  out.edge_moment.assign(9 * in.n_edges, 0.0);
  std::fill(out.edge_grad.begin(), out.edge_grad.end(), 0.0);
  auto host = torch::TensorOptions().dtype(torch::kFloat64);
  // layered: every rank runs every backward pass, whose exchanges are collective
  if (layered || (in.n_edges > 0 && local.requires_grad())) {
    auto x = in.n_local > 0
        ? torch::from_blob(const_cast<double *>(in.centroid_positions), {in.n_local, 3}, host)
              .to(impl->device, impl->dtype)
        : torch::zeros({0, 3}, host.device(impl->device).dtype(impl->dtype));
    auto weighted = (x * local.unsqueeze(1)).sum(0);    // X_a
    std::vector<torch::Tensor> grads;
    for (int p = 0; p < 4; ++p) {
      if (framed) framed->start_pass(p);
      auto target = p == 0 ? local.sum() : weighted[p - 1];
      // retain the graph for the next pass; allow unused (a rank without edges)
      grads.push_back(torch::autograd::grad({target}, fp.grad_inputs(), {}, p < 3, false, true)[0]);
    }
    if (in.n_edges > 0) {
      auto zero = torch::zeros_like(fp.edge_vec);
      for (auto &g : grads)
        if (!g.defined()) g = zero;
      torch::from_blob(out.edge_grad.data(), {in.n_edges, 3}, host).copy_(grads[0]);
      // [n_edges][a][b]
      torch::from_blob(out.edge_moment.data(), {in.n_edges, 3, 3}, host)
          .copy_(torch::stack({grads[1], grads[2], grads[3]}, 1));
    }
  }
  if (!out.node_energy.empty() && in.n_local > 0)
    torch::from_blob(out.node_energy.data(), {in.n_local}, host).copy_(local.detach());
  out.energy = local.detach().to(torch::kFloat64).sum().item<double>();
}

double Model::evaluate_into(const GraphInput &in, double *edge_grad, double *node_energy) const
{
  torch::Tensor local_energy, grad;
  // the compiled graphs are exported for >= 2 edges and nodes and >= 1 local
  // atom; the rare smaller graph (a nearly empty subdomain) runs the twin
  // (a layered model under the halo exchange runs its compiled stages below,
  // or, from a package without them, the twin's stages)
  const bool layered = impl->meta.layered && in.halo;
  const bool big = in.n_edges >= 2 && in.n_nodes >= 2 && in.n_local >= 1;
  const bool compiled = impl->compiled && !layered && big;
  // a layered package's compiled stages, chained by hand with the exchange:
  // forward exchanges in layer order, then reverse exchanges in the opposite
  // order, as the autograd operators run them in the twin (which the rare
  // smaller graph runs)
  const bool stages = impl->compiled && layered && !impl->compiled->stages.empty() && big;
  if (stages) {
    auto g = wrap_graph(in, impl->device, impl->dtype);
    auto local = g.species.narrow(0, 0, in.n_local);
    auto &st = impl->compiled->state;
    auto run = [&](const std::string &name, std::vector<torch::Tensor> inputs) {
      inputs.insert(inputs.end(), st.begin(), st.end());
      try {
        return impl->compiled->stages.at(name)->run(inputs);
      } catch (std::exception &e) {
        throw ModelError("Compiled model " + impl->source + " failed in stage " + name + ": " +
                         first_line(e.what()));
      }
    };
    const bool host = !in.on_model_device;
    const int nex = static_cast<int>(impl->meta.feature_widths.size());
    std::vector<torch::Tensor> h_all(nex);
    auto h = run("embed_fwd", {g.edge_vec, g.edge_index, g.species, local})[0];
    for (int k = 0; k < nex; ++k) {
      h_all[k] = halo_exchange_rows(h, in.halo, in.n_nodes, true, host);
      h = run("inter_fwd_" + std::to_string(k), {h_all[k], g.edge_vec, g.edge_index, g.species, local})[0];
    }
    auto r = run("readout", {h, local});
    local_energy = r[0];
    auto gh = r[1];
    grad = torch::zeros_like(g.edge_vec);
    for (int k = nex - 1; k >= 0; --k) {
      auto o = run("inter_vjp_" + std::to_string(k),
                   {h_all[k], g.edge_vec, g.edge_index, g.species, local, gh});
      grad += o[1];
      gh = halo_exchange_rows(o[0], in.halo, in.n_local, false, host);
    }
    grad += run("embed_vjp", {g.edge_vec, g.edge_index, g.species, local, gh})[0];
  } else if (compiled) {
    auto g = wrap_graph(in, impl->device, impl->dtype);
    std::vector<torch::Tensor> inputs{g.edge_vec, g.edge_index, g.species,
                                      g.species.narrow(0, 0, in.n_local)};
    inputs.insert(inputs.end(), impl->compiled->state.begin(), impl->compiled->state.end());
    std::vector<torch::Tensor> out;
    try {
      out = impl->compiled->loader->run(inputs);
    } catch (std::exception &e) {
      throw ModelError("Compiled model " + impl->source + " failed: " + first_line(e.what()));
    }
    if (out.size() != 2 || out[0].dim() != 1 || out[0].size(0) != in.n_local ||
        out[1].sizes() != g.edge_vec.sizes())
      throw ModelError("Compiled model " + impl->source +
                       " returned outputs of unexpected shapes; compile it with mltorch-compile");
    local_energy = out[0];
    grad = out[1];
  } else {
    // no weight gradients in plain MD (not while a training graph is alive)
    if (!impl->train_energy.defined()) impl->set_params_require_grad(false);
    auto fp = run_forward(impl->module, impl->meta, in, impl->device, impl->dtype, impl->source);
    local_energy = fp.local_energy;
    auto total = local_energy.sum();
    // layered: every rank runs the backward pass, whose exchanges are collective
    if (layered || (in.n_edges > 0 && total.requires_grad()))
      grad = torch::autograd::grad({total}, fp.grad_inputs(), {}, /*retain_graph=*/false,
                                   /*create_graph=*/false, /*allow_unused=*/true)[0];
  }
  auto out_opts = torch::TensorOptions().dtype(torch::kFloat64);
  if (in.on_model_device) out_opts = out_opts.device(impl->device);
  if (in.n_edges > 0) {
    auto out = torch::from_blob(edge_grad, {in.n_edges, 3}, out_opts);
    if (grad.defined())
      out.copy_(grad);
    else
      out.zero_();
  }
  if (node_energy && in.n_local > 0)
    torch::from_blob(node_energy, {in.n_local}, out_opts).copy_(local_energy.detach());
  // the caller (a Kokkos kernel on its own stream) reads the outputs next:
  // the model's device work must be finished, not only queued
  if (impl->device.is_cuda()) torch::cuda::synchronize(impl->device.index());

  // the energy sum in double whatever the model's dtype, reduced where the
  // energies are (one scalar leaves the device, not n_local of them)
  return local_energy.detach().to(torch::kFloat64).sum().item<double>();
}

/* ---------------------------------------------------------------------- */

std::vector<std::string> Model::parameter_names() const
{
  std::vector<std::string> names;
  for (const auto &p : impl->module.named_parameters()) names.push_back(p.name);
  return names;
}

std::vector<int64_t> Model::parameter_sizes() const
{
  std::vector<int64_t> sizes;
  for (const auto &p : impl->module.parameters()) sizes.push_back(p.numel());
  return sizes;
}

void Model::set_trainable(const std::vector<bool> &mask)
{
  if (mask.size() < impl->trainable.size())
    throw ModelError("set_trainable(): mask shorter than the parameter list");
  std::size_t k = 0;
  for (auto p : impl->module.parameters()) {
    impl->trainable[k] = mask[k] && impl->declared[k];
    p.requires_grad_(impl->params_require_grad && impl->trainable[k]);
    if (p.grad().defined()) p.mutable_grad() = torch::Tensor();
    ++k;
  }
}

std::vector<bool> Model::trainable() const
{
  return impl->trainable;
}

int64_t Model::num_trainable() const
{
  int64_t n = 0;
  std::size_t k = 0;
  for (const auto &p : impl->module.parameters())
    if (impl->trainable[k++]) n += p.numel();
  return n;
}

// parameters, then floating-point buffers, in module order
static std::vector<torch::Tensor> state_tensors(torch::jit::Module &module)
{
  std::vector<torch::Tensor> out;
  for (const auto &p : module.parameters()) out.push_back(p);
  for (const auto &b : module.buffers())
    if (b.is_floating_point()) out.push_back(b);
  return out;
}

std::string Model::state_bytes() const
{
  std::string out;
  for (const auto &t : state_tensors(impl->module)) {
    auto h = t.detach().to(torch::kCPU).contiguous();
    const auto n = h.numel() * h.element_size();
    out.append(static_cast<const char *>(h.data_ptr()), n);
  }
  return out;
}

void Model::load_state_bytes(const std::string &bytes)
{
  torch::NoGradGuard no_grad;
  std::size_t off = 0;
  auto tensors = state_tensors(impl->module);
  std::size_t total = 0;
  for (const auto &t : tensors) total += t.numel() * t.element_size();
  if (total != bytes.size())
    throw ModelError("Model " + impl->source + ": parameter state of " +
                     std::to_string(bytes.size()) + " bytes does not fit this model (" +
                     std::to_string(total) + " bytes)");
  for (auto &t : tensors) {
    const auto n = t.numel() * t.element_size();
    auto h = torch::empty(t.sizes(), t.options().device(torch::kCPU).requires_grad(false));
    std::memcpy(h.data_ptr(), bytes.data() + off, n);
    t.copy_(h);
    off += n;
  }
}

std::string Model::file_bytes(const std::string &provenance_json) const
{
  nlohmann::json meta = nlohmann::json::parse(impl->meta.json);
  if (!provenance_json.empty()) {
    auto prov = nlohmann::json::parse(provenance_json);
    // the exporter's content hash describes the parent parameters, not these
    if (meta.contains("content_hash")) {
      prov["parent_content_hash"] = meta["content_hash"];
      meta.erase("content_hash");
    }
    meta["finetune"] = prov;
  }
  torch::jit::ExtraFilesMap extra{{kMetadataName, meta.dump(1)}};
  std::ostringstream os;
  impl->module.save(os, extra);
  return os.str();
}

/* ---------------------------------------------------------------------- */

}    // namespace MLTorch
