// convert_model for a GGUF source (runtime/convert/convert.h): the pack keeps every tensor in its
// stored ggml type. Experts are copied slice by slice (gate, up, down of one expert from the three
// stacked tensors) into version-2 expert files; the dense tensors go into dense.gguf by the pack's
// names with llama's Q/K rows put back in the engine's order; the tokenizer metadata follows them.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/option_ref.h"
#include "common/file_util.h"
#include "kernels/cpu/ggml_quant.h"
#include "kernels/cpu/quant.h"
#include "loader/format/expert_file_writer.h"
#include "loader/format/gguf_model.h"
#include "loader/format/gguf_writer.h"
#include "runtime/convert/convert.h"
#include "runtime/convert/convert_output.h"
#include "runtime/convert/dense_gguf.h"

namespace moestream {
namespace {

namespace fs = std::filesystem;

// The pack's dense tensor names (model_config.h), in dense.safetensors' order.
std::vector<std::string> dense_names(const ModelConfig& c) {
  std::vector<std::string> n{"embed", "final_norm"};
  if (!c.tie_word_embeddings) n.push_back("lm_head");
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    for (const char* f : {"attn_norm", "wq", "wk", "wv", "wo"}) n.push_back(p + f);
    if (c.qk_norm != QkNorm::kNone) {
      n.push_back(p + "q_norm");
      n.push_back(p + "k_norm");
    }
    n.push_back(p + "ffn_norm");
    // Issues 20/21 (qwen2moe, glm4moe): biases, dense-MLP layers, correction bias, shared experts.
    if (c.qkv_bias)
      for (const char* f : {"bq", "bk", "bv"}) n.push_back(p + f);
    if (!c.is_moe_layer(l)) {
      for (const char* f : {"mlp_gate", "mlp_up", "mlp_down"}) n.push_back(p + f);
      continue;
    }
    n.push_back(p + "router");
    if (c.router_scoring == RouterScoring::kSigmoid) n.push_back(p + "router_bias");
    if (c.has_shared_expert()) {
      for (const char* f : {"shared_gate", "shared_up", "shared_down"}) n.push_back(p + f);
      if (c.shared_expert_gated) n.push_back(p + "shared_expert_gate");
    }
  }
  return n;
}

bool is_qk(const std::string& name) {
  const size_t dot = name.rfind('.');
  return name.rfind("layers.", 0) == 0 && dot != std::string::npos &&
         (name.compare(dot + 1, std::string::npos, "wq") == 0 || name.compare(dot + 1, std::string::npos, "wk") == 0);
}

// Within each head, the file's rows 2i and 2i+1 become our rows i and hd/2 + i (the order the
// engine's rotate-half RoPE computes; dense_weights.cpp does the same for a GGUF run in place).
std::vector<uint8_t> deinterleave_rows(const std::vector<uint8_t>& in, uint64_t rows, size_t head_dim) {
  std::vector<uint8_t> out(in);
  const size_t rb = size_t(in.size() / rows), half = head_dim / 2;
  for (size_t h0 = 0; h0 + head_dim <= rows; h0 += head_dim)
    for (size_t i = 0; i < half; ++i) {
      std::memcpy(out.data() + (h0 + i) * rb, in.data() + (h0 + 2 * i) * rb, rb);
      std::memcpy(out.data() + (h0 + half + i) * rb, in.data() + (h0 + 2 * i + 1) * rb, rb);
    }
  return out;
}

// Open descriptors of a split set's shards, closed on scope exit.
struct ShardFds {
  std::vector<int> fds;
  ~ShardFds() {
    for (int fd : fds) ::close(fd);
  }
};

void pread_exact(int fd, uint8_t* dst, uint64_t n, uint64_t off, const fs::path& path) {
  uint64_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd, dst + done, n - done, off_t(off + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw_errno("cannot read at offset " + std::to_string(off + done) + " of", path);
    if (r == 0)
      throw IoError(path.string() + ": truncated: expert data at offset " + std::to_string(off + done) +
                    " lies past the end of the file (changed since it was opened?)");
    done += uint64_t(r);
  }
}

// Refuses an output directory that is (or holds) one of the source's files: --force would delete it.
void check_output_is_not_source(const fs::path& out_dir, const GgufModelFiles& files) {
  std::error_code ec;
  const fs::path out = fs::weakly_canonical(out_dir, ec);
  if (ec || out.empty()) throw IoError("cannot resolve the output path " + out_dir.string() + ": " + ec.message());
  for (const fs::path& p : files.paths()) {
    const fs::path src = fs::weakly_canonical(p, ec);
    if (!ec && std::mismatch(out.begin(), out.end(), src.begin(), src.end()).first == out.end())
      throw ConfigError("output " + out_dir.string() + " would replace the source " + p.string());
  }
}

}  // namespace

