// Implementation of loader/format/gguf_model.h: GGUF metadata and tensor shapes -> ModelConfig
// (validated by the same rules as model.json), dense tensor names, expert slice placement.
#include "loader/format/gguf_model.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/file_util.h"
#include "loader/format/gguf_arch.h"

namespace moestream {
namespace {

using json = nlohmann::json;

[[noreturn]] void bad(const std::string& where, const std::string& what) { gguf_arch_error(where, what); }

std::string file_type_name(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO (pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

}  // namespace

ModelPathProbe probe_model_path(const std::filesystem::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) return {ModelPathKind::kMissing, "no such file or directory"};
    throw_errno("cannot stat model", path);
  }
  if (S_ISDIR(st.st_mode)) return {ModelPathKind::kDirectory, {}};
  if (!S_ISREG(st.st_mode)) return {ModelPathKind::kOther, file_type_name(st.st_mode)};
  // O_NONBLOCK: a path swapped for a FIFO since the stat does not block the open.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw_errno("cannot open model", path);
  if (::fstat(fd, &st) != 0) close_and_throw_errno(fd, "cannot stat model", path);
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return {ModelPathKind::kOther, file_type_name(st.st_mode)};
  }
  unsigned char magic[4] = {};
  ssize_t r;
  size_t got = 0;
  while (got < sizeof magic && (r = ::pread(fd, magic + got, sizeof magic - got, off_t(got))) != 0) {
    if (r < 0 && errno == EINTR) continue;
    if (r < 0)
      close_and_throw_errno(fd, "cannot read the first " + std::to_string(sizeof magic) + " bytes (offset " +
                                    std::to_string(got) + ") of model",
                            path);
    got += size_t(r);
  }
  ::close(fd);
  if (got == 0) return {ModelPathKind::kOther, "an empty file"};
  if (got < sizeof magic) return {ModelPathKind::kOther, "a " + std::to_string(got) + "-byte file"};
  if (std::memcmp(magic, "GGUF", 4) == 0) return {ModelPathKind::kGguf, {}};
  static const char* kDigits = "0123456789abcdef";
  std::string hex = "0x";
  for (unsigned char b : magic) hex += {kDigits[b >> 4], kDigits[b & 15]};
  return {ModelPathKind::kOther, "a file that starts " + hex + " (a GGUF starts \"GGUF\")"};
}

bool is_gguf_file(const std::filesystem::path& path) { return probe_model_path(path).kind == ModelPathKind::kGguf; }

