// Batch planning (sort, coalesce, in-place vs bounce) and completion outcomes for the read
// engine; shared by every backend so that all of them treat short reads and errors alike.
#include "loader/io/io_plan.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <numeric>

#include "common/error.h"

namespace moestream::io {
namespace {

uint64_t align_down(uint64_t x, uint64_t a) { return x / a * a; }
uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

// True when the group's requests tile [start, end) exactly and their dests are one contiguous
// buffer in the same order: the read can land in place.
bool contiguous(std::span<ReadRequest> reqs, const std::vector<uint32_t>& order, size_t b,
                size_t e) {
  for (size_t i = b + 1; i < e; ++i) {
    const ReadRequest& p = reqs[order[i - 1]];
    const ReadRequest& r = reqs[order[i]];
    if (r.offset != p.offset + p.length) return false;
    if (static_cast<uint8_t*>(r.dest) != static_cast<uint8_t*>(p.dest) + p.length) return false;
  }
  return true;
}

// Requests sorted by offset that do not overlap (gaps allowed), and for O_DIRECT are whole
// blocks in aligned dests: a vectored read can land each of them in place.
bool scatterable(std::span<ReadRequest> reqs, const std::vector<uint32_t>& order, size_t b,
                 size_t e, bool direct) {
  for (size_t i = b; i < e; ++i) {
    const ReadRequest& r = reqs[order[i]];
    if (i > b) {
      const ReadRequest& p = reqs[order[i - 1]];
      if (r.offset < p.offset + p.length) return false;
    }
    if (direct && (r.offset % kDirectAlign || r.length % kDirectAlign ||
                   reinterpret_cast<uintptr_t>(r.dest) % kDirectAlign))
      return false;
  }
  return true;
}

// iovecs a scatter extent needs: one per request plus the gap pieces. A resubmission from
// `done` only drops or shortens leading entries, so it never needs more.
uint32_t max_iovecs(std::span<ReadRequest> reqs, const std::vector<uint32_t>& order, size_t b,
                    size_t e, uint64_t start, uint64_t end, uint64_t sink_bytes) {
  uint64_t n = 0, pos = start;
  for (size_t i = b; i < e; ++i) {
    const ReadRequest& r = reqs[order[i]];
    if (r.offset > pos) n += (r.offset - pos + sink_bytes - 1) / sink_bytes;
    ++n;
    pos = r.offset + r.length;
  }
  if (end > pos) n += (end - pos + sink_bytes - 1) / sink_bytes;
  return static_cast<uint32_t>(n);
}

constexpr uint32_t kMaxIovecs = 1024;  // IOV_MAX on Linux

void add_bounce(IoPlan& plan, Extent& x) {
  x.bounce = true;
  x.bounce_offset = plan.bounce_bytes;
  plan.bounce_bytes += align_up(x.length, kDirectAlign);
}

// One extent from a planned read over requests order[b, b + pr.count) of one file, with a slice
// per request (the part of it the read covers: all of it unless the read is a split piece).
void add_extent(IoPlan& plan, std::span<ReadRequest> reqs, const std::vector<uint32_t>& order,
                size_t b, const PlannedRead& pr, const FileEntry& f, const PlanOptions& opts) {
  const size_t e = b + pr.count;
  Extent x;
  x.file = reqs[order[b]].file;
  x.offset = pr.offset;
  x.length = pr.length;
  x.needed = pr.needed;
  x.first_slice = static_cast<uint32_t>(plan.slices.size());
  x.n_slices = pr.count;
  const uint64_t read_end = x.offset + x.length;
  for (size_t i = b; i < e; ++i) {
    const ReadRequest& r = reqs[order[i]];
    const uint64_t from = std::max(x.offset, r.offset);
    const uint64_t to = std::min(read_end, r.offset + r.length);
    plan.slices.push_back({order[i], from - x.offset, from - r.offset, to - from});
  }
  const ReadSlice& first = plan.slices[x.first_slice];
  uint8_t* dest = static_cast<uint8_t*>(reqs[order[b]].dest) + first.req_offset;
  // In place: no padding or gap at either end, and the dests tile one buffer in file order.
  bool in_place = first.buf_offset == 0 && x.needed == x.length && contiguous(reqs, order, b, e);
  if (in_place && f.direct) in_place = reinterpret_cast<uintptr_t>(dest) % kDirectAlign == 0;
  uint32_t n_iov = 0;
  if (!in_place && opts.scatter && e - b > 1 && opts.sink_bytes > 0 &&
      scatterable(reqs, order, b, e, f.direct))
    n_iov = max_iovecs(reqs, order, b, e, x.offset, read_end, opts.sink_bytes);
  if (in_place) {
    x.buf = dest;
  } else if (n_iov > 0 && n_iov <= kMaxIovecs) {
    x.scatter = true;
    x.first_iov = static_cast<uint32_t>(plan.iovs.size());
    x.n_iov_max = n_iov;
    plan.iovs.resize(plan.iovs.size() + n_iov);
  } else {
    add_bounce(plan, x);
  }
  plan.extents.push_back(x);
}

}  // namespace

PlanOptions plan_options(const IoEngineOptions& o, uint64_t sink_bytes) {
  PlanOptions p{o.coalesce, o.coalesce_gap_bytes, o.max_read_bytes, o.direct_max_read_bytes,
                o.scatter, sink_bytes, {}};
  if (o.profile) {
    const IoProfile& d = *o.profile;
    MOE_ASSERT(d.op_latency_us > 0 && d.iops_limit > 0 && d.bandwidth_gbps > 0 && d.single_read_gbps > 0,
               "unvalidated I/O profile");
    p.merge.enabled = true;
    p.merge.op_latency_us = d.op_latency_us;
    p.merge.op_floor_us = 1e6 / d.iops_limit;
    p.merge.bytes_per_us = d.bandwidth_gbps * 1e3;
    p.merge.single_bytes_per_us = d.single_read_gbps * 1e3;
    p.merge.depth = std::max(1u, o.queue_depth);
    p.merge.direct_max_read_bytes = std::max(o.direct_max_read_bytes, kMergeRuleDirectMaxReadBytes);
  }
  return p;
}

double batch_read_us(uint64_t n_reads, uint64_t bytes, uint64_t longest_bytes, const MergeRule& m) {
  if (n_reads == 0) return 0;
  const double in_flight = double(std::min<uint64_t>(n_reads, m.depth));
  const double per_op = std::max(m.op_floor_us, m.op_latency_us / in_flight);
  // A batch's bytes arrive after one latency, at the device's bandwidth, or at one read's rate
  // for its longest read, whichever ends last.
  const double transfer = std::max(double(bytes) / m.bytes_per_us, double(longest_bytes) / m.single_bytes_per_us);
  return std::max(double(n_reads) * per_op, m.op_latency_us + transfer);
}

int64_t merge_gap_bytes(std::span<const ByteRange> ranges, const MergeRule& m) {
  const size_t n = ranges.size();
  if (n < 2) return 0;
  // Groups of overlapping ranges (which always merge) as [start, end) spans, the gaps between
  // neighbouring groups, and the gaps' order (smallest first, earlier first among equals). Sized
  // by one batch's reads of a file; reused, as the cost model calls this per priced token.
  thread_local std::vector<uint64_t> start, end;
  thread_local std::vector<uint32_t> order, left;  // left: the group a merged group starts at
  start.assign(1, ranges[0].offset);
  end.assign(1, ranges[0].offset + ranges[0].length);
  uint64_t bytes = ranges[0].length;
  for (size_t i = 1; i < n; ++i) {
    const ByteRange& r = ranges[i];
    bytes += r.length;
    if (r.offset < end.back()) {
      end.back() = std::max(end.back(), r.offset + r.length);
    } else {
      start.push_back(r.offset);
      end.push_back(r.offset + r.length);
    }
  }
  const size_t groups = start.size();
  if (groups < 2) return 0;
  order.resize(groups - 1);
  std::iota(order.begin(), order.end(), 0u);
  auto gap = [&](uint32_t g) { return start[g + 1] - end[g]; };
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return gap(a) < gap(b); });
  left.resize(groups);
  std::iota(left.begin(), left.end(), 0u);
  auto first_of = [&](uint32_t g) {
    while (left[g] != g) g = left[g] = left[left[g]];
    return g;
  };
  // The span of a merged group: from its first group's start to its last group's end.
  thread_local std::vector<uint64_t> span_end;
  span_end = end;
  uint64_t longest = 0;
  for (size_t g = 0; g < groups; ++g) longest = std::max(longest, end[g] - start[g]);
  uint64_t reads = groups;
  int64_t best_gap = -1;
  double best = batch_read_us(reads, bytes, longest, m);
  for (size_t k = 0; k < order.size(); ++k) {
    const uint32_t g = order[k];
    const uint64_t gk = gap(g);
    // Join group g's merged group with the one starting at g + 1 (file order keeps them neighbours).
    const uint32_t a = first_of(g);
    left[g + 1] = a;
    span_end[a] = span_end[g + 1];
    --reads;
    bytes += gk;
    longest = std::max(longest, span_end[a] - start[a]);
    if (k + 1 < order.size() && gap(order[k + 1]) == gk) continue;  // equal gaps go together
    // At equal modelled time the fewer reads win: each costs a system call and a completion,
    // and a volume billed per operation counts it.
    const double t = batch_read_us(reads, bytes, longest, m);
    if (t <= best) {
      best = t;
      best_gap = static_cast<int64_t>(gk);
    }
  }
  return best_gap;
}

