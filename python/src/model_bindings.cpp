// moestream.Model and moestream.Tokenizer: loading with infer's options, generation (whole text or
// streamed pieces), logits, perplexity and stats. The GIL is released while C++ runs.
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <condition_variable>
#include <cstdio>
#include <deque>
#include <exception>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/checked.h"
#include "common/error.h"
#include "common/mapping_guard.h"
#include "loader/format/expert_file.h"
#include "loader/format/routing_log.h"
#include "python/src/bindings.h"
#include "loader/store/store_options.h"
#include "runtime/engine/generate.h"
#include "runtime/engine/model.h"
#include "runtime/engine/run_stats.h"
#include "runtime/model/sampler.h"
#include "runtime/tokenizer/model_tokenizer.h"
#include "runtime/tokenizer/tokenizer.h"

namespace fs = std::filesystem;

namespace moestream::py_bindings {
namespace {

// infer's flags, as keyword arguments of Model(...).
struct PyModelOptions {
  StoreConfig store;  // io ... direct_max_read_kb; verify_checksums is copied in from below
  bool cache_aware = false;
  float cache_tolerance = 0.10f;
  int threads = 0, ctx = 0, batch = 0;
  bool verify_checksums = true;
  fs::path collect_routing;
  bool collect_router_inputs = false;
  bool gpu = false;
  uint64_t gpu_cache_mb = 0;  // 0 = automatic
  int moe_lookahead = 0;
  bool gpu_preload = false;
  bool gpu_pin_page_cache = false;
  bool gpu_cpu_misses = false;
};

// The store builder's warnings and the read engine's notices. While the model loads (GIL released)
// they are collected, then raised as Python UserWarnings; later ones come from I/O threads, where
// Python cannot be called safely, and go to stderr as the engine's default does.
class NoticeSink {
 public:
  void add(const std::string& line) {
    std::lock_guard lock(mu_);
    if (collecting_)
      lines_.push_back(line);
    else
      std::fprintf(stderr, "moestream: %s\n", line.c_str());
  }
  std::vector<std::string> stop_collecting() {
    std::lock_guard lock(mu_);
    collecting_ = false;
    return std::move(lines_);
  }

 private:
  std::mutex mu_;
  bool collecting_ = true;
  std::vector<std::string> lines_;
};

class PyModel {
 public:
  PyModel(const fs::path& path, const PyModelOptions& o) : dir_(path) {
    // infer's bounds (common/checked.h), in Python's spelling, before the slow load.
    check_range("cache_tolerance", o.cache_tolerance, 0.0f, kMaxCacheTolerance);
    check_range("threads", o.threads, 0, kMaxThreads);
    check_range("ctx", o.ctx, 0, kMaxContext);
    check_range("batch", o.batch, 0, 1 << 20);
    check_range("gpu_cache_mb", o.gpu_cache_mb, uint64_t(0), kMaxGpuCacheMb);
    if (o.collect_router_inputs && o.collect_routing.empty())
      throw ConfigError("collect_router_inputs needs collect_routing=PATH");
    ModelOptions mo;
    mo.n_threads = o.threads;
    mo.max_context = o.ctx;
    mo.verify_checksums = o.verify_checksums;
    mo.cache_aware.enabled = o.cache_aware;
    mo.cache_aware.tolerance = o.cache_tolerance;
    mo.max_batch = o.batch > 0 ? o.batch : default_max_batch(o.gpu);
    mo.gpu = o.gpu;
    mo.gpu_cache_mb = size_t(o.gpu_cache_mb);
    mo.moe_lookahead = o.moe_lookahead;
    mo.gpu_preload = o.gpu_preload;
    mo.gpu_pin_page_cache = o.gpu_pin_page_cache;
    mo.gpu_cpu_misses = o.gpu_cpu_misses;
    // infer's checks, before the slow load, in Python's spelling of the options.
    check_gpu_options(mo, {.gpu = "gpu=True", .gpu_cache_mb = "gpu_cache_mb",
                           .moe_lookahead = "moe_lookahead", .gpu_preload = "gpu_preload=True",
                           .gpu_pin_page_cache = "gpu_pin_page_cache=True",
                           .gpu_cpu_misses = "gpu_cpu_misses=True", .assign = "="});
    const StoreConfig sc = store_config_for(mo, o.store);
    auto sink = std::make_shared<NoticeSink>();
    {
      py::gil_scoped_release nogil;
      const MappingOwnerScope owner(new_mapping_owner());  // the store's and the model's mappings
      require_model_location(dir_);
      const ModelConfig header_cfg = ModelConfig::load(dir_);
      tok_ = load_model_tokenizer(dir_, header_cfg);
      auto store = open_store_for(dir_, header_cfg, sc, OptionSpelling::kPython,
                                  [sink](const std::string& line) { sink->add(line); });
      model_ = Model::load(dir_, mo, std::move(store));
      if (!o.collect_routing.empty()) attach_routing(o.collect_routing, o.collect_router_inputs);
    }
    for (const std::string& line : sink->stop_collecting())
      if (PyErr_WarnEx(PyExc_UserWarning, line.c_str(), 1) != 0) throw py::error_already_set();
  }

