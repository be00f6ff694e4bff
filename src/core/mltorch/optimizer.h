/* -*- c++ -*- ----------------------------------------------------------
   ML-TORCH: TorchScript machine-learned potentials for LAMMPS.
   This file is part of the LAMMPS-independent core: it knows nothing of
   LAMMPS and exposes no LibTorch type.
   A model's optimizer: LibTorch's Adam, AdamW or SGD over its trainable
   parameters, clipping, and its state for restart files.
------------------------------------------------------------------------- */

#ifndef MLTORCH_CORE_OPTIMIZER_H
#define MLTORCH_CORE_OPTIMIZER_H

#include "mltorch/model.h"

#include <memory>
#include <string>
#include <vector>

namespace MLTorch {
// A LibTorch optimizer (torch::optim) over a model's trainable parameters.
struct OptimizerSettings {
  std::string kind = "adam";    // adam, adamw or sgd
  double lr = 1e-3;
  double weight_decay = 0.0;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;    // adam, adamw
  double momentum = 0.0;                             // sgd
  // L2-SP: (anchor / 2) |theta - theta0|^2 added to the loss, theta0 the
  // trainable parameters when the optimizer was made (0: none)
  double anchor = 0.0;
};

class ModelOptimizer {
 public:
  // the model's trainable set is fixed from here on
  ModelOptimizer(Model &model, const OptimizerSettings &settings);
  ~ModelOptimizer();
  ModelOptimizer(const ModelOptimizer &) = delete;
  ModelOptimizer &operator=(const ModelOptimizer &) = delete;

  // Install `grad` (flat, trainable parameters only, model order) as the
  // gradients, clip its global 2-norm to max_norm (<= 0: no clipping) and
  // take one optimizer step with learning rate lr. Returns the norm before
  // clipping. The model's parameters change in place: the pair style that
  // shares the model uses them on its next force call.
  double step(const std::vector<double> &grad, double lr, double max_norm);
  // (anchor / 2) |theta - theta0|^2 of the current parameters (0 without anchor)
  double anchor_term() const;
  // optimizer state (moments, step counts) for restart files
  std::string state() const;
  void load_state(const std::string &bytes);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl;
};

}    // namespace MLTorch

#endif
