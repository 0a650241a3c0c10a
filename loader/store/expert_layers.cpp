// Implementation of loader/store/expert_layers.h.
#include "loader/store/expert_layers.h"

#include <algorithm>
#include <string>
#include <utility>

#include "common/error.h"
#include "loader/format/gguf_model.h"

namespace moestream::engine_store {
namespace {

// The MoE layers of a GGUF: each expert is slices of its layer's three expert tensors (and
// gpt-oss's three bias tensors, into the payload's bias section), possibly in different shards;
// files[s] is shard s's engine file, page_caches its residency probe (null for O_DIRECT).
std::vector<Layer> gguf_layers(const GgufModel& g, const ModelConfig& cfg, std::span<const uint32_t> files,
                               const std::vector<std::unique_ptr<PageCacheResidency>>& page_caches) {
  std::vector<Layer> layers;
  const size_t F4 = size_t(cfg.moe_intermediate_size) * sizeof(float);
  for (int l = 0; l < cfg.n_moe_layers(); ++l) {
    Layer L;
    L.index = l;
    L.path = g.files().paths().front();
    L.header.n_experts = uint32_t(cfg.n_experts);
    L.map = ExpertMap::identity(uint32_t(cfg.n_experts));
    L.layout = cfg.expert_layout(l);
    const GgufLayerExperts& x = g.experts()[size_t(l)];
    std::vector<std::pair<const GgufExpertMatrix*, size_t>> slices = {
        {&x.gate, L.layout.gate_offset}, {&x.up, L.layout.up_offset}, {&x.down, L.layout.down_offset}};
    if (x.bias)  // gpt-oss: three f32 bias slices into the payload's bias section
      slices.insert(slices.end(), {{&x.gate_bias, L.layout.bias_offset},
                                   {&x.up_bias, L.layout.bias_offset + F4},
                                   {&x.down_bias, L.layout.bias_offset + 2 * F4}});
    for (const auto& [m, dest] : slices)
      L.pieces.push_back(Piece{files[m->shard], m->offset, m->expert_bytes, m->expert_bytes, dest,
                               page_caches[files[m->shard]].get()});
    layers.push_back(std::move(L));
  }
  return layers;
}

}  // namespace

uint32_t Layer::slot_of(int id) const {
  MOE_ASSERT(id >= 0 && static_cast<uint32_t>(id) < header.n_experts, "expert id out of range");
  return map.physical(static_cast<uint32_t>(id));
}

bool Layer::in_page_cache(uint32_t slot) const {
  for (const Piece& p : pieces)
    if (p.page_cache == nullptr || !p.page_cache->sample(p.at(slot), std::min(p.length, layout.bytes), 2).fully_resident())
      return false;
  return true;
}

void slots_in_file_order(const Layer& L, std::span<const int> ids, std::vector<uint32_t>& slots,
                         std::vector<uint32_t>& position) {
  slots.clear();
  for (int id : ids) slots.push_back(L.slot_of(id));
  std::sort(slots.begin(), slots.end());
  slots.erase(std::unique(slots.begin(), slots.end()), slots.end());
  position.resize(ids.size());
  for (size_t i = 0; i < ids.size(); ++i)
    position[i] = uint32_t(std::lower_bound(slots.begin(), slots.end(), L.slot_of(ids[i])) - slots.begin());
}

ExpertFiles::ExpertFiles(const std::filesystem::path& model_dir, const ModelConfig& cfg, bool use_maps,
                         uint64_t read_bytes, IoEngine& engine) {
  if (cfg.format == ModelFormat::kGguf) {  // every shard goes into the engine once
    const GgufModel g(model_dir);
    std::vector<uint32_t> files;
    for (const auto& p : g.files().paths()) files.push_back(add_file(p, engine));
    layers_ = gguf_layers(g, cfg, files, page_caches_);
    return;
  }
  for (int l = 0; l < cfg.n_moe_layers(); ++l) {  // MoE layers only (model_config.h)
    Layer L;
    static_cast<ExpertLayerFile&>(L) = open_expert_layer_file(model_dir, cfg, l, use_maps);
    L.index = l;
    if (L.header.expert_stride < read_bytes)
      throw FormatError(L.path.string() + ": expert_stride " + std::to_string(L.header.expert_stride) +
                        " is below the 4 KiB rounded expert size " + std::to_string(read_bytes));
    L.layout = cfg.expert_layout(l);
    const uint32_t file = add_file(L.path, engine);
    L.pieces.push_back(Piece{file, L.header.data_offset, L.header.expert_stride, read_bytes, 0,
                             page_caches_[file].get()});
    layers_.push_back(std::move(L));
  }
}

// Adds a file to the engine, with its page-cache residency probe (which means something only
// for reads that go through the page cache: none for O_DIRECT files). Returns its index.
// Buffered files are also mapped (read-only, shared) for experts computed in place.
uint32_t ExpertFiles::add_file(const std::filesystem::path& path, IoEngine& engine) {
  const uint32_t file = engine.add_file(path);
  page_caches_.resize(size_t(file) + 1);
  maps_.resize(size_t(file) + 1);
  if (!engine.file_is_direct(file)) {
    page_caches_[file] = std::make_unique<PageCacheResidency>(path);
    try {
      maps_[file] = std::make_unique<MappedFile>(path);
    } catch (const IoError&) {
      // A file that cannot be mapped is still read (and copied) as before.
    }
  }
  return file;
}

bool ExpertFiles::in_place_allowed(const Layer& L) const {
  if (L.pieces.size() > 3) return false;  // gpt-oss's GGUF biases: three slices, not one bias section
  for (const Piece& p : L.pieces)
    if (!maps_[p.file]) return false;
  return true;
}

ExpertMatrices ExpertFiles::mapped_matrices(const Layer& L, uint32_t slot) const {
  const auto at = [&](const Piece& p, uint64_t n) {
    return maps_[p.file]->range(p.at(slot), n, "expert slot " + std::to_string(slot) + " of layer " +
                                                   std::to_string(L.index));
  };
  if (L.pieces.size() == 1) return ExpertMatrices::of_payload(at(L.pieces[0], L.layout.bytes), L.layout);
  MOE_ASSERT(L.pieces.size() == 3, "a GGUF expert is three slices");
  return {at(L.pieces[0], L.pieces[0].length), at(L.pieces[1], L.pieces[1].length),
          at(L.pieces[2], L.pieces[2].length)};
}

std::vector<ExpertStore::MappedRegion> ExpertFiles::regions() const {
  std::vector<ExpertStore::MappedRegion> out;
  for (const auto& m : maps_)
    if (m && m->size() > 0) out.push_back({m->path(), m->range(0, m->size(), "the whole file"), m->size()});
  return out;
}

}  // namespace moestream::engine_store
