/* -*- c++ -*- ----------------------------------------------------------
   ML-TORCH: TorchScript machine-learned potentials for LAMMPS.
   This file is part of the LAMMPS-independent core: it knows nothing of
   LAMMPS and exposes no LibTorch type.
   A loaded model (TorchScript or a compiled package): evaluation, the
   training passes, its parameters and its file. LAMMPS styles that include
   it do not pull in torch headers.
------------------------------------------------------------------------- */

#ifndef MLTORCH_CORE_MODEL_H
#define MLTORCH_CORE_MODEL_H

#include "mltorch/contract.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace MLTorch {
class Model {
 public:
  // Load a model from the bytes of a model file: TorchScript (mltorch.export),
  // or a compiled package (mltorch-compile), told apart by content.
  // `source` names it in messages.
  Model(const std::string &bytes, const std::string &source, const std::string &device);
  ~Model();
  Model(const Model &) = delete;
  Model &operator=(const Model &) = delete;

  const Metadata &metadata() const;
  std::string device() const;
  // move the parameters and buffers to another torch device (cpu, cuda:N)
  void to_device(const std::string &device);
  // a compiled (AOTInductor) package from mltorch-compile: evaluate() runs the
  // compiled code with the current parameters; training runs its TorchScript twin
  bool is_compiled() const;
  int compiled_threads() const;
  // a compiled layered model whose stages are compiled too (halo exchange)
  bool compiled_stages() const;    // OpenMP threads baked into compiled CPU code (0: not compiled)

  // Energy and dE/dr_ij by one autograd pass; node energies on request.
  void evaluate(const GraphInput &in, GraphOutput &out, bool want_node_energy) const;
  // The same into caller buffers in the memory space of the input (host, or
  // the model's device with in.on_model_device): edge_grad [n_edges][3] and,
  // if not null, node_energy [n_local]. Returns the energy of nodes [0, n_local).
  double evaluate_into(const GraphInput &in, double *edge_grad, double *node_energy) const;

  // --- training support (doc/fix_torch_finetune.rst: the exact distributed gradient) ---------
  // Stage 1: energy of nodes [0, n_local) and the partial force this graph
  // puts on every node, node_forces [n_nodes][3] (F_i += g_ij, F_j -= g_ij),
  // keeping the autograd graph for stage 2.
  // With `virial` (6 doubles: xx yy zz xy xz yz) it also returns this graph's
  // virial W = -sum_e r_e (x) dE/dr_e, kept differentiable in the parameters.
  void forward_train(const GraphInput &in, double &energy, std::vector<double> &node_forces,
                     double *virial = nullptr);
  // Stage 2: add to the parameter gradients
  //   d/dtheta [ sum_a node_force_weights[a] . F_a + energy_weight * E ]
  // for the graph of the last forward_train, then release it.  With
  // weights 2 R_a (the owner's force residual, also on ghost copies) and
  // 2 (E - E_ref), the sum over ranks is the gradient of the whole loss.
  // `virial_weights` (6 doubles or nullptr) add sum_k c_k W_k to the objective.
  void backward_train(const std::vector<double> &node_force_weights, double energy_weight,
                      const double *virial_weights = nullptr);
  // whether the parameters require gradients now (only inside a training
  // pass: MD passes build no parameter graph)
  bool parameters_require_grad() const;
  int64_t num_parameters() const;
  void zero_grad();
  // parameter gradients, flattened in the module's fixed parameter order
  // (all parameters, or only the trainable ones); unused parameters give zeros
  std::vector<double> flat_gradient(bool trainable_only = false) const;

  // --- parameters --------------------------------------------------------
  std::vector<std::string> parameter_names() const;    // fixed module order
  std::vector<int64_t> parameter_sizes() const;
  // choose the trainable parameters (requires_grad); mask in module order
  void set_trainable(const std::vector<bool> &mask);
  std::vector<bool> trainable() const;
  int64_t num_trainable() const;    // number of trainable scalars
  // raw bytes of every parameter and floating-point buffer, in a fixed
  // order: what replicas broadcast, checksum and restart files store
  std::string state_bytes() const;
  void load_state_bytes(const std::string &bytes);
  // a complete model file (TorchScript + metadata) with the current
  // parameters; `provenance_json` (a JSON object or "") is stored in the
  // metadata under "finetune"
  std::string file_bytes(const std::string &provenance_json) const;

  friend class ModelOptimizer;

 private:
  void forward_train_pass(const GraphInput &in, double &energy, std::vector<double> &node_forces,
                          double *virial);
  void evaluate_centroid(const GraphInput &in, GraphOutput &out) const;
  struct Impl;
  std::unique_ptr<Impl> impl;
};

}    // namespace MLTorch

#endif
