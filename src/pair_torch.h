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
#include "torch_committee.h"
#include "torch_graph.h"
#include "torch_student.h"

#include <memory>
#include <string>
#include <vector>

namespace MLTorch {
class Model;
struct GraphInput;
struct GraphOutput;
}    // namespace MLTorch

namespace LAMMPS_NS {

// pair_style torch: a LAMMPS pair style around two objects, the graph of
// this rank (TorchGraph: build, fold, halo exchange, force scatter) and the
// models (TorchCommittee: one file or a committee, the MD model and the
// committee deviation). A force call reads as build -> evaluate -> scatter.
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
  // the graph's per-atom rows (CommRows) by forward and reverse communication
  int pack_forward_comm(int, int *, double *, int, int *) override;
  void unpack_forward_comm(int, int, double *) override;
  int pack_reverse_comm(int, int, double *) override;
  void unpack_reverse_comm(int, int *, double *) override;

  // --- TorchStudent: what fix torch/finetune and compute torch/deviation use
  // member 0 of the committee; no model before pair_coeff
  MLTorch::Model *model() override { return shared_model().get(); }
  std::shared_ptr<MLTorch::Model> shared_model() const override
  {
    return committee->size() > 0 ? committee->member(0) : nullptr;
  }
  const std::string &model_hash() const override { return committee->hash(0); }
  const std::string &model_path() const override { return committee->path(0); }
  int committee_size() const override { return committee->size(); }
  std::shared_ptr<MLTorch::Model> member(int m) const override { return committee->member(m); }
  const std::string &member_path(int m) const override { return committee->path(m); }
  const std::string &member_hash(int m) const override { return committee->hash(m); }
  bool md_on_mean() const override { return committee->mean; }
  int species_of_type(int type) const override { return graph->shape.type2species[type]; }
  const Deviation &committee_deviation() override;
  void committee_changed() override
  {
    committee->changed();
    stamp_output = -1;
  }
  void training_graph(MLTorch::GraphInput &in) override;
  const std::vector<int> &graph_atoms() const override { return graph->node_atoms(); }
  bool halo_exchange() const override { return use_exchange; }
  void evaluate_md(const MLTorch::GraphInput &in, MLTorch::GraphOutput &out) override
  {
    committee->evaluate_md(in, out, -1);
  }
  const MLTorch::GraphOutput *md_output() const override
  {
    return stamp_output == ncompute && ncompute > 0 ? output.get() : nullptr;
  }
  void add_edge_forces(const double *edge_grad, double *dst, int stride) const override
  {
    graph->scatter(edge_grad, dst, stride);
  }
  void defer_next_model_call() override { defer_request = true; }
  bool model_deferred() const override { return deferred_at == ncompute && ncompute > 0; }
  void complete_deferred(double energy, const double *virial) override;
  void sync_host_for_fix() override {}
  void host_forces_modified() override {}

  // a private instance (a fix's teacher): not the pair style of the run
  void set_private_instance() { private_instance = true; }

 protected:
  CommRows comm_rows;                        // what the pack/unpack methods move
  std::unique_ptr<TorchGraph> graph;         // torch/kk installs its own
  std::unique_ptr<TorchCommittee> committee;
  bool private_instance = false;
  long ncompute = 0;              // force calls so far
  long stamp_output = -1;         // ncompute of member 0's output in *output
  bool defer_request = false;     // the next force call leaves the model out
  long deferred_at = -1;          // ncompute of a force call that left it out
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
  int feature_width = 0;      // widest feature vector exchanged (comm buffer size)
  bool log_ghosts = false;    // log the ghost counts on the next force call
  void derive_halo_mode();    // exchange/thick, ghost lists, comm sizes (pair_coeff, init)
  void log_halo_mode();
  bool halo_settings_changed = false;    // a re-issued pair_style changed halo or fold
  double cutghost_user_before = -1.0;    // comm->cutghostuser before thick ghosts raised it
  // the graph the committee deviation is evaluated on (host buffers)
  virtual void deviation_graph(MLTorch::GraphInput &in) { training_graph(in); }
  bool centroid_supported = true;    // false: this variant computes no centroid virial
  bool fold_supported = true;        // false: this variant builds graphs that are never folded
  std::unique_ptr<MLTorch::GraphOutput> output;
  // force calls that ran the model and that deferred it, and the member
  // evaluations of the committee deviation (extract "model_calls")
  double model_calls[3] = {0.0, 0.0, 0.0};
  // wall time in compute() and in the model's evaluation since init_style()
  // (reported by finish(): what the pair style adds around the model)
  double time_pair = 0.0, time_model = 0.0;

  virtual void allocate();
  // the ERROR of a model that returns non-finite values (`where`: which
  // atoms), the same text for every back end
  void nonfinite_error(const std::string &where);
  // pair_style hybrid's skip list: a message-passing model must own every
  // type pair (ERROR otherwise), the same check for every back end
  void require_all_type_pairs();
};

}    // namespace LAMMPS_NS

#endif
#endif