GgufModel::GgufModel(const std::filesystem::path& path) : files_(path) {
  const GgufMetadata& m = files_.metadata();
  const std::string where = path.string();
  const std::string& arch_s = m.get_string("general.architecture");
  const GgufArch& traits = find_gguf_arch(where, arch_s);
  const std::string a = arch_s + ".";
  // Every architecture counts its blocks (MTP blocks included) in {arch}.block_count; a tensor of
  // a block past it would be silently left out of the model.
  const uint64_t n_blocks = m.get_u64(a + "block_count");
  gguf_arch_check_block_count(files_, where, a + "block_count", n_blocks);
  if (traits.read != nullptr) {  // gpt-oss, deepseek2: readers of their own (gguf_arch.h)
    GgufArchModel r;
    traits.read(files_, where, r);
    cfg_ = std::move(r.cfg);
    experts_ = std::move(r.experts);
    names_ = std::move(r.names);
    derived_ = std::move(r.derived);
    cfg_.format = ModelFormat::kGguf;
    cfg_.dense_file = path.filename().string();
    cfg_.dense_dtype = "gguf";
    cfg_.experts_dir.clear();
    return;
  }
  qk_interleaved_ = traits.qk_interleaved;

  // Decoder layers: block_count less the MTP blocks after them (GLM-4.5's nextn layers, unused
  // by decoding), the first `lead` of them with a dense MLP instead of experts.
  const uint64_t n_nextn = m.find_u64(a + "nextn_predict_layers").value_or(0);
  if (n_nextn >= n_blocks)
    bad(where, a + "nextn_predict_layers (" + std::to_string(n_nextn) + ") leaves none of " + std::to_string(n_blocks) +
                   " blocks");
  const uint64_t n_layers = n_blocks - n_nextn;
  gguf_arch_check_mtp_blocks(files_, where, a + "nextn_predict_layers", n_layers, n_blocks);
  const uint64_t lead = m.find_u64(a + "leading_dense_block_count").value_or(0);
  if (lead >= n_layers)
    bad(where, a + "leading_dense_block_count (" + std::to_string(lead) + ") leaves no MoE layer of " +
                   std::to_string(n_layers));
  // Sizes from the tensors, which must exist whatever the metadata says.
  const std::string gate0_name = "blk." + std::to_string(lead) + ".ffn_gate_exps.weight";
  const GgufTensor* gate0 = files_.find_tensor(gate0_name);
  if (gate0 == nullptr) {
    if (files_.find_tensor("blk." + std::to_string(lead) + ".ffn_gate.0.weight") != nullptr)
      bad(where, "experts are stored one tensor per expert (blk.N.ffn_gate.E.weight), an old GGUF "
                 "layout; convert the model again with a current llama.cpp converter");
    bad(where, "tensor '" + gate0_name + "' is missing: not a mixture-of-experts model");
  }
  const GgufArchSizes z = gguf_arch_sizes(files_, where, a, int(lead), std::string(traits.expert_width_key));
  const uint64_t D = z.hidden, F = z.expert_width, E = z.experts, V = z.vocab;
  const uint64_t n_heads = m.get_u64(a + "attention.head_count");
  const uint64_t n_kv = m.find_u64(a + "attention.head_count_kv").value_or(n_heads);
  if (n_heads == 0) bad(where, a + "attention.head_count is 0");
  const uint64_t head_dim = m.find_u64(a + "attention.key_length").value_or(D / n_heads);
  if (const auto v = m.find_u64(a + "attention.value_length"); v && *v != head_dim)
    bad(where, a + "attention.value_length (" + std::to_string(*v) + ") differs from key_length (" +
                   std::to_string(head_dim) + "): not supported");

  // Everything model.json states, through model.json's validation (ranges, products, ids).
  json j;
  j["format"] = "moestream";
  j["format_version"] = 1;
  j["architecture"] = std::string(arch_name(traits.arch));
  j["vocab_size"] = V;
  j["hidden_size"] = D;
  j["n_layers"] = n_layers;
  j["n_heads"] = n_heads;
  j["n_kv_heads"] = n_kv;
  j["head_dim"] = head_dim;
  j["moe_intermediate_size"] = F;
  j["n_experts"] = E;
  j["n_experts_per_tok"] = m.get_u64(a + "expert_used_count");
  j["norm_topk_prob"] = m.find_bool(a + "expert_weights_norm").value_or(traits.norm_topk_prob);
  j["rms_norm_eps"] = m.get_f64(a + "attention.layer_norm_rms_epsilon");
  j["max_position_embeddings"] = m.get_u64(a + "context_length");
  const GgufTensor* qn = files_.find_tensor("blk.0.attn_q_norm.weight");
  j["qk_norm"] = qn == nullptr ? "none" : qn->dims.size() == 1 && qn->dims[0] == head_dim ? "per_head" : "full";
  json rope;
  rope["theta"] = m.find_f64(a + "rope.freq_base").value_or(10000.0);
  rope["scaling"] = nullptr;
  if (const std::string* st = m.find_string(a + "rope.scaling.type"); st && *st != "none") {
    if (*st != "linear" && *st != "yarn")
      bad(where, a + "rope.scaling.type '" + *st + "' is not supported (none, linear, yarn)");
    json s;
    s["type"] = *st;
    s["factor"] = m.get_f64(a + "rope.scaling.factor");
    if (const auto o = m.find_u64(a + "rope.scaling.original_context_length")) s["original_max_position_embeddings"] = *o;
    rope["scaling"] = s;
  }
  j["rope"] = rope;
  // Checked against head_dim here; the attention tensors' shapes confirm head_dim below.
  if (const uint64_t rot = gguf_arch_rope_dims(m, where, a, head_dim, traits.partial_rotary); rot != head_dim)
    j["rotary_dim"] = rot;
  const bool tied = files_.find_tensor("output.weight") == nullptr;
  j["tie_word_embeddings"] = tied;
  // Placeholders model.json requires; the GGUF-specific fields are set after validation.
  j["dense"] = {{"file", "dense.safetensors"}, {"dtype", "f32"}};
  j["experts"] = {{"dir", "experts"}, {"quant", "f32"}};
  if (const auto b = m.find_u64("tokenizer.ggml.bos_token_id")) j["bos_token_id"] = *b;
  if (const auto e = m.find_u64("tokenizer.ggml.eos_token_id")) j["eos_token_id"] = *e;
  if (lead > 0) {
    j["first_k_dense_replace"] = lead;
    j["intermediate_size"] = m.get_u64(a + "feed_forward_length");  // the dense MLP's width
  }
  if (traits.extend != nullptr) traits.extend(files_, where, a, j);
  try {
    cfg_ = ModelConfig::from_json(j, where);
  } catch (const Error& e) {
    throw FormatError(std::string(e.what()) + " (values read from the GGUF metadata and tensors)");
  }
  cfg_.format = ModelFormat::kGguf;
  cfg_.dense_file = path.filename().string();
  cfg_.dense_dtype = "gguf";
  cfg_.experts_dir.clear();

  // Every dense tensor the engine reads, with its shape (ne0 = columns first).
  const uint64_t qd = n_heads * head_dim, kvd = n_kv * head_dim;
  gguf_arch_shaped(files_, where, "output_norm.weight", {D});
  if (!tied) gguf_arch_shaped(files_, where, "output.weight", {D, V});
  for (uint64_t l = 0; l < n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    gguf_arch_shaped(files_, where, p + "attn_norm.weight", {D});
    gguf_arch_shaped(files_, where, p + "attn_q.weight", {D, qd});
    gguf_arch_shaped(files_, where, p + "attn_k.weight", {D, kvd});
    gguf_arch_shaped(files_, where, p + "attn_v.weight", {D, kvd});
    gguf_arch_shaped(files_, where, p + "attn_output.weight", {qd, D});
    gguf_arch_shaped(files_, where, gguf_dense_name(cfg_.arch, "layers." + std::to_string(l) + ".ffn_norm"), {D});
    if (cfg_.is_moe_layer(int(l))) gguf_arch_shaped(files_, where, p + "ffn_gate_inp.weight", {D, E});
    if (cfg_.qk_norm != QkNorm::kNone) {
      const uint64_t qn_len = cfg_.qk_norm == QkNorm::kPerHead ? head_dim : qd;
      const uint64_t kn_len = cfg_.qk_norm == QkNorm::kPerHead ? head_dim : kvd;
      gguf_arch_shaped(files_, where, p + "attn_q_norm.weight", {qn_len});
      gguf_arch_shaped(files_, where, p + "attn_k_norm.weight", {kn_len});
    }
    if (!cfg_.is_moe_layer(int(l))) continue;  // its dense MLP: gguf_arch_check_extra_tensors
    const GgufTensor& g = gguf_arch_shaped(files_, where, p + "ffn_gate_exps.weight", {D, F, E});
    const GgufTensor& u = gguf_arch_shaped(files_, where, p + "ffn_up_exps.weight", {D, F, E});
    const GgufTensor& d = gguf_arch_shaped(files_, where, p + "ffn_down_exps.weight", {F, D, E});
    experts_.push_back({gguf_arch_experts(where, g, E), gguf_arch_experts(where, u, E), gguf_arch_experts(where, d, E),
                        false, {}, {}, {}});
    // Whether the kernels compute these types is checked where they are linked (the forward pass).
    cfg_.layer_expert_types.push_back(ExpertTypes{ggml_quant(g.type), ggml_quant(u.type), ggml_quant(d.type)});
  }
  cfg_.expert_quant = cfg_.layer_expert_types.front().gate;
  gguf_arch_check_extra_tensors(files_, where, cfg_);
}

