// ExpertStore over the read engine: logical ids -> physical slots (.map) for the reads, host-cache
// hits (keyed by logical id) at once, misses read by a background thread in one coalesced batch
// and handed out as each one lands; a read-ahead reads the next fetch's misses into a second set
// of buffers. An expert is one read in a pack (its slot) and three in a GGUF (its slices of the
// layer's gate, up and down tensors), each placed at its matrix's offset in the payload.
// A caller that takes experts as matrices (begin_fetch_matrices) gets those already in the page
// cache as pages of a read-only mapping instead: nothing is read, copied or re-verified.
#include "loader/store/engine_expert_store.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/error.h"
#include "common/mapped_file.h"
#include "common/timing.h"
#include "loader/format/expert_file.h"
#include "loader/format/expert_map.h"
#include "loader/store/expert_buffer.h"
#include "loader/store/host_cache.h"
#include "loader/io/residency.h"
#include "loader/format/expert_layer_file.h"
#include "loader/format/gguf_model.h"

namespace moestream {
namespace {

constexpr uint64_t kSlotAlign = kExpertAlign;  // O_DIRECT and page granularity

class EngineExpertStore final : public ExpertStore {
 public:
  EngineExpertStore(const std::filesystem::path& model_dir, const ModelConfig& cfg,
                    const EngineExpertStoreOptions& opts)
      : model_dir_(model_dir), cfg_(cfg), opts_(opts), engine_(two_lanes(opts.io)) {
    // Reading whole 4 KiB pages keeps O_DIRECT reads in place, and when the file's slot stride
    // is the same, neighbouring slots read into neighbouring buffers form one contiguous read.
    // Every buffer (scratch, host-cache slot) holds the largest expert of any layer.
    read_bytes_ = (cfg.max_expert_bytes() + kSlotAlign - 1) / kSlotAlign * kSlotAlign;
    if (cfg.format == ModelFormat::kGguf) {
      open_gguf(model_dir, cfg);
    } else {
      for (int l = 0; l < cfg.n_moe_layers(); ++l) {  // MoE layers only (model_config.h)
        Layer L;
        static_cast<ExpertLayerFile&>(L) = open_expert_layer_file(model_dir, cfg, l, opts.use_maps);
        if (L.header.expert_stride < read_bytes_)
          throw FormatError(L.path.string() + ": expert_stride " +
                            std::to_string(L.header.expert_stride) + " is below the 4 KiB rounded " +
                            "expert size " + std::to_string(read_bytes_));
        L.layout = cfg.expert_layout(l);
        const uint32_t file = add_file(L.path);
        L.pieces.push_back(Piece{file, L.header.data_offset, L.header.expert_stride, read_bytes_, 0,
                                 page_caches_[file].get()});
        layers_.push_back(std::move(L));
      }
    }
    if (opts.host_cache_bytes > 0) {
      cache_ = std::make_unique<HostCache>(opts.host_cache_bytes, read_bytes_);
      cache_verified_.assign(cache_->n_slots(), false);
    }
    // Two I/O threads on an engine of two lanes: a read-ahead's batch runs beside the current
    // one instead of queueing behind its tail.
    for (std::thread& t : io_threads_) t = std::thread([this] { io_loop(); });
  }

  ~EngineExpertStore() override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      // A batch in flight writes into our buffers.
      cv_.wait(lock, [&] { return !fetches_[0].busy && !fetches_[1].busy; });
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : io_threads_) t.join();
  }

  std::unique_ptr<ExpertStore> reopen() const override {
    EngineExpertStoreOptions o = opts_;
    o.host_cache_bytes = 0;            // a second host cache would hold the same experts twice
    o.count_page_cache_hits = false;   // nobody reads a reopened store's tier counts
    return std::make_unique<EngineExpertStore>(model_dir_, cfg_, o);
  }

