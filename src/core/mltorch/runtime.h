/* -*- c++ -*- ----------------------------------------------------------
   ML-TORCH: TorchScript machine-learned potentials for LAMMPS.
   This file is part of the LAMMPS-independent core: it knows nothing of
   LAMMPS and exposes no LibTorch type.
   The process around the models: files (atomic writes, hashes,
   provenance), LibTorch's threads and devices, the memory allocators.
------------------------------------------------------------------------- */

#ifndef MLTORCH_CORE_RUNTIME_H
#define MLTORCH_CORE_RUNTIME_H

#include <cstddef>
#include <cstdint>
#include <string>

namespace MLTorch {
// Write a file atomically: a temporary file in the same folder, flushed to
// disk, then renamed over `path`. A crash leaves the old file intact.
void write_file_atomic(const std::string &path, const std::string &bytes);

// The second half of it, for files written by others (LAMMPS's restart
// writer): flush the written `tmp` to disk, rename it over `path` and sync
// the folder. On failure `tmp` is removed, `path` is untouched, and the
// ModelError says why.
void commit_file(const std::string &tmp, const std::string &path);

// Read a whole file into a string; throws ModelError with the reason.
std::string read_file(const std::string &path);

// 64-bit FNV-1a of a byte string, as 16 hex digits (identifies a model file).
std::string content_hash(const std::string &bytes);

// the provenance a saved model carries (Model::file_bytes): its parent file
// and hash, the updates and step, the teacher, as a JSON object
std::string provenance_json(const std::string &parent, const std::string &parent_hash,
                            int64_t updates, int64_t step, const std::string &teacher);

// LibTorch helpers that need no torch types in the caller.
void set_num_threads(int n);
int get_num_threads();
// CUDA devices LibTorch sees (0 without CUDA)
int cuda_device_count();
// the GPU of an MPI rank for 'device cuda': the ranks of one node share its
// GPUs in turn, counted over the whole job (every replica of a -partition
// run), so replicas do not pile onto the first GPUs: "cuda:(node_local_rank
// mod ngpu)"; "cuda" when no GPU is visible (the model load reports it)
std::string cuda_device_for_rank(int node_local_rank, int ngpu);
// LibTorch's inter-op pool: one thread (models run one after the other;
// MPI ranks and intra-op threads fill the cores). Only the first call of a
// process has an effect, as LibTorch allows.
void set_single_interop_thread();
// Keep large freed blocks in the C library's heap instead of returning them
// to the kernel (glibc: mmap and trim thresholds 1 GiB). A model allocates its tensors
// afresh every step, tens of MB each for large graphs; above glibc's
// threshold (32 MB at most by default) each is mmapped, freed with munmap
// and faulted in again on the next step (30% of a 32k-atom Lennard-Jones
// step here). Once per process; a MALLOC_MMAP_THRESHOLD_ set by the user
// wins. Returns the threshold in effect (0: unknown or not glibc).
long keep_large_allocations();
// LibTorch's CPU tensors of 4 KiB or more from a cache of blocks (size
// classes of 16 per octave, made with 1/8 headroom) that reuses freed blocks
// for any tensor that fits, instead of returning them to malloc: the model's
// temporaries, whose sizes change with the graph at every step, then stop
// fragmenting the heap, and the resident size of a long run stays flat (MKL's
// own buffer cache is turned off for the same reason). Once per process;
// MLTORCH_TENSOR_CACHE=0 in the environment keeps LibTorch's own allocator
// and MKL's. Returns whether the cache is in place.
bool cache_tensor_blocks();
// the size class of a tensor of `bytes` bytes in that cache
std::size_t tensor_block_class(std::size_t bytes);
// the cache's clock, once per force call: a free block that no tensor took
// for 64 to 128 calls goes back to malloc (a growing system's outgrown blocks)
void tensor_blocks_step();
// bytes in the cache's blocks (4 KiB and more): in tensors, free, and the
// most ever in tensors at once; all zero when the cache is off
struct TensorBlockStats {
  std::size_t live_bytes = 0, free_bytes = 0, peak_live_bytes = 0;
};
TensorBlockStats tensor_block_stats();
std::string libtorch_version();

}    // namespace MLTorch

#endif
