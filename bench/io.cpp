// bench_io: read bandwidth and per-op latency of the read engine's backends (one pread thread,
// pread pool, mmap, io_uring with one and several rings) on page-cache hits and device reads.
//
// It creates a file (--size-mb), then measures sequential and random reads of each block size,
// and the expert read pattern of a model layer (top-k random experts per batch, coalescing on),
// and prints a table plus JSON. Before those, when device reads are on, the device profile
// (bench/io_profile_cells.h) that --profile-out saves for infer/cluster_experts --io-profile.
//   cache "page_cache": buffered reads of a file that is fully in the page cache (checked with
//                       cachestat); "device": O_DIRECT reads; "device_mmap": mmap after
//                       POSIX_FADV_DONTNEED. On a VM "device" is whatever the virtual disk does.
#include <fcntl.h>
#include <sys/utsname.h>
#include <unistd.h>
#include <xxhash.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/file_util.h"
#include "bench/io_profile_cells.h"
#include "bench/median.h"
#include "common/timing.h"
#include "loader/io/io_engine.h"
#include "loader/io/residency.h"

namespace fs = std::filesystem;
using namespace moestream;
using bench::median;

namespace {

struct Args {
  std::string file;
  uint64_t size_mb = 512;
  unsigned threads = 8;
  unsigned rings = 4;
  unsigned qd = 32;
  unsigned batch = 64;
  double seconds = 0.2;
  std::vector<std::string> blocks{"4K", "16K", "64K", "256K", "1M"};
  uint64_t expert_bytes = 2654208;  // Qwen3-30B-A3B expert in q4: 3 x 768x2048 matrices
  unsigned top_k = 8;
  uint64_t max_read_kb = 1024;  // engine read size cap (coalescing and splitting)
  uint64_t direct_max_read_kb = 4096;  // the same for O_DIRECT reads
  std::string json = "bench_io.json";
  bool keep = false;
  bool no_device = false;
  bool no_page_cache = false;
  bool no_sweep = false;
  bool uring_batch_submit = false;  // add rows for io_uring rings that submit a share at once
  unsigned depth_reps = 0;      // cold depth study rounds (0: off)
  unsigned hot_ab_rounds = 0;   // interleaved page-cache rounds, pread pool vs rings (0: off)
};

uint64_t parse_size(const std::string& s) {
  char* end = nullptr;
  uint64_t v = std::strtoull(s.c_str(), &end, 10);
  std::string unit(end);
  if (unit == "K" || unit == "k") return v << 10;
  if (unit == "M" || unit == "m") return v << 20;
  if (unit.empty()) return v;
  throw ConfigError("bad block size '" + s + "' (expected e.g. 4K, 1M)");
}

struct AlignedBuf {
  explicit AlignedBuf(size_t n) {
    if (::posix_memalign(&p, 4096, std::max<size_t>(n, 4096)) != 0) throw IoError("out of memory");
    std::memset(p, 1, n);  // fault the pages in so the first read does not pay for it
  }
  ~AlignedBuf() { std::free(p); }
  AlignedBuf(const AlignedBuf&) = delete;
  AlignedBuf& operator=(const AlignedBuf&) = delete;
  uint8_t* data() const { return static_cast<uint8_t*>(p); }
  void* p = nullptr;
};

void create_file(const fs::path& path, uint64_t bytes) {
  std::string tmp = path.string() + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw_errno("cannot create", tmp);
  std::vector<uint64_t> chunk((8 << 20) / 8);
  std::mt19937_64 rng(1);
  for (uint64_t done = 0; done < bytes;) {
    for (auto& v : chunk) v = rng();
    size_t n = std::min<uint64_t>(chunk.size() * 8, bytes - done);
    if (::write(fd, chunk.data(), n) != static_cast<ssize_t>(n)) throw_errno("cannot write", tmp);
    done += n;
  }
  if (::fsync(fd) != 0) throw_errno("cannot fsync", tmp);
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) throw_errno("cannot rename into", path);
}

void drop_cache(const fs::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw_errno("cannot open", path);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

double warm_cache(const fs::path& path, uint64_t bytes) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw_errno("cannot open", path);
  std::vector<char> buf(8 << 20);
  for (uint64_t off = 0; off < bytes; off += buf.size())
    if (::pread(fd, buf.data(), buf.size(), static_cast<off_t>(off)) < 0) throw_errno("cannot read", path);
  ::close(fd);
  return PageCacheResidency(path).query(0, bytes).fraction();
}

