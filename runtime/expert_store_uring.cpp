// ExpertStore over the read engine: per fetch, logical ids -> physical slots (.map), one batch
// of slot-sized reads into a 4 KiB aligned arena (adjacent slots land as one read), checksums.
#include "runtime/expert_store_uring.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/error.h"
#include "loader/expert_file.h"
#include "loader/expert_map.h"

namespace moestream {
namespace {

constexpr uint64_t kSlotAlign = kExpertAlign;  // O_DIRECT and page granularity

struct FreeDeleter {
  void operator()(uint8_t* p) const { std::free(p); }
};

std::string hex64(uint64_t v) {
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

class EngineExpertStore final : public ExpertStore {
 public:
  EngineExpertStore(const std::filesystem::path& model_dir, const ModelConfig& cfg,
                    const EngineExpertStoreOptions& opts)
      : opts_(opts), engine_(opts.io) {
    layout_ = ExpertLayout::make(cfg.expert_quant, cfg.hidden_size, cfg.moe_intermediate_size);
    // Reading whole 4 KiB pages keeps O_DIRECT reads in place, and when the file's slot stride
    // is the same, neighbouring slots read into neighbouring buffers form one contiguous read.
    read_bytes_ = (layout_.bytes + kSlotAlign - 1) / kSlotAlign * kSlotAlign;
    const std::filesystem::path dir = model_dir / cfg.experts_dir;
    for (int l = 0; l < cfg.n_layers; ++l) {
      char name[32];
      std::snprintf(name, sizeof name, "layer_%03d", l);
      Layer L;
      L.path = dir / (std::string(name) + ".bin");
      L.header = read_expert_header(L.path);
      check(L, l, cfg);
      if (L.header.expert_stride < read_bytes_)
        throw FormatError(L.path.string() + ": expert_stride " +
                          std::to_string(L.header.expert_stride) + " is below the 4 KiB rounded " +
                          "expert size " + std::to_string(read_bytes_));
      L.map = opts.use_maps ? load_expert_map_file(dir / (std::string(name) + ".map"), L.header.n_experts)
                            : ExpertMap::identity(L.header.n_experts);
      L.file = engine_.add_file(L.path);
      layers_.push_back(std::move(L));
    }
  }

  void fetch(int layer, std::span<const int> ids, std::vector<const uint8_t*>& out) override {
    MOE_ASSERT(layer >= 0 && layer < static_cast<int>(layers_.size()), "layer out of range");
    const Layer& L = layers_[layer];
    auto t0 = std::chrono::steady_clock::now();
    // Unique physical slots in file order; buffer k holds the k-th, so neighbours in the file
    // are neighbours in memory.
    slots_.clear();
    for (int id : ids) {
      MOE_ASSERT(id >= 0 && static_cast<uint32_t>(id) < L.header.n_experts, "expert id out of range");
      slots_.push_back(L.map.physical(static_cast<uint32_t>(id)));
    }
    std::sort(slots_.begin(), slots_.end());
    slots_.erase(std::unique(slots_.begin(), slots_.end()), slots_.end());
    if (slots_.size() > buf_slots_) {
      void* p = std::aligned_alloc(kSlotAlign, read_bytes_ * slots_.size());
      if (p == nullptr)
        throw IoError("out of memory for " + std::to_string(slots_.size()) + " expert buffers");
      buf_.reset(static_cast<uint8_t*>(p));
      buf_slots_ = slots_.size();
    }
    reqs_.resize(slots_.size());
    for (size_t k = 0; k < slots_.size(); ++k)
      reqs_[k] = {L.file, L.header.slot_offset(slots_[k]), read_bytes_, buf_.get() + k * read_bytes_};
    engine_.read(reqs_);  // one IoError for the batch, naming file, offset and length

    for (size_t k = 0; k < slots_.size() && opts_.store.verify_checksums; ++k) {
      const uint8_t* p = buf_.get() + k * read_bytes_;
      uint64_t got = expert_checksum(p, layout_.bytes);
      uint64_t want = L.header.slot_checksums[slots_[k]];
      if (got != want)
        throw FormatError(L.path.string() + ": checksum mismatch for expert " +
                          std::to_string(L.map.logical(slots_[k])) + " (physical slot " +
                          std::to_string(slots_[k]) + " at offset " +
                          std::to_string(L.header.slot_offset(slots_[k])) + ", " +
                          std::to_string(layout_.bytes) + " bytes): header says " + hex64(want) +
                          ", data hashes to " + hex64(got));
    }
    out.resize(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      uint32_t slot = L.map.physical(static_cast<uint32_t>(ids[i]));
      size_t k = std::lower_bound(slots_.begin(), slots_.end(), slot) - slots_.begin();
      out[i] = buf_.get() + k * read_bytes_;
    }
    stats_.fetch_calls += 1;
    stats_.experts_requested += ids.size();
    stats_.experts_read += slots_.size();
    stats_.bytes_read += slots_.size() * layout_.bytes;
    stats_.io_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  ExpertStoreStats stats() const override { return stats_; }

 private:
  struct Layer {
    std::filesystem::path path;
    ExpertFileHeader header;
    ExpertMap map;
    uint32_t file = 0;
  };

  void check(const Layer& L, int l, const ModelConfig& cfg) const {
    auto mismatch = [&](const char* field, const std::string& got, const std::string& want) {
      throw FormatError(L.path.string() + ": header field '" + field + "' is " + got +
                        " but model.json says " + want);
    };
    const ExpertFileHeader& h = L.header;
    if (h.quant != cfg.expert_quant)
      mismatch("quant", std::string(quant_name(h.quant)), std::string(quant_name(cfg.expert_quant)));
    if (h.layer != static_cast<uint32_t>(l)) mismatch("layer", std::to_string(h.layer), std::to_string(l));
    if (h.n_experts != static_cast<uint32_t>(cfg.n_experts))
      mismatch("n_experts", std::to_string(h.n_experts), std::to_string(cfg.n_experts));
    if (h.hidden != static_cast<uint32_t>(cfg.hidden_size))
      mismatch("hidden", std::to_string(h.hidden), std::to_string(cfg.hidden_size));
    if (h.intermediate != static_cast<uint32_t>(cfg.moe_intermediate_size))
      mismatch("intermediate", std::to_string(h.intermediate), std::to_string(cfg.moe_intermediate_size));
  }

  EngineExpertStoreOptions opts_;
  IoEngine engine_;
  ExpertLayout layout_;
  uint64_t read_bytes_ = 0;
  std::vector<Layer> layers_;
  std::unique_ptr<uint8_t, FreeDeleter> buf_;
  size_t buf_slots_ = 0;
  std::vector<uint32_t> slots_;
  std::vector<ReadRequest> reqs_;
  ExpertStoreStats stats_;
};

}  // namespace

std::unique_ptr<ExpertStore> open_engine_expert_store(const std::filesystem::path& model_dir,
                                                      const ModelConfig& cfg,
                                                      const EngineExpertStoreOptions& opts) {
  return std::make_unique<EngineExpertStore>(model_dir, cfg, opts);
}

std::unique_ptr<ExpertStore> open_expert_store(std::string_view io,
                                               const std::filesystem::path& model_dir,
                                               const ModelConfig& cfg,
                                               EngineExpertStoreOptions opts) {
  if (io == "simple") return open_pread_expert_store(model_dir, cfg, opts.store);
  IoBackend b;
  try {
    b = parse_io_backend(io);
  } catch (const ConfigError&) {
    throw ConfigError("unknown --io value '" + std::string(io) +
                      "' (expected simple, auto, uring, pread or mmap)");
  }
  opts.io.backend = b;
  return open_engine_expert_store(model_dir, cfg, opts);
}

}  // namespace moestream
