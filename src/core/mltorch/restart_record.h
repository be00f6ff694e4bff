/* -*- c++ -*- ----------------------------------------------------------
   ML-TORCH: machine-learned potentials for LAMMPS.
   Part of the LAMMPS-independent core: the training state that fix
   torch/finetune keeps in LAMMPS restart files, packed and read back with
   every length checked against the record's size.

   LAMMPS hands a fix's restart() the record without its size, so version 3
   to 5 records (4 adds the energy reference, 5 the label file's length) carry their own frame: the payload's size twice (as n and ~n, so
   that a damaged size is seen before it is used) and a checksum of the
   payload. Versions 1 and 2 (written by earlier ML-TORCH versions) have no
   frame; they are read with every length checked against a bound instead.
------------------------------------------------------------------------- */

#ifndef MLTORCH_CORE_RESTART_RECORD_H
#define MLTORCH_CORE_RESTART_RECORD_H

#include "mltorch/finetune.h"    // FinetuneCounters

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace MLTorch {

// a record that cannot be read: its text says what is wrong with it
class RecordError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// the counters (FinetuneCounters), and what else the fix keeps
struct TrainingRecord : FinetuneCounters {
  static constexpr int VERSION = 5;
  int version = VERSION;    // of the record read (1 to 5)
  std::string model_hash;                   // the trained model file's hash
  std::vector<std::string> member_hashes;   // every member's (version 1: the model's)
  // (the uncertainty-gated labelling counters are in versions >= 2)
  double loss_ema = 0.0;
  std::vector<double> stats;    // the fix's output vector, a fixed length
  std::string parameters, optimizer, good_parameters, good_optimizer;
  // the fitted energy reference of every member (EnergyShift::pack, one
  // length-prefixed block per member; version 4, empty before)
  std::string energy_shift;
  // the replica's label file (labels FILE) when the record was written: its
  // whole frames and their bytes (version 5; -1: none, or before)
  int64_t labels_frames = -1, labels_bytes = -1;
  // the dataset sampler's epoch and next index in its shard (version 5;
  // -1: no dataset, or before)
  int64_t dataset_epoch = -1, dataset_next = -1;
};

// the current version's record of `r` (its version field is ignored)
std::string pack_record(const TrainingRecord &r);

// the size of the record at `buf` that LAMMPS gave the fix: from its frame
// (version 3), or `bound` for the unframed versions 1 and 2. Reads the first
// 20 bytes, which every record has. RecordError when the frame is damaged
// or larger than `bound`.
std::size_t record_size(const char *buf, std::size_t bound);

// the record in buf[0, size), whose stats vector has `nstats` entries;
// RecordError when any length, the version, the frame or the checksum is wrong
TrainingRecord unpack_record(const char *buf, std::size_t size, int nstats);

// why a record read back does not belong to the models loaded now (the
// model file `path` with file hash `hash`, a committee with `hashes`), or
// empty when it does
std::string record_mismatch(const TrainingRecord &r, const std::string &path,
                            const std::string &hash, const std::vector<std::string> &hashes);

}    // namespace MLTorch

#endif
