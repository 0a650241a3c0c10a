// The read engine's front: file table (O_DIRECT with buffered fallback), backend choice with the
// io_uring -> pread fallback, the bounce arena, stats, and the one-error-per-batch rule.
#include "loader/io/io_engine.h"

#include <fcntl.h>
#include <liburing.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <condition_variable>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/file_util.h"
#include "loader/io/io_backend.h"
#include "loader/io/io_plan.h"

namespace moestream {

using io::FileEntry;

std::string_view io_backend_name(IoBackend b) {
  switch (b) {
    case IoBackend::kAuto: return "auto";
    case IoBackend::kUring: return "uring";
    case IoBackend::kPread: return "pread";
    case IoBackend::kMmap: return "mmap";
  }
  return "?";
}

IoBackend parse_io_backend(std::string_view name) {
  for (IoBackend b : {IoBackend::kAuto, IoBackend::kUring, IoBackend::kPread, IoBackend::kMmap})
    if (io_backend_name(b) == name) return b;
  throw ConfigError("unknown I/O backend '" + std::string(name) +
                    "' (expected auto, uring, pread or mmap)");
}

bool io_uring_available(int* err) {
  io_uring ring;
  int rc = io_uring_queue_init(2, &ring, 0);
  if (err) *err = rc < 0 ? -rc : 0;
  if (rc < 0) return false;
  io_uring_queue_exit(&ring);
  return true;
}

struct IoEngine::Impl {
  // One batch runs on a lane: its own backend (rings or threads) and bounce arena, so that
  // concurrent batches never share a ring or a buffer.
  struct Lane {
    std::unique_ptr<io::Backend> backend;
    uint8_t* arena = nullptr;  // bounce buffers, 4 KiB aligned for O_DIRECT
    size_t arena_bytes = 0;
    // Where this lane's scatter reads drop the gaps they read through (contents never read;
    // one per lane all the same, so that no two reads in flight write the same bytes).
    uint8_t* sink = nullptr;
    bool busy = false;
  };
  IoEngineOptions opts;
  std::vector<FileEntry> files;
  std::vector<Lane> lanes;
  uint64_t sink_bytes = 0;   // size of each lane's gap sink
  IoEngineStats stats;
  std::mutex mu;  // files, lanes' busy flags, stats
  std::condition_variable cv;

  void notice(const std::string& line) const {
    if (opts.notice)
      opts.notice(line);
    else
      std::fprintf(stderr, "moestream: %s\n", line.c_str());
  }

  static void ensure_arena(Lane& l, size_t bytes) {
    if (bytes <= l.arena_bytes) return;
    size_t want = std::max<size_t>(bytes, 1 << 20);
    want = std::bit_ceil(want);  // grow geometrically: io_uring re-registers on every growth
    void* p = nullptr;
    if (::posix_memalign(&p, io::kDirectAlign, want) != 0)
      throw IoError("cannot allocate a " + std::to_string(want) + "-byte bounce buffer");
    std::free(l.arena);
    l.arena = static_cast<uint8_t*>(p);
    l.arena_bytes = want;
    l.backend->on_arena(l.arena, l.arena_bytes);
  }

