#include "text/tokenizer.h"

#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <deque>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "common/error.h"
#include "common/thread_pool.h"
#include "text/bpe.h"
#include "text/regex.h"
#include "text/utf8.h"
#include "text/word_cache.h"

namespace moeserve::text {

using json = nlohmann::json;

namespace {

// ---- JSON field access with errors that say where ------------------------------------------------

const json& field(const json& j, const char* key, const std::string& where) {
  check(j.is_object(), "{}: expected an object", where);
  auto it = j.find(key);
  check(it != j.end(), "{}: missing field '{}'", where, key);
  return *it;
}

std::string string_field(const json& j, const char* key, const std::string& where) {
  const json& v = field(j, key, where);
  check(v.is_string(), "{}.{}: expected a string, got {}", where, key, v.type_name());
  return v.get<std::string>();
}

bool bool_field(const json& j, const char* key, bool fallback, const std::string& where) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  check(j[key].is_boolean(), "{}.{}: expected true or false, got {}", where, key, j[key].dump());
  return j[key].get<bool>();
}

// A "pattern" object: {"String": "..."} or {"Regex": "..."}.
std::string pattern_field(const json& j, const std::string& where) {
  const json& p = field(j, "pattern", where);
  check(p.is_object() && p.size() == 1, "{}.pattern: expected {{\"String\": ...}} or {{\"Regex\": ...}}",
        where);
  if (p.contains("String") && p["String"].is_string()) return regex_escape(p["String"].get<std::string>());
  if (p.contains("Regex") && p["Regex"].is_string()) return p["Regex"].get<std::string>();
  fail("{}.pattern: expected {{\"String\": ...}} or {{\"Regex\": ...}}, got {}", where, p.dump());
}

bool is_unicode_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

// ---- normalizers ---------------------------------------------------------------------------------

struct Normalizer {
  virtual ~Normalizer() = default;
  virtual void apply(std::string& s) const = 0;
  // False when apply() would certainly leave s unchanged: lets encode skip copying the text.
  virtual bool may_change(std::string_view) const { return true; }
};

struct UnicodeNormalizer : Normalizer {
  int options;
  bool compat;     // NFKC/NFKD: compatibility decompositions apply too
  bool decompose;  // NFD/NFKD: nothing is recomposed
  explicit UnicodeNormalizer(int o)
      : options(o), compat((o & UTF8PROC_COMPAT) != 0), decompose((o & UTF8PROC_COMPOSE) == 0) {}
  // True when this normalization form cannot change this code point in any context: a starter that never
  // composes with what precedes it and has no decomposition this form applies. Lets almost all real text (CJK
  // and its full-width punctuation included) skip the normalizer entirely. Checked against utf8proc for every
  // code point after several kinds of predecessor, in all four forms.
  bool stable(uint32_t cp) const {
    if (cp < (decompose || compat ? 0x80u : 0x300u)) return true;  // Latin-1 is NFC already, not NFD/NFKC
    if (decompose && cp >= 0xAC00 && cp <= 0xD7A3) return false;   // Hangul syllables decompose by rule
    if ((cp >= 0x1161 && cp <= 0x1175) || (cp >= 0x11A8 && cp <= 0x11C2)) return false;  // Hangul V/T jamo
    const utf8proc_property_t* p = utf8proc_get_property(static_cast<utf8proc_int32_t>(cp));
    if (p->combining_class != 0) return false;
    if (p->comb_index != UINT16_MAX && p->comb_index >= 0x8000)
      return false;  // composes with its predecessor
    if (p->decomp_seqindex == UINT16_MAX) return true;
    // A compatibility decomposition (decomp_type != 0, e.g. the full-width comma) is left alone by NFC and
    // NFD; a canonical one may change in any form (conservatively: even an NFC form that maps to itself).
    return !compat && p->decomp_type != 0;
  }
  bool needs_work(std::string_view s) const {
    size_t i = 0;
    while (i < s.size()) {
      if (static_cast<unsigned char>(s[i]) < 0x80) {
        ++i;
        continue;
      }
      if (utf8_sequence_length(s, i) == 0) return true;
      if (!stable(utf8_decode(s, i))) return true;
    }
    return false;
  }
  bool may_change(std::string_view s) const override { return needs_work(s); }
  void apply(std::string& s) const override {
    if (!needs_work(s)) return;
    utf8proc_uint8_t* out = nullptr;
    auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                          static_cast<utf8proc_ssize_t>(s.size()), &out,
                          static_cast<utf8proc_option_t>(options | UTF8PROC_STABLE));
    if (n < 0) return;  // input is validated before normalization; keep it unchanged if utf8proc disagrees
    s.assign(reinterpret_cast<char*>(out), static_cast<size_t>(n));
    std::free(out);
  }
};

