/* -*- c++ -*- ----------------------------------------------------------
   ML-TORCH: TorchScript machine-learned potentials for LAMMPS.
   This file is part of the LAMMPS-independent core: it knows nothing of
   LAMMPS and exposes no LibTorch type, so LAMMPS styles that include it
   do not pull in torch headers.
------------------------------------------------------------------------- */

#ifndef MLTORCH_CORE_MODEL_H
#define MLTORCH_CORE_MODEL_H

#include "mltorch/halo.h"

#include <cstddef>
#include <cstdint>
#include <memory>
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

  friend class Trainer;

 private:
  void forward_train_pass(const GraphInput &in, double &energy, std::vector<double> &node_forces,
                          double *virial);
  void evaluate_centroid(const GraphInput &in, GraphOutput &out) const;
  struct Impl;
  std::unique_ptr<Impl> impl;
};

// A LibTorch optimizer (torch::optim) over a model's trainable parameters.
struct OptimizerSettings {
  std::string kind = "adam";    // adam, adamw or sgd
  double lr = 1e-3;
  double weight_decay = 0.0;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;    // adam, adamw
  double momentum = 0.0;                             // sgd
};

class Trainer {
 public:
  // the model's trainable set is fixed from here on
  Trainer(Model &model, const OptimizerSettings &settings);
  ~Trainer();
  Trainer(const Trainer &) = delete;
  Trainer &operator=(const Trainer &) = delete;

  // Install `grad` (flat, trainable parameters only, model order) as the
  // gradients, clip its global 2-norm to max_norm (<= 0: no clipping) and
  // take one optimizer step with learning rate lr. Returns the norm before
  // clipping. The model's parameters change in place: the pair style that
  // shares the model uses them on its next force call.
  double step(const std::vector<double> &grad, double lr, double max_norm);
  // optimizer state (moments, step counts) for restart files
  std::string state() const;
  void load_state(const std::string &bytes);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl;
};

// Write a file atomically: a temporary file in the same folder, flushed to
// disk, then renamed over `path`. A crash leaves the old file intact.
void write_file_atomic(const std::string &path, const std::string &bytes);

// The second half of it, for files written by others (LAMMPS's restart
// writer): flush the written `tmp` to disk, rename it over `path` and sync
// the folder. On failure `tmp` is removed, `path` is untouched, and the
// ModelError says why.
void commit_file(const std::string &tmp, const std::string &path);

// Read a whole file into a string; throws ModelError with the reason.
std::string read_file(const std::string &path);

// 64-bit FNV-1a of a byte string, as 16 hex digits (identifies a model file).
std::string content_hash(const std::string &bytes);

// the provenance a saved model carries (Model::file_bytes): its parent file
// and hash, the updates and step, the teacher, as a JSON object
std::string provenance_json(const std::string &parent, const std::string &parent_hash,
                            int64_t updates, int64_t step, const std::string &teacher);

// LibTorch helpers that need no torch types in the caller.
void set_num_threads(int n);
int get_num_threads();
// CUDA devices LibTorch sees (0 without CUDA)
int cuda_device_count();
// the GPU of an MPI rank for 'device cuda': the ranks of one node share its
// GPUs in turn, counted over the whole job (every replica of a -partition
// run), so replicas do not pile onto the first GPUs: "cuda:(node_local_rank
// mod ngpu)"; "cuda" when no GPU is visible (the model load reports it)
std::string cuda_device_for_rank(int node_local_rank, int ngpu);
// LibTorch's inter-op pool: one thread (models run one after the other;
// MPI ranks and intra-op threads fill the cores). Only the first call of a
// process has an effect, as LibTorch allows.
void set_single_interop_thread();
// Keep large freed blocks in the C library's heap instead of returning them
// to the kernel (glibc: mmap and trim thresholds 1 GiB). A model allocates its tensors
// afresh every step, tens of MB each for large graphs; above glibc's
// threshold (32 MB at most by default) each is mmapped, freed with munmap
// and faulted in again on the next step (30% of a 32k-atom Lennard-Jones
// step here). Once per process; a MALLOC_MMAP_THRESHOLD_ set by the user
// wins. Returns the threshold in effect (0: unknown or not glibc).
long keep_large_allocations();
// LibTorch's CPU tensors of 4 KiB or more from a cache of blocks (size
// classes of 16 per octave, made with 1/8 headroom) that reuses freed blocks
// for any tensor that fits, instead of returning them to malloc: the model's
// temporaries, whose sizes change with the graph at every step, then stop
// fragmenting the heap, and the resident size of a long run stays flat (MKL's
// own buffer cache is turned off for the same reason). Once per process;
// MLTORCH_TENSOR_CACHE=0 in the environment keeps LibTorch's own allocator
// and MKL's. Returns whether the cache is in place.
bool cache_tensor_blocks();
// the size class of a tensor of `bytes` bytes in that cache
std::size_t tensor_block_class(std::size_t bytes);
// the cache's clock, once per force call: a free block that no tensor took
// for 64 to 128 calls goes back to malloc (a growing system's outgrown blocks)
void tensor_blocks_step();
// bytes in the cache's blocks (4 KiB and more): in tensors, free, and the
// most ever in tensors at once; all zero when the cache is off
struct TensorBlockStats {
  std::size_t live_bytes = 0, free_bytes = 0, peak_live_bytes = 0;
};
TensorBlockStats tensor_block_stats();
std::string libtorch_version();

}    // namespace MLTorch

#endif