IoPlan plan_reads(std::span<ReadRequest> reqs, std::span<const FileEntry> files,
                  const PlanOptions& opts) {
  IoPlan plan;
  std::vector<uint32_t> order;
  order.reserve(reqs.size());
  for (uint32_t i = 0; i < reqs.size(); ++i) {
    ReadRequest& r = reqs[i];
    r.error = 0;
    if (r.file >= files.size())
      throw ConfigError("read request " + std::to_string(i) + ": file index " +
                        std::to_string(r.file) + " not added (engine has " +
                        std::to_string(files.size()) + " files)");
    if (r.offset + r.length < r.offset)
      throw ConfigError("read request " + std::to_string(i) + " on " + files[r.file].path +
                        ": offset " + std::to_string(r.offset) + " + length overflows");
    if (r.length == 0) {
      r.result = ReadResult::kOk;
      continue;
    }
    if (r.dest == nullptr)
      throw ConfigError("read request " + std::to_string(i) + " on " + files[r.file].path +
                        ": null destination");
    r.result = ReadResult::kPending;
    order.push_back(i);
  }
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    const ReadRequest& x = reqs[a];
    const ReadRequest& y = reqs[b];
    if (x.file != y.file) return x.file < y.file;
    if (x.offset != y.offset) return x.offset < y.offset;
    return a < b;
  });

  std::vector<ByteRange> ranges;
  ranges.reserve(order.size());
  size_t b = 0;
  while (b < order.size()) {
    const uint32_t file = reqs[order[b]].file;
    size_t e = b;
    ranges.clear();
    for (; e < order.size() && reqs[order[e]].file == file; ++e)
      ranges.push_back({reqs[order[e]].offset, reqs[order[e]].length});
    plan_file_reads(ranges, files[file].direct, opts, [&](const PlannedRead& pr) {
      add_extent(plan, reqs, order, b + pr.first, pr, files[file], opts);
    });
    b = e;
  }
  return plan;
}