ModelConfig convert_gguf_model(const fs::path& src, const fs::path& out_dir, const ConvertOptions& opts) {
  if (!opts.dense_dtype.empty())
    throw ConfigError(src.string() + ": " + option_ref("dense_quant") + " applies to Hugging Face checkpoints; a GGUF's dense tensors "
                      "keep their stored types");
  const GgufModel g(src);
  const GgufModelFiles& files = g.files();
  check_output_is_not_source(out_dir, files);
  if (fs::exists(out_dir) && !opts.overwrite)
    throw ConfigError("output directory " + out_dir.string() + " already exists (pass " + option_ref("force") + " to replace it)");

  ModelConfig c = g.config();
  c.format = ModelFormat::kPack;
  c.experts_dir = "experts";
  c.dense_file = kDenseGgufFile;
  c.dense_dtype = "gguf";
  const GgufMetadata& md = files.metadata();
  const bool has_tokenizer = md.find_string("tokenizer.ggml.model") != nullptr;
  c.tokenizer_file = has_tokenizer ? kDenseGgufFile : "";
  c.tokenizer_config_file.clear();
  const uint64_t D = uint64_t(c.hidden_size), F = uint64_t(c.moe_intermediate_size);
  const uint32_t E = uint32_t(c.n_experts);

  // Every slice must be exactly the matrix its type gives before anything is written. Experts are
  // numbered by MoE layer (l); the GGUF names decoder layers (blk.<l + first_k_dense_replace>).
  for (int l = 0; l < c.n_moe_layers(); ++l) {
    const ExpertLayout lay = c.expert_layout(l);
    const GgufLayerExperts& x = g.experts()[size_t(l)];
    const struct {
      const char* name;
      uint64_t got, want;
    } m[] = {{"ffn_gate_exps", x.gate.expert_bytes, quant_matrix_bytes(lay.types.gate, F, D)},
             {"ffn_up_exps", x.up.expert_bytes, quant_matrix_bytes(lay.types.up, F, D)},
             {"ffn_down_exps", x.down.expert_bytes, quant_matrix_bytes(lay.types.down, D, F)}};
    for (const auto& s : m)
      if (s.got != s.want)
        throw FormatError(src.string() + ": tensor 'blk." + std::to_string(c.first_k_dense_replace + l) + "." +
                          s.name + ".weight' holds " +
                          std::to_string(s.got) + " bytes per expert, its type and shape need " + std::to_string(s.want));
  }

  // gpt-oss / deepseek2 name their tensors through the GGUF reader (gguf_arch.h).
  const std::vector<std::string> arch_names = g.arch_dense_names();
  const std::vector<std::string> names = arch_names.empty() ? dense_names(c) : arch_names;
  std::vector<const GgufTensor*> src_tensors;
  std::vector<GgufTensorSpec> specs;
  // A pack this build could not run is refused now, naming the tensor (as infer would at load).
  auto computable = [&](const GgufTensor& t) { require_ggml_computable(t.type, files.path_of(t).string(), t.name); };
  for (int l = 0; l < c.n_moe_layers(); ++l)
    for (const char* p : {"gate", "up", "down"})
      computable(files.tensor("blk." + std::to_string(c.first_k_dense_replace + l) + ".ffn_" + p + "_exps.weight"));
  for (const std::string& n : names) {
    if (g.dense_is_derived(n)) {
      src_tensors.push_back(nullptr);  // built from others when written
      specs.push_back({n, g.dense_type(n), g.dense_dims(n)});
      continue;
    }
    const GgufTensor& t = g.dense_tensor(n);
    computable(t);
    src_tensors.push_back(&t);
    specs.push_back({n, t.type, t.dims});
  }

  TempOutput tmp(make_temp_output(out_dir, c.experts_dir));
  ProgressBar bar(opts.progress, names.size() + uint64_t(c.n_moe_layers()) * E);
  uint64_t done = 0;
  {
    GgufWriterOptions wo;
    wo.protect = files.paths();
    GgufWriter w(tmp.path / c.dense_file, dense_gguf_metadata(has_tokenizer ? &md : nullptr), specs, wo);
    const GgufDequantizer deq = [&](GgmlType t, const uint8_t* in, size_t rows, size_t cols, float* out) {
      if (!ggml_type_computable(t))
        throw ConfigError(src.string() + ": a tensor of type " + std::string(ggml_type_name(t)) +
                          " cannot be dequantised by this build");
      dequantize_matrix(t == GgmlType::kF32 ? QuantType::kF32 : ggml_quant(t), in, rows, cols, out);
    };
    for (size_t i = 0; i < names.size(); ++i) {
      if (src_tensors[i] == nullptr) {  // gpt-oss / deepseek2: built from the stored tensors
        const std::optional<GgufDerivedTensor> d = g.derived_tensor(names[i], deq);
        w.write(d->bytes.data(), d->bytes.size());
        bar.update(++done, "dense " + names[i]);
        continue;
      }
      std::vector<uint8_t> bytes = g.read_tensor(*src_tensors[i]);
      if (g.qk_rows_interleaved() && is_qk(names[i]))
        bytes = deinterleave_rows(bytes, src_tensors[i]->rows(), size_t(c.head_dim));
      w.write(bytes.data(), bytes.size());
      bar.update(++done, "dense " + names[i]);
    }
    w.commit();
  }

  ShardFds fds;
  for (const fs::path& p : files.paths()) {
    uint64_t size = 0;
    fds.fds.push_back(open_for_read(p, "GGUF file", &size));
  }
  // Every layer's slots as wide as the largest expert: the engine reads one buffer size.
  const uint64_t stride = c.max_expert_bytes();
  for (int l = 0; l < c.n_moe_layers(); ++l) {
    const ExpertLayout lay = c.expert_layout(l);
    const GgufLayerExperts& x = g.experts()[size_t(l)];
    ExpertFileWriter w(expert_file_path(tmp.path, l), lay.types, uint32_t(l), E, uint32_t(D), uint32_t(F), stride);
    std::vector<uint8_t> payload(lay.bytes);
    for (uint32_t e = 0; e < E; ++e) {
      std::fill(payload.begin(), payload.end(), 0);  // alignment gaps stay zero: stable checksums
      for (const auto& [m, off] : {std::pair{&x.gate, lay.gate_offset}, std::pair{&x.up, lay.up_offset},
                                   std::pair{&x.down, lay.down_offset}})
        pread_exact(fds.fds.at(m->shard), payload.data() + off, m->expert_bytes, m->offset + uint64_t(e) * m->expert_bytes,
                    files.paths().at(m->shard));
      if (x.bias)  // gpt-oss: f32 gate, up, down biases into the payload's bias section
        for (const auto& [m, off] : {std::pair{&x.gate_bias, lay.bias_offset}, std::pair{&x.up_bias, lay.bias_offset + F * 4},
                                     std::pair{&x.down_bias, lay.bias_offset + 2 * F * 4}})
          pread_exact(fds.fds.at(m->shard), payload.data() + off, m->expert_bytes,
                      m->offset + uint64_t(e) * m->expert_bytes, files.paths().at(m->shard));
      w.write_expert(e, payload.data());
      bar.update(++done, "layer " + std::to_string(l + 1) + "/" + std::to_string(c.n_moe_layers()) + " expert " +
                             std::to_string(e + 1) + "/" + std::to_string(E));
    }
    w.finish();
  }

  publish_model(tmp, out_dir, c,
                {{"gguf", fs::absolute(files.paths().front()).lexically_normal().string()},
                 {"architecture", md.get_string("general.architecture")},
                 {"shards", files.shard_count()}});
  bar.finish();
  return c;
}

}  // namespace moestream
