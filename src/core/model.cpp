/* ----------------------------------------------------------------------
   ML-TORCH: TorchScript machine-learned potentials for LAMMPS.
   LAMMPS-independent core: model loading, metadata, evaluation.
------------------------------------------------------------------------- */

#include "mltorch/model.h"

#include "mltorch/layered.h"

#include <caffe2/serialize/inline_container.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/cuda.h>
#include <torch/script.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include <fcntl.h>
#include <unistd.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

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

long keep_large_allocations()
{
#if defined(__GLIBC__)
  static long threshold = -1;
  if (threshold < 0) {
    threshold = 0;
    if (!std::getenv("MALLOC_MMAP_THRESHOLD_")) {
      const int one_gib = 1 << 30;
      if (mallopt(M_MMAP_THRESHOLD, one_gib) == 1) threshold = one_gib;
      // and do not hand the freed top of the heap back either (the next step
      // would fault it in again)
      if (threshold > 0 && !std::getenv("MALLOC_TRIM_THRESHOLD_")) mallopt(M_TRIM_THRESHOLD, one_gib);
    }
  }
  return threshold;
#else
  return 0;
#endif
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

// A compiled (AOTInductor) package made by mltorch-compile: the compiled
// energy-and-gradient function takes the model's parameters and buffers as
// inputs, so it always runs the twin's current values (fine-tuning updates
// reach it without a reload or a recompile).
struct Compiled {
  std::unique_ptr<torch::inductor::AOTIModelPackageLoader> loader;
  std::string device_type;                  // "cpu" or "cuda"
  int threads = 1;                          // OpenMP threads of the generated CPU code
  std::vector<std::string> state_names;     // input order after the four graph tensors
  std::vector<torch::Tensor> state;         // the twin's tensors (detached aliases), that order
  // a layered model's compiled stages (mltorch-compile): embed_fwd, embed_vjp,
  // inter_fwd_K, inter_vjp_K, readout; empty for other models
  std::map<std::string, std::unique_ptr<torch::inductor::AOTIModelPackageLoader>> stages;
};

// an AOTInductor package from bytes (the loader reads a file: a private
// temporary copy, removed once loaded)
static std::unique_ptr<torch::inductor::AOTIModelPackageLoader> load_aoti(const std::string &bytes,
                                                                          const std::string &source)
{
  std::string path = (std::filesystem::temp_directory_path() / "mltorch-XXXXXX.pt2").string();
  const int fd = ::mkstemps(path.data(), 4);
  if (fd < 0)
    throw ModelError("Cannot create a temporary file for compiled model " + source + " in " +
                     std::filesystem::temp_directory_path().string() + ": " + std::strerror(errno) +
                     " (set TMPDIR to a writable folder)");
  const bool written = ::write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size());
  ::close(fd);
  std::unique_ptr<torch::inductor::AOTIModelPackageLoader> loader;
  try {
    if (!written) throw ModelError("cannot write " + path + ": " + std::strerror(errno));
    loader = std::make_unique<torch::inductor::AOTIModelPackageLoader>(path, "model");
  } catch (std::exception &e) {
    std::remove(path.c_str());
    throw ModelError("Cannot load compiled model " + source + ": " + e.what());
  }
  std::remove(path.c_str());
  return loader;
}

struct Model::Impl {
  torch::jit::Module module;    // TorchScript (for a compiled package: its twin)
  std::unique_ptr<Compiled> compiled;
  // training state between forward_train and backward_train
  torch::Tensor train_energy, train_forces, train_virial;
  Metadata meta;
  torch::Device device{torch::kCPU};
  torch::Dtype dtype = torch::kFloat64;
  std::string source;
  // which parameters train (module order); the parameters themselves require
  // gradients only while a training graph is built, so that plain MD keeps no
  // activations for weight gradients
  std::vector<bool> trainable;
  // the parameters the file itself declares trainable (requires_grad as saved:
  // e.g. SevenNet's per-species scale and shift are not); the others never train
  std::vector<bool> declared;
  bool params_require_grad = true;