struct LowercaseNormalizer : Normalizer {
  void apply(std::string& s) const override {
    std::string out;
    out.reserve(s.size());
    size_t i = 0;
    while (i < s.size())
      utf8_append(out,
                  static_cast<uint32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(utf8_decode(s, i)))));
    s.swap(out);
  }
};

struct ReplaceNormalizer : Normalizer {
  std::unique_ptr<Regex> regex;
  std::string content;
  void apply(std::string& s) const override {
    std::string out;
    size_t pos = 0, b = 0, e = 0;
    while (pos <= s.size() && regex->find(s, pos, b, e)) {
      out.append(s, pos, b - pos);
      out += content;
      if (e == b) {  // empty match: copy one character and move on
        if (b >= s.size()) {
          pos = s.size() + 1;
          break;
        }
        size_t n = std::max<size_t>(1, utf8_sequence_length(s, b));
        out.append(s, b, n);
        e = b + n;
      }
      pos = e;
    }
    if (pos < s.size()) out.append(s, pos);
    s.swap(out);
  }
};

struct PrependNormalizer : Normalizer {
  std::string prefix;
  void apply(std::string& s) const override {
    if (!s.empty()) s.insert(0, prefix);
  }
};

struct StripNormalizer : Normalizer {
  bool left = true, right = true;
  void apply(std::string& s) const override {
    size_t b = 0, e = s.size();
    if (left) {
      while (b < e) {
        size_t i = b;
        if (!is_unicode_space(utf8_decode(s, i))) break;
        b = i;
      }
    }
    if (right) {
      while (e > b) {
        size_t start = e - 1;
        while (start > b && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
        size_t i = start;
        if (!is_unicode_space(utf8_decode(s, i))) break;
        e = start;
      }
    }
    s = s.substr(b, e - b);
  }
};

struct SequenceNormalizer : Normalizer {
  std::vector<std::unique_ptr<Normalizer>> steps;
  bool may_change(std::string_view s) const override {
    return std::any_of(steps.begin(), steps.end(), [&](const auto& n) { return n->may_change(s); });
  }
  void apply(std::string& s) const override {
    for (const auto& n : steps) n->apply(s);
  }
};

std::unique_ptr<Normalizer> make_normalizer(const json& j, const std::string& where) {
  std::string type = string_field(j, "type", where);
  if (type == "NFC") return std::make_unique<UnicodeNormalizer>(UTF8PROC_COMPOSE);
  if (type == "NFD") return std::make_unique<UnicodeNormalizer>(UTF8PROC_DECOMPOSE);
  if (type == "NFKC") return std::make_unique<UnicodeNormalizer>(UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
  if (type == "NFKD") return std::make_unique<UnicodeNormalizer>(UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT);
  if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  if (type == "Replace") {
    auto n = std::make_unique<ReplaceNormalizer>();
    n->regex = std::make_unique<Regex>(pattern_field(j, where));
    n->content = string_field(j, "content", where);
    return n;
  }
  if (type == "Prepend") {
    auto n = std::make_unique<PrependNormalizer>();
    n->prefix = string_field(j, "prepend", where);
    return n;
  }
  if (type == "Strip") {
    auto n = std::make_unique<StripNormalizer>();
    n->left = bool_field(j, "strip_left", true, where);
    n->right = bool_field(j, "strip_right", true, where);
    return n;
  }
  if (type == "Sequence") {
    auto n = std::make_unique<SequenceNormalizer>();
    const json& list = field(j, "normalizers", where);
    check(list.is_array(), "{}.normalizers: expected an array", where);
    for (size_t i = 0; i < list.size(); ++i)
      n->steps.push_back(make_normalizer(list[i], fmt::format("{}.normalizers[{}]", where, i)));
    return n;
  }
  fail(
      "{}: normalizer type '{}' is not supported (supported: NFC, NFD, NFKC, NFKD, Lowercase, Replace, "
      "Prepend, Strip, Sequence)",
      where, type);
}

// ---- pre-tokenizers ------------------------------------------------------------------------------
// Each stage turns one piece into pieces for the next stage. Pieces are views into the input or into an
// arena of strings a stage had to build (a prefix space).

using Sink = std::function<void(std::string_view)>;

struct PreTokenizer {
  virtual ~PreTokenizer() = default;
  virtual void split(std::string_view piece, std::deque<std::string>& arena, const Sink& sink) const = 0;
  // True when split() passes every piece through unchanged: a Sequence leaves such a step out.
  virtual bool identity() const { return false; }
};

enum class SplitBehavior { kIsolated, kRemoved, kMergedWithPrevious, kMergedWithNext, kContiguous };

// Splits by regex matches and the gaps between them, arranged as tokenizers' SplitDelimiterBehavior says.
void split_by_regex(const Regex& regex, std::string_view s, SplitBehavior behavior, bool invert,
                    const Sink& sink) {
  struct Span {
    size_t b, e;
    bool match;
  };
  // `from` is where the next search starts, `gap` where the current unmatched stretch began; an empty
  // match is not a delimiter, so it only moves `from`.
  size_t gap = 0, from = 0, b = 0, e = 0;
  if (behavior == SplitBehavior::kIsolated && !invert) {  // the common case: pieces straight to the sink
    while (from < s.size() && regex.find(s, from, b, e)) {
      if (e == b) {
        from = b + std::max<size_t>(1, utf8_sequence_length(s, b));
        continue;
      }
      if (b > gap) sink(s.substr(gap, b - gap));
      sink(s.substr(b, e - b));
      gap = from = e;
    }
    if (gap < s.size()) sink(s.substr(gap));
    return;
  }
  std::vector<Span> spans;
  while (from < s.size() && regex.find(s, from, b, e)) {
    if (e == b) {
      from = b + std::max<size_t>(1, utf8_sequence_length(s, b));
      continue;
    }
    if (b > gap) spans.push_back({gap, b, false});
    spans.push_back({b, e, true});
    gap = from = e;
  }
  if (gap < s.size()) spans.push_back({gap, s.size(), false});
  if (invert)
    for (auto& sp : spans) sp.match = !sp.match;

  auto emit = [&](size_t x, size_t y) {
    if (y > x) sink(s.substr(x, y - x));
  };
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const auto& sp : spans) emit(sp.b, sp.e);
      break;
    case SplitBehavior::kRemoved:
      for (const auto& sp : spans)
        if (!sp.match) emit(sp.b, sp.e);
      break;
    case SplitBehavior::kMergedWithPrevious: {
      size_t start = 0;
      for (size_t i = 0; i < spans.size(); ++i) {
        if (spans[i].match) {
          emit(start, spans[i].e);
          start = spans[i].e;
        }
      }
      emit(start, s.size());
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      size_t start = 0;
      for (size_t i = 0; i < spans.size(); ++i) {
        if (spans[i].match && spans[i].b > start) {
          emit(start, spans[i].b);
          start = spans[i].b;
        }
      }
      emit(start, s.size());
      break;
    }
    case SplitBehavior::kContiguous: {
      size_t i = 0;
      while (i < spans.size()) {
        size_t j = i + 1;
        if (spans[i].match)
          while (j < spans.size() && spans[j].match) ++j;
        emit(spans[i].b, spans[j - 1].e);
        i = j;
      }
      break;
    }
  }
}

