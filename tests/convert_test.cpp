// Tests of the converter and what it reads: the safetensors reader/writer, and convert_model on
// tiny HF checkpoints (tests/support/tiny_hf.h) in every layout (per-expert and fused 3-D; bf16
// and f32; single file and sharded with index.json) for every architecture. The config mapping's
// own tests: hf_config_test.cpp.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/file_util.h"
#include "loader/format/expert_file.h"
#include "loader/format/gguf_file.h"
#include "runtime/convert/convert.h"
#include "runtime/engine/model.h"
#include "loader/store/expert_store.h"
#include "common/half.h"
#include "runtime/convert/hf_config.h"
#include "runtime/model/dense_weights.h"
#include "kernels/cpu/quant.h"
#include "loader/format/safetensors.h"
#include "tests/support/strict_skip.h"
#include "tests/support/tiny_hf.h"

namespace fs = std::filesystem;
using namespace moestream;
using namespace moestream::test;
using nlohmann::json;

namespace {

ConvertOptions quiet(QuantType q, std::string dense = "") {
  ConvertOptions o;
  o.quant = q;
  o.dense_dtype = dense;
  o.progress = false;
  return o;
}

std::vector<uint64_t> slot_checksums(const fs::path& model, int layer) {
  return read_expert_header(expert_file_path(model, layer)).slot_checksums;
}

bool no_temp_left(const fs::path& dir) {
  for (auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().find(".tmp.") != std::string::npos) return false;
  return true;
}

}  // namespace

// ---- safetensors ----

TEST(Safetensors, WriterAndReaderRoundTripEveryFloatDtype) {
  TempDir d;
  std::vector<float> a = {1.5f, -2.25f, 3.0f, 0.0f, 65504.0f, -1e-3f};
  {
    SafetensorsWriter w(d.path() / "t.safetensors");
    w.declare("f32", DType::kF32, {2, 3});
    w.declare("bf16", DType::kBF16, {6});
    w.declare("f16", DType::kF16, {3, 2});
    w.set_metadata("format", "pt");
    w.write("f16", a.data(), a.size());  // any order
    w.write("f32", a.data(), a.size());
    w.write("bf16", a.data(), a.size());
    w.finish();
  }
  SafetensorsFile f(d.path() / "t.safetensors");
  EXPECT_EQ(f.names().size(), 3u);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.info("f32").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(f.to_float("f32"), a);
  std::vector<float> b = f.to_float("bf16"), h = f.to_float("f16");
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(b[i], bf16_to_f32(f32_to_bf16(a[i])));
    EXPECT_EQ(h[i], f16_to_f32(f32_to_f16(a[i])));
  }
  std::vector<float> part(2);
  f.read_float("f32", 3, 2, part.data());
  EXPECT_EQ(part, (std::vector<float>{0.0f, 65504.0f}));
  f.release("f32", 0, 6);  // drops our mapping only: the data reads back the same
  EXPECT_EQ(f.to_float("f32"), a);
  EXPECT_THROW(f.to_float_checked("f32", {3, 2}), FormatError);
  std::string msg = message_of([&] { f.info("nope"); });
  EXPECT_NE(msg.find("missing tensor 'nope'"), std::string::npos) << msg;
}

TEST(Safetensors, CorruptHeadersAreRejectedNamingFileAndTensor) {
  TempDir d;
  auto write_raw = [&](const std::string& header, size_t data_bytes) {
    std::string s(8, '\0');
    uint64_t n = header.size();
    std::memcpy(s.data(), &n, 8);
    s += header + std::string(data_bytes, '\x01');
    write_file_atomic(d.path() / "x.safetensors", s);
    return d.path() / "x.safetensors";
  };
  struct Case {
    std::string header;
    size_t data;
    std::string expect;
  };
  const Case cases[] = {
      {R"({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}})", 8, "'w'"},     // truncated data
      {R"({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 16]}})", 16, "needs 24"}, // shape vs span
      {R"({"w": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 2]}})", 2, "unknown dtype"},
      {R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296, 16], "data_offsets": [0, 16]}})", 16, "overflows"},
      {R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}})", 8, "'w'"},
      {R"({"w": {"dtype": "F32", "shape": [1]}})", 4, "data_offsets"},
      {R"({"w": )", 4, "not valid JSON"},
  };
  for (const Case& c : cases) {
    fs::path p = write_raw(c.header, c.data);
    std::string msg = message_of([&] { SafetensorsFile f(p); });
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.header << " -> " << msg;
    EXPECT_NE(msg.find("x.safetensors"), std::string::npos) << msg;
  }
  // Header length beyond the file.
  std::string s(8, '\0');
  uint64_t n = 1000;
  std::memcpy(s.data(), &n, 8);
  write_file_atomic(d.path() / "y.safetensors", s + "{}");
  EXPECT_THROW(SafetensorsFile(d.path() / "y.safetensors"), FormatError);
}

