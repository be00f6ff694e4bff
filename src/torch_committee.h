/* -*- c++ -*- ----------------------------------------------------------
   LAMMPS - Large-scale Atomic/Molecular Massively Parallel Simulator
   https://www.lammps.org/, Sandia National Laboratories
   LAMMPS development team: developers@lammps.org

   ML-TORCH package: TorchScript machine-learned potentials.
   Distributed under the GNU General Public License, version 2.
------------------------------------------------------------------------- */

#ifndef LMP_TORCH_COMMITTEE_H
#define LMP_TORCH_COMMITTEE_H

#include "pointers.h"
#include "torch_student.h"

#include <exception>
#include <memory>
#include <string>
#include <vector>

namespace MLTorch {
class Model;
struct GraphInput;
struct GraphOutput;
}    // namespace MLTorch

namespace LAMMPS_NS {

class TorchGraph;

// The models of one torch pair style: one file, or several (a committee)
// that answer the same question (same elements, units, cutoff and depth).
// It loads them (rank 0 reads, every rank gets the bytes), evaluates the MD
// model on a graph (member 0, or the members' mean with 'committee mean'),
// and the committee deviation of DeePMD-kit's model deviation, which fix
// torch/finetune and compute torch/deviation read. The force call numbers
// (`call`) are the owning pair style's: outputs are kept per call.
class TorchCommittee : protected Pointers {
 public:
  explicit TorchCommittee(class LAMMPS *lmp);
  ~TorchCommittee();

  // pair_coeff's model files; `ntypes`, `nwords`: for the message on a
  // misspelt element read as a file name. Collective.
  void load(const std::vector<std::string> &files, const std::string &device, int ntypes,
            int nwords);
  void to_device(const std::string &device);    // collective
  // the device of this rank for the 'device' keyword ('cuda': the node's
  // GPUs in turn over the node-local ranks of the whole job)
  std::string rank_device(const std::string &device_name) const;

  int size() const { return static_cast<int>(members.size()); }
  const std::shared_ptr<MLTorch::Model> &member(int m) const { return members[m]; }
  const std::string &path(int m) const { return paths[m]; }
  const std::string &hash(int m) const { return hashes[m]; }
  bool mean = false;    // MD on the members' mean ('committee mean')
  // every member layered; the widest feature vector any of them exchanges
  bool all_layered(int &feature_width) const;

  // the MD model's output on a graph; with the mean, the members' outputs
  // are kept as those of force call `call`
  void evaluate_md(const MLTorch::GraphInput &in, MLTorch::GraphOutput &out, long call);
  // the deviation of force call `call` on `graph` (its host graph `in`);
  // `first`: member 0's output of that call if still valid. Collective.
  const TorchStudent::Deviation &deviation(TorchGraph &graph, const MLTorch::GraphInput &in,
                                           long call, const MLTorch::GraphOutput *first);
  // the deviation of force call `call` if it was evaluated, else nullptr
  const TorchStudent::Deviation *known_deviation(long call) const
  {
    return stamp_deviation == call && call > 0 ? &result : nullptr;
  }
  void changed() { stamp_members = stamp_deviation = -1; }    // parameters changed
  double evaluations = 0.0;    // member evaluations made for deviations

  // the ERROR of a model that throws on a step (`what`: in which evaluation)
  void model_error(const std::exception &e, const char *what = "") const;

 private:
  std::vector<std::shared_ptr<MLTorch::Model>> members;
  std::vector<std::string> paths, hashes;
  // per-member outputs of the last graph (committee mean, or a deviation)
  std::vector<MLTorch::GraphOutput> member_out;
  std::vector<double> member_force;    // [nall][3 x members], reverse-communicated
  TorchStudent::Deviation result;
  long stamp_members = -1;      // force call member_out belongs to
  long stamp_deviation = -1;    // force call the deviation belongs to
};

}    // namespace LAMMPS_NS

#endif
