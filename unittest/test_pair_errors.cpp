/* ----------------------------------------------------------------------
   ML-TORCH: every bad input to pair_style torch stops with its ERROR text.
   LAMMPS used as a library turns ERRORs into exceptions carrying the
   message, as LAMMPS's own command tests check them.
------------------------------------------------------------------------- */

#include "input.h"
#include "lammps.h"

#include <gtest/gtest.h>
#include <mpi.h>

#include <fstream>
#include <string>
#include <vector>

using LAMMPS_NS::LAMMPS;

static const std::string potentials = ML_TORCH_POTENTIALS_DIR;
static const std::string test_models = ML_TORCH_TEST_MODELS_DIR;

class PairTorchErrors : public ::testing::Test {
 protected:
  void SetUp() override
  {
    std::vector<std::string> args{"lmp", "-log", "none", "-echo", "none", "-nocite", "-screen", "none"};
    std::vector<char *> argv;
    for (auto &a : args) argv.push_back(a.data());
    lmp = new LAMMPS(static_cast<int>(argv.size()), argv.data(), MPI_COMM_WORLD);
  }
  void TearDown() override { delete lmp; }

  void cmd(const std::string &line) { lmp->input->one(line); }
  void box(const std::string &units = "metal", int ntypes = 1)
  {
    cmd("units " + units);
    cmd("lattice fcc 5.26");
    cmd("region box block 0 2 0 2 0 2");
    cmd("create_box " + std::to_string(ntypes) + " box");
    cmd("create_atoms 1 box");
    cmd("mass * 39.948");
  }
  // the ERROR text raised by `lines`, or "" if none
  std::string error_of(const std::vector<std::string> &lines)
  {
    try {
      for (const auto &l : lines) cmd(l);
    } catch (std::exception &e) {
      return e.what();
    }
    return "";
  }

  LAMMPS *lmp = nullptr;
};

#define EXPECT_ERROR(text, ...)                                                    \
  do {                                                                             \
    const std::string msg = error_of({__VA_ARGS__});                               \
    EXPECT_NE(msg.find(text), std::string::npos) << "got: '" << msg << "'";        \
  } while (0)

TEST_F(PairTorchErrors, MissingModelFile)
{
  box();
  EXPECT_ERROR("Cannot open model file /nonexistent/lj.pt", "pair_style torch",
               "pair_coeff * * /nonexistent/lj.pt Ar");
}

TEST_F(PairTorchErrors, CorruptModelFile)
{
  const std::string path = ::testing::TempDir() + "/corrupt.pt";
  std::ofstream(path) << "not a model";
  box();
  EXPECT_ERROR("as a TorchScript model", "pair_style torch", "pair_coeff * * " + path + " Ar");
}

TEST_F(PairTorchErrors, NoMetadata)
{
  box();
  EXPECT_ERROR("has no ML-TORCH metadata", "pair_style torch",
               "pair_coeff * * " + test_models + "/no_metadata.pt Ar");
}

TEST_F(PairTorchErrors, UnsupportedFormatVersion)
{
  box();
  EXPECT_ERROR("has format version 99, this ML-TORCH build reads version 1", "pair_style torch",
               "pair_coeff * * " + test_models + "/bad_version.pt Ar");
}

TEST_F(PairTorchErrors, IncompleteMetadata)
{
  box();
  EXPECT_ERROR("metadata lacks the required key 'cutoff'", "pair_style torch",
               "pair_coeff * * " + test_models + "/no_cutoff.pt Ar");
}

TEST_F(PairTorchErrors, ElementNotInModel)
{
  box();
  EXPECT_ERROR("Element Xe is not in model file " + potentials + "/lj_Ar.pt (it has: Ar)",
               "pair_style torch", "pair_coeff * * " + potentials + "/lj_Ar.pt Xe");
}

TEST_F(PairTorchErrors, WrongNumberOfElements)
{
  box("metal", 2);
  EXPECT_ERROR("needs one element name (or NULL) per atom type: got 1 name(s) for 2 atom type(s)",
               "pair_style torch", "pair_coeff * * " + potentials + "/lj_Ar.pt Ar");
}

