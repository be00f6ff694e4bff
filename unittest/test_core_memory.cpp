/* ----------------------------------------------------------------------
   ML-TORCH core tests (no LAMMPS): memory. The tensor block cache (run in
   processes of their own: ctest TensorBlockCache, TensorBlockCacheOff)
   and glibc's settings for large blocks (ctest MallocSettingsKept too).
------------------------------------------------------------------------- */

#include "mltorch/halo.h"
#include "mltorch/layered.h"
#include "mltorch/model.h"
#include "mltorch/runtime.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <malloc.h>

/* ----------------------------------------------------------------------
   the tensor block cache (cache_tensor_blocks): size classes of 1/16
   octave; a freed block serves the next tensor that fits it (up to twice
   its size), blocks alive at once are distinct, small tensors and larger
   ones get blocks of their own, and the values are those written. Run in
   a process of its own (ctest TensorBlockCache): the cache starts empty
------------------------------------------------------------------------- */

TEST(TensorBlockCache, ReusesFreedBlocks)
{
  using MLTorch::tensor_block_class;
  EXPECT_EQ(tensor_block_class(100), 100u);          // below 4 KiB: not cached
  EXPECT_EQ(tensor_block_class(4096), 4096u);
  EXPECT_EQ(tensor_block_class(4097), 4096u + 256u); // steps of 1/16 of the octave
  EXPECT_EQ(tensor_block_class(100000), 102400u);    // 65536 <= n < 131072: steps of 4096
  for (std::size_t n = 4096; n < 10000000; n = n * 9 / 8 + 1) {
    const std::size_t c = tensor_block_class(n);
    EXPECT_GE(c, n);
    EXPECT_LE(c, n + n / 16 + 1);
  }

  ASSERT_TRUE(MLTorch::cache_tensor_blocks());
  // MKL's own buffer cache is off with it (unless the environment said otherwise)
  ASSERT_NE(std::getenv("MKL_DISABLE_FAST_MM"), nullptr);
  auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
  void *first = nullptr;
  {
    auto a = torch::full({10000}, 1.5, f64);    // 80,000 bytes
    first = a.data_ptr();
  }
  {
    // 79,200 bytes, the same class: the freed block again
    auto b = torch::full({9900}, 2.5, f64);
    EXPECT_EQ(b.data_ptr(), first);
    // alive at the same time: a block of its own
    auto c = torch::full({9900}, 3.5, f64);
    EXPECT_NE(c.data_ptr(), first);
    EXPECT_EQ(b.sum().item<double>(), 2.5 * 9900);
    EXPECT_EQ(c.sum().item<double>(), 3.5 * 9900);
  }
  {
    // a tensor of a fifth of the size: the smallest free block that fits,
    // up to twice its size, so neither 80 KB block
    auto d = torch::full({2000}, 1.0, f64);
    EXPECT_NE(d.data_ptr(), first);
    // a larger tensor than any free block: a new one
    auto e = torch::full({50000}, 1.0, f64);
    EXPECT_NE(e.data_ptr(), first);
    // 10% larger than the first: the first block had 1/8 headroom
    auto g = torch::full({11000}, 4.0, f64);
    EXPECT_EQ(g.data_ptr(), first);
    EXPECT_EQ(g.sum().item<double>(), 4.0 * 11000);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(g.data_ptr()) % 64, 0u);    // c10's alignment
  }
}

// a system that grows slowly (fix deposit) asks for tensors that outgrow
// the 1/8 headroom of the old blocks every ~120 steps here (0.1% per step,
// 3000 steps, 20x); the outgrown blocks go back to malloc after 64-128 idle
// steps, so what the cache holds follows the last steps' working set
// (at most 2.6 working sets measured) instead of every generation of
// blocks (5.6 working sets without the sweep, and rising)
TEST(TensorBlockCache, GrowingSystemKeepsOnlyRecentBlocks)
{
  ASSERT_TRUE(MLTorch::cache_tensor_blocks());
  auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
  const auto before = MLTorch::tensor_block_stats();
  double n = 2000.0;
  std::size_t working_set = 0;    // the block bytes of the last step's tensors
  double most_held = 0.0;         // the most held after a step, in working sets
  for (int step = 0; step < 3000; ++step, n *= 1.001) {
    const auto m = static_cast<int64_t>(n);
    {
      // a step's temporaries: nodes, edges, features, alive at once
      auto a = torch::ones({m}, f64), b = torch::ones({3 * m}, f64), c = torch::ones({12 * m}, f64);
      EXPECT_EQ((a.sum() + b.sum() + c.sum()).item<double>(), 16.0 * m);
      working_set = MLTorch::tensor_block_stats().live_bytes - before.live_bytes;
    }
    MLTorch::tensor_blocks_step();
    const auto now = MLTorch::tensor_block_stats();
    if (step >= 500)
      most_held = std::max(most_held, static_cast<double>(now.free_bytes + now.live_bytes) / working_set);
  }
  const auto after = MLTorch::tensor_block_stats();
  std::printf("[ blocks   ] 20x growth in 3000 steps: the cache holds at most %.2f working sets "
              "(last: %zu bytes free, %zu in tensors, working set %zu)\n",
              most_held, after.free_bytes, after.live_bytes, working_set);
  EXPECT_EQ(after.live_bytes, before.live_bytes);
  EXPECT_GE(most_held, 1.0);
  EXPECT_LE(most_held, 3.0);
}

