// The batch read engine: one call reads many (file, offset, length) ranges into caller buffers,
// sorted and coalesced, through io_uring (several rings), a pread thread pool, or mmap.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "loader/io/io_profile.h"

namespace moestream {

enum class IoBackend { kAuto, kUring, kPread, kMmap };

std::string_view io_backend_name(IoBackend b);     // "auto", "uring", "pread", "mmap"
IoBackend parse_io_backend(std::string_view name);  // throws ConfigError naming the bad value

// Outcome of one request after a batch.
enum class ReadResult : uint8_t {
  kPending,    // not executed (only seen inside a batch)
  kOk,         // all `length` bytes are in `dest`
  kTruncated,  // the file ended before offset + length (a read returned 0 bytes)
  kError,      // the read failed; `error` holds the errno
};

// One read. `file` is an index returned by IoEngine::add_file. `dest` must hold `length` bytes;
// it needs no alignment, even with O_DIRECT (unaligned pieces go through a bounce buffer, so
// 4 KiB aligned offsets, lengths and dests are what make O_DIRECT reads land in place).
struct ReadRequest {
  uint32_t file = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  void* dest = nullptr;
  // Filled by the engine.
  ReadResult result = ReadResult::kPending;
  int error = 0;  // errno for kError (EAGAIN when the retry bound ran out)
};

// Called once per request as soon as its final result is set (index = its position in the
// batch), from an engine worker thread, possibly concurrently; must not throw. The request's
// dest bytes are complete when result is kOk.
using RequestDoneFn = std::function<void(const ReadRequest&, size_t index)>;

// What the completion hook sees: one completed read (possibly the rest of a short read).
struct CompletionInfo {
  const std::string* path = nullptr;
  uint64_t offset = 0;   // file offset this read started at
  uint64_t length = 0;   // bytes it asked for
  int64_t result = 0;    // bytes read, or -errno
  uint32_t attempt = 0;  // 0 for the first completion of an extent, then 1, 2, ...
};

// Test-only seam: sees every completion before the engine acts on it and returns the result to
// act on (a smaller count = short read, 0 = EOF, -EIO, -EAGAIN, ...). Called concurrently from
// the engine's worker threads, so it must be thread-safe.
using CompletionHook = std::function<int64_t(const CompletionInfo&)>;

struct IoEngineOptions {
  IoBackend backend = IoBackend::kAuto;  // kAuto: io_uring, else pread with a notice
  bool direct = false;          // O_DIRECT; per file falls back to buffered with a notice
  uint32_t queue_depth = 32;    // reads in flight per ring
  uint32_t n_rings = 0;         // io_uring rings, each driven by its own thread; 0: auto
  uint32_t n_threads = 0;       // pread / mmap worker threads; 0: auto
  bool coalesce = true;
  uint64_t coalesce_gap_bytes = 64 << 10;  // read through gaps up to this size to save an op
  // A coalesced read whose dests are not one contiguous buffer: a vectored read (readv) straight
  // into each dest when true, else one read into a bounce buffer and a copy.
  bool scatter = true;
  // Coalesced reads stop growing at this size, and a longer request is split into reads of this
  // size so that one large expert keeps several queue slots (and rings) busy. 1 MiB reads keep
  // an NVMe drive at full bandwidth once a few are in flight.
  uint64_t max_read_bytes = 1 << 20;
  // The same cap for files read with O_DIRECT (0: max_read_bytes). Device reads gain nothing
  // from pieces spread over rings, and whole experts read faster than 1 MiB pieces (bench_io
  // depth study on the dev VM: top-8 batches 0.80-0.84 vs 0.69-0.80 of the limit); 4 MiB is
  // the virtio disks' max_sectors_kb, and holds a 2.65 MB q4 expert of Qwen3-30B-A3B whole.
  uint64_t direct_max_read_bytes = 4 << 20;
  // Batches that may run at once (each on its own rings or threads and bounce buffer), so a
  // caller with a next batch in hand keeps the device queue full across the first one's tail:
  // one batch stream of top-8 experts reached 69-80% of the top-64 O_DIRECT limit on the dev
  // VM, two streams 97-99% (bench_io depth study).
  uint32_t max_batches_in_flight = 1;
  // The device's profile (bench_io --profile-out; loader/io/io_profile.h): when set, each batch
  // decides which gaps to read through from the profile's costs instead of coalesce_gap_bytes,
  // and O_DIRECT reads may grow past direct_max_read_bytes (io::MergeRule, docs/io_engine.md
  // "Merge rule"). Empty: the fixed gap and caps above.
  std::optional<IoProfile> profile;
  uint32_t max_retries = 16;    // per extent bound on -EAGAIN/-EINTR (and no-progress) retries
  bool register_files = true;   // io_uring fixed files where the kernel allows
  bool register_buffers = true; // io_uring fixed bounce buffers where the kernel allows
  // io_uring: each ring submits its whole share of a batch in one io_uring_enter instead of one
  // read per submission. Fewer system calls, but page-cache hits (copied inside the submission)
  // then balance worse over the rings (io_uring_backend.cpp); kept for A/B runs
  // (bench_io --uring-batch-submit).
  bool uring_batch_submit = false;
  // Test seams: pretend io_uring_queue_init failed with this errno (e.g. EPERM), or that the
  // filesystem refused O_DIRECT with this errno (e.g. EINVAL); 0 = off.
  int simulate_uring_init_errno = 0;
  int simulate_direct_errno = 0;
  // Test seam: every io_uring submission fails with this errno (the ring rescue path); 0 = off.
  int simulate_submit_errno = 0;
  CompletionHook completion_hook;  // test seam, see above
  // Receives one-line notices (fallbacks). Default: "moestream: <line>" on stderr.
  std::function<void(const std::string&)> notice;
};

struct IoEngineStats {
  uint64_t batches = 0;
  uint64_t requests = 0;
  uint64_t reads_issued = 0;       // extents after coalescing (first submissions)
  uint64_t bytes_requested = 0;
  uint64_t bytes_read = 0;         // bytes transferred, including gaps read through
  uint64_t bounce_bytes = 0;       // bytes that went through a bounce buffer
  uint64_t scatter_reads = 0;      // coalesced reads that used readv into the dests
  uint64_t short_reads = 0;        // short reads whose rest was resubmitted
  uint64_t retries = 0;            // -EAGAIN/-EINTR resubmissions
  uint64_t failed_requests = 0;
};

class IoEngine {
 public:
  explicit IoEngine(IoEngineOptions opts = {});
  ~IoEngine();
  IoEngine(const IoEngine&) = delete;
  IoEngine& operator=(const IoEngine&) = delete;

