/* ----------------------------------------------------------------------
   ML-TORCH tests of fix torch/finetune `teacher ipi`, faults and CP2K: an
   external program labels through the i-PI socket protocol. Clients are started by the test
   as separate processes (LAMMPS's fix ipi, ASE's SocketClient, faulty
   clients) from universe rank 0; the server runs in this process.
   Run under ctest (test_finetune_ipi), whose environment names the lmp and
   python executables (ML_TORCH_LMP, ML_TORCH_PYTHON_EXE).
------------------------------------------------------------------------- */

#include "ipi_fixtures.h"

#include "mltorch/ipi.h"

#include <cerrno>
#include <fcntl.h>
#include <csignal>
#include <fstream>
#include <sstream>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <spawn.h>
#include <unistd.h>

#include "json.h"    // LAMMPS's copy of nlohmann/json

/* ----------------------------------------------------------------------
   faults: each ends in an ERROR on every rank (library mode: every rank
   throws), none hangs (ctest TIMEOUT), files stay whole
------------------------------------------------------------------------- */

TEST(IpiFaults, NoClientTimesOut)
{
  const std::string name = socket_name("none");
  Lammps l;
  auto c = finetune_run("teacher ipi \"" + name + " 0 unix\"", "ortho");
  c.back() = "run 4 post no";
  for (auto &s : c)
    if (s.find("teacher_timeout 60") != std::string::npos)
      s.replace(s.find("teacher_timeout 60"), 18, "teacher_timeout 1");
  const std::string err = l.error_of(c);
  if (me == 0) std::printf("[ ipi none ] %s\n", err.c_str());
  EXPECT_NE(err.find("no i-PI client connected to /tmp/ipi_" + name + " within 1 s"), std::string::npos) << err;
  EXPECT_NE(err.find("CP2K with RUN_TYPE DRIVER and &DRIVER HOST " + name + " (unix)"), std::string::npos) << err;
}

TEST(IpiFaults, ClientDiesMidRun)
{
  const std::string name = socket_name("dies");
  const std::string saved = "/tmp/" + name + ".pt";
  Client client(ase_client(name, 64, {"--die-after", "3"}));
  Lammps l;
  const std::string err = l.error_of(finetune_run("teacher ipi \"" + name + " 0 unix\"", "ortho",
                                                  "save 1 " + saved));
  if (me == 0) std::printf("[ ipi dies ] %s\n", err.c_str());
  EXPECT_NE(err.find("is gone"), std::string::npos) << err;
  EXPECT_NE(err.find("start a new client and continue"), std::string::npos) << err;
  // three updates were saved, atomically: the file loads
  EXPECT_EQ(l.fix()->updates(), 3);
  if (me == 0) {
    EXPECT_NO_THROW(MLTorch::Model(MLTorch::read_file(saved), saved, "cpu"));
    std::remove(saved.c_str());
  }
}

TEST(IpiFaults, WrongAtomCount)
{
  const std::string name = socket_name("count");
  Client client(ase_client(name, 64, {"--bad", "count"}));
  Lammps l;
  const std::string err = l.error_of(finetune_run("teacher ipi \"" + name + " 0 unix\"", "ortho"));
  EXPECT_NE(err.find("returned forces on 63 atoms for the 64 it was sent"), std::string::npos) << err;
  EXPECT_EQ(l.fix()->updates(), 1);
}

TEST(IpiFaults, NonFiniteValuesMakeNoUpdate)
{
  const std::string name = socket_name("nan");
  Client client(ase_client(name, 64, {"--bad", "nan"}));
  Lammps l;
  const std::string err = l.error_of(finetune_run("teacher ipi \"" + name + " 0 unix\"", "ortho"));
  EXPECT_NE(err.find("non-finite values"), std::string::npos) << err;
  EXPECT_EQ(l.fix()->updates(), 1);
}

