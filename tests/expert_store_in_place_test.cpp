// Tests of the in-place path of loader/store/engine_expert_store.h (begin_fetch / next_ready of
// FetchForm::kMatrices): experts of files without due checksums that sit in the page cache are
// handed out as the file's mapped pages, neither read nor copied; checksummed packs are still read
// and verified once, then used in place while their pages stay and their file is unchanged (a
// corrupt page is caught, a changed file or evicted pages are hashed again); O_DIRECT files are
// not mapped; the bytes handed out are always the expert's, for packs and GGUF files. With deferred
// checks (the CPU pass) first uses are handed out before their hash and verify_pending catches a
// corrupt one.
#include <fcntl.h>
#include <gtest/gtest.h>

#include <functional>
#include <sys/stat.h>
#include <unistd.h>

#include <ctime>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/file_util.h"
#include "loader/format/expert_file.h"
#include "loader/format/expert_map.h"
#include "loader/store/engine_expert_store.h"
#include "tests/support/strict_skip.h"
#include "tests/support/test_model.h"

namespace fs = std::filesystem;
using namespace moestream;

namespace {

const fs::path kGguf = fs::path(MOESTREAM_SOURCE_DIR) / "tests/fixtures/gguf/qwen3moe-tiny-Q8_0.gguf";

void warm(const fs::path& f) { (void)read_file(f); }

// Asks the kernel to drop f's pages; false when they stay (some sandboxes ignore the advice).
bool drop(const fs::path& f) {
  const int fd = ::open(f.c_str(), O_RDONLY);
  if (fd < 0) return false;
  ::fdatasync(fd);
  const bool ok = ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0;
  ::close(fd);
  return ok;
}

// Fetches `ids` of `layer` as matrices and returns each as one payload (gate, up, down at the
// layout's offsets), by position in ids.
std::vector<std::vector<uint8_t>> fetch_matrices(ExpertStore& s, const ModelConfig& c, int layer,
                                                 const std::vector<int>& ids) {
  const ExpertLayout lay = c.expert_layout(layer);
  std::vector<std::vector<uint8_t>> got(ids.size());
  s.begin_fetch(layer, ids, FetchForm::kMatrices);
  size_t i = 0, n = 0;
  ExpertMatrices m;
  while (s.next_ready(&i, &m, true)) {
    EXPECT_TRUE(got[i].empty()) << "position " << i << " handed out twice";
    got[i].resize(lay.bytes);
    std::memcpy(got[i].data() + lay.gate_offset, m.gate, lay.up_offset - lay.gate_offset);
    std::memcpy(got[i].data() + lay.up_offset, m.up, lay.down_offset - lay.up_offset);
    std::memcpy(got[i].data() + lay.down_offset, m.down, lay.bytes - lay.down_offset);
    ++n;
  }
  EXPECT_EQ(n, ids.size());
  return got;
}

// Deferred checks (ExpertStore::set_deferred_checks, the CPU pass): first uses are handed out in
// place before their hash ran; the hashes queue on the lent post and verify_pending settles them.
struct Queue {
  std::vector<std::function<void()>> tasks;
  ExpertStore::Post post() {
    return [this](std::function<void()> t) { tasks.push_back(std::move(t)); };
  }
};

class InPlace : public ::testing::Test {
 protected:
  void SetUp() override {
    c = test::tiny_moe_config({.vocab = 50, .hidden = 96, .head_dim = 8, .quant = QuantType::kQ8});
    want = test::write_layer_files(d.path(), c, 17, /*permute=*/true);
  }
  EngineExpertStoreOptions opts(bool verify, const char* backend = "pread") const {
    EngineExpertStoreOptions o;
    o.store.verify_checksums = verify;
    o.io.backend = parse_io_backend(backend);
    o.io.notice = [](const std::string&) {};
    return o;
  }
  void expect_payloads(const std::vector<std::vector<uint8_t>>& got, int layer, const std::vector<int>& ids) {
    for (size_t i = 0; i < ids.size(); ++i)
      EXPECT_EQ(got[i], want[size_t(layer)][size_t(ids[i])]) << "layer " << layer << " expert " << ids[i];
  }
  // Where s reports expert e of `layer`: a test that needs it resident (or evicted) skips where a
  // warmed (or dropped) file is not reported so.
  ExpertTier tier(ExpertStore& s, int layer, int e) const {
    std::vector<ExpertTier> tiers(size_t(c.n_experts));
    s.residency(layer, tiers);
    return tiers[size_t(e)];
  }
  std::unique_ptr<ExpertStore> deferred_store_with_corrupt_expert3(Queue& q);
  TempDir d{"expert_store_in_place_test"};
  ModelConfig c;
  test::Payloads want;
};

TEST_F(InPlace, ResidentExpertsOfAnUncheckedPackAreNeitherReadNorCopied) {
  warm(expert_file_path(d.path(), 1));
  auto s = open_engine_expert_store(d.path(), c, opts(false));
  if (tier(*s, 1, 2) != ExpertTier::kPageCache) GTEST_SKIP() << "the file is not reported resident after a read";
  const std::vector<int> ids{2, 5, 2, 7};  // a duplicate shares one expert
  expect_payloads(fetch_matrices(*s, c, 1, ids), 1, ids);
  const ExpertStoreStats st = s->stats();
  EXPECT_EQ(st.experts_in_place, 3u);
  EXPECT_EQ(st.experts_read, 0u);
  EXPECT_EQ(st.bytes_read, 0u);
  // The copying form of the same store still reads into its buffers.
  std::vector<const uint8_t*> out;
  const std::vector<int> five{5};
  s->fetch(1, five, out);
  EXPECT_EQ(std::memcmp(out[0], want[1][5].data(), want[1][5].size()), 0);
  EXPECT_EQ(s->stats().experts_read, 1u);
}

TEST_F(InPlace, ChecksummedPackIsVerifiedWhereItLiesAndACorruptPageIsCaught) {
  warm(expert_file_path(d.path(), 0));
  {
    auto s = open_engine_expert_store(d.path(), c, opts(true));
    if (tier(*s, 0, 3) != ExpertTier::kPageCache) GTEST_SKIP() << "the file is not reported resident after a read";
    const std::vector<int> ids{0, 3};
    expect_payloads(fetch_matrices(*s, c, 0, ids), 0, ids);  // resident: hashed in place, not read
    EXPECT_EQ(s->stats().experts_in_place, 2u);
    EXPECT_EQ(s->stats().verified_in_place, 2u);
    EXPECT_EQ(s->stats().experts_read, 0u);
  }
  const fs::path f = expert_file_path(d.path(), 0);
  const ExpertFileHeader h = read_expert_header(f);
  const uint32_t slot = read_expert_map(expert_map_path(d.path(), 0)).physical(3);
  test::overwrite_bytes(f, h.slot_offset(slot) + 9, "\x77");
  warm(f);  // the corrupt byte is in the page cache: its hash in place fails, the read's names it
  auto s = open_engine_expert_store(d.path(), c, opts(true));
  const std::string msg = test::error_message([&] { fetch_matrices(*s, c, 0, {1, 3}); });
  EXPECT_NE(msg.find("checksum mismatch for expert 3"), std::string::npos) << msg;
}

// Sets f's mtime an hour back, as a model file written long before the run is: a write during
// the run then changes it even within the clock tick of the file's last change.
void age(const fs::path& f) {
  struct timespec t[2];
  ::clock_gettime(CLOCK_REALTIME, &t[0]);
  t[0].tv_sec -= 3600;
  t[1] = t[0];
  ASSERT_EQ(::utimensat(AT_FDCWD, f.c_str(), t, 0), 0);
}

TEST_F(InPlace, ChecksummedExpertsVerifiedOnceAreThenUsedWithoutANewChecksum) {
  const fs::path f = expert_file_path(d.path(), 0);
  warm(f);
  auto s = open_engine_expert_store(d.path(), c, opts(true));
  if (tier(*s, 0, 3) != ExpertTier::kPageCache) GTEST_SKIP() << "the file is not reported resident after a read";
  // The hashing runs on the threads the caller lends (one call for both first uses).
  std::vector<size_t> lent;
  s->set_parallel_for([&](size_t n, const std::function<void(size_t)>& fn) {
    lent.push_back(n);
    for (size_t i = n; i-- > 0;) fn(i);  // any order
  });
  const std::vector<int> ids{0, 3};
  expect_payloads(fetch_matrices(*s, c, 0, ids), 0, ids);  // first use: verified where it lies
  EXPECT_EQ(s->stats().experts_read, 0u);
  EXPECT_EQ(s->stats().experts_in_place, 2u);
  EXPECT_EQ(s->stats().verified_in_place, 2u);
  EXPECT_EQ(lent, (std::vector<size_t>{2}));
  expect_payloads(fetch_matrices(*s, c, 0, ids), 0, ids);  // the same pages: in place, no hash
  EXPECT_EQ(s->stats().experts_read, 0u);
  EXPECT_EQ(s->stats().experts_in_place, 4u);
  EXPECT_EQ(s->stats().verified_in_place, 2u);
  EXPECT_EQ(lent.size(), 1u);
  // The copying form (the GPU's staging) still copies, but without hashing again.
  std::vector<const uint8_t*> out;
  s->fetch(0, ids, out);
  for (size_t i = 0; i < ids.size(); ++i)
    EXPECT_EQ(std::memcmp(out[i], want[0][size_t(ids[i])].data(), want[0][size_t(ids[i])].size()), 0);
  EXPECT_EQ(s->stats().checksums_skipped, 2u);
  // The copying form reads what it copies; an expert never verified is hashed on first use.
  const std::vector<int> other{5};
  expect_payloads(fetch_matrices(*s, c, 0, other), 0, other);
  EXPECT_EQ(s->stats().verified_in_place, 3u);
  EXPECT_EQ(s->stats().experts_read, 2u);  // the copying form's two
}

TEST_F(InPlace, AFileChangedAfterVerificationIsHashedAgainAndTheCorruptionCaught) {
  const fs::path f = expert_file_path(d.path(), 0);
  age(f);
  warm(f);
  auto s = open_engine_expert_store(d.path(), c, opts(true));
  const std::vector<int> ids{1, 3};
  expect_payloads(fetch_matrices(*s, c, 0, ids), 0, ids);  // verified and marked
  const ExpertFileHeader h = read_expert_header(f);
  const uint32_t slot = read_expert_map(expert_map_path(d.path(), 0)).physical(3);
  test::overwrite_bytes(f, h.slot_offset(slot) + 9, "\x77");
  warm(f);  // the corrupt byte is in the page cache, where verified pages were
  const std::string msg = test::error_message([&] { fetch_matrices(*s, c, 0, ids); });
  EXPECT_NE(msg.find("checksum mismatch for expert 3"), std::string::npos) << msg;
  // The copying form as well.
  auto s2 = open_engine_expert_store(d.path(), c, opts(true));
  std::vector<const uint8_t*> out;
  EXPECT_NE(test::error_message([&] { s2->fetch(0, std::vector<int>{3}, out); }).find("checksum mismatch"),
            std::string::npos);
}

// Deferred checks (ExpertStore::set_deferred_checks, the CPU pass): first uses are handed out in
// place before their hash ran; the hashes queue on the lent post and verify_pending settles them.

TEST_F(InPlace, FirstUsesHandedOutBeforeTheirHashAreVerifiedByVerifyPending) {
  const fs::path f = expert_file_path(d.path(), 0);
  warm(f);
  Queue q;
  auto s = open_engine_expert_store(d.path(), c, opts(true));
  if (tier(*s, 0, 3) != ExpertTier::kPageCache) GTEST_SKIP() << "the file is not reported resident after a read";
  s->set_deferred_checks(q.post());
  const std::vector<int> ids{0, 3};
  expect_payloads(fetch_matrices(*s, c, 0, ids), 0, ids);  // at once, in place, not yet hashed
  EXPECT_EQ(s->stats().experts_in_place, 2u);
  EXPECT_EQ(s->stats().experts_read, 0u);
  EXPECT_EQ(s->stats().verified_in_place, 0u);
  ASSERT_EQ(q.tasks.size(), 2u);
  q.tasks[1]();        // one hashed by a lent thread ...
  s->verify_pending();  // ... the other here
  EXPECT_EQ(s->stats().verified_in_place, 2u);
  q.tasks[0]();  // taken already: does nothing
  s->verify_pending();
  EXPECT_EQ(s->stats().verified_in_place, 2u);
  expect_payloads(fetch_matrices(*s, c, 0, ids), 0, ids);  // verified: in place, no new hash
  EXPECT_EQ(q.tasks.size(), 2u);
  EXPECT_EQ(s->stats().experts_in_place, 4u);
  // A store gone with a hash still queued: the task finds it cancelled (the mapping is gone).
  const std::vector<int> other{5};
  expect_payloads(fetch_matrices(*s, c, 0, other), 0, other);
  ASSERT_EQ(q.tasks.size(), 3u);
  s.reset();
  q.tasks[2]();
}

// A store with deferred checks over layer 0 whose expert 3 is corrupt in the page cache; null
// when the page cache does not report the file resident after a read (the caller skips).
std::unique_ptr<ExpertStore> InPlace::deferred_store_with_corrupt_expert3(Queue& q) {
  const fs::path f = expert_file_path(d.path(), 0);
  const ExpertFileHeader h = read_expert_header(f);
  const uint32_t slot = read_expert_map(expert_map_path(d.path(), 0)).physical(3);
  test::overwrite_bytes(f, h.slot_offset(slot) + 9, "\x77");
  warm(f);  // the corrupt byte is in the page cache
  auto s = open_engine_expert_store(d.path(), c, opts(true));
  if (tier(*s, 0, 3) != ExpertTier::kPageCache) return nullptr;
  s->set_deferred_checks(q.post());
  return s;
}

// The hand-out carries its queued hash (ExpertMatrices::unverified): the thread about to compute
// it runs the hash first (PendingChecks::run_now), the queued task then finds it taken, and
// verify_pending compares it as any other; a verified expert carries none.
TEST_F(InPlace, TheComputingThreadRunsAFirstUsesQueuedHash) {
  Queue q;
  auto s = deferred_store_with_corrupt_expert3(q);
  if (!s) GTEST_SKIP() << "the file is not reported resident after a read";
  const auto hand_out = [&](const std::vector<int>& ids) {
    std::vector<ExpertMatrices> ms(ids.size());
    s->begin_fetch(0, ids, FetchForm::kMatrices);
    size_t i = 0;
    ExpertMatrices m;
    while (s->next_ready(&i, &m, true)) ms[i] = m;
    return ms;
  };
  std::vector<ExpertMatrices> ms = hand_out({1, 3});
  ASSERT_NE(ms[0].unverified, nullptr);
  ASSERT_NE(ms[1].unverified, nullptr);
  ASSERT_EQ(q.tasks.size(), 2u);
  for (const ExpertMatrices& m : ms) PendingChecks::run_now(*m.unverified);  // as ExpertCompute does
  EXPECT_TRUE(ms[0].unverified->done() && ms[1].unverified->done());
  for (auto& t : q.tasks) t();  // taken already: nothing
  const std::string msg = test::error_message<FormatError>([&] { s->verify_pending(); });
  EXPECT_NE(msg.find("checksum mismatch for expert 3"), std::string::npos) << msg;
  EXPECT_EQ(s->stats().verified_in_place, 1u);
  ms = hand_out({1});  // verified: nothing queued, nothing carried
  EXPECT_EQ(ms[0].unverified, nullptr);
  EXPECT_EQ(q.tasks.size(), 2u);
}

TEST_F(InPlace, ACorruptPageComputedBeforeItsHashIsCaughtByVerifyPending) {
  const fs::path f = expert_file_path(d.path(), 0);
  Queue q;
  auto s = deferred_store_with_corrupt_expert3(q);
  if (!s) GTEST_SKIP() << "the file is not reported resident after a read";
  const std::vector<int> ids{1, 3};
  (void)fetch_matrices(*s, c, 0, ids);  // handed out: the caller must not return what it computes
  for (auto& t : q.tasks) t();
  std::string msg = test::error_message<FormatError>([&] { s->verify_pending(); });
  EXPECT_NE(msg.find("checksum mismatch for expert 3"), std::string::npos) << msg;
  EXPECT_NE(msg.find(f.string()), std::string::npos) << msg;
  EXPECT_EQ(s->stats().verified_in_place, 1u);  // expert 1 passed
  // Never marked: its next use is hashed (and caught) again, the good one is not.
  (void)fetch_matrices(*s, c, 0, ids);
  EXPECT_EQ(q.tasks.size(), 3u);
  msg = test::error_message<FormatError>([&] { s->verify_pending(); });
  EXPECT_NE(msg.find("checksum mismatch for expert 3"), std::string::npos) << msg;
  // Without deferred checks the same store catches it before handing it out.
  s->set_deferred_checks({});
  msg = test::error_message([&] { fetch_matrices(*s, c, 0, ids); });
  EXPECT_NE(msg.find("checksum mismatch for expert 3"), std::string::npos) << msg;
}

TEST_F(InPlace, AFirstUseWhoseFileChangedBeforeItsCheckIsNotMarked) {
  const fs::path f = expert_file_path(d.path(), 0);
  age(f);
  warm(f);
  Queue q;
  auto s = open_engine_expert_store(d.path(), c, opts(true));
  if (tier(*s, 0, 1) != ExpertTier::kPageCache) GTEST_SKIP() << "the file is not reported resident after a read";
  s->set_deferred_checks(q.post());
  (void)fetch_matrices(*s, c, 0, {1});  // queued with the file as it was
  const ExpertFileHeader h = read_expert_header(f);
  const uint32_t slot5 = read_expert_map(expert_map_path(d.path(), 0)).physical(5);
  test::overwrite_bytes(f, h.slot_offset(slot5) + 9, "\x77");  // another expert's bytes
  warm(f);
  (void)fetch_matrices(*s, c, 0, {2});  // a fetch of the same file sees the change
  ASSERT_EQ(q.tasks.size(), 2u);
  s->verify_pending();  // both match: expert 1's bytes were not touched
  EXPECT_EQ(s->stats().verified_in_place, 2u);
  // Expert 1 was hashed before the change was seen: hashed again; expert 2 after: trusted.
  (void)fetch_matrices(*s, c, 0, {1, 2});
  EXPECT_EQ(q.tasks.size(), 3u);
  s->verify_pending();
}

TEST_F(InPlace, VerifiedExpertsWhosePagesLeftAreReadAndHashedAgain) {
  const fs::path f = expert_file_path(d.path(), 1);
  warm(f);
  auto s = open_engine_expert_store(d.path(), c, opts(true));
  const std::vector<int> ids{0, 6};
  expect_payloads(fetch_matrices(*s, c, 1, ids), 1, ids);
  if (!drop(f) || tier(*s, 1, 0) != ExpertTier::kStorage || tier(*s, 1, 6) != ExpertTier::kStorage)
    GTEST_SKIP() << "the page cache cannot be dropped here";
  expect_payloads(fetch_matrices(*s, c, 1, ids), 1, ids);
  EXPECT_EQ(s->stats().experts_read, 4u);
  EXPECT_EQ(s->stats().experts_in_place, 0u);
  EXPECT_EQ(s->stats().checksums_skipped, 0u);
}

TEST_F(InPlace, EvictedExpertsAreReadAndTheMmapBackendFaultsThemIn) {
  const fs::path f = expert_file_path(d.path(), 1);
  const std::vector<int> ids{0, 1, 6};
  {
    auto s = open_engine_expert_store(d.path(), c, opts(false));
    if (!drop(f) || tier(*s, 1, 0) != ExpertTier::kStorage || tier(*s, 1, 6) != ExpertTier::kStorage)
      GTEST_SKIP() << "the page cache cannot be dropped here";
    expect_payloads(fetch_matrices(*s, c, 1, ids), 1, ids);
    EXPECT_EQ(s->stats().experts_read, 3u);
    EXPECT_EQ(s->stats().experts_in_place, 0u);
  }
  ASSERT_TRUE(drop(f));
  auto s = open_engine_expert_store(d.path(), c, opts(false, "mmap"));
  expect_payloads(fetch_matrices(*s, c, 1, ids), 1, ids);
  EXPECT_EQ(s->stats().experts_in_place, 3u);
  EXPECT_EQ(s->stats().experts_read, 0u);
}

TEST_F(InPlace, ODirectFilesAreNotMapped) {
  EngineExpertStoreOptions o = opts(false);
  o.io.direct = true;
  auto s = open_engine_expert_store(d.path(), c, o);
  if (s->describe().find("O_DIRECT") == std::string::npos) GTEST_SKIP() << "O_DIRECT refused here";
  warm(expert_file_path(d.path(), 0));
  const std::vector<int> ids{4, 2};
  expect_payloads(fetch_matrices(*s, c, 0, ids), 0, ids);
  EXPECT_EQ(s->stats().experts_in_place, 0u);
  EXPECT_EQ(s->stats().experts_read, 2u);
}

// A pass that fails on a read abandons the first uses it queued: a hash one of them took of pages
// that the failure's cause had changed (here a truncation, which zeroes the cut page past the new
// end) is neither reused nor compared once the file is whole again. It was: the next pass failed
// with a checksum mismatch on the slot that crossed the cut, the same hash every run.
TEST_F(InPlace, AFailedPassLeavesNoHashForTheNextToReuse) {
  const fs::path f = expert_file_path(d.path(), 0);
  const std::string whole = read_file(f);
  warm(f);
  auto s = open_engine_expert_store(d.path(), c, opts(true));
  if (tier(*s, 0, 3) != ExpertTier::kPageCache) GTEST_SKIP() << "the file is not reported resident after a read";
  s->set_deferred_checks([](std::function<void()> t) { t(); });  // hashed at once, as an idle lent thread may
  // The cut: inside the last page of the second-to-last slot's payload (that page stays resident,
  // zeros past the cut); the last slot is gone, and reading it fails the pass.
  const ExpertFileHeader h = read_expert_header(f);
  const uint64_t bytes = c.expert_layout(0).bytes, last_page = (bytes - 1) / 4096 * 4096;
  ASSERT_GE(bytes - last_page, 2u);
  const uint64_t cut = h.slot_offset(h.n_experts - 2) + last_page + (bytes - last_page) / 2;
  std::vector<int> all(size_t(c.n_experts));
  for (int e = 0; e < c.n_experts; ++e) all[size_t(e)] = e;
  expect_payloads(fetch_matrices(*s, c, 0, all), 0, all);
  s->verify_pending();
  ASSERT_EQ(::truncate(f.c_str(), off_t(cut)), 0);
  const std::string failed = test::error_message([&] {
    fetch_matrices(*s, c, 0, all);
    s->verify_pending();
  });
  EXPECT_NE(failed.find("truncated"), std::string::npos) << failed;
  test::overwrite_bytes(f, 0, whole);  // back byte for byte, in place (the same inode)
  const std::string again = test::error_message([&] {
    expect_payloads(fetch_matrices(*s, c, 0, all), 0, all);
    s->verify_pending();
  });
  EXPECT_EQ(again, "<no exception>");
}

TEST(InPlaceGguf, ExpertSlicesInPlaceEqualTheCopiedPayload) {
  if (!fs::exists(kGguf)) MOESTREAM_SKIP_OR_FAIL() << kGguf << " absent";
  TempDir d{"expert_store_in_place_gguf"};
  const fs::path g = d.path() / "m.gguf";
  fs::copy_file(kGguf, g);
  warm(g);
  const ModelConfig c = ModelConfig::load(g);
  EngineExpertStoreOptions o;
  o.io.backend = IoBackend::kPread;
  auto copying = open_engine_expert_store(g, c, o);
  auto in_place = open_engine_expert_store(g, c, o);
  std::vector<int> ids(size_t(c.n_experts));
  for (int e = 0; e < c.n_experts; ++e) ids[size_t(e)] = c.n_experts - 1 - e;
  for (int l = 0; l < c.n_layers; ++l) {
    std::vector<const uint8_t*> out;
    copying->fetch(l, ids, out);
    const auto got = fetch_matrices(*in_place, c, l, ids);
    const size_t bytes = c.expert_layout(l).bytes;
    for (size_t i = 0; i < ids.size(); ++i)
      EXPECT_EQ(std::memcmp(got[i].data(), out[i], bytes), 0) << "layer " << l << " expert " << ids[i];
  }
  const ExpertStoreStats st = in_place->stats();
  std::vector<ExpertTier> tiers(size_t(c.n_experts));
  in_place->residency(0, tiers);
  if (tiers[0] == ExpertTier::kPageCache) {
    EXPECT_EQ(st.experts_in_place, uint64_t(c.n_layers) * uint64_t(c.n_experts));
    EXPECT_EQ(st.experts_read, 0u);
  }
  EXPECT_EQ(copying->stats().experts_in_place, 0u);
}

}  // namespace
