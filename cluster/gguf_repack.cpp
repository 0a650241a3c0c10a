// Implementation of cluster/gguf_repack.h.
#include "cluster/gguf_repack.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <memory>

#include "common/error.h"
#include "common/file_util.h"
#include "loader/format/gguf_model.h"
#include "loader/format/gguf_writer.h"

namespace fs = std::filesystem;

namespace moestream::cluster {

namespace {

bool is_permutation(const std::vector<uint32_t>& p, uint32_t n) {
  if (p.size() != n) return false;
  std::vector<uint8_t> seen(n, 0);
  for (uint32_t v : p) {
    if (v >= n || seen[v]) return false;
    seen[v] = 1;
  }
  return true;
}

// Layer of an expert-indexed tensor name (gguf_repack.h), or -1 for any other tensor.
int64_t expert_tensor_layer(const std::string& name) {
  if (name.rfind("blk.", 0) != 0) return -1;
  const size_t dot = name.find('.', 4);
  if (dot == std::string::npos || dot == 4 || dot - 4 > 9) return -1;
  int64_t l = 0;
  for (size_t i = 4; i < dot; ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    l = l * 10 + (name[i] - '0');
  }
  const std::string rest = name.substr(dot + 1);
  const bool router = rest.rfind("ffn_gate_inp.", 0) == 0;  // not ffn_gate_inp_shexp (shared expert)
  const bool stacked = rest.find("_exps.") != std::string::npos;
  const bool bias = rest.rfind("exp_probs_b.", 0) == 0;
  return router || stacked || bias ? l : -1;
}

// The permutation recorded in `md` for `n_layers` x `n_experts` (identity where the file has none).
std::vector<std::vector<uint32_t>> recorded_permutation(const GgufMetadata& md, uint32_t n_layers, uint32_t n_experts,
                                                        const std::string& file) {
  std::vector<std::vector<uint32_t>> perm(n_layers);
  for (uint32_t l = 0; l < n_layers; ++l) {
    const std::string key = kGgufPermutationKey + std::to_string(l);
    std::vector<uint32_t>& p = perm[l];
    if (md.find(key) == nullptr) {
      p.resize(n_experts);
      for (uint32_t e = 0; e < n_experts; ++e) p[e] = e;
      continue;
    }
    for (int64_t v : md.get_i64_array(key)) p.push_back(v < 0 || v > int64_t(UINT32_MAX) ? UINT32_MAX : uint32_t(v));
    if (!is_permutation(p, n_experts))
      throw FormatError(file + ": metadata key '" + key + "' is not a permutation of " + std::to_string(n_experts) +
                        " experts");
  }
  return perm;
}

// Reads [off, off + n) of fd (the source, validated by the caller) in bounded chunks into the writer.
void copy_range(int fd, const fs::path& src, uint64_t off, uint64_t n, std::vector<char>& buf, GgufWriter& w) {
  while (n > 0) {
    const uint64_t k = std::min<uint64_t>(n, buf.size());
    uint64_t done = 0;
    while (done < k) {
      const ssize_t r = ::pread(fd, buf.data() + done, k - done, off_t(off + done));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) throw_errno("cannot read at offset " + std::to_string(off + done) + " of", src);
      if (r == 0) throw IoError(src.string() + ": file shrank while being copied (EOF at offset " +
                                std::to_string(off + done) + ")");
      done += uint64_t(r);
    }
    w.write(buf.data(), k);
    off += k;
    n -= k;
  }
}

}  // namespace

std::vector<uint32_t> slots_within_groups(const std::vector<uint32_t>& slots, uint32_t groups) {
  const uint32_t E = uint32_t(slots.size()), size = groups ? E / groups : 0;
  if (groups == 0 || size * groups != E) throw ConfigError("routing groups: " + std::to_string(E) + " experts in " +
                                                           std::to_string(groups) + " groups");
  std::vector<uint32_t> out(E);
  std::vector<uint32_t> members(size);
  for (uint32_t g = 0; g < groups; ++g) {
    for (uint32_t i = 0; i < size; ++i) members[i] = g * size + i;
    std::sort(members.begin(), members.end(), [&](uint32_t a, uint32_t b) { return slots[a] < slots[b]; });
    for (uint32_t i = 0; i < size; ++i) out[members[i]] = g * size + i;
  }
  return out;
}

std::vector<uint32_t> order_of_slots(const std::vector<uint32_t>& slots) {
  if (!is_permutation(slots, uint32_t(slots.size()))) throw ConfigError("expert slots are not a permutation");
  std::vector<uint32_t> order(slots.size());
  for (uint32_t e = 0; e < slots.size(); ++e) order[slots[e]] = e;
  return order;
}