  void set_params_require_grad(bool on)
  {
    if (on == params_require_grad) return;
    std::size_t k = 0;
    for (auto p : module.parameters()) p.requires_grad_(on && trainable[k++]);
    params_require_grad = on;
  }
  void bind_compiled_state();
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

// names inside a compiled package (potentials/mltorch/compiled.py)
static constexpr const char *kCompiledInfo = "extra/mltorch_compiled.json";
static constexpr const char *kCompiledTwin = "mltorch/model.pt";
static constexpr const char *kCompiledStages = "mltorch/stages";
static constexpr int kCompiledFormat = 1;

static std::string device_type_name(const torch::Device &dev)
{
  return dev.is_cuda() ? "cuda" : "cpu";
}

static std::string first_line(const std::string &what)
{
  return what.substr(0, what.find('\n'));
}

static std::string read_record(caffe2::serialize::PyTorchStreamReader &zip, const std::string &name)
{
  auto [data, size] = zip.getRecord(name);
  return std::string(static_cast<const char *>(data.get()), size);
}

// A compiled package, or nullptr for anything else (TorchScript, foreign data)
static std::unique_ptr<Compiled> open_package(const std::string &bytes, const std::string &source,
                                              std::string &twin)
{
  if (bytes.size() < 4 || bytes.compare(0, 2, "PK") != 0) return nullptr;    // not a zip archive
  std::istringstream in(bytes);
  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> zip;
  try {
    zip = std::make_unique<caffe2::serialize::PyTorchStreamReader>(&in);
  } catch (std::exception &) {
    return nullptr;    // reported by the TorchScript loader
  }
  if (!zip->hasRecord("archive_format")) return nullptr;    // a TorchScript archive
  if (!zip->hasRecord(kCompiledInfo) || !zip->hasRecord(kCompiledTwin))
    throw ModelError("Model file " + source +
                     " is a torch.export/AOTInductor package without ML-TORCH data; compile "
                     "models with mltorch-compile (potentials/mltorch), which adds the model "
                     "file and metadata pair_style torch needs");
  auto c = std::make_unique<Compiled>();
  std::vector<std::string> stage_names;
  try {
    auto info = nlohmann::json::parse(read_record(*zip, kCompiledInfo));
    if (info.value("compiled_format", 0) != kCompiledFormat)
      throw ModelError("Compiled model " + source + " has compiled_format " +
                       info.value("compiled_format", nlohmann::json(0)).dump() +
                       "; this build reads " + std::to_string(kCompiledFormat) +
                       ": compile it again with this version's mltorch-compile");
    c->device_type = info.at("device").get<std::string>();
    c->threads = info.value("threads", 1);
    c->state_names = info.at("state_names").get<std::vector<std::string>>();
    stage_names = info.value("stages", std::vector<std::string>());
    const std::string built = info.value("torch_version", "");
    if (built.rfind(libtorch_version(), 0) != 0)
      throw ModelError("Compiled model " + source + " was compiled with torch " + built +
                       " but this LAMMPS links LibTorch " + libtorch_version() +
                       "; compiled code is tied to one version: run mltorch-compile again here");
  } catch (nlohmann::json::exception &e) {
    throw ModelError("Compiled model " + source + ": unreadable " + kCompiledInfo + " (" + e.what() +
                     ")");
  }
  twin = read_record(*zip, kCompiledTwin);

  // the loader reads a file: a private copy of the broadcast bytes (the
  // loader unpacks its shared library elsewhere)
  try {
    c->loader = load_aoti(bytes, source);
    for (const auto &name : stage_names) {
      const std::string record = std::string(kCompiledStages) + "/" + name + ".pt2";
      if (!zip->hasRecord(record))
        throw ModelError("it lists the compiled stage " + name + " but has no " + record);
      c->stages[name] = load_aoti(read_record(*zip, record), source + " (stage " + name + ")");
    }
  } catch (ModelError &e) {
    throw ModelError(first_line(e.what()));
  }
  return c;
}

// a package runs on the device type it was compiled for only
static void check_compiled_device(const Compiled *c, const torch::Device &dev, const std::string &source)
{
  if (c && c->device_type != device_type_name(dev))
    throw ModelError("Compiled model " + source + " was compiled for " + c->device_type +
                     " but device " + dev.str() +
                     " is requested; compile it for that device (mltorch-compile --device " +
                     device_type_name(dev) + ") or use the TorchScript model file");
}

void Model::Impl::bind_compiled_state()
{
  if (!compiled) return;
  std::map<std::string, torch::Tensor> by_name;
  for (const auto &p : module.named_parameters(/*recurse=*/true)) by_name[p.name] = p.value;
  for (const auto &b : module.named_buffers(/*recurse=*/true)) by_name[b.name] = b.value;
  compiled->state.clear();
  for (const auto &name : compiled->state_names) {
    auto it = by_name.find(name);
    if (it == by_name.end())
      throw ModelError("Compiled model " + source + " needs the tensor '" + name +
                       "' that its model file does not have; the package is inconsistent: "
                       "compile it again with mltorch-compile");
    // aliases: optimizer steps and state loads update them in place
    compiled->state.push_back(it->second.detach());
  }
}

Model::Model(const std::string &bytes, const std::string &source, const std::string &device) :
    impl(std::make_unique<Impl>())
{
  impl->source = source;
  impl->device = parse_device(device, source);