SplitBehavior parse_behavior(const std::string& name, const std::string& where) {
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  fail("{}.behavior: '{}' is not one of Isolated, Removed, MergedWithPrevious, MergedWithNext, Contiguous",
       where, name);
}

struct SplitPreTokenizer : PreTokenizer {
  std::unique_ptr<Regex> regex;
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  void split(std::string_view piece, std::deque<std::string>&, const Sink& sink) const override {
    split_by_regex(*regex, piece, behavior, invert, sink);
  }
};

// The GPT-2 pattern ByteLevel applies when use_regex is true.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct ByteLevelPreTokenizer : PreTokenizer {
  bool add_prefix_space = false;
  std::unique_ptr<Regex> regex;  // set when use_regex
  void split(std::string_view piece, std::deque<std::string>& arena, const Sink& sink) const override {
    if (add_prefix_space && !piece.starts_with(' ')) {
      arena.push_back(" " + std::string(piece));
      piece = arena.back();
    }
    if (regex) {
      split_by_regex(*regex, piece, SplitBehavior::kIsolated, false, sink);
    } else {
      sink(piece);
    }
  }
  // Qwen's ByteLevel (after a Split) only marks the model as byte-level: skipping it saves a call per word.
  bool identity() const override { return !add_prefix_space && !regex; }
};

struct DigitsPreTokenizer : PreTokenizer {
  bool individual = false;
  void split(std::string_view s, std::deque<std::string>&, const Sink& sink) const override {
    size_t start = 0;
    auto is_digit = [&](size_t i) { return s[i] >= '0' && s[i] <= '9'; };
    size_t i = 0;
    while (i < s.size()) {
      if (is_digit(i)) {
        if (i > start) sink(s.substr(start, i - start));
        size_t j = i + 1;
        if (!individual)
          while (j < s.size() && is_digit(j)) ++j;
        sink(s.substr(i, j - i));
        start = i = j;
      } else {
        ++i;
      }
    }
    if (start < s.size()) sink(s.substr(start));
  }
};

struct SequencePreTokenizer : PreTokenizer {
  std::vector<std::unique_ptr<PreTokenizer>> steps;
  void run(size_t stage, std::string_view piece, std::deque<std::string>& arena, const Sink& sink) const {
    if (stage == steps.size()) {
      sink(piece);
      return;
    }
    steps[stage]->split(piece, arena, [&](std::string_view p) { run(stage + 1, p, arena, sink); });
  }
  void split(std::string_view piece, std::deque<std::string>& arena, const Sink& sink) const override {
    run(0, piece, arena, sink);
  }
};