GgufLayout read_gguf_layout(const fs::path& path, const IoEngineOptions& reads) {
  const GgufModel model(path);
  const ModelConfig& cfg = model.config();
  // Routing logs, maps and the recorded permutation number MoE layers (leading dense layers of
  // GLM-4.5 or DeepSeek have no experts).
  const uint32_t L = uint32_t(cfg.n_moe_layers()), E = uint32_t(cfg.n_experts);
  GgufLayout out;
  out.packed.want.model_hash = model_identity_hash(path);
  out.packed.want.n_layers = L;
  out.packed.want.n_experts = E;
  for (uint32_t l = 0; l < L; ++l) out.packed.maps.push_back(ExpertMap::identity(E));
  const GgufLayerExperts& x = model.experts().front();
  out.packed.geometry.data_offset = x.gate.offset;
  out.packed.geometry.expert_bytes = x.gate.expert_bytes + x.up.expert_bytes + x.down.expert_bytes;
  out.packed.geometry.expert_stride = out.packed.geometry.expert_bytes;
  out.packed.geometry = read_by(out.packed.geometry, reads);
  const GgufMetadata& md = model.files().metadata();
  out.permutation = recorded_permutation(md, L, E, path.string());
  if (md.find(kGgufPermutationSourceKey) != nullptr) out.source_hash = md.get_u64(kGgufPermutationSourceKey);
  out.routing_groups = uint32_t(std::max(cfg.n_group, 1));
  return out;
}

std::vector<RoutingLog> load_gguf_routing_logs(const std::vector<std::string>& paths, const GgufLayout& layout,
                                               const fs::path& model, bool shape_only,
                                               const std::function<void(const std::string&)>& notice) {
  const RoutingLogHeader& want = layout.packed.want;
  return read_routing_logs(paths, notice, [&](const std::string& p, RoutingLog& log) {
    const RoutingLogHeader& h = log.header;
    const bool same_shape = h.n_layers == want.n_layers && h.n_experts == want.n_experts;
    const bool of_original = layout.source_hash && h.model_hash == *layout.source_hash;
    if (!same_shape || (h.model_hash != want.model_hash && !of_original && !shape_only))
      throw another_model_error(
          p, h, model,
          std::to_string(want.model_hash) +
              (layout.source_hash ? " or its original's " + std::to_string(*layout.source_hash) : ""),
          want);
    if (of_original && h.model_hash != want.model_hash) {
      // Original ids -> this file's positions, through the inverse of the recorded permutation.
      std::vector<std::vector<uint16_t>> pos(want.n_layers, std::vector<uint16_t>(want.n_experts));
      for (uint32_t l = 0; l < want.n_layers; ++l)
        for (uint32_t i = 0; i < want.n_experts; ++i) pos[l][layout.permutation[l][i]] = uint16_t(i);
      for (RoutingRecord& r : log.records)
        for (uint16_t& id : r.ids) id = pos[r.layer][id];  // layer and ids were checked by the reader
      if (notice) notice(p + ": recorded on the original model; expert ids mapped through the recorded permutation");
    }
  });
}

