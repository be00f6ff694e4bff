/* ----------------------------------------------------------------------
   ML-TORCH: TorchScript machine-learned potentials for LAMMPS.
   LAMMPS-independent core: compiled (AOTInductor) packages made by
   mltorch-compile: opened, checked, bound to their TorchScript twin.
------------------------------------------------------------------------- */

#include "model_impl.h"

#include <caffe2/serialize/inline_container.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <unistd.h>

namespace MLTorch {

// names inside a compiled package (potentials/mltorch/compiled.py)
static constexpr const char *kCompiledInfo = "extra/mltorch_compiled.json";
static constexpr const char *kCompiledTwin = "mltorch/model.pt";
static constexpr const char *kCompiledStages = "mltorch/stages";
static constexpr int kCompiledFormat = 1;

// temporary copy, removed once loaded)
// `dev`: a CUDA package binds to that GPU when it is loaded (the loader's
// device index; -1 would mean the current device, GPU 0 for every rank)
static std::unique_ptr<torch::inductor::AOTIModelPackageLoader> load_aoti(const std::string &bytes,
                                                                          const std::string &source,
                                                                          const torch::Device &dev)
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
    const c10::DeviceIndex index = dev.is_cuda() && dev.has_index() ? dev.index() : -1;
    loader = std::make_unique<torch::inductor::AOTIModelPackageLoader>(path, "model", false, 1, index);
  } catch (std::exception &e) {
    std::remove(path.c_str());
    throw ModelError("Cannot load compiled model " + source + ": " + e.what());
  }
  std::remove(path.c_str());
  return loader;
}
static std::string device_type_name(const torch::Device &dev)
{
  return dev.is_cuda() ? "cuda" : "cpu";
}

static std::string read_record(caffe2::serialize::PyTorchStreamReader &zip, const std::string &name)
{
  auto [data, size] = zip.getRecord(name);
  return std::string(static_cast<const char *>(data.get()), size);
}

// A compiled package, or nullptr for anything else (TorchScript, foreign data)
std::unique_ptr<Compiled> open_package(const std::string &bytes, const std::string &source,
                                       std::string &twin, const torch::Device &dev)
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
  // the device type before any native code is loaded
  check_compiled_device(c.get(), dev, source);

  // the loader reads a file: a private copy of the broadcast bytes (the
  // loader unpacks its shared library elsewhere)
  try {
    c->loader = load_aoti(bytes, source, dev);
    c->loaded_on = dev;
    for (const auto &name : stage_names) {
      const std::string record = std::string(kCompiledStages) + "/" + name + ".pt2";
      if (!zip->hasRecord(record))
        throw ModelError("it lists the compiled stage " + name + " but has no " + record);
      c->stages[name] = load_aoti(read_record(*zip, record), source + " (stage " + name + ")", dev);
    }
  } catch (ModelError &e) {
    throw ModelError(first_line(e.what()));
  }
  return c;
}

// a package runs on the device type it was compiled for only
void check_compiled_device(const Compiled *c, const torch::Device &dev, const std::string &source)
{
  if (c && c->device_type != device_type_name(dev))
    throw ModelError("Compiled model " + source + " was compiled for " + c->device_type +
                     " but device " + dev.str() +
                     " is requested; compile it for that device (mltorch-compile --device " +
                     device_type_name(dev) + ") or use the TorchScript model file");
  if (c && c->loaded_on && *c->loaded_on != dev)
    throw ModelError("Compiled model " + source + " was loaded for device " + c->loaded_on->str() +
                     " and cannot move to " + dev.str() +
                     " (its code binds to one GPU when loaded): issue its pair_coeff again");
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

}    // namespace MLTorch