TEST_F(PairTorchErrors, CommitteeMembersMustMatch)
{
  box("metal");
  EXPECT_ERROR("committee member 2 (" + potentials + "/morse_Cu.pt) does not match member 1 (" + potentials + "/lj_Ar.pt): elements Ar vs Cu",
               "pair_style torch", "pair_coeff * * " + potentials + "/lj_Ar.pt " + potentials +
               "/morse_Cu.pt Ar");
}

// the other properties one graph must share: cutoff and depth
TEST_F(PairTorchErrors, CommitteeMembersMustShareCutoffAndDepth)
{
  box("metal");
  EXPECT_ERROR("committee member 2 (" + test_models + "/si_short_cutoff.pt) does not match member 1 (" +
                   potentials + "/si_local.pt): cutoff ",
               "pair_style torch",
               "pair_coeff * * " + potentials + "/si_local.pt " + test_models + "/si_short_cutoff.pt Si");
  cmd("clear");
  box("metal");
  EXPECT_ERROR("committee member 2 (" + test_models + "/si_mp4_layered.pt) does not match member 1 (" +
                   potentials + "/si_mp2.pt): 2 vs 4 interaction layers; a committee needs models of "
                   "the same elements, units, cutoff and depth",
               "pair_style torch",
               "pair_coeff * * " + potentials + "/si_mp2.pt " + test_models + "/si_mp4_layered.pt Si");
}

TEST_F(PairTorchErrors, CommitteeMisspeltElementIsReadAsAFile)
{
  box("metal");
  EXPECT_ERROR("(pair_coeff read 2 model files, because 3 words follow '* *' and there are 1 atom "
               "types)", "pair_style torch", "pair_coeff * * " + potentials + "/lj_Ar.pt Ar Ar");
}

TEST_F(PairTorchErrors, CommitteeMode)
{
  EXPECT_ERROR("Illegal pair_style torch committee value median: must be first or mean",
               "pair_style torch committee median");
}

TEST_F(PairTorchErrors, HaloMode)
{
  EXPECT_ERROR("Illegal pair_style torch halo value thin: must be exchange or thick",
               "pair_style torch halo thin");
  EXPECT_ERROR("Expected boolean parameter instead of 'maybe' in input script or data file",
               "pair_style torch fold maybe");
  EXPECT_ERROR("Illegal pair_style torch fold command: missing argument", "pair_style torch fold");
}

// pair_modify shift/tail would be silently ignored: refused with an ERROR
TEST_F(PairTorchErrors, PairModifyShiftAndTailRefused)
{
  box();
  const std::string lj = std::string(ML_TORCH_POTENTIALS_DIR) + "/lj_Ar.pt";
  EXPECT_ERROR("Pair style torch does not support pair_modify shift yes", "pair_style torch",
               "pair_coeff * * " + lj + " Ar", "pair_modify shift yes", "run 0 post no");
  EXPECT_ERROR("Pair style torch does not support pair_modify tail yes", "pair_modify shift no",
               "pair_modify tail yes", "run 0 post no");
  EXPECT_EQ(error_of({"pair_modify tail no", "run 0 post no"}), "");
}

TEST_F(PairTorchErrors, DeviationKeywords)
{
  box("metal");
  EXPECT_ERROR("Illegal compute torch/deviation keyword atomic (expected relative or relative_v)",
               "compute dev all torch/deviation atomic");
  EXPECT_ERROR("Illegal compute torch/deviation relative_v level -1: must be > 0",
               "compute dev all torch/deviation relative 1.0 relative_v -1");
}

TEST_F(PairTorchErrors, DeviationNeedsACommittee)
{
  box("metal");
  EXPECT_ERROR("Compute torch/deviation needs a committee of at least 2 models", "pair_style torch",
               "pair_coeff * * " + potentials + "/lj_Ar.pt Ar", "compute dev all torch/deviation",
               "thermo_style custom step c_dev[1]", "run 0 post no");
  EXPECT_ERROR("Compute torch/deviation needs pair_style torch", "pair_style lj/cut 5.0",
               "pair_coeff * * 0.01 3.4", "uncompute dev", "compute dev all torch/deviation",
               "thermo_style custom step c_dev[1]", "run 0 post no");
}

