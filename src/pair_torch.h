/* -*- c++ -*- ----------------------------------------------------------
   LAMMPS - Large-scale Atomic/Molecular Massively Parallel Simulator
   https://www.lammps.org/, Sandia National Laboratories
   LAMMPS development team: developers@lammps.org

   ML-TORCH package: TorchScript machine-learned potentials.
   Distributed under the GNU General Public License, version 2.
------------------------------------------------------------------------- */

#ifdef PAIR_CLASS
// clang-format off
PairStyle(torch,PairTorch);
// clang-format on
#else

#ifndef LMP_PAIR_TORCH_H
#define LMP_PAIR_TORCH_H

#include "pair.h"
#include "torch_student.h"

#include <exception>
#include <memory>
#include <string>
#include <vector>

namespace MLTorch {
class HaloExchange;
class Model;
struct GraphInput;
struct GraphOutput;
}    // namespace MLTorch

namespace LAMMPS_NS {

class PairTorch : public Pair, public TorchStudent {
 public:
  PairTorch(class LAMMPS *);
  ~PairTorch() override;

  void compute(int, int) override;
  void settings(int, char **) override;
  void coeff(int, char **) override;
  void init_style() override;
  double init_one(int, int) override;
  double memory_usage() override;
  void *extract(const char *, int &) override;
  void finish() override;
  int pack_forward_comm(int, int *, double *, int, int *) override;
  void unpack_forward_comm(int, int, double *) override;
  int pack_reverse_comm(int, int, double *) override;
  void unpack_reverse_comm(int, int *, double *) override;

  // the per-layer halo exchange of a layered model on the current graph
  // (MLTorch::HaloExchange): owned rows [n_local][width] -> all nodes' rows
  // by forward communication, and its adjoint by reverse communication.
  // Collective; host buffers. torch/kk overrides them for device buffers.
  virtual void halo_forward(const double *owned, double *all, int width);
  virtual void halo_reverse(const double *all, double *owned, int width);

  // --- TorchStudent: what fix torch/finetune and compute torch/deviation use
  MLTorch::Model *model() override { return model_.get(); }
  std::shared_ptr<MLTorch::Model> shared_model() const override { return model_; }
  const std::string &model_hash() const override { return model_hash_; }
  const std::string &model_path() const override { return model_file; }
  int committee_size() const override { return static_cast<int>(members.size()); }
  std::shared_ptr<MLTorch::Model> member(int m) const override { return members[m]; }
  const std::string &member_path(int m) const override { return member_files[m]; }
  const std::string &member_hash(int m) const override { return member_hashes[m]; }
  bool md_on_mean() const override { return committee_mean; }
  int species_of_type(int type) const override { return type2species[type]; }
  const Deviation &committee_deviation() override;
  void committee_changed() override { stamp_members = stamp_deviation = stamp_output = -1; }
  void training_graph(MLTorch::GraphInput &in) override;
  const std::vector<int> &graph_atoms() const override { return node2atom; }
  bool halo_exchange() const override { return use_exchange; }
  void evaluate_md(const MLTorch::GraphInput &in, MLTorch::GraphOutput &out) override;
  const MLTorch::GraphOutput *md_output() const override
  {
    return stamp_output == ncompute ? output.get() : nullptr;
  }
  void add_edge_forces(const double *edge_grad, double *dst, int stride) const override;
  void defer_next_model_call() override { defer_request = true; }
  bool model_deferred() const override { return deferred_at == ncompute && ncompute > 0; }
  void complete_deferred(double energy, const double *virial) override;
  void sync_host_for_fix() override {}
  void host_forces_modified() override {}

  // a private instance (a fix's teacher): not the pair style of the run
  void set_private_instance() { private_instance = true; }

  // ghost atoms whose edges can reach a local energy (message-passing models);
  // public because torch/kk captures it in device lambdas (CUDA forbids
  // protected member types there)
  struct GhostReach {
    bool prune = false;
    double lo[3] = {0, 0, 0}, hi[3] = {0, 0, 0};
    double reach_sq = 0.0;
    bool needed(const double *xi) const
    {
      if (!prune) return true;
      double d2 = 0.0;
      for (int d = 0; d < 3; ++d) {
        const double out = (xi[d] < lo[d]) ? lo[d] - xi[d] : (xi[d] > hi[d] ? xi[d] - hi[d] : 0.0);
        d2 += out * out;
      }
      return d2 <= reach_sq;
    }
  };

