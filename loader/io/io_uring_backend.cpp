// The io_uring backend: several rings, each driven by its own worker thread, because a buffered
// read that hits the page cache is copied inline by the submitting thread, so one ring caps
// page-cache hits at one core's memcpy rate. Files (and the bounce arena) are registered.
#include <liburing.h>
#include <sys/uio.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "loader/io/io_backend.h"
#include "loader/io/worker_pool.h"

namespace moestream::io {
namespace {

constexpr unsigned kFixedFileSlots = 1024;  // sparse fixed-file table; later files go by fd

struct Ring {
  io_uring ring{};
  bool alive = false;
  bool files_registered = false;
  bool buffers_registered = false;
  std::vector<bool> fixed;  // per engine file: registered in this ring's table
};

class UringBackend final : public Backend {
 public:
  UringBackend(const IoEngineOptions& opts, int* err)
      : opts_(opts), rings_(std::max(1u, opts.n_rings)), pool_(std::max(1u, opts.n_rings)) {
    for (Ring& r : rings_) {
      int rc = opts.simulate_uring_init_errno ? -opts.simulate_uring_init_errno
                                              : io_uring_queue_init(opts.queue_depth, &r.ring, 0);
      if (rc < 0) {
        *err = -rc;
        return;
      }
      r.alive = true;
      if (opts.register_files)
        r.files_registered = io_uring_register_files_sparse(&r.ring, kFixedFileSlots) == 0;
    }
    *err = 0;
  }

  ~UringBackend() override {
    for (Ring& r : rings_)
      if (r.alive) io_uring_queue_exit(&r.ring);
  }

  IoBackend kind() const override { return IoBackend::kUring; }

  void on_file_added(uint32_t index, const FileEntry& f) override {
    for (Ring& r : rings_) register_file(r, index, f);
  }

  void on_arena(uint8_t* data, size_t bytes) override {
    if (!opts_.register_buffers) return;
    for (Ring& r : rings_) {
      if (!r.alive) continue;
      if (r.buffers_registered) io_uring_unregister_buffers(&r.ring);
      iovec iov{data, bytes};
      // Fixed buffers skip per-read page pinning, which matters for O_DIRECT; a kernel or
      // RLIMIT_MEMLOCK that refuses simply leaves plain reads.
      r.buffers_registered = io_uring_register_buffers(&r.ring, &iov, 1) == 0;
    }
    arena_ = data;
    arena_bytes_ = bytes;
  }

  void run(BatchContext& ctx) override {
    std::atomic<size_t> next{0};
    const size_t n = ctx.plan.extents.size();
    const unsigned workers = static_cast<unsigned>(std::min<size_t>(n, rings_.size()));
    // Each ring keeps at most its share of the batch in flight. Without the cap the first ring
    // to wake claims queue_depth extents at once and a layer's 24 reads all land on one or two
    // rings: page-cache hits, which the submitting thread copies inline, then ran at one or two
    // cores' memcpy rate (6.8 GB/s with 16 rings vs 48 GB/s for 16 pread threads on the H200
    // machine). The total in flight is unchanged, so device reads keep their queue depth.
    const unsigned cap = static_cast<unsigned>(
        std::min<size_t>(opts_.queue_depth, (n + workers - 1) / std::max(1u, workers)));
    pool_.run(workers, [&](unsigned w) { drive(rings_[w], ctx, next, std::max(1u, cap)); });
  }

 private:
  void prep(Ring& r, io_uring_sqe* sqe, Extent& e, BatchContext& ctx) {
    const FileEntry& f = ctx.files[e.file];
    bool fixed_file = e.file < r.fixed.size() && r.fixed[e.file];
    int fd = fixed_file ? static_cast<int>(e.file) : f.fd;
    unsigned len = static_cast<unsigned>(std::min<uint64_t>(next_length(e), 1u << 30));
    if (e.scatter) {
      uint32_t n_iov = build_iovecs(e, ctx.plan, ctx.reqs, ctx.sink, ctx.sink_bytes);
      io_uring_prep_readv(sqe, fd, ctx.plan.iovs.data() + e.first_iov, n_iov, next_offset(e));
    } else if (e.bounce && r.buffers_registered)
      io_uring_prep_read_fixed(sqe, fd, next_buf(e), len, next_offset(e), 0);
    else
      io_uring_prep_read(sqe, fd, next_buf(e), len, next_offset(e));
    if (fixed_file) sqe->flags |= IOSQE_FIXED_FILE;
    io_uring_sqe_set_data(sqe, &e);
  }