std::unique_ptr<PreTokenizer> make_pretokenizer(const json& j, const std::string& where, bool& byte_level) {
  std::string type = string_field(j, "type", where);
  if (type == "Split") {
    auto p = std::make_unique<SplitPreTokenizer>();
    p->regex = std::make_unique<Regex>(pattern_field(j, where));
    p->behavior = parse_behavior(string_field(j, "behavior", where), where);
    p->invert = bool_field(j, "invert", false, where);
    return p;
  }
  if (type == "ByteLevel") {
    auto p = std::make_unique<ByteLevelPreTokenizer>();
    p->add_prefix_space = bool_field(j, "add_prefix_space", false, where);
    if (bool_field(j, "use_regex", true, where)) p->regex = std::make_unique<Regex>(kGpt2Pattern);
    byte_level = true;
    return p;
  }
  if (type == "Digits") {
    auto p = std::make_unique<DigitsPreTokenizer>();
    p->individual = bool_field(j, "individual_digits", false, where);
    return p;
  }
  if (type == "Sequence") {
    auto p = std::make_unique<SequencePreTokenizer>();
    const json& list = field(j, "pretokenizers", where);
    check(list.is_array(), "{}.pretokenizers: expected an array", where);
    for (size_t i = 0; i < list.size(); ++i) {
      auto step = make_pretokenizer(list[i], fmt::format("{}.pretokenizers[{}]", where, i), byte_level);
      if (!step->identity()) p->steps.push_back(std::move(step));
    }
    if (p->steps.size() == 1) return std::move(p->steps[0]);
    return p;
  }
  fail("{}: pre-tokenizer type '{}' is not supported (supported: Split, ByteLevel, Digits, Sequence)", where,
       type);
}

// ---- added tokens --------------------------------------------------------------------------------

struct AddedToken {
  std::string content;
  int32_t id;
  bool special, lstrip, rstrip, normalized, single_word;
};

// Leftmost-longest matching of added tokens, as the aho-corasick automaton in tokenizers does.
class AddedMatcher {
 public:
  void add(const AddedToken* t) {
    if (t->content.empty()) return;
    auto& bucket = by_first_[static_cast<unsigned char>(t->content[0])];
    bucket.push_back(t);
    std::sort(bucket.begin(), bucket.end(),
              [](const AddedToken* a, const AddedToken* b) { return a->content.size() > b->content.size(); });
    any_ = true;
  }
  bool empty() const { return !any_; }

  // Calls on_text(view) for text between tokens and on_token(token) for each matched token.
  template <typename OnText, typename OnToken>
  void split(std::string_view s, OnText on_text, OnToken on_token) const {
    size_t text_start = 0;
    size_t i = 0;
    while (i < s.size()) {
      const auto& bucket = by_first_[static_cast<unsigned char>(s[i])];
      const AddedToken* hit = nullptr;
      for (const AddedToken* t : bucket) {
        if (s.compare(i, t->content.size(), t->content) == 0 &&
            (!t->single_word || whole_word(s, i, t->content.size()))) {
          hit = t;
          break;
        }
      }
      if (!hit) {
        ++i;
        continue;
      }
      size_t b = i, e = i + hit->content.size();
      if (hit->lstrip)
        while (b > text_start && is_space_before(s, b)) b = previous_char(s, b);
      if (hit->rstrip)
        while (e < s.size() && is_space_at(s, e)) e += std::max<size_t>(1, utf8_sequence_length(s, e));
      if (b > text_start) on_text(s.substr(text_start, b - text_start));
      on_token(*hit);
      text_start = i = e;
    }
    if (text_start < s.size()) on_text(s.substr(text_start));
  }

 private:
  static size_t previous_char(std::string_view s, size_t i) {
    do --i;
    while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80);
    return i;
  }
  static bool is_space_at(std::string_view s, size_t i) {
    if (utf8_sequence_length(s, i) == 0) return false;
    return is_unicode_space(utf8_decode(s, i));
  }
  static bool is_space_before(std::string_view s, size_t i) { return is_space_at(s, previous_char(s, i)); }
  static bool is_word_at(std::string_view s, size_t i) {
    if (utf8_sequence_length(s, i) == 0) return false;
    auto cp = static_cast<utf8proc_int32_t>(utf8_decode(s, i));
    auto cat = utf8proc_category(cp);
    return cp == '_' || (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
           (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO);
  }
  static bool whole_word(std::string_view s, size_t b, size_t n) {
    if (b > 0 && is_word_at(s, previous_char(s, b))) return false;
    return b + n >= s.size() || !is_word_at(s, b + n);
  }
  std::array<std::vector<const AddedToken*>, 256> by_first_;
  bool any_ = false;
};

