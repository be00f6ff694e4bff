/* -*- c++ -*- ----------------------------------------------------------
   ML-TORCH tests: main() of the GoogleTest programs that run under mpirun.
   Only rank 0 prints; the exit code is the worst of all ranks.
------------------------------------------------------------------------- */

#ifndef MLTORCH_TEST_MPI_MAIN_H
#define MLTORCH_TEST_MPI_MAIN_H

#include <gtest/gtest.h>
#include <mpi.h>

#include <string>

// rank, size and --verbose-lammps of this test program; `before_finalize`
// runs after the tests, before MPI_Finalize (e.g. Kokkos's finalize)
inline int mpi_test_main(int argc, char **argv, int &me, int &nprocs, bool &verbose,
                         void (*before_finalize)() = nullptr)
{
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &nprocs);
  ::testing::InitGoogleTest(&argc, argv);
  for (int i = 1; i < argc; i++)
    if (std::string(argv[i]) == "--verbose-lammps") verbose = true;
  if (me != 0) {
    auto &listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  const int rv = RUN_ALL_TESTS();
  int worst = rv;
  MPI_Allreduce(&rv, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (before_finalize) before_finalize();
  MPI_Finalize();
  return worst;
}

#endif
