/* ----------------------------------------------------------------------
   ML-TORCH: TorchScript machine-learned potentials for LAMMPS.
   LAMMPS-independent core: model loading, metadata, evaluation.
------------------------------------------------------------------------- */

#include "model.h"

#include <nlohmann/json.hpp>
#include <torch/cuda.h>
#include <torch/script.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include <fcntl.h>
#include <unistd.h>

namespace MLTorch {

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
  // process-wide in LibTorch: several models (a torch teacher and student)
  // each set theirs before they run, and setting the same count is a no-op
  if (n > 0 && at::get_num_threads() != n) at::set_num_threads(n);
}

void set_single_interop_thread()
{
  static bool done = false;
  if (done) return;
  done = true;
  try {
    at::set_num_interop_threads(1);
  } catch (std::exception &) {
    // already set (or used) by the embedding program: keep its choice
  }
}

int get_num_threads()
{
  return at::get_num_threads();
}

int cuda_device_count()
{
  return torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
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
  torch::Tensor train_energy, train_forces, train_virial;
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

  if (bytes.empty())
    throw ModelError("Model file " + source + " is empty (0 bytes); was it written completely?");
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
  impl->module.to(dev);
  impl->device = dev;
}

// Graph tensors for the model and its forward pass, with the contract checks
struct ForwardPass {
  torch::Tensor edge_vec, edge_index, local_energy;
};

static ForwardPass run_forward(torch::jit::Module &module, const GraphInput &in,
                               const torch::Device &dev, torch::Dtype dtype, const std::string &source)
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
  ForwardPass fp;
  fp.edge_vec = wrap(in.edge_vectors, {in.n_edges, 3}, f64).to(dev, dtype).requires_grad_(true);
  fp.edge_index = wrap(in.edge_index, {2, in.n_edges}, i64).to(dev);
  auto species = wrap(in.species, {in.n_nodes}, i64).to(dev);

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
  out.energy =
      evaluate_into(in, out.edge_grad.data(), want_node_energy ? out.node_energy.data() : nullptr);
}

double Model::evaluate_into(const GraphInput &in, double *edge_grad, double *node_energy) const
{
  auto fp = run_forward(impl->module, in, impl->device, impl->dtype, impl->source);
  auto total = fp.local_energy.sum();
  auto out_opts = torch::TensorOptions().dtype(torch::kFloat64);
  if (in.on_model_device) out_opts = out_opts.device(impl->device);
  if (in.n_edges > 0) {
    auto out = torch::from_blob(edge_grad, {in.n_edges, 3}, out_opts);
    torch::Tensor grad;
    if (total.requires_grad())
      grad = torch::autograd::grad({total}, {fp.edge_vec}, {}, /*retain_graph=*/false,
                                   /*create_graph=*/false, /*allow_unused=*/true)[0];
    if (grad.defined())
      out.copy_(grad);
    else
      out.zero_();
  }
  if (node_energy && in.n_local > 0)
    torch::from_blob(node_energy, {in.n_local}, out_opts).copy_(fp.local_energy.detach());
  // the caller (a Kokkos kernel on its own stream) reads the outputs next:
  // the model's device work must be finished, not only queued
  if (impl->device.is_cuda()) torch::cuda::synchronize(impl->device.index());

  // accumulate the energy in double whatever the model's dtype, atom by atom
  auto e_host = fp.local_energy.detach().to(torch::kCPU, torch::kFloat64).contiguous();
  const double *e = e_host.data_ptr<double>();
  double sum = 0.0;
  for (int64_t i = 0; i < in.n_local; ++i) sum += e[i];
  return sum;
}

/* ---------------------------------------------------------------------- */