  void fetch(int layer, std::span<const int> ids, std::vector<const uint8_t*>& out) override {
    begin_fetch(layer, ids);
    out.assign(ids.size(), nullptr);
    size_t i = 0;
    const uint8_t* p = nullptr;
    while (next_ready(&i, &p, true)) out[i] = p;
  }

  void begin_fetch(int layer, std::span<const int> ids) override { begin(layer, ids, false); }
  void begin_fetch_matrices(int layer, std::span<const int> ids) override { begin(layer, ids, true); }

  void begin(int layer, std::span<const int> ids, bool matrices) {
    MOE_ASSERT(layer >= 0 && layer < static_cast<int>(layers_.size()), "layer out of range");
    stats_.fetch_calls += 1;
    stats_.experts_requested += ids.size();
    if (Fetch* p = std::exchange(next_, nullptr)) {
      if (p->layer == layer && p->matrices == matrices &&
          std::equal(ids.begin(), ids.end(), p->ids.begin(), p->ids.end())) {
        release(*cur_);  // the fetch whose payloads were valid until now
        cur_ = p;
        ++stats_.fetches_read_ahead;
        return;
      }
      release(*p);  // a read-ahead nobody asked for
    }
    release(*cur_);
    start(*cur_, layer, ids, matrices);
  }

  void read_ahead(int layer, std::span<const int> ids) override {
    MOE_ASSERT(layer >= 0 && layer < static_cast<int>(layers_.size()), "layer out of range");
    if (ids.empty()) return;
    if (Fetch* p = std::exchange(next_, nullptr)) release(*p);
    Fetch& f = cur_ == &fetches_[0] ? fetches_[1] : fetches_[0];
    start(f, layer, ids, cur_->matrices);  // read ahead for the same kind of caller
    next_ = &f;
  }

  bool next_ready(size_t* index, const uint8_t** payload, bool wait) override {
    const Item* it = nullptr;
    if (!next_item(index, &it, wait)) return false;
    MOE_ASSERT(!it->mapped, "an expert handed out in place needs next_ready_matrices");
    *payload = it->data;
    return true;
  }

  bool next_ready_matrices(size_t* index, ExpertMatrices* m, const ExpertLayout& layout, bool wait) override {
    const Item* it = nullptr;
    if (!next_item(index, &it, wait)) return false;
    *m = it->mapped ? it->in_place : ExpertMatrices::of_payload(it->data, layout);
    return true;
  }

  void residency(int layer, std::span<ExpertTier> out) const override {
    MOE_ASSERT(layer >= 0 && layer < static_cast<int>(layers_.size()), "layer out of range");
    const Layer& L = layers_[layer];
    MOE_ASSERT(out.size() == L.header.n_experts, "residency: out must hold n_experts entries");
    for (uint32_t e = 0; e < L.header.n_experts; ++e) {
      const uint32_t slot = L.map.physical(e);
      if (cache_ && cache_->policy().slot_of(ExpertKey{layer, int(e)}) >= 0)
        out[e] = ExpertTier::kHostCache;
      else if (in_page_cache(L, slot))
        out[e] = ExpertTier::kPageCache;
      else
        out[e] = ExpertTier::kStorage;
    }
  }

  std::string describe() const override {
    std::string s = "engine " + std::string(io_backend_name(engine_.backend()));
    const IoEngineOptions& o = engine_.options();
    size_t direct = 0;
    for (uint32_t f = 0; f < engine_.n_files(); ++f) direct += engine_.file_is_direct(f);
    s += direct == engine_.n_files() ? ", O_DIRECT" : direct ? ", O_DIRECT on some files" : ", buffered";
    if (engine_.backend() == IoBackend::kUring)
      s += ", " + std::to_string(o.n_rings) + " rings x QD " + std::to_string(o.queue_depth);
    else
      s += ", " + std::to_string(o.n_threads) + " threads";
    s += ", coalesce gap " + std::to_string(o.coalesce ? o.coalesce_gap_bytes >> 10 : 0) +
         " KiB, max read " + std::to_string(o.max_read_bytes >> 10) + " KiB";
    if (direct > 0 && o.direct_max_read_bytes > 0)
      s += " (O_DIRECT " + std::to_string(o.direct_max_read_bytes >> 10) + " KiB)";
    if (cache_) {
      char buf[96];
      std::snprintf(buf, sizeof buf, ", host cache %.1f MiB (%u experts)",
                    double(uint64_t(cache_->n_slots()) * cache_->slot_bytes()) / (1 << 20),
                    cache_->n_slots());
      s += buf;
    }
    if (cfg_.format == ModelFormat::kGguf) s += ", GGUF (3 slices per expert, no checksums in the format)";
    else if (!opts_.store.verify_checksums) s += ", checksums off";
    return s;
  }