TEST(Convert, Glm4MoeSkipsTheMtpLayerAndKeepsTheRouterBiasFloat) {
  const fs::path fixture = fs::path(MOESTREAM_SOURCE_DIR) / "tests/fixtures/glm4_moe";
  if (!fs::exists(fixture)) MOESTREAM_SKIP_OR_FAIL() << fixture << " absent (python/training/make_fixtures.py)";
  TempDir d;
  ConvertOptions opts;
  opts.quant = QuantType::kBF16;
  opts.dense_dtype = "bf16";
  const ModelConfig c = convert_model(fixture, d.path() / "out", opts);
  EXPECT_EQ(c.n_moe_layers(), 2);
  EXPECT_TRUE(fs::exists(expert_file_path(d.path() / "out", 1)));
  EXPECT_FALSE(fs::exists(expert_file_path(d.path() / "out", 2)));
  const SafetensorsFile dense(d.path() / "out" / "dense.safetensors");
  EXPECT_EQ(dense.info("layers.1.router_bias").dtype, DType::kF32);
  EXPECT_EQ(dense.info("layers.1.wq").dtype, DType::kBF16);
  EXPECT_TRUE(dense.contains("layers.0.mlp_gate"));
  EXPECT_FALSE(dense.contains("layers.0.router"));
  EXPECT_FALSE(dense.contains("layers.3.wq"));  // the MTP layer is not converted
  // An MoE layer's bias the model does not read is refused, naming the tensor.
  TempDir bad;
  for (const char* f : {"config.json"}) fs::copy_file(fixture / f, bad.path() / f);
  {
    const SafetensorsFile src(fixture / "model.safetensors");
    SafetensorsWriter w(bad.path() / "model.safetensors");
    for (const std::string& n : src.names()) w.declare(n, DType::kF32, src.info(n).shape);
    w.declare("model.layers.1.self_attn.o_proj.bias", DType::kF32, {53});
    for (const std::string& n : src.names()) {
      std::vector<float> v(src.info(n).numel());
      src.read_float(n, 0, v.size(), v.data());
      w.write(n, v.data(), v.size());
    }
    std::vector<float> z(53, 0.0f);
    w.write("model.layers.1.self_attn.o_proj.bias", z.data(), z.size());
    w.finish();
  }
  std::string msg = message_of([&] { convert_model(bad.path(), d.path() / "out2", opts); });
  EXPECT_NE(msg.find("o_proj.bias"), std::string::npos) << msg;
}

// ---- convert_model ----

