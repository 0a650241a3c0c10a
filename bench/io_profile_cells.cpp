// Implementation of bench/io_profile_cells.h.
#include "bench/io_profile_cells.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <vector>

#include "bench/median.h"
#include "common/error.h"
#include "common/timing.h"
#include "loader/io/io_engine.h"

namespace fs = std::filesystem;

namespace moestream::bench {
namespace {

struct Buffer {
  explicit Buffer(size_t n) {
    if (::posix_memalign(&p, 4096, n) != 0) throw IoError("out of memory for a " + std::to_string(n) + "-byte buffer");
  }
  ~Buffer() { std::free(p); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  uint8_t* data() const { return static_cast<uint8_t*>(p); }
  void* p = nullptr;
};

std::unique_ptr<IoEngine> direct_engine(const fs::path& path, unsigned depth, bool uring) {
  IoEngineOptions o;
  o.backend = uring ? IoBackend::kUring : IoBackend::kPread;
  o.direct = true;
  o.n_rings = 1;
  o.n_threads = depth;
  o.queue_depth = depth;
  o.coalesce = false;  // every request is one read, never split
  o.max_read_bytes = o.direct_max_read_bytes = uint64_t(1) << 40;
  o.notice = [](const std::string& line) { std::fprintf(stderr, "bench_io: %s\n", line.c_str()); };
  auto e = std::make_unique<IoEngine>(o);
  e->add_file(path);
  if (!e->file_is_direct(0)) throw IoError(path.string() + ": O_DIRECT refused; a profile needs device reads");
  return e;
}

struct Rate {
  double ops_per_s = 0, gbps = 0;
  uint64_t ops = 0;
};

// Batches of `batch` reads of `block` bytes at random block-aligned offsets for `seconds`.
Rate measure_rate(IoEngine& e, uint64_t file_bytes, uint64_t block, unsigned batch, double seconds,
                  std::mt19937_64& rng) {
  Buffer buf(block * batch);
  const uint64_t n_blocks = file_bytes / block;
  std::vector<ReadRequest> reqs(batch);
  auto fill = [&] {
    for (unsigned i = 0; i < batch; ++i) reqs[i] = {0, (rng() % n_blocks) * block, block, buf.data() + i * block};
  };
  fill();
  e.read(reqs);  // warm-up: threads, rings, buffers
  Rate r;
  double timed = 0;
  while (timed < seconds) {
    fill();
    auto t = Clock::now();
    e.read(reqs);
    timed += seconds_since(t);
    r.ops += batch;
  }
  r.ops_per_s = double(r.ops) / timed;
  r.gbps = double(r.ops) * double(block) / timed / 1e9;
  return r;
}

// Single reads of `block` bytes at random aligned offsets, one at a time, for `seconds` (at
// least 16): each read's microseconds.
std::vector<double> single_reads_us(IoEngine& e, uint64_t file_bytes, uint64_t block, double seconds,
                                    std::mt19937_64& rng) {
  Buffer buf(block);
  const uint64_t n_blocks = file_bytes / block;
  std::vector<ReadRequest> one(1);
  std::vector<double> us;
  double timed = 0;
  while (timed < seconds || us.size() < 16) {
    one[0] = {0, (rng() % n_blocks) * block, block, buf.data()};
    auto t = Clock::now();
    e.read(one);
    us.push_back(seconds_since(t) * 1e6);
    timed += us.back() / 1e6;
  }
  return us;
}

}  // namespace

void add_profile_options(CLI::App& app, ProfileArgs& a) {
  app.add_option("--profile-out", a.out,
                 "write the device profile (latency, IOPS limit, bandwidth; docs/io_engine.md) to this "
                 "file for infer/cluster_experts --io-profile");
  app.add_flag("--profile-only", a.only, "measure the device profile and nothing else");
  app.add_option("--profile-seconds", a.seconds, "seconds per profile measurement")->capture_default_str();
  app.add_option("--profile-qd", a.queue_depth, "reads in flight for the profile's IOPS and bandwidth")
      ->capture_default_str()->check(CLI::Range(1u, 4096u));
  app.add_option("--profile-single-kb", a.single_kb, "read size of the single-read bandwidth measurement, KiB")
      ->capture_default_str()->check(CLI::Range(uint64_t(4), uint64_t(1) << 20));
  app.add_option("--profile-large-kb", a.large_kb, "read size of the bandwidth measurement, KiB")
      ->capture_default_str()->check(CLI::Range(uint64_t(4), uint64_t(1) << 20));
}

ProfileRun measure_io_profile(const fs::path& path, uint64_t file_bytes, const ProfileArgs& a) {
  // Large and single reads of at most a quarter of the file (4 KiB multiples), so that a small
  // --size-mb still gives random offsets; the sizes used are saved under "source".
  const uint64_t quarter = file_bytes / 4 / 4096 * 4096;
  if (quarter < a.small_bytes) throw ConfigError("the profile needs a file of at least 16 x 4 KiB");
  const uint64_t large_bytes = std::min(a.large_kb << 10, quarter);
  const bool uring = io_uring_available();
  std::mt19937_64 rng(11);
  // Latency: one small read at a time; the median of single-read times. Then the same with
  // single_bytes reads: what one read alone moves.
  auto qd1 = direct_engine(path, 1, uring);
  const std::vector<double> lat_us = single_reads_us(*qd1, file_bytes, a.small_bytes, a.seconds, rng);
  const double p50 = median(lat_us);
  std::printf("profile  latency    QD 1, %llu-byte random O_DIRECT reads: p50 %.1f us (%zu reads)\n",
              static_cast<unsigned long long>(a.small_bytes), p50, lat_us.size());
  const uint64_t single_bytes = std::min(a.single_kb << 10, quarter);
  const std::vector<double> single_us = single_reads_us(*qd1, file_bytes, single_bytes, a.seconds, rng);
  const double single_gbps = double(single_bytes) / median(single_us) / 1e3;
  std::printf("profile  single     QD 1, %llu-byte random O_DIRECT reads: p50 %.1f us, %.3f GB/s (%zu reads)\n",
              static_cast<unsigned long long>(single_bytes), median(single_us), single_gbps, single_us.size());
  auto deep = direct_engine(path, a.queue_depth, uring);
  // Batches of 4x the depth keep the queue full for most of each batch.
  const Rate iops = measure_rate(*deep, file_bytes, a.small_bytes, 4 * a.queue_depth, a.seconds, rng);
  std::printf("profile  iops       QD %u, %llu-byte random O_DIRECT reads: %.0f ops/s\n", a.queue_depth,
              static_cast<unsigned long long>(a.small_bytes), iops.ops_per_s);
  const unsigned large_batch = std::max(4u, std::min(a.queue_depth, 16u));
  const Rate bw = measure_rate(*deep, file_bytes, large_bytes, large_batch, a.seconds, rng);
  // O_DIRECT can also be refused at the first read (EINVAL): the engine then reads buffered.
  if (!qd1->file_is_direct(0) || !deep->file_is_direct(0))
    throw IoError(path.string() + ": O_DIRECT refused at the first read; a profile needs device reads");
  std::printf("profile  bandwidth  %u x %llu-byte random O_DIRECT reads in flight: %.3f GB/s\n", large_batch,
              static_cast<unsigned long long>(large_bytes), bw.gbps);
  std::fflush(stdout);
  ProfileRun run;
  run.profile = IoProfile{p50, iops.ops_per_s, double(a.queue_depth), bw.gbps, single_gbps};
  validate_io_profile(run.profile, "the measured profile of " + path.string());
  run.source = {{"tool", "bench_io"},
                {"file", path.string()},
                {"file_bytes", file_bytes},
                {"engine", uring ? "io_uring, 1 ring" : "pread pool"},
                {"small_read_bytes", a.small_bytes},
                {"large_read_bytes", large_bytes},
                {"large_reads_in_flight", large_batch},
                {"seconds_per_measurement", a.seconds},
                {"latency_reads", lat_us.size()},
                {"single_read_bytes", single_bytes},
                {"single_reads", single_us.size()},
                {"op_latency_us_mean", [&] {
                   double s = 0;
                   for (double x : lat_us) s += x;
                   return s / double(lat_us.size());
                 }()},
                {"iops_reads", iops.ops},
                {"small_reads_gbps", iops.gbps},
                {"large_reads_per_s", bw.ops_per_s}};
  return run;
}

}  // namespace moestream::bench
