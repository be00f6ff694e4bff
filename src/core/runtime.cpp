/* ----------------------------------------------------------------------
   ML-TORCH: TorchScript machine-learned potentials for LAMMPS.
   LAMMPS-independent core: the torch runtime (threads, allocations, devices)
   and model files (read, written atomically).
------------------------------------------------------------------------- */

#include "mltorch/runtime.h"

#include "mltorch/contract.h"

#include <torch/cuda.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <sstream>
#include <vector>

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

namespace {
  // LibTorch's CPU tensors from a cache of blocks in size classes. A model
  // allocates its temporaries afresh at every step, in sizes that follow the
  // edge and atom counts; through malloc these ever-changing sizes split and
  // merge the heap's free blocks so that, over a long run, a new largest
  // hole keeps being needed and the heap (and the resident size) creeps up
  // by a few KB per 1000 steps (bench/RESULTS.md, the soak). Here a freed
  // block of 4 KiB or more waits for the next tensor that fits it (up to
  // twice the block's size); blocks are made in size classes (16 per
  // octave) with 1/8 headroom, so after the first steps the model's tensors
  // reuse the same blocks and the heap stops moving. LibTorch has such a
  // cache only for CUDA and, on the CPU, in its mobile builds
  // (c10::CPUCachingAllocator), not in the LibTorch that desktops and
  // clusters use. The cache keeps the blocks that the run keeps reusing: a
  // free block that no tensor has taken for kIdleSteps steps (the clock is
  // tensor_blocks_step(), once per force call) goes back to malloc, so a
  // slowly growing system (fix deposit, a growing crystal), whose tensors
  // outgrow the headroom of the old blocks every few percent of growth,
  // does not keep every generation of blocks: the resident size follows the
  // working set of the last steps.
  class BlockCache final : public c10::Allocator {
   public:
    static constexpr std::size_t kHeader = 64;    // keeps c10's 64-byte alignment
    static constexpr std::size_t kSmallest = 4096;
    // a sweep every kIdleSteps steps returns the blocks that stayed free
    // since the sweep before: none is kept idle for more than 2 kIdleSteps
    static constexpr std::uint64_t kIdleSteps = 64;

    static std::size_t size_class(std::size_t n)
    {
      if (n < kSmallest) return n;
      std::size_t top = kSmallest;
      while (top <= n / 2) top *= 2;    // top <= n < 2 top
      const std::size_t step = top / 16;
      return (n + step - 1) / step * step;
    }

    c10::DataPtr allocate(std::size_t n) override
    {
      const std::size_t size = size_class(n);
      char *block = nullptr;
      if (size >= kSmallest) {
        std::lock_guard<std::mutex> lock(mutex_);
        // the smallest free block that fits, up to twice the size: a block
        // serves any smaller tensor, so new blocks are made only when more
        // memory is alive at once than ever before in the run
        auto it = free_.lower_bound(size);
        if (it != free_.end() && it->first <= 2 * size) {
          block = static_cast<char *>(it->second.back());
          it->second.pop_back();
          if (it->second.empty()) free_.erase(it);
          const std::size_t made = header(block).size;
          free_bytes_ -= made;
          live_bytes_ += made;
          peak_live_bytes_ = std::max(peak_live_bytes_, live_bytes_);
        }
      }
      if (!block) {
        // a new block 1/8 larger than asked: the counts' thermal ups and
        // downs then fit the blocks made in the first steps
        const std::size_t made = size < kSmallest ? size : size_class(n + n / 8);
        block = static_cast<char *>(c10::alloc_cpu(made + kHeader));
        header(block).size = made;
        if (made >= kSmallest) {
          std::lock_guard<std::mutex> lock(mutex_);
          live_bytes_ += made;
          peak_live_bytes_ = std::max(peak_live_bytes_, live_bytes_);
        }
      }
      // data and context are the same pointer, as LibTorch's raw_allocate needs
      void *data = block + kHeader;
      return {data, data, &release, c10::Device(c10::DeviceType::CPU)};
    }

    c10::DeleterFnPtr raw_deleter() const override { return &release; }

