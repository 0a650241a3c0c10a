// ExpertStore over the read engine: logical ids -> physical slots (.map) for the reads, host-cache
// hits (keyed by logical id) at once, misses read by a background thread in one coalesced batch
// and handed out as each one lands; a read-ahead reads the next fetch's misses into a second set
// of buffers; a look-ahead reads a predicted layer's misses on a lane of its own, and that layer's
// fetch takes them (landed or in flight) instead of reading them again. An expert is one read in
// a pack (its slot) and three in a GGUF (its slices of the layer's gate, up and down tensors),
// each placed at its matrix's offset in the payload.
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
#include "loader/store/engine_fetch.h"
#include "loader/store/host_cache.h"
#include "loader/io/residency.h"
#include "loader/store/verified_pages.h"
#include "loader/format/expert_layer_file.h"
#include "loader/format/gguf_model.h"

namespace moestream {
namespace {

using engine_store::Fetch;
using engine_store::Item;
using engine_store::Layer;
using engine_store::Piece;

constexpr uint64_t kSlotAlign = kExpertAlign;  // O_DIRECT and page granularity

class EngineExpertStore final : public ExpertStore {
 public:
  EngineExpertStore(const std::filesystem::path& model_dir, const ModelConfig& cfg,
                    const EngineExpertStoreOptions& opts)
      : model_dir_(model_dir), cfg_(cfg), opts_(opts), engine_(store_lanes(opts.io)) {
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
        if (page_caches_[file] && L.checksummed() && opts.store.verify_checksums)
          L.verified = verified_.add_layer(L.path, uint32_t(L.header.slot_checksums.size()));
        layers_.push_back(std::move(L));
      }
    }
    if (opts.host_cache_bytes > 0) {
      cache_ = std::make_unique<HostCache>(opts.host_cache_bytes, read_bytes_);
      cache_verified_.assign(cache_->n_slots(), false);
    }
    // Two I/O threads (a read-ahead's batch runs beside the current one instead of queueing
    // behind its tail) and, from the first guess on, the look-ahead's: three engine lanes.
    cur_->in_use = true;  // the current fetch, empty until the first begin (never a guess's buffer)
    for (std::thread& t : io_threads_) t = std::thread([this] { io_loop(false); });
  }

