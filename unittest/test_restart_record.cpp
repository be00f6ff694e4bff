/* ----------------------------------------------------------------------
   The training record of fix torch/finetune's restart files
   (src/core/mltorch/restart_record.h), without LAMMPS: it reads back what it
   packs, reads the records of earlier versions, and refuses every damaged
   or truncated record with a RecordError instead of reading past it.
------------------------------------------------------------------------- */

#include "mltorch/runtime.h"    // content_hash
#include "mltorch/restart_record.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

using MLTorch::RecordError;
using MLTorch::TrainingRecord;

namespace {
constexpr int NSTATS = 11;

TrainingRecord sample()
{
  TrainingRecord r;
  r.model_hash = "0123456789abcdef";
  r.member_hashes = {"0123456789abcdef", "fedcba9876543210"};
  r.ncalls = 101;
  r.nknown = 57;
  r.nabove = 3;
  r.nempty = 2;
  r.nupdates = 44;
  r.nskipped = 5;
  r.nrollbacks = 1;
  r.nconfigs = 88;
  r.loss_ema = 0.125;
  for (int k = 0; k < NSTATS; ++k) r.stats.push_back(0.5 * k - 1.0);
  r.parameters = std::string("\x01\x02\0\x03 parameters", 15);
  r.optimizer = "optimizer state";
  r.good_parameters = "good parameters";
  r.good_optimizer = "";
  r.energy_shift = std::string("\x08\0\0\0\0\0\0\0shift st", 16);
  r.labels_frames = 12;
  r.labels_bytes = 34567;
  r.dataset_epoch = 3;
  r.dataset_next = 5;
  return r;
}

void expect_same(const TrainingRecord &a, const TrainingRecord &b)
{
  EXPECT_EQ(a.model_hash, b.model_hash);
  EXPECT_EQ(a.member_hashes, b.member_hashes);
  EXPECT_EQ(a.ncalls, b.ncalls);
  EXPECT_EQ(a.nknown, b.nknown);
  EXPECT_EQ(a.nabove, b.nabove);
  EXPECT_EQ(a.nempty, b.nempty);
  EXPECT_EQ(a.nupdates, b.nupdates);
  EXPECT_EQ(a.nskipped, b.nskipped);
  EXPECT_EQ(a.nrollbacks, b.nrollbacks);
  EXPECT_EQ(a.nconfigs, b.nconfigs);
  EXPECT_EQ(a.loss_ema, b.loss_ema);
  EXPECT_EQ(a.stats, b.stats);
  EXPECT_EQ(a.parameters, b.parameters);
  EXPECT_EQ(a.optimizer, b.optimizer);
  EXPECT_EQ(a.good_parameters, b.good_parameters);
  EXPECT_EQ(a.good_optimizer, b.good_optimizer);
  EXPECT_EQ(a.energy_shift, b.energy_shift);
  EXPECT_EQ(a.labels_frames, b.labels_frames);
  EXPECT_EQ(a.labels_bytes, b.labels_bytes);
  EXPECT_EQ(a.dataset_epoch, b.dataset_epoch);
  EXPECT_EQ(a.dataset_next, b.dataset_next);
}

template <typename T> void put(std::string &out, T v)
{
  out.append(reinterpret_cast<const char *>(&v), sizeof(T));
}
void put_bytes(std::string &out, const std::string &s)
{
  put<int64_t>(out, static_cast<int64_t>(s.size()));
  out += s;
}

// the records earlier versions of the fix wrote (their layouts, by hand)
std::string version2(const TrainingRecord &r)
{
  std::string out;
  put<int32_t>(out, 2);
  put_bytes(out, r.model_hash);
  put<int32_t>(out, static_cast<int32_t>(r.member_hashes.size()));
  for (const auto &h : r.member_hashes) put_bytes(out, h);
  for (int64_t v : {r.ncalls, r.nknown, r.nabove, r.nempty, r.nupdates, r.nskipped, r.nrollbacks,
                    r.nconfigs})
    put(out, v);
  put(out, r.loss_ema);
  for (double v : r.stats) put(out, v);
  for (const auto *s : {&r.parameters, &r.optimizer, &r.good_parameters, &r.good_optimizer})
    put_bytes(out, *s);
  return out;
}

// version 3: version 2's body with the statistics counted, framed (the
// energy reference came with version 4)
std::string version3(const TrainingRecord &r)
{
  std::string payload;
  put_bytes(payload, r.model_hash);
  put<int32_t>(payload, static_cast<int32_t>(r.member_hashes.size()));
  for (const auto &h : r.member_hashes) put_bytes(payload, h);
  for (int64_t v : {r.ncalls, r.nknown, r.nabove, r.nempty, r.nupdates, r.nskipped, r.nrollbacks,
                    r.nconfigs})
    put(payload, v);
  put(payload, r.loss_ema);
  put<int32_t>(payload, static_cast<int32_t>(r.stats.size()));
  for (double v : r.stats) put(payload, v);
  for (const auto *s : {&r.parameters, &r.optimizer, &r.good_parameters, &r.good_optimizer})
    put_bytes(payload, *s);
  std::string out;
  put<int32_t>(out, 3);
  const auto n = static_cast<int64_t>(payload.size());
  put(out, n);
  put(out, ~n);
  return out + payload + MLTorch::content_hash(payload);
}

// version 4: version 3 with the energy reference (the label file came with 5)
std::string version4(const TrainingRecord &r)
{
  const std::string v3 = version3(r);
  std::string payload = v3.substr(4 + 16, v3.size() - 4 - 16 - 16);
  put_bytes(payload, r.energy_shift);
  std::string out;
  put<int32_t>(out, 4);
  const auto n = static_cast<int64_t>(payload.size());
  put(out, n);
  put(out, ~n);
  return out + payload + MLTorch::content_hash(payload);
}

std::string version1(const TrainingRecord &r)
{
  std::string out;
  put<int32_t>(out, 1);
  put_bytes(out, r.model_hash);
  for (int64_t v : {r.nupdates, r.nskipped, r.nrollbacks, r.nconfigs}) put(out, v);
  put(out, r.loss_ema);
  for (double v : r.stats) put(out, v);
  for (const auto *s : {&r.parameters, &r.optimizer, &r.good_parameters, &r.good_optimizer})
    put_bytes(out, *s);
  return out;
}

// read `bytes[0, n)` from a buffer of exactly n bytes, as LAMMPS hands it over
// (AddressSanitizer builds see any read past it)
TrainingRecord read(const std::string &bytes, std::size_t n)
{
  std::unique_ptr<char[]> buf(new char[n]);
  std::memcpy(buf.get(), bytes.data(), n);
  return MLTorch::unpack_record(buf.get(), MLTorch::record_size(buf.get(), n), NSTATS);
}
}    // namespace

