/* ----------------------------------------------------------------------
   ML-TORCH package: registration of the styles for `plugin load`.
   Distributed under the GNU General Public License, version 2.
------------------------------------------------------------------------- */

#include "lammpsplugin.h"
#include "version.h"

#include "compute_torch_deviation.h"
#include "fix_torch_finetune.h"
#include "pair_torch.h"
#include "torch_train.h"
#include "write_restart_atomic.h"

using namespace LAMMPS_NS;

static Pair *pair_torch_creator(LAMMPS *lmp)
{
  return new PairTorch(lmp);
}

static Compute *compute_torch_deviation_creator(LAMMPS *lmp, int argc, char **argv)
{
  return new ComputeTorchDeviation(lmp, argc, argv);
}

static Command *write_restart_atomic_creator(LAMMPS *lmp)
{
  return new WriteRestartAtomic(lmp);
}

static Command *torch_train_creator(LAMMPS *lmp)
{
  return new TorchTrain(lmp);
}

static Fix *fix_torch_finetune_creator(LAMMPS *lmp, int argc, char **argv)
{
  return new FixTorchFinetune(lmp, argc, argv);
}

extern "C" void lammpsplugin_init(void *lmp, void *handle, void *regfunc)
{
  lammpsplugin_t plugin;
  auto register_plugin = (lammpsplugin_regfunc) regfunc;

  plugin.version = LAMMPS_VERSION;
  plugin.style = "pair";
  plugin.name = "torch";
  plugin.info = "ML-TORCH TorchScript machine-learned potential";
  plugin.author = "ML-TORCH developers";
  plugin.creator.v1 = (lammpsplugin_factory1 *) &pair_torch_creator;
  plugin.handle = handle;
  (*register_plugin)(&plugin, lmp);

  plugin.style = "fix";
  plugin.name = "torch/finetune";
  plugin.info = "ML-TORCH online fine-tuning of a pair_style torch model";
  plugin.creator.v2 = (lammpsplugin_factory2 *) &fix_torch_finetune_creator;
  (*register_plugin)(&plugin, lmp);

  plugin.style = "compute";
  plugin.name = "torch/deviation";
  plugin.info = "ML-TORCH committee deviation of pair_style torch models";
  plugin.creator.v2 = (lammpsplugin_factory2 *) &compute_torch_deviation_creator;
  (*register_plugin)(&plugin, lmp);

  plugin.style = "command";
  plugin.name = "write_restart/atomic";
  plugin.info = "ML-TORCH write_restart that replaces the file atomically";
  plugin.creator.v1 = (lammpsplugin_factory1 *) &write_restart_atomic_creator;
  (*register_plugin)(&plugin, lmp);

  plugin.name = "torch/train";
  plugin.info = "ML-TORCH offline training of a pair_style torch model on labelled configurations";
  plugin.creator.v1 = (lammpsplugin_factory1 *) &torch_train_creator;
  (*register_plugin)(&plugin, lmp);
}