// ---- post-processor ------------------------------------------------------------------------------

struct PostProcessor {
  std::vector<int32_t> prefix, suffix;  // ids placed around a single sequence
};

void parse_post_processor(const json& j, const std::string& where, PostProcessor& out) {
  if (j.is_null()) return;
  std::string type = string_field(j, "type", where);
  if (type == "ByteLevel") return;  // only adjusts offsets
  if (type == "Sequence") {
    const json& list = field(j, "processors", where);
    for (size_t i = 0; i < list.size(); ++i)
      parse_post_processor(list[i], fmt::format("{}.processors[{}]", where, i), out);
    return;
  }
  if (type == "TemplateProcessing") {
    const json& single = field(j, "single", where);
    const json& specials = field(j, "special_tokens", where);
    bool seen_sequence = false;
    for (const json& piece : single) {
      if (piece.contains("Sequence")) {
        seen_sequence = true;
      } else if (piece.contains("SpecialToken")) {
        std::string name = string_field(piece["SpecialToken"], "id", where + ".single");
        check(specials.contains(name), "{}.special_tokens: '{}' used in 'single' is not defined", where,
              name);
        for (const json& id : field(specials[name], "ids", where + ".special_tokens." + name))
          (seen_sequence ? out.suffix : out.prefix).push_back(id.get<int32_t>());
      } else {
        fail("{}.single: unexpected entry {}", where, piece.dump());
      }
    }
    return;
  }
  fail("{}: post-processor type '{}' is not supported (supported: ByteLevel, TemplateProcessing, Sequence)",
       where, type);
}

// The decoder chain, reduced to what it does to one token's text (ByteLevel, Replace, ByteFallback) and what
// it does to the whole decoded text once tokens are fused (Strip after Fuse).
struct Decoder {
  bool byte_level = false;
  bool byte_fallback = false;                                     // "<0xE4>" decodes to the byte 0xE4
  std::vector<std::pair<std::string, std::string>> replacements;  // in order, on each token
  bool fused = false;
  std::string strip_content;
  size_t strip_start = 0, strip_stop = 0;

  bool is_byte_token(const std::string& token) const {
    return byte_fallback && token.size() == 6 && token.starts_with("<0x") && token.ends_with('>') &&
           std::isxdigit(static_cast<unsigned char>(token[3])) &&
           std::isxdigit(static_cast<unsigned char>(token[4]));
  }

  std::string token_bytes(const std::string& token) const {
    if (byte_level) {
      // A token whose characters all belong to the byte alphabet becomes those bytes; any other (e.g. an
      // added "<|im_start|>" with non-alphabet characters) stays as its UTF-8.
      std::string bytes;
      bool all_mapped = is_valid_utf8(token);
      for (size_t i = 0; all_mapped && i < token.size();) {
        int b = byte_from_char(utf8_decode(token, i));
        if (b < 0) all_mapped = false;
        bytes.push_back(static_cast<char>(b));
      }
      return all_mapped ? bytes : token;
    }
    if (is_byte_token(token))
      return std::string(1, static_cast<char>(std::stoi(token.substr(3, 2), nullptr, 16)));
    std::string text = token;
    for (const auto& [from, to] : replacements) {
      std::string out;
      size_t pos = 0;
      for (size_t at; (at = text.find(from, pos)) != std::string::npos; pos = at + from.size())
        out.append(text, pos, at - pos).append(to);
      text = out.append(text, pos);
    }
    return text;
  }

  // Strip after Fuse: up to strip_start copies of the content at the start, strip_stop at the end.
  void finish(std::string& text) const {
    if (strip_content.empty()) return;
    size_t b = 0, e = text.size();
    for (size_t n = 0; n < strip_start && text.compare(b, strip_content.size(), strip_content) == 0; ++n)
      b += strip_content.size();
    for (size_t n = 0; n < strip_stop && e >= b + strip_content.size() &&
                       text.compare(e - strip_content.size(), strip_content.size(), strip_content) == 0;
         ++n)
      e -= strip_content.size();
    text = text.substr(b, e - b);
  }
};