TEST(Convert, PacksEveryArchitectureWithExactF32Experts) {
  for (Arch arch : {Arch::kQwen3Moe, Arch::kOlmoe, Arch::kMixtral, Arch::kQwen2Moe, Arch::kMinimaxM2}) {
    TempDir d;
    TinyHf m = make_tiny(arch);
    save_tiny(d.path() / "hf", m, DType::kF32, false, 1);
    ModelConfig c = convert_model(d.path() / "hf", d.path() / "out", quiet(QuantType::kF32));
    ModelConfig r = ModelConfig::load(d.path() / "out");
    EXPECT_EQ(r.to_json(), c.to_json());
    EXPECT_EQ(r.arch, arch);
    EXPECT_EQ(r.dense_dtype, "bf16");  // bf16 by default, an f32 checkpoint too (issue 18)
    EXPECT_EQ(r.tokenizer_file, "tokenizer.json");
    EXPECT_TRUE(fs::exists(d.path() / "out" / "tokenizer.json"));
    EXPECT_TRUE(no_temp_left(d.path()));

    // Experts: byte-exact f32 copies of the source matrices, in gate|up|down order.
    auto store = open_pread_expert_store(d.path() / "out", r);
    ExpertLayout lay = ExpertLayout::make(QuantType::kF32, m.D, m.F);
    for (int l = 0; l < m.L; ++l) {
      std::vector<int> ids = {0, 5, 7};
      std::vector<const uint8_t*> out;
      store->fetch(l, ids, out);
      for (size_t i = 0; i < ids.size(); ++i) {
        auto [g, u, dn] = expert_tensors(m, l, ids[i]);
        EXPECT_EQ(std::memcmp(out[i] + lay.gate_offset, g->data.data(), g->data.size() * 4), 0);
        EXPECT_EQ(std::memcmp(out[i] + lay.up_offset, u->data.data(), u->data.size() * 4), 0);
        EXPECT_EQ(std::memcmp(out[i] + lay.down_offset, dn->data.data(), dn->data.size() * 4), 0);
      }
    }
    // Dense: canonical names, same values.
    SafetensorsFile dense(d.path() / "out" / "dense.safetensors");
    EXPECT_EQ(dense.to_float("embed"), m.tensors.at("model.embed_tokens.weight").data);
    EXPECT_EQ(dense.to_float("layers.2.wk"), m.tensors.at("model.layers.2.self_attn.k_proj.weight").data);
    const bool mixtral_names = arch == Arch::kMixtral || arch == Arch::kMinimaxM2;
    std::string router =
        mixtral_names ? "model.layers.1.block_sparse_moe.gate.weight" : "model.layers.1.mlp.gate.weight";
    EXPECT_EQ(dense.to_float("layers.1.router"), m.tensors.at(router).data);
    EXPECT_EQ(dense.contains("layers.0.q_norm"),
              arch == Arch::kQwen3Moe || arch == Arch::kOlmoe || arch == Arch::kMinimaxM2);
    if (arch == Arch::kOlmoe) {
      EXPECT_EQ(dense.info("layers.0.k_norm").shape, (std::vector<int64_t>{18}));
    }
    if (arch == Arch::kMinimaxM2) {  // full-width QK-norm; the correction bias beside the gate, float
      EXPECT_EQ(dense.info("layers.0.q_norm").shape, (std::vector<int64_t>{m.H * m.hd}));
      EXPECT_EQ(dense.info("layers.0.k_norm").shape, (std::vector<int64_t>{m.KV * m.hd}));
      EXPECT_EQ(dense.info("layers.2.router_bias").dtype, DType::kF32);
      EXPECT_EQ(dense.to_float("layers.2.router_bias"),
                m.tensors.at("model.layers.2.block_sparse_moe.e_score_correction_bias").data);
    }
  }
}

