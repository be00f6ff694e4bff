/* -*- c++ -*- ----------------------------------------------------------
   LAMMPS - Large-scale Atomic/Molecular Massively Parallel Simulator
   https://www.lammps.org/, Sandia National Laboratories
   LAMMPS development team: developers@lammps.org

   ML-TORCH package: TorchScript machine-learned potentials.
   Distributed under the GNU General Public License, version 2.
------------------------------------------------------------------------- */

#ifndef LMP_TORCH_STUDENT_H
#define LMP_TORCH_STUDENT_H

#include <memory>
#include <string>
#include <vector>

namespace MLTorch {
class Model;
struct GraphInput;
struct GraphOutput;
}    // namespace MLTorch

namespace LAMMPS_NS {

// What compute torch/deviation reads of the pair style that runs the model
// (pair_style torch and torch/kk): its committee and the committee deviation
// of the current configuration. Found with TorchCommitteeView::of().
class TorchCommitteeView {
 public:
  // the torch pair style of the run (a pair_style hybrid sub-style too), or
  // nullptr when there is none (or several)
  static TorchCommitteeView *of(class Force *force);

  // the models in pair_coeff (several: a committee)
  virtual int committee_size() const = 0;
  // model species of a LAMMPS atom type (-1: NULL, not covered)
  virtual int species_of_type(int type) const = 0;
  // the committee deviation of the current configuration (DeePMD-kit's model
  // deviation): per owned atom, columns devi_f = sqrt(<|F_m - <F>|^2>) and
  // devi_e = sqrt(<(e_m - <e>)^2>) over the members m (atomic energies e);
  // and every member's total energy. Evaluated on demand, at most once per
  // force call (an updated model invalidates it); collective over the world.
  struct Deviation {
    std::vector<double> atom;            // [nlocal][2]: devi_f, devi_e
    std::vector<double> force_mean;      // [nlocal] |<F>|, the committee mean force's magnitude
    std::vector<double> member_energy;   // [members] total energy
    std::vector<double> member_virial;   // [members][9] W_ab = -sum r_a g_b (xx xy xz yx ... zz)
    double natoms = 0.0;                 // atoms the models cover, all ranks
  };
  virtual const Deviation &committee_deviation() = 0;

 protected:
  ~TorchCommitteeView() = default;
};

// What fix torch/finetune uses of that pair style besides: the models it
// trains and their files, the graph of the current step with forces on it,
// the deferred force call, and host data on the steps it acts. Found with
// TorchStudent::of(); everything else of pair_torch.h is a LAMMPS pair style.
class TorchStudent : public TorchCommitteeView {
 public:
  // the torch pair style of the run, as TorchCommitteeView::of
  static TorchStudent *of(class Force *force);

  // the loaded model (member 0; nullptr before pair_coeff); users that keep
  // it (fix torch/finetune) hold it through shared_model(), so it outlives a
  // replaced pair style or a new pair_coeff
  virtual MLTorch::Model *model() = 0;
  virtual std::shared_ptr<MLTorch::Model> shared_model() const = 0;
  virtual const std::string &model_hash() const = 0;
  virtual const std::string &model_path() const = 0;
  // the committee: several model files in pair_coeff; MD runs on member 0
  // ('committee first', default) or on the mean of all ('committee mean')
  virtual std::shared_ptr<MLTorch::Model> member(int m) const = 0;
  virtual const std::string &member_path(int m) const = 0;
  virtual const std::string &member_hash(int m) const = 0;
  virtual bool md_on_mean() const = 0;
  // the parameters of some member changed (fix torch/finetune): forget the
  // deviation and the member outputs of the last force call
  virtual void committee_changed() = 0;

  // the graph of the current step, built from the current neighbor list
  // exactly as the force call builds it; graph_atoms() maps its nodes to
  // local/ghost atom indices
  virtual void training_graph(MLTorch::GraphInput &in) = 0;
  virtual const std::vector<int> &graph_atoms() const = 0;
  // true when the layered model(s) run with the per-layer halo exchange
  virtual bool halo_exchange() const = 0;
  // the MD force model on a graph (member 0, or the mean of all members),
  // and its output of the last force call if still valid (nullptr after a
  // parameter change, and for variants that keep it elsewhere)
  virtual void evaluate_md(const MLTorch::GraphInput &in, MLTorch::GraphOutput &out) = 0;
  virtual const MLTorch::GraphOutput *md_output() const = 0;
  // edge gradients g_e of the current graph as atom forces: F_i += g_ij,
  // F_j -= g_ij into dst[atom * stride + k] (local and ghost atoms)
  virtual void add_edge_forces(const double *edge_grad, double *dst, int stride) const = 0;
  // fix torch/finetune on a step whose model forces it replaces anyway (an
  // update follows its labels): the next force call builds the graph but
  // leaves out the model's forces, energy and virial; the fix adds the forces
  // of the updated model itself (evaluate_md on the step's graph), so the
  // model runs once for MD on that step instead of twice. A variant may
  // decline (the default), and the force call declines when it must tally
  // per-atom energy or virial; model_deferred() says whether this step's
  // call deferred. complete_deferred() gives the pair style's global energy
  // and virial this rank's `energy` and `virial` (xx yy zz xy xz yz), which
  // the caller has from its own pass
  virtual void defer_next_model_call() {}
  virtual bool model_deferred() const { return false; }
  virtual void complete_deferred(double /*energy*/, const double * /*virial*/) {}
  // for users that read or change per-atom data on the host only on some
  // steps (their KOKKOS data masks are empty): make the host copies current,
  // and say that host forces were changed. No-ops outside KOKKOS.
  virtual void sync_host_for_fix() = 0;
  virtual void host_forces_modified() = 0;

 protected:
  // never deleted through this interface (the pair style owns itself)
  ~TorchStudent() = default;
};

}    // namespace LAMMPS_NS

#endif
