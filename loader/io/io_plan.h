// The read engine's planner: turns a batch of requests into sorted, coalesced extents, and
// decides what each completion means (done, resubmit the rest, retry, fail). No I/O here.
// plan_file_reads (the coalescing and read-cap rule alone) is also the clusterer's cost model
// (cluster/io_cost_model), so the two cannot drift; the rest is internal to the engine.
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "loader/io/io_engine.h"

namespace moestream::io {

inline constexpr uint64_t kDirectAlign = 4096;  // O_DIRECT offset/length/buffer alignment

struct FileEntry {
  std::string path;
  int fd = -1;         // the fd reads go through (O_DIRECT when `direct`)
  int buffered_fd = -1;  // a buffered fd (same as fd unless direct); mmap and residency use it
  bool direct = false;
  uint64_t size = 0;
};

// A piece of a request inside an extent: the whole request, or one chunk of a split request.
struct ReadSlice {
  uint32_t request = 0;
  uint64_t buf_offset = 0;  // the piece starts at extent.buf + buf_offset
  uint64_t req_offset = 0;  // ... and goes to request.dest + req_offset
  uint64_t length = 0;
  // Set by finish_extent (by the worker that ran the extent), read by apply_results.
  ReadResult result = ReadResult::kPending;
  int error = 0;
};

struct Extent {
  uint32_t file = 0;
  uint64_t offset = 0;   // file offset of the read
  uint64_t length = 0;   // bytes asked for (aligned up for O_DIRECT)
  uint64_t needed = 0;   // bytes that must arrive; less than length only for O_DIRECT padding
  uint8_t* buf = nullptr;  // a request's dest (direct placement) or a bounce buffer
  uint64_t bounce_offset = 0;  // offset of buf in the bounce arena when bounce
  bool bounce = false;
  // Scatter: one vectored read straight into each request's dest, gaps into a sink buffer.
  bool scatter = false;
  uint32_t first_iov = 0, n_iov_max = 0;  // this extent's iovec slots in IoPlan::iovs
  uint32_t first_slice = 0, n_slices = 0;
  // Progress, owned by whichever worker runs the extent.
  uint64_t done = 0;
  uint32_t attempts = 0;  // completions seen
  uint32_t retries = 0;   // retries without progress (EAGAIN/EINTR or unaligned short reads)
  ReadResult result = ReadResult::kPending;
  int error = 0;
};

struct IoPlan {
  std::vector<Extent> extents;
  std::vector<ReadSlice> slices;
  std::vector<iovec> iovs;    // scatter extents' iovecs, rebuilt from `done` before each read
  uint64_t bounce_bytes = 0;  // arena size the extents with bounce=true need
  // Per-request completion tracking, set up by track_requests() when the caller wants each
  // request reported as soon as its last slice lands (hit/miss overlap in the expert store).
  std::unique_ptr<std::atomic<uint32_t>[]> slices_left;  // per request
  std::unique_ptr<std::atomic<int64_t>[]> first_failed;  // per request: slice index, or -1
  const RequestDoneFn* on_done = nullptr;
};

// The run-time merge rule a device profile gives (IoEngineOptions::profile; docs/io_engine.md
// "Device profiles and the merge rule"). A batch of n reads moving b bytes, the longest s, is
// modelled as taking
//   T = max(n * c(n), op_latency + max(b / bandwidth, s / single_read_bandwidth)),
//   c(n) = max(1 / iops_limit, op_latency / min(n, depth))
// (reads overlap up to the queue depth but never beat the IOPS limit; the bytes arrive after one
// latency, never faster than the bandwidth, and no read ends before it has moved its own bytes
// at the rate of one read alone).
// Merging two reads across a gap of g bytes saves one op, moves g bytes more and makes one read
// longer; the planner merges the smallest gaps first (touching neighbours, g = 0, before any
// other) for as long as that lowers T: while g / bandwidth is below the op it saves and the batch
// is bound by ops, not bytes, and the merged read does not outlast the parallel ones.
struct MergeRule {
  bool enabled = false;
  double op_latency_us = 0;
  double op_floor_us = 0;   // 1e6 / iops_limit
  double bytes_per_us = 0;  // bandwidth
  double single_bytes_per_us = 0;  // single_read_gbps
  uint32_t depth = 1;       // reads one batch can keep in flight (the engine's queue depth)
  // Cap of O_DIRECT reads under the rule, for merges and splits alike: the model never gains from
  // splitting, and the block layer spreads a large O_DIRECT read over the device queue itself.
  uint64_t direct_max_read_bytes = 0;
};

// Cap of O_DIRECT reads under a merge rule (unless direct_max_read_bytes is larger): bounds the
// bounce space and iovecs of one merged read.
inline constexpr uint64_t kMergeRuleDirectMaxReadBytes = uint64_t(32) << 20;

struct PlanOptions {
  bool coalesce = true;
  uint64_t gap_bytes = 0;
  uint64_t max_read_bytes = 0;
  uint64_t direct_max_read_bytes = 0;  // for O_DIRECT files; 0: max_read_bytes
  bool scatter = true;      // vectored reads for coalesced non-contiguous dests
  uint64_t sink_bytes = 0;  // size of the gap sink buffer (gaps are cut into pieces this big)
  MergeRule merge;          // enabled: replaces gap_bytes per batch (and the O_DIRECT cap)
};

// The planner's options from the engine's: the one translation, used by the engine and by the
// clusterer's cost model.
PlanOptions plan_options(const IoEngineOptions& o, uint64_t sink_bytes = 0);

// One request's bytes in a file, as the coalescing rule sees it.
struct ByteRange {
  uint64_t offset = 0;
  uint64_t length = 0;
};

// The modelled time of a batch of `n_reads` reads moving `bytes`, the longest `longest_bytes`,
// under rule `m` (see MergeRule).
double batch_read_us(uint64_t n_reads, uint64_t bytes, uint64_t longest_bytes, const MergeRule& m);

// The gap the rule merges across in one batch of `ranges` (one file's, sorted by offset): the
// largest gap between neighbours that it merges, smallest first, while that does not raise
// batch_read_us (at equal time fewer reads win); 0: only touching (and overlapping) neighbours
// merge; -1: only overlapping ones.
int64_t merge_gap_bytes(std::span<const ByteRange> ranges, const MergeRule& m);

// One read the planner issues: ranges [first, first + count) of its input (count is 1 for each
// piece of a split range), the file bytes [offset, offset + length) it asks for (aligned for
// O_DIRECT), and how many of them must arrive (`needed`, less than length only for the padding).
struct PlannedRead {
  uint32_t first = 0, count = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t needed = 0;
};

// The coalescing and read-cap rule, without files or buffers: groups one file's `ranges`
// (sorted by offset, each of non-zero length) into reads and calls emit(const PlannedRead&) for
// each, in file order. With opts.coalesce a read grows while the next range starts within
// the gap of its end and it stays within the cap (direct_max_read_bytes when `direct` and set,
// else max_read_bytes); a lone range over the cap is split into cap-sized pieces (block-aligned
// for O_DIRECT), which then run on different rings/threads at once: one big expert otherwise
// occupies a single queue slot and cannot use the device's parallelism. The gap is gap_bytes,
// or with opts.merge enabled merge_gap_bytes of this call's ranges (one batch's reads of a file),
// and O_DIRECT reads are then capped at opts.merge.direct_max_read_bytes. plan_reads builds its
// extents from exactly these reads. A template so that the cost model's inner loop inlines it.
template <class Emit>
void plan_file_reads(std::span<const ByteRange> ranges, bool direct, const PlanOptions& opts,
                     Emit&& emit) {
  const bool rule = opts.coalesce && opts.merge.enabled;
  const uint64_t max_read = direct && rule ? opts.merge.direct_max_read_bytes
                            : direct && opts.direct_max_read_bytes > 0 ? opts.direct_max_read_bytes
                                                                       : opts.max_read_bytes;
  // -1: not even touching ranges merge (only overlapping ones, which must).
  const int64_t gap = rule ? merge_gap_bytes(ranges, opts.merge) : static_cast<int64_t>(opts.gap_bytes);
  auto down = [&](uint64_t x) { return direct ? x / kDirectAlign * kDirectAlign : x; };
  auto up = [&](uint64_t x) { return direct ? (x + kDirectAlign - 1) / kDirectAlign * kDirectAlign : x; };
  size_t b = 0;
  while (b < ranges.size()) {
    const uint64_t start = ranges[b].offset;
    uint64_t end = start + ranges[b].length;
    size_t e = b + 1;
    if (opts.coalesce) {
      while (e < ranges.size()) {
        const ByteRange& r = ranges[e];
        // Gap too wide: a separate read is cheaper.
        if (gap < 0 ? r.offset >= end : r.offset > end + static_cast<uint64_t>(gap)) break;
        const uint64_t new_end = r.offset + r.length > end ? r.offset + r.length : end;
        if (new_end - start > max_read) break;
        end = new_end;
        ++e;
      }
    }
    if (e - b == 1 && end - start > max_read) {
      uint64_t chunk = max_read;
      if (direct) chunk = chunk < kDirectAlign ? kDirectAlign : down(chunk);
      for (uint64_t cs = down(start), re = up(end); cs < re; cs += chunk) {
        const uint64_t ce = cs + chunk < re ? cs + chunk : re;
        emit(PlannedRead{static_cast<uint32_t>(b), 1, cs, ce - cs, (ce < end ? ce : end) - cs});
      }
    } else {
      const uint64_t off = down(start);
      emit(PlannedRead{static_cast<uint32_t>(b), static_cast<uint32_t>(e - b), off, up(end) - off, end - off});
    }
    b = e;
  }
}

// Largest gap sink a plan may ask for: gaps are at most gap_bytes plus O_DIRECT padding.
inline uint64_t sink_bytes_for(uint64_t gap_bytes) {
  return (gap_bytes + 3 * kDirectAlign) / kDirectAlign * kDirectAlign;
}

// Sorts `reqs` by (file, offset) and groups each file's requests into extents with
// plan_file_reads (at most max_read_bytes, direct_max_read_bytes for O_DIRECT files; a longer
// request is split into several extents). Extents whose requests' dests
// are exactly contiguous (and aligned enough for O_DIRECT) read in place; extents of
// non-overlapping requests (block-aligned for O_DIRECT) scatter; the rest get a bounce range
// [bounce_offset, +length) with buf left null until the caller binds the arena.
// Zero-length requests get no extent and are marked kOk. Throws ConfigError for a request
// naming a file index out of range or a null dest.
IoPlan plan_reads(std::span<ReadRequest> reqs, std::span<const FileEntry> files,
                  const PlanOptions& opts);

// What to do after a completion.
enum class Step { kDone, kResubmit, kFailed };

struct CompletionCounters {
  uint64_t short_reads = 0;
  uint64_t retries = 0;
};

// Applies the hook, then one completion result `res` (bytes or -errno) to extent `e`:
// progress -> kDone when `needed` bytes are in, else kResubmit the rest; 0 bytes -> kFailed
// (kTruncated); -EAGAIN/-EINTR -> kResubmit until max_retries; other -errno -> kFailed.
// Never throws.
Step on_completion(Extent& e, int64_t res, const FileEntry& f, const IoEngineOptions& opts,
                   CompletionCounters& counters);

// Fills the extent's iovec slots for the bytes [done, length) (dests and gap pieces into
// `sink`) and returns how many it used.
uint32_t build_iovecs(const Extent& e, IoPlan& plan, std::span<const ReadRequest> reqs,
                      uint8_t* sink, uint64_t sink_bytes);

// Where the next read of a resubmitted extent starts and how long it is.
inline uint64_t next_offset(const Extent& e) { return e.offset + e.done; }
inline uint64_t next_length(const Extent& e) { return e.length - e.done; }
inline uint8_t* next_buf(const Extent& e) { return e.buf + e.done; }

// Arms per-request tracking: finish_extent() then gives each request its final result and calls
// `on_done` (which must outlive the batch) once its last slice is finished. Requests without
// slices (zero length) are reported here at once.
void track_requests(IoPlan& plan, std::span<ReadRequest> reqs, const RequestDoneFn* on_done);

// Copies a finished bounce extent's bytes into its requests' dests and records each slice's
// outcome. Touches only this extent's slices, so workers may finish extents concurrently.
void finish_extent(const Extent& e, IoPlan& plan, std::span<ReadRequest> reqs);

// After every extent is finished: a request is kOk when all its slices are, else it takes the
// first failed slice's result and errno.
void apply_results(const IoPlan& plan, std::span<ReadRequest> reqs);

}  // namespace moestream::io
