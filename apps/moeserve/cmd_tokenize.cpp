// moeserve tokenize: encode text (or decode ids) with a tokenizer.json, as the server would.
#include <cctype>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string_view>

#include "command.h"
#include "common/error.h"
#include "text/tokenizer.h"

namespace {

struct TokenizeFlags {
  std::string tokenizer, text, file, decode;
  bool no_special = false;
  bool skip_special = false;
};

std::string tokenizer_json_path(const std::string& path) {
  namespace fs = std::filesystem;
  if (fs::is_directory(path)) return (fs::path(path) / "tokenizer.json").string();
  return path;
}

// Ids as "1,2,3", "[1, 2, 3]" or "1 2 3" (what `tokenize` prints can be pasted back); anything else is an
// error that shows the offending piece.
std::vector<int32_t> parse_ids(std::string_view s) {
  auto trim = [](std::string_view v) {
    while (!v.empty() && std::isspace(static_cast<unsigned char>(v.front()))) v.remove_prefix(1);
    while (!v.empty() && std::isspace(static_cast<unsigned char>(v.back()))) v.remove_suffix(1);
    return v;
  };
  std::string_view body = trim(s);
  bool open = body.starts_with('['), close = body.ends_with(']');
  moeserve::check(open == close, "--decode: '{}' has an unmatched bracket", s);
  if (open) body = trim(body.substr(1, body.size() - 2));
  std::vector<int32_t> ids;
  if (body.empty()) return ids;
  bool commas = body.find(',') != std::string_view::npos;
  size_t pos = 0;
  while (pos <= body.size()) {
    size_t end = commas ? body.find(',', pos) : body.find_first_of(" \t\n", pos);
    if (end == std::string_view::npos) end = body.size();
    std::string_view word = trim(body.substr(pos, end - pos));
    pos = end + 1;
    if (word.empty() && !commas) continue;  // runs of spaces
    moeserve::check(!word.empty(), "--decode: '{}' has an empty id (expected e.g. 1,2,3 or [1,2,3])", s);
    int64_t v = 0;
    auto [ptr, ec] = std::from_chars(word.data(), word.data() + word.size(), v);
    moeserve::check(ec == std::errc() && ptr == word.data() + word.size(),
                    "--decode: '{}' is not an integer id (expected e.g. 1,2,3 or [1,2,3])", word);
    moeserve::check(v >= 0 && v <= INT32_MAX, "--decode: id {} is out of range", word);
    ids.push_back(static_cast<int32_t>(v));
  }
  return ids;
}

int run(const TokenizeFlags& f) {
  using moeserve::text::Tokenizer;
  Tokenizer tok = Tokenizer::from_file(tokenizer_json_path(f.tokenizer));
  if (!f.decode.empty()) {
    std::vector<int32_t> ids = parse_ids(f.decode);
    for (int32_t id : ids)
      moeserve::check(static_cast<size_t>(id) < tok.vocab_size(),
                      "--decode: id {} is past the tokenizer's vocabulary ({} ids)", id, tok.vocab_size());
    std::string text = tok.decode(ids, f.skip_special);
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fputc('\n', stdout);
    return 0;
  }
  std::string text = f.text;
  if (!f.file.empty()) {
    std::ifstream in(f.file, std::ios::binary);
    moeserve::check(in.good(), "cannot open --file '{}'", f.file);
    std::ostringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  }
  nlohmann::json out = {{"ids", tok.encode(text, !f.no_special)}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

std::function<int()> setup(CLI::App& app) {
  auto flags = std::make_shared<TokenizeFlags>();
  app.add_option("--tokenizer", flags->tokenizer, "tokenizer.json, or a model directory holding one")
      ->required();
  auto* text = app.add_option("--text", flags->text, "text to encode");
  auto* file = app.add_option("--file", flags->file, "file whose bytes to encode");
  auto* decode = app.add_option("--decode", flags->decode,
                                "decode these ids instead (\"9707,11,1879\" or \"[9707, 11, 1879]\")");
  text->excludes(file)->excludes(decode);
  file->excludes(decode);
  app.add_flag("--no-special", flags->no_special,
               "do not apply the post-processor's special tokens (e.g. BOS)");
  app.add_flag("--skip-special", flags->skip_special, "with --decode: leave out special tokens");
  return [flags] { return run(*flags); };
}

moeserve::app::Registration reg{
    {"tokenize", "Encode text to token ids (or decode ids) with a tokenizer.json", 80, setup}};

}  // namespace
