// A fake CUDA runtime for gpu_expert_cache_fake_test: "device" memory is host memory, each stream
// a queue of operations that run lazily in a seeded random interleaving whenever the host calls in
// (and fully on a synchronize). A copy reads its source when it runs, so a missing stream wait or
// a staging buffer reused too early shows up as wrong bytes, without a GPU (CI). Every call holds
// one lock, so the cache's prefetch worker thread may call in too. Test hooks in
// tests/fake_cuda_runtime.h.
#include "tests/fake_cuda_runtime.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <vector>

#include "kernels/cuda/gpu_ops.h"

namespace {

struct Op {
  std::function<bool()> ready;  // false while the operation waits for an event
  std::function<void()> run;
};
struct FakeStream {
  std::deque<Op> ops;
};
struct FakeEvent {
  uint64_t recorded = 0, done = 0;  // tickets of the last record and the last one that ran
};

std::mutex g_mu;  // every entry point holds it: the state below is shared by threads
std::vector<FakeStream*> g_streams;
FakeStream g_legacy;
std::mt19937 g_rng(1);
uint64_t g_ticket = 0;
int g_skip_mallocs = 0, g_fail_mallocs = 0;  // hook: cudaMalloc calls to let pass, then fail
std::map<void*, size_t> g_device;      // live cudaMalloc allocations
std::map<void*, size_t> g_registered;  // live cudaHostRegister ranges

FakeStream* stream_of(cudaStream_t s) { return s ? reinterpret_cast<FakeStream*>(s) : &g_legacy; }

// Runs the first ready operation of a randomly chosen stream; false when none can run.
bool run_one() {
  std::vector<FakeStream*> all(g_streams);
  all.push_back(&g_legacy);
  std::shuffle(all.begin(), all.end(), g_rng);
  for (FakeStream* s : all) {
    if (s->ops.empty() || !s->ops.front().ready()) continue;
    Op op = std::move(s->ops.front());
    s->ops.pop_front();
    op.run();
    return true;
  }
  return false;
}

// The "device" moves on a little at each host call: one operation one time in five, so copies
// often lag several calls behind.
void progress() {
  if (g_rng() % 5 == 0) run_one();
}

void run_until(const std::function<bool()>& cond) {
  while (!cond())
    if (!run_one()) std::abort();  // a deadlock: a wait on an event never recorded to run
}

void enqueue(cudaStream_t s, Op op) {
  stream_of(s)->ops.push_back(std::move(op));
  progress();
}

bool all_idle() {
  for (FakeStream* s : g_streams)
    if (!s->ops.empty()) return false;
  return g_legacy.ops.empty();
}

}  // namespace

