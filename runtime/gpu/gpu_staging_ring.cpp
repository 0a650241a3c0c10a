// Implementation of runtime/gpu/gpu_staging_ring.h.
#include "runtime/gpu/gpu_staging_ring.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "common/error.h"
#include "common/timing.h"
#include "kernels/cuda/cuda_check.cuh"
#include "runtime/gpu/gpu_host_pin.h"

namespace moestream {

GpuStagingRing::GpuStagingRing(size_t bytes, cudaStream_t copy, GpuEventPool& events,
                               bool batch_copies)
    : events_(events), copy_(copy), batch_copies_(batch_copies), bytes_(bytes) {
  staging_ = gpu_alloc_pinned(bytes_, "pinned host staging");
}

GpuStagingRing::~GpuStagingRing() {
  for (const Batch& b : batches_) cudaEventDestroy(b.done);
  cudaFreeHost(staging_);
}

void GpuStagingRing::retire_front() {
  Batch& b = batches_.front();
  completed_seq_ = b.seq;
  events_.give(b.done);
  batches_.pop_front();
}

void GpuStagingRing::poll() {
  while (!batches_.empty() && gpu_event_done(batches_.front().done)) retire_front();
}

void GpuStagingRing::wait(uint64_t seq) {
  while (completed_seq_ < seq) {
    MOE_ASSERT(!batches_.empty(), "waiting for a copy batch that was never issued");
    MOE_CUDA_CHECK(cudaEventSynchronize(batches_.front().done));
    retire_front();
  }
}

cudaEvent_t GpuStagingRing::event_of(uint64_t seq) const {
  MOE_ASSERT(!batches_.empty() && seq >= batches_.front().seq && seq <= batches_.back().seq,
             "copy batch not in flight");
  return batches_[size_t(seq - batches_.front().seq)].done;
}

void GpuStagingRing::retire_all() {
  while (!batches_.empty()) retire_front();
  head_ = 0;
}

// `n` contiguous bytes of staging that no in-flight copy reads.
size_t GpuStagingRing::reserve(size_t n) {
  MOE_ASSERT(n <= bytes_, "staging request larger than the ring");
  size_t start = head_ + n <= bytes_ ? head_ : 0;
  uint64_t must_finish = 0;
  for (const Batch& b : batches_)
    if (b.stage_begin < start + n && start < b.stage_end) must_finish = b.seq;
  if (must_finish) wait(must_finish);
  head_ = start + n;
  return start;
}

void GpuStagingRing::issue_runs(std::vector<void*>& dst, std::vector<const void*>& src,
                                std::vector<size_t>& sizes) {
  const size_t n = dst.size();
#if CUDART_VERSION >= 12080
  if (n > 1 && batch_copies_) {
    cudaMemcpyAttributes attr{};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
    size_t attr_idx = 0;
#if CUDART_VERSION >= 13000
    cudaError_t e = cudaMemcpyBatchAsync(dst.data(), src.data(), sizes.data(), n, &attr,
                                         &attr_idx, 1, copy_);
#else
    size_t fail_idx = 0;
    cudaError_t e = cudaMemcpyBatchAsync(dst.data(), const_cast<void**>(src.data()), sizes.data(),
                                         n, &attr, &attr_idx, 1, &fail_idx, copy_);
#endif
    if (e == cudaSuccess) return;
    // A driver older than the runtime: plain copies from now on.
    cudaGetLastError();
    batch_copies_ = false;
  }
#endif
  for (size_t i = 0; i < n; ++i)
    MOE_CUDA_CHECK(cudaMemcpyAsync(dst[i], src[i], sizes[i], cudaMemcpyHostToDevice, copy_));
}

uint64_t GpuStagingRing::upload(std::vector<GpuCopy>& cs, uint64_t& h2d_copies,
                                uint64_t& h2d_bytes) {
  std::sort(cs.begin(), cs.end(), [](const GpuCopy& a, const GpuCopy& b) { return a.dst < b.dst; });
  const size_t group_cap = bytes_ / 2;
  std::vector<void*> dst;
  std::vector<const void*> src;
  std::vector<size_t> sizes;
  size_t i = 0;
  while (i < cs.size()) {
    size_t j = i, staged = 0, total = 0;
    while (j < cs.size() && (j == i || cs[j].direct || staged + cs[j].bytes <= group_cap)) {
      if (!cs[j].direct) staged += cs[j].bytes;
      total += cs[j++].bytes;
    }
    const size_t start = reserve(staged);
    dst.clear(), src.clear(), sizes.clear();
    size_t off = start;
    for (size_t k = i; k < j; ++k) {
      const uint8_t* from = cs[k].src;
      if (!cs[k].direct) {
        std::memcpy(staging_ + off, cs[k].src, cs[k].bytes);
        from = staging_ + off;
        off += cs[k].bytes;
      }
      // Adjacent on the device and at the source (staged neighbours are, by construction): one copy.
      if (!dst.empty() && cs[k].region && cs[k].region == cs[k - 1].region &&
          static_cast<uint8_t*>(dst.back()) + sizes.back() == cs[k].dst &&
          static_cast<const uint8_t*>(src.back()) + sizes.back() == from) {
        sizes.back() += cs[k].bytes;
      } else {
        dst.push_back(cs[k].dst);
        src.push_back(from);
        sizes.push_back(cs[k].bytes);
      }
    }
    issue_runs(dst, src, sizes);
    h2d_copies += dst.size();
    h2d_bytes += total;
    Batch b{++next_seq_, events_.take(), start, start + staged};
    MOE_CUDA_CHECK(cudaEventRecord(b.done, copy_));
    batches_.push_back(b);
    for (size_t k = i; k < j; ++k) cs[k].seq = b.seq;
    i = j;
  }
  return next_seq_;
}

GpuExpertParts GpuExpertParts::of(const ExpertLayout& lay, size_t hidden, size_t intermediate) {
  GpuExpertParts p;
  p.layout = lay;
  p.gate_bytes = quant_matrix_bytes(lay.types.gate, intermediate, hidden);
  p.up_bytes = quant_matrix_bytes(lay.types.up, intermediate, hidden);
  p.down_bytes = quant_matrix_bytes(lay.types.down, hidden, intermediate);
  p.bias_bytes = lay.types.bias ? (2 * intermediate + hidden) * sizeof(float) : 0;
  return p;
}

uint64_t GpuStagingRing::read_and_upload(ExpertStore& store, int layer, const std::vector<int>& ids,
                                         std::vector<GpuCopy>& cs, const GpuExpertParts& parts,
                                         const GpuPinnedMappings* pinned, GpuCacheTelemetry& tel,
                                         const std::function<void(const GpuCopy&)>& on_copied) {
  const ExpertLayout& lay = parts.layout;
  store.begin_fetch(layer, ids, FetchForm::kMatrices);
  std::vector<GpuCopy> landed;
  std::vector<uint8_t> taken(cs.size(), 0);
  size_t index = 0, got = 0;
  ExpertMatrices m;
  uint64_t last = 0;
  auto part = [&](const GpuCopy& c, size_t offset, const uint8_t* from, size_t n) {
    GpuCopy p = c;
    p.dst = c.dst + offset;
    p.src = from;
    p.bytes = n;
    p.direct = pinned != nullptr && pinned->contains(from, n);
    if (p.direct) tel.h2d_direct_bytes += n;
    landed.push_back(p);
  };
  auto take = [&] {
    MOE_ASSERT(index < cs.size() && !taken[index], "store handed out an expert twice");
    taken[index] = 1;
    ++got;
    const GpuCopy& c = cs[index];
    MOE_ASSERT(c.bytes == lay.bytes, "a copy of another size than the layer's experts");
    const uint8_t* base = m.gate - lay.gate_offset;
    const bool one_payload = m.up == base + lay.up_offset && m.down == base + lay.down_offset &&
                             (!m.bias || reinterpret_cast<const uint8_t*>(m.bias) == base + lay.bias_offset);
    if (one_payload) {
      part(c, 0, base, lay.bytes);
      return;
    }
    part(c, lay.gate_offset, m.gate, parts.gate_bytes);
    part(c, lay.up_offset, m.up, parts.up_bytes);
    part(c, lay.down_offset, m.down, parts.down_bytes);
    if (m.bias) part(c, lay.bias_offset, reinterpret_cast<const uint8_t*>(m.bias), parts.bias_bytes);
  };
  for (;;) {
    const auto t0 = std::chrono::steady_clock::now();
    const bool any = store.next_ready(&index, &m, true);
    tel.demand_wait_s += seconds_since(t0);
    if (!any) break;
    landed.clear();
    take();
    while (store.next_ready(&index, &m, false)) take();
    last = upload(landed, tel.h2d_copies, tel.h2d_bytes);
    for (const GpuCopy& c : landed) on_copied(c);
  }
  MOE_ASSERT(got == cs.size(), "store handed out fewer experts than asked");
  return last;
}

GpuStagingEntries::GpuStagingEntries(size_t entry_bytes, size_t n) : entry_bytes_(entry_bytes) {
  MOE_ASSERT(n > 0, "staging without entries");
  staging_ = gpu_alloc_pinned(n * entry_bytes, "pinned host staging for prefetches");
  used_.assign(n, 0);
  try {
    for (size_t i = 0; i < n; ++i) {
      cudaEvent_t e;
      MOE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      done_.push_back(e);
    }
  } catch (...) {
    for (cudaEvent_t e : done_) cudaEventDestroy(e);
    cudaFreeHost(staging_);
    throw;
  }
}

GpuStagingEntries::~GpuStagingEntries() {
  for (cudaEvent_t e : done_) cudaEventDestroy(e);
  cudaFreeHost(staging_);
}

uint8_t* GpuStagingEntries::next() {
  current_ = next_;
  next_ = (next_ + 1) % done_.size();
  if (used_[current_]) MOE_CUDA_CHECK(cudaEventSynchronize(done_[current_]));
  return staging_ + current_ * entry_bytes_;
}

void GpuStagingEntries::record(cudaStream_t stream) {
  MOE_CUDA_CHECK(cudaEventRecord(done_[current_], stream));
  used_[current_] = 1;
}

}  // namespace moestream