void parse_decoder(const json& j, const std::string& where, Decoder& out) {
  check(!j.is_null(), "{}: a tokenizer without a decoder is not supported", where);
  std::string type = string_field(j, "type", where);
  if (type == "Sequence") {
    const json& list = field(j, "decoders", where);
    check(list.is_array(), "{}.decoders: expected an array", where);
    for (size_t i = 0; i < list.size(); ++i)
      parse_decoder(list[i], fmt::format("{}.decoders[{}]", where, i), out);
    return;
  }
  check(type == "Strip" || out.strip_content.empty(), "{}: a decoder after Strip is not supported", where);
  if (type == "ByteLevel") {
    out.byte_level = true;
  } else if (type == "ByteFallback") {
    out.byte_fallback = true;
  } else if (type == "Fuse") {
    out.fused = true;  // our decode always concatenates: Fuse only makes a later Strip act on the whole text
  } else if (type == "Replace") {
    const json& p = field(j, "pattern", where);
    check(p.is_object() && p.contains("String") && p["String"].is_string(),
          "{}.pattern: only a {{\"String\": ...}} pattern is supported in a Replace decoder", where);
    out.replacements.emplace_back(p["String"].get<std::string>(), string_field(j, "content", where));
  } else if (type == "Strip") {
    check(out.fused, "{}: Strip is supported only after Fuse (on the whole decoded text)", where);
    out.strip_content = string_field(j, "content", where);
    check(!out.strip_content.empty(), "{}.content: expected a non-empty string", where);
    auto count = [&](const char* key) {
      const json& v = field(j, key, where);
      check(v.is_number_unsigned(), "{}.{}: expected a non-negative integer", where, key);
      return v.get<size_t>();
    };
    out.strip_start = count("start");
    out.strip_stop = count("stop");
  } else {
    fail(
        "{}: decoder type '{}' is not supported (supported: ByteLevel, ByteFallback, Fuse, Replace, Strip, "
        "Sequence)",
        where, type);
  }
  check(!(out.byte_level && (out.byte_fallback || !out.replacements.empty())),
        "{}: ByteLevel cannot be combined with ByteFallback or Replace", where);
}

// Identifies a tokenizer's entries in the per-thread word cache.
std::atomic<uint64_t> next_serial{1};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  check(in.good(), "cannot open tokenizer file '{}'", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

// ---- the tokenizer -------------------------------------------------------------------------------

struct Tokenizer::Impl {
  std::string origin;
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pretokenizer;
  bool byte_level = false;
  BpeModel bpe;
  std::vector<AddedToken> added;
  AddedMatcher raw_matcher, normalized_matcher;
  std::unordered_map<std::string, int32_t> added_by_content;
  PostProcessor post;
  Decoder decoder;
  std::vector<std::string> token_bytes;  // decoded bytes of each id
  std::vector<uint8_t> flags;            // bit 0: added, bit 1: special, bit 2: a byte-fallback "<0xXX>"
  uint64_t serial = next_serial++;       // identifies this tokenizer's entries in the per-thread cache

  void encode_text(std::string_view text, std::vector<int32_t>& out) const;
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;
};

void Tokenizer::Impl::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.size() > WordCache::kMaxWordBytes) {
    bpe.encode_word(word, byte_level, out);
    return;
  }
  thread_local WordCache cache;
  cache.set_owner(serial);
  uint64_t hash = WordCache::hash(word);
  if (cache.append_cached(word, hash, out)) return;
  size_t before = out.size();
  bpe.encode_word(word, byte_level, out);
  cache.insert(word, hash, std::span<const int32_t>(out).subspan(before));
}

// Normalizes, splits on normalized added tokens, pre-tokenizes and runs BPE on one stretch of text that
// holds no raw added token.
void Tokenizer::Impl::encode_text(std::string_view text, std::vector<int32_t>& out) const {
  std::string copy;
  std::string_view normalized = text;
  if (normalizer && normalizer->may_change(text)) {
    copy.assign(text);
    normalizer->apply(copy);
    normalized = copy;
  }
  std::deque<std::string> arena;
  auto pretokenize = [&](std::string_view piece) {
    if (pretokenizer) {
      pretokenizer->split(piece, arena, [&](std::string_view word) { encode_word(word, out); });
    } else {
      encode_word(piece, out);
    }
  };
  if (normalized_matcher.empty()) {
    pretokenize(normalized);
  } else {
    normalized_matcher.split(normalized, pretokenize, [&](const AddedToken& t) { out.push_back(t.id); });
  }
}

Tokenizer Tokenizer::from_file(const std::string& path) {
  return from_json(read_file(path), path);
}