    void copy_data(void *dest, const void *src, std::size_t count) const override
    {
      default_copy_data(dest, src, count);
    }

    static BlockCache &instance()
    {
      // never destroyed: tensors may be freed during static destruction
      static BlockCache *cache = new BlockCache;
      return *cache;
    }

    // one step of the clock; every kIdleSteps steps, the free blocks whose
    // last release came before the previous sweep go back to malloc
    void step()
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (++steps_ % kIdleSteps) return;
      const std::uint64_t kept_since = sweeps_++;
      for (auto it = free_.begin(); it != free_.end();) {
        auto &blocks = it->second;
        std::size_t kept = 0;
        for (void *b : blocks) {
          if (header(b).sweep >= kept_since) {
            blocks[kept++] = b;
          } else {
            free_bytes_ -= header(b).size;
            c10::free_cpu(b);
          }
        }
        blocks.resize(kept);
        it = blocks.empty() ? free_.erase(it) : std::next(it);
      }
    }

    TensorBlockStats stats()
    {
      std::lock_guard<std::mutex> lock(mutex_);
      return {live_bytes_, free_bytes_, peak_live_bytes_};
    }

   private:
    struct Header {
      std::size_t size;       // bytes of the block after the header
      std::uint64_t sweep;    // the sweep count when it was last released
    };
    static Header &header(void *block) { return *static_cast<Header *>(block); }

    static void release(void *data)
    {
      if (!data) return;
      char *block = static_cast<char *>(data) - kHeader;
      const std::size_t size = header(block).size;
      if (size < kSmallest) {
        c10::free_cpu(block);
        return;
      }
      BlockCache &cache = instance();
      std::lock_guard<std::mutex> lock(cache.mutex_);
      header(block).sweep = cache.sweeps_;
      cache.free_[size].push_back(block);
      cache.live_bytes_ -= size;
      cache.free_bytes_ += size;
    }

    std::mutex mutex_;
    std::map<std::size_t, std::vector<void *>> free_;    // block size -> free blocks
    std::size_t live_bytes_ = 0, free_bytes_ = 0, peak_live_bytes_ = 0;
    std::uint64_t steps_ = 0, sweeps_ = 0;
  };
}    // namespace

bool cache_tensor_blocks()
{
  static int installed = -1;
  if (installed < 0) {
    // MLTORCH_TENSOR_CACHE=0 leaves LibTorch's own CPU allocator in place;
    // priority 1 over LibTorch's default 0, and an embedding program that
    // installed its own allocator with a higher priority keeps it
    const char *env = std::getenv("MLTORCH_TENSOR_CACHE");
    installed = (env && std::strcmp(env, "0") == 0) ? 0 : 1;
    if (installed) {
      // MKL's own memory manager keeps a GEMM work buffer (240 KB here)
      // from the first product of a new shape class on, at a random step
      // of a long run: with it off (MKL's documented switch, read when MKL
      // first allocates, before any model runs here) MKL takes its buffers
      // from malloc per call, from the same steady heap
      setenv("MKL_DISABLE_FAST_MM", "1", /*overwrite=*/0);
      c10::SetCPUAllocator(&BlockCache::instance(), /*priority=*/1);
      installed = (c10::GetCPUAllocator() == &BlockCache::instance()) ? 1 : 0;
    }
  }
  return installed == 1;
}

std::size_t tensor_block_class(std::size_t bytes)
{
  return BlockCache::size_class(bytes);
}

void tensor_blocks_step()
{
  if (cache_tensor_blocks()) BlockCache::instance().step();
}

TensorBlockStats tensor_block_stats()
{
  if (!cache_tensor_blocks()) return {};
  return BlockCache::instance().stats();
}

int get_num_threads()
{
  return at::get_num_threads();
}

int cuda_device_count()
{
  return torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
}

std::string cuda_device_for_rank(int node_local_rank, int ngpu)
{
  if (ngpu < 1 || node_local_rank < 0) return "cuda";
  return "cuda:" + std::to_string(node_local_rank % ngpu);
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