Step on_completion(Extent& e, int64_t res, const FileEntry& f, const IoEngineOptions& opts,
                   CompletionCounters& counters) {
  if (opts.completion_hook) {
    CompletionInfo info{&f.path, next_offset(e), next_length(e), res, e.attempts};
    res = opts.completion_hook(info);
  }
  ++e.attempts;
  if (res > 0) {
    uint64_t got = std::min<uint64_t>(static_cast<uint64_t>(res), next_length(e));
    uint64_t before = e.done;
    e.done += got;
    if (e.done >= e.needed) {
      e.result = ReadResult::kOk;
      return Step::kDone;
    }
    ++counters.short_reads;
    if (f.direct && (e.offset + e.done) % kDirectAlign != 0) {
      // O_DIRECT resubmissions must start aligned; an unaligned end at or past the known size is
      // the end of the file, and the next read would return 0.
      if (e.offset + e.done >= f.size) {
        e.result = ReadResult::kTruncated;
        return Step::kFailed;
      }
      e.done = align_down(e.offset + e.done, kDirectAlign) - e.offset;
      if (e.done <= before && ++e.retries > opts.max_retries) {
        e.result = ReadResult::kError;
        e.error = EIO;
        return Step::kFailed;
      }
    }
    return Step::kResubmit;
  }
  if (res == 0) {
    e.result = ReadResult::kTruncated;
    return Step::kFailed;
  }
  int err = static_cast<int>(-res);
  if ((err == EAGAIN || err == EINTR) && e.retries < opts.max_retries) {
    ++e.retries;
    ++counters.retries;
    return Step::kResubmit;
  }
  e.result = ReadResult::kError;
  e.error = err;
  return Step::kFailed;
}