Tokenizer Tokenizer::from_json(std::string_view text, const std::string& origin) {
  json root;
  try {
    root = json::parse(text);
  } catch (const json::parse_error& e) {
    fail("{}: not valid JSON: {}", origin, e.what());
  }
  check(root.is_object(), "{}: expected a JSON object at the top level", origin);
  auto impl = std::make_shared<Impl>();
  impl->origin = origin;

  // Model.
  const json& model = field(root, "model", origin);
  std::string where = origin + ": model";
  std::string model_type = model.contains("type") ? string_field(model, "type", where) : "BPE";
  check(model_type == "BPE", "{}: model type '{}' is not supported (supported: BPE)", where, model_type);
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(key) && model[key].is_string())
      check(model[key].get<std::string>().empty(), "{}.{}: a non-empty value is not supported", where, key);
  }
  if (model.contains("dropout") && !model["dropout"].is_null())
    check(model["dropout"].get<double>() == 0.0, "{}.dropout: BPE dropout is not supported at inference",
          where);
  BpeModel& bpe = impl->bpe;
  bpe.byte_fallback = bool_field(model, "byte_fallback", false, where);
  bpe.ignore_merges = bool_field(model, "ignore_merges", false, where);
  bpe.fuse_unk = bool_field(model, "fuse_unk", false, where);
  const json& vocab = field(model, "vocab", where);
  check(vocab.is_object(), "{}.vocab: expected an object of token -> id", where);
  bpe.vocab.reserve(vocab.size());
  int32_t max_id = -1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    check(it.value().is_number_integer() && it.value().get<int64_t>() >= 0 &&
              it.value().get<int64_t>() < (1 << 30),
          "{}.vocab['{}']: expected a non-negative integer id, got {}", where, it.key(), it.value().dump());
    auto id = it.value().get<int32_t>();
    bpe.vocab.emplace(it.key(), id);
    max_id = std::max(max_id, id);
  }
  const json& merges = field(model, "merges", where);
  check(merges.is_array(), "{}.merges: expected an array", where);
  bpe.merges.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const json& m = merges[rank];
    std::string left, right;
    if (m.is_string()) {  // older format: "left right"
      const auto& s = m.get_ref<const std::string&>();
      auto space = s.find(' ', 1);
      check(space != std::string::npos, "{}.merges[{}]: '{}' is not 'left right'", where, rank, s);
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else {
      check(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(),
            "{}.merges[{}]: expected [\"left\", \"right\"], got {}", where, rank, m.dump());
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    }
    auto l = bpe.vocab.find(left), r = bpe.vocab.find(right), merged = bpe.vocab.find(left + right);
    check(l != bpe.vocab.end() && r != bpe.vocab.end() && merged != bpe.vocab.end(),
          "{}.merges[{}]: ('{}', '{}') uses a token that is not in the vocabulary", where, rank, left, right);
    bpe.merges.insert(l->second, r->second, static_cast<int32_t>(rank), merged->second);
  }
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    auto it = bpe.vocab.find(model["unk_token"].get<std::string>());
    check(it != bpe.vocab.end(), "{}.unk_token: '{}' is not in the vocabulary", where,
          model["unk_token"].get<std::string>());
    bpe.unk_id = it->second;
  }
  for (int b = 0; b < 256; ++b) {
    std::string mapped;
    utf8_append(mapped, byte_to_char(static_cast<uint8_t>(b)));
    auto it = bpe.vocab.find(mapped);
    bpe.byte_token[b] = it == bpe.vocab.end() ? -1 : it->second;
    auto fb = bpe.vocab.find(fmt::format("<0x{:02X}>", b));
    bpe.fallback_token[b] = fb == bpe.vocab.end() ? -1 : fb->second;
  }

  // Normalizer and pre-tokenizer.
  if (root.contains("normalizer") && !root["normalizer"].is_null())
    impl->normalizer = make_normalizer(root["normalizer"], origin + ": normalizer");
  if (root.contains("pre_tokenizer") && !root["pre_tokenizer"].is_null())
    impl->pretokenizer =
        make_pretokenizer(root["pre_tokenizer"], origin + ": pre_tokenizer", impl->byte_level);
  if (impl->byte_level) {
    for (int b = 0; b < 256; ++b)
      check(bpe.byte_token[b] >= 0,
            "{}: the ByteLevel pre-tokenizer needs all 256 byte tokens, byte {} is missing", where, b);
  }
  if (root.contains("post_processor"))
    parse_post_processor(root["post_processor"], origin + ": post_processor", impl->post);
  parse_decoder(root.contains("decoder") ? root["decoder"] : json(), origin + ": decoder", impl->decoder);

  // Added tokens.
  if (root.contains("added_tokens")) {
    const json& list = root["added_tokens"];
    check(list.is_array(), "{}: added_tokens: expected an array", origin);
    impl->added.reserve(list.size());
    for (size_t i = 0; i < list.size(); ++i) {
      std::string w = fmt::format("{}: added_tokens[{}]", origin, i);
      const json& t = list[i];
      AddedToken a;
      a.content = string_field(t, "content", w);
      const json& id = field(t, "id", w);
      check(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < (1 << 30),
            "{}.id: expected a non-negative integer", w);
      a.id = id.get<int32_t>();
      a.special = bool_field(t, "special", false, w);
      a.lstrip = bool_field(t, "lstrip", false, w);
      a.rstrip = bool_field(t, "rstrip", false, w);
      a.normalized = bool_field(t, "normalized", !a.special, w);
      a.single_word = bool_field(t, "single_word", false, w);
      max_id = std::max(max_id, a.id);
      impl->added.push_back(a);
    }
    for (const AddedToken& a : impl->added) {
      (a.normalized ? impl->normalized_matcher : impl->raw_matcher).add(&a);
      impl->added_by_content[a.content] = a.id;
    }
  }

  // Per-id tables: vocabulary strings, decoded bytes, flags.
  bpe.id_to_token.assign(static_cast<size_t>(max_id + 1), std::string());
  for (const auto& [tok, id] : bpe.vocab) bpe.id_to_token[id] = tok;
  for (const AddedToken& a : impl->added) bpe.id_to_token[a.id] = a.content;
  impl->token_bytes.resize(bpe.id_to_token.size());
  impl->flags.assign(bpe.id_to_token.size(), 0);
  for (size_t id = 0; id < bpe.id_to_token.size(); ++id)
    impl->token_bytes[id] = impl->decoder.token_bytes(bpe.id_to_token[id]);
  for (size_t id = 0; id < bpe.id_to_token.size(); ++id)
    if (impl->decoder.is_byte_token(bpe.id_to_token[id])) impl->flags[id] = 4;
  for (const AddedToken& a : impl->added) impl->flags[a.id] = 1 | (a.special ? 2 : 0);
  return Tokenizer(std::move(impl));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  const Impl& m = *impl_;
  std::string sanitized;
  if (!is_valid_utf8(text)) {
    sanitized = utf8_lossy(text);
    text = sanitized;
  }
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  if (add_special_tokens) out.insert(out.end(), m.post.prefix.begin(), m.post.prefix.end());
  if (m.raw_matcher.empty()) {
    m.encode_text(text, out);
  } else {
    m.raw_matcher.split(
        text, [&](std::string_view piece) { m.encode_text(piece, out); },
        [&](const AddedToken& t) { out.push_back(t.id); });
  }
  if (add_special_tokens) out.insert(out.end(), m.post.suffix.begin(), m.post.suffix.end());
  return out;
}

