// The pread(2) thread-pool backend: the fallback when io_uring cannot be set up, and the
// parallel-pread reference the io_uring backend is measured against.
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>

#include "loader/io_backend.h"
#include "loader/worker_pool.h"

namespace moestream::io {

void pread_extent(Extent& e, BatchContext& ctx, CompletionCounters& counters) {
  const FileEntry& f = ctx.files[e.file];
  for (;;) {
    ssize_t n;
    if (e.scatter) {
      uint32_t n_iov = build_iovecs(e, ctx.plan, ctx.reqs, ctx.sink, ctx.sink_bytes);
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
