/* ----------------------------------------------------------------------
   ML-TORCH: machine-learned potentials for LAMMPS.
   The training record of LAMMPS restart files (restart_record.h).

   Layout (native byte order, as LAMMPS restart files):
     version 4: int32 4, int64 n, int64 ~n, payload (n bytes), checksum of
                the payload (16 hex characters, FNV-1a 64 as model files)
     version 3: the same frame; the payload without the energy reference
     payload:   bytes model hash, int32 M, M x bytes member hash, int64
                ncalls nknown nabove nempty nupdates nskipped nrollbacks
                nconfigs, double loss_ema, int32 S, S x double stats, bytes
                parameters, optimizer, good parameters, good optimizer, and
                (version 4) bytes energy reference (EnergyShift states), (version 5)
                int64 label file frames, bytes, dataset epoch, position
     version 2: int32 2, then the payload without S (S fixed by the fix)
     version 1: int32 1, bytes model hash, the counters from nupdates on,
                loss_ema, stats, the four byte strings
   where "bytes" is an int64 length and that many bytes.
------------------------------------------------------------------------- */

#include "mltorch/restart_record.h"

#include "mltorch/runtime.h"    // content_hash

#include <algorithm>
#include <cstring>

namespace MLTorch {
namespace {

constexpr std::size_t FRAME = sizeof(int32_t) + 2 * sizeof(int64_t);
constexpr std::size_t CHECKSUM = 16;

void put_bytes(std::string &out, const std::string &bytes)
{
  const int64_t n = static_cast<int64_t>(bytes.size());
  out.append(reinterpret_cast<const char *>(&n), sizeof(n));
  out.append(bytes);
}
template <typename T> void put(std::string &out, const T &v)
{
  out.append(reinterpret_cast<const char *>(&v), sizeof(T));
}

// reads within [p, end) only; every read that would pass the end throws
class Reader {
 public:
  Reader(const char *begin, std::size_t size) : p(begin), end(begin + size) {}
  std::size_t left() const { return static_cast<std::size_t>(end - p); }
  template <typename T> T get(const char *what)
  {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, p, sizeof(T));
    p += sizeof(T);
    return v;
  }
  std::string bytes(const char *what)
  {
    const auto n = get<int64_t>(what);
    if (n < 0 || static_cast<uint64_t>(n) > left())
      throw RecordError(std::string("the restart record's ") + what + " claims " +
                        std::to_string(n) + " bytes where " + std::to_string(left()) +
                        " are left: the restart file is damaged or truncated");
    std::string s(p, p + n);
    p += n;
    return s;
  }
  // a count of items of at least `item` bytes each, that must fit what is left
  int count(const char *what, std::size_t item, int least)
  {
    const auto n = get<int32_t>(what);
    if (n < least || static_cast<std::size_t>(n) * item > left())
      throw RecordError(std::string("the restart record's ") + what + " is " +
                        std::to_string(n) + ", which the record's " + std::to_string(left()) +
                        " remaining bytes cannot hold: the restart file is damaged");
    return n;
  }

 private:
  void need(std::size_t n, const char *what) const
  {
    if (n > left())
      throw RecordError(std::string("the restart record ends inside its ") + what +
                        ": the restart file is damaged or truncated");
  }
  const char *p;
  const char *end;
};

void read_counters(Reader &in, TrainingRecord &r)
{
  r.nupdates = in.get<int64_t>("update count");
  r.nskipped = in.get<int64_t>("skip count");
  r.nrollbacks = in.get<int64_t>("rollback count");
  r.nconfigs = in.get<int64_t>("configuration count");
  r.loss_ema = in.get<double>("loss average");
}

void read_states(Reader &in, TrainingRecord &r)
{
  r.parameters = in.bytes("parameters");
  r.optimizer = in.bytes("optimizer state");
  r.good_parameters = in.bytes("rollback parameters");
  r.good_optimizer = in.bytes("rollback optimizer state");
}

// the version 2 body, which is the version 3 payload but for the stats count
void read_body(Reader &in, TrainingRecord &r, int nstats, bool counted)
{
  r.model_hash = in.bytes("model hash");
  r.member_hashes.resize(in.count("member count", sizeof(int64_t), 1));
  for (auto &h : r.member_hashes) h = in.bytes("member hash");
  r.ncalls = in.get<int64_t>("teacher call count");
  r.nknown = in.get<int64_t>("known count");
  r.nabove = in.get<int64_t>("above-threshold count");
  r.nempty = in.get<int64_t>("empty update count");
  read_counters(in, r);
  if (counted) {
    const int n = in.count("statistics count", sizeof(double), 0);
    if (n != nstats)
      throw RecordError("the restart record holds " + std::to_string(n) +
                        " statistics, this version of fix torch/finetune " +
                        std::to_string(nstats));
  }
  r.stats.resize(nstats);
  for (double &v : r.stats) v = in.get<double>("statistics");
  read_states(in, r);
}

}    // namespace

