/* ----------------------------------------------------------------------
   ML-TORCH tests: failures inside fix torch/finetune's collective sequences
   when LAMMPS is driven through its C library interface (as Python does),
   where an ERROR throws instead of aborting the job. A failure that one MPI
   rank or one replica sees must reach every rank of every replica as a
   LAMMPS error at the same step; none may be left waiting in a collective.
   Run under mpirun -np 2 with a ctest TIMEOUT, so that a hang fails.

     OneRankFails:          the model raises in a training pass on rank 1 only
     OnePartitionFails:     the same in partition 2 of two (-partition 2x1)
     OnePartitionHasNoData: partition 1 holds no atom (none the model covers)
------------------------------------------------------------------------- */

#define LAMMPS_LIB_MPI 1
#include "library.h"

#include "mpi_test_main.h"

#include <gtest/gtest.h>
#include <mpi.h>

#include <string>
#include <vector>

static int me = 0, nprocs = 1;
static bool verbose = false;
static const std::string test_models = ML_TORCH_TEST_MODELS_DIR;

namespace {

// one LAMMPS instance on all ranks, through the C library interface only
class Instance {
 public:
  explicit Instance(const std::vector<std::string> &extra)
  {
    std::vector<std::string> args{"lmp", "-log", "none", "-echo", "none", "-nocite"};
    if (!verbose) args.insert(args.end(), {"-screen", "none"});
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char *> argv;
    for (auto &a : args) argv.push_back(&a[0]);
    handle = lammps_open(static_cast<int>(argv.size()), argv.data(), MPI_COMM_WORLD, nullptr);
  }
  ~Instance() { lammps_close(handle); }
  Instance(const Instance &) = delete;
  Instance &operator=(const Instance &) = delete;

  // runs `lines`; the error type (0 none, 1 LAMMPS error, 2 abort-class) and its message
  int run(const std::string &lines, std::string &message)
  {
    lammps_commands_string(handle, lines.c_str());
    if (!lammps_has_error(handle)) return 0;
    char buf[16384];
    const int type = lammps_get_last_error_message(handle, buf, sizeof(buf));
    message = buf;
    return type;
  }

  void *handle = nullptr;
};

// 128 Ar atoms in 2 subdomains along x; Xe atoms in the region named by
// ${xe}; the model refuses training passes around Xe (its MD passes work)
std::string ar_xe(const std::string &model_types,
                  const std::string &model = test_models + "/fails_training_near_Xe.pt",
                  const std::string &cut = "8.5")
{
  return "processors * 1 1\n"
         "units metal\n"
         "atom_modify map array\n"
         "lattice fcc 5.26\n"
         "region box block 0 8 0 2 0 2\n"
         "create_box 2 box\n"
         "create_atoms 1 box\n"
         "mass * 39.948\n"
         "region back block 7 8 INF INF INF INF\n"
         "region none block -3 -2 INF INF INF INF\n"
         "set region ${xe} type 2\n"
         "velocity all create 60.0 4928 loop geom\n"
         "pair_style torch\n"
         "pair_coeff * * " +
      model + " " + model_types +
      "\n"
      "fix md all nve\n"
      "fix ft all torch/finetune 1 teacher \"lj/cut " + cut + "\" \"* * 0.0104 3.4\" log 0\n";
}

// every rank of every partition: the same error type and a message with `want`
void expect_everywhere(int type, const std::string &message, int want_type, const std::string &want)
{
  EXPECT_EQ(type, want_type) << message;
  EXPECT_NE(message.find(want), std::string::npos) << "got: '" << message << "'";
  int ok = (type == want_type && message.find(want) != std::string::npos) ? 1 : 0, all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  EXPECT_EQ(all, 1) << "not every rank got the error";
}

}    // namespace

TEST(LibraryFailures, OneRankFails)
{
  if (nprocs != 2) GTEST_SKIP() << "runs on 2 ranks";
  Instance lmp({"-var", "xe", "back"});
  std::string message;
  ASSERT_EQ(lmp.run(ar_xe("Ar Xe"), message), 0) << message;
  const int type = lmp.run("run 3 post no\n", message);
  // one partition: an ordinary LAMMPS error on both ranks, rank 1's message
  expect_everywhere(type, message, 1,
                    "Fix torch/finetune on step 1: Model " + test_models +
                        "/fails_training_near_Xe.pt failed in forward()");
  EXPECT_NE(message.find("training pass refused near Xe (test model)"), std::string::npos) << message;
  EXPECT_NE(message.find("(on MPI rank 1)"), std::string::npos) << message;
}

// a layered model under the per-layer halo exchange that raises between
// two exchanges of a training pass on rank 1 only (its 16 Xe atoms): rank
// 0 must not wait in the next exchange; both stop with rank 1's message
TEST(LibraryFailures, OneRankFailsBetweenExchanges)
{
  if (nprocs != 2) GTEST_SKIP() << "runs on 2 ranks";
  Instance lmp({"-var", "xe", "back"});
  std::string message;
  ASSERT_EQ(lmp.run(ar_xe("Ar Xe", test_models + "/fails_layer2_near_Xe.pt", "6.0"), message), 0)
      << message;
  const int type = lmp.run("run 3 post no\n", message);
  expect_everywhere(type, message, 1, "Fix torch/finetune on step 1: ");
  EXPECT_NE(message.find("training pass refused in layer 2 near Xe (test model)"), std::string::npos)
      << message;
  EXPECT_NE(message.find("(on MPI rank 1)"), std::string::npos) << message;
}

// two replicas (-partition 2x1, one rank each) set up by `setup`, then a
// short run: its error type and message
static int run_two_replicas(const std::string &setup, std::string &message)
{
  Instance lmp({"-partition", "2x1", "-plog", "none", "-pscreen", "none", "-in", "none"});
  const int type = lmp.run("variable p world 0 1\n" + setup, message);
  if (type != 0) return -type;    // the set-up failed: a negative type
  return lmp.run("run 3 post no\n", message);
}

TEST(LibraryFailures, OnePartitionFails)
{
  if (nprocs != 2) GTEST_SKIP() << "runs on 2 ranks";
  std::string message;
  // Xe in partition 2 only
  const int type = run_two_replicas("if \"${p} == 1\" then \"variable xe string back\" "
                                    "else \"variable xe string none\"\n" + ar_xe("Ar Xe"),
                                    message);
  // replicas: LAMMPS's abort-class error (the caller must end the job), on every replica
  expect_everywhere(type, message, 2, "training pass refused near Xe (test model)");
  EXPECT_NE(message.find("(in partition 2)"), std::string::npos) << message;
}

TEST(LibraryFailures, OnePartitionHasNoData)
{
  if (nprocs != 2) GTEST_SKIP() << "runs on 2 ranks";
  std::string message;
  // partition 1: no atom at all, so none of a type the model covers
  const int type = run_two_replicas("variable xe string none\n" + ar_xe("Ar Xe") +
                                        "if \"${p} == 0\" then \"delete_atoms group all\"\n",
                                    message);
  expect_everywhere(type, message, 2,
                    "Fix torch/finetune on step 1: no atom of a type the model covers; nothing "
                    "to train on (in partition 1)");
}

int main(int argc, char **argv)
{
  return mpi_test_main(argc, argv, me, nprocs, verbose);
}