  ~PyModel() {
    // Destructors never throw: a failed final flush is lost here; close_routing() reports it.
    if (routing_) model_->set_routing_callback({});
  }

  // Appends every layer's routing to a log, one request per prompt or window (as infer does).
  void attach_routing(const fs::path& path, bool inputs) {
    const ModelConfig& cfg = model_->config();
    RoutingLogHeader rh{model_identity_hash(dir_), uint32_t(cfg.n_moe_layers()), uint32_t(cfg.n_experts),
                        uint32_t(cfg.n_experts_per_tok), uint32_t(cfg.hidden_size)};
    routing_.emplace(path, rh);
    RoutingLogWriter* log = &*routing_;
    model_->set_routing_callback([log, inputs, request = uint64_t(0)](const RoutingEvent& ev) mutable {
      if (ev.layer == 0 && ev.prefill && ev.position == 0) request = log->take_request_id();
      RoutingRecord r;
      r.request_id = request;
      r.phase = ev.prefill ? RoutingPhase::kPrefill : RoutingPhase::kDecode;
      r.layer = static_cast<uint16_t>(ev.layer);
      const size_t k = size_t(ev.top_k), hidden = size_t(ev.hidden);
      for (int t = 0; t < ev.n_tokens; ++t) {
        r.position = static_cast<uint32_t>(ev.position + t);
        r.ids.assign(ev.ids + t * k, ev.ids + (t + 1) * k);
        r.weights.assign(ev.weights + t * k, ev.weights + (t + 1) * k);
        if (inputs) r.router_input.assign(ev.router_inputs + t * hidden, ev.router_inputs + (t + 1) * hidden);
        log->append(r);
      }
    });
  }

  // Flushes, fsyncs and closes the routing log (IoError on failure); later calls record nothing.
  void close_routing() {
    py::gil_scoped_release nogil;
    std::lock_guard lock(mu_);
    if (!routing_) return;
    model_->set_routing_callback({});
    routing_->close();
    routing_.reset();
  }

  const Tokenizer& tokenizer() const {
    if (!tok_) throw ConfigError(dir_.string() + "/model.json: field tokenizer.file is null: the model ships no tokenizer");
    return *tok_;
  }

  std::vector<int> prompt_ids(const py::object& prompt) const {
    std::vector<int> ids;
    if (py::isinstance<py::str>(prompt)) {
      const std::string text = prompt.cast<std::string>();
      py::gil_scoped_release nogil;
      for (int32_t id : tokenizer().encode(text, true)) ids.push_back(id);
    } else {
      ids = prompt.cast<std::vector<int>>();
    }
    if (ids.empty()) throw ConfigError("prompt: no tokens");
    return ids;
  }

  GenerateOptions generate_options(int max_tokens, bool ignore_eos) const {
    if (max_tokens < 0) throw ConfigError("max_tokens must be >= 0, got " + std::to_string(max_tokens));
    GenerateOptions go;
    go.n_new = max_tokens;
    if (!ignore_eos) {
      const ModelConfig& cfg = model_->config();
      if (cfg.eos_token_id) go.stop_token = *cfg.eos_token_id;
      else if (tok_ && tok_->eos_id()) go.stop_token = *tok_->eos_id();
    }
    return go;
  }