  ~EngineExpertStore() override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      // A batch in flight writes into our buffers.
      for (Fetch* f : pred_jobs_) f->busy = false;  // guesses not started: nobody takes them now
      pred_jobs_.clear();
      cv_.wait(lock, [&] { return idle(); });
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : io_threads_) t.join();
    if (pred_thread_.joinable()) pred_thread_.join();
  }

  std::vector<MappedRegion> mapped_regions() const override { return engine_store::regions_of(maps_); }
  void set_parallel_for(ParallelFor pf) override { parallel_for_ = std::move(pf); }
  void set_deferred_checks(Post post) override { post_ = std::move(post); }
  void verify_pending() override { engine_store::settle_pending(pending_, layers_, verified_, stats_, mu_); }

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
    reap_retired();
    // A look-ahead of this layer is taken (what it read or is reading); one of another layer is
    // discarded, as is one whose batch has not started yet (it would only queue behind).
    Fetch* pred = std::exchange(pred_, nullptr);
    if (pred != nullptr && pred->layer == layer) count_recall(*pred, ids, stats_);
    if (pred != nullptr && (cancel_if_queued(*pred) || pred->layer != layer)) {
      release(*pred);
      pred = nullptr;
    }
    if (Fetch* p = std::exchange(next_, nullptr)) {
      if (p->layer == layer && p->matrices == matrices &&
          std::equal(ids.begin(), ids.end(), p->ids.begin(), p->ids.end())) {
        release(*cur_);  // the fetch whose payloads were valid until now
        cur_ = p;
        ++stats_.fetches_read_ahead;
        if (pred != nullptr) release(*pred);
        return;
      }
      release(*p);  // a read-ahead nobody asked for
    }
    release(*cur_);
    Fetch& f = free_fetch();
    if (pred != nullptr) drain(*pred);  // what landed meanwhile is checked and ready to take
    f.awaits = pred;
    start(f, layer, ids, matrices);
    cur_ = &f;
  }

  void prefetch_predicted(int layer, std::span<const int> ids) override {
    MOE_ASSERT(layer >= 0 && layer < static_cast<int>(layers_.size()), "layer out of range");
    reap_retired();
    if (Fetch* p = std::exchange(pred_, nullptr)) {  // an earlier guess nobody took
      cancel_if_queued(*p);
      release(*p);
    }
    ++stats_.lookahead_predictions;
    stats_.lookahead_predicted += ids.size();
    const Layer& L = layers_[layer];
    // Read only what no host tier holds and no fetch of this store is reading already.
    std::vector<int>& want = want_;
    want.clear();
    for (int id : ids) {
      MOE_ASSERT(id >= 0 && static_cast<uint32_t>(id) < L.header.n_experts, "expert id out of range");
      if (std::find(want.begin(), want.end(), id) != want.end()) continue;
      if (cache_ && cache_->policy().slot_of(ExpertKey{layer, id}) >= 0) continue;
      if (in_page_cache(L, L.map.physical(uint32_t(id)))) continue;
      if (holds(cur_, layer, id) || holds(next_, layer, id)) continue;
      want.push_back(id);
    }
    Fetch* f = free_fetch_or_null();
    if (f == nullptr) return;  // every buffer busy with reads still landing: no guess this time
    f->predicted.assign(ids.begin(), ids.end());
    f->prediction = true;
    start(*f, layer, want, cur_->matrices);
    pred_ = f;
  }

  void read_ahead(int layer, std::span<const int> ids) override {
    MOE_ASSERT(layer >= 0 && layer < static_cast<int>(layers_.size()), "layer out of range");
    if (ids.empty()) return;
    if (Fetch* p = std::exchange(next_, nullptr)) release(*p);
    Fetch& f = free_fetch();
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
    return engine_store::describe(engine_, cache_.get(), cfg_.format == ModelFormat::kGguf,
                                  opts_.store.verify_checksums);
  }

  ExpertStoreStats stats() const override {
    ExpertStoreStats s;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return idle(); });
      s = stats_;
      s.experts_read += s.lookahead_read;
      s.bytes_read += lookahead_bytes_;
    }
    const IoEngineStats e = engine_.stats();
    s.read_ops_requested = e.requests;
    s.read_ops_issued = e.reads_issued;
    s.bytes_transferred = e.bytes_read;
    return s;
  }

 private:
  // The layers of a GGUF: every shard goes into the engine once (engine_fetch.h gguf_layers).
  void open_gguf(const std::filesystem::path& path, const ModelConfig& cfg) {
    const GgufModel g(path);
    std::vector<uint32_t> files;
    for (const auto& p : g.files().paths()) files.push_back(add_file(p));
    for (Layer& L : engine_store::gguf_layers(g, cfg, files, page_caches_)) layers_.push_back(std::move(L));
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

  bool idle() const {  // under mu_
    for (const Fetch& f : fetches_)
      if (f.busy) return false;
    return true;
  }
  Fetch* free_fetch_or_null() {
    for (Fetch& f : fetches_)
      if (!f.in_use) return &f;
    return nullptr;
  }
  // A buffer for a fetch; when look-aheads still landing hold them all, waits for the first.
  Fetch& free_fetch() {
    if (Fetch* f = free_fetch_or_null()) return *f;
    for (Fetch& f : fetches_)
      if (f.retired) {
        finish(f);
        return f;
      }
    MOE_ASSERT(false, "no free fetch buffer");
    return fetches_[0];
  }

  // The next ready expert of the current fetch (its position in ids and its item).
  bool next_item(size_t* index, const Item** item, bool wait) {
    Fetch& f = *cur_;
    Fetch* const p = f.awaits;  // a look-ahead whose reads some of f's experts wait for
    while (f.ready_head == f.ready.size()) {
      if (f.handed >= f.ids.size()) return false;
      size_t r;
      bool mine;
      {
        std::unique_lock<std::mutex> lock(mu_);
        const auto any = [&] {
          return f.landed_head < f.landed.size() || (p != nullptr && p->landed_head < p->landed.size());
        };
        if (!any()) {
          if (!wait) return false;
          auto t0 = std::chrono::steady_clock::now();
          cv_.wait(lock, any);
          stats_.io_wait_seconds += seconds_since(t0);
        }
        mine = f.landed_head < f.landed.size();
        r = mine ? f.landed[f.landed_head++] : p->landed[p->landed_head++];
      }
      // A failed read fails the pass: its first uses' hashes vouch for no later one.
      pending_.abandon_if_throws([&] { mine ? land(f, r) : land_prediction(*p, r, &f); });
    }
    const size_t pos = f.ready[f.ready_head++];
    *index = pos;
    *item = &f.items[f.position_item[pos]];
    ++f.handed;
    return true;
  }

  // Three lanes: the current fetch and a read-ahead, and the look-ahead's own, so a demand batch
  // never waits for a lane behind a guess.
  static IoEngineOptions store_lanes(IoEngineOptions o) {
    o.max_batches_in_flight = std::max(3u, o.max_batches_in_flight);
    return o;
  }

  // Sets up fetch `f` (idle) for `ids`: host-cache hits ready at once, misses planned into cache
  // slots or scratch, then their batch queued on the I/O thread. A look-ahead (f.prediction)
  // reads all of `ids` as speculative fills on its own thread; a demand fetch first takes what
  // the look-ahead it awaits read or is reading.
  void start(Fetch& f, int layer, std::span<const int> ids, bool matrices) {
    const Layer& L = layers_[layer];
    f.in_use = true;
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
    if (f.awaits != nullptr) take_predicted(f, cache_ ? &cache_->policy() : nullptr, stats_);
    if (cache_ && !f.prediction)
      for (size_t k = 0; k < f.items.size(); ++k) {
        if (f.items[k].ready || f.items[k].awaited) continue;
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
    // Checksums verify what comes from the device: an expert whose resident pages passed once
    // (and whose file has not changed since) is not hashed again (verified_pages.h).
    const bool due = opts_.store.verify_checksums && L.checksummed();
    const bool trusted = L.verified >= 0 && verified_.refresh(L.verified);
    if (matrices && !f.prediction && engine_store::in_place_allowed(L, maps_)) {
      const bool fault_in = engine_.backend() == IoBackend::kMmap && !due;
      f.first_use.clear();
      for (size_t k = 0; k < f.items.size(); ++k) {
        Item& it = f.items[k];
        if (it.ready || it.awaited || reread[k]) continue;
        const bool resident = in_page_cache(L, it.slot);
        if (due && !resident && L.verified >= 0) verified_.forget(L.verified, it.slot);
        if (due && !(resident && trusted)) continue;
        if (due && !verified_.holds(L.verified, it.slot)) {  // resident, never verified: hashed there
          f.first_use.push_back(k);
          continue;
        }
        if (!resident && !fault_in) continue;
        engine_store::hand_out_in_place(it, engine_store::mapped_matrices(L, layer, it.slot, maps_),
                                        resident && opts_.count_page_cache_hits, stats_);
      }
      engine_store::verify_in_place(f, L, layer, maps_, verified_, parallel_for_, pending_, post_,
                                    opts_.count_page_cache_hits, stats_);
    }
    size_t n_scratch = 0;
    for (size_t k = 0; k < f.items.size(); ++k) {
      Item& it = f.items[k];
      if (it.ready || it.awaited) continue;
      if (cache_ && !reread[k]) {
        // A guess fills as speculative (admission may refuse it: it then reads into scratch).
        const CacheAccess a = cache_->policy().insert(ExpertKey{layer, it.expert},
                                                      f.prediction ? CacheFill::kSpeculative : CacheFill::kDemand);
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
    f.due.clear();
    for (size_t k = 0; k < f.items.size(); ++k) {
      Item& it = f.items[k];
      if (it.ready) {
        push_ready(f, k);
        continue;
      }
      if (it.awaited) continue;
      if (it.cache_slot < 0) it.data = scratch + it.scratch * read_bytes_;
      const bool probe = (opts_.count_page_cache_hits && !f.prediction) || (due && L.verified >= 0);
      const bool resident = probe && in_page_cache(L, it.slot);
      if (opts_.count_page_cache_hits && !f.prediction && resident) ++stats_.page_cache_hits;
      // A copy of pages verified earlier needs no new checksum; pages gone come from the device.
      bool check = due;
      if (due && L.verified >= 0) {
        if (!resident) {
          verified_.forget(L.verified, it.slot);
        } else if (trusted && verified_.holds(L.verified, it.slot)) {
          check = false;
          if (!f.prediction) ++stats_.checksums_skipped;
        }
      }
      for (const Piece& p : L.pieces) {
        ReadRequest r;
        r.file = p.file;
        r.offset = p.at(it.slot);
        r.length = p.length;
        r.dest = const_cast<uint8_t*>(it.data) + p.dest_offset;
        f.reqs.push_back(r);
        f.req_item.push_back(uint32_t(k));
        f.due.push_back(check);
      }
      it.pieces_left = uint32_t(L.pieces.size());
      if (f.prediction) continue;  // counted when its thread takes the batch (it may be cancelled)
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
      f.submitted = false;
      (f.prediction ? pred_jobs_ : jobs_).push_back(&f);
    }
    if (f.prediction && !pred_thread_.joinable()) pred_thread_ = std::thread([this] { io_loop(true); });
    cv_.notify_all();
  }

  // A look-ahead read landed: checked as any read (land), but a failure only marks the guess
  // failed, unless the demand fetch waits for that expert: then it throws there as a demand read
  // of it would. A good one releases the demand item waiting for it.
  void land_prediction(Fetch& p, size_t r, Fetch* demand) {
    Item& it = p.items[p.req_item[r]];
    if (it.failed) return;
    try {
      land(p, r);
    } catch (const Error&) {
      it.failed = true;
      if (demand != nullptr && it.awaited_by >= 0) throw;
      return;
    }
    if (!it.ready || demand == nullptr || it.awaited_by < 0) return;
    Item& d = demand->items[size_t(it.awaited_by)];
    d.ready = true;
    push_ready(*demand, size_t(it.awaited_by));
  }

  // Checks every look-ahead read of p that landed so far (caller's thread).
  void drain(Fetch& p) {
    for (;;) {
      size_t r;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (p.landed_head == p.landed.size()) return;
        r = p.landed[p.landed_head++];
      }
      land_prediction(p, r, nullptr);
    }
  }

  // A look-ahead whose batch no I/O thread has taken yet is dropped from the queue (true).
  bool cancel_if_queued(Fetch& p) {
    std::lock_guard<std::mutex> lock(mu_);
    auto q = std::find(pred_jobs_.begin(), pred_jobs_.end(), &p);
    if (q == pred_jobs_.end()) return false;
    pred_jobs_.erase(q);
    p.busy = false;
    stats_.lookahead_cancelled += p.items.size();
    return true;
  }

  // Look-aheads released while still reading are finished once their batch is done.
  void reap_retired() {
    for (Fetch& f : fetches_) {
      if (!f.retired) continue;
      bool busy;
      {
        std::lock_guard<std::mutex> lock(mu_);
        busy = f.busy;
      }
      if (!busy) finish(f);
    }
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
    if (f.due[r] && f.checksum[r] != L.header.slot_checksums[it.slot])
      throw expert_checksum_error(L, it.slot, L.layout.bytes, f.checksum[r]);
    // Read through the page cache and verified: those pages may be used again unhashed.
    if (f.due[r] && L.verified >= 0) verified_.mark(L.verified, it.slot);
    if (it.cache_slot >= 0) cache_verified_[size_t(it.cache_slot)] = true;
    it.ready = true;
    push_ready(f, k);
  }

  // Waits out fetch f's batch, releases its pins, and forgets cache slots whose data never
  // proved good (failed read, bad checksum, a fetch abandoned after an error, or a read-ahead
  // that was never used: its reads may not have been checked).
  // A look-ahead still reading is retired instead (finished later by reap_retired), so that a
  // demand fetch never waits for a guess's reads; its pinned slots stay pinned until then.
  void release(Fetch& f) {
    if (Fetch* p = std::exchange(f.awaits, nullptr)) release(*p);
    if (f.prediction) {
      std::lock_guard<std::mutex> lock(mu_);
      if (f.busy) {
        f.retired = true;
        return;
      }
    }
    finish(f);
  }
  void finish(Fetch& f) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return !f.busy; });
    }
    if (f.prediction) {
      drain(f);  // landed guesses are checked, so good ones stay in the host cache
      if (f.submitted)
        for (const Item& it : f.items) stats_.lookahead_wasted += !it.taken;
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
    f.predicted.clear();
    f.prediction = f.retired = f.in_use = f.submitted = false;
    f.ready.clear();
    f.ready_head = f.handed = 0;
    f.reqs.clear();
  }

  // The I/O threads: run queued batches in order, two at a time; the engine reports each request as it lands,
  // and the worker that finished it computes its checksum there, so verification runs on the
  // engine's threads in parallel and overlaps the reads still in flight (on one caller thread
  // it took a third of O_DIRECT decode time: ~1 ms per 6.7 MB expert).
  // The look-ahead's thread (predictions) takes only look-aheads, on the third lane.
  void io_loop(bool predictions) {
    std::deque<Fetch*>& jobs = predictions ? pred_jobs_ : jobs_;
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return !jobs.empty() || stop_; });
      if (jobs.empty()) return;
      Fetch& f = *jobs.front();
      jobs.pop_front();
      f.submitted = true;
      if (f.prediction) {  // added to experts_read and bytes_read by stats()
        stats_.lookahead_read += f.items.size();
        lookahead_bytes_ += f.items.size() * layers_[size_t(f.layer)].layout.bytes;
      }
      lock.unlock();
      auto t0 = std::chrono::steady_clock::now();
      // Two pointers fit std::function's inline buffer: no allocation per batch.
      Fetch* fp = &f;
      engine_.submit(f.reqs, [this, fp](const ReadRequest& r, size_t index) {
        Fetch& f = *fp;
        double dt = 0;
        const Layer& L = layers_[size_t(f.layer)];
        if (f.due[index] && r.result == ReadResult::kOk) {
          auto c0 = std::chrono::steady_clock::now();
          f.checksum[index] = expert_checksum(L.header.payload_hash, static_cast<const uint8_t*>(r.dest), L.layout.bytes);
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
  VerifiedPages verified_;            // page-cache copies of experts that passed (caller's thread)
  ParallelFor parallel_for_;          // the caller's threads, for hashing in place (may be unset)
  Post post_;                         // set: first uses are hashed beside their compute (pending_)
  PendingChecks pending_;             // after maps_: gone (its hashes waited for) before the mapping

  // The current fetch, the look-ahead it awaits, a read-ahead, the next look-ahead, and room
  // for look-aheads retired while still landing.
  Fetch fetches_[6];
  Fetch* cur_ = &fetches_[0];   // handed out by next_ready (caller's thread only)
  Fetch* next_ = nullptr;       // a read-ahead in flight or landed, or null
  Fetch* pred_ = nullptr;       // a look-ahead in flight or landed, not taken yet, or null

  // Shared with the I/O thread, under mu_ (with each Fetch's landed/busy).
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::deque<Fetch*> jobs_;
  std::deque<Fetch*> pred_jobs_;  // look-aheads, for pred_thread_ (started on the first one)
  bool stop_ = false;
  uint64_t lookahead_bytes_ = 0;  // bytes the look-ahead's thread read
  std::vector<int> want_;         // prefetch_predicted's experts to read (caller's thread)
  ExpertStoreStats stats_;  // io_seconds, checksum_seconds and lookahead_read are written under mu_
  std::thread io_threads_[2];
  std::thread pred_thread_;
};

}  // namespace

std::unique_ptr<ExpertStore> open_engine_expert_store(const std::filesystem::path& model_dir,
                                                      const ModelConfig& cfg,
                                                      const EngineExpertStoreOptions& opts) {
  return std::make_unique<EngineExpertStore>(model_dir, cfg, opts);
}

}  // namespace moestream
