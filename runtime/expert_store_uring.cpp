// ExpertStore over the read engine: logical ids -> physical slots (.map), host-cache hits at once,
// misses read by a background thread in one coalesced batch and handed out as each one lands.
#include "runtime/expert_store_uring.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "loader/expert_file.h"
#include "loader/expert_map.h"
#include "loader/host_cache.h"
#include "loader/residency.h"
#include "runtime/expert_layer_file.h"

namespace moestream {
namespace {

constexpr uint64_t kSlotAlign = kExpertAlign;  // O_DIRECT and page granularity

struct FreeDeleter {
  void operator()(uint8_t* p) const { std::free(p); }
};

class EngineExpertStore final : public ExpertStore {
 public:
  EngineExpertStore(const std::filesystem::path& model_dir, const ModelConfig& cfg,
                    const EngineExpertStoreOptions& opts)
      : opts_(opts), engine_(opts.io) {
    layout_ = ExpertLayout::make(cfg.expert_quant, cfg.hidden_size, cfg.moe_intermediate_size);
    // Reading whole 4 KiB pages keeps O_DIRECT reads in place, and when the file's slot stride
    // is the same, neighbouring slots read into neighbouring buffers form one contiguous read.
    read_bytes_ = (layout_.bytes + kSlotAlign - 1) / kSlotAlign * kSlotAlign;
    for (int l = 0; l < cfg.n_layers; ++l) {
      Layer L;
      static_cast<ExpertLayerFile&>(L) = open_expert_layer_file(model_dir, cfg, l, opts.use_maps);
      if (L.header.expert_stride < read_bytes_)
        throw FormatError(L.path.string() + ": expert_stride " +
                          std::to_string(L.header.expert_stride) + " is below the 4 KiB rounded " +
                          "expert size " + std::to_string(read_bytes_));
      L.file = engine_.add_file(L.path);
      // Page-cache residency means something only for reads that go through the page cache.
      if (!engine_.file_is_direct(L.file))
        L.page_cache = std::make_unique<PageCacheResidency>(L.path);
      layers_.push_back(std::move(L));
    }
    if (opts.host_cache_bytes > 0) {
      cache_ = std::make_unique<HostCache>(opts.host_cache_bytes, read_bytes_);
      cache_verified_.assign(cache_->n_slots(), false);
    }
    io_thread_ = std::thread([this] { io_loop(); });
  }