  // O_DIRECT can be refused at open (EINVAL) or only at the first read (some filesystems):
  // probe both, and read buffered with a notice when refused.
  int open_direct(const std::filesystem::path& path, uint64_t size) const {
    int fd = -1;
    if (opts.simulate_direct_errno != 0)
      errno = opts.simulate_direct_errno;
    else
      fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
    if (fd < 0) {
      notice("O_DIRECT refused for " + path.string() + " (" + std::strerror(errno) +
             "); reading it through the page cache");
      return -1;
    }
    if (size > 0) {
      void* probe = nullptr;
      if (::posix_memalign(&probe, io::kDirectAlign, io::kDirectAlign) != 0) {
        ::close(fd);
        return -1;
      }
      ssize_t n = ::pread(fd, probe, io::kDirectAlign, 0);
      int saved = errno;
      std::free(probe);
      if (n < 0 && saved == EINVAL) {
        ::close(fd);
        notice("O_DIRECT reads fail on " + path.string() + " (" + std::strerror(saved) +
               "); reading it through the page cache");
        return -1;
      }
    }
    return fd;
  }
};

IoEngine::IoEngine(IoEngineOptions opts) : impl_(std::make_unique<Impl>()) {
  unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  // Defaults: one ring per core up to 8 (page-cache copies scale with submitting cores); pread
  // threads at least 4 so that blocking device reads still overlap on small machines.
  if (opts.n_rings == 0) opts.n_rings = std::clamp(hw, 1u, 8u);
  if (opts.n_threads == 0) opts.n_threads = std::clamp(hw, 4u, 16u);
  if (opts.queue_depth == 0) throw ConfigError("io queue_depth must be at least 1");
  if (opts.max_read_bytes == 0) throw ConfigError("io max_read_bytes must be at least 1");
  if (opts.max_batches_in_flight == 0) throw ConfigError("io max_batches_in_flight must be at least 1");
  if (opts.profile) validate_io_profile(*opts.profile, "the read engine's I/O profile");
  impl_->opts = std::move(opts);
  Impl& m = *impl_;
  std::unique_ptr<io::Backend> first;
  if (m.opts.backend == IoBackend::kAuto || m.opts.backend == IoBackend::kUring) {
    int err = 0;
    first = io::make_uring_backend(m.opts, &err);
    if (!first)
      m.notice(std::string("io_uring unavailable (io_uring_queue_init: ") + std::strerror(err) +
               "); using the pread thread pool");
  } else if (m.opts.backend == IoBackend::kMmap) {
    if (m.opts.direct) {
      m.notice("O_DIRECT does not apply to the mmap backend; reading through the page cache");
      m.opts.direct = false;
    }
    first = io::make_mmap_backend(m.opts);
  }
  if (!first) first = io::make_pread_backend(m.opts);
  const IoBackend kind = first->kind();
  m.lanes.resize(m.opts.max_batches_in_flight);
  m.lanes[0].backend = std::move(first);
  for (size_t i = 1; i < m.lanes.size(); ++i) {
    int err = 0;
    if (kind == IoBackend::kUring) m.lanes[i].backend = io::make_uring_backend(m.opts, &err);
    if (kind == IoBackend::kMmap) m.lanes[i].backend = io::make_mmap_backend(m.opts);
    if (!m.lanes[i].backend) m.lanes[i].backend = io::make_pread_backend(m.opts);
  }
  if (m.opts.scatter) {
    // A profile's merge rule picks its gaps per batch: a 1 MiB sink keeps them to a few pieces.
    m.sink_bytes = io::sink_bytes_for(m.opts.profile ? uint64_t(1) << 20
                                                     : std::min<uint64_t>(m.opts.coalesce_gap_bytes, 1 << 20));
    for (Impl::Lane& l : m.lanes) {
      void* p = nullptr;
      if (::posix_memalign(&p, io::kDirectAlign, m.sink_bytes) != 0)
        throw IoError("cannot allocate the " + std::to_string(m.sink_bytes) + "-byte gap sink");
      l.sink = static_cast<uint8_t*>(p);
    }
  }
}

IoEngine::~IoEngine() {
  for (Impl::Lane& l : impl_->lanes) {
    l.backend.reset();  // rings and workers go before the fds and buffers they use
    std::free(l.arena);
    std::free(l.sink);
  }
  for (FileEntry& f : impl_->files) {
    if (f.fd != f.buffered_fd) ::close(f.fd);
    ::close(f.buffered_fd);
  }
}

uint32_t IoEngine::add_file(const std::filesystem::path& path) {
  std::unique_lock<std::mutex> lock(impl_->mu);
  // Batches in flight read the file table: let them finish before it may move.
  impl_->cv.wait(lock, [&] {
    return std::none_of(impl_->lanes.begin(), impl_->lanes.end(), [](const Impl::Lane& l) { return l.busy; });
  });
  FileEntry f;
  f.path = path.string();
  f.buffered_fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.buffered_fd < 0) throw_errno("cannot open", path);
  struct stat st {};
  if (::fstat(f.buffered_fd, &st) != 0) {
    int saved = errno;
    ::close(f.buffered_fd);
    errno = saved;
    throw_errno("cannot stat", path);
  }
  f.size = static_cast<uint64_t>(st.st_size);
  f.fd = f.buffered_fd;
  if (impl_->opts.direct) {
    int dfd = impl_->open_direct(path, f.size);
    if (dfd >= 0) {
      f.fd = dfd;
      f.direct = true;
    }
  }
  uint32_t index = static_cast<uint32_t>(impl_->files.size());
  impl_->files.push_back(f);
  for (Impl::Lane& l : impl_->lanes) l.backend->on_file_added(index, impl_->files.back());
  return index;
}