  // Whole generation: returns the generated text (or ids when the model has no tokenizer).
  py::object generate_all(const std::vector<int>& prompt, const GenerateOptions& go, const SamplerParams& sp) {
    std::vector<int> out;
    {
      py::gil_scoped_release nogil;
      std::lock_guard lock(mu_);
      Sampler sampler(sp);
      last_gen_ = generate(*model_, prompt, go, sampler, [](int) {}, &out);
      last_ppl_.reset();
      if (routing_) routing_->flush();
    }
    if (!tok_) return py::cast(out);
    std::string text;
    {
      py::gil_scoped_release nogil;
      text = tok_->decode(std::vector<int32_t>(out.begin(), out.end()));
    }
    return py::str(text);
  }

  py::array_t<float> logits(const std::vector<int>& ids) {
    if (ids.empty()) throw ConfigError("logits: token_ids is empty");
    const size_t vocab = size_t(model_->config().vocab_size);
    std::vector<float> out(ids.size() * vocab);
    {
      py::gil_scoped_release nogil;
      std::lock_guard lock(mu_);
      model_->reset();
      model_->forward(ids, out, /*all_logits=*/true);
      if (routing_) routing_->flush();
    }
    return to_numpy(std::move(out), {py::ssize_t(ids.size()), py::ssize_t(vocab)});
  }

  py::dict perplexity_of(const py::object& text, int ctx, int stride) {
    std::vector<int> ids = prompt_ids(text);
    PerplexityResult r;
    {
      py::gil_scoped_release nogil;
      std::lock_guard lock(mu_);
      // infer's defaults: a 512-token window (or the context), stride half of it.
      const int c = ctx > 0 ? ctx : std::min(model_->max_context(), 512);
      const int s = stride > 0 ? stride : std::max(1, c / 2);
      r = perplexity(*model_, ids, c, s);
      last_ppl_ = r;
      last_gen_.reset();
      if (routing_) routing_->flush();
    }
    py::dict d;
    d["perplexity"] = r.perplexity;
    d["mean_nll"] = r.mean_nll;
    d["n_scored"] = r.n_scored;
    d["n_windows"] = r.n_windows;
    d["ctx"] = r.ctx;
    d["stride"] = r.stride;
    d["seconds"] = r.seconds;
    return d;
  }

  // infer --stats-json's object for the last generate/perplexity call, plus the store's counters
  // since load and the model's shape.
  py::object stats() {
    nlohmann::json j;
    {
      py::gil_scoped_release nogil;
      std::lock_guard lock(mu_);
      const ModelConfig& cfg = model_->config();
      RunInfo info{dir_.string(), std::string(arch_name(cfg.arch)), std::string(quant_name(cfg.expert_quant)),
                   model_->n_threads(), model_->max_context(), model_->expert_store().describe(), "", ""};
      if (const GpuForwardInfo* g = model_->gpu_info()) info.gpu = g->describe();
      j = run_stats_json(info, last_gen_, last_ppl_);
      const ExpertStoreStats s = model_->expert_stats();
      j["expert_store"] = {{"fetch_calls", s.fetch_calls}, {"experts_requested", s.experts_requested},
                           {"experts_read", s.experts_read}, {"bytes_read", s.bytes_read},
                           {"io_seconds", s.io_seconds}, {"host_cache_hits", s.host_cache_hits},
                           {"page_cache_hits", s.page_cache_hits}, {"read_ops_requested", s.read_ops_requested},
                           {"read_ops_issued", s.read_ops_issued}, {"bytes_transferred", s.bytes_transferred},
                           {"io_wait_seconds", s.io_wait_seconds}, {"checksum_seconds", s.checksum_seconds},
                           {"experts_in_place", s.experts_in_place}, {"verified_in_place", s.verified_in_place}};
      const CacheAwareStats& c = model_->cache_aware_stats();
      j["cache_aware"] = {{"enabled", model_->cache_aware().enabled}, {"tolerance", model_->cache_aware().tolerance},
                          {"routings", c.routings}, {"substitutions", c.substitutions},
                          {"misses_before", c.misses_before}, {"misses_after", c.misses_after},
                          {"agreement", c.agreement()}};
      j["active_bytes_per_token"] = model_->active_bytes_per_token();
      j["n_past"] = model_->n_past();
    }
    return json_to_python(j);
  }