  ExpertStoreStats stats() const override {
    ExpertStoreStats s;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return !fetches_[0].busy && !fetches_[1].busy; });
      s = stats_;
    }
    const IoEngineStats e = engine_.stats();
    s.read_ops_requested = e.requests;
    s.read_ops_issued = e.reads_issued;
    s.bytes_transferred = e.bytes_read;
    return s;
  }

 private:
  // One read of an expert: `length` bytes at offset + slot*stride of `file`, landing at
  // dest_offset in the expert's payload. A pack expert is one piece, a GGUF expert three.
  struct Piece {
    uint32_t file = 0;
    uint64_t offset = 0, stride = 0, length = 0, dest_offset = 0;
    const PageCacheResidency* page_cache = nullptr;  // null for O_DIRECT files
    uint64_t at(uint32_t slot) const { return offset + uint64_t{slot} * stride; }
  };
  // A layer's experts. A pack layer keeps its file header (checksums, map); a GGUF layer has an
  // empty checksum table and an identity map.
  struct Layer : ExpertLayerFile {
    ExpertLayout layout;
    std::vector<Piece> pieces;
    bool checksummed() const { return !header.slot_checksums.empty(); }
  };

  // The layers of a GGUF: every shard goes into the engine once; a layer's experts are slices of
  // its three expert tensors, possibly in different shards.
  void open_gguf(const std::filesystem::path& path, const ModelConfig& cfg) {
    const GgufModel g(path);
    std::vector<uint32_t> files;
    for (const auto& p : g.files().paths()) files.push_back(add_file(p));
    for (int l = 0; l < cfg.n_moe_layers(); ++l) {
      Layer L;
      L.path = g.files().paths().front();
      L.header.n_experts = uint32_t(cfg.n_experts);
      L.map = ExpertMap::identity(uint32_t(cfg.n_experts));
      L.layout = cfg.expert_layout(l);
      const GgufLayerExperts& x = g.experts()[size_t(l)];
      const std::pair<const GgufExpertMatrix*, size_t> mats[] = {
          {&x.gate, L.layout.gate_offset}, {&x.up, L.layout.up_offset}, {&x.down, L.layout.down_offset}};
      for (const auto& [m, dest] : mats)
        L.pieces.push_back(Piece{files[m->shard], m->offset, m->expert_bytes, m->expert_bytes, dest,
                                 page_caches_[files[m->shard]].get()});
      if (x.bias) {  // gpt-oss: three f32 bias slices into the payload's bias section
        const size_t F4 = size_t(cfg.moe_intermediate_size) * sizeof(float);
        const std::pair<const GgufExpertMatrix*, size_t> biases[] = {{&x.gate_bias, L.layout.bias_offset},
                                                                     {&x.up_bias, L.layout.bias_offset + F4},
                                                                     {&x.down_bias, L.layout.bias_offset + 2 * F4}};
        for (const auto& [m, dest] : biases)
          L.pieces.push_back(Piece{files[m->shard], m->offset, m->expert_bytes, m->expert_bytes, dest,
                                   page_caches_[files[m->shard]].get()});
      }
      layers_.push_back(std::move(L));
    }
  }

  // Adds a file to the engine, with its page-cache residency probe (which means something only
  // for reads that go through the page cache: none for O_DIRECT files). Returns its index.
  // Buffered files are also mapped (read-only, shared) for experts computed in place.
  uint32_t add_file(const std::filesystem::path& path) {
    const uint32_t file = engine_.add_file(path);
    page_caches_.resize(size_t(file) + 1);
    maps_.resize(size_t(file) + 1);
    if (!engine_.file_is_direct(file)) {
      page_caches_[file] = std::make_unique<PageCacheResidency>(path);
      try {
        maps_[file] = std::make_unique<MappedFile>(path);
      } catch (const IoError&) {
        // A file that cannot be mapped is still read (and copied) as before.
      }
    }
    return file;
  }

  // Whether the experts of L may be handed out as mapped pages: every piece's file is buffered
  // (mapped), and no checksum is due (checksums verify what comes from the device, and a
  // mapped page may come from it unseen; a GGUF has none).
  bool in_place_allowed(const Layer& L) const {
    if (L.checksummed() && opts_.store.verify_checksums) return false;
    if (L.pieces.size() > 3) return false;  // gpt-oss's GGUF biases: three slices, not one bias section
    for (const Piece& p : L.pieces)
      if (!maps_[p.file]) return false;
    return true;
  }

  // The matrices of the expert in `slot` in the mapped files (FormatError when a slice lies
  // outside its file: offsets come from the file). A pack's expert is one piece at the layout's
  // offsets, a GGUF's three pieces in gate, up, down order.
  ExpertMatrices mapped_matrices(const Layer& L, int layer, uint32_t slot) const {
    const auto at = [&](const Piece& p, uint64_t n) {
      return maps_[p.file]->range(p.at(slot), n, "expert slot " + std::to_string(slot) + " of layer " +
                                                     std::to_string(layer));
    };
    if (L.pieces.size() == 1) return ExpertMatrices::of_payload(at(L.pieces[0], L.layout.bytes), L.layout);
    MOE_ASSERT(L.pieces.size() == 3, "a GGUF expert is three slices");
    return {at(L.pieces[0], L.pieces[0].length), at(L.pieces[1], L.pieces[1].length),
            at(L.pieces[2], L.pieces[2].length)};
  }

  // Whether every piece of the expert in `slot` is in the page cache (sampled).
  static bool in_page_cache(const Layer& L, uint32_t slot) {
    for (const Piece& p : L.pieces)
      if (p.page_cache == nullptr || !p.page_cache->sample(p.at(slot), std::min(p.length, L.layout.bytes), 2).fully_resident())
        return false;
    return true;
  }
  struct Item {
    uint32_t slot = 0;               // physical slot in the layer file
    int expert = 0;                  // logical id (the host cache's key)
    const uint8_t* data = nullptr;   // where the payload is (or lands)
    int64_t cache_slot = -1;         // host cache slot, or -1 (scratch buffer)
    size_t scratch = 0;
    uint32_t pieces_left = 0;        // reads still to land
    bool ready = false;
    bool mapped = false;             // handed out in place: in_place, not data
    ExpertMatrices in_place;
  };
  // One fetch: the current one (handed out by next_ready) or the read-ahead next one. Two exist
  // so that a read-ahead can read into its own buffers while the current payloads are in use.
  struct Fetch {
    int layer = 0;
    bool matrices = false;                 // begin_fetch_matrices: resident experts in place
    std::vector<int> ids;                  // as asked (a read-ahead is adopted on an exact match)
    std::vector<Item> items;
    std::vector<uint32_t> position_item;   // ids position -> item
    std::vector<size_t> ready;             // positions ready to hand out
    size_t ready_head = 0, handed = 0;
    std::vector<ReadRequest> reqs;         // the misses' reads (read by the I/O thread)
    std::vector<uint32_t> req_item;        // request -> item
    std::vector<uint64_t> checksum;        // request -> XXH64 computed where it landed
    std::vector<int> pinned;               // cache slots this fetch hands out
    std::vector<uint8_t> reread;           // item -> resident but still loading elsewhere
    ExpertBuffer scratch;                  // misses the cache does not take
    // Shared with the I/O thread, under mu_.
    std::vector<size_t> landed;  // request indices in landing order
    size_t landed_head = 0;
    bool busy = false;           // its batch is queued or in flight
  };

  // The next ready expert of the current fetch (its position in ids and its item).
  bool next_item(size_t* index, const Item** item, bool wait) {
    Fetch& f = *cur_;
    while (f.ready_head == f.ready.size()) {
      if (f.handed >= f.ids.size()) return false;
      size_t r;
      {
        std::unique_lock<std::mutex> lock(mu_);
        if (f.landed_head == f.landed.size()) {
          if (!wait) return false;
          auto t0 = std::chrono::steady_clock::now();
          cv_.wait(lock, [&] { return f.landed_head < f.landed.size(); });
          stats_.io_wait_seconds += seconds_since(t0);
        }
        r = f.landed[f.landed_head++];
      }
      land(f, r);
    }
    const size_t pos = f.ready[f.ready_head++];
    *index = pos;
    *item = &f.items[f.position_item[pos]];
    ++f.handed;
    return true;
  }

  static IoEngineOptions two_lanes(IoEngineOptions o) {
    o.max_batches_in_flight = std::max(2u, o.max_batches_in_flight);
    return o;
  }

  // Every position of `ids` that names item k becomes ready.
  static void push_ready(Fetch& f, size_t k) {
    for (size_t i = 0; i < f.position_item.size(); ++i)
      if (f.position_item[i] == k) f.ready.push_back(i);
  }

  // Sets up fetch `f` (idle) for `ids`: host-cache hits ready at once, misses planned into cache
  // slots or scratch, then their batch queued on the I/O thread.
  void start(Fetch& f, int layer, std::span<const int> ids, bool matrices) {
    const Layer& L = layers_[layer];
    f.layer = layer;
    f.matrices = matrices;
    f.ids.assign(ids.begin(), ids.end());
    // Unique physical slots in file order, so neighbours in the file read as one extent.
    f.items.clear();
    for (int id : ids) {
      MOE_ASSERT(id >= 0 && static_cast<uint32_t>(id) < L.header.n_experts, "expert id out of range");
      Item it;
      it.slot = L.map.physical(static_cast<uint32_t>(id));
      it.expert = id;
      f.items.push_back(it);
    }
    std::sort(f.items.begin(), f.items.end(), [](const Item& a, const Item& b) { return a.slot < b.slot; });
    f.items.erase(std::unique(f.items.begin(), f.items.end(),
                              [](const Item& a, const Item& b) { return a.slot == b.slot; }),
                  f.items.end());
    f.position_item.resize(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      uint32_t slot = L.map.physical(static_cast<uint32_t>(ids[i]));
      f.position_item[i] = uint32_t(std::lower_bound(f.items.begin(), f.items.end(), slot,
                                                      [](const Item& a, uint32_t s) { return a.slot < s; }) -
                                     f.items.begin());
    }
    f.ready.clear();
    f.ready_head = 0;
    f.handed = 0;

    // Hits first (and pinned), so that placing the misses cannot evict an expert of this fetch.
    // A resident slot not yet verified is still being read by the other fetch: read it again
    // rather than hand out bytes that may not have landed.
    std::vector<uint8_t>& reread = f.reread;
    reread.assign(f.items.size(), 0);
    if (cache_)
      for (size_t k = 0; k < f.items.size(); ++k) {
        const int cs = cache_->policy().lookup(ExpertKey{layer, f.items[k].expert}, CacheFill::kDemand);
        if (cs < 0) continue;
        if (!cache_verified_[size_t(cs)]) {
          reread[k] = 1;
          continue;
        }
        f.items[k].data = cache_->slot_data(uint32_t(cs));
        f.items[k].cache_slot = cs;
        f.items[k].ready = true;
        cache_->policy().pin(cs);
        f.pinned.push_back(cs);
        ++stats_.host_cache_hits;
      }
    // Then, for a caller of matrices, what the page cache holds stays where it is. With the mmap
    // backend everything does: a page fault reads what is missing, as that backend's copy would.
    if (matrices && in_place_allowed(L)) {
      const bool fault_in = engine_.backend() == IoBackend::kMmap;
      for (size_t k = 0; k < f.items.size(); ++k) {
        Item& it = f.items[k];
        if (it.ready || reread[k]) continue;
        const bool resident = in_page_cache(L, it.slot);
        if (!resident && !fault_in) continue;
        it.in_place = mapped_matrices(L, layer, it.slot);
        it.mapped = it.ready = true;
        ++stats_.experts_in_place;
        stats_.page_cache_hits += resident && opts_.count_page_cache_hits;
      }
    }
    size_t n_scratch = 0;
    for (size_t k = 0; k < f.items.size(); ++k) {
      Item& it = f.items[k];
      if (it.ready) continue;
      if (cache_ && !reread[k]) {
        const CacheAccess a = cache_->policy().insert(ExpertKey{layer, it.expert}, CacheFill::kDemand);
        if (a.outcome == CacheOutcome::kFilled) {
          it.cache_slot = a.slot;
          it.data = cache_->slot_data(uint32_t(a.slot));
          cache_->policy().pin(a.slot);
          f.pinned.push_back(a.slot);
          cache_verified_[size_t(a.slot)] = false;
          continue;
        }
      }
      it.scratch = n_scratch++;
    }
    uint8_t* const scratch = f.scratch.reserve(n_scratch, read_bytes_, kSlotAlign);
    f.reqs.clear();
    f.req_item.clear();
    for (size_t k = 0; k < f.items.size(); ++k) {
      Item& it = f.items[k];
      if (it.ready) {
        push_ready(f, k);
        continue;
      }
      if (it.cache_slot < 0) it.data = scratch + it.scratch * read_bytes_;
      if (opts_.count_page_cache_hits && in_page_cache(L, it.slot)) ++stats_.page_cache_hits;
      for (const Piece& p : L.pieces) {
        ReadRequest r;
        r.file = p.file;
        r.offset = p.at(it.slot);
        r.length = p.length;
        r.dest = const_cast<uint8_t*>(it.data) + p.dest_offset;
        f.reqs.push_back(r);
        f.req_item.push_back(uint32_t(k));
      }
      it.pieces_left = uint32_t(L.pieces.size());
      ++stats_.experts_read;
      stats_.bytes_read += L.layout.bytes;
    }
    f.checksum.assign(f.reqs.size(), 0);
    if (f.reqs.empty()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      f.landed.clear();
      f.landed_head = 0;
      f.busy = true;
      jobs_.push_back(&f);
    }
    cv_.notify_all();
  }

  // A read landed: check its outcome and the checksum the I/O worker computed (here, on the
  // caller's thread, so errors throw where the caller can catch them), then release its expert.
  void land(Fetch& f, size_t r) {
    const ReadRequest& q = f.reqs[r];
    const size_t k = f.req_item[r];
    Item& it = f.items[k];
    const Layer& L = layers_[f.layer];
    if (q.result != ReadResult::kOk) {
      std::string where = engine_.file_path(q.file) + " at offset " + std::to_string(q.offset) + " length " +
                          std::to_string(q.length);
      if (q.result == ReadResult::kTruncated)
        throw IoError("truncated file: read of " + where + " hit end of file (file has " +
                      std::to_string(engine_.file_size(q.file)) + " bytes at open)");
      throw IoError("read of " + where + " failed: " + std::strerror(q.error));
    }
    if (--it.pieces_left > 0) return;  // the expert's other slices are still in flight
    if (opts_.store.verify_checksums && L.checksummed() && f.checksum[r] != L.header.slot_checksums[it.slot])
      throw expert_checksum_error(L, it.slot, L.layout.bytes, f.checksum[r]);
    if (it.cache_slot >= 0) cache_verified_[size_t(it.cache_slot)] = true;
    it.ready = true;
    push_ready(f, k);
  }

  // Waits out fetch f's batch, releases its pins, and forgets cache slots whose data never
  // proved good (failed read, bad checksum, a fetch abandoned after an error, or a read-ahead
  // that was never used: its reads may not have been checked).
  void release(Fetch& f) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return !f.busy; });
    }
    if (cache_) {
      for (const Item& it : f.items)
        if (it.cache_slot >= 0 && !cache_verified_[size_t(it.cache_slot)])
          cache_->policy().erase(ExpertKey{f.layer, it.expert});
      for (int cs : f.pinned) cache_->policy().unpin(cs);
    }
    f.pinned.clear();
    f.items.clear();
    f.ids.clear();
    f.ready.clear();
    f.ready_head = f.handed = 0;
    f.reqs.clear();
  }

  // The I/O threads: run queued batches in order, two at a time; the engine reports each request as it lands,
  // and the worker that finished it computes its checksum there, so verification runs on the
  // engine's threads in parallel and overlaps the reads still in flight (on one caller thread
  // it took a third of O_DIRECT decode time: ~1 ms per 6.7 MB expert).
  void io_loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return !jobs_.empty() || stop_; });
      if (jobs_.empty()) return;
      Fetch& f = *jobs_.front();
      jobs_.pop_front();
      lock.unlock();
      auto t0 = std::chrono::steady_clock::now();
      // Two pointers fit std::function's inline buffer: no allocation per batch.
      Fetch* fp = &f;
      engine_.submit(f.reqs, [this, fp](const ReadRequest& r, size_t index) {
        Fetch& f = *fp;
        double dt = 0;
        const Layer& L = layers_[size_t(f.layer)];
        if (opts_.store.verify_checksums && L.checksummed() && r.result == ReadResult::kOk) {
          auto c0 = std::chrono::steady_clock::now();
          f.checksum[index] = expert_checksum(static_cast<const uint8_t*>(r.dest), L.layout.bytes);
          dt = seconds_since(c0);
        }
        {
          std::lock_guard<std::mutex> g(mu_);
          f.landed.push_back(index);
          stats_.checksum_seconds += dt;
        }
        cv_.notify_all();
      });
      const double dt = seconds_since(t0);
      lock.lock();
      stats_.io_seconds += dt;
      f.busy = false;
      cv_.notify_all();
    }
  }

  std::filesystem::path model_dir_;  // for reopen()
  ModelConfig cfg_;
  EngineExpertStoreOptions opts_;
  IoEngine engine_;
  uint64_t read_bytes_ = 0;  // one expert buffer: the largest payload, 4 KiB rounded
  std::vector<std::unique_ptr<PageCacheResidency>> page_caches_;  // per engine file; null: O_DIRECT
  std::vector<std::unique_ptr<MappedFile>> maps_;                  // per engine file; null: O_DIRECT
  std::vector<Layer> layers_;
  std::unique_ptr<HostCache> cache_;
  std::vector<bool> cache_verified_;  // per cache slot: data passed its read and checksum

  Fetch fetches_[2];
  Fetch* cur_ = &fetches_[0];   // handed out by next_ready (caller's thread only)
  Fetch* next_ = nullptr;       // a read-ahead in flight or landed, or null

  // Shared with the I/O thread, under mu_ (with each Fetch's landed/busy).
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::deque<Fetch*> jobs_;
  bool stop_ = false;
  ExpertStoreStats stats_;  // io_seconds and checksum_seconds are written under mu_
  std::thread io_threads_[2];
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
  if (io == "simple") {
    if (cfg.format == ModelFormat::kGguf)
      throw ConfigError("--io simple reads packed models only; a GGUF is read by the engine (--io auto, uring, "
                        "pread or mmap)");
    return open_pread_expert_store(model_dir, cfg, opts.store);
  }
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