TEST(Convert, Qwen2MoeBiasesAndSharedExpertGoToTheDenseFile) {
  for (const char* dense_dtype : {"f32", "q8"}) {
    TempDir d;
    TinyHf m = make_tiny(Arch::kQwen2Moe);
    save_tiny(d.path() / "hf", m, DType::kF32, false, 1);
    convert_model(d.path() / "hf", d.path() / "out", quiet(QuantType::kQ8, dense_dtype));
    const ModelConfig r = ModelConfig::load(d.path() / "out");
    EXPECT_EQ(r.arch, Arch::kQwen2Moe);
    EXPECT_TRUE(r.qkv_bias);
    EXPECT_EQ(r.shared_expert_intermediate_size, 26);
    // The CPU pass loads every tensor (shapes checked) and holds the gate and biases in float.
    const DenseWeights w = DenseWeights::load(d.path() / "out" / r.dense_file, r);
    const LayerWeights& l1 = w.layers[1];
    const auto& bq = m.tensors.at("model.layers.1.self_attn.q_proj.bias").data;
    ASSERT_EQ(size_t(l1.bq.size()), bq.size());
    for (size_t i = 0; i < bq.size(); ++i) EXPECT_EQ(l1.bq[Eigen::Index(i)], bq[i]) << i;
    const auto& sg = m.tensors.at("model.layers.1.mlp.shared_expert_gate.weight").data;
    ASSERT_EQ(l1.shared_expert_gate.rows(), 1);
    for (size_t i = 0; i < sg.size(); ++i) EXPECT_EQ(l1.shared_expert_gate(0, Eigen::Index(i)), sg[i]) << i;
    EXPECT_EQ(l1.shared_gate.rows, 26u);
    EXPECT_EQ(l1.shared_down.cols, 26u);
    EXPECT_EQ(l1.bk.size(), 16);
    if (std::string(dense_dtype) == "f32") {
      SafetensorsFile dense(d.path() / "out" / "dense.safetensors");
      EXPECT_EQ(dense.to_float("layers.2.shared_down"),
                m.tensors.at("model.layers.2.mlp.shared_expert.down_proj.weight").data);
      EXPECT_EQ(dense.to_float("layers.0.bv"), m.tensors.at("model.layers.0.self_attn.v_proj.bias").data);
    }
  }
  // A shared expert in an architecture without one is refused, naming the tensor.
  TempDir d;
  TinyHf m = make_tiny(Arch::kQwen3Moe);
  m.tensors["model.layers.0.mlp.shared_expert_gate.weight"] = Tensor{{1, m.D}, std::vector<float>(size_t(m.D), 1.0f)};
  save_tiny(d.path() / "hf", m, DType::kF32, false, 1);
  std::string msg = message_of([&] { convert_model(d.path() / "hf", d.path() / "out", quiet(QuantType::kQ4)); });
  EXPECT_NE(msg.find("shared_expert_gate"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(d.path() / "out"));
}

TEST(Convert, EveryLayoutDtypeAndShardingGivesIdenticalExperts) {
  for (Arch arch : {Arch::kQwen3Moe, Arch::kOlmoe, Arch::kMixtral, Arch::kMinimaxM2}) {
    TempDir d;
    TinyHf m = make_tiny(arch, 7);
    struct Variant {
      const char* name;
      DType dtype;
      bool fused;
      int shards;
    };
    const Variant variants[] = {{"pe_f32_1", DType::kF32, false, 1},
                                {"pe_bf16_3", DType::kBF16, false, 3},
                                {"fu_bf16_1", DType::kBF16, true, 1},
                                {"fu_f32_2", DType::kF32, true, 2},
                                {"pe_f16_2", DType::kF16, false, 2}};
    std::vector<std::vector<uint64_t>> ref;
    std::vector<float> ref_router;
    for (const Variant& v : variants) {
      save_tiny(d.path() / v.name, m, v.dtype, v.fused, v.shards);
      fs::path out = d.path() / (std::string(v.name) + ".out");
      convert_model(d.path() / v.name, out, quiet(QuantType::kQ4, "f32"));
      std::vector<std::vector<uint64_t>> sums;
      for (int l = 0; l < m.L; ++l) sums.push_back(slot_checksums(out, l));
      SafetensorsFile dense(out / "dense.safetensors");
      if (ref.empty()) {
        ref = sums;
        ref_router = dense.to_float("layers.2.router");
      } else {
        EXPECT_EQ(sums, ref) << arch_name(arch) << " " << v.name;
        EXPECT_EQ(dense.to_float("layers.2.router"), ref_router) << arch_name(arch) << " " << v.name;
      }
      if (v.shards == 3) {  // one worker or five: the same file
        ConvertOptions one = quiet(QuantType::kQ4, "f32"), five = one;
        one.threads = 1;
        five.threads = 5;
        convert_model(d.path() / v.name, out.string() + ".t1", one);
        convert_model(d.path() / v.name, out.string() + ".t5", five);
        EXPECT_EQ(read_file(expert_file_path(out.string() + ".t1", 1)), read_file(expert_file_path(out, 1)));
        EXPECT_EQ(read_file(expert_file_path(out.string() + ".t5", 1)), read_file(expert_file_path(out, 1)));
      }
      json src = json::parse(read_file(out / "model.json"))["source"];
      EXPECT_EQ(src["expert_layout"], v.fused ? "fused" : "per_expert");
      EXPECT_EQ(src["shards"], v.shards);
    }
  }
}

TEST(Convert, QuantisedExpertsDecodeCloseToTheSource) {
  TempDir d;
  TinyHf m = make_tiny(Arch::kQwen3Moe, 3);
  save_tiny(d.path() / "hf", m, DType::kBF16, false, 1);
  for (QuantType q : {QuantType::kBF16, QuantType::kQ8, QuantType::kQ4}) {
    fs::path out = d.path() / std::string(quant_name(q));
    ModelConfig c = convert_model(d.path() / "hf", out, quiet(q));
    EXPECT_EQ(c.dense_dtype, "bf16");
    auto store = open_pread_expert_store(out, c);
    std::vector<int> ids = {6};
    std::vector<const uint8_t*> p;
    store->fetch(2, ids, p);
    ExpertLayout lay = ExpertLayout::make(q, m.D, m.F);
    auto [g, u, dn] = expert_tensors(m, 2, 6);
    std::vector<float> back(m.D * m.F);
    dequantize_matrix(q, p[0] + lay.down_offset, m.D, m.F, back.data());
    double tol = q == QuantType::kBF16 ? 0.0 : q == QuantType::kQ8 ? 0.02 : 0.5;  // vs weights ~N(0, 0.5)
    for (size_t i = 0; i < back.size(); ++i) ASSERT_NEAR(back[i], dn->data[i], tol) << quant_name(q);
  }
}

TEST(Convert, MissingTensorIsNamedAndNothingIsLeftBehind) {
  TempDir d;
  TinyHf m = make_tiny(Arch::kOlmoe);
  m.tensors.erase("model.layers.1.mlp.experts.3.up_proj.weight");
  save_tiny(d.path() / "hf", m, DType::kBF16, false, 2);
  std::string msg = message_of([&] { convert_model(d.path() / "hf", d.path() / "out", quiet(QuantType::kQ8)); });
  EXPECT_NE(msg.find("missing tensor 'model.layers.1.mlp.experts.3.up_proj.weight'"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(d.path() / "out"));
  EXPECT_TRUE(no_temp_left(d.path()));

  TinyHf m2 = make_tiny(Arch::kMixtral);
  m2.tensors.erase("model.layers.0.self_attn.o_proj.weight");
  save_tiny(d.path() / "hf2", m2, DType::kF32, false, 1);
  msg = message_of([&] { convert_model(d.path() / "hf2", d.path() / "out2", quiet(QuantType::kQ8)); });
  EXPECT_NE(msg.find("model.layers.0.self_attn.o_proj.weight"), std::string::npos) << msg;
}

TEST(Convert, ShapeMismatchNamesTensorAndBothShapes) {
  TempDir d;
  TinyHf m = make_tiny(Arch::kQwen3Moe);
  m.tensors["model.layers.2.mlp.experts.0.down_proj.weight"].shape = {m.F, m.D};  // transposed
  save_tiny(d.path() / "hf", m, DType::kF32, false, 1);
  std::string msg = message_of([&] { convert_model(d.path() / "hf", d.path() / "out", quiet(QuantType::kQ4)); });
  EXPECT_NE(msg.find("model.layers.2.mlp.experts.0.down_proj.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[21, 37]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[37, 21]"), std::string::npos) << msg;
}

TEST(Convert, UnsupportedArchitectureAndBiasesAreRejected) {
  TempDir d;
  TinyHf m = make_tiny(Arch::kQwen3Moe);
  json cfg = m.config;
  cfg["architectures"] = {"ArcticForCausalLM"};
  save_hf(d.path() / "hf", cfg, m.tensors, DType::kF32, 1);
  EXPECT_THROW(convert_model(d.path() / "hf", d.path() / "out", quiet(QuantType::kQ4)), ConfigError);
  m.tensors["model.layers.0.self_attn.q_proj.bias"] = Tensor{{32}, std::vector<float>(32, 1.0f)};
  save_hf(d.path() / "hf2", m.config, m.tensors, DType::kF32, 1);
  std::string msg = message_of([&] { convert_model(d.path() / "hf2", d.path() / "out", quiet(QuantType::kQ4)); });
  EXPECT_NE(msg.find("q_proj.bias"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(d.path() / "out"));
}

TEST(Convert, ExistingOutputIsKeptUnlessForced) {
  TempDir d;
  TinyHf m = make_tiny(Arch::kMixtral);
  save_tiny(d.path() / "hf", m, DType::kBF16, true, 1);
  fs::create_directories(d.path() / "out");
  write_file_atomic(d.path() / "out" / "keep.txt", "x");
  EXPECT_THROW(convert_model(d.path() / "hf", d.path() / "out", quiet(QuantType::kQ4)), ConfigError);
  EXPECT_TRUE(fs::exists(d.path() / "out" / "keep.txt"));
  ConvertOptions o = quiet(QuantType::kQ4);
  o.overwrite = true;
  convert_model(d.path() / "hf", d.path() / "out", o);
  EXPECT_FALSE(fs::exists(d.path() / "out" / "keep.txt"));
  EXPECT_TRUE(fs::exists(d.path() / "out" / "model.json"));
  EXPECT_TRUE(no_temp_left(d.path()));
}

// ---- the CLI ----

namespace {
struct CliResult {
  int status;
  std::string output;
};
CliResult run_cli(const std::string& args) {
  std::string cmd = std::string(MOESTREAM_BIN_DIR) + "/convert_model " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  CliResult r{-1, ""};
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}
}  // namespace

TEST(ConvertCli, BadInputExitsNonZeroWithTheMessage) {
  if (!fs::exists(fs::path(MOESTREAM_BIN_DIR) / "convert_model"))
    MOESTREAM_SKIP_OR_FAIL() << "convert_model not built in " << MOESTREAM_BIN_DIR;
  TempDir d;
  TinyHf m = make_tiny(Arch::kQwen3Moe);
  m.tensors.erase("model.layers.0.mlp.gate.weight");
  save_tiny(d.path() / "hf", m, DType::kBF16, false, 1);
  CliResult r = run_cli(d.path().string() + "/hf " + d.path().string() + "/out -q");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("missing tensor 'model.layers.0.mlp.gate.weight'"), std::string::npos) << r.output;
  r = run_cli(d.path().string() + "/nonexistent " + d.path().string() + "/out");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("config.json"), std::string::npos) << r.output;
  r = run_cli(d.path().string() + "/hf " + d.path().string() + "/out --quant q3");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("q3"), std::string::npos) << r.output;
}

