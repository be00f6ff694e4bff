/* ----------------------------------------------------------------------
   libFuzzer target: the reader of fix torch/finetune's restart record
   (MLTorch::record_size and MLTorch::unpack_record). Any input must either
   read as a record or throw RecordError with a message; nothing else (a
   crash, a read outside the input, another exception) is allowed. A record
   that reads must pack back to a record that reads to the same fields.
   Built and run by tools/fuzz.sh.
------------------------------------------------------------------------- */

#include "mltorch/restart_record.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

namespace {
constexpr int NSTATS = 11;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  // a copy of exactly `size` bytes, so that AddressSanitizer sees any read past it
  std::unique_ptr<char[]> buf(new char[size]);
  std::memcpy(buf.get(), data, size);
  try {
    // as fix torch/finetune's restart() does, with the input's size as the bound
    const std::size_t n = MLTorch::record_size(buf.get(), size);
    if (n > size) std::abort();    // a frame larger than its input was accepted
    const MLTorch::TrainingRecord r = MLTorch::unpack_record(buf.get(), n, NSTATS);
    if (r.stats.size() != NSTATS || r.member_hashes.empty()) std::abort();
    const std::string again = MLTorch::pack_record(r);
    const MLTorch::TrainingRecord s = MLTorch::unpack_record(again.data(), again.size(), NSTATS);
    if (s.parameters != r.parameters || s.good_optimizer != r.good_optimizer ||
        s.member_hashes != r.member_hashes || s.nconfigs != r.nconfigs)
      std::abort();
  } catch (MLTorch::RecordError &e) {
    if (std::strlen(e.what()) == 0) std::abort();
  }
  return 0;
}