void Model::forward_train(const GraphInput &in, double &energy, std::vector<double> &node_forces,
                          double *virial)
{
  impl->train_virial = torch::Tensor();
  auto fp = run_forward(impl->module, in, impl->device, impl->dtype, impl->source);
  auto &edge_vec = fp.edge_vec;
  auto &edge_index = fp.edge_index;
  auto total = fp.local_energy.sum();

  // partial forces with create_graph, so that they stay differentiable in the parameters
  torch::Tensor forces = torch::zeros({in.n_nodes, 3}, edge_vec.options().requires_grad(false));
  if (in.n_edges > 0 && total.requires_grad()) {
    auto g = torch::autograd::grad({total}, {edge_vec}, {}, /*retain_graph=*/true,
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
  if (static_cast<int64_t>(node_force_weights.size()) != F.numel())
    throw ModelError("backward_train(): " + std::to_string(node_force_weights.size()) +
                     " force weights for " + std::to_string(F.numel()) + " force components");
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
  if (objective.requires_grad()) objective.backward();
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
  for (const auto &p : impl->module.parameters()) {
    if (trainable_only && !p.requires_grad()) continue;
    // an unused parameter contributes zeros, so every rank reduces the same layout
    auto g = p.grad().defined() ? p.grad() : torch::zeros_like(p);
    auto h = g.detach().to(torch::kCPU, torch::kFloat64).contiguous().flatten();
    out.insert(out.end(), h.data_ptr<double>(), h.data_ptr<double>() + h.numel());
  }
  return out;
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
  std::size_t k = 0;
  for (auto p : impl->module.parameters()) {
    if (k >= mask.size()) throw ModelError("set_trainable(): mask shorter than the parameter list");
    p.requires_grad_(mask[k++]);
    if (p.grad().defined()) p.mutable_grad() = torch::Tensor();
  }
}

std::vector<bool> Model::trainable() const
{
  std::vector<bool> mask;
  for (const auto &p : impl->module.parameters()) mask.push_back(p.requires_grad());
  return mask;
}

int64_t Model::num_trainable() const
{
  int64_t n = 0;
  for (const auto &p : impl->module.parameters())
    if (p.requires_grad()) n += p.numel();
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

struct Trainer::Impl {
  std::vector<torch::Tensor> params;    // trainable parameters, model order
  std::unique_ptr<torch::optim::Optimizer> optimizer;
};

Trainer::Trainer(Model &model, const OptimizerSettings &s) : impl(std::make_unique<Impl>())
{
  for (const auto &p : model.impl->module.parameters())
    if (p.requires_grad()) impl->params.push_back(p);
  if (impl->params.empty()) throw ModelError("the model has no trainable parameter");
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

Trainer::~Trainer() = default;

double Trainer::step(const std::vector<double> &grad, double lr, double max_norm)
{
  std::size_t off = 0;
  for (auto &p : impl->params) {
    const auto n = static_cast<std::size_t>(p.numel());
    if (off + n > grad.size()) throw ModelError("Trainer::step(): gradient too short");
    auto g = torch::from_blob(const_cast<double *>(grad.data() + off), p.sizes(),
                              torch::TensorOptions().dtype(torch::kFloat64))
                 .to(p.device(), p.scalar_type(), /*non_blocking=*/false, /*copy=*/true);
    p.mutable_grad() = g;
    off += n;
  }
  if (off != grad.size()) throw ModelError("Trainer::step(): gradient too long");
  const double limit = max_norm > 0.0 ? max_norm : std::numeric_limits<double>::infinity();
  const double norm = torch::nn::utils::clip_grad_norm_(impl->params, limit);
  for (auto &group : impl->optimizer->param_groups()) group.options().set_lr(lr);
  impl->optimizer->step();
  for (auto &p : impl->params) p.mutable_grad() = torch::Tensor();
  return norm;
}

std::string Trainer::state() const
{
  torch::serialize::OutputArchive archive;
  impl->optimizer->save(archive);
  std::ostringstream os;
  archive.save_to(os);
  return os.str();
}

void Trainer::load_state(const std::string &bytes)
{
  torch::serialize::InputArchive archive;
  std::istringstream is(bytes);
  try {
    archive.load_from(is);
    impl->optimizer->load(archive);
  } catch (std::exception &e) {
    std::string what = e.what();
    auto nl = what.find('\n');
    if (nl != std::string::npos) what.resize(nl);
    throw ModelError("cannot restore the optimizer state: " + what);
  }
}

/* ---------------------------------------------------------------------- */

void write_file_atomic(const std::string &path, const std::string &bytes)
{
  const std::string tmp = path + ".tmp." + std::to_string(static_cast<long>(::getpid()));
  FILE *fp = std::fopen(tmp.c_str(), "wb");
  if (!fp) throw ModelError("Cannot write " + tmp + ": " + std::strerror(errno));
  bool ok = std::fwrite(bytes.data(), 1, bytes.size(), fp) == bytes.size();
  ok = (std::fflush(fp) == 0) && ok;
  ok = (::fsync(::fileno(fp)) == 0) && ok;
  ok = (std::fclose(fp) == 0) && ok;
  if (!ok) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    throw ModelError("Cannot write " + tmp + ": " + why);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    throw ModelError("Cannot rename " + tmp + " to " + path + ": " + why);
  }
  // the rename itself survives a crash of the machine once the folder is synced
  const auto slash = path.rfind('/');
  const std::string dir = (slash == std::string::npos) ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}    // namespace MLTorch