const std::string& IoEngine::file_path(uint32_t file) const { return impl_->files.at(file).path; }
uint64_t IoEngine::file_size(uint32_t file) const { return impl_->files.at(file).size; }
bool IoEngine::file_is_direct(uint32_t file) const { return impl_->files.at(file).direct; }
uint32_t IoEngine::n_files() const { return uint32_t(impl_->files.size()); }

size_t IoEngine::submit(std::span<ReadRequest> batch) { return submit(batch, RequestDoneFn{}); }

size_t IoEngine::submit(std::span<ReadRequest> batch, const RequestDoneFn& on_done) {
  Impl& m = *impl_;
  Impl::Lane* lane = nullptr;
  {
    std::unique_lock<std::mutex> lock(m.mu);
    m.cv.wait(lock, [&] {
      for (Impl::Lane& l : m.lanes)
        if (!l.busy) {
          lane = &l;
          return true;
        }
      return false;
    });
    lane->busy = true;
  }
  // Frees the lane however this returns (plan_reads and the arena may throw).
  struct Release {
    Impl& m;
    Impl::Lane& l;
    ~Release() {
      {
        std::lock_guard<std::mutex> lock(m.mu);
        l.busy = false;
      }
      m.cv.notify_all();
    }
  } release{m, *lane};
  io::IoPlan plan = io::plan_reads(batch, m.files, io::plan_options(m.opts, m.sink_bytes));
  if (plan.bounce_bytes > 0) Impl::ensure_arena(*lane, plan.bounce_bytes);
  for (io::Extent& e : plan.extents)
    if (e.bounce) e.buf = lane->arena + e.bounce_offset;
  if (on_done) io::track_requests(plan, batch, &on_done);
  io::BatchContext ctx{plan, batch, m.files, m.opts, lane->sink, m.sink_bytes, {}, {}};
  if (!plan.extents.empty()) lane->backend->run(ctx);
  io::apply_results(plan, batch);

  size_t failed = 0;
  uint64_t requested = 0;
  for (const ReadRequest& r : batch) {
    requested += r.length;
    MOE_ASSERT(r.result != ReadResult::kPending, "a request was left pending");
    if (r.result != ReadResult::kOk) ++failed;
  }
  std::lock_guard<std::mutex> lock(m.mu);
  IoEngineStats& s = m.stats;
  ++s.batches;
  s.requests += batch.size();
  s.reads_issued += plan.extents.size();
  s.bytes_requested += requested;
  for (const io::Extent& e : plan.extents) {
    s.bytes_read += e.done;
    if (e.bounce) s.bounce_bytes += e.done;
    if (e.scatter) ++s.scatter_reads;
  }
  s.short_reads += ctx.counters.short_reads;
  s.retries += ctx.counters.retries;
  s.failed_requests += failed;
  return failed;
}

void IoEngine::read(std::span<ReadRequest> batch) {
  size_t failed = submit(batch);
  if (failed == 0) return;
  const ReadRequest* first = nullptr;
  for (const ReadRequest& r : batch)
    if (r.result != ReadResult::kOk && !first) first = &r;
  const FileEntry& f = impl_->files[first->file];
  std::string where = f.path + " at offset " + std::to_string(first->offset) + " length " +
                      std::to_string(first->length);
  std::string what;
  if (first->result == ReadResult::kTruncated) {
    struct stat st {};
    uint64_t now = ::fstat(f.buffered_fd, &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
    what = "truncated file: read of " + where + " hit end of file (file has " +
           std::to_string(now) + " bytes)";
  } else {
    what = "read of " + where + " failed: " + std::strerror(first->error);
  }
  throw IoError(what + " (" + std::to_string(failed) + " of " + std::to_string(batch.size()) +
                " requests in the batch failed)");
}

IoBackend IoEngine::backend() const { return impl_->lanes[0].backend->kind(); }
const IoEngineOptions& IoEngine::options() const { return impl_->opts; }

IoEngineStats IoEngine::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->stats;
}

void IoEngine::reset_stats() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->stats = {};
}

}  // namespace moestream