  ~EngineExpertStore() override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return !busy_; });  // a batch in flight writes into our buffers
      stop_ = true;
    }
    cv_.notify_all();
    io_thread_.join();
  }

  void fetch(int layer, std::span<const int> ids, std::vector<const uint8_t*>& out) override {
    begin_fetch(layer, ids);
    out.assign(ids.size(), nullptr);
    size_t i = 0;
    const uint8_t* p = nullptr;
    while (next_ready(&i, &p, true)) out[i] = p;
  }

  void begin_fetch(int layer, std::span<const int> ids) override {
    MOE_ASSERT(layer >= 0 && layer < static_cast<int>(layers_.size()), "layer out of range");
    finish_previous();
    const Layer& L = layers_[layer];
    layer_ = layer;
    // Unique physical slots in file order, so neighbours in the file read as one extent.
    items_.clear();
    for (int id : ids) {
      MOE_ASSERT(id >= 0 && static_cast<uint32_t>(id) < L.header.n_experts, "expert id out of range");
      items_.push_back(Item{L.map.physical(static_cast<uint32_t>(id))});
    }
    std::sort(items_.begin(), items_.end(), [](const Item& a, const Item& b) { return a.slot < b.slot; });
    items_.erase(std::unique(items_.begin(), items_.end(),
                             [](const Item& a, const Item& b) { return a.slot == b.slot; }),
                 items_.end());
    position_item_.resize(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      uint32_t slot = L.map.physical(static_cast<uint32_t>(ids[i]));
      position_item_[i] = uint32_t(std::lower_bound(items_.begin(), items_.end(), slot,
                                                    [](const Item& a, uint32_t s) { return a.slot < s; }) -
                                   items_.begin());
    }
    ready_.clear();
    ready_head_ = 0;
    handed_ = 0;
    n_positions_ = ids.size();

    // Hits first (and pinned), so that placing the misses cannot evict an expert of this fetch.
    if (cache_)
      for (size_t k = 0; k < items_.size(); ++k) {
        if (auto cs = cache_->policy().lookup(HostCache::key(uint32_t(layer), items_[k].slot))) {
          items_[k].data = cache_->slot_data(*cs);
          items_[k].cache_slot = int64_t(*cs);
          items_[k].ready = true;
          cache_->policy().pin(*cs);
          pinned_.push_back(*cs);
          ++stats_.host_cache_hits;
        }
      }
    size_t n_scratch = 0;
    for (Item& it : items_) {
      if (it.ready) continue;
      if (cache_)
        if (auto cs = cache_->policy().insert(HostCache::key(uint32_t(layer), it.slot))) {
          it.cache_slot = int64_t(*cs);
          it.data = cache_->slot_data(*cs);
          cache_->policy().pin(*cs);
          pinned_.push_back(*cs);
          cache_verified_[*cs] = false;
          continue;
        }
      it.scratch = n_scratch++;
    }
    ensure_scratch(n_scratch);
    reqs_.clear();
    req_item_.clear();
    for (size_t k = 0; k < items_.size(); ++k) {
      Item& it = items_[k];
      if (it.ready) {
        push_ready(k);
        continue;
      }
      if (it.cache_slot < 0) it.data = scratch_.get() + it.scratch * read_bytes_;
      const uint64_t off = L.header.slot_offset(it.slot);
      if (L.page_cache && opts_.count_page_cache_hits &&
          L.page_cache->sample(off, layout_.bytes, 2).fully_resident())
        ++stats_.page_cache_hits;
      ReadRequest r;
      r.file = L.file;
      r.offset = off;
      r.length = read_bytes_;
      r.dest = const_cast<uint8_t*>(it.data);
      reqs_.push_back(r);
      req_item_.push_back(uint32_t(k));
    }
    stats_.fetch_calls += 1;
    stats_.experts_requested += ids.size();
    stats_.experts_read += reqs_.size();
    stats_.bytes_read += reqs_.size() * layout_.bytes;
    if (reqs_.empty()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      landed_.clear();
      landed_head_ = 0;
      busy_ = true;
      job_ = true;
    }
    cv_.notify_all();
  }

  bool next_ready(size_t* index, const uint8_t** payload, bool wait) override {
    while (ready_head_ == ready_.size()) {
      if (handed_ >= n_positions_) return false;
      size_t r;
      {
        std::unique_lock<std::mutex> lock(mu_);
        if (landed_head_ == landed_.size()) {
          if (!wait) return false;
          auto t0 = std::chrono::steady_clock::now();
          cv_.wait(lock, [&] { return landed_head_ < landed_.size(); });
          stats_.io_wait_seconds += seconds_since(t0);
        }
        r = landed_[landed_head_++];
      }
      land(r);
    }
    const size_t pos = ready_[ready_head_++];
    *index = pos;
    *payload = items_[position_item_[pos]].data;
    ++handed_;
    return true;
  }

  void residency(int layer, std::span<ExpertTier> out) const override {
    MOE_ASSERT(layer >= 0 && layer < static_cast<int>(layers_.size()), "layer out of range");
    const Layer& L = layers_[layer];
    MOE_ASSERT(out.size() == L.header.n_experts, "residency: out must hold n_experts entries");
    for (uint32_t e = 0; e < L.header.n_experts; ++e) {
      const uint32_t slot = L.map.physical(e);
      if (cache_ && cache_->policy().peek(HostCache::key(uint32_t(layer), slot)))
        out[e] = ExpertTier::kHostCache;
      else if (L.page_cache && L.page_cache->sample(L.header.slot_offset(slot), layout_.bytes, 2).fully_resident())
        out[e] = ExpertTier::kPageCache;
      else
        out[e] = ExpertTier::kStorage;
    }
  }

  std::string describe() const override {
    std::string s = "engine " + std::string(io_backend_name(engine_.backend()));
    const IoEngineOptions& o = engine_.options();
    size_t direct = 0;
    for (const Layer& L : layers_) direct += engine_.file_is_direct(L.file);
    s += direct == layers_.size() ? ", O_DIRECT" : direct ? ", O_DIRECT on some files" : ", buffered";
    if (engine_.backend() == IoBackend::kUring)
      s += ", " + std::to_string(o.n_rings) + " rings x QD " + std::to_string(o.queue_depth);
    else
      s += ", " + std::to_string(o.n_threads) + " threads";
    s += ", coalesce gap " + std::to_string(o.coalesce ? o.coalesce_gap_bytes >> 10 : 0) +
         " KiB, max read " + std::to_string(o.max_read_bytes >> 10) + " KiB";
    if (cache_) {
      char buf[96];
      std::snprintf(buf, sizeof buf, ", host cache %.1f MiB (%u experts)",
                    double(uint64_t(cache_->n_slots()) * cache_->slot_bytes()) / (1 << 20),
                    cache_->n_slots());
      s += buf;
    }
    if (!opts_.store.verify_checksums) s += ", checksums off";
    return s;
  }

  ExpertStoreStats stats() const override {
    ExpertStoreStats s;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return !busy_; });
      s = stats_;
    }
    const IoEngineStats e = engine_.stats();
    s.read_ops_requested = e.requests;
    s.read_ops_issued = e.reads_issued;
    s.bytes_transferred = e.bytes_read;
    return s;
  }

 private:
  struct Layer : ExpertLayerFile {
    uint32_t file = 0;
    std::unique_ptr<PageCacheResidency> page_cache;  // null for O_DIRECT files
  };
  struct Item {
    uint32_t slot = 0;               // physical slot in the layer file
    const uint8_t* data = nullptr;   // where the payload is (or lands)
    int64_t cache_slot = -1;         // host cache slot, or -1 (scratch buffer)
    size_t scratch = 0;
    bool ready = false;
  };

  static double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  // Every position of `ids` that names item k becomes ready.
  void push_ready(size_t k) {
    for (size_t i = 0; i < position_item_.size(); ++i)
      if (position_item_[i] == k) ready_.push_back(i);
  }

  // A read landed: check its outcome and checksum (here, on the caller's thread, so errors
  // throw where the caller can catch them), then release its expert.
  void land(size_t r) {
    const ReadRequest& q = reqs_[r];
    const size_t k = req_item_[r];
    Item& it = items_[k];
    const Layer& L = layers_[layer_];
    if (q.result != ReadResult::kOk) {
      std::string where = L.path.string() + " at offset " + std::to_string(q.offset) + " length " +
                          std::to_string(q.length);
      if (q.result == ReadResult::kTruncated)
        throw IoError("truncated file: read of " + where + " hit end of file (file has " +
                      std::to_string(engine_.file_size(L.file)) + " bytes at open)");
      throw IoError("read of " + where + " failed: " + std::strerror(q.error));
    }
    if (opts_.store.verify_checksums) {
      auto t0 = std::chrono::steady_clock::now();
      uint64_t got = expert_checksum(it.data, layout_.bytes);
      stats_.checksum_seconds += seconds_since(t0);
      uint64_t want = L.header.slot_checksums[it.slot];
      if (got != want)
        throw expert_checksum_error(L, it.slot, layout_.bytes, got);
    }
    if (it.cache_slot >= 0) cache_verified_[size_t(it.cache_slot)] = true;
    it.ready = true;
    push_ready(k);
  }

  // Waits out the previous batch, releases its pins, and forgets cache slots whose data never
  // proved good (failed read, bad checksum, or a fetch abandoned after an error).
  void finish_previous() {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return !busy_; });
    }
    if (!cache_) return;
    for (const Item& it : items_)
      if (it.cache_slot >= 0 && !cache_verified_[size_t(it.cache_slot)])
        cache_->policy().erase(HostCache::key(uint32_t(layer_), it.slot));
    for (uint32_t cs : pinned_) cache_->policy().unpin(cs);
    pinned_.clear();
  }

  void ensure_scratch(size_t n) {
    if (n <= scratch_slots_) return;
    void* p = std::aligned_alloc(kSlotAlign, read_bytes_ * n);
    if (p == nullptr) throw IoError("out of memory for " + std::to_string(n) + " expert buffers");
    scratch_.reset(static_cast<uint8_t*>(p));
    scratch_slots_ = n;
  }

  // The I/O thread: runs one batch at a time; the engine reports each request as it lands.
  void io_loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return job_ || stop_; });
      if (stop_) return;
      job_ = false;
      lock.unlock();
      auto t0 = std::chrono::steady_clock::now();
      engine_.submit(reqs_, [this](const ReadRequest&, size_t index) {
        {
          std::lock_guard<std::mutex> g(mu_);
          landed_.push_back(index);
        }
        cv_.notify_all();
      });
      const double dt = seconds_since(t0);
      lock.lock();
      stats_.io_seconds += dt;
      busy_ = false;
      cv_.notify_all();
    }
  }


  EngineExpertStoreOptions opts_;
  IoEngine engine_;
  ExpertLayout layout_;
  uint64_t read_bytes_ = 0;
  std::vector<Layer> layers_;
  std::unique_ptr<HostCache> cache_;
  std::vector<bool> cache_verified_;  // per cache slot: data passed its read and checksum
  std::vector<uint32_t> pinned_;      // cache slots the current fetch hands out
  std::unique_ptr<uint8_t, FreeDeleter> scratch_;  // misses the cache does not take
  size_t scratch_slots_ = 0;

  // The current fetch (caller's thread only).
  int layer_ = 0;
  std::vector<Item> items_;
  std::vector<uint32_t> position_item_;  // ids position -> item
  std::vector<size_t> ready_;            // positions ready to hand out
  size_t ready_head_ = 0, handed_ = 0, n_positions_ = 0;
  std::vector<ReadRequest> reqs_;        // the misses' reads (read by the I/O thread)
  std::vector<uint32_t> req_item_;       // request -> item

  // Shared with the I/O thread, under mu_.
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::vector<size_t> landed_;  // request indices in landing order
  size_t landed_head_ = 0;
  bool job_ = false, busy_ = false, stop_ = false;
  ExpertStoreStats stats_;  // io_seconds is written by the I/O thread under mu_
  std::thread io_thread_;
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