  py::dict config() const {
    const ModelConfig& c = model_->config();
    py::dict d;
    d["architecture"] = std::string(arch_name(c.arch));
    d["expert_quant"] = std::string(quant_name(c.expert_quant));
    d["n_layers"] = c.n_layers;
    d["n_experts"] = c.n_experts;
    d["n_experts_per_tok"] = c.n_experts_per_tok;
    d["hidden_size"] = c.hidden_size;
    d["vocab_size"] = c.vocab_size;
    d["max_context"] = model_->max_context();
    d["threads"] = model_->n_threads();
    d["expert_io"] = model_->expert_store().describe();
    return d;
  }

  Model& model() { return *model_; }
  std::mutex& mutex() { return mu_; }
  bool has_tokenizer() const { return tok_.has_value(); }
  void set_last_gen(const GenerateStats& g) { last_gen_ = g; last_ppl_.reset(); }
  void flush_routing() { if (routing_) routing_->flush(); }

 private:
  fs::path dir_;
  std::unique_ptr<Model> model_;
  std::optional<Tokenizer> tok_;
  std::optional<RoutingLogWriter> routing_;
  std::optional<GenerateStats> last_gen_;
  std::optional<PerplexityResult> last_ppl_;
  std::mutex mu_;  // one call at a time: the model's KV cache is single-sequence
};

// Iterator over the pieces of a generation that runs on its own thread, so Python can consume
// text as it is produced; abandoning the iterator stops the generation at the next token.
class GenerationStream {
 public:
  GenerationStream(py::object owner, PyModel& m, std::vector<int> prompt, GenerateOptions go, SamplerParams sp)
      : owner_(std::move(owner)), model_(m) {
    Sampler sampler(sp);  // validate before starting the thread: errors reach the caller now
    thread_ = std::thread([this, prompt = std::move(prompt), go, sampler]() mutable { run(prompt, go, sampler); });
  }
  ~GenerationStream() {
    {
      std::lock_guard lock(mu_);
      cancel_ = true;
    }
    py::gil_scoped_release nogil;
    if (thread_.joinable()) thread_.join();
  }

  // Next piece of text ("" pieces are skipped), or the ids as ints without a tokenizer.
  py::object next() {
    std::unique_lock lock(mu_);
    {
      py::gil_scoped_release nogil;
      cv_.wait(lock, [&] { return !queue_.empty() || done_; });
    }
    if (!queue_.empty()) {
      Piece p = std::move(queue_.front());
      queue_.pop_front();
      if (p.id >= 0) return py::int_(p.id);
      return py::str(p.text);
    }
    if (error_) {
      std::exception_ptr e = error_;
      error_ = nullptr;
      lock.unlock();
      std::rethrow_exception(e);
    }
    throw py::stop_iteration();
  }

 private:
  struct Piece {
    std::string text;
    int id = -1;
  };
  struct Cancelled {};

  void push(Piece p) {
    std::lock_guard lock(mu_);
    if (cancel_) throw Cancelled{};
    queue_.push_back(std::move(p));
    cv_.notify_one();
  }

  void run(const std::vector<int>& prompt, const GenerateOptions& go, Sampler& sampler) {
    try {
      std::lock_guard model_lock(model_.mutex());
      std::optional<StreamDecoder> dec;
      if (model_.has_tokenizer()) dec.emplace(model_.tokenizer());
      GenerateStats st = generate(model_.model(), prompt, go, sampler, [&](int id) {
        if (!dec) return push({"", id});
        std::string piece = dec->push(id);
        if (!piece.empty()) push({std::move(piece), -1});
      });
      if (dec) {
        std::string rest = dec->flush();
        if (!rest.empty()) push({std::move(rest), -1});
      }
      model_.set_last_gen(st);
      model_.flush_routing();
    } catch (const Cancelled&) {
      // The consumer went away: nothing to report.
    } catch (...) {
      std::lock_guard lock(mu_);
      error_ = std::current_exception();
    }
    std::lock_guard lock(mu_);
    done_ = true;
    cv_.notify_one();
  }

