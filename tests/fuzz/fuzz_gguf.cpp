// libFuzzer target: GGUF files (GgufModelFiles opens and validates one file), then every value
// and tensor read back through the public getters, then what the engine builds from a GGUF: the
// model (GgufModel: config from metadata and tensor shapes, expert placement) and the tokenizer
// (tokenizer.ggml.* metadata).
#include "common/error.h"
#include "loader/format/gguf_file.h"
#include "loader/format/gguf_model.h"
#include "runtime/tokenizer/gguf_vocab.h"
#include "runtime/tokenizer/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

// Walks a value the way a caller would, nested arrays included (bounded by the reader's limits).
void touch(const moestream::GgufValue& v) {
  (void)v.describe();
  if (const moestream::GgufArray* a = v.to_array()) {
    for (uint64_t i = 0; i < a->size() && i < 4096; ++i) {
      if (a->elem_type() == moestream::GgufValueType::kString) {
        (void)a->string_at(i);
      } else {
        touch(a->element(i));
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto path = moestream::fuzz::write_input(data, size, "model.gguf");
  try {
    moestream::GgufModelFiles files(path);
    const moestream::GgufMetadata& md = files.metadata();
    for (const moestream::GgufKv& kv : md.entries()) {
      touch(kv.value);
      // The typed getters on every key: a mismatch must be a FormatError, never anything else.
      try { (void)md.get_u32(kv.key); } catch (const moestream::FormatError&) {}
      try { (void)md.get_i64(kv.key); } catch (const moestream::FormatError&) {}
      try { (void)md.get_f32(kv.key); } catch (const moestream::FormatError&) {}
      try { (void)md.get_string_array(kv.key); } catch (const moestream::FormatError&) {}
      try { (void)md.get_i64_array(kv.key); } catch (const moestream::FormatError&) {}
      try { (void)md.get_f32_array(kv.key); } catch (const moestream::FormatError&) {}
    }
    for (const moestream::GgufTensor& t : files.tensors()) {
      if (&files.tensor(t.name) != &t) __builtin_trap();
      if (t.offset + t.bytes > files.shard(t.shard).file_bytes()) __builtin_trap();
    }
    try {
      const moestream::Tokenizer tok = moestream::Tokenizer::from_gguf(moestream::read_gguf_vocab(md));
      (void)tok.encode("The cat sat on the mat. <|im_end|> 123", true);
    } catch (const moestream::Error&) {
    }
    const moestream::GgufModel model(path);
    const moestream::ModelConfig& cfg = model.config();
    for (int l = 0; l < cfg.n_moe_layers(); ++l) {  // experts() holds the MoE layers only
      const moestream::GgufExpertMatrix& g = model.experts()[size_t(l)].gate;
      const uint64_t end = g.offset + g.expert_bytes * uint64_t(cfg.n_experts);
      if (end > files.shard(g.shard).file_bytes()) __builtin_trap();
      (void)cfg.expert_layout(l);
    }
  } catch (const moestream::Error&) {
  }
  return 0;
}
