// moestream.Model and moestream.Tokenizer: loading with the option table's keywords, generation (whole text or
// streamed pieces), logits, perplexity and stats. The GIL is released while C++ runs.
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <condition_variable>
#include <cstdlib>
#include <limits>
#include <type_traits>
#include <variant>
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
#include "common/option_ref.h"
#include "loader/format/expert_file.h"
#include "loader/format/routing_log.h"
#include "python/src/bindings.h"
#include "loader/store/store_options.h"
#include "runtime/engine/generate.h"
#include "runtime/engine/model.h"
#include "runtime/engine/options.h"
#include "runtime/engine/routing_replay.h"
#include "runtime/engine/run_stats.h"
#include "runtime/model/sampler.h"
#include "runtime/tokenizer/model_tokenizer.h"
#include "runtime/tokenizer/tokenizer.h"

namespace fs = std::filesystem;

namespace moestream::py_bindings {
namespace {

// One keyword's value into its field: a bool for a flag, an int (not a bool) in the type's and the
// option's range, a number for a float, a str or os.PathLike for text (None: the default).
void set_from_python(const OptionSpec& spec, const OptionTarget& t, const py::handle& v) {
  const std::string name(spec.name);
  const auto wrong = [&](const char* want) {
    return py::type_error(name + " must be " + want + ", got " + py::str(py::type::of(v).attr("__name__")).cast<std::string>());
  };
  std::visit([&](auto* p) {
    using T = std::remove_pointer_t<decltype(p)>;
    if constexpr (std::is_same_v<T, bool>) {
      if (!py::isinstance<py::bool_>(v)) throw wrong("a bool");
      *p = v.cast<bool>();
    } else if constexpr (std::is_integral_v<T>) {
      if (!py::isinstance<py::int_>(v) || py::isinstance<py::bool_>(v)) throw wrong("an int");
      // Through Python's own comparison, so a value beyond 64 bits is refused by range, not wrapped.
      const long double lo = spec.lo != spec.hi ? spec.lo : static_cast<long double>(std::numeric_limits<T>::min());
      const long double hi = spec.lo != spec.hi ? spec.hi : static_cast<long double>(std::numeric_limits<T>::max());
      const py::int_ lo_i(static_cast<long long>(lo)), hi_i = py::reinterpret_steal<py::int_>(
          PyLong_FromUnsignedLongLong(static_cast<unsigned long long>(hi)));
      if (v < lo_i || v > hi_i)
        throw ConfigError(option_ref(spec.name) + " must be in [" + detail::number_text(static_cast<T>(lo)) + ", " +
                          detail::number_text(static_cast<T>(hi)) + "], got " + py::str(v).cast<std::string>());
      *p = v.cast<T>();
    } else if constexpr (std::is_same_v<T, float>) {
      if (!(py::isinstance<py::float_>(v) || py::isinstance<py::int_>(v)) || py::isinstance<py::bool_>(v))
        throw wrong("a number");
      *p = v.cast<float>();
      if (spec.lo != spec.hi) check_range(option_ref(spec.name), *p, float(spec.lo), float(spec.hi));
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (v.is_none()) return;
      if (!py::isinstance<py::str>(v) && !py::hasattr(v, "__fspath__")) throw wrong("a str or os.PathLike");
      *p = py::str(py::module_::import("os").attr("fspath")(v)).cast<std::string>();
    } else {
      throw wrong("a list");  // no Model keyword is a list
    }
  }, t);
}

// Model(...)'s keywords: every option of the table for Python (runtime/engine/options.h), each
// checked for its type and range, then the table's rules; a keyword not given takes the option's
// environment variable, else its default. Errors name the keyword.
EngineSettings settings_from_keywords(const py::kwargs& kw) {
  EngineSettings s;
  EngineSettings defaults;
  std::vector<OptionValue> values;
  for (const auto& [key, value] : kw) {
    const std::string name = py::cast<std::string>(key);
    const OptionSpec* spec = find_option(name);
    if (spec == nullptr || !(spec->tools & kToolPythonModel))
      throw py::type_error("Model() got an unexpected keyword argument '" + name + "'");
  }
  for (const OptionSpec& spec : option_table()) {
    if (!(spec.tools & kToolPythonModel)) continue;
    MOE_ASSERT(spec.engine != nullptr, "a Python keyword with no engine field");
    const OptionTarget t = spec.engine(s);
    const std::string name(spec.name);
    if (kw.contains(name.c_str())) {
      set_from_python(spec, t, kw[name.c_str()]);
    } else if (spec.env) {
      if (const char* env = std::getenv(option_env_name(spec).c_str()))
        set_option_text(spec, t, env, option_env_name(spec));
    }
    values.push_back({&spec, option_value_text(t) != option_value_text(spec.engine(defaults))});
  }
  check_option_rules(values, kToolPythonModel);
  return s;
}

// Model's docstring: its keywords, from the table, with defaults and environment variables.
std::string model_doc() {
  std::string d = "A packed model (convert_model output) or GGUF file, with infer's options as keywords:\n";
  EngineSettings defaults;
  for (const OptionSpec& s : option_table()) {
    if (!(s.tools & kToolPythonModel)) continue;
    const std::string def = option_value_text(s.engine(defaults));
    d += "\n" + std::string(s.name) + " (default " + (def.empty() ? "None" : def) +
         (s.env ? ", env " + option_env_name(s) : "") + "): " +
         (s.negated ? "False: " : "") + render_options(s.help, OptionCaller::kPython);
  }
  return d;
}

// The table's Python options, for tests and tools: name, where (Model or generate), type, default
// (engine options), environment variable, group, help.
py::list python_options() {
  py::list out;
  EngineSettings defaults;
  for (const OptionSpec& s : option_table()) {
    if (!(s.tools & (kToolPythonModel | kToolPythonGenerate))) continue;
    py::dict d;
    d["name"] = std::string(s.name);
    d["where"] = s.tools & kToolPythonModel ? "Model" : "generate";
    d["type"] = std::string(s.type == OptionType::kFlag ? "bool" : s.type == OptionType::kFloat ? "float"
                            : s.type == OptionType::kText ? "str" : s.type == OptionType::kList ? "dict" : "int");
    if (s.engine != nullptr) {
      const OptionTarget t = s.engine(defaults);
      d["default"] = std::visit([](auto* p) -> py::object {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, std::string>) return p->empty() ? py::none() : py::cast(*p);
        else if constexpr (std::is_same_v<T, float>) return py::float_(std::stod(detail::number_text(*p)));  // 0.8, not 0.800000011920929
        else return py::cast(*p);
      }, t);
    }
    d["env"] = s.env ? py::cast(option_env_name(s)) : py::none();
    d["group"] = std::string(option_group_title(s.group));
    d["help"] = render_options(s.help, OptionCaller::kPython);
    out.append(d);
  }
  return out;
}

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
  PyModel(const fs::path& path, const EngineSettings& o) : dir_(path) {
    const ModelOptions mo = o.model_options();
    check_model_options(mo);  // before the slow load
    const StoreConfig sc = store_config_for(mo, o.store);
    auto sink = std::make_shared<NoticeSink>();
    {
      py::gil_scoped_release nogil;
      const MappingOwnerScope owner(new_mapping_owner());  // the store's and the model's mappings
      require_model_location(dir_);
      const ModelConfig header_cfg = ModelConfig::load(dir_);
      tok_ = load_model_tokenizer(dir_, header_cfg);
      auto store = open_store_for(dir_, header_cfg, sc, [sink](const std::string& line) { sink->add(line); });
      // The log (cheap) before the weights (slow), as infer: a bad log is reported at once.
      if (!o.replay_routing.empty()) replay_.emplace(RoutingReplay::load(o.replay_routing, header_cfg));
      model_ = Model::load(dir_, mo, std::move(store));
      if (replay_) {
        RoutingReplay* replay = &*replay_;
        model_->set_routing_override([replay](int layer, uint64_t ordinal, int n, int* ids, float* w) {
          replay->route(layer, ordinal, n, ids, w);
        });
      }
      if (!o.collect_routing.empty()) attach_routing(o.collect_routing, o.collect_router_inputs);
    }
    for (const std::string& line : sink->stop_collecting())
      if (PyErr_WarnEx(PyExc_UserWarning, render_options(line, OptionCaller::kPython).c_str(), 1) != 0)
        throw py::error_already_set();
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
      if (const GpuForwardInfo* g = model_->gpu_info()) info.gpu = render_options(g->describe(), OptionCaller::kPython);
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
  std::optional<RoutingReplay> replay_;  // replay_routing: every layer's experts from a log (outlives model_)
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
  const SamplerParams kSampling;
  const GenerateOptions kGenerate;
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

  m.def("options", &python_options, "The engine options Python takes (the option table's rows).");
  py::class_<PyModel>(m, "Model", model_doc().c_str())
      .def(py::init([](const fs::path& path, const py::kwargs& kw) {
             return std::make_unique<PyModel>(path, settings_from_keywords(kw));
           }),
           py::arg("path"))
      // The sampler's keywords and defaults are the option table's (SamplerParams'), as infer's flags.
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
           py::arg("prompt"), py::arg("max_tokens") = kGenerate.n_new, py::arg("temperature") = kSampling.temperature,
           py::arg("top_p") = kSampling.top_p, py::arg("seed") = kSampling.seed, py::arg("stream") = false,
           py::kw_only(), py::arg("top_k") = kSampling.top_k, py::arg("ignore_eos") = false,
           py::arg("min_p") = kSampling.min_p, py::arg("typical_p") = kSampling.typical_p,
           py::arg("repeat_penalty") = kSampling.repeat_penalty, py::arg("repeat_last_n") = kSampling.repeat_last_n,
           py::arg("presence_penalty") = kSampling.presence_penalty,
           py::arg("frequency_penalty") = kSampling.frequency_penalty, py::arg("logit_bias") = py::none())
      .def("logits", &PyModel::logits, py::arg("token_ids"))
      .def("perplexity", &PyModel::perplexity_of, py::arg("text"), py::kw_only(), py::arg("ctx") = 0,
           py::arg("stride") = 0)
      .def("stats", &PyModel::stats)
      .def("close_routing", &PyModel::close_routing)
      .def_property_readonly("config", &PyModel::config)
      .def_property_readonly("tokenizer", &PyModel::tokenizer, py::return_value_policy::reference_internal);
}

}  // namespace moestream::py_bindings
