// The mmap backend: copies from a shared read-only mapping of each file, so every miss is a
// page fault. The baseline that llama.cpp-style engines use; no completions, so no hook.
// Each mapping is registered with common/mapping_guard.h: a page that cannot be read (the file
// truncated under us, a device error) fails its extent with EIO instead of killing the process.
#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <vector>

#include "common/error.h"
#include "common/mapping_guard.h"
#include "loader/io/io_backend.h"
#include "loader/io/worker_pool.h"

namespace moestream::io {
namespace {

struct Mapping {
  uint8_t* data = nullptr;
  uint64_t bytes = 0;
  int error = 0;  // errno of a failed mmap
  MappingGuard guard;
};

class MmapBackend final : public Backend {
 public:
  explicit MmapBackend(const IoEngineOptions& opts) : pool_(opts.n_threads) {}
  ~MmapBackend() override {
    for (auto& m : maps_) {
      m.guard = MappingGuard();
      if (m.data) ::munmap(m.data, m.bytes);
    }
  }
  IoBackend kind() const override { return IoBackend::kMmap; }

  void on_file_added(uint32_t index, const FileEntry& f) override {
    if (maps_.size() <= index) maps_.resize(index + 1);
    remap(maps_[index], f.buffered_fd, f.size, f.path);
  }

  void run(BatchContext& ctx) override {
    // Touching a page past the end of the file raises SIGBUS, so the size is checked per batch
    // and the mapping grows with the file.
    std::vector<uint64_t> sizes(ctx.files.size(), 0);
    std::vector<bool> seen(ctx.files.size(), false);
    for (const Extent& e : ctx.plan.extents) {
      if (seen[e.file]) continue;
      seen[e.file] = true;
      struct stat st {};
      const FileEntry& f = ctx.files[e.file];
      sizes[e.file] = ::fstat(f.buffered_fd, &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
      // A mapping that faulted reads zeros: map the file afresh (it may have been restored).
      if (sizes[e.file] > maps_[e.file].bytes || maps_[e.file].guard.fault_count() > 0)
        remap(maps_[e.file], f.buffered_fd, sizes[e.file], f.path);
    }
    std::atomic<size_t> next{0};
    const size_t n = ctx.plan.extents.size();
    pool_.run(static_cast<unsigned>(std::min<size_t>(n, pool_.size())), [&](unsigned) {
      for (size_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < n;) {
        Extent& e = ctx.plan.extents[i];
        const Mapping& m = maps_[e.file];
        uint64_t limit = std::min(sizes[e.file], m.bytes);
        if (m.data == nullptr && m.error != 0) {
          e.result = ReadResult::kError;
          e.error = m.error;
        } else {
          uint64_t avail = e.offset < limit ? limit - e.offset : 0;
          uint64_t n_copy = std::min(e.needed, avail);
          const uint8_t* src = m.data + e.offset;
          const uint64_t faults = m.guard.fault_count();
          if (e.bounce || e.scatter) {
            // Touch each page first, so a page that cannot be read fails the extent before
            // finish_extent copies from it.
            for (uint64_t o = 0; o < n_copy; o += 4096) (void)*static_cast<const volatile uint8_t*>(src + o);
            if (n_copy > 0) (void)*static_cast<const volatile uint8_t*>(src + n_copy - 1);
            // finish_extent copies each slice straight from the map.
            e.buf = const_cast<uint8_t*>(src);
            e.bounce = true;
            e.scatter = false;
          } else if (n_copy > 0) {
            std::memcpy(e.buf, src, n_copy);
          }
          e.done = n_copy;
          e.result = n_copy >= e.needed ? ReadResult::kOk : ReadResult::kTruncated;
          if (m.guard.fault_count() != faults) {  // zeros, not the file's bytes
            e.done = 0;
            e.result = ReadResult::kError;
            e.error = EIO;
          }
        }
        finish_extent(e, ctx.plan, ctx.reqs);
      }
    });
  }

 private:
  static void remap(Mapping& m, int fd, uint64_t size, const std::string& path) {
    // A remap at a batch runs on a lane thread: the new mapping keeps the first one's owner.
    const MappingOwnerScope owner(m.guard.registered() ? m.guard.owner() : current_mapping_owner());
    m.guard = MappingGuard();
    if (m.data) ::munmap(m.data, m.bytes);
    m = Mapping{};
    if (size == 0) return;
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      m.error = errno;
      return;
    }
    m.data = static_cast<uint8_t*>(p);
    m.bytes = size;
    try {
      m.guard = MappingGuard(p, size, path, fd, /*watch_changes=*/false);
    } catch (const IoError&) {  // registry full: an unguarded mapping could kill the process
      ::munmap(p, size);
      m = Mapping{};
      m.error = EMFILE;
    }
  }

  WorkerPool pool_;
  std::vector<Mapping> maps_;
};

}  // namespace

std::unique_ptr<Backend> make_mmap_backend(const IoEngineOptions& opts) {
  return std::make_unique<MmapBackend>(opts);
}

}  // namespace moestream::io
