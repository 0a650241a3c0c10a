// The pread(2) thread-pool backend: the fallback when io_uring cannot be set up, and the
// parallel-pread reference the io_uring backend is measured against.
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <memory>

#include "loader/io/io_backend.h"
#include "loader/io/worker_pool.h"

namespace moestream::io {
namespace {

// This thread's gap sink (4 KiB aligned for O_DIRECT): threads reading scatter extents at once
// never write the same bytes, although nobody reads them.
uint8_t* thread_sink(uint64_t bytes) {
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  thread_local std::unique_ptr<uint8_t, Free> sink;
  thread_local uint64_t sink_bytes = 0;
  if (sink_bytes < bytes) {
    void* p = nullptr;
    if (::posix_memalign(&p, kDirectAlign, bytes) != 0) return nullptr;
    sink.reset(static_cast<uint8_t*>(p));
    sink_bytes = bytes;
  }
  return sink.get();
}

}  // namespace

void pread_extent(Extent& e, BatchContext& ctx, CompletionCounters& counters) {
  const FileEntry& f = ctx.files[e.file];
  uint8_t* sink = e.scatter ? thread_sink(ctx.sink_bytes) : nullptr;
  if (sink == nullptr) sink = ctx.sink;  // out of memory: the shared one still works
  for (;;) {
    ssize_t n;
    if (e.scatter) {
      uint32_t n_iov = build_iovecs(e, ctx.plan, ctx.reqs, sink, ctx.sink_bytes);
      n = ::preadv(f.fd, ctx.plan.iovs.data() + e.first_iov, static_cast<int>(n_iov),
                   static_cast<off_t>(next_offset(e)));
    } else {
      n = ::pread(f.fd, next_buf(e), next_length(e), static_cast<off_t>(next_offset(e)));
    }
    int64_t res = n < 0 ? -int64_t{errno} : int64_t{n};
    if (on_completion(e, res, f, ctx.opts, counters) != Step::kResubmit) return;
  }
}

namespace {

class PreadBackend final : public Backend {
 public:
  explicit PreadBackend(const IoEngineOptions& opts) : pool_(opts.n_threads) {}
  IoBackend kind() const override { return IoBackend::kPread; }

  void run(BatchContext& ctx) override {
    std::atomic<size_t> next{0};
    const size_t n = ctx.plan.extents.size();
    pool_.run(static_cast<unsigned>(std::min<size_t>(n, pool_.size())), [&](unsigned) {
      CompletionCounters c;
      for (size_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < n;) {
        Extent& e = ctx.plan.extents[i];
        pread_extent(e, ctx, c);
        finish_extent(e, ctx.plan, ctx.reqs);
      }
      ctx.add_counters(c);
    });
  }

 private:
  WorkerPool pool_;
};

}  // namespace

std::unique_ptr<Backend> make_pread_backend(const IoEngineOptions& opts) {
  return std::make_unique<PreadBackend>(opts);
}

}  // namespace moestream::io