 protected:
  std::shared_ptr<MLTorch::Model> model_;
  std::vector<std::shared_ptr<MLTorch::Model>> members;    // members[0] == model_
  std::vector<std::string> member_files, member_hashes;
  bool committee_mean = false;
  bool private_instance = false;
  // per-member outputs of the last graph (committee mean, or a deviation)
  std::vector<MLTorch::GraphOutput> member_out;
  std::vector<double> member_force;    // [nall][3 x members], reverse-communicated
  Deviation deviation;
  long ncompute = 0;                   // force calls so far
  long stamp_members = -1;             // ncompute of the graph member_out belongs to
  long stamp_deviation = -1;           // ncompute the deviation belongs to
  long stamp_output = -1;              // ncompute of member 0's output in *output
  bool defer_request = false;          // the next force call leaves the model out
  long deferred_at = -1;               // ncompute of a force call that left it out
  std::string model_file;
  std::string model_hash_;    // content hash of the loaded file's bytes
  std::string device_name;    // torch device, "cpu" unless the device keyword says otherwise
  int nthreads;               // torch intra-op threads; 0 = LAMMPS default
  int torch_threads = 1;      // the count init_style() chose, set before every evaluation
  double cutoff;              // model cutoff
  double cutghost_model;      // ghost cutoff requested for message-passing models
  int nlayers;                // message-passing layers (1 = strictly local)
  // 'halo thick' forces thick ghosts for a layered model; otherwise a
  // layered model (every committee member layered) uses the exchange
  bool halo_thick = false;
  bool use_exchange = false;
  // 'fold yes' (default): with the exchange on a single rank, every ghost
  // atom is a periodic image of an owned one, and the model runs in one call
  // on the owned atoms, each edge to a ghost re-pointed at its owner
  bool fold_images = true;
  bool folded = false;        // the last graph was folded (build_graph)
  int feature_width = 0;      // widest feature vector exchanged (comm buffer size)
  bool log_ghosts = false;    // log the ghost counts on the next force call
  // what pack/unpack_*_comm move (LAMMPS's commflag convention)
  enum { COMM_MEMBER_FORCES, COMM_FEATURES };
  int commflag = COMM_MEMBER_FORCES;
  int comm_width = 0;                 // values per atom of COMM_FEATURES
  std::vector<double> halo_buf;       // [nall][comm_width] features by atom
  std::vector<double> centroid_pos;   // [nodes][3] on atomic-virial steps
  struct HaloComm;
  std::unique_ptr<HaloComm> halo;     // the MLTorch::HaloExchange handed to the model
  MLTorch::HaloExchange *halo_exchanger() const;    // it, when this style uses the exchange
  bool fold_possible() const;    // ghosts can be folded onto owners (see fold_images)
  void derive_halo_mode();       // exchange/thick, ghost lists, comm sizes (pair_coeff, init)
  void log_halo_mode();
  bool halo_settings_changed = false;    // a re-issued pair_style changed halo or fold
  double cutghost_user_before = -1.0;    // comm->cutghostuser before thick ghosts raised it
  bool fold_ghosts();            // folds the built graph; false: left as it was
  // each atom's owner (local index) by forward communication, kept until
  // the next neighbour list build (fold_ghosts)
  void find_ghost_owners();
  std::vector<int> ghost_owner;
  bigint owners_built = -1;
  bool fold_refusal_logged = false;
  // the graph the committee deviation is evaluated on (host buffers)
  virtual void deviation_graph(MLTorch::GraphInput &in) { training_graph(in); }
  bool centroid_supported = true;    // false: this variant computes no centroid virial
  bool fold_supported = true;        // false: this variant builds graphs that are never folded
  std::vector<int> type2species;    // LAMMPS type -> model species, -1 for NULL

  // graph buffers, grown and reused from step to step
  std::vector<int> atom2node, node2atom, centres;
  std::vector<int64_t> species, edge_index;
  std::vector<double> edge_vec;
  std::vector<int64_t> edge_nbr;
  std::unique_ptr<MLTorch::GraphOutput> output;
  int ncounted;    // nodes [0, ncounted) are the local atoms whose energies count
  double graph_size[2] = {0.0, 0.0};    // nodes and edges of the last graph (extract "graph_size")
  // force calls that ran the model and that deferred it, and the member
  // evaluations of the committee deviation (extract "model_calls")
  double model_calls[3] = {0.0, 0.0, 0.0};
  // wall time in compute() and in the model's evaluation since init_style()
  // (reported by finish(): what the pair style adds around the model)
  double time_pair = 0.0, time_model = 0.0, time_halo = 0.0;

  // the virial tallies of an MD force call (scatter_edges); null: not asked
  struct EdgeTallies {
    double *virial = nullptr;           // global, 6 components
    double **vatom = nullptr;           // compute stress/atom
    double **cvatom = nullptr;          // compute centroid/stress/atom, 9 components
    const double *moments = nullptr;    // GraphOutput::edge_moment of a message-passing model
    double **x = nullptr;               // positions, with moments
  };
  void scatter_edges(const double *edge_grad, double *dst, int stride, const EdgeTallies *t) const;

  virtual void allocate();
  // may_fold false: the exchange's graph even where ghosts could be folded
  void build_graph(bool may_fold = true);
  void graph_input(MLTorch::GraphInput &in) const;
  void check_finite();
  // the ERRORs of a model that throws on a step (`what`: in which
  // evaluation) or returns non-finite values (`where`: which atoms), the
  // same texts for every back end
  void model_error(const std::exception &e, const char *what = "");
  void nonfinite_error(const std::string &where);
  void log_ghost_counts(double nnodes);
  void collective_check(bool ok, const std::string &message);
  std::string torch_device() const;

  GhostReach ghost_reach() const;
};

}    // namespace LAMMPS_NS

#endif
#endif