TEST(IpiFaults, BusyAddressIsRefused)
{
  const std::string name = socket_name("busy");
  std::unique_ptr<MLTorch::IpiServer> other;
  if (me == 0) {
    other = std::make_unique<MLTorch::IpiServer>(name, 0, true);
    other->open();
  }
  MPI_Barrier(MPI_COMM_WORLD);
  Lammps l;
  const std::string err = l.error_of(finetune_run("teacher ipi \"" + name + " 0 unix\"", "ortho"));
  EXPECT_NE(err.find("another server is listening on the i-PI socket /tmp/ipi_" + name), std::string::npos)
      << err;
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(IpiFaults, StaleSocketFileIsReused)
{
  const std::string name = socket_name("stale");
  if (me == 0) {
    // a socket file nobody listens on (a crashed server's)
    const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, ("/tmp/ipi_" + name).c_str(), sizeof(addr.sun_path) - 1);
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr *>(&addr), sizeof(addr)), 0);
    ::close(fd);
    EXPECT_TRUE(file_exists("/tmp/ipi_" + name));
  }
  MPI_Barrier(MPI_COMM_WORLD);
  {
    Client client(ase_client(name, 64));
    Lammps l;
    l.cmds(finetune_run("teacher ipi \"" + name + " 0 unix\"", "ortho"));
    EXPECT_EQ(l.fix()->updates(), 8);
  }
  EXPECT_FALSE(file_exists("/tmp/ipi_" + name));
}

TEST(IpiFaults, AtomCountChangeIsRefused)
{
  const std::string name = socket_name("natoms");
  Client client(ase_client(name, 64));
  Lammps l;
  l.cmds(finetune_run("teacher ipi \"" + name + " 0 unix\"", "ortho"));
  const std::string err = l.error_of({"group one id 7", "delete_atoms group one", "run 4 post no"});
  EXPECT_NE(err.find("the number of atoms changed from 64 to 63"), std::string::npos) << err;
}

TEST(IpiFaults, BadAddressAndUnits)
{
  Lammps l;
  l.cmds(silicon(2, 4321, "ortho"));
  l.cmds({"pair_style torch", "pair_coeff * * " + student + " Si"});
  std::string err = l.error_of({"fix ft all torch/finetune 2 teacher ipi \"name\""});
  EXPECT_NE(err.find("needs \"ADDRESS PORT [unix]\""), std::string::npos) << err;
  err = l.error_of({"fix ft all torch/finetune 2 teacher ipi \"localhost 99999\""});
  EXPECT_NE(err.find("is not a TCP port"), std::string::npos) << err;
  err = l.error_of({"fix ft all torch/finetune 2 teacher ipi \"n 0 unix\" teacher_timeout 0"});
  EXPECT_NE(err.find("teacher_timeout must be > 0"), std::string::npos) << err;
}

/* ----------------------------------------------------------------------
   CP2K (Debian's cp2k.psmp) in driver mode: the labels (energy, forces,
   virial) of an 8-atom Si cell equal CP2K's own ENERGY_FORCE run of the
   same configuration (energy, forces, stress times volume; both
   inputs written by tools/cp2k_input.py from one data file; PBE, SZV
   basis, 120 Ry, Gamma point). Not bitwise: CP2K reads the ENERGY_FORCE
   run's Angstrom coordinates with its own Bohr constant, the driver gets
   Bohr from the server's, and the SCF stops at EPS_SCF.
------------------------------------------------------------------------- */