  if (bytes.empty())
    throw ModelError("Model file " + source + " is empty (0 bytes); was it written completely?");
  std::string twin;
  impl->compiled = open_package(bytes, source, twin);
  check_compiled_device(impl->compiled.get(), impl->device, source);
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

// The graph as tensors on the model's device, in the model's dtype
struct GraphTensors {
  torch::Tensor edge_vec, edge_index, species;
};

static GraphTensors wrap_graph(const GraphInput &in, const torch::Device &dev, torch::Dtype dtype)
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

// Graph tensors for the model and its forward pass, with the contract checks
struct ForwardPass {
  torch::Tensor edge_vec, edge_index, local_energy;
  // a layered run with the halo exchange: the zero scalar the exchanges
  // hang on (run_layered); differentiate by {edge_vec, anchor}
  torch::Tensor anchor;
  // the tensors whose gradients a backward pass must ask for
  std::vector<torch::Tensor> grad_inputs() const
  {
    if (anchor.defined()) return {edge_vec, anchor};
    return {edge_vec};
  }
};

static ForwardPass run_forward(torch::jit::Module &module, const Metadata &meta, const GraphInput &in,
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
  out.energy =
      evaluate_into(in, out.edge_grad.data(), want_node_energy ? out.node_energy.data() : nullptr);
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

void Model::forward_train(const GraphInput &in, double &energy, std::vector<double> &node_forces,
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

struct Trainer::Impl {
  std::vector<torch::Tensor> params;    // trainable parameters, model order
  std::unique_ptr<torch::optim::Optimizer> optimizer;
};

Trainer::Trainer(Model &model, const OptimizerSettings &s) : impl(std::make_unique<Impl>())
{
  std::size_t k = 0;
  for (const auto &p : model.impl->module.parameters())
    if (model.impl->trainable[k++]) impl->params.push_back(p);
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
    throw ModelError("cannot restore the optimizer state: " + first_line(e.what()));
  }
}

/* ---------------------------------------------------------------------- */

void write_file_atomic(const std::string &path, const std::string &bytes)
{
  const std::string tmp = path + ".tmp." + std::to_string(static_cast<long>(::getpid()));
  FILE *fp = std::fopen(tmp.c_str(), "wb");
  if (!fp) throw ModelError("Cannot write " + tmp + ": " + std::strerror(errno));
  bool ok = std::fwrite(bytes.data(), 1, bytes.size(), fp) == bytes.size();
  ok = (std::fclose(fp) == 0) && ok;
  if (!ok) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    throw ModelError("Cannot write " + tmp + ": " + why);
  }
  commit_file(tmp, path);
}

void commit_file(const std::string &tmp, const std::string &path)
{
  // a write-back error of the closed file is reported to this new
  // descriptor's fsync (Linux keeps it per file, not per descriptor)
  const int fd = ::open(tmp.c_str(), O_RDONLY);
  if (fd < 0 || ::fsync(fd) != 0) {
    const std::string why = std::strerror(errno);
    if (fd >= 0) ::close(fd);
    std::remove(tmp.c_str());
    throw ModelError("Cannot write " + tmp + ": " + why);
  }
  ::close(fd);
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
