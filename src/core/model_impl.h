/* -*- c++ -*- ----------------------------------------------------------
   ML-TORCH: TorchScript machine-learned potentials for LAMMPS.
   Core-internal (LibTorch types): what the files of class Model share (the
   loaded module, a compiled package, the graph as tensors, a forward pass).
   Not included by LAMMPS styles, nor installed.
------------------------------------------------------------------------- */

#ifndef MLTORCH_CORE_MODEL_IMPL_H
#define MLTORCH_CORE_MODEL_IMPL_H

#include "mltorch/model.h"
#include "mltorch/optimizer.h"
#include "mltorch/runtime.h"

#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <map>
#include <optional>
#include <memory>
#include <string>
#include <vector>

namespace MLTorch {

/* ---------------------------------------------------------------------- */

// A compiled (AOTInductor) package made by mltorch-compile: the compiled
// energy-and-gradient function takes the model's parameters and buffers as
// inputs, so it always runs the twin's current values (fine-tuning updates
// reach it without a reload or a recompile).
struct Compiled {
  std::unique_ptr<torch::inductor::AOTIModelPackageLoader> loader;
  std::string device_type;                  // "cpu" or "cuda"
  std::optional<torch::Device> loaded_on;   // the device its code was loaded for
  int threads = 1;                          // OpenMP threads of the generated CPU code
  std::vector<std::string> state_names;     // input order after the four graph tensors
  std::vector<torch::Tensor> state;         // the twin's tensors (detached aliases), that order
  // a layered model's compiled stages (mltorch-compile): embed_fwd, embed_vjp,
  // inter_fwd_K, inter_vjp_K, readout; empty for other models
  std::map<std::string, std::unique_ptr<torch::inductor::AOTIModelPackageLoader>> stages;
};

// an AOTInductor package from bytes (the loader reads a file: a private


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
  void end_training_pass();
};

// The graph as tensors on the model's device, in the model's dtype
struct GraphTensors {
  torch::Tensor edge_vec, edge_index, species;
};


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

// the first line of an exception's text (LibTorch appends stack traces)
std::string first_line(const std::string &what);
// a compiled package from a file's bytes (nullptr: a TorchScript file; then
// `twin` is left alone), its TorchScript twin into `twin` (compiled.cpp)
// `dev`: its type is checked before the package's code is loaded, and a
// CUDA package binds to that GPU
std::unique_ptr<Compiled> open_package(const std::string &bytes, const std::string &source,
                                       std::string &twin, const torch::Device &dev);
// ModelError when the package was compiled for another device type
void check_compiled_device(const Compiled *c, const torch::Device &dev, const std::string &source);
// the graph as tensors on the model's device, in the model's dtype
GraphTensors wrap_graph(const GraphInput &in, const torch::Device &dev, torch::Dtype dtype);
// the TorchScript module's per-node energies on a graph, differentiable in
// the edge vectors (and the layered exchange's anchor)
ForwardPass run_forward(torch::jit::Module &module, const Metadata &meta, const GraphInput &in,
                        const torch::Device &dev, torch::Dtype dtype, const std::string &source);

}    // namespace MLTorch

#endif