// CP2K's own energy (Hartree), forces (Hartree/Bohr) and stress (GPa, 3x3
// row-major) from its output
static double cp2k_energy_and_forces(const std::string &out, std::vector<double> &f,
                                     std::vector<double> &stress)
{
  std::ifstream in(out);
  std::string line;
  double e = NAN;
  bool forces = false;
  int stress_rows = -1;
  while (std::getline(in, line)) {
    if (line.find("STRESS| Analytical stress tensor [GPa]") != std::string::npos) {
      stress.clear();
      stress_rows = 0;
      continue;
    }
    if (stress_rows >= 0 && stress_rows < 4) {
      std::istringstream w(line.substr(line.find('|') + 1));
      std::string axis;
      double a, b, c;
      if (w >> axis >> a >> b >> c) stress.insert(stress.end(), {a, b, c});
      if (++stress_rows == 4) stress_rows = -1;
    }
    if (line.find("ENERGY| Total FORCE_EVAL ( QS ) energy") != std::string::npos)
      e = std::stod(line.substr(line.rfind(':') + 1));
    if (line.find("ATOMIC FORCES in [a.u.]") != std::string::npos) {
      forces = true;
      f.clear();
      continue;
    }
    if (forces) {
      std::istringstream w(line);
      int atom, kind;
      std::string el;
      double fx, fy, fz;
      if (w >> atom >> kind >> el >> fx >> fy >> fz) {
        f.insert(f.end(), {fx, fy, fz});
      } else if (line.find("SUM OF ATOMIC FORCES") != std::string::npos) {
        forces = false;
      }
    }
  }
  return e;
}

// the last n lines of a text file ("" when it cannot be read)
static std::string tail_of(const std::string &path, int n)
{
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  std::string out;
  for (size_t i = lines.size() > size_t(n) ? lines.size() - n : 0; i < lines.size(); ++i)
    out += lines[i] + "\n";
  return out;
}

// the labels of one configuration from a DFT code in driver mode (`driver`,
// started in `dir` once the server's socket exists) while the same code's
// own run of it (`own`) goes beside it; the driver's output on a failure
static Labels label_with(Lammps &l, const std::string &name, const std::string &dir,
                         const std::string &code, const std::string &driver, const std::string &own)
{
  Labels got;
  try {
    Client d({"/bin/sh", "-c", "while [ ! -S /tmp/ipi_" + name + " ]; do sleep 0.05; done; cd " +
              dir + " && exec " + driver}, dir + "/driver.log");
    Client o({"/bin/sh", "-c", "cd " + dir + " && exec " + own}, dir + "/own.log");
    l.cmds({"fix ft all torch/finetune 1 teacher ipi \"" + name +
                " 0 unix\" energy_shift none log 0 check 0 teacher_timeout 60",
            "run 1 post no"});
    got = labels_of(l, MPI_COMM_WORLD);
    l.cmd("unfix ft");
  } catch (std::exception &ex) {
    ADD_FAILURE() << ex.what() << "\n" << code << " driver's output (end):\n"
                  << tail_of(dir + "/driver.out", 30) << "\nits stderr (end):\n"
                  << tail_of(dir + "/driver.log", 30);
  }
  return got;
}

