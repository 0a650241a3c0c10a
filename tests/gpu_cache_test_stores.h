// Test support for the GPU expert cache and its parts (tests/gpu_*_test.cpp): a small model
// config and expert stores whose payloads are distinct random bytes, handed out out of order,
// optionally trickling in, gated (the prefetch worker's) or failing for one layer.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "loader/format/expert_file.h"
#include "loader/format/model_config.h"
#include "loader/store/expert_store.h"
#include "tests/support/test_model.h"

namespace moestream::gpu_cache_test {

inline ModelConfig small_config() {
  return test::tiny_moe_config({.hidden = 64, .layers = 3, .intermediate = 96, .experts = 16, .top_k = 4});
}

inline size_t expert_bytes(const ModelConfig& c) {
  return ExpertLayout::make(c.expert_quant, size_t(c.hidden_size), size_t(c.moe_intermediate_size)).bytes;
}

// small_config with a GGUF-like mix: each layer's gate/up/down in its own ggml types, so the three
// layers' experts have three sizes (none a multiple of another's).
inline ModelConfig mixed_config() {
  ModelConfig c = small_config();
  const auto q = [](GgmlType t) { return ggml_quant(t); };
  c.layer_expert_types = {{q(GgmlType::kQ8_0), q(GgmlType::kQ8_0), q(GgmlType::kQ8_0)},
                          {q(GgmlType::kQ4_0), q(GgmlType::kQ5_1), q(GgmlType::kQ4_0)},
                          {q(GgmlType::kQ4_1), q(GgmlType::kQ8_0), q(GgmlType::kQ5_0)}};
  c.expert_quant = c.layer_expert_types.front().gate;
  return c;
}

// Every expert a distinct pseudo-random payload of its layer's size (ModelConfig::expert_layout);
// experts are handed out in reverse order of the request so the cache must use next_ready's
// index, not arrival order.
class FakeStore : public ExpertStore {
 public:
  explicit FakeStore(const ModelConfig& c) : cfg_(c), n_experts_(c.n_experts) {
    std::mt19937_64 rng(12345);
    data_.resize(size_t(c.n_layers) * size_t(c.n_experts));
    for (size_t i = 0; i < data_.size(); ++i) {
      data_[i].resize(c.expert_layout(int(i / size_t(c.n_experts))).bytes);
      for (auto& b : data_[i]) b = uint8_t(rng());
    }
  }
  const std::vector<uint8_t>& payload(int layer, int e) const {
    return data_[size_t(layer) * size_t(n_experts_) + size_t(e)];
  }
  // With split_matrices_ (and FetchForm::kMatrices), each expert comes as its three matrices
  // apart (as a GGUF computed in place: three tensors), from copies of its payload's parts; else
  // as one payload.
  void begin_fetch(int layer, std::span<const int> ids, FetchForm form) override {
    pending_.resize(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) pending_[i] = payload(layer, ids[i]).data();
    ++stats_.fetch_calls;
    stats_.experts_requested += ids.size();
    layout_ = cfg_.expert_layout(layer);
    split_now_ = split_matrices_ && form == FetchForm::kMatrices;
    next_ = pending_.size();
  }
  bool next_ready(size_t* index, ExpertMatrices* m, bool wait) override {
    if (wait) {
      if (on_wait_) on_wait_();
      since_wait_ = 0;
    } else if (trickle_ > 0 && since_wait_ >= trickle_) {
      return false;  // the rest has not landed yet
    }
    if (next_ == 0) return false;
    ++since_wait_;
    --next_;
    *index = next_;
    const uint8_t* p = pending_[next_];
    const ExpertLayout& lay = layout_;
    if (!split_now_) {
      *m = ExpertMatrices::of_payload(p, lay);
      return true;
    }
    auto& parts = parts_.emplace_back();
    const size_t cut[] = {lay.gate_offset, lay.up_offset, lay.down_offset, lay.bytes};
    for (int k = 0; k < 3; ++k) parts.emplace_back(p + cut[k], p + cut[k + 1]);
    *m = ExpertMatrices{parts[0].data(), parts[1].data(), parts[2].data()};
    return true;
  }
  ExpertStoreStats stats() const override { return stats_; }
  // With map_payloads_, every payload is one "mapped" region (for GpuPinnedMappings).
  std::vector<MappedRegion> mapped_regions() const override {
    std::vector<MappedRegion> out;
    if (map_payloads_)
      for (const auto& d : data_) out.push_back({"fake", d.data(), d.size()});
    return out;
  }

  // 0: every expert is ready at once; n: each waiting next_ready() lands n more.
  size_t trickle_ = 0;
  std::function<void()> on_wait_;  // runs at each waiting next_ready()
  bool split_matrices_ = false;
  bool map_payloads_ = false;

 private:
  std::deque<std::vector<std::vector<uint8_t>>> parts_;  // split matrices handed out (kept alive)
  size_t since_wait_ = 0;
  ModelConfig cfg_;
  int n_experts_;
  ExpertLayout layout_;     // the current fetch's layer's
  bool split_now_ = false;  // the current fetch hands out split matrices
  std::vector<std::vector<uint8_t>> data_;
  std::vector<const uint8_t*> pending_;
  size_t next_ = 0;
  ExpertStoreStats stats_;
};

// The prefetch worker's store: begin_fetch blocks until the gate opens (by open(), or by itself
// after 10 s so a broken cache fails instead of hanging) and may fail for one layer.
class GatedStore : public FakeStore {
 public:
  explicit GatedStore(const ModelConfig& c, bool open = false) : FakeStore(c), open_(open) {}
  void begin_fetch(int layer, std::span<const int> ids, FetchForm form) override {
    {
      std::unique_lock<std::mutex> lk(mu_);
      layers_.push_back(layer);
      cv_.wait_for(lk, std::chrono::seconds(10), [&] { return open_; });
    }
    if (delay_us_ > 0) std::this_thread::sleep_for(std::chrono::microseconds(delay_us_));
    if (layer == fail_layer_)
      throw IoError("layer_" + std::to_string(layer) + ".bin: injected read error at offset 0");
    FakeStore::begin_fetch(layer, ids, form);
  }
  void open() {
    std::lock_guard<std::mutex> lk(mu_);
    open_ = true;
    cv_.notify_all();
  }
  std::vector<int> layers_fetched() const {
    std::lock_guard<std::mutex> lk(mu_);
    return layers_;
  }
  // Until the worker has entered begin_fetch `n` times in all (it holds that group then).
  void wait_entered(size_t n) const {
    for (int i = 0; i < 10000 && layers_fetched().size() < n; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  int fail_layer_ = -1;
  int delay_us_ = 0;  // per begin_fetch: a slow read, so demand overtakes the worker

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
  std::vector<int> layers_;
};

}  // namespace moestream::gpu_cache_test