TEST(ConvertCli, ConvertsAndReportsWithProgress) {
  if (!fs::exists(fs::path(MOESTREAM_BIN_DIR) / "convert_model"))
    MOESTREAM_SKIP_OR_FAIL() << "convert_model not built in " << MOESTREAM_BIN_DIR;
  TempDir d;
  save_tiny(d.path() / "hf", make_tiny(Arch::kOlmoe), DType::kBF16, true, 2);
  CliResult r = run_cli(d.path().string() + "/hf " + d.path().string() + "/out --quant q8");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("100%"), std::string::npos) << r.output;
  EXPECT_EQ(ModelConfig::load(d.path() / "out").expert_quant, QuantType::kQ8);
}

// --dense-quant q8 where some rows are whole Q8_0 blocks and some are not: Qwen3's tiny model has
// D = 37 (embed, lm_head, wq, wk, wv fall back to BF16, the encoding of bf16's dense.safetensors)
// and H*hd = 32 (wo in Q8_0). Logits against the bf16 pack: only wo differs, by Q8_0's rounding
// (relative error <= 1/254 of a block's largest weight), so within 2% of the largest logit.
TEST(Convert, DenseQ8UsesQ8_0WhereRowsAreWholeBlocksAndBf16Elsewhere) {
  TempDir d;
  TinyHf m = make_tiny(Arch::kQwen3Moe, 3);
  save_tiny(d.path() / "hf", m, DType::kF32, false, 1);
  const ModelConfig q8 = convert_model(d.path() / "hf", d.path() / "q8", quiet(QuantType::kQ8, "q8"));
  const ModelConfig bf = convert_model(d.path() / "hf", d.path() / "bf", quiet(QuantType::kQ8, "bf16"));
  EXPECT_EQ(q8.dense_dtype, "gguf");
  EXPECT_EQ(q8.dense_file, "dense.gguf");
  EXPECT_EQ(q8.to_json()["format_version"], 2);
  EXPECT_EQ(bf.to_json()["format_version"], 1);
  EXPECT_FALSE(fs::exists(d.path() / "q8" / "dense.safetensors"));
  const GgufFile g(d.path() / "q8" / "dense.gguf");
  EXPECT_EQ(g.tensor("embed").type, GgmlType::kBF16);
  EXPECT_EQ(g.tensor("layers.2.wq").type, GgmlType::kBF16);
  EXPECT_EQ(g.tensor("layers.1.wo").type, GgmlType::kQ8_0);
  EXPECT_EQ(g.tensor("layers.1.router").type, GgmlType::kF32);
  EXPECT_EQ(g.tensor("layers.0.q_norm").type, GgmlType::kF32);
  EXPECT_EQ(g.tensor("embed").dims, (std::vector<uint64_t>{uint64_t(m.D), uint64_t(m.V)}));

  ModelOptions mo;
  mo.n_threads = 2;
  const std::vector<int> prompt = {3, 17, 40, 5, 22};
  std::vector<float> a(prompt.size() * size_t(m.V)), b(a.size());
  Model::load(d.path() / "q8", mo)->forward(prompt, a, true);
  Model::load(d.path() / "bf", mo)->forward(prompt, b, true);
  float diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(a[i] - b[i]));
    scale = std::max(scale, std::fabs(b[i]));
  }
  EXPECT_GT(diff, 0.0f);  // wo really is Q8_0
  EXPECT_LE(diff, 0.02f * scale);
}