TEST(IpiCp2k, LabelsEqualItsOwnRun)
{
  const std::string name = socket_name("cp2k");
  const std::string dir = "/tmp/" + name;
  const std::string data = dir + "/si8.data";
  Lammps l;
  l.cmds({"units metal", "lattice diamond 5.431", "region box block 0 1 0 1 0 1",
          "create_box 1 box", "create_atoms 1 box", "mass 1 28.0855",
          "displace_atoms all random 0.1 0.1 0.1 8813 units box", "pair_style torch",
          "pair_coeff * * " + student + " Si"});
  if (me == 0) ::mkdir(dir.c_str(), 0755);
  l.cmds({"write_data " + data});
  const std::string tool = env_or("ML_TORCH_PYTHON_EXE", "python3") + " " ML_TORCH_SOURCE_DIR
                           "/tools/cp2k_input.py " + data +
      " --elements Si --basis SZV-MOLOPT-SR-GTH --cutoff 120 --rel-cutoff 30 --eps-scf 1e-8";
  if (me == 0) {
    ASSERT_EQ(std::system((tool + " --driver " + name + " -o " + dir + "/driver.inp").c_str()), 0);
    ASSERT_EQ(std::system((tool + " -o " + dir + "/own.inp").c_str()), 0);
    // the two run at once in one folder: one CP2K project each (one shared
    // project rotates the same RESTART.wfn backups, and one run aborts)
    EXPECT_NE(tail_of(dir + "/driver.inp", 1000).find("PROJECT driver\n"), std::string::npos);
    EXPECT_NE(tail_of(dir + "/own.inp", 1000).find("PROJECT own\n"), std::string::npos);
  }
  // the driver waits for the server's socket; its own run goes at the same time
  const Labels got = label_with(l, name, dir, "CP2K",
                                "cp2k.psmp -i driver.inp -o driver.out",
                                "cp2k.psmp -i own.inp -o own.out");
  if (::testing::Test::HasFailure()) return;
  double e_own = NAN;
  std::vector<double> f_own, s_own(9, 0.0);
  if (me == 0) e_own = cp2k_energy_and_forces(dir + "/own.out", f_own, s_own);
  s_own.resize(9, 0.0);
  MPI_Bcast(s_own.data(), 9, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  MPI_Bcast(&e_own, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  int nf = static_cast<int>(f_own.size());
  MPI_Bcast(&nf, 1, MPI_INT, 0, MPI_COMM_WORLD);
  f_own.resize(nf);
  MPI_Bcast(f_own.data(), nf, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  ASSERT_EQ(nf, 24) << "CP2K's own run printed no forces (see " << dir << "/own.out)";
  const double hartree = 27.211386245988, bohr = 0.529177210903;
  const double e = e_own * hartree;
  for (double &v : f_own) v *= hartree / bohr;
  const double de = std::fabs(got.e - e), df = max_diff(got.f, f_own);
  if (me == 0)
    std::printf("[ ipi cp2k ] 8 Si atoms, PBE/SZV/120 Ry: labels vs CP2K's own run: energy %.3e eV "
                "(%.2e relative), forces %.3e eV/A (largest force %.3f eV/A)\n",
                de, de / std::fabs(e), df, max_abs(f_own));
  EXPECT_LE(de, 1e-5);
  EXPECT_LE(df, 1e-4);
  EXPECT_GT(max_abs(f_own), 0.1);    // a displaced crystal: forces to compare
  // the virial the driver returned against CP2K's own stress: W = sigma V
  // (CP2K prints compression as positive stress), GPa * A^3 -> eV
  const double volume = std::pow(5.431, 3), gpa_a3_ev = 1.0 / 160.21766208;
  const int ij[6][2] = {{0, 0}, {1, 1}, {2, 2}, {0, 1}, {0, 2}, {1, 2}};
  std::vector<double> w_got(got.w, got.w + 6), w_own(6);
  for (int k = 0; k < 6; ++k) w_own[k] = s_own[3 * ij[k][0] + ij[k][1]] * volume * gpa_a3_ev;
  const double dw = max_diff(w_got, w_own);
  if (me == 0)
    std::printf("[ ipi cp2k ] virial vs CP2K's own stress x volume: %.3e eV (%.2e of the largest "
                "component, %.3f eV)\n",
                dw, dw / max_abs(w_own), max_abs(w_own));
  EXPECT_GT(max_abs(w_own), 1.0);
  EXPECT_LE(dw, 1e-6 * max_abs(w_own));
  if (me == 0) std::system(("rm -rf " + dir).c_str());
}

/* ----------------------------------------------------------------------
   Quantum ESPRESSO (Debian's pw.x) as the client: it asks NEEDINIT before
   every configuration and reads exactly one byte of INIT's string. The
   labels of an 8-atom Si cell equal pw.x's own scf run of the same input
   (tools/qe_input.py; PBE, Debian's Si.pbe-rrkj.UPF, 20 Ry, 2x2x2 k-points,
   Marzari-Vanderbilt smearing): energy, forces and stress times volume.
   Not bitwise: pw.x prints 8 decimals (Ry, Ry/Bohr, Ry/Bohr^3), its own run
   converts the Angstrom input with its Bohr (CODATA 2006: 4.4e-9 from the
   server's), and the SCF stops at conv_thr.
------------------------------------------------------------------------- */

// pw.x's energy (Ry), forces (Ry/Bohr) and stress (Ry/Bohr^3, 3x3) from its output
static double qe_results(const std::string &out, std::vector<double> &f, std::vector<double> &stress)
{
  std::ifstream in(out);
  std::string line;
  double e = NAN;
  int stress_rows = -1;
  while (std::getline(in, line)) {
    if (line.rfind("!    total energy", 0) == 0) e = std::stod(line.substr(line.find('=') + 1));
    if (line.find("Forces acting on atoms") != std::string::npos) f.clear();
    if (line.find(" force =") != std::string::npos && line.find("atom") != std::string::npos) {
      std::istringstream w(line.substr(line.find('=') + 1));
      double fx, fy, fz;
      if (w >> fx >> fy >> fz) f.insert(f.end(), {fx, fy, fz});
    }
    if (line.find("total   stress") != std::string::npos) {
      stress.clear();
      stress_rows = 0;
      continue;
    }
    if (stress_rows >= 0 && stress_rows < 3) {
      std::istringstream w(line);
      double a, b, c;
      if (w >> a >> b >> c) stress.insert(stress.end(), {a, b, c});
      ++stress_rows;
    }
  }
  return e;
}

static std::vector<std::string> si8_with_student()
{
  return {"units metal", "lattice diamond 5.431", "region box block 0 1 0 1 0 1", "create_box 1 box",
          "create_atoms 1 box", "mass 1 28.0855",
          "displace_atoms all random 0.1 0.1 0.1 8813 units box", "pair_style torch",
          "pair_coeff * * " + student + " Si"};
}

TEST(IpiQe, LabelsEqualItsOwnRun)
{
  if (std::system("command -v pw.x > /dev/null 2>&1") != 0) GTEST_SKIP() << "no pw.x";
  const std::string name = socket_name("qe"), dir = "/tmp/" + name;
  Lammps l;
  l.cmds(si8_with_student());
  if (me == 0) ::mkdir(dir.c_str(), 0755);
  l.cmds({"write_data " + dir + "/si8.data"});
  const std::string tool = env_or("ML_TORCH_PYTHON_EXE", "python3") + " " ML_TORCH_SOURCE_DIR
                           "/tools/qe_input.py " + dir + "/si8.data --elements Si";
  if (me == 0) {
    // one scratch folder each: the two run at once in one folder
    ASSERT_EQ(std::system((tool + " --outdir ./driver-out -o " + dir + "/driver.in").c_str()), 0);
    ASSERT_EQ(std::system((tool + " --outdir ./own-out -o " + dir + "/own.in").c_str()), 0);
  }
  // pw.x connects once: it starts when the server's socket exists
  const Labels got =
      label_with(l, name, dir, "pw.x", "pw.x --ipi " + name + ":UNIX -in driver.in > driver.out",
                 "pw.x -in own.in > own.out");
  if (::testing::Test::HasFailure()) return;
  double e_own = NAN;
  std::vector<double> f_own, s_own;
  if (me == 0) e_own = qe_results(dir + "/own.out", f_own, s_own);
  MPI_Bcast(&e_own, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  int nf = static_cast<int>(f_own.size());
  MPI_Bcast(&nf, 1, MPI_INT, 0, MPI_COMM_WORLD);
  f_own.resize(nf);
  s_own.resize(9, 0.0);
  MPI_Bcast(f_own.data(), nf, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  MPI_Bcast(s_own.data(), 9, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  ASSERT_EQ(nf, 24) << "pw.x's own run printed no forces (see " << dir << "/own.out)";
  const double hartree = 27.211386245988, bohr = 0.529177210903, ry = hartree / 2;
  const double e = e_own * ry;
  for (double &v : f_own) v *= ry / bohr;
  // W = sigma V: pw.x prints compression as positive stress (Ry/Bohr^3)
  const double volume = std::pow(5.431 / bohr, 3);
  const int ij[6][2] = {{0, 0}, {1, 1}, {2, 2}, {0, 1}, {0, 2}, {1, 2}};
  std::vector<double> w_got(got.w, got.w + 6), w_own(6);
  for (int k = 0; k < 6; ++k) w_own[k] = s_own[3 * ij[k][0] + ij[k][1]] * volume * ry;
  const double de = std::fabs(got.e - e), df = max_diff(got.f, f_own), dw = max_diff(w_got, w_own);
  if (me == 0)
    std::printf("[ ipi qe ] 8 Si atoms, PBE/20 Ry/2x2x2: labels vs pw.x's own run: energy %.3e eV "
                "(%.2e relative), forces %.3e eV/A (largest %.3f), virial %.3e eV (largest %.3f)\n",
                de, de / std::fabs(e), df, max_abs(f_own), dw, max_abs(w_own));
  EXPECT_LE(de, 1e-5);
  EXPECT_LE(df, 1e-5);
  EXPECT_LE(dw, 2e-3);    // 8 printed decimals of Ry/Bohr^3 times 1080 Bohr^3: 1.5e-4 eV
  EXPECT_GT(max_abs(f_own), 0.1);
  EXPECT_GT(max_abs(w_own), 1.0);
  if (me == 0) std::system(("rm -rf " + dir).c_str());
}

/* ----------------------------------------------------------------------
   i-PI's own Python driver (PyPI ipi, i-pi-py_driver -m harmonic) as the
   client: it answers NEEDINIT until it gets INIT, so the handshake's
   INIT path runs. Its labels are the harmonic potential of the positions
   sent (Bohr, relative to the box's lower corner): E = k/2 sum x^2,
   F = -k x, no virial; equal to 1e-13 relative
------------------------------------------------------------------------- */

TEST(IpiDriver, HarmonicLabelsAreItsOwn)
{
  const std::string py = env_or("ML_TORCH_PYTHON_EXE", "python3");
  const std::string driver = py.substr(0, py.rfind('/') + 1) + "i-pi-py_driver";
  if (!file_exists(driver)) GTEST_SKIP() << "no " << driver;
  const std::string name = socket_name("pydrv");
  const double k = 0.05;
  Lammps l;
  l.cmds(si8_with_student());
  Labels got;
  {
    Client client({"/bin/sh", "-c", "while [ ! -S /tmp/ipi_" + name + " ]; do sleep 0.05; done; exec " +
                   py + " " + driver + " -u -a " + name + " -m harmonic -o " + std::to_string(k)});
    l.cmds({"fix ft all torch/finetune 1 teacher ipi \"" + name +
                " 0 unix\" energy_shift none log 0 check 0 teacher_timeout 60",
            "run 1 post no"});
    got = labels_of(l, MPI_COMM_WORLD);
    l.cmd("unfix ft");
  }
  const auto x = l.gather("x", 3);
  const double hartree = 27.211386245988, bohr = 0.529177210903;
  std::vector<double> f(x.size());
  double e = 0.0;
  for (std::size_t j = 0; j < x.size(); ++j) {
    const double xb = x[j] / bohr;    // the box's lower corner is 0
    e += 0.5 * k * xb * xb * hartree;
    f[j] = -k * xb * hartree / bohr;
  }
  if (me == 0)
    std::printf("[ ipi i-pi-py_driver ] harmonic k=%g: energy %.3e relative, forces %.3e relative\n",
                k, std::fabs(got.e - e) / e, rel(got.f, f));
  EXPECT_LE(std::fabs(got.e - e), 1e-13 * e);
  EXPECT_LE(rel(got.f, f), 1e-13);
  EXPECT_EQ(max_abs(std::vector<double>(got.w, got.w + 6)), 0.0);
}