  py::object owner_;  // the Python Model: alive while the stream is (destroyed with the GIL held)
  PyModel& model_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Piece> queue_;
  bool done_ = false, cancel_ = false;
  std::exception_ptr error_;
};

}  // namespace

void bind_model(py::module_& m) {
  py::class_<Tokenizer>(m, "Tokenizer", "A Hugging Face tokenizer.json, id-for-id with `tokenizers`.")
      .def_static("load", [](const fs::path& path, const std::optional<fs::path>& config) {
            py::gil_scoped_release nogil;
            return Tokenizer::load(path, config.value_or(fs::path()));
          }, py::arg("tokenizer_json"), py::arg("tokenizer_config") = py::none())
      .def("encode", [](const Tokenizer& t, const std::string& text, bool add_special_tokens) {
            py::gil_scoped_release nogil;
            std::vector<int32_t> ids = t.encode(text, add_special_tokens);
            return std::vector<int>(ids.begin(), ids.end());
          }, py::arg("text"), py::arg("add_special_tokens") = true)
      .def("decode", [](const Tokenizer& t, const std::vector<int32_t>& ids, bool skip_special_tokens) {
            std::string s;
            {
              py::gil_scoped_release nogil;
              s = t.decode(ids, skip_special_tokens);
            }
            return py::str(s);  // invalid UTF-8 never comes out: decode replaces it with U+FFFD
          }, py::arg("ids"), py::arg("skip_special_tokens") = false)
      .def_property_readonly("vocab_size", &Tokenizer::vocab_size)
      .def_property_readonly("bos_id", &Tokenizer::bos_id)
      .def_property_readonly("eos_id", &Tokenizer::eos_id)
      .def("token_text", &Tokenizer::token_text, py::arg("id"))
      .def("token_id", &Tokenizer::token_id, py::arg("token"));

  py::class_<GenerationStream>(m, "GenerationStream", "Pieces of text as a generation produces them.")
      .def("__iter__", [](GenerationStream& s) -> GenerationStream& { return s; })
      .def("__next__", &GenerationStream::next);

  const StoreConfig kStoreDefaults;
  py::class_<PyModel>(m, "Model", "A packed model (convert_model output), with infer's options.")
      .def(py::init([](const fs::path& path, const std::string& io, bool io_direct, uint64_t host_cache_mb,
                       bool cache_aware, float cache_tolerance, int threads, int ctx, int batch,
                       bool verify_checksums, uint32_t io_qd, uint32_t io_rings, uint32_t io_threads,
                       uint64_t coalesce_gap_kb, uint64_t max_read_kb, uint64_t direct_max_read_kb,
                       std::optional<fs::path> collect_routing, bool collect_router_inputs, bool gpu,
                       uint64_t gpu_cache_mb, int moe_lookahead, std::optional<fs::path> io_profile,
                       bool gpu_preload, bool gpu_pin_page_cache, bool gpu_cpu_misses, bool auto_direct) {
             PyModelOptions o;
             o.store = {.io = io, .io_direct = io_direct, .host_cache_mb = host_cache_mb, .io_qd = io_qd,
                        .io_rings = io_rings, .io_threads = io_threads, .coalesce_gap_kb = coalesce_gap_kb,
                        .max_read_kb = max_read_kb, .direct_max_read_kb = direct_max_read_kb,
                        .io_profile = io_profile ? io_profile->string() : std::string(),
                        .auto_direct = auto_direct};
             o.cache_aware = cache_aware;
             o.cache_tolerance = cache_tolerance;
             o.threads = threads;
             o.ctx = ctx;
             o.batch = batch;
             o.verify_checksums = verify_checksums;
             o.collect_routing = collect_routing.value_or(fs::path());
             o.collect_router_inputs = collect_router_inputs;
             o.gpu = gpu;
             o.gpu_cache_mb = gpu_cache_mb;
             o.moe_lookahead = moe_lookahead;
             o.gpu_preload = gpu_preload;
             o.gpu_pin_page_cache = gpu_pin_page_cache;
             o.gpu_cpu_misses = gpu_cpu_misses;
             return std::make_unique<PyModel>(path, o);
           }),
           // The store keywords' defaults are the builder's (infer's flags have the same).
           py::arg("path"), py::kw_only(), py::arg("io") = kStoreDefaults.io,
           py::arg("io_direct") = kStoreDefaults.io_direct, py::arg("host_cache_mb") = kStoreDefaults.host_cache_mb,
           py::arg("cache_aware") = false, py::arg("cache_tolerance") = 0.10f,
           py::arg("threads") = 0, py::arg("ctx") = 0, py::arg("batch") = 0, py::arg("verify_checksums") = true,
           py::arg("io_qd") = kStoreDefaults.io_qd, py::arg("io_rings") = kStoreDefaults.io_rings,
           py::arg("io_threads") = kStoreDefaults.io_threads, py::arg("coalesce_gap_kb") = kStoreDefaults.coalesce_gap_kb,
           py::arg("max_read_kb") = kStoreDefaults.max_read_kb,
           py::arg("direct_max_read_kb") = kStoreDefaults.direct_max_read_kb,
           py::arg("collect_routing") = py::none(), py::arg("collect_router_inputs") = false,
           py::arg("gpu") = false, py::arg("gpu_cache_mb") = 0, py::arg("moe_lookahead") = 0,
           py::arg("io_profile") = py::none(), py::arg("gpu_preload") = false,
           py::arg("gpu_pin_page_cache") = false, py::arg("gpu_cpu_misses") = false,
           py::arg("auto_direct") = kStoreDefaults.auto_direct)
      .def("generate", [](PyModel& self, const py::object& prompt, int max_tokens, float temperature, float top_p,
                          uint64_t seed, bool stream, int top_k, bool ignore_eos, float min_p, float typical_p,
                          float repeat_penalty, int repeat_last_n, float presence_penalty, float frequency_penalty,
                          const std::optional<std::map<int, float>>& logit_bias) -> py::object {
             std::vector<int> ids = self.prompt_ids(prompt);
             GenerateOptions go = self.generate_options(max_tokens, ignore_eos);
             SamplerParams sp{.temperature = temperature, .top_k = top_k, .top_p = top_p, .seed = seed,
                              .min_p = min_p, .typical_p = typical_p, .repeat_penalty = repeat_penalty,
                              .repeat_last_n = repeat_last_n, .presence_penalty = presence_penalty,
                              .frequency_penalty = frequency_penalty, .logit_bias = {}};
             for (const auto& [id, bias] : logit_bias.value_or(std::map<int, float>())) sp.logit_bias.push_back({id, bias});
             if (stream) return py::cast(new GenerationStream(py::cast(&self, py::return_value_policy::reference),
                                                              self, std::move(ids), go, sp),
                                         py::return_value_policy::take_ownership);
             return self.generate_all(ids, go, sp);
           },
           // The sampler's keywords and defaults are infer's flags (--min-p ... --logit-bias).
           py::arg("prompt"), py::arg("max_tokens") = 64, py::arg("temperature") = 0.8f, py::arg("top_p") = 0.95f,
           py::arg("seed") = 0, py::arg("stream") = false, py::kw_only(), py::arg("top_k") = 40,
           py::arg("ignore_eos") = false, py::arg("min_p") = 0.0f, py::arg("typical_p") = 1.0f,
           py::arg("repeat_penalty") = 1.0f, py::arg("repeat_last_n") = 64, py::arg("presence_penalty") = 0.0f,
           py::arg("frequency_penalty") = 0.0f, py::arg("logit_bias") = py::none())
      .def("logits", &PyModel::logits, py::arg("token_ids"))
      .def("perplexity", &PyModel::perplexity_of, py::arg("text"), py::kw_only(), py::arg("ctx") = 0,
           py::arg("stride") = 0)
      .def("stats", &PyModel::stats)
      .def("close_routing", &PyModel::close_routing)
      .def_property_readonly("config", &PyModel::config)
      .def_property_readonly("tokenizer", &PyModel::tokenizer, py::return_value_policy::reference_internal);
}

}  // namespace moestream::py_bindings