GgufRepackResult repack_gguf_experts(const fs::path& src, const fs::path& out,
                                     const std::vector<std::vector<uint32_t>>& order, const GgufRepackOptions& opts) {
  const GgufModel model(src);  // a supported architecture, shapes checked against the metadata
  if (model.files().shard_count() > 1)
    throw ConfigError(src.string() + ": a split GGUF set (" + std::to_string(model.files().shard_count()) +
                      " shards) is not repacked: merge it into one file first (llama-gguf-split --merge)");
  const GgufFile& f = model.files().shard(0);
  const std::string name = f.path().string();
  // Orders are per MoE layer; blk.N holds MoE layer N - first_dense.
  const ModelConfig& cfg = model.config();
  const uint32_t L = uint32_t(cfg.n_moe_layers()), E = uint32_t(cfg.n_experts);
  const int64_t first_dense = cfg.n_layers - cfg.n_moe_layers();
  if (order.size() != L)
    throw ConfigError("GGUF repack: " + std::to_string(order.size()) + " layer orders for " + std::to_string(L) +
                      " MoE layers");
  for (uint32_t l = 0; l < L; ++l)
    if (!is_permutation(order[l], E))
      throw ConfigError("GGUF repack: the order of layer " + std::to_string(l) + " is not a permutation of " +
                        std::to_string(E) + " experts");
  // A GGUF's expert ids are its positions, and grouped routing (DeepSeek-V3's n_group) takes
  // groups as runs of consecutive ids: an expert moved to another group would route differently.
  const uint32_t group = E / uint32_t(std::max(cfg.n_group, 1));
  for (uint32_t l = 0; l < L && cfg.n_group > 1; ++l)
    for (uint32_t i = 0; i < E; ++i)
      if (order[l][i] / group != i / group)
        throw ConfigError("GGUF repack: the order of MoE layer " + std::to_string(l) + " moves expert " +
                          std::to_string(order[l][i]) + " into routing group " + std::to_string(i / group) + " of " +
                          std::to_string(cfg.n_group) + " (groups of " + std::to_string(group) +
                          " consecutive experts); a GGUF keeps each expert in its group. Convert it to a pack "
                          "(convert_model), whose .map files reorder the bytes and keep the ids");

  // Which tensors move, and each one's expert slice.
  std::vector<int64_t> layer_of(f.tensors().size(), -1);
  std::vector<uint64_t> slice(f.tensors().size(), 0);
  std::vector<uint32_t> left(L, 0);  // expert tensors of each layer not yet written
  for (size_t i = 0; i < f.tensors().size(); ++i) {
    const GgufTensor& t = f.tensors()[i];
    const int64_t blk = expert_tensor_layer(t.name);
    if (blk < 0) continue;
    const std::string what = name + ": tensor '" + t.name + "'";
    if (blk < first_dense || blk >= cfg.n_layers)
      throw FormatError(what + ": expert-indexed, but block " + std::to_string(blk) + " is not one of the " +
                        std::to_string(L) + " MoE layers (blocks " + std::to_string(first_dense) + ".." +
                        std::to_string(cfg.n_layers - 1) + ")");
    const int64_t l = blk - first_dense;
    if (t.dims.back() != E)
      throw FormatError(what + ": its last dim " + std::to_string(t.dims.back()) + " is not the " + std::to_string(E) +
                        " experts, so it cannot be permuted");
    // Expert slices must be whole rows (whole blocks): a 1-D tensor only of a plain type.
    if (t.dims.size() == 1 && !ggml_row_bytes(t.type, 1))
      throw FormatError(what + ": a 1-D block-type tensor cannot be split by expert");
    if (t.bytes % E != 0) throw FormatError(what + ": " + std::to_string(t.bytes) + " bytes are not " + std::to_string(E) + " equal slices");
    layer_of[i] = l;
    slice[i] = t.bytes / E;
    ++left[size_t(l)];
  }
  for (uint32_t l = 0; l < L; ++l)
    if (left[l] < 4)  // the router and three expert matrices at least (GgufModel found them)
      throw FormatError(name + ": MoE layer " + std::to_string(l) + " (block " + std::to_string(l + first_dense) +
                        ") has " + std::to_string(left[l]) + " expert-indexed tensors");

  // Metadata: the source's, the moestream permutation keys replaced by the composed ones.
  const GgufMetadata& smd = f.metadata();
  const std::vector<std::vector<uint32_t>> prior = recorded_permutation(smd, L, E, name);
  uint64_t source_hash = 0;
  if (smd.find(kGgufPermutationSourceKey) != nullptr) source_hash = smd.get_u64(kGgufPermutationSourceKey);
  else source_hash = model_identity_hash(src);
  GgufMetadata md(out.string());
  for (const GgufKv& kv : smd.entries())
    if (kv.key.rfind(kGgufPermutationKey, 0) != 0) md.add(kv.key, kv.value);
  md.add(kGgufPermutationSourceKey, GgufValue::from_unsigned(GgufValueType::kU64, source_hash));
  for (uint32_t l = 0; l < L; ++l) {
    std::vector<uint32_t> composed(E);
    for (uint32_t i = 0; i < E; ++i) composed[i] = prior[l][order[l][i]];
    auto arr = std::make_shared<GgufArray>(GgufValueType::kU32);
    arr->append_raw(composed.data(), E);
    md.add(kGgufPermutationKey + std::to_string(l), GgufValue::from_array(std::move(arr)));
  }

  std::vector<GgufTensorSpec> specs;
  for (const GgufTensor& t : f.tensors()) specs.push_back({t.name, t.type, t.dims});
  GgufWriterOptions wo;
  wo.version = f.version();
  wo.protect = {f.path()};
  GgufWriter w(out, md, specs, wo);

  // The source again, as it is now: same size, every tensor inside the data section, sizes as
  // the writer computed them from the shapes.
  uint64_t size = 0;
  const int fd = open_for_read(f.path(), "GGUF file", &size);
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  if (size != f.file_bytes())
    throw IoError(name + ": file changed size since it was opened (" + std::to_string(f.file_bytes()) + " -> " +
                  std::to_string(size) + " bytes)");
  std::vector<char> buf(8u << 20);
  GgufRepackResult res;
  for (size_t i = 0; i < f.tensors().size(); ++i) {
    const GgufTensor& t = f.tensors()[i];
    if (t.bytes != w.tensor_bytes(i) || t.offset < f.data_offset() || t.offset > size || t.bytes > size - t.offset)
      throw FormatError(name + ": tensor '" + t.name + "' at offset " + std::to_string(t.offset) + " (" +
                        std::to_string(t.bytes) + " bytes) does not lie in the data section");
    const int64_t l = layer_of[i];
    if (l < 0) {
      copy_range(fd, f.path(), t.offset, t.bytes, buf, w);
      ++res.tensors_copied;
      continue;
    }
    for (uint32_t p = 0; p < E; ++p) copy_range(fd, f.path(), t.offset + order[size_t(l)][p] * slice[i], slice[i], buf, w);
    ++res.tensors_permuted;
    if (--left[size_t(l)] == 0) {
      if (opts.fault) opts.fault("layer " + std::to_string(l) + " written");
      if (opts.progress) opts.progress(int(l) + 1, int(L));
    }
  }
  if (opts.fault) opts.fault("before commit");
  w.commit();  // reads the result back (every tensor where written) before it appears as `out`
  res.bytes_written = w.file_bytes();
  return res;
}

}  // namespace moestream::cluster