std::string pack_record(const TrainingRecord &r)
{
  std::string payload;
  put_bytes(payload, r.model_hash);
  put(payload, static_cast<int32_t>(r.member_hashes.size()));
  for (const auto &h : r.member_hashes) put_bytes(payload, h);
  for (int64_t v : {r.ncalls, r.nknown, r.nabove, r.nempty, r.nupdates, r.nskipped, r.nrollbacks,
                    r.nconfigs})
    put(payload, v);
  put(payload, r.loss_ema);
  put(payload, static_cast<int32_t>(r.stats.size()));
  for (double v : r.stats) put(payload, v);
  put_bytes(payload, r.parameters);
  put_bytes(payload, r.optimizer);
  put_bytes(payload, r.good_parameters);
  put_bytes(payload, r.good_optimizer);
  put_bytes(payload, r.energy_shift);    // version 4
  put(payload, r.labels_frames);         // version 5
  put(payload, r.labels_bytes);
  put(payload, r.dataset_epoch);
  put(payload, r.dataset_next);

  std::string out;
  out.reserve(FRAME + payload.size() + CHECKSUM);
  put(out, static_cast<int32_t>(TrainingRecord::VERSION));
  const auto n = static_cast<int64_t>(payload.size());
  put(out, n);
  put(out, ~n);
  out += payload;
  out += content_hash(payload);
  return out;
}

std::size_t record_size(const char *buf, std::size_t bound)
{
  Reader in(buf, std::min(FRAME, bound));
  const auto version = in.get<int32_t>("version");
  if (version == 1 || version == 2) return bound;
  if (version < 3 || version > TrainingRecord::VERSION)
    throw RecordError("restart data version " + std::to_string(version) +
                      " is not one this fix reads (1 to " +
                      std::to_string(TrainingRecord::VERSION) + ")");
  const auto n = in.get<int64_t>("size");
  const auto check = in.get<int64_t>("size");
  if (n != ~check || n < 0)
    throw RecordError("the restart record's size field is damaged: the restart file is damaged");
  if (bound < FRAME + CHECKSUM || static_cast<uint64_t>(n) > bound - FRAME - CHECKSUM)
    throw RecordError("the restart record claims " + std::to_string(n) +
                      " bytes, more than a restart record holds");
  return FRAME + static_cast<std::size_t>(n) + CHECKSUM;
}

TrainingRecord unpack_record(const char *buf, std::size_t size, int nstats)
{
  TrainingRecord r;
  Reader in(buf, size);
  r.version = in.get<int32_t>("version");
  if (r.version == 1) {
    r.model_hash = in.bytes("model hash");
    r.member_hashes = {r.model_hash};
    read_counters(in, r);
    r.stats.resize(nstats);
    for (double &v : r.stats) v = in.get<double>("statistics");
    read_states(in, r);
    return r;
  }
  if (r.version == 2) {
    read_body(in, r, nstats, false);
    return r;
  }
  // the version and the frame, checked against `size`
  const std::size_t n = record_size(buf, size) - FRAME - CHECKSUM;
  const char *payload = buf + FRAME;
  if (std::string(payload + n, CHECKSUM) != content_hash(std::string(payload, n)))
    throw RecordError("the restart record's checksum does not match its contents: the restart "
                      "file is damaged");
  Reader body(payload, n);
  read_body(body, r, nstats, true);
  if (r.version >= 4) r.energy_shift = body.bytes("energy shift state");
  if (r.version >= 5) {
    r.labels_frames = body.get<int64_t>("label file frame count");
    r.labels_bytes = body.get<int64_t>("label file length");
    if (r.labels_frames < -1 || r.labels_bytes < -1 || (r.labels_frames < 0) != (r.labels_bytes < 0))
      throw RecordError("the restart record's label file length is damaged: the restart file is "
                        "damaged");
    r.dataset_epoch = body.get<int64_t>("dataset epoch");
    r.dataset_next = body.get<int64_t>("dataset position");
  }
  if (body.left() != 0)
    throw RecordError("the restart record has " + std::to_string(body.left()) +
                      " bytes that belong to no field: the restart file is damaged");
  return r;
}

std::string record_mismatch(const TrainingRecord &r, const std::string &path,
                            const std::string &hash, const std::vector<std::string> &hashes)
{
  auto words = [](const std::vector<std::string> &v) {
    std::string out;
    for (const auto &w : v) out += (out.empty() ? "" : " ") + w;
    return out;
  };
  if (r.model_hash != hash)
    return "the restart file was written while training a model with file hash " + r.model_hash +
        ", but pair_coeff loaded " + path + " (hash " + hash +
        "); load the same model file that the run which wrote the restart file started from";
  if (r.member_hashes != hashes)
    return "the restart file was written while training a committee of " +
        std::to_string(r.member_hashes.size()) + " model(s) (" + words(r.member_hashes) +
        "), but pair_coeff loaded " + std::to_string(hashes.size()) + " (" + words(hashes) +
        "); load the same model files";
  return {};
}

}    // namespace MLTorch