  // Opens `path` read-only (O_DIRECT when asked and the filesystem allows); returns its index.
  // Throws IoError naming the path.
  uint32_t add_file(const std::filesystem::path& path);
  const std::string& file_path(uint32_t file) const;
  uint64_t file_size(uint32_t file) const;  // size at add_file time
  bool file_is_direct(uint32_t file) const;
  uint32_t n_files() const;  // files added so far

  // Executes the batch and fills each request's result/error; never throws for I/O outcomes.
  // Returns the number of failed requests. Up to max_batches_in_flight calls from different
  // threads run at once; more wait for one of them to finish.
  size_t submit(std::span<ReadRequest> batch);
  // Same, reporting each request through `on_done` as soon as it lands, so a caller waiting on
  // another thread can use the first experts while the rest of the batch is still in flight.
  size_t submit(std::span<ReadRequest> batch, const RequestDoneFn& on_done);

  // submit(), then one IoError for the whole batch naming the first failure's file, offset,
  // length and error, and how many requests failed.
  void read(std::span<ReadRequest> batch);

  IoBackend backend() const;  // the backend in use after any fallback: kUring, kPread or kMmap
  const IoEngineOptions& options() const;
  IoEngineStats stats() const;
  void reset_stats();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// True when io_uring_queue_init works here (probe with a tiny ring).
bool io_uring_available(int* err = nullptr);

}  // namespace moestream