  // Keeps up to `cap` extents in flight on one ring until the batch is drained; never
  // throws: each CQE goes through on_completion, resubmissions go back into the queue.
  //
  // Extents are claimed and submitted one at a time (unless opts_.uring_batch_submit), and the
  // ring waits only when it may not take another. A buffered read that hits the page cache is
  // copied inside io_uring_enter, so a ring that submitted its whole share at once was committed
  // to copying all of it, while a worker whose core ran slower (a busy SMT sibling, a preempted
  // vCPU) or woke later held back the batch: the static split of a top-64 batch over 16 rings
  // read at 73% of 16 pread threads, which pick up one read at a time. One read per submission
  // balances the copies the same way; device reads are still queued without waiting, so they
  // keep their depth (one io_uring_enter per read: ~1 us next to a ~1 MiB read).
  void drive(Ring& r, BatchContext& ctx, std::atomic<size_t>& next, unsigned cap) {
    CompletionCounters c;
    const size_t n = ctx.plan.extents.size();
    const unsigned per_submit = opts_.uring_batch_submit ? cap : 1;
    std::vector<Extent*> claimed, retry;
    unsigned in_flight = 0;
    uint32_t submit_failures = 0;
    int submit_error = 0;
    bool ring_ok = r.alive;
    while (ring_ok) {
      for (unsigned added = 0; added < per_submit && in_flight < cap; ++added) {
        Extent* e = nullptr;
        if (!retry.empty()) {
          e = retry.back();
          retry.pop_back();
        } else {
          size_t i = next.fetch_add(1, std::memory_order_relaxed);
          if (i >= n) break;
          e = &ctx.plan.extents[i];
          claimed.push_back(e);
        }
        io_uring_sqe* sqe = io_uring_get_sqe(&r.ring);
        if (sqe == nullptr) {
          retry.push_back(e);
          break;
        }
        prep(r, sqe, *e, ctx);
        ++in_flight;
      }
      if (in_flight == 0) break;
      // Wait for a completion only when this ring may not claim another extent now.
      const bool may_claim =
          in_flight < cap && (!retry.empty() || next.load(std::memory_order_relaxed) < n);
      int rc = opts_.simulate_submit_errno ? -opts_.simulate_submit_errno
                                           : io_uring_submit_and_wait(&r.ring, may_claim ? 0 : 1);
      if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
        if (++submit_failures > opts_.max_retries) {
          ring_ok = false;
          submit_error = -rc;
        }
        continue;
      }
      submit_failures = 0;
      io_uring_cqe* cqe = nullptr;
      unsigned head = 0, seen = 0;
      io_uring_for_each_cqe(&r.ring, head, cqe) {
        ++seen;
        --in_flight;
        Extent& e = *static_cast<Extent*>(io_uring_cqe_get_data(cqe));
        Step s = on_completion(e, cqe->res, ctx.files[e.file], opts_, c);
        if (s == Step::kResubmit)
          retry.push_back(&e);
        else
          finish_extent(e, ctx.plan, ctx.reqs);
      }
      io_uring_cq_advance(&r.ring, seen);
    }
    if (!ring_ok) {
      if (submit_error)
        ctx.notice(std::string("io_uring submission keeps failing (") + std::strerror(submit_error) +
                   "); finishing this ring's reads with pread and opening a new ring");
      rescue(r, ctx, next, claimed, in_flight, c);
    }
    ctx.add_counters(c);
  }

  // The ring keeps refusing submissions: tear it down (the kernel cancels or completes what
  // was in flight, so no stale SQE can touch these buffers later), finish this worker's
  // extents with pread, and try a fresh ring for the next batch.
  void rescue(Ring& r, BatchContext& ctx, std::atomic<size_t>& next,
              std::vector<Extent*>& claimed, unsigned in_flight, CompletionCounters& c) {
    // Reap what the kernel did accept before closing the ring, so no read lands later.
    unsigned submitted =
        r.alive ? in_flight - std::min(in_flight, io_uring_sq_ready(&r.ring)) : 0;
    while (submitted > 0) {
      io_uring_cqe* cqe = nullptr;
      int rc = io_uring_wait_cqe(&r.ring, &cqe);
      if (rc == -EINTR) continue;
      if (rc < 0) break;
      Extent& e = *static_cast<Extent*>(io_uring_cqe_get_data(cqe));
      if (on_completion(e, cqe->res, ctx.files[e.file], opts_, c) != Step::kResubmit)
        finish_extent(e, ctx.plan, ctx.reqs);  // a resubmission stays pending: pread below
      io_uring_cqe_seen(&r.ring, cqe);
      --submitted;
    }
    if (r.alive) io_uring_queue_exit(&r.ring);
    r.alive = false;
    for (size_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < ctx.plan.extents.size();)
      claimed.push_back(&ctx.plan.extents[i]);
    for (Extent* e : claimed) {
      if (e->result != ReadResult::kPending) continue;
      pread_extent(*e, ctx, c);
      finish_extent(*e, ctx.plan, ctx.reqs);
    }
    r = Ring{};
    if (io_uring_queue_init(opts_.queue_depth, &r.ring, 0) == 0) {
      r.alive = true;
      if (opts_.register_files)
        r.files_registered = io_uring_register_files_sparse(&r.ring, kFixedFileSlots) == 0;
      for (uint32_t i = 0; i < ctx.files.size(); ++i) register_file(r, i, ctx.files[i]);
      if (arena_ && opts_.register_buffers) {
        iovec iov{arena_, arena_bytes_};
        r.buffers_registered = io_uring_register_buffers(&r.ring, &iov, 1) == 0;
      }
    }
  }

  static void register_file(Ring& r, uint32_t index, const FileEntry& f) {
    if (r.fixed.size() <= index) r.fixed.resize(index + 1, false);
    if (r.alive && r.files_registered && index < kFixedFileSlots) {
      int fd = f.fd;
      r.fixed[index] = io_uring_register_files_update(&r.ring, index, &fd, 1) == 1;
    }
  }

  IoEngineOptions opts_;
  std::vector<Ring> rings_;
  WorkerPool pool_;
  uint8_t* arena_ = nullptr;
  size_t arena_bytes_ = 0;
};

}  // namespace

std::unique_ptr<Backend> make_uring_backend(const IoEngineOptions& opts, int* err) {
  auto b = std::make_unique<UringBackend>(opts, err);
  if (*err != 0) return nullptr;
  return b;
}

}  // namespace moestream::io