struct EngineSpec {
  std::string name;
  IoBackend backend;
  unsigned threads, rings;
  bool batch_submit = false;  // io_uring: a ring's share of a batch in one submission
};

struct Cell {
  std::string section, engine, cache, pattern;
  uint64_t block = 0;
  double gbps = 0, lat_p50_us = 0, lat_mean_us = 0, ops_per_s = 0;
  uint64_t ops = 0, reads_issued = 0;
};

// The median and mean of per-read latencies (microseconds; sorted in place).
void set_latency(Cell& c, std::vector<double>& lat_us) {
  std::sort(lat_us.begin(), lat_us.end());
  c.lat_p50_us = lat_us[lat_us.size() / 2];
  double sum = 0;
  for (double x : lat_us) sum += x;
  c.lat_mean_us = sum / lat_us.size();
}

// The expert pattern: reqs.size() distinct random experts of the layer file (slots of `stride`
// bytes, payloads of `expert_bytes`) into consecutive slots of `buf`; `ids` has one entry per
// expert of the file (scratch).
void random_expert_reads(std::vector<ReadRequest>& reqs, std::vector<uint64_t>& ids, std::mt19937_64& rng,
                         uint64_t stride, uint64_t expert_bytes, uint8_t* buf) {
  const uint64_t n_experts = ids.size();
  for (uint64_t i = 0; i < n_experts; ++i) ids[i] = i;
  for (size_t i = 0; i < reqs.size(); ++i) {
    std::swap(ids[i], ids[i + rng() % (n_experts - i)]);
    reqs[i] = {0, ids[i] * stride, expert_bytes, buf + i * stride};
  }
}

// The cache a cell reads from: the warm page cache, or the device (through a mapping for mmap).
std::string cache_label(bool cold, bool is_mmap) { return !cold ? "page_cache" : is_mmap ? "device_mmap" : "device"; }

// Whether the options skip the device (cold) or the page-cache (warm) measurements.
bool skipped(const Args& a, bool cold) { return cold ? a.no_device : a.no_page_cache; }

uint64_t g_max_read_bytes = 1 << 20, g_direct_max_read_bytes = 4 << 20;

std::unique_ptr<IoEngine> make_engine(const EngineSpec& e, bool direct, unsigned qd, bool coalesce,
                                      const fs::path& path) {
  IoEngineOptions o;
  o.backend = e.backend;
  o.direct = direct;
  o.n_threads = e.threads;
  o.n_rings = e.rings;
  o.queue_depth = qd;
  o.uring_batch_submit = e.batch_submit;
  o.coalesce = coalesce;
  // The block sweeps and limit rows measure raw reads: no coalescing, no splitting.
  o.max_read_bytes = coalesce ? g_max_read_bytes : uint64_t{1} << 40;
  o.direct_max_read_bytes = coalesce ? g_direct_max_read_bytes : uint64_t{1} << 40;
  auto eng = std::make_unique<IoEngine>(o);
  if (e.backend == IoBackend::kUring && eng->backend() != IoBackend::kUring)
    throw ConfigError("io_uring is not available here; cannot measure " + e.name);
  eng->add_file(path);
  return eng;
}

// measure()'s refresh for mmap on a cold cache: a mapping keeps faulted pages mapped, and mapped
// pages are not dropped, so the engine is dropped, the cache dropped, and the file mapped again.
std::function<void()> remap_cold(std::unique_ptr<IoEngine>& eng, const EngineSpec& es, unsigned qd, bool coalesce,
                                 const fs::path& path) {
  return [&eng, es, qd, coalesce, path] {
    eng.reset();
    drop_cache(path);
    eng = make_engine(es, false, qd, coalesce, path);
    // Let the new engine's worker threads park before the timed read starts.
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  };
}