uint32_t build_iovecs(const Extent& e, IoPlan& plan, std::span<const ReadRequest> reqs,
                      uint8_t* sink, uint64_t sink_bytes) {
  iovec* out = plan.iovs.data() + e.first_iov;
  uint32_t n = 0;
  uint64_t pos = e.done;  // position inside the extent
  auto gap = [&](uint64_t to) {
    while (pos < to) {
      uint64_t piece = std::min(to - pos, sink_bytes);
      out[n++] = {sink, piece};
      pos += piece;
    }
  };
  for (uint32_t s = e.first_slice; s < e.first_slice + e.n_slices; ++s) {
    const ReadSlice& sl = plan.slices[s];
    const ReadRequest& r = reqs[sl.request];
    uint64_t end = sl.buf_offset + sl.length;
    if (end <= pos) continue;
    gap(sl.buf_offset);
    uint64_t skip = pos - sl.buf_offset;
    out[n++] = {static_cast<uint8_t*>(r.dest) + sl.req_offset + skip, sl.length - skip};
    pos = end;
  }
  gap(e.length);
  MOE_ASSERT(n <= e.n_iov_max, "scatter extent needs more iovecs than planned");
  return n;
}

void track_requests(IoPlan& plan, std::span<ReadRequest> reqs, const RequestDoneFn* on_done) {
  plan.on_done = on_done;
  plan.slices_left = std::make_unique<std::atomic<uint32_t>[]>(reqs.size());
  plan.first_failed = std::make_unique<std::atomic<int64_t>[]>(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    plan.slices_left[i].store(0, std::memory_order_relaxed);
    plan.first_failed[i].store(-1, std::memory_order_relaxed);
  }
  for (const ReadSlice& sl : plan.slices) plan.slices_left[sl.request].fetch_add(1, std::memory_order_relaxed);
  for (size_t i = 0; i < reqs.size(); ++i)
    if (plan.slices_left[i].load(std::memory_order_relaxed) == 0) (*on_done)(reqs[i], i);
}

void finish_extent(const Extent& e, IoPlan& plan, std::span<ReadRequest> reqs) {
  for (uint32_t s = e.first_slice; s < e.first_slice + e.n_slices; ++s) {
    ReadSlice& sl = plan.slices[s];
    // A failed extent may still have delivered the slices that lie before the failure point.
    bool arrived = e.result == ReadResult::kOk || sl.buf_offset + sl.length <= e.done;
    if (arrived) {
      if (e.bounce)
        std::memcpy(static_cast<uint8_t*>(reqs[sl.request].dest) + sl.req_offset,
                    e.buf + sl.buf_offset, sl.length);
      sl.result = ReadResult::kOk;
      sl.error = 0;
    } else {
      sl.result = e.result;
      sl.error = e.error;
    }
  }
  if (plan.on_done == nullptr) return;
  for (uint32_t s = e.first_slice; s < e.first_slice + e.n_slices; ++s) {
    const ReadSlice& sl = plan.slices[s];
    if (sl.result != ReadResult::kOk) {
      int64_t none = -1;
      plan.first_failed[sl.request].compare_exchange_strong(none, s, std::memory_order_relaxed);
    }
    // The last slice of a request: its other slices were finished by other workers, whose
    // writes the acq_rel decrement makes visible here.
    if (plan.slices_left[sl.request].fetch_sub(1, std::memory_order_acq_rel) != 1) continue;
    ReadRequest& r = reqs[sl.request];
    int64_t f = plan.first_failed[sl.request].load(std::memory_order_relaxed);
    r.result = f < 0 ? ReadResult::kOk : plan.slices[size_t(f)].result;
    r.error = f < 0 ? 0 : plan.slices[size_t(f)].error;
    (*plan.on_done)(r, sl.request);
  }
}

void apply_results(const IoPlan& plan, std::span<ReadRequest> reqs) {
  if (plan.on_done != nullptr) return;  // finish_extent already gave each request its result
  for (const ReadSlice& sl : plan.slices) {
    ReadRequest& r = reqs[sl.request];
    if (sl.result != ReadResult::kOk) {
      if (r.result == ReadResult::kPending || r.result == ReadResult::kOk) {
        r.result = sl.result;
        r.error = sl.error;
      }
    } else if (r.result == ReadResult::kPending) {
      r.result = ReadResult::kOk;
    }
  }
}

}  // namespace moestream::io
