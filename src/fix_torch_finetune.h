/* -*- c++ -*- ----------------------------------------------------------
   LAMMPS - Large-scale Atomic/Molecular Massively Parallel Simulator
   https://www.lammps.org/, Sandia National Laboratories
   LAMMPS development team: developers@lammps.org

   ML-TORCH package: TorchScript machine-learned potentials.
   Distributed under the GNU General Public License, version 2.
------------------------------------------------------------------------- */

#ifdef FIX_CLASS
// clang-format off
FixStyle(torch/finetune,FixTorchFinetune);
// clang-format on
#else

#ifndef LMP_FIX_TORCH_FINETUNE_H
#define LMP_FIX_TORCH_FINETUNE_H

#include "fix.h"

#include "mltorch/halo.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace MLTorch {
struct GraphInput;
struct GraphOutput;
class Model;
class DistributedTrainer;
struct FinetuneSettings;
}    // namespace MLTorch

namespace LAMMPS_NS {

class FixTorchFinetune : public Fix {
  friend class FixTorchFinetuneProbe;    // the tests' view of the internals

 public:
  FixTorchFinetune(class LAMMPS *, int, char **);
  ~FixTorchFinetune() override;

  int setmask() override;
  void init() override;
  void setup(int) override;
  void setup_pre_force(int) override;
  void pre_force(int) override;
  void post_force(int) override;
  void post_run() override;
  double compute_vector(int) override;
  void write_restart(FILE *) override;
  void restart(char *) override;
  double memory_usage() override;

  // per-atom |F - F_ref| of the last labelled configuration, following the atoms
  void grow_arrays(int) override;
  void copy_arrays(int, int, int) override;
  int pack_exchange(int, double *) override;
  int unpack_exchange(int, double *) override;

  int pack_forward_comm(int, int *, double *, int, int *) override;
  void unpack_forward_comm(int, int, double *) override;
  int pack_reverse_comm(int, int, double *) override;
  void unpack_reverse_comm(int, int *, double *) override;

 protected:
  // the keywords (fix_torch_finetune_settings.cpp parses them)
  std::unique_ptr<MLTorch::FinetuneSettings> set;
  static void parse_settings(class LAMMPS *, int, char **, MLTorch::FinetuneSettings &);

  // the pair style running the model: set when the fix is defined and by
  // every init(); between runs it may be gone (another pair_style), so only
  // run-time code uses it
  class TorchStudent *student;
  // the models, shared with the pair style that loaded them: they stay valid
  // for the fix (restart files, saves) whatever happens to the pair style
  std::shared_ptr<MLTorch::Model> model_;    // member 0, the MD model
  std::vector<std::shared_ptr<MLTorch::Model>> members;
  std::string model_path, model_hash;
  std::vector<std::string> member_hashes;
  // the training state and its update (the core's MPI library)
  std::unique_ptr<MLTorch::DistributedTrainer> trainer;
  std::unique_ptr<class FinetuneTeacher> teacher;
  std::unique_ptr<class FinetuneReplicas> replicas;
  std::unique_ptr<class FinetuneLabels> labels;    // labels FILE (none: null)
  std::unique_ptr<class FinetuneDataset> dataset;  // dataset FILE M (none: null)
  bool synced;
  int pending;    // configurations accumulated since the last update
  // the pair style may leave the model out of the force call of a step that
  // ends in an update (init() decides; pre_force() asks for it)
  bool defer_ok = false;
  // this rank's share of the MD model's energy and virial of the labelled
  // configuration (its training pass): what a deferred force call tallies
  double md_energy_part = 0.0, md_virial_part[6] = {0, 0, 0, 0, 0, 0};
  double last_devi = 0.0;
  // wall seconds of this rank in labelling + training + updates (output
  // vector element 12; 13 is the trainer's time in the gradient reduction)
  double time_update = 0.0;
  bool replay_warned = false;
  bool rerun_warned = false, minimize_warned = false;
  // the largest restart record LAMMPS stores for a fix (an int byte count);
  // a test lowers it to reach the error without a 2 GB model
  static std::size_t max_restart_bytes;

  // --- per-atom work arrays ---
  int nmax;
  double **fpart;    // partial model forces -> full forces on owners (reverse comm)
  double **resid;    // force-loss weights on owners -> ghost copies (forward comm)
  double **fref;     // teacher forces on owners
  double **fmd;      // the MD model's forces before an update (when not in fpart)
  double *resid_atom;    // per atom |F - F_ref| of the last labelled configuration (member 1)
  std::vector<tagint> lab_tags;    // the labels of the last labelled configuration
  std::vector<double> lab_forces;
  double lab_energy = 0.0, lab_virial[6] = {0, 0, 0, 0, 0, 0};
  // what pack/unpack_*_comm move (LAMMPS's commflag convention): atom->f or
  // one of the work arrays, [3] per atom
  enum { COMM_F, COMM_FPART, COMM_FMD, COMM_RESID };
  int commflag = COMM_RESID;
  double **comm_array() const;
  std::vector<double> node_buf;    // the teacher forces on the owned nodes, reused
  // the owners of the student's graph nodes through this fix's
  // communication (fpart, resid): MLTorch::configuration_gradient's exchange
  struct OwnerComm : MLTorch::HaloExchange {
    OwnerComm(FixTorchFinetune &f, const std::vector<int> &atoms, int64_t nl, int64_t nn) :
        fix(f), node2atom(atoms), n_local(nl), n_nodes(nn)
    {
    }
    void forward(const double *owned, double *all, int width) override;
    void reverse(const double *all, double *owned, int width) override;
    FixTorchFinetune &fix;
    const std::vector<int> &node2atom;
    int64_t n_local, n_nodes;
  };

  void setup_trainable();
  void grow_work();
  void train_current(const MLTorch::GraphInput &in);
  bool gate_says_label();
  void store_replay(const MLTorch::GraphInput &in, double e_ref, const double *w_ref,
                    double natoms);
  void take_step();
  void refresh_forces(const MLTorch::GraphInput &in, double **before);
  void md_forces(const MLTorch::GraphInput &in, int which, const MLTorch::GraphOutput *given);
  // the fix's communication of one [3] per-atom array (COMM_*)
  void sum_to_owners(int which);
  void copy_to_ghosts(int which);
  void save_model(const std::string &path);
  std::string energy_shift_text() const;
};

}    // namespace LAMMPS_NS

#endif
#endif