// Throughput: batches of `batch` reads until `seconds` of read time; latency: one-read batches.
// `refresh` (may be empty) runs before every batch, outside the timed part: the mmap "device"
// cells use it to unmap and drop the page cache so that every batch faults from the device.
template <typename MakeBatch>
Cell measure(std::unique_ptr<IoEngine>& eng, MakeBatch make_batch, size_t batch, double seconds,
             const std::function<void()>& refresh = {}) {
  Cell c;
  std::vector<ReadRequest> reqs(batch);
  uint64_t bytes = 0, ops = 0, reads = 0;
  make_batch(reqs);
  eng->read(reqs);  // warm-up: bounce arena, fixed-buffer registration, first-touch faults
  double timed = 0;
  auto t_start = Clock::now();
  do {
    if (refresh) refresh();
    make_batch(reqs);
    eng->reset_stats();
    auto t = Clock::now();
    eng->read(reqs);
    timed += seconds_since(t);
    reads += eng->stats().reads_issued;
    for (auto& r : reqs) bytes += r.length;
    ops += reqs.size();
  } while (timed < seconds && seconds_since(t_start) < 20 * seconds);
  c.gbps = bytes / timed / 1e9;
  c.ops = ops;
  c.ops_per_s = ops / timed;
  c.reads_issued = reads;
  std::vector<double> lat;
  std::vector<ReadRequest> one(1);
  timed = 0;
  t_start = Clock::now();
  while ((timed < seconds / 2 && seconds_since(t_start) < 10 * seconds) || lat.size() < 5) {
    if (refresh) refresh();
    make_batch(reqs);
    one[0] = reqs[0];
    auto t = Clock::now();
    eng->read(one);
    lat.push_back(seconds_since(t) * 1e6);
    timed += lat.back() / 1e6;
  }
  set_latency(c, lat);
  return c;
}

void print_cell(const Cell& c) {
  std::printf("%-8s %-12s %-12s %-6s %8llu %9.2f %10.0f %10.1f %10.1f\n", c.section.c_str(),
              c.engine.c_str(), c.cache.c_str(), c.pattern.c_str(),
              static_cast<unsigned long long>(c.block), c.gbps, c.ops_per_s, c.lat_p50_us,
              c.lat_mean_us);
  std::fflush(stdout);
}

// c with its row labels, printed as it is measured.
Cell labelled(Cell c, std::string section, std::string engine, std::string cache, std::string pattern,
              uint64_t block) {
  c.section = std::move(section);
  c.engine = std::move(engine);
  c.cache = std::move(cache);
  c.pattern = std::move(pattern);
  c.block = block;
  print_cell(c);
  return c;
}

nlohmann::json to_json(const Cell& c) {
  return {{"section", c.section}, {"engine", c.engine}, {"cache", c.cache},
          {"pattern", c.pattern}, {"block_bytes", c.block}, {"gbps", c.gbps},
          {"ops_per_s", c.ops_per_s}, {"op_latency_us_p50", c.lat_p50_us},
          {"op_latency_us_mean", c.lat_mean_us}, {"ops", c.ops}, {"reads_issued", c.reads_issued}};
}

// One configuration of the O_DIRECT depth study: `streams` threads sharing one engine of that
// many lanes (max_batches_in_flight; rings split between them), each reading batches of k random
// distinct experts (one request per expert, no coalescing, reads split at max_read_bytes). With
// two streams a second batch is in flight when one drains, the way the expert store's read-ahead
// keeps the device queue full across batch boundaries.
struct DepthConfig {
  unsigned k = 8, streams = 1;
  uint64_t max_read = 1 << 20;
  std::vector<std::unique_ptr<IoEngine>> engines;
  std::vector<std::unique_ptr<AlignedBuf>> bufs;
  std::vector<std::mt19937_64> rngs;
  std::vector<double> round_gbps;

  void open(const fs::path& path, unsigned rings, unsigned qd, uint64_t stride, uint64_t seed) {
    IoEngineOptions o;
    o.backend = IoBackend::kUring;
    o.direct = true;
    o.n_rings = std::max(1u, rings / streams);
    o.queue_depth = qd;
    o.coalesce = false;
    o.max_read_bytes = max_read;
    o.direct_max_read_bytes = max_read;
    o.max_batches_in_flight = streams;
    engines.push_back(std::make_unique<IoEngine>(o));
    engines.back()->add_file(path);
    for (unsigned s = 0; s < streams; ++s) {
      bufs.push_back(std::make_unique<AlignedBuf>(stride * k));
      rngs.emplace_back(seed + s);
    }
  }

