/* ----------------------------------------------------------------------
   libFuzzer target: the keyword parsers of pair_style torch (settings and
   pair_coeff, committees included), fix torch/finetune and compute
   torch/deviation, through one LAMMPS instance with a small Si crystal.
   The input is split into lines; each line becomes the arguments of one of
   five commands (its first byte chooses which); '@' in a line stands for
   the potentials folder. With ML_TORCH_FUZZ_PLUGIN set (tools/fuzz.sh sets
   it), the styles come from that plugin, built with coverage, so the
   search is guided by the coverage of these parsers.
   Every command must either work or stop with a LAMMPS ERROR (an
   exception); a crash or a sanitizer report is a finding.
   Built and run by tools/fuzz.sh.
------------------------------------------------------------------------- */

#include "input.h"
#include "lammps.h"

#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

static LAMMPS_NS::LAMMPS *lmp = nullptr;
static std::string potentials;

static void command(const std::string &line)
{
  try {
    lmp->input->one(line);
  } catch (std::exception &) {
    // an ERROR: the expected outcome of bad input
  }
}

extern "C" int LLVMFuzzerInitialize(int *argc, char ***argv)
{
  MPI_Init(argc, argv);
  const char *p = std::getenv("ML_TORCH_POTENTIALS");
  potentials = p ? p : "potentials";
  const char *args[] = {"lmp", "-log", "none", "-echo", "none", "-screen", "none", "-nocite"};
  lmp = new LAMMPS_NS::LAMMPS(8, const_cast<char **>(args), MPI_COMM_WORLD);
  if (const char *plugin = std::getenv("ML_TORCH_FUZZ_PLUGIN")) {
    try {
      lmp->input->one(std::string("plugin load ") + plugin);
    } catch (std::exception &e) {
      std::fprintf(stderr, "cannot load %s: %s\n", plugin, e.what());
      std::abort();
    }
  }
  for (const char *l : {"units metal", "atom_modify map array", "lattice diamond 5.431",
                        "region box block 0 1 0 1 0 1", "create_box 1 box", "create_atoms 1 box",
                        "mass 1 28.0855"})
    command(l);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  std::string text(reinterpret_cast<const char *>(data), size);
  std::size_t start = 0;
  int ncommands = 0;
  while (start < text.size() && ncommands < 8) {
    std::size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(start, end - start);
    start = end + 1;
    if (line.empty()) continue;
    const char kind = line[0];
    line = line.substr(1);
    // LAMMPS input syntax is not the target: no variables, commands or comments
    for (char &c : line)
      if (c == '$' || c == '#' || c == '&' || c == '\0' || c == '\r') c = ' ';
    for (std::size_t at = line.find('@'); at != std::string::npos; at = line.find('@', at + potentials.size() + 1))
      line.replace(at, 1, potentials + "/");
    ++ncommands;
    switch (kind % 5) {
      case 0:
        command("pair_style torch " + line);
        break;
      case 1:
        command("pair_coeff * * " + potentials + "/si_local.pt " + line);
        break;
      case 2:
        command("fix ft all torch/finetune " + line);
        break;
      case 3:
        command("compute dev all torch/deviation " + line);
        command("uncompute dev");
        break;
      default:
        command("pair_coeff * * " + line);
    }
  }
  command("unfix ft");
  command("pair_style none");
  return 0;
}
