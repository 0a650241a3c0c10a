// The pread(2) ExpertStore: one open file per layer, headers validated against model.json on
// open, logical ids mapped to slots by the layer's .map (identity when absent), each fetched
// expert read into its own 64-byte aligned buffer and checksum-verified.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/error.h"
#include "common/file_util.h"
#include "common/timing.h"
#include "loader/format/expert_map.h"
#include "loader/format/expert_layer_file.h"
#include "loader/store/expert_buffer.h"
#include "loader/store/expert_store.h"

namespace moestream {
namespace {

class PreadExpertStore final : public ExpertStore {
 public:
  PreadExpertStore(const std::filesystem::path& model_dir, const ModelConfig& cfg,
                   const ExpertStoreOptions& opts)
      : model_dir_(model_dir), cfg_(cfg), opts_(opts) {
    // Buffers are 64-byte aligned so the matrices inside keep their kMatrixAlign alignment; each
    // holds the largest expert (a pack converted from a mixed GGUF has several sizes).
    buf_stride_ = (cfg.max_expert_bytes() + kMatrixAlign - 1) / kMatrixAlign * kMatrixAlign;
    for (int l = 0; l < cfg.n_moe_layers(); ++l) {  // MoE layers only (model_config.h)
      Layer layer;
      static_cast<ExpertLayerFile&>(layer) = open_expert_layer_file(model_dir, cfg, l);
      layer.fd = ::open(layer.path.c_str(), O_RDONLY | O_CLOEXEC);
      if (layer.fd < 0) {
        close_all();
        throw_errno("cannot open expert file", layer.path);
      }
      layer.expert_bytes = cfg.expert_layout(l).bytes;
      layers_.push_back(std::move(layer));
    }
  }

  ~PreadExpertStore() override { close_all(); }

  std::unique_ptr<ExpertStore> reopen() const override {
    return std::make_unique<PreadExpertStore>(model_dir_, cfg_, opts_);
  }

  // Reads every expert here, one blocking pread each; next_ready then hands them out in order. A
  // read that fails leaves nothing to hand out.
  void begin_fetch(int layer, std::span<const int> ids, FetchForm form) override {
    (void)form;  // always payloads: nothing is mapped
    MOE_ASSERT(layer >= 0 && layer < static_cast<int>(layers_.size()), "layer out of range");
    const Layer& L = layers_[layer];
    const size_t expert_bytes = L.expert_bytes;
    auto t0 = std::chrono::steady_clock::now();
    n_ready_ = next_ = 0;
    uint8_t* const buf = buf_.reserve(ids.size(), buf_stride_, kMatrixAlign);
    out_.resize(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      const int id = ids[i];
      MOE_ASSERT(id >= 0 && static_cast<uint32_t>(id) < L.header.n_experts, "expert id out of range");
      uint8_t* dst = buf + i * buf_stride_;
      const uint32_t slot = L.map.physical(static_cast<uint32_t>(id));
      const uint64_t off = L.header.slot_offset(slot);
      read_exact(L, dst, expert_bytes, off);
      if (opts_.verify_checksums) {
        auto c0 = std::chrono::steady_clock::now();
        uint64_t got = expert_checksum(L.header.payload_hash, dst, expert_bytes);
        stats_.checksum_seconds += seconds_since(c0);
        uint64_t want = L.header.slot_checksums[slot];
        if (got != want)
          throw expert_checksum_error(L, slot, expert_bytes, got);
      }
      out_[i] = dst;
      stats_.bytes_read += expert_bytes;
      stats_.bytes_transferred += expert_bytes;
    }
    // One synchronous pread per expert, no coalescing; all of the time is waited for.
    const double waited = seconds_since(t0);
    stats_.fetch_calls += 1;
    stats_.experts_requested += ids.size();
    stats_.experts_read += ids.size();
    stats_.read_ops_requested += ids.size();
    stats_.read_ops_issued += ids.size();
    stats_.io_seconds += waited;
    stats_.io_wait_seconds += waited;
    layout_ = cfg_.expert_layout(layer);
    n_ready_ = ids.size();
  }

  bool next_ready(size_t* index, ExpertMatrices* m, bool wait) override {
    (void)wait;  // everything is ready after begin_fetch()
    if (next_ >= n_ready_) return false;
    *index = next_;
    *m = ExpertMatrices::of_payload(out_[next_++], layout_);
    return true;
  }

  ExpertStoreStats stats() const override { return stats_; }

 private:
  struct Layer : ExpertLayerFile {
    int fd = -1;
    size_t expert_bytes = 0;  // this layer's payload (ExpertLayout::bytes)
  };

  static void read_exact(const Layer& L, uint8_t* dst, size_t n, uint64_t off) {
    size_t done = 0;
    while (done < n) {
      ssize_t r = ::pread(L.fd, dst + done, n - done, static_cast<off_t>(off + done));
      if (r < 0) {
        if (errno == EINTR) continue;
        throw IoError("cannot read " + L.path.string() + " at offset " + std::to_string(off + done) +
                      " (" + std::to_string(n - done) + " bytes): " + std::strerror(errno));
      }
      if (r == 0)
        throw IoError(L.path.string() + ": truncated: expert at offset " + std::to_string(off) +
                      " needs " + std::to_string(n) + " bytes, file ends after " + std::to_string(done));
      done += static_cast<size_t>(r);
    }
  }

  void close_all() {
    for (Layer& L : layers_)
      if (L.fd >= 0) {
        ::close(L.fd);
        L.fd = -1;
      }
  }

  std::filesystem::path model_dir_;  // for reopen()
  ModelConfig cfg_;
  ExpertStoreOptions opts_;
  size_t buf_stride_ = 0;
  std::vector<Layer> layers_;
  ExpertBuffer buf_;
  std::vector<const uint8_t*> out_;  // the last begin_fetch()'s payloads, handed out from next_
  size_t n_ready_ = 0;               // how many: 0 until every read of the fetch passed
  size_t next_ = 0;
  ExpertLayout layout_;              // their layer's
  ExpertStoreStats stats_;
};

}  // namespace

std::unique_ptr<ExpertStore> open_pread_expert_store(const std::filesystem::path& model_dir,
                                                     const ModelConfig& cfg,
                                                     const ExpertStoreOptions& opts) {
  return std::make_unique<PreadExpertStore>(model_dir, cfg, opts);
}

}  // namespace moestream