// torch/kk's host-space exchange writes the rows of its atoms only; the
// padding rows after them (pair_style torch/kk pad) must come out as zeros
// even where the buffer's block last held NaNs (a NaN feature on the dummy
// atom times its zero cutoff weight is a NaN). Here the block cache hands
// the exchange the very block a NaN tensor just freed
TEST(TensorBlockCache, ExchangePaddingRowsAreZero)
{
  ASSERT_TRUE(MLTorch::cache_tensor_blocks());
  struct RowsOfAtomsOnly : MLTorch::HaloExchange {
    int64_t n_atoms;
    explicit RowsOfAtomsOnly(int64_t n) : n_atoms(n) {}
    void forward(const double *owned, double *all, int width) override
    {
      for (int64_t i = 0; i < n_atoms * width; ++i) all[i] = owned[i % (2 * width)];
    }
    void reverse(const double *, double *, int) override {}
  } halo(900);
  auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
  const int64_t rows = 1000, width = 16;    // 128,000 bytes: cached
  void *poisoned = nullptr;
  {
    auto nan = torch::full({rows, width}, std::nan(""), f64);
    poisoned = nan.data_ptr();
  }
  auto owned = torch::ones({2, width}, f64);
  auto all = MLTorch::halo_exchange_rows(owned, &halo, rows, true, true);
  EXPECT_EQ(all.data_ptr(), poisoned) << "the test's premise: the freed block is reused";
  EXPECT_EQ(all.slice(0, 0, 900).sum().item<double>(), 900.0 * width);
  EXPECT_EQ(torch::isnan(all).sum().item<int64_t>(), 0);
  EXPECT_EQ(all.slice(0, 900).abs().sum().item<double>(), 0.0);
}

// large blocks stay in the heap: the mmap threshold is raised to 1 GiB
// (doc/pair_torch.rst, "Timing and memory"), so a 1 MiB block is not an
// mmap of its own; a MALLOC_MMAP_THRESHOLD_ the user set wins (ctest
// MallocSettingsKept sets 65536, and there the 1 MiB block is mmapped)
TEST(MallocSettings, LargeBlocksStayInTheHeapUnlessTheUserSaysOtherwise)
{
  const char *user = std::getenv("MALLOC_MMAP_THRESHOLD_");
  const long threshold = MLTorch::keep_large_allocations();
  const std::size_t before = mallinfo2().hblkhd;
  static void *volatile block;    // kept from the optimiser (a malloc-free pair may go)
  block = std::malloc(1 << 20);
  static_cast<volatile char *>(block)[0] = 1;
  const std::size_t mapped = mallinfo2().hblkhd - before;
  std::free(block);
  if (user) {
    EXPECT_EQ(threshold, 0) << "the user's MALLOC_MMAP_THRESHOLD_=" << user << " is kept";
    EXPECT_GE(mapped, std::size_t(1) << 20);
  } else {
    EXPECT_EQ(threshold, 1L << 30);
    EXPECT_EQ(mapped, 0u);
  }
}

// MLTORCH_TENSOR_CACHE=0 (doc/pair_torch.rst) keeps LibTorch's allocator and
// MKL's buffer cache; ctest TensorBlockCacheOff runs this with it set
TEST(TensorBlockCacheOff, LibTorchAllocatorKept)
{
  const char *env = std::getenv("MLTORCH_TENSOR_CACHE");
  if (!env || std::string(env) != "0") GTEST_SKIP() << "run with MLTORCH_TENSOR_CACHE=0";
  EXPECT_FALSE(MLTorch::cache_tensor_blocks());
  EXPECT_EQ(std::getenv("MKL_DISABLE_FAST_MM"), nullptr);
  auto t = torch::full({10000}, 1.5, torch::TensorOptions().dtype(torch::kFloat64));
  EXPECT_EQ(t.sum().item<double>(), 1.5 * 10000);
}