TEST(Convert, DenseQuantOtherThanBf16Q8F32IsRefused) {
  TempDir d;
  save_tiny(d.path() / "hf", make_tiny(Arch::kOlmoe), DType::kF32, false, 1);
  EXPECT_THROW(convert_model(d.path() / "hf", d.path() / "out", quiet(QuantType::kQ8, "q4")), ConfigError);
  const std::string msg = message_of([&] { convert_model(d.path() / "hf", d.path() / "out", quiet(QuantType::kQ8, "q4")); });
  EXPECT_NE(msg.find("'q4'"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(d.path() / "out"));
}

// DeepSeek-V2/V3 configs (the fixtures' own config.json): MLA sizes, head_dim as q/k head width
// (transformers saves the RoPE part there), routing per version; what the runtime does not
// implement is refused naming the key.
TEST(Convert, SweepADeepseekV3RopeInterleaveNullAndMoeLayerFreq) {
  const fs::path fixture = fs::path(MOESTREAM_SOURCE_DIR) / "tests/fixtures/deepseek_v3";
  if (!fs::exists(fixture)) MOESTREAM_SKIP_OR_FAIL() << fixture << " absent (python/training/make_fixtures.py)";
  const json hf = json::parse(read_file(fixture / "config.json"));
  TempDir d;
  ConvertOptions opts;
  opts.quant = QuantType::kF32;
  opts.dense_dtype = "f32";
  opts.progress = false;
  // A checkpoint dir with this config and the fixture's tensors but `drop`.
  auto variant = [&](const std::string& name, const json& cfg, const std::string& drop) {
    const fs::path dir = d.path() / name;
    fs::create_directories(dir);
    write_file_atomic(dir / "config.json", cfg.dump(2));
    const SafetensorsFile src(fixture / "model.safetensors");
    SafetensorsWriter w(dir / "model.safetensors");
    for (const std::string& n : src.names())
      if (n != drop) w.declare(n, DType::kF32, src.info(n).shape);
    for (const std::string& n : src.names()) {
      if (n == drop) continue;
      std::vector<float> v(src.info(n).numel());
      src.read_float(n, 0, v.size(), v.data());
      w.write(n, v.data(), v.size());
    }
    w.finish();
    return dir;
  };
  // rope_interleave null: transformers tests it for truth, so the pairs are rotate-half's (false).
  auto dense_of = [&](const json& interleave) {
    json cfg = hf;
    cfg["rope_interleave"] = interleave;
    const std::string tag = interleave.dump();
    convert_model(variant("in_" + tag, cfg, ""), d.path() / ("out_" + tag), opts);
    return read_file(d.path() / ("out_" + tag) / "dense.safetensors");
  };
  const std::string as_null = dense_of(nullptr);
  EXPECT_EQ(as_null, dense_of(false));
  EXPECT_NE(as_null, dense_of(true));
  // moe_layer_freq: transformers ignores it (every layer from first_k_dense_replace is MoE) ...
  json freq = hf;
  freq["moe_layer_freq"] = 2;
  EXPECT_EQ(convert_model(variant("freq", freq, ""), d.path() / "out_freq", opts).n_moe_layers(), 2);
  // ... and a checkpoint with a dense layer among them (the original remote code's layout) is refused.
  const std::string msg = message_of(
      [&] { convert_model(variant("freq_dense", freq, "model.layers.2.mlp.gate.weight"), d.path() / "o", opts); });
  EXPECT_NE(msg.find("moe_layer_freq"), std::string::npos) << msg;
}