  // Reads `n_total` experts (split over the streams) and records the round's GB/s.
  void round(unsigned n_total, uint64_t expert_bytes, uint64_t stride, uint64_t n_experts) {
    const unsigned per_stream = std::max(k, n_total / streams / k * k);
    auto stream = [&](unsigned s) {
      std::vector<uint64_t> ids(n_experts);
      std::vector<ReadRequest> reqs(k);
      for (unsigned done = 0; done < per_stream; done += k) {
        random_expert_reads(reqs, ids, rngs[s], stride, expert_bytes, bufs[s]->data());
        engines[0]->read(reqs);
      }
    };
    auto t0 = Clock::now();
    std::vector<std::thread> th;
    for (unsigned s = 1; s < streams; ++s) th.emplace_back(stream, s);
    stream(0);
    for (auto& t : th) t.join();
    round_gbps.push_back(double(per_stream) * streams * expert_bytes / seconds_since(t0) / 1e9);
  }
};

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{"bench_io: read engine bandwidth and latency, page cache and device"};
  app.add_option("--file", a.file, "file to create and read (default: $TMPDIR/moestream_bench_io.bin)");
  app.add_option("--size-mb", a.size_mb, "file size in MiB");
  app.add_option("--threads", a.threads, "pread pool / mmap threads");
  app.add_option("--rings", a.rings, "io_uring rings for the several-ring engine");
  app.add_option("--qd", a.qd, "io_uring queue depth per ring");
  app.add_option("--batch", a.batch, "reads per batch in the block sweeps");
  app.add_option("--seconds", a.seconds, "measuring time per cell");
  app.add_option("--blocks", a.blocks, "block sizes (4K, 64K, 1M, ...)")->delimiter(',');
  app.add_option("--expert-bytes", a.expert_bytes, "expert payload bytes for the expert pattern");
  app.add_option("--top-k", a.top_k, "experts per layer batch in the expert pattern");
  app.add_option("--max-read-kb", a.max_read_kb, "engine max read size: coalescing cap and split size");
  app.add_option("--direct-max-read-kb", a.direct_max_read_kb, "the same for O_DIRECT reads");
  app.add_option("--json", a.json, "JSON output path");
  app.add_flag("--keep", a.keep, "keep the created file");
  app.add_flag("--no-device", a.no_device, "skip O_DIRECT / dropped-cache measurements");
  app.add_flag("--no-page-cache", a.no_page_cache, "skip page-cache measurements");
  app.add_flag("--no-sweep", a.no_sweep, "skip the block-size sweeps");
  app.add_flag("--uring-batch-submit", a.uring_batch_submit,
               "also measure the several-ring engine submitting each ring's share of a batch at "
               "once (rows uringN_bs; the engine's default submits one read at a time)");
  app.add_option("--hot-ab-rounds", a.hot_ab_rounds,
                 "page-cache expert pattern, pread pool vs io_uring rings measured in turn: N rounds");
  app.add_option("--depth-reps", a.depth_reps,
                 "O_DIRECT depth study (experts in flight x read size x streams): N interleaved rounds");
  bench::ProfileArgs prof;
  bench::add_profile_options(app, prof);
  CLI11_PARSE(app, argc, argv);
  g_max_read_bytes = a.max_read_kb << 10;
  g_direct_max_read_bytes = a.direct_max_read_kb << 10;

  try {
    const char* tmp = std::getenv("TMPDIR");
    fs::path path = a.file.empty() ? fs::path(tmp && *tmp ? tmp : "/tmp") / "moestream_bench_io.bin"
                                   : fs::path(a.file);
    const uint64_t file_bytes = a.size_mb << 20;
    bool created = false;
    if (!fs::exists(path) || fs::file_size(path) < file_bytes) {
      std::printf("creating %s (%llu MiB)\n", path.c_str(), static_cast<unsigned long long>(a.size_mb));
      create_file(path, file_bytes);
      created = true;
    }
    std::vector<uint64_t> blocks;
    for (auto& s : a.blocks) blocks.push_back(parse_size(s));
    unsigned hw = std::thread::hardware_concurrency();
    bool uring = io_uring_available();
    std::vector<EngineSpec> engines{{"pread1", IoBackend::kPread, 1, 1},
                                    {"pread" + std::to_string(a.threads), IoBackend::kPread, a.threads, 1},
                                    {"mmap" + std::to_string(a.threads), IoBackend::kMmap, a.threads, 1}};
    if (uring) {
      engines.push_back({"uring1", IoBackend::kUring, 1, 1});
      engines.push_back({"uring" + std::to_string(a.rings), IoBackend::kUring, 1, a.rings});
      if (a.uring_batch_submit)
        engines.push_back({"uring" + std::to_string(a.rings) + "_bs", IoBackend::kUring, 1, a.rings, true});
    } else {
      std::printf("io_uring unavailable here: io_uring rows skipped\n");
    }
    std::printf("machine: %u hardware threads; file %s, %llu MiB; batch %u, qd %u per ring\n", hw,
                path.c_str(), static_cast<unsigned long long>(a.size_mb), a.batch, a.qd);
    std::printf("%-8s %-12s %-12s %-6s %8s %9s %10s %10s %10s\n", "section", "engine", "cache",
                "pattern", "block", "GB/s", "ops/s", "p50_us", "mean_us");

    // ---- the device profile (latency, IOPS limit, bandwidth) for --io-profile
    if (prof.only && a.no_device) throw ConfigError("--profile-only measures the device: drop --no-device");
    std::optional<bench::ProfileRun> profile;
    if (!a.no_device) profile = bench::measure_io_profile(path, file_bytes, prof);
    if (profile && !prof.out.empty()) {
      save_io_profile(prof.out, profile->profile, profile->source.dump());
      std::printf("wrote the device profile %s\n", prof.out.c_str());
    }
    if (prof.only) {
      if (created && !a.keep) fs::remove(path);
      return 0;
    }
    std::vector<Cell> cells;
    std::mt19937_64 rng(7);
    // ---- block sweeps: coalescing off, so every request is one read
    for (int cold = 1; cold >= 0 && !a.no_sweep; --cold) {
      if (skipped(a, cold)) continue;
      if (!cold) std::printf("page cache warmed: %.1f%% of the file resident (cachestat/mincore)\n",
                             100 * warm_cache(path, file_bytes));
      for (const EngineSpec& es : engines) {
        bool is_mmap = es.backend == IoBackend::kMmap;
        const std::string cache = cache_label(cold, is_mmap);
        std::unique_ptr<IoEngine> eng = make_engine(es, cold != 0 && !is_mmap, a.qd, false, path);
        std::function<void()> refresh;
        if (is_mmap && cold) refresh = remap_cold(eng, es, a.qd, false, path);
        for (uint64_t bs : blocks) {
          AlignedBuf buf(bs * a.batch);
          for (int random = 0; random <= 1; ++random) {
            uint64_t n_blocks = file_bytes / bs;
            uint64_t cursor = (rng() % n_blocks);
            auto make = [&](std::vector<ReadRequest>& reqs) {
              for (size_t i = 0; i < reqs.size(); ++i) {
                uint64_t blk = random ? rng() % n_blocks : (cursor++ % n_blocks);
                reqs[i] = {0, blk * bs, bs, buf.data() + i * bs};
              }
            };
            Cell c = measure(eng, make, a.batch, a.seconds, refresh);
            cells.push_back(labelled(c, "sweep", es.name, cache, random ? "rand" : "seq", bs));
          }
        }
      }
    }

    // ---- expert pattern: a layer file of experts at 4 KiB aligned slots; top-k random distinct
    // experts per batch into separate buffers (what the expert store does), coalescing on.
    const uint64_t stride = (a.expert_bytes + 4095) / 4096 * 4096;
    const uint64_t n_experts = file_bytes / stride;
    std::vector<Cell> expert_cells;
    if (n_experts >= a.top_k && a.top_k > 0) {
      std::printf("expert pattern: %llu experts of %llu bytes (stride %llu), top-%u per batch\n",
                  static_cast<unsigned long long>(n_experts), static_cast<unsigned long long>(a.expert_bytes),
                  static_cast<unsigned long long>(stride), a.top_k);
      std::vector<EngineSpec> xengines = engines;
      xengines.insert(xengines.begin(), {"naive_loop", IoBackend::kPread, 1, 1});
      AlignedBuf buf(stride * std::max<uint64_t>(a.top_k, 64));
      for (int cold = 1; cold >= 0; --cold) {
        if (skipped(a, cold)) continue;
        if (!cold) warm_cache(path, file_bytes);
        for (const EngineSpec& es : xengines) {
          bool is_mmap = es.backend == IoBackend::kMmap;
          bool naive = es.name == "naive_loop";
          const std::string cache = cache_label(cold, is_mmap);
          // The physical-limit rows read 64 experts per batch at high queue depth, one read each
          // (no coalescing): the machine's limit for expert-sized reads.
          for (unsigned k : {a.top_k, 64u}) {
            bool limit = k != a.top_k;
            if (limit && (naive || is_mmap || es.name == "pread1" || es.name == "uring1")) continue;
            if (k > n_experts) continue;
            auto eng = make_engine(es, cold != 0 && !is_mmap, a.qd, !naive && !limit, path);
            std::function<void()> refresh;
            if (is_mmap && cold) refresh = remap_cold(eng, es, a.qd, true, path);
            std::vector<uint64_t> ids(n_experts);
            auto make = [&](std::vector<ReadRequest>& reqs) {
              random_expert_reads(reqs, ids, rng, stride, a.expert_bytes, buf.data());
            };
            Cell c;
            if (naive) {
              // One blocking pread per expert, no engine: the simplest possible expert store.
              int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (cold ? O_DIRECT : 0));
              if (fd < 0) throw_errno("cannot open", path);
              std::vector<ReadRequest> reqs(k);
              uint64_t bytes = 0, ops = 0;
              std::vector<double> lat;
              auto t0 = Clock::now();
              while (seconds_since(t0) < a.seconds) {
                make(reqs);
                for (auto& r : reqs) {
                  auto t = Clock::now();
                  uint64_t want = cold ? stride : r.length;  // O_DIRECT: whole aligned slot
                  if (::pread(fd, r.dest, want, static_cast<off_t>(r.offset)) != static_cast<ssize_t>(want))
                    throw_errno("short read in", path);
                  lat.push_back(seconds_since(t) * 1e6);
                  bytes += r.length;
                  ++ops;
                }
              }
              double el = seconds_since(t0);
              ::close(fd);
              c.gbps = bytes / el / 1e9;
              c.ops = c.reads_issued = ops;
              c.ops_per_s = ops / el;
              set_latency(c, lat);
            } else {
              c = measure(eng, make, k, a.seconds, refresh);
            }
            expert_cells.push_back(
                labelled(c, limit ? "limit" : "expert", es.name, cache, "top" + std::to_string(k), a.expert_bytes));
          }
        }
      }
    }

    // ---- O_DIRECT depth study: experts in flight (top-k per batch) x read size (split at 1 MiB
    // or whole experts) x streams (one batch at a time, or two batches in flight), repeated and
    // interleaved so that drift of a shared disk shows up as spread rather than as a trend.
    nlohmann::json depth = nlohmann::json::array();
    if (a.depth_reps > 0 && !a.no_device && uring && n_experts >= 64 && a.top_k > 0) {
      // Rounds: each configuration in turn reads 64 experts, so that a shared disk's drift hits
      // every configuration alike; per configuration the median over rounds, and the median of
      // its per-round ratio to the top-64 whole-expert reads of the same round.
      std::printf("depth study: uring %u rings, QD %u, O_DIRECT, %u rounds of 64 experts per "
                  "configuration, interleaved\n", a.rings, a.qd, a.depth_reps);
      std::vector<std::unique_ptr<DepthConfig>> cfgs;
      auto add = [&](unsigned k, uint64_t mr, unsigned streams) {
        cfgs.push_back(std::make_unique<DepthConfig>());
        cfgs.back()->k = k;
        cfgs.back()->max_read = mr;
        cfgs.back()->streams = streams;
        cfgs.back()->open(path, a.rings, a.qd, stride, 1000 + cfgs.size() * 10);
      };
      for (uint64_t mr : {uint64_t{1} << 20, stride})
        for (unsigned k : {1u, 8u, 16u, 32u, 64u}) add(k, mr, 1);
      for (uint64_t mr : {uint64_t{1} << 20, stride}) add(a.top_k, mr, 2);
      const size_t ref = 9;  // top-64, whole experts, one stream: the limit's pattern
      for (unsigned rep = 0; rep < a.depth_reps; ++rep)
        for (auto& c : cfgs) c->round(64, a.expert_bytes, stride, n_experts);
      std::printf("%-8s %-6s %-7s %-7s %8s %8s %8s %14s\n", "section", "top_k", "reads", "streams",
                  "median", "min", "max", "vs_top64_whole");
      for (auto& c : cfgs) {
        std::vector<double> ratio;
        for (size_t r = 0; r < c->round_gbps.size(); ++r)
          ratio.push_back(c->round_gbps[r] / cfgs[ref]->round_gbps[r]);
        std::string reads = c->max_read == stride ? "whole" : std::to_string(c->max_read >> 10) + "K";
        auto [mn, mx] = std::minmax_element(c->round_gbps.begin(), c->round_gbps.end());
        std::printf("depth    %-6u %-7s %-7u %8.2f %8.2f %8.2f %14.2f\n", c->k, reads.c_str(),
                    c->streams, median(c->round_gbps), *mn, *mx, median(ratio));
        depth.push_back({{"top_k", c->k}, {"max_read_bytes", c->max_read}, {"streams", c->streams},
                         {"gbps_rounds", c->round_gbps}, {"gbps_median", median(c->round_gbps)},
                         {"ratio_to_top64_whole_median", median(ratio)}});
      }
      std::fflush(stdout);
    }

    // ---- page-cache A/B: the expert pattern (top-k coalesced, top-64 limit) through the pread
    // pool and the several-ring engines, each measured for --seconds in turn, round after round,
    // so that a shared VM's drift shows up as spread rather than as a bias against whichever
    // cell ran at a bad moment; per configuration the median GB/s and the median of its
    // per-round ratio to the pread pool on the same pattern.
    nlohmann::json hot_ab = nlohmann::json::array();
    if (a.hot_ab_rounds > 0 && !a.no_page_cache && n_experts >= 64 && a.top_k > 0 &&
        a.top_k <= 64) {  // one buffer of 64 experts serves both patterns
      warm_cache(path, file_bytes);
      struct AbConfig {
        std::string engine;
        unsigned k;
        std::unique_ptr<IoEngine> eng;
        std::vector<double> gbps;
        size_t ref = 0;  // index of the pread configuration of the same pattern
      };
      std::vector<AbConfig> cfgs;
      for (unsigned k : {a.top_k, 64u}) {
        size_t ref = cfgs.size();
        for (const EngineSpec& es : engines) {
          bool pool = es.backend == IoBackend::kPread && es.name != "pread1";
          bool rings = es.backend == IoBackend::kUring && es.name != "uring1";
          if (!pool && !rings) continue;
          cfgs.push_back({es.name, k, make_engine(es, false, a.qd, k == a.top_k, path), {}, ref});
        }
      }
      AlignedBuf buf(stride * 64);
      std::vector<uint64_t> ids(n_experts);
      std::vector<ReadRequest> reqs;
      auto make = [&](unsigned k) {
        reqs.resize(k);
        random_expert_reads(reqs, ids, rng, stride, a.expert_bytes, buf.data());
      };
      for (AbConfig& c : cfgs) {  // warm-up: bounce arena, registrations, first-touch faults
        make(c.k);
        c.eng->read(reqs);
      }
      for (unsigned round = 0; round < a.hot_ab_rounds; ++round)
        for (AbConfig& c : cfgs) {
          double timed = 0;
          uint64_t bytes = 0;
          do {
            make(c.k);
            auto t = Clock::now();
            c.eng->read(reqs);
            timed += seconds_since(t);
            bytes += uint64_t{c.k} * a.expert_bytes;
          } while (timed < a.seconds);
          c.gbps.push_back(bytes / timed / 1e9);
        }
      std::printf("hot A/B: page cache, expert pattern, %u rounds of %.2f s per configuration, "
                  "interleaved\n", a.hot_ab_rounds, a.seconds);
      std::printf("%-8s %-12s %-6s %8s %8s %8s %14s\n", "section", "engine", "pattern", "median",
                  "min", "max", "vs_pread_pool");
      for (AbConfig& c : cfgs) {
        std::vector<double> ratio;
        for (size_t r = 0; r < c.gbps.size(); ++r) ratio.push_back(c.gbps[r] / cfgs[c.ref].gbps[r]);
        auto [mn, mx] = std::minmax_element(c.gbps.begin(), c.gbps.end());
        std::string pattern = "top" + std::to_string(c.k);
        std::printf("hotab    %-12s %-6s %8.2f %8.2f %8.2f %14.2f\n", c.engine.c_str(), pattern.c_str(),
                    median(c.gbps), *mn, *mx, median(ratio));
        hot_ab.push_back({{"engine", c.engine}, {"top_k", c.k}, {"gbps_rounds", c.gbps},
                          {"gbps_median", median(c.gbps)}, {"ratio_to_pread_pool_median", median(ratio)},
                          {"ratio_rounds", ratio}});
      }
      std::fflush(stdout);
    }

    // ---- residency probe cost: one query per expert of a layer (what the runtime asks per
    // layer per token), and checksum cost (XXH64 over expert payloads).
    nlohmann::json residency = nlohmann::json::object();
    for (ResidencyMethod m : {ResidencyMethod::kCachestat, ResidencyMethod::kMincore}) {
      if (m == ResidencyMethod::kCachestat && !cachestat_supported()) continue;
      PageCacheResidency probe(path, m);
      uint64_t n = std::min<uint64_t>(n_experts, 128);
      std::vector<ByteRange> ranges(n);
      for (uint64_t i = 0; i < n; ++i) ranges[i] = {i * stride, a.expert_bytes};
      std::vector<RangeResidency> out(n);
      int reps = 0;
      auto t0 = Clock::now();
      while (seconds_since(t0) < 0.2) {
        probe.query(ranges, out);
        ++reps;
      }
      double per_layer_us = seconds_since(t0) / reps * 1e6;
      std::printf("residency %-9s: %.1f us per query of %llu expert ranges (%.2f us per expert)\n",
                  std::string(residency_method_name(m)).c_str(), per_layer_us,
                  static_cast<unsigned long long>(n), per_layer_us / std::max<uint64_t>(n, 1));
      reps = 0;
      t0 = Clock::now();
      while (seconds_since(t0) < 0.2) {
        for (uint64_t i = 0; i < n; ++i) out[i] = probe.sample(ranges[i].offset, ranges[i].length, 4);
        ++reps;
      }
      double sampled_us = seconds_since(t0) / reps * 1e6;
      std::printf("residency %-9s: %.1f us per sampled query (4 pages per expert) of the same ranges\n",
                  std::string(residency_method_name(m)).c_str(), sampled_us);
      residency[std::string(residency_method_name(m))] = {
          {"experts", n}, {"us_per_layer_query", per_layer_us}, {"us_per_layer_sampled_4", sampled_us}};
    }
    double xxh_gbps = 0;
    {
      AlignedBuf buf(a.expert_bytes);
      int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0 || ::pread(fd, buf.data(), a.expert_bytes, 0) < 0) throw_errno("cannot read", path);
      ::close(fd);
      uint64_t sink = 0, bytes = 0;
      auto t0 = Clock::now();
      while (seconds_since(t0) < 0.2) {
        sink ^= XXH64(buf.data(), a.expert_bytes, 0);
        bytes += a.expert_bytes;
      }
      xxh_gbps = bytes / seconds_since(t0) / 1e9;
      std::printf("checksum XXH64: %.2f GB/s on one core (%.0f us per %llu-byte expert)%s\n", xxh_gbps,
                  a.expert_bytes / xxh_gbps / 1e3, static_cast<unsigned long long>(a.expert_bytes),
                  sink == 42 ? " " : "");
    }

    nlohmann::json j;
    utsname u{};
    ::uname(&u);
    j["machine"] = {{"hardware_threads", hw}, {"kernel", u.release}, {"io_uring", uring},
                    {"cachestat", cachestat_supported()}};
    j["params"] = {{"file_bytes", file_bytes}, {"threads", a.threads}, {"rings", a.rings},
                   {"queue_depth", a.qd}, {"batch", a.batch}, {"seconds_per_cell", a.seconds},
                   {"uring_batch_submit_rows", a.uring_batch_submit},
                   {"expert_bytes", a.expert_bytes}, {"top_k", a.top_k},
                   {"max_read_bytes", g_max_read_bytes},
                   {"direct_max_read_bytes", g_direct_max_read_bytes}};
    j["cache_legend"] = {{"page_cache", "buffered reads, file fully in the page cache"},
                         {"device", "O_DIRECT reads (the storage device or the VM's virtual disk)"},
                         {"device_mmap", "mmap page faults after POSIX_FADV_DONTNEED"}};
    for (auto& c : cells) j["sweep"].push_back(to_json(c));
    for (auto& c : expert_cells) j["expert"].push_back(to_json(c));
    j["residency"] = residency;
    j["depth_study"] = depth;
    j["hot_ab"] = hot_ab;
    j["checksum_xxh64_gbps_one_core"] = xxh_gbps;
    if (profile) j["profile"] = nlohmann::json::parse(io_profile_json(profile->profile, profile->source.dump()));
    write_file_atomic(a.json, j.dump(1));
    std::printf("wrote %s\n", a.json.c_str());
    if (created && !a.keep) fs::remove(path);
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_io: %s\n", e.what());
    return 1;
  }
  return 0;
}