TEST_F(PairTorchErrors, NotStarStar)
{
  box();
  EXPECT_ERROR("Pair_coeff must start with * * for pair style torch", "pair_style torch",
               "pair_coeff 1 1 " + potentials + "/lj_Ar.pt Ar");
}

TEST_F(PairTorchErrors, UnitsMismatch)
{
  box("real");
  EXPECT_ERROR("uses 'metal' units but this run uses 'units real'", "pair_style torch",
               "pair_coeff * * " + potentials + "/lj_Ar.pt Ar", "run 0 post no");
}

TEST_F(PairTorchErrors, NewtonPairOff)
{
  cmd("newton off");
  box();
  EXPECT_ERROR("Pair style torch requires newton pair on", "pair_style torch",
               "pair_coeff * * " + potentials + "/lj_Ar.pt Ar", "run 0 post no");
}

TEST_F(PairTorchErrors, NonFiniteModelOutput)
{
  box();
  EXPECT_ERROR("returned a non-finite energy or force on step 0 near atom IDs 1 ",
               "pair_style torch", "pair_coeff * * " + test_models + "/nonfinite_Ar.pt Ar",
               "run 0 post no");
}

TEST_F(PairTorchErrors, DeviceThatDoesNotExist)
{
  box();
  const std::string msg =
      error_of({"pair_style torch device cuda:7", "pair_coeff * * " + potentials + "/lj_Ar.pt Ar"});
  EXPECT_TRUE(msg.find("sees no CUDA device; use 'device cpu'") != std::string::npos ||
              msg.find("CUDA device(s) exist") != std::string::npos)
      << msg;
  EXPECT_ERROR("Unknown torch device 'tpu'", "pair_style torch device tpu",
               "pair_coeff * * " + potentials + "/lj_Ar.pt Ar");
}

TEST_F(PairTorchErrors, MessagePassingInsideHybrid)
{
  box("metal", 2);
  // a type left out (NULL), and a type pair given to another sub-style
  EXPECT_ERROR("(2 layers) inside pair_style hybrid must be given every type pair",
               "pair_style hybrid torch lj/cut 5.0",
               "pair_coeff * * torch " + potentials + "/toy_mp2_Si.pt Si NULL",
               "pair_coeff 1 2 lj/cut 0.01 3.0", "pair_coeff 2 2 lj/cut 0.01 3.0", "run 0 post no");
  EXPECT_ERROR("(2 layers) inside pair_style hybrid must be given every type pair",
               "pair_style hybrid torch lj/cut 5.0",
               "pair_coeff * * torch " + potentials + "/toy_mp2_Si.pt Si Si",
               "pair_coeff 1 2 lj/cut 0.01 3.0", "run 0 post no");
}

TEST_F(PairTorchErrors, BadKeywords)
{
  box();
  EXPECT_ERROR("Unknown pair_style torch keyword: fast", "pair_style torch fast");
  EXPECT_ERROR("Illegal pair_style torch threads value 0: must be >= 1", "pair_style torch threads 0");
  // LAMMPS's own wording (utils::missing_cmd_args), not a text the echo of
  // the command line contains
  EXPECT_ERROR("Illegal pair_style torch threads command: missing argument(s)",
               "pair_style torch threads");
}

TEST_F(PairTorchErrors, ThreadsKeywordWorks)
{
  box();
  EXPECT_EQ(error_of({"pair_style torch threads 2", "pair_coeff * * " + potentials + "/lj_Ar.pt Ar",
                      "run 0 post no"}),
            "");
}

