/* -*- c++ -*- ----------------------------------------------------------
   ML-TORCH tests of fix torch/finetune `teacher ipi`: starting i-PI client
   processes (LAMMPS's fix ipi, ASE's SocketClient, faulty clients) and
   reading the labels the fix received (test_finetune_ipi*.cpp).
------------------------------------------------------------------------- */

#ifndef MLTORCH_TEST_IPI_FIXTURES_H
#define MLTORCH_TEST_IPI_FIXTURES_H

#include "finetune_fixtures.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <string>
#include <vector>

extern char **environ;

inline std::string env_or(const char *name, const char *fallback)
{
  const char *v = std::getenv(name);
  return v ? v : fallback;
}

// a client process: started with the MPI launcher's variables removed (an
// Open MPI child of an MPI rank would otherwise join this job), stopped
// (SIGTERM, then reaped) when the object goes
class Client {
 public:
  explicit Client(const std::vector<std::string> &argv_in, const std::string &log = "/dev/null")
  {
    if (me != 0) return;
    std::vector<std::string> env;
    for (char **e = environ; *e; ++e) {
      const std::string kv = *e;
      if (kv.rfind("OMPI_", 0) == 0 || kv.rfind("PMIX_", 0) == 0 || kv.rfind("PRTE_", 0) == 0 ||
          kv.rfind("OPAL_", 0) == 0 || kv.rfind("HYDRA_", 0) == 0 || kv.rfind("PMI_", 0) == 0)
        continue;
      env.push_back(kv);
    }
    env.push_back("OMP_NUM_THREADS=1");
    std::vector<char *> envp, argv;
    for (auto &s : env) envp.push_back(s.data());
    envp.push_back(nullptr);
    args = argv_in;
    for (auto &s : args) argv.push_back(s.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    if (posix_spawnp(&pid, argv[0], &fa, nullptr, argv.data(), envp.data()) != 0) pid = -1;
    posix_spawn_file_actions_destroy(&fa);
  }
  ~Client()
  {
    if (pid <= 0) return;
    int status = 0;
    // a client told EXIT leaves by itself; one that did not hear it is stopped
    for (int i = 0; i < 50 && waitpid(pid, &status, WNOHANG) == 0; ++i) usleep(20000);
    if (waitpid(pid, &status, WNOHANG) == 0) {
      kill(pid, SIGTERM);
      waitpid(pid, &status, 0);
    }
  }
  Client(const Client &) = delete;
  Client &operator=(const Client &) = delete;
  bool started() const { return me != 0 || pid > 0; }

 private:
  pid_t pid = -1;
  std::vector<std::string> args;
};

inline const std::string lmp_exe = env_or("ML_TORCH_LMP", "lmp");
inline const std::string python_exe = env_or("ML_TORCH_PYTHON_EXE", "python3");
inline const std::string client_py = ML_TORCH_TEST_DIR "/ipi_client.py";

// a socket name of this test process (tests may run side by side)
inline std::string socket_name(const std::string &what)
{
  long pid = static_cast<long>(getpid());
  MPI_Bcast(&pid, 1, MPI_LONG, 0, MPI_COMM_WORLD);
  return "mlt" + std::to_string(pid) + what;
}

// LAMMPS's fix ipi connects once, when its run starts, and stops if no
// server listens yet: the client starts when the socket file appears
inline std::vector<std::string> lammps_client(const std::string &name, const std::string &shape, int np)
{
  std::string cmd = "while [ ! -S /tmp/ipi_" + name + " ]; do sleep 0.05; done; exec ";
  if (np > 1)
    cmd += env_or("ML_TORCH_MPIEXEC", "mpirun") + " --allow-run-as-root --oversubscribe -np " +
        std::to_string(np) + " ";
  cmd += lmp_exe + " -log none -nocite -var name " + name + " -var shape " + shape +
      " -var potentials " + lammps_potentials + " -in " ML_TORCH_TEST_DIR "/in.ipi_client";
  return {"/bin/sh", "-c", cmd};
}

inline std::vector<std::string> ase_client(const std::string &name, int natoms,
                                    const std::vector<std::string> &extra = {})
{
  std::vector<std::string> a{python_exe, client_py, name, std::to_string(natoms)};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

// the fix's labels of its last labelled configuration, in atom-ID order
// over the replica (forces), with its energy and virial
struct Labels {
  std::vector<double> f;    // [natoms][3]
  double e = 0.0, w[6] = {0, 0, 0, 0, 0, 0};
};

inline Labels labels_of(Lammps &l, MPI_Comm world)
{
  auto fx = l.fix();
  const auto &tags = fx->label_tags();
  const auto &f = fx->label_forces();
  Labels out;
  const auto n = static_cast<std::size_t>(l.natoms());
  std::vector<double> mine(3 * n, 0.0);
  for (std::size_t i = 0; i < tags.size(); ++i)
    for (int k = 0; k < 3; ++k) mine[3 * (tags[i] - 1) + k] = f[3 * i + k];
  out.f.resize(3 * n);
  MPI_Allreduce(mine.data(), out.f.data(), static_cast<int>(3 * n), MPI_DOUBLE, MPI_SUM, world);
  out.e = fx->label_energy();
  std::copy(fx->label_virial(), fx->label_virial() + 6, out.w);
  return out;
}

inline double rel(const std::vector<double> &a, const std::vector<double> &b)
{
  return max_diff(a, b) / std::max(max_abs(b), 1e-300);
}

// the run every comparison makes: the spoilt student on hot Si, 8 labels
// and updates (every 2 steps), the teacher given
inline std::vector<std::string> finetune_run(const std::string &teacher, const std::string &shape,
                                      const std::string &extra = "")
{
  auto c = silicon(2, 4321, shape);
  c.insert(c.end(), {"velocity all create 900 4928 loop geom", "pair_style torch",
                     "pair_coeff * * " + student + " Si", "neighbor 1.0 bin",
                     "fix md all nve",
                     "fix ft all torch/finetune 2 " + teacher +
                         " lr 1e-3 log 0 check 0 teacher_timeout 60 " + extra,
                     "run 16 post no"});
  return c;
}

inline bool file_exists(const std::string &path)
{
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}


#endif