TEST(RestartRecord, ReadsWhatItPacks)
{
  const TrainingRecord r = sample();
  const std::string bytes = MLTorch::pack_record(r);
  // the frame gives the record's size, as LAMMPS does not
  EXPECT_EQ(MLTorch::record_size(bytes.data(), 1u << 30), bytes.size());
  const TrainingRecord back = read(bytes, bytes.size());
  EXPECT_EQ(back.version, 5);
  expect_same(back, r);
}

TEST(RestartRecord, ReadsEarlierVersions)
{
  TrainingRecord r = sample();
  // version 4: no label file
  const std::string v4 = version4(r);
  TrainingRecord back4 = read(v4, v4.size());
  EXPECT_EQ(back4.version, 4);
  r.labels_frames = r.labels_bytes = r.dataset_epoch = r.dataset_next = -1;
  expect_same(back4, r);
  const std::string v2 = version2(r);
  // version 3: framed, no energy reference
  const std::string v3 = version3(r);
  EXPECT_EQ(MLTorch::record_size(v3.data(), 1u << 30), v3.size());
  TrainingRecord back3 = read(v3, v3.size());
  EXPECT_EQ(back3.version, 3);
  TrainingRecord no_shift = r;
  no_shift.energy_shift.clear();
  expect_same(back3, no_shift);
  // unframed: the size is the bound the caller gives
  EXPECT_EQ(MLTorch::record_size(v2.data(), 1u << 30), 1u << 30);
  TrainingRecord back = read(v2, v2.size());
  EXPECT_EQ(back.version, 2);
  r.energy_shift.clear();
  expect_same(back, r);

  const std::string v1 = version1(r);
  back = read(v1, v1.size());
  EXPECT_EQ(back.version, 1);
  // a version 1 record knew one model and no gating counters
  r.member_hashes = {r.model_hash};
  r.ncalls = r.nknown = r.nabove = r.nempty = 0;
  expect_same(back, r);
}

// every prefix of a record is refused, whatever its version
TEST(RestartRecord, EveryTruncationIsRefused)
{
  const TrainingRecord r = sample();
  for (const std::string &bytes : {MLTorch::pack_record(r), version2(r), version1(r)}) {
    for (std::size_t n = 0; n < bytes.size(); ++n)
      EXPECT_THROW(read(bytes, n), RecordError) << "version " << bytes[0] << ", " << n << " of "
                                                << bytes.size() << " bytes";
  }
}

// a change of any byte of a version 3 record (frame, payload or checksum) is seen
TEST(RestartRecord, EveryDamagedByteIsSeen)
{
  const std::string bytes = MLTorch::pack_record(sample());
  for (std::size_t k = 0; k < bytes.size(); ++k)
    for (unsigned char flip : {0x01, 0x80, 0xff}) {
      std::string bad = bytes;
      bad[k] = static_cast<char>(static_cast<unsigned char>(bad[k]) ^ flip);
      EXPECT_THROW(read(bad, bad.size()), RecordError) << "byte " << k << " ^ " << int(flip);
    }
}

TEST(RestartRecord, MessagesSayWhatIsWrong)
{
  const TrainingRecord r = sample();
  const auto message = [](const std::string &bytes, std::size_t n) -> std::string {
    try {
      read(bytes, n);
    } catch (RecordError &e) {
      return e.what();
    }
    return "no error";
  };
  std::string bytes = MLTorch::pack_record(r);
  bytes[40] ^= 0x10;
  EXPECT_NE(message(bytes, bytes.size()).find("checksum does not match"), std::string::npos);
  bytes = MLTorch::pack_record(r);
  bytes[5] ^= 0x10;
  EXPECT_NE(message(bytes, bytes.size()).find("size field is damaged"), std::string::npos);
  const std::string v2 = version2(r);
  EXPECT_NE(message(v2, v2.size() - 3).find("damaged or truncated"), std::string::npos);
  std::string v9 = v2;
  v9[0] = 9;
  EXPECT_NE(message(v9, v9.size()).find("version 9 is not one this fix reads (1 to 5)"),
            std::string::npos);
  // a version 2 length that claims more than the record holds
  std::string long_hash = v2;
  long_hash[4 + 7] = 0x7f;
  EXPECT_NE(message(long_hash, long_hash.size()).find("model hash claims"), std::string::npos);
  // another number of statistics than this fix keeps
  TrainingRecord fewer = r;
  fewer.stats.pop_back();
  bytes = MLTorch::pack_record(fewer);
  EXPECT_NE(message(bytes, bytes.size()).find("holds 10 statistics"), std::string::npos);
}