TEST_F(PairTorchErrors, ReissuedDeviceIsUsed)
{
  // a re-issued pair_style keeps the model but takes the new device: before,
  // the model stayed where it was loaded and 'device cuda' was ignored
  box();
  const std::string msg = error_of({"pair_style torch", "pair_coeff * * " + potentials + "/lj_Ar.pt Ar",
                                    "run 0 post no", "pair_style torch device cuda:7", "run 0 post no"});
  EXPECT_TRUE(msg.find("sees no CUDA device; use 'device cpu'") != std::string::npos ||
              msg.find("CUDA device(s) exist") != std::string::npos)
      << "got: '" << msg << "'";
}

TEST_F(PairTorchErrors, MessagePassingWithCommModeMulti)
{
  cmd("units metal");
  cmd("lattice diamond 5.431");
  cmd("region box block 0 3 0 3 0 3");
  cmd("create_box 1 box");
  cmd("create_atoms 1 box");
  cmd("mass * 28.0855");
  // thick ghosts need L cutoffs of ghosts, which mode multi does not give
  // (the per-layer halo exchange needs one cutoff, as any pair style)
  EXPECT_ERROR("which comm_modify mode multi does not provide; use 'comm_modify mode single'",
               "neighbor 2.0 multi", "comm_modify mode multi", "pair_style torch halo thick",
               "pair_coeff * * " + potentials + "/si_mp2.pt Si", "run 0 post no");
}

/* ----------------------------------------------------------------------
   broken, foreign and misbehaving model files
------------------------------------------------------------------------- */

TEST_F(PairTorchErrors, ZeroByteTruncatedAndForeignFiles)
{
  const std::string dir = ::testing::TempDir();
  std::ofstream(dir + "/empty.pt").close();
  std::ifstream good(potentials + "/si_local.pt", std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(good)), std::istreambuf_iterator<char>());
  std::ofstream(dir + "/truncated.pt", std::ios::binary).write(bytes.data(), bytes.size() / 2);
  // a zip archive that is not a TorchScript module (a LAMMPS potential file, zipped)
  std::ofstream(dir + "/foreign.pt", std::ios::binary) << "PK\x03\x04 not a module";
  box();
  EXPECT_ERROR("is empty (0 bytes)", "pair_style torch", "pair_coeff * * " + dir + "/empty.pt Ar");
  EXPECT_ERROR("as a TorchScript model", "pair_coeff * * " + dir + "/truncated.pt Ar");
  EXPECT_ERROR("as a TorchScript model", "pair_coeff * * " + dir + "/foreign.pt Ar");
  for (const char *f : {"/empty.pt", "/truncated.pt", "/foreign.pt"}) std::remove((dir + f).c_str());
}

struct BadModel {
  const char *file, *text;
};

class BadModelFiles : public PairTorchErrors, public ::testing::WithParamInterface<BadModel> {};

TEST_P(BadModelFiles, StopWithTheirError)
{
  box();
  EXPECT_ERROR(GetParam().text, "pair_style torch",
               "pair_coeff * * " + test_models + "/" + GetParam().file + " Ar", "run 0 post no");
}

INSTANTIATE_TEST_SUITE_P(
    Models, BadModelFiles,
    ::testing::Values(BadModel{"wrong_shape_Ar.pt", ", 2], expected per-atom energies of shape"},
                      BadModel{"integer_energies_Ar.pt", "forward() returned Long energies, but its "
                                                        "metadata says float64"},
                      BadModel{"float32_energies_Ar.pt", "forward() returned Float energies, but its "
                                                        "metadata says float64"},
                      BadModel{"tuple_output_Ar.pt", "forward() must return a tensor of per-atom energies"},
                      BadModel{"nan_weights_Ar.pt", "parameter 'w' holds NaN or infinite values"},
                      BadModel{"inf_weights_Ar.pt", "parameter 'w' holds NaN or infinite values"}),
    [](const ::testing::TestParamInfo<BadModel> &info) {
      std::string n = info.param.file;
      return n.substr(0, n.find('.'));
    });

int main(int argc, char **argv)
{
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  const int rv = RUN_ALL_TESTS();
  MPI_Finalize();
  return rv;
}
