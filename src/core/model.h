/* -*- c++ -*- ----------------------------------------------------------
   ML-TORCH: TorchScript machine-learned potentials for LAMMPS.
   This file is part of the LAMMPS-independent core: it knows nothing of
   LAMMPS and exposes no LibTorch type, so LAMMPS styles that include it
   do not pull in torch headers.
------------------------------------------------------------------------- */

#ifndef MLTORCH_CORE_MODEL_H
#define MLTORCH_CORE_MODEL_H

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace MLTorch {

// The model-file format version this build reads.
static constexpr int kFormatVersion = 1;
// Name of the metadata file stored inside the TorchScript archive.
static constexpr const char *kMetadataName = "mltorch_metadata.json";

// Errors a user can act on (bad file, bad metadata, bad device, bad shapes).
class ModelError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Metadata {
  int format_version = 0;
  double cutoff = 0.0;                  // Angstrom (or the model's length unit)
  std::vector<std::string> elements;    // species index -> element name
  int num_interaction_layers = 1;       // 1 = strictly local
  std::string units;                    // LAMMPS unit style the model expects
  std::string dtype;                    // "float32" or "float64"
  std::string model_type;               // free text, e.g. "lennard-jones"
  std::string json;                     // the metadata as stored

  int species_of(const std::string &element) const;    // -1 if absent
};

// Parse and validate metadata JSON; throws ModelError naming what is wrong.
Metadata parse_metadata(const std::string &json, const std::string &source);

// A graph on local + ghost atoms, in the layout of the model contract.
struct GraphInput {
  int64_t n_nodes = 0;                    // local + ghost nodes
  int64_t n_local = 0;                    // nodes [0, n_local) count in the energy
  int64_t n_edges = 0;
  const double *edge_vectors = nullptr;   // [n_edges][3], r_ij = x_j - x_i
  const int64_t *edge_index = nullptr;    // [2][n_edges]: centres i, then neighbours j
  const int64_t *species = nullptr;       // [n_nodes]
};

struct GraphOutput {
  double energy = 0.0;             // sum of the energies of nodes [0, n_local)
  std::vector<double> node_energy; // [n_local] (filled when asked for)
  std::vector<double> edge_grad;   // [n_edges][3], dE/dr_ij
};

class Model {
 public:
  // Load a model from the bytes of a model file. `source` names it in messages.
  Model(const std::string &bytes, const std::string &source, const std::string &device);
  ~Model();
  Model(const Model &) = delete;
  Model &operator=(const Model &) = delete;

  const Metadata &metadata() const;
  std::string device() const;

  // Energy and dE/dr_ij by one autograd pass; node energies on request.
  void evaluate(const GraphInput &in, GraphOutput &out, bool want_node_energy) const;

  // --- training support (the distributed gradient of DESIGN.md) ---------
  // Stage 1: energy of nodes [0, n_local) and the partial force this graph
  // puts on every node, node_forces [n_nodes][3] (F_i += g_ij, F_j -= g_ij),
  // keeping the autograd graph for stage 2.
  void forward_train(const GraphInput &in, double &energy, std::vector<double> &node_forces);
  // Stage 2: add to the parameter gradients
  //   d/dtheta [ sum_a node_force_weights[a] . F_a + energy_weight * E ]
  // for the graph of the last forward_train, then release it.  With
  // weights 2 R_a (the owner's force residual, also on ghost copies) and
  // 2 (E - E_ref), the sum over ranks is the gradient of the whole loss.
  void backward_train(const std::vector<double> &node_force_weights, double energy_weight);
  int64_t num_parameters() const;
  void zero_grad();
  // parameter gradients, flattened in the module's fixed parameter order
  std::vector<double> flat_gradient() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl;
};

// Read a whole file into a string; throws ModelError with the reason.
std::string read_file(const std::string &path);

// 64-bit FNV-1a of a byte string, as 16 hex digits (identifies a model file).
std::string content_hash(const std::string &bytes);

// LibTorch helpers that need no torch types in the caller.
void set_num_threads(int n);
int get_num_threads();
std::string libtorch_version();

}    // namespace MLTorch

#endif
