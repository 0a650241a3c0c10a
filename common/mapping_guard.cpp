// Implementation of common/mapping_guard.h: the slot registry the SIGBUS handler reads (fixed
// array, atomics only: the handler may not lock or allocate) and the checks outside it.
#include "common/mapping_guard.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <set>

#include "common/error.h"

namespace moestream {
namespace {

enum SlotState : int { kFree = 0, kClaimed = 1, kLive = 2 };

// What the handler reads: lock-free atomics on plain integers (async-signal-safe).
struct Slot {
  std::atomic<int> state{kFree};
  std::atomic<uintptr_t> base{0};
  std::atomic<uint64_t> bytes{0};
  std::atomic<uint64_t> faults{0};
  std::atomic<uint64_t> first_fault{UINT64_MAX};  // offset in the file of the first fault
};

Slot g_slots[MappingGuard::kMaxMappings];
std::atomic<int> g_slot_end{0};  // slots [0, end) were used at some point: the handler's scan
std::atomic<uint64_t> g_faults{0};
uintptr_t g_page = 4096;
struct sigaction g_previous {};
std::once_flag g_install_once;
int g_install_errno = 0;

// The live guards, for check_mapped_files (never touched by the handler).
std::atomic<uint64_t> g_next_owner{1};
thread_local uint64_t t_owner = 0;  // never read by the handler
std::mutex g_live_mu;
std::set<const MappingGuard*> g_live;

static_assert(std::atomic<uintptr_t>::is_always_lock_free && std::atomic<uint64_t>::is_always_lock_free);

// Hands a signal that is not ours on: to the previous handler, or to the default action.
void pass_on(int sig, siginfo_t* info, void* ctx) {
  if ((g_previous.sa_flags & SA_SIGINFO) != 0 && g_previous.sa_sigaction != nullptr) {
    g_previous.sa_sigaction(sig, info, ctx);
    return;
  }
  if ((g_previous.sa_flags & SA_SIGINFO) == 0 && g_previous.sa_handler != SIG_DFL &&
      g_previous.sa_handler != SIG_IGN) {
    g_previous.sa_handler(sig);
    return;
  }
  // Default action (an ignored SIGBUS on a bad page would fault forever): the signal stays
  // pending while this handler runs and kills the process when it returns.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  ::sigaction(SIGBUS, &dfl, nullptr);
  ::raise(SIGBUS);
}

void on_sigbus(int sig, siginfo_t* info, void* ctx) {
  const int saved_errno = errno;
  if (info != nullptr && info->si_code > 0) {  // a fault the kernel raised, not a kill()
    const uintptr_t addr = reinterpret_cast<uintptr_t>(info->si_addr);
    const int end = g_slot_end.load(std::memory_order_acquire);
    for (int i = 0; i < end; ++i) {
      Slot& s = g_slots[i];
      if (s.state.load(std::memory_order_acquire) != kLive) continue;
      const uintptr_t base = s.base.load(std::memory_order_relaxed);
      const uint64_t bytes = s.bytes.load(std::memory_order_relaxed);
      if (addr < base || addr - base >= bytes) continue;
      // Zeros from the faulting page to the end of the mapping: one call, however many pages
      // the pass would still touch (the mapping is poisoned from now on anyway).
      const uintptr_t page = addr & ~(g_page - 1);
      const uintptr_t stop = (base + bytes + g_page - 1) & ~(g_page - 1);
      void* z = ::mmap(reinterpret_cast<void*>(page), stop - page, PROT_READ,
                       MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (z == MAP_FAILED) break;  // cannot repair the page: die as without this handler
      uint64_t none = UINT64_MAX;
      s.first_fault.compare_exchange_strong(none, addr - base, std::memory_order_relaxed);
      s.faults.fetch_add(1, std::memory_order_release);
      g_faults.fetch_add(1, std::memory_order_release);
      errno = saved_errno;
      return;
    }
  }
  errno = saved_errno;
  pass_on(sig, info, ctx);
}

void install_handler() {
  g_page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  struct sigaction sa {};
  sa.sa_sigaction = on_sigbus;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  if (::sigaction(SIGBUS, &sa, &g_previous) != 0) g_install_errno = errno;
}

std::string stat_problem(const std::filesystem::path& path, int fd, uint64_t ino, uint64_t dev, uint64_t size,
                         int64_t mtime_ns, bool by_path) {
  struct stat st {};
  if (::fstat(fd, &st) != 0)
    return "cannot stat the mapped file " + path.string() + ": " + std::strerror(errno);
  const int64_t mtime = int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  if (uint64_t(st.st_size) != size || mtime != mtime_ns)
    return path.string() + ": the file changed while this process had it mapped (size " + std::to_string(size) +
           " -> " + std::to_string(st.st_size) + " bytes, mtime " + std::to_string(mtime_ns) + " -> " +
           std::to_string(mtime) + " ns); its weights can no longer be trusted: restart to load it again";
  if (!by_path) return "";
  struct stat now {};
  if (::stat(path.c_str(), &now) != 0)
    return path.string() + ": the mapped file is gone (" + std::strerror(errno) + "); restart to load the model again";
  if (uint64_t(now.st_ino) != ino || uint64_t(now.st_dev) != dev)
    return path.string() + ": the file was replaced while this process had it mapped (inode " + std::to_string(ino) +
           " -> " + std::to_string(now.st_ino) + "); restart to load the new file";
  return "";
}

}  // namespace

MappingGuard::MappingGuard(const void* base, uint64_t bytes, std::filesystem::path path, int fd, bool watch_changes)
    : owner_(t_owner), watch_(watch_changes), path_(std::move(path)) {
  std::call_once(g_install_once, install_handler);
  if (g_install_errno != 0)
    throw IoError("cannot install the SIGBUS handler that guards " + path_.string() + ": " +
                  std::strerror(g_install_errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw IoError("cannot stat " + path_.string() + ": " + std::strerror(errno));
  ino_ = uint64_t(st.st_ino);
  dev_ = uint64_t(st.st_dev);
  size_ = uint64_t(st.st_size);
  mtime_ns_ = int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  fd_ = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (fd_ < 0) throw IoError("cannot keep a descriptor of " + path_.string() + ": " + std::strerror(errno));
  for (int i = 0; i < kMaxMappings; ++i) {
    int expect = kFree;
    if (!g_slots[i].state.compare_exchange_strong(expect, kClaimed, std::memory_order_acq_rel)) continue;
    Slot& s = g_slots[i];
    s.base.store(reinterpret_cast<uintptr_t>(base), std::memory_order_relaxed);
    s.bytes.store(bytes, std::memory_order_relaxed);
    s.faults.store(0, std::memory_order_relaxed);
    s.first_fault.store(UINT64_MAX, std::memory_order_relaxed);
    int end = g_slot_end.load(std::memory_order_relaxed);
    while (end < i + 1 && !g_slot_end.compare_exchange_weak(end, i + 1, std::memory_order_acq_rel)) {
    }
    s.state.store(kLive, std::memory_order_release);
    slot_ = i;
    break;
  }
  if (slot_ < 0) {
    ::close(fd_);
    throw IoError("cannot map " + path_.string() + ": more than " + std::to_string(kMaxMappings) +
                  " mapped files are open at once");
  }
  std::lock_guard<std::mutex> lock(g_live_mu);
  g_live.insert(this);
}

void MappingGuard::release() noexcept {
  if (slot_ >= 0) {
    {
      std::lock_guard<std::mutex> lock(g_live_mu);
      g_live.erase(this);
    }
    g_slots[slot_].state.store(kFree, std::memory_order_release);
    slot_ = -1;
  }
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

MappingGuard::~MappingGuard() { release(); }

MappingGuard::MappingGuard(MappingGuard&& o) noexcept { *this = std::move(o); }

MappingGuard& MappingGuard::operator=(MappingGuard&& o) noexcept {
  if (this == &o) return *this;
  release();
  std::lock_guard<std::mutex> lock(g_live_mu);
  if (o.slot_ >= 0) {
    g_live.erase(&o);
    g_live.insert(this);
  }
  slot_ = o.slot_;
  owner_ = o.owner_;
  fd_ = o.fd_;
  watch_ = o.watch_;
  path_ = std::move(o.path_);
  ino_ = o.ino_;
  dev_ = o.dev_;
  size_ = o.size_;
  mtime_ns_ = o.mtime_ns_;
  o.slot_ = -1;
  o.fd_ = -1;
  return *this;
}

uint64_t MappingGuard::fault_count() const {
  return slot_ < 0 ? 0 : g_slots[slot_].faults.load(std::memory_order_acquire);
}

std::string MappingGuard::problem(bool by_path) const {
  if (slot_ < 0) return "";
  const Slot& s = g_slots[slot_];
  if (s.faults.load(std::memory_order_acquire) > 0) {
    // The signal does not say why: a read of the same byte does (EIO, or the end of the file).
    const uint64_t at = s.first_fault.load(std::memory_order_relaxed);
    uint8_t byte = 0;
    const ssize_t got = ::pread(fd_, &byte, 1, off_t(at));
    struct stat st {};
    const std::string size_now = ::fstat(fd_, &st) == 0 ? std::to_string(st.st_size) : "?";
    const std::string why =
        got < 0 ? std::string(std::strerror(errno)) + " (the device failed the read)"
        : got == 0 ? "past the end of the file: it was truncated from " + std::to_string(size_) + " to " + size_now +
                         " bytes while mapped"
                   : "the page could not be read while mapped (it reads now: a transient device error, or the "
                     "file was truncated and grown again)";
    return "cannot read " + path_.string() + " at offset " + std::to_string(at) + ": " + why +
           " (SIGBUS on its mapping); what was computed from it is discarded";
  }
  if (!watch_) return "";
  return stat_problem(path_, fd_, ino_, dev_, size_, mtime_ns_, by_path);
}

void MappingGuard::check(bool by_path) const {
  const std::string p = problem(by_path);
  if (!p.empty()) throw IoError(p);
}

uint64_t new_mapping_owner() { return g_next_owner.fetch_add(1, std::memory_order_relaxed); }
uint64_t current_mapping_owner() { return t_owner; }
MappingOwnerScope::MappingOwnerScope(uint64_t owner) : previous_(t_owner) { t_owner = owner; }
MappingOwnerScope::~MappingOwnerScope() { t_owner = previous_; }

void check_mapped_files(uint64_t owner) {
  // The path's inode at most every 100 ms: a file replaced by rename leaves the mapped inode
  // intact (what is computed stays consistent), so it may be noticed a call later; an in-place
  // change (the descriptor's size and mtime) is checked on every call.
  using Clock = std::chrono::steady_clock;
  static std::atomic<int64_t> last_path_check{0};
  const int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch()).count();
  int64_t last = last_path_check.load(std::memory_order_relaxed);
  const bool by_path = now - last >= 100 && last_path_check.compare_exchange_strong(last, now);
  std::lock_guard<std::mutex> lock(g_live_mu);
  for (const MappingGuard* g : g_live)
    if (g->owner() == owner || g->owner() == 0) g->check(by_path);
}

uint64_t mapped_fault_count() { return g_faults.load(std::memory_order_acquire); }

}  // namespace moestream