extern "C" {

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto* f = new FakeStream;
  g_streams.push_back(f);
  *s = reinterpret_cast<cudaStream_t>(f);
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  std::lock_guard<std::mutex> lock(g_mu);
  FakeStream* f = stream_of(s);
  run_until([f] { return f->ops.empty(); });
  std::erase(g_streams, f);
  delete f;
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int) {
  std::lock_guard<std::mutex> lock(g_mu);
  *e = reinterpret_cast<cudaEvent_t>(new FakeEvent);
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  std::lock_guard<std::mutex> lock(g_mu);
  delete reinterpret_cast<FakeEvent*>(e);
  return cudaSuccess;
}
cudaError_t cudaHostAlloc(void** p, size_t n, unsigned int) {
  std::lock_guard<std::mutex> lock(g_mu);
  *p = std::malloc(n);
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFreeHost(void* p) {
  std::lock_guard<std::mutex> lock(g_mu);
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaMalloc(void** p, size_t n) {
  std::lock_guard<std::mutex> lock(g_mu);
  progress();
  if (g_skip_mallocs > 0) {
    --g_skip_mallocs;
  } else if (g_fail_mallocs > 0) {
    --g_fail_mallocs;
    *p = nullptr;
    return cudaErrorMemoryAllocation;
  }
  *p = std::malloc(n);
  if (!*p) return cudaErrorMemoryAllocation;
  std::memset(*p, 0xEE, n);  // not zeros: a slot never written reads as garbage
  g_device[*p] = n;
  return cudaSuccess;
}
cudaError_t cudaFree(void* p) {
  std::lock_guard<std::mutex> lock(g_mu);
  run_until(all_idle);  // as the real cudaFree, which synchronizes the device
  g_device.erase(p);
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind, cudaStream_t s) {
  std::lock_guard<std::mutex> lock(g_mu);
  enqueue(s, {[] { return true; }, [=] { std::memcpy(dst, src, n); }});
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind) {
  std::lock_guard<std::mutex> lock(g_mu);
  std::memcpy(dst, src, n);  // the tests' streams are non-blocking: no implicit wait
  return cudaSuccess;
}
cudaError_t cudaMemcpyBatchAsync(void* const* dsts, const void* const* srcs, const size_t* sizes,
                                 size_t count, cudaMemcpyAttributes*, size_t*, size_t,
                                 cudaStream_t s) {
  std::lock_guard<std::mutex> lock(g_mu);
  for (size_t i = 0; i < count; ++i) {
    void* dst = dsts[i];
    const void* src = srcs[i];
    const size_t n = sizes[i];
    enqueue(s, {[] { return true; }, [=] { std::memcpy(dst, src, n); }});
  }
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto* ev = reinterpret_cast<FakeEvent*>(e);
  const uint64_t t = ++g_ticket;
  ev->recorded = t;
  enqueue(s, {[] { return true; }, [=] { ev->done = std::max(ev->done, t); }});
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
  std::lock_guard<std::mutex> lock(g_mu);
  progress();
  auto* ev = reinterpret_cast<FakeEvent*>(e);
  return ev->done >= ev->recorded ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto* ev = reinterpret_cast<FakeEvent*>(e);
  const uint64_t t = ev->recorded;
  run_until([=] { return ev->done >= t; });
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto* ev = reinterpret_cast<FakeEvent*>(e);
  const uint64_t t = ev->recorded;  // the record current at the call, as CUDA
  enqueue(s, {[=] { return ev->done >= t; }, [] {}});
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  std::lock_guard<std::mutex> lock(g_mu);
  FakeStream* f = stream_of(s);
  run_until([f] { return f->ops.empty(); });
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() {
  std::lock_guard<std::mutex> lock(g_mu);
  run_until(all_idle);
  return cudaSuccess;
}
cudaError_t cudaLaunchHostFunc(cudaStream_t, cudaHostFn_t, void*) {
  std::lock_guard<std::mutex> lock(g_mu);
  return cudaErrorNotSupported;  // a blocking host function would stall this single thread
}
cudaError_t cudaGetDevice(int* d) {
  *d = 0;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int) { return cudaSuccess; }
cudaError_t cudaGetLastError() { return cudaSuccess; }
// Host registration: copies read host memory either way; the fake only checks pairing.
cudaError_t cudaHostRegister(void* p, size_t n, unsigned int) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!p || n == 0 || !g_registered.emplace(p, n).second) return cudaErrorInvalidValue;
  return cudaSuccess;
}
cudaError_t cudaHostUnregister(void* p) {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_registered.erase(p) ? cudaSuccess : cudaErrorHostMemoryNotRegistered;
}
cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr a, int) {
  *v = a == cudaDevAttrHostRegisterReadOnlySupported ? 1 : 0;
  return cudaSuccess;
}
const char* cudaGetErrorString(cudaError_t) { return "fake runtime error"; }
const char* cudaGetErrorName(cudaError_t) { return "cudaErrorFake"; }
cudaError_t cudaMemGetInfo(size_t* free_b, size_t* total_b) {
  std::lock_guard<std::mutex> lock(g_mu);
  *free_b = size_t{1} << 30;
  *total_b = size_t{2} << 30;
  return cudaSuccess;
}

}  // extern "C"

namespace moestream::gpu {
int device_count(const char**) { return 1; }
}  // namespace moestream::gpu

namespace moestream::fake_cuda {
void fail_next_mallocs(int n, int skip) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_skip_mallocs = skip;
  g_fail_mallocs = n;
}
size_t live_device_bytes() {
  std::lock_guard<std::mutex> lock(g_mu);
  size_t total = 0;
  for (const auto& [p, n] : g_device) total += n;
  return total;
}
size_t registered_ranges() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_registered.size();
}
size_t pending_ops() {
  std::lock_guard<std::mutex> lock(g_mu);
  size_t n = g_legacy.ops.size();
  for (FakeStream* s : g_streams) n += s->ops.size();
  return n;
}
}  // namespace moestream::fake_cuda
