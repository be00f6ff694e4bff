/* ----------------------------------------------------------------------
   ML-TORCH: TorchScript machine-learned potentials for LAMMPS.
   LAMMPS-independent core: model loading, metadata, evaluation.
------------------------------------------------------------------------- */

#include "model.h"

#include <nlohmann/json.hpp>
#include <torch/headeronly/version.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

namespace MLTorch {

int Metadata::species_of(const std::string &element) const
{
  for (std::size_t i = 0; i < elements.size(); ++i)
    if (elements[i] == element) return static_cast<int>(i);
  return -1;
}

Metadata parse_metadata(const std::string &text, const std::string &source)
{
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (std::exception &e) {
    throw ModelError("Model file " + source + ": metadata is not valid JSON: " + e.what());
  }
  if (!j.is_object()) throw ModelError("Model file " + source + ": metadata is not a JSON object");

  auto require = [&](const char *key) -> const nlohmann::json & {
    if (!j.contains(key))
      throw ModelError("Model file " + source + ": metadata lacks the required key '" + key +
                       "'; re-export the model with the ML-TORCH exporter");
    return j.at(key);
  };
  auto bad = [&](const char *key, const std::string &why) {
    return ModelError("Model file " + source + ": metadata key '" + key + "' " + why);
  };

  Metadata m;
  m.json = text;
  const auto &ver = require("format_version");
  if (!ver.is_number_integer()) throw bad("format_version", "must be an integer");
  m.format_version = ver.get<int>();
  if (m.format_version != kFormatVersion)
    throw ModelError("Model file " + source + " has format version " +
                     std::to_string(m.format_version) + ", this ML-TORCH build reads version " +
                     std::to_string(kFormatVersion) + "; re-export the model or update ML-TORCH");

  const auto &cut = require("cutoff");
  if (!cut.is_number() || !(cut.get<double>() > 0.0)) throw bad("cutoff", "must be a positive number");
  m.cutoff = cut.get<double>();

  const auto &el = require("elements");
  if (!el.is_array() || el.empty()) throw bad("elements", "must be a non-empty list of names");
  std::set<std::string> seen;
  for (const auto &e : el) {
    if (!e.is_string() || e.get<std::string>().empty())
      throw bad("elements", "must hold non-empty strings");
    if (!seen.insert(e.get<std::string>()).second)
      throw bad("elements", "lists '" + e.get<std::string>() + "' twice");
    m.elements.push_back(e.get<std::string>());
  }

  const auto &nl = require("num_interaction_layers");
  if (!nl.is_number_integer() || nl.get<int>() < 1)
    throw bad("num_interaction_layers", "must be an integer >= 1");
  m.num_interaction_layers = nl.get<int>();

  const auto &un = require("units");
  if (!un.is_string() || un.get<std::string>().empty()) throw bad("units", "must be a LAMMPS unit style");
  m.units = un.get<std::string>();

  const auto &dt = require("dtype");
  if (!dt.is_string() || (dt.get<std::string>() != "float32" && dt.get<std::string>() != "float64"))
    throw bad("dtype", "must be \"float32\" or \"float64\"");
  m.dtype = dt.get<std::string>();

  if (j.contains("model_type") && j.at("model_type").is_string())
    m.model_type = j.at("model_type").get<std::string>();
  return m;
}

std::string read_file(const std::string &path)
{
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ModelError("Cannot open model file " + path + ": " + std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw ModelError("Error reading model file " + path);
  return ss.str();
}

std::string content_hash(const std::string &bytes)
{
  std::uint64_t h = 14695981039346656037ULL;    // FNV-1a 64-bit offset basis
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

void set_num_threads(int n)
{
  if (n > 0) at::set_num_threads(n);
}

int get_num_threads()
{
  return at::get_num_threads();
}

std::string libtorch_version()
{
  return std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
      std::to_string(TORCH_VERSION_PATCH);
}

/* ---------------------------------------------------------------------- */

struct Model::Impl {
  torch::jit::Module module;
  // training state between forward_train and backward_train
  torch::Tensor train_energy, train_forces;
  Metadata meta;
  torch::Device device{torch::kCPU};
  torch::Dtype dtype = torch::kFloat64;
  std::string source;
};

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

Model::Model(const std::string &bytes, const std::string &source, const std::string &device) :
    impl(std::make_unique<Impl>())
{
  impl->source = source;
  impl->device = parse_device(device, source);

  torch::jit::ExtraFilesMap extra{{kMetadataName, ""}};
  try {
    std::istringstream in(bytes);
    impl->module = torch::jit::load(in, impl->device, extra);
  } catch (std::exception &e) {
    std::string what = e.what();
    auto nl = what.find('\n');
    if (nl != std::string::npos) what.resize(nl);
    throw ModelError("Cannot load " + source + " as a TorchScript model: " + what);
  }
  if (extra[kMetadataName].empty())
    throw ModelError("Model file " + source + " has no ML-TORCH metadata (" + kMetadataName +
                     "); export it with mltorch.export (potentials/mltorch)");
  impl->meta = parse_metadata(extra[kMetadataName], source);
  impl->dtype = impl->meta.dtype == "float32" ? torch::kFloat32 : torch::kFloat64;
  if (!impl->module.find_method("forward"))
    throw ModelError("Model file " + source + " has no forward() method");
  impl->module.eval();
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

// Graph tensors for the model and its forward pass, with the contract checks
struct ForwardPass {
  torch::Tensor edge_vec, edge_index, local_energy;
};

static ForwardPass run_forward(torch::jit::Module &module, const GraphInput &in,
                               const torch::Device &dev, torch::Dtype dtype, const std::string &source)
{
  const auto i64 = torch::TensorOptions().dtype(torch::kInt64);
  const auto f64 = torch::TensorOptions().dtype(torch::kFloat64);

  // from_blob wraps the caller's buffers without copying; .to() copies only
  // when the dtype or device differs from the host double/int64 layout
  ForwardPass fp;
  fp.edge_vec = torch::from_blob(const_cast<double *>(in.edge_vectors), {in.n_edges, 3}, f64)
                    .to(dev, dtype)
                    .requires_grad_(true);
  fp.edge_index =
      torch::from_blob(const_cast<int64_t *>(in.edge_index), {2, in.n_edges}, i64).to(dev);
  auto species = torch::from_blob(const_cast<int64_t *>(in.species), {in.n_nodes}, i64).to(dev);

  std::vector<torch::jit::IValue> args{fp.edge_vec, fp.edge_index, species, in.n_local};
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
  if (node_energy.dim() != 1 || node_energy.size(0) < in.n_local)
    throw ModelError("Model " + source + ": forward() returned a tensor of shape " +
                     c10::str(node_energy.sizes()) + ", expected per-atom energies of shape [" +
                     std::to_string(in.n_local) + "] or [" + std::to_string(in.n_nodes) + "]");
  fp.local_energy = node_energy.slice(0, 0, in.n_local);
  return fp;
}

void Model::evaluate(const GraphInput &in, GraphOutput &out, bool want_node_energy) const
{
  const auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
  auto fp = run_forward(impl->module, in, impl->device, impl->dtype, impl->source);
  auto &edge_vec = fp.edge_vec;
  auto &local_energy = fp.local_energy;
  auto total = local_energy.sum();

  torch::Tensor grad;
  if (total.requires_grad() && in.n_edges > 0) {
    auto g = torch::autograd::grad({total}, {edge_vec}, {}, /*retain_graph=*/false,
                                   /*create_graph=*/false, /*allow_unused=*/true);
    grad = g[0];
  }
  if (!grad.defined()) grad = torch::zeros({in.n_edges, 3}, f64);

  auto grad_host = grad.detach().to(torch::kCPU, torch::kFloat64).contiguous();
  out.edge_grad.resize(3 * in.n_edges);
  if (in.n_edges > 0)
    std::memcpy(out.edge_grad.data(), grad_host.data_ptr<double>(), sizeof(double) * 3 * in.n_edges);

  // accumulate the energy in double whatever the model's dtype
  auto e_host = local_energy.detach().to(torch::kCPU, torch::kFloat64).contiguous();
  const double *e = e_host.data_ptr<double>();
  double sum = 0.0;
  for (int64_t i = 0; i < in.n_local; ++i) sum += e[i];
  out.energy = sum;
  if (want_node_energy) out.node_energy.assign(e, e + in.n_local);
}

/* ---------------------------------------------------------------------- */

void Model::forward_train(const GraphInput &in, double &energy, std::vector<double> &node_forces)
{
  auto fp = run_forward(impl->module, in, impl->device, impl->dtype, impl->source);
  auto &edge_vec = fp.edge_vec;
  auto &edge_index = fp.edge_index;
  auto total = fp.local_energy.sum();

  // partial forces with create_graph, so that they stay differentiable in the parameters
  torch::Tensor forces = torch::zeros({in.n_nodes, 3}, edge_vec.options().requires_grad(false));
  if (in.n_edges > 0 && total.requires_grad()) {
    auto g = torch::autograd::grad({total}, {edge_vec}, {}, /*retain_graph=*/true,
                                   /*create_graph=*/true, /*allow_unused=*/true)[0];
    if (g.defined())
      forces = forces.index_add(0, edge_index[0], g).index_add(0, edge_index[1], -g);
  }
  impl->train_energy = total;
  impl->train_forces = forces;
  energy = total.item<double>();
  auto host = forces.detach().to(torch::kCPU, torch::kFloat64).contiguous();
  node_forces.assign(host.data_ptr<double>(), host.data_ptr<double>() + 3 * in.n_nodes);
}

void Model::backward_train(const std::vector<double> &node_force_weights, double energy_weight)
{
  if (!impl->train_energy.defined()) throw ModelError("backward_train() without forward_train()");
  auto &F = impl->train_forces;
  auto w = torch::from_blob(const_cast<double *>(node_force_weights.data()), F.sizes(),
                            torch::TensorOptions().dtype(torch::kFloat64))
               .to(F.device(), F.scalar_type());
  auto objective = (w * F).sum() + energy_weight * impl->train_energy;
  if (objective.requires_grad()) objective.backward();
  impl->train_energy = torch::Tensor();
  impl->train_forces = torch::Tensor();
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

std::vector<double> Model::flat_gradient() const
{
  std::vector<double> out;
  out.reserve(num_parameters());
  for (const auto &p : impl->module.parameters()) {
    // an unused parameter contributes zeros, so every rank reduces the same layout
    auto g = p.grad().defined() ? p.grad() : torch::zeros_like(p);
    auto h = g.detach().to(torch::kCPU, torch::kFloat64).contiguous().flatten();
    out.insert(out.end(), h.data_ptr<double>(), h.data_ptr<double>() + h.numel());
  }
  return out;
}

}    // namespace MLTorch