std::vector<std::vector<int32_t>> Tokenizer::encode_batch(std::span<const std::string> texts,
                                                          bool add_special_tokens) const {
  std::vector<std::vector<int32_t>> out(texts.size());
  ThreadPool::global().parallel_for(texts.size(), [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) out[i] = encode(texts[i], add_special_tokens);
  });
  return out;
}

const std::string& Tokenizer::token_bytes(int32_t id) const {
  check(id >= 0, "token id {} is negative", id);
  // Checkpoints pad the embedding table past the tokenizer (Qwen3.5: 248,320 rows); a model can sample those
  // ids (random weights do). They have no text, as in Hugging Face's decode, which skips them.
  static const std::string no_text;
  if (static_cast<size_t>(id) >= impl_->token_bytes.size()) return no_text;
  return impl_->token_bytes[id];
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  const Impl& m = *impl_;
  std::string bytes;
  // ByteFallback decodes each run of byte tokens on its own: valid UTF-8 stays, otherwise every byte of the
  // run becomes U+FFFD (tokenizers' rule, which differs from replacing maximal ill-formed subsequences).
  size_t run_start = 0;
  auto close_run = [&] {
    std::string_view run(bytes.data() + run_start, bytes.size() - run_start);
    if (!is_valid_utf8(run)) {
      size_t n = run.size();
      bytes.resize(run_start);
      for (size_t i = 0; i < n; ++i) bytes += "\xEF\xBF\xBD";
    }
  };
  bool in_run = false;
  for (int32_t id : ids) {
    if (skip_special_tokens && is_special(id)) continue;
    bool byte_token = id >= 0 && static_cast<size_t>(id) < m.flags.size() && (m.flags[id] & 4);
    if (byte_token && !in_run) run_start = bytes.size();
    if (!byte_token && in_run) close_run();
    in_run = byte_token;
    bytes += token_bytes(id);
  }
  if (in_run) close_run();
  m.decoder.finish(bytes);
  return is_valid_utf8(bytes) ? bytes : utf8_lossy(bytes);
}

std::optional<int32_t> Tokenizer::token_id(std::string_view token) const {
  if (auto it = impl_->added_by_content.find(std::string(token)); it != impl_->added_by_content.end())
    return it->second;
  if (auto it = impl_->bpe.vocab.find(std::string(token)); it != impl_->bpe.vocab.end()) return it->second;
  return std::nullopt;
}

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->bpe.id_to_token.size()) return std::nullopt;
  const std::string& s = impl_->bpe.id_to_token[id];
  if (s.empty()) return std::nullopt;
  return s;
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->flags.size() && (impl_->flags[id] & 2);
}

bool Tokenizer::is_added(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->flags.size() && (impl_->flags[id] & 1);
}

size_t Tokenizer::vocab_size() const {
  return impl_->token_bytes.size();
}

}  // namespace moeserve::text
