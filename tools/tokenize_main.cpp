// tokenize: encode or decode files with a Hugging Face tokenizer.json, for the conformance test
// and the tokenizer benchmark (documents separated by NUL bytes, one line of ids per document).
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/error.h"
#include "common/file_util.h"
#include "common/timing.h"
#include "runtime/tokenizer/tokenizer.h"

namespace {

using moestream::Tokenizer;

std::vector<std::string_view> split_docs(std::string_view all, bool split_nul) {
  std::vector<std::string_view> docs;
  if (!split_nul) {
    docs.push_back(all);
    return docs;
  }
  size_t start = 0;
  while (start <= all.size()) {
    size_t end = all.find('\0', start);
    if (end == std::string_view::npos) end = all.size();
    if (end > start || end < all.size()) docs.push_back(all.substr(start, end - start));
    start = end + 1;
  }
  return docs;
}

void write_output(const std::string& path, const std::string& data) {
  std::error_code ec;
  auto st = std::filesystem::status(path, ec);
  if (path == "-") {
    std::fwrite(data.data(), 1, data.size(), stdout);
  } else if (!ec && std::filesystem::exists(st) && !std::filesystem::is_regular_file(st)) {
    // A device or pipe (/dev/null, a FIFO): write through it; an atomic rename would replace
    // the node itself with a regular file.
    std::ofstream f(path, std::ios::binary);
    f.write(data.data(), static_cast<std::streamsize>(data.size()));
    if (!f.good()) moestream::throw_errno("write", path);
  } else {
    moestream::write_file_atomic(path, data);
  }
}

std::vector<int32_t> parse_ids(std::string_view line, size_t line_no, const std::string& file) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && line[i] == ' ') ++i;
    if (i >= line.size()) break;
    size_t j = i;
    while (j < line.size() && line[j] != ' ') ++j;
    std::string tok(line.substr(i, j - i));
    char* end = nullptr;
    long v = std::strtol(tok.c_str(), &end, 10);
    if (end == tok.c_str() || *end != '\0' || v < INT32_MIN || v > INT32_MAX) {
      throw moestream::FormatError(file + ": line " + std::to_string(line_no) +
                                   ": not an integer id: '" + tok + "'");
    }
    ids.push_back(static_cast<int32_t>(v));
    i = j;
  }
  return ids;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Encode/decode text with a Hugging Face tokenizer.json (moestream tokenizer)"};
  app.require_subcommand(1);
  std::string tokenizer_path, config_path, input, output = "-";
  bool split_nul = false, no_special = false, skip_special = false, stream = false, timing = false;
  int repeat = 1;

  // Every subcommand loads a tokenizer; those given `input_help` also read an input and write an output.
  auto subcommand = [&](const char* name, const char* about, const char* input_help, const char* output_help) {
    CLI::App* sub = app.add_subcommand(name, about);
    sub->add_option("-t,--tokenizer", tokenizer_path, "tokenizer.json")->required();
    sub->add_option("-c,--config", config_path, "tokenizer_config.json (default: beside it)");
    if (input_help) {
      sub->add_option("-i,--input", input, input_help)->required();
      sub->add_option("-o,--output", output, output_help);
    }
    return sub;
  };
  CLI::App* enc = subcommand("encode", "text file -> one line of ids per document", "UTF-8 text file",
                             "ids file ('-' = stdout)");
  enc->add_flag("--split-nul", split_nul, "documents are separated by NUL bytes");
  enc->add_flag("--no-special", no_special, "do not add the post-processor's special tokens");
  enc->add_flag("--time", timing, "print encode throughput as JSON on stderr");
  enc->add_option("--repeat", repeat, "encode the input this many times (timing)")
      ->check(CLI::Range(1, 1000));

  CLI::App* dec = subcommand("decode", "ids file (one line per document) -> text", "ids file",
                             "text file, documents separated by NUL ('-' = stdout)");
  dec->add_flag("--skip-special", skip_special, "drop special added tokens");
  dec->add_flag("--stream", stream, "decode through StreamDecoder, one id at a time");

  CLI::App* info = subcommand("info", "print vocabulary size, bos/eos", nullptr, nullptr);

  CLI11_PARSE(app, argc, argv);
  try {
    Tokenizer tok = Tokenizer::load(tokenizer_path, config_path);
    if (info->parsed()) {
      auto opt = [](std::optional<int32_t> v) { return v ? std::to_string(*v) : "null"; };
      std::printf("{\"vocab_size\": %d, \"bos_id\": %s, \"eos_id\": %s, \"chat_template\": %s}\n",
                  tok.vocab_size(), opt(tok.bos_id()).c_str(), opt(tok.eos_id()).c_str(),
                  tok.chat_template().empty() ? "false" : "true");
      return 0;
    }
    std::string data = moestream::read_file(input);
    std::string out;
    if (enc->parsed()) {
      std::vector<std::string_view> docs = split_docs(data, split_nul);
      std::vector<std::vector<int32_t>> all(docs.size());
      auto t0 = std::chrono::steady_clock::now();
      for (int r = 0; r < repeat; ++r) {
        for (size_t d = 0; d < docs.size(); ++d) all[d] = tok.encode(docs[d], !no_special);
      }
      double secs = moestream::seconds_since(t0);
      size_t n_ids = 0;
      for (const auto& ids : all) {
        for (size_t k = 0; k < ids.size(); ++k) {
          if (k) out.push_back(' ');
          out += std::to_string(ids[k]);
        }
        out.push_back('\n');
        n_ids += ids.size();
      }
      if (timing) {
        double bytes = static_cast<double>(data.size()) * repeat;
        std::fprintf(stderr,
                     "{\"bytes\": %.0f, \"seconds\": %.6f, \"mb_per_s\": %.3f, \"ids\": %zu}\n",
                     bytes, secs, bytes / 1e6 / secs, n_ids);
      }
    } else {
      std::istringstream lines(data);
      std::string line;
      size_t line_no = 0;
      bool first = true;
      while (std::getline(lines, line)) {
        ++line_no;
        std::vector<int32_t> ids = parse_ids(line, line_no, input);
        if (!first) out.push_back('\0');
        first = false;
        if (stream) {
          moestream::StreamDecoder sd(tok, skip_special);
          for (int32_t id : ids) out += sd.push(id);
          out += sd.flush();
        } else {
          out += tok.decode(ids, skip_special);
        }
      }
    }
    write_output(output, out);
  } catch (const moestream::Error& e) {
    std::fprintf(stderr, "tokenize: %s\n", e.what());
    return 1;
  }
  return 0;
}
