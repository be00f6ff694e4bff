/* -*- c++ -*- ----------------------------------------------------------
   ML-TORCH: TorchScript machine-learned potentials for LAMMPS.
   This file is part of the LAMMPS-independent core: it knows nothing of
   LAMMPS and exposes no LibTorch type.
   The model contract: the file format's limits, a model file's metadata,
   the graph a model is given and what it returns (doc/models.md).
------------------------------------------------------------------------- */

#ifndef MLTORCH_CORE_CONTRACT_H
#define MLTORCH_CORE_CONTRACT_H

#include "mltorch/halo.h"

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace MLTorch {


// The model-file format version this build reads.
static constexpr int kFormatVersion = 1;
// most message-passing layers a model may declare (its ghost shell is
// layers x cutoff wide)
static constexpr int kMaxLayers = 16;
// widest per-atom feature vector a layered model may exchange between layers
static constexpr int kMaxFeatureWidth = 65536;
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
  // layered form (per-layer halo exchange): the module has the stages
  // stage_embed, stage_interaction and stage_readout beside forward(), and exchanges
  // feature_widths[k] values per atom before interaction layer k
  bool layered = false;
  std::vector<int> feature_widths;      // num_interaction_layers - 1 entries
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
  // the three buffers live in the memory of the model's device (e.g. Kokkos
  // CUDA views): wrapped without any copy; otherwise host memory
  bool on_model_device = false;
  // a layered model runs stage by stage with this exchange between its
  // layers (the graph then has edges around nodes [0, n_local) only, and
  // ghost nodes one cutoff deep); nullptr: the single forward() call
  HaloExchange *halo = nullptr;
  // true: evaluate() also returns the edge moments of the atomic (centroid)
  // virial (GraphOutput::edge_moment), from the positions [n_nodes][3] of
  // all nodes in this rank's frame (the one of the edge vectors). Set on
  // every rank of a halo exchange, ranks without nodes included: the extra
  // passes exchange too.
  bool atomic_virial = false;
  const double *centroid_positions = nullptr;
};

struct GraphOutput {
  double energy = 0.0;             // sum of the energies of nodes [0, n_local)
  std::vector<double> node_energy; // [n_local] (filled when asked for)
  std::vector<double> edge_grad;   // [n_edges][3], dE/dr_ij
  // with GraphInput::atomic_virial: [n_edges][3][3],
  //   P_e[a][b] = d/d(r_e)_b of sum_{j < n_local} x_j[a] E_j
  // (x_j the given positions, held fixed). The atomic virial of node n is
  //   W_n = sum_{e: nbr(e) = n} (P_e - x_n (x) g_e) - sum_{e: centre(e) = n} (P_e - x_n (x) g_e)
  // = sum_j (x_j - x_n) (x) dE_j/dx_n (doc/pair_torch.rst, "Heat flux")
  std::vector<double> edge_moment;
};

}    // namespace MLTorch

#endif
