/* ----------------------------------------------------------------------
   ML-TORCH: TorchScript machine-learned potentials for LAMMPS.
   LAMMPS-independent core: the torch runtime (threads, allocations, devices)
   and model files (read, written atomically).
------------------------------------------------------------------------- */

#include "mltorch/model.h"

#include <torch/cuda.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fcntl.h>
#include <unistd.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace MLTorch {

std::string read_file(const std::string &path)
{
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ModelError("Cannot open model file " + path + ": " + std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw ModelError("Error reading model file " + path);
  return ss.str();
}

void set_num_threads(int n)
{
  // process-wide in LibTorch: several models (a torch teacher and student)
  // each set theirs before they run, and setting the same count is a no-op
  if (n > 0 && at::get_num_threads() != n) at::set_num_threads(n);
}

void set_single_interop_thread()
{
  static bool done = false;
  if (done) return;
  done = true;
  try {
    at::set_num_interop_threads(1);
  } catch (std::exception &) {
    // already set (or used) by the embedding program: keep its choice
  }
}

long keep_large_allocations()
{
#if defined(__GLIBC__)
  static long threshold = -1;
  if (threshold < 0) {
    threshold = 0;
    if (!std::getenv("MALLOC_MMAP_THRESHOLD_")) {
      const int one_gib = 1 << 30;
      if (mallopt(M_MMAP_THRESHOLD, one_gib) == 1) threshold = one_gib;
      // and do not hand the freed top of the heap back either (the next step
      // would fault it in again)
      if (threshold > 0 && !std::getenv("MALLOC_TRIM_THRESHOLD_")) mallopt(M_TRIM_THRESHOLD, one_gib);
    }
  }
  return threshold;
#else
  return 0;
#endif
}

int get_num_threads()
{
  return at::get_num_threads();
}

int cuda_device_count()
{
  return torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
}

std::string libtorch_version()
{
  return std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
      std::to_string(TORCH_VERSION_PATCH);
}


void write_file_atomic(const std::string &path, const std::string &bytes)
{
  const std::string tmp = path + ".tmp." + std::to_string(static_cast<long>(::getpid()));
  FILE *fp = std::fopen(tmp.c_str(), "wb");
  if (!fp) throw ModelError("Cannot write " + tmp + ": " + std::strerror(errno));
  bool ok = std::fwrite(bytes.data(), 1, bytes.size(), fp) == bytes.size();
  ok = (std::fclose(fp) == 0) && ok;
  if (!ok) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    throw ModelError("Cannot write " + tmp + ": " + why);
  }
  commit_file(tmp, path);
}

void commit_file(const std::string &tmp, const std::string &path)
{
  // a write-back error of the closed file is reported to this new
  // descriptor's fsync (Linux keeps it per file, not per descriptor)
  const int fd = ::open(tmp.c_str(), O_RDONLY);
  if (fd < 0 || ::fsync(fd) != 0) {
    const std::string why = std::strerror(errno);
    if (fd >= 0) ::close(fd);
    std::remove(tmp.c_str());
    throw ModelError("Cannot write " + tmp + ": " + why);
  }
  ::close(fd);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    throw ModelError("Cannot rename " + tmp + " to " + path + ": " + why);
  }
  // the rename itself survives a crash of the machine once the folder is synced
  const auto slash = path.rfind('/');
  const std::string dir = (slash == std::string::npos) ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}    // namespace MLTorch