const GgufTensor& GgufModel::dense_tensor(const std::string& our_name) const {
  if (!names_.empty()) {  // an architecture reader's names (gguf_arch.h)
    const auto it = names_.find(our_name);
    if (it == names_.end())
      throw FormatError(files_.paths().front().string() + ": no GGUF tensor holds '" + our_name + "'" +
                        (derived_.count(our_name) ? " as stored (it is derived from others)" : ""));
    return files_.tensor(it->second);
  }
  const std::string name = gguf_dense_name(cfg_.arch, our_name);
  const GgufTensor* t = files_.find_tensor(name);
  if (t == nullptr)
    throw FormatError(files_.paths().front().string() + ": tensor '" + name + "' (" + our_name + ") is missing");
  return *t;
}

std::vector<uint8_t> GgufModel::read_tensor(const GgufTensor& t) const {
  const std::filesystem::path& p = files_.path_of(t);
  uint64_t size = 0;
  const int fd = open_for_read(p, "GGUF file", &size);
  if (t.offset > size || t.bytes > size - t.offset) {
    ::close(fd);
    throw IoError(p.string() + ": tensor '" + t.name + "' ends past the end of the file (truncated since it was opened?)");
  }
  std::vector<uint8_t> out;
  try {
    out.resize(t.bytes);
  } catch (const std::bad_alloc&) {
    ::close(fd);
    throw IoError("out of memory reading tensor '" + t.name + "' (" + std::to_string(t.bytes) + " bytes) of " + p.string());
  }
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t r = ::pread(fd, out.data() + done, out.size() - done, off_t(t.offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      const int err = r < 0 ? errno : 0;
      ::close(fd);
      throw IoError(p.string() + ": reading tensor '" + t.name + "' at offset " + std::to_string(t.offset + done) +
                    (err ? ": " + std::string(std::strerror(err)) : ": unexpected end of file"));
    }
    done += size_t(r);
  }
  ::close(fd);
  return out;
}

}  // namespace moestream
