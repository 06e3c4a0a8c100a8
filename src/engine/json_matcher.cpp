// JsonMatcher: the pushdown automaton over a compiled JsonSchema (engine/json_constraint.h). feed() takes one
// byte: whitespace between tokens, then the frame on top of the stack by its kind, one function each.
#include <algorithm>
#include <array>
#include <string_view>
#include <type_traits>

#include "engine/json_constraint.h"

namespace moeserve {

using Frame = JsonMatcher::Frame;
using Node = JsonSchema::Node;
static_assert(std::is_trivially_copyable_v<Frame>, "accepts() copies the stack once per token checked");

namespace {

constexpr uint32_t kNone = JsonTrie::kNone;

bool is_ws(uint8_t c) {
  return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}
bool is_digit(uint8_t c) {
  return c >= '0' && c <= '9';
}
bool is_hex(uint8_t c) {
  return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

// Object phases.
enum : uint8_t { kObjOpen, kObjKey, kObjColon, kObjValue, kObjAfter, kObjNext };
// Array phases.
enum : uint8_t { kArrOpen, kArrItem, kArrAfter };
// XML argument phases: a "<parameter=NAME>\n" or "</function>" in the trie, the value, then its end.
enum : uint8_t { kXmlBetween, kXmlValue, kXmlEnd };
constexpr std::string_view kXmlValueEnd = "\n</parameter>\n";
// Raw text phases: kRawNewline holds a '\n' that is the value's or the start of its end.
enum : uint8_t { kRawChar, kRawNewline };
// String phases. A \u escape's value so far is in the frame's `seen`; `count` is 1 while a high surrogate
// waits for its low half.
enum : uint8_t { kStrChar, kStrEscape, kStrHex1, kStrHex2, kStrHex3, kStrHex4, kStrWantBackslash, kStrWantU };
// Number phases (accepting: kNumZero, kNumInt, kNumFrac, kNumExp).
// kNumNoPhase: not a number's prefix.
enum : uint8_t {
  kNumStart,
  kNumMinus,
  kNumZero,
  kNumInt,
  kNumDot,
  kNumFrac,
  kNumE,
  kNumESign,
  kNumExp,
  kNumNoPhase
};

// Without bounds an exponent has at most two digits (1e99): past that a double, which JSON parsers in Python
// and JavaScript read numbers into, may be infinite (1e400), and the number would not compare as one. (Under
// bounds, NumberBounds keeps numbers within a double's magnitudes already.)
constexpr uint32_t kMaxExponentDigits = 2;

bool number_accepting(uint8_t phase) {
  return phase == kNumZero || phase == kNumInt || phase == kNumFrac || phase == kNumExp;
}

// The number phase after `c`, kNumNoPhase when `c` cannot continue the number (JSON's number grammar;
// integers have neither fraction nor exponent).
uint8_t number_phase(uint8_t phase, uint8_t c, bool integer) {
  switch (phase) {
    case kNumStart:
      return c == '-' ? kNumMinus : c == '0' ? kNumZero : is_digit(c) ? kNumInt : kNumNoPhase;
    case kNumMinus:
      return c == '0' ? kNumZero : is_digit(c) ? kNumInt : kNumNoPhase;
    case kNumZero:
    case kNumInt:
      if (phase == kNumInt && is_digit(c)) return kNumInt;
      if (c == '.' && !integer) return kNumDot;
      if ((c == 'e' || c == 'E') && !integer) return kNumE;
      return kNumNoPhase;
    case kNumDot:
      return is_digit(c) ? kNumFrac : kNumNoPhase;
    case kNumFrac:
      return is_digit(c) ? kNumFrac : (c == 'e' || c == 'E') ? kNumE : kNumNoPhase;
    case kNumE:
      return (c == '+' || c == '-') ? kNumESign : is_digit(c) ? kNumExp : kNumNoPhase;
    case kNumESign:
    case kNumExp:
      return is_digit(c) ? kNumExp : kNumNoPhase;
  }
  return kNumNoPhase;
}

}  // namespace

JsonMatcher::JsonMatcher(std::shared_ptr<const JsonSchema> schema) : schema_(std::move(schema)) {
  State& state = states_.emplace_back();
  Frame root;
  root.kind = Frame::kRoot;
  state.stack.push_back(root);
  Frame value;
  value.kind = schema_->raw_text() ? Frame::kText : Frame::kValue;
  value.node = 0;
  if (value.kind == Frame::kText) value.rx = schema_->string_rule(schema_->node(0).string_rule).start();
  if (schema_->call()) {
    value.kind = Frame::kCall;
    value.trie = schema_->function_names();
  }
  state.stack.push_back(value);
  if (schema_->call() && schema_->function_names() == kNone) start_arguments(state, 0);
}

// A copy of `from` in the scratch states, to be fed from byte `at` on.
void JsonMatcher::start(const State& from, size_t at) const {
  if (used_ == scratch_.size()) scratch_.emplace_back();
  State& s = scratch_[used_];
  s.stack.assign(from.stack.begin(), from.stack.end());  // reuses the capacity: no allocation
  s.whitespace_run = from.whitespace_run;
  s.number.assign(from.number);
  work_ += s.stack.size();
  pending_.emplace_back(used_++, at);
}

// Feeds the bytes to every state, and to the states unions fork on the way: done_ lists those that took them
// all (with `first`, only the first found). Returns their count.
size_t JsonMatcher::run(std::string_view bytes, bool first) const {
  used_ = 0;
  pending_.clear();
  done_.clear();
  for (size_t i = states_.size(); i-- > 0;) start(states_[i], 0);  // the first state is tried first
  while (!pending_.empty()) {
    auto [i, at] = pending_.back();
    pending_.pop_back();
    bool taken = true;
    for (; taken && at < bytes.size(); ++at) {
      taken = feed(scratch_[i], uint8_t(bytes[at]));
      for (const State& fork : forks_) start(fork, at);  // they have not taken this byte yet
      forks_.clear();
    }
    if (!taken) continue;
    done_.push_back(i);
    if (first) break;
  }
  return done_.size();
}

bool JsonMatcher::accepts(std::string_view bytes) const {
  return run(bytes, true) > 0;
}

bool JsonMatcher::advance(std::string_view bytes) {
  if (run(bytes, false) == 0) return false;
  // States that took the same path are one state again.
  size_t kept = 0;
  for (size_t i : done_) {
    if (kept == kMaxStates) break;
    bool again = false;
    for (size_t k = 0; k < kept && !again; ++k) again = states_[k] == scratch_[i];
    if (again) continue;
    if (kept == states_.size()) states_.emplace_back();
    std::swap(states_[kept++], scratch_[i]);
  }
  states_.resize(kept);
  return true;
}

bool JsonMatcher::can_end() const {
  for (const State& s : states_)
    if (can_end(s)) return true;
  return false;
}

bool JsonMatcher::can_end(const State& s) const {
  const Frame& top = s.stack.back();
  if (top.kind == Frame::kRoot) return size_t(top.count) == schema_->suffix().size();
  if (s.stack.size() != 2 || !schema_->suffix().empty()) return false;
  if (top.kind == Frame::kNumber) return number_accepting(top.phase) && number_in_bounds(top, s.number);
  if (top.kind == Frame::kLiteral) return schema_->values().tag[top.trie] >= 0;
  if (top.kind == Frame::kText)
    return !top.utf8_left && schema_->string_rule(schema_->node(0).string_rule).complete(top.rx, top.length);
  return false;
}

// A value of `node` starting in the frame at `index` nests within kMaxNesting containers (the root frame
// holds none, so the frame at index i is inside i - 1).
bool JsonMatcher::fits(int node, size_t index) const {
  return index - 1 + schema_->node(node).need() <= size_t(kMaxNesting);
}

uint32_t JsonMatcher::step(const JsonTrie& trie, uint32_t node, uint8_t c) const {
  ++work_;
  return trie.child(node, c);
}

// An object opens in the frame at `index`: properties whose value would not fit below count as seen (none is
// required: the object's need covers those), and other keys may come only if their schema fits.
void JsonMatcher::open_object(Frame& f, size_t index) const {
  const Node& n = schema_->node(f.node);
  f.kind = Frame::kObject;
  f.phase = kObjOpen;
  f.seen = 0;
  work_ += n.properties.size();
  for (size_t p = 0; p < n.properties.size(); ++p)
    if (!fits(n.properties[p], index + 1)) f.seen |= uint64_t(1) << p;
  f.open = n.additional >= 0 && fits(n.additional, index + 1);
}

// The frame on top finished; tell its parent (now on top).
bool JsonMatcher::child_done(State& s) const {
  const Frame done = s.stack.back();
  s.stack.pop_back();
  Frame& f = s.stack.back();
  switch (f.kind) {
    case Frame::kRoot:
      f.phase = 1;
      return true;
    case Frame::kArray:
      ++f.count, f.phase = kArrAfter;
      return true;
    case Frame::kXmlObject:
      f.phase = kXmlEnd;
      f.count = done.kind == Frame::kXmlText ? 2 : 0;  // raw text ends on the '<' after its '\n'
      return true;
    case Frame::kObject: {
      if (f.phase == kObjValue) {
        f.phase = kObjAfter;
        return true;
      }
      // A key: which property it names.
      const JsonTrie& names = schema_->names();
      if (done.kind == Frame::kName) {
        f.key_index = names.tag[done.trie];
      } else {
        const uint32_t end = done.trie == kNone ? kNone : names.child(done.trie, '"');
        f.key_index = end == kNone ? -1 : names.tag[end];
      }
      if (f.key_index >= 0) f.seen |= uint64_t(1) << f.key_index;
      f.phase = kObjColon;
      return true;
    }
    default:
      return false;
  }
}

// The value a frame of kind kValue holds starts with this byte: it becomes the frame of that value's kind.
JsonMatcher::Step JsonMatcher::feed_value(State& s, uint8_t c) const {
  Frame& f = s.stack.back();
  const size_t at = s.stack.size() - 1;
  if (const Node& u = schema_->node(f.node); !u.alternatives.empty()) {
    // A union: this state follows the first alternative that fits, a fork each other one.
    int first = -1;
    for (int alt : u.alternatives) {
      if (!fits(alt, at)) continue;
      if (first < 0) {
        first = alt;
        continue;
      }
      forks_.push_back(s);
      forks_.back().stack.back().node = alt;
      work_ += s.stack.size();
    }
    if (first < 0) return Step::kReject;
    s.stack.back().node = first;
    return Step::kPass;
  }
  const Node& n = schema_->node(f.node);
  if (n.values != kNone || ((c == 't' || c == 'f' || c == 'n') && n.words != kNone)) {
    f.kind = Frame::kLiteral;
    f.trie = n.values != kNone ? n.values : n.words;
    return Step::kPass;  // the literal takes this byte
  }
  // Containers only where what they must hold still fits.
  if (c == '{' && (n.types & Node::kObject) && at - 1 + n.need_object <= size_t(kMaxNesting)) {
    open_object(f, at);
    return Step::kTaken;
  }
  if (c == '[' && (n.types & Node::kArray) && at - 1 + n.need_array <= size_t(kMaxNesting)) {
    f.kind = Frame::kArray;
    f.phase = kArrOpen;
    return Step::kTaken;
  }
  if (c == '"' && (n.types & Node::kString)) {
    f.kind = Frame::kString;
    f.phase = kStrChar;
    f.rx = n.string_rule >= 0 ? schema_->string_rule(n.string_rule).start() : 0;
    f.length = 0;
    return Step::kTaken;
  }
  if ((c == '-' || is_digit(c)) && (n.types & (Node::kNumber | Node::kInteger))) {
    f.kind = Frame::kNumber;
    f.phase = kNumStart;
    f.length = 0;  // exponent digits
    s.number.clear();
    return Step::kPass;
  }
  return Step::kReject;
}

// Enum/const values and true/false/null: one step in the value trie.
JsonMatcher::Step JsonMatcher::feed_literal(State& s, uint8_t c) const {
  Frame& f = s.stack.back();
  const JsonTrie& values = schema_->values();
  const uint32_t next = step(values, f.trie, c);
  if (next == kNone) {
    if (values.tag[f.trie] < 0 || !child_done(s)) return Step::kReject;
    return Step::kPass;  // the literal ended before this byte: the parent takes it
  }
  f.trie = next;
  // Done when no longer text is possible: tell the parent now.
  return values.leaf(next) && !child_done(s) ? Step::kReject : Step::kTaken;
}

// A key where no other keys are allowed: only properties not seen yet (nor too deep) may follow.
JsonMatcher::Step JsonMatcher::feed_name(State& s, uint8_t c) const {
  Frame& f = s.stack.back();
  const JsonTrie& names = schema_->names();
  const uint32_t next = step(names, f.trie, c);
  if (next == kNone || !(names.below[next] & ~s.stack[s.stack.size() - 2].seen)) return Step::kReject;
  f.trie = next;
  return names.leaf(next) && !child_done(s) ? Step::kReject : Step::kTaken;  // a name ends at its quote
}

// Under bounds the text so far is kept, and each byte must leave a number that can still end in bounds.
JsonMatcher::Step JsonMatcher::feed_number(State& s, uint8_t c) const {
  Frame& f = s.stack.back();
  const Node& n = schema_->node(f.node);
  if (const uint8_t next = number_phase(f.phase, c, !(n.types & Node::kNumber)); next != kNumNoPhase) {
    if (next == kNumExp && n.bounds < 0 && ++f.length > kMaxExponentDigits) return Step::kReject;
    f.phase = next;
    if (n.bounds < 0) return Step::kTaken;
    ++work_;
    s.number.push_back(char(c));
    return schema_->bounds(n.bounds).viable(s.number) ? Step::kTaken : Step::kReject;
  }
  if (!number_accepting(f.phase) || !number_in_bounds(f, s.number) || !child_done(s)) return Step::kReject;
  return Step::kPass;
}

bool JsonMatcher::number_in_bounds(const Frame& f, const std::string& text) const {
  const Node& n = schema_->node(f.node);
  if (n.bounds < 0) return true;
  const std::optional<Decimal> v = Decimal::parse(text);
  return v && schema_->bounds(n.bounds).contains(*v);
}

JsonMatcher::Step JsonMatcher::feed_string(State& s, uint8_t c) const {
  Frame& f = s.stack.back();
  const size_t at = s.stack.size() - 1;
  const uint8_t before = f.phase;
  const Step taken = Step::kTaken;
  if (f.utf8_left) {  // inside a multi-byte UTF-8 character
    if (c < f.utf8_lo || c > f.utf8_hi) return Step::kReject;
    --f.utf8_left;
    f.utf8_lo = 0x80, f.utf8_hi = 0xBF;
    follow_key(f, c);
    return follow_rule(f, c, before) ? taken : Step::kReject;
  }
  switch (f.phase) {
    case kStrChar:
      if (c == '"') {
        if (f.key) {  // the key must leave room for its value: a property too deep to start is refused
          const JsonTrie& names = schema_->names();
          const uint32_t end = f.trie == kNone ? kNone : names.child(f.trie, '"');
          const Node& object = schema_->node(s.stack[at - 1].node);
          if (end != kNone && names.tag[end] >= 0 && !fits(object.properties[size_t(names.tag[end])], at))
            return Step::kReject;
        } else if (const int rule = schema_->node(f.node).string_rule;
                   rule >= 0 && !schema_->string_rule(rule).complete(f.rx, f.length)) {
          return Step::kReject;
        }
        return child_done(s) ? Step::kTaken : Step::kReject;
      }
      if (c == '\\') {
        f.phase = kStrEscape;
      } else if (c < 0x20) {
        return Step::kReject;
      } else if (c >= 0x80 && !utf8_lead(f, c)) {
        return Step::kReject;
      }
      break;
    case kStrWantBackslash:
      if (c != '\\') return Step::kReject;
      f.phase = kStrWantU;
      break;
    case kStrEscape:
    case kStrWantU:
      if (f.phase == kStrWantU && c != 'u') return Step::kReject;
      if (c == 'u') {
        f.phase = kStrHex1;
        f.seen = 0;
      } else if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' ||
                 c == 't') {
        f.phase = kStrChar;
      } else {
        return Step::kReject;
      }
      break;
    default:
      if (!escape_hex(f, c)) return Step::kReject;
  }
  follow_key(f, c);
  return follow_rule(f, c, before) ? taken : Step::kReject;
}

// The whole output as text an automaton accepts (guided_regex, choice): every byte is a character of it.
JsonMatcher::Step JsonMatcher::feed_text(State& s, uint8_t c) const {
  return raw_char(s.stack.back(), c);
}

// One byte of raw text (UTF-8, no escapes) under the frame's rule.
JsonMatcher::Step JsonMatcher::raw_char(Frame& f, uint8_t c) const {
  if (f.utf8_left) {
    if (c < f.utf8_lo || c > f.utf8_hi) return Step::kReject;
    --f.utf8_left;
    f.utf8_lo = 0x80, f.utf8_hi = 0xBF;
  } else if (c >= 0x80 && !utf8_lead(f, c)) {
    return Step::kReject;
  }
  return follow_rule(f, c, kStrChar, true) ? Step::kTaken : Step::kReject;
}

namespace {

// Code points a multi-byte character can still be, from the bits read and the continuation bytes left;
// `total` is the character's continuation count (its lead says), which fixes the range UTF-8 allows it.
struct CodeRange {
  uint32_t lo, hi;
};

std::array<CodeRange, 2> utf8_ranges(uint32_t bits, int left, int total) {
  const uint32_t lo = bits << (6 * left), hi = lo + (uint32_t(1) << (6 * left)) - 1;
  static constexpr CodeRange kLegal[] = {{0, 0x7F}, {0x80, 0x7FF}, {0x800, 0xFFFF}, {0x10000, 0x10FFFF}};
  const CodeRange legal = kLegal[total];
  const CodeRange r{std::max(lo, legal.lo), std::min(hi, legal.hi)};
  // Minus the surrogates, which UTF-8 does not encode.
  return {CodeRange{r.lo, std::min(r.hi, uint32_t(0xD7FF))},
          CodeRange{std::max(r.lo, uint32_t(0xE000)), r.hi}};
}

uint32_t supplementary(uint32_t high, uint32_t low) {
  return 0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00);
}

uint32_t escaped(uint8_t c) {
  switch (c) {
    case 'b':
      return 8;
    case 'f':
      return 12;
    case 'n':
      return 10;
    case 'r':
      return 13;
    case 't':
      return 9;
    default:
      return c;  // " \ /
  }
}

}  // namespace

// A string under a StringRule: each character it completes steps the automaton, and each byte that starts
// or continues a character (raw UTF-8 or an escape) is taken only while some character it can still become
// keeps the string viable.
bool JsonMatcher::follow_rule(Frame& f, uint8_t c, uint8_t before, bool raw) const {
  const int index = schema_->node(f.node).string_rule;
  if (f.key || index < 0) return true;
  const StringRule& rule = schema_->string_rule(index);
  ++work_;
  auto any = [&](uint32_t lo, uint32_t hi) { return rule.any_viable(f.rx, f.length, lo, hi); };
  auto any_of = [&](const std::array<CodeRange, 2>& r) {
    return any(r[0].lo, r[0].hi) || any(r[1].lo, r[1].hi);
  };
  if (before == kStrChar) {
    if ((c & 0xC0) == 0x80) {  // a continuation byte
      f.seen = f.seen << 6 | (c & 0x3F);
      if (f.utf8_left == 0) return rule_takes(f, uint32_t(f.seen));
      return any_of(utf8_ranges(uint32_t(f.seen), f.utf8_left, f.utf8_total));
    }
    if (c >= 0xC0) {  // a lead byte: its payload bits, then what the continuation bytes can make of them
      f.utf8_total = f.utf8_left;
      f.seen = c & (0x7F >> (f.utf8_left + 1));
      return any_of(utf8_ranges(uint32_t(f.seen), f.utf8_left, f.utf8_total));
    }
    if (raw || c != '\\') return rule_takes(f, c);
    return any(0, 0xD7FF) || any(0xE000, RegexDfa::kMaxCodePoint);  // a backslash: any character may follow
  }
  if (before == kStrEscape) return c == 'u' || rule_takes(f, escaped(c));
  if (before == kStrWantBackslash || before == kStrWantU) return true;  // checked with the high half
  // A hex digit of \uXXXX.
  if (before == kStrHex4) {
    if (f.phase == kStrWantBackslash) {  // a high surrogate: the pair's range
      f.high = uint32_t(f.seen);
      return any(supplementary(f.high, 0xDC00), supplementary(f.high, 0xDFFF));
    }
    const uint32_t cp = f.high ? supplementary(f.high, uint32_t(f.seen)) : uint32_t(f.seen);
    f.high = 0;
    return rule_takes(f, cp);
  }
  const int digits = before - kStrHex1 + 1;
  const uint32_t span = uint32_t(1) << (4 * (4 - digits));
  const uint32_t lo = uint32_t(f.seen) * span, hi = lo + span - 1;
  if (f.high)
    return any(supplementary(f.high, std::max(lo, 0xDC00u)), supplementary(f.high, std::min(hi, 0xDFFFu)));
  if (any(lo, std::min(hi, 0xD7FFu)) || any(std::max(lo, 0xE000u), hi)) return true;
  return lo <= 0xDBFF && hi >= 0xD800 &&
         any(supplementary(std::max(lo, 0xD800u), 0xDC00), supplementary(std::min(hi, 0xDBFFu), 0xDFFF));
}

bool JsonMatcher::rule_takes(Frame& f, uint32_t cp) const {
  const StringRule& rule = schema_->string_rule(schema_->node(f.node).string_rule);
  const uint32_t next = rule.next(f.rx, cp);
  if (!rule.viable(next, int64_t(f.length) + 1)) return false;
  f.rx = next;
  ++f.length;
  return true;
}

// A key where other keys are allowed: its text so far is followed in the name trie, to know whether it
// names a property.
void JsonMatcher::follow_key(Frame& f, uint8_t c) const {
  if (f.key && f.trie != kNone) f.trie = step(schema_->names(), f.trie, c);
}

// The first byte of a multi-byte character: well-formed UTF-8 only (no overlongs, no surrogates, nothing
// past U+10FFFF), so the continuation bytes' range is set here.
bool JsonMatcher::utf8_lead(Frame& f, uint8_t c) {
  if (c >= 0xC2 && c <= 0xDF)
    f.utf8_left = 1;
  else if (c == 0xE0)
    f.utf8_left = 2, f.utf8_lo = 0xA0;
  else if (c == 0xED)
    f.utf8_left = 2, f.utf8_hi = 0x9F;
  else if (c >= 0xE1 && c <= 0xEF)
    f.utf8_left = 2;
  else if (c == 0xF0)
    f.utf8_left = 3, f.utf8_lo = 0x90;
  else if (c >= 0xF1 && c <= 0xF3)
    f.utf8_left = 3;
  else if (c == 0xF4)
    f.utf8_left = 3, f.utf8_hi = 0x8F;
  else
    return false;
  return true;
}

// A hex digit of \uXXXX; surrogates only in pairs (parsers reject lone ones).
bool JsonMatcher::escape_hex(Frame& f, uint8_t c) {
  if (!is_hex(c)) return false;
  const uint64_t digit = is_digit(c) ? c - '0' : (c | 0x20) - 'a' + 10;
  f.seen = f.seen * 16 + digit;
  const bool want_low = f.count == 1;  // after a high surrogate: DC00..DFFF
  if (f.phase == kStrHex1 && want_low && digit != 0xD) return false;
  const bool low = f.seen >= 0xDC && f.seen <= 0xDF;
  if (f.phase == kStrHex2 && low != want_low) return false;
  if (f.phase == kStrHex4) {
    f.count = !want_low && f.seen >= 0xD800 && f.seen <= 0xDBFF ? 1 : 0;
    f.phase = f.count ? kStrWantBackslash : kStrChar;
  } else {
    ++f.phase;
  }
  return true;
}

JsonMatcher::Step JsonMatcher::feed_object(State& s, uint8_t c) const {
  Frame& f = s.stack.back();
  const Node& n = schema_->node(f.node);
  const uint64_t all = n.properties.size() == 64 ? ~uint64_t(0) : (uint64_t(1) << n.properties.size()) - 1;
  const bool more_keys = f.open || (f.seen & all) != all;
  const bool may_close = (f.seen & n.required) == n.required;
  auto start_key = [&] {
    Frame k;
    k.node = f.node;
    k.kind = f.open ? Frame::kString : Frame::kName;  // a name: past the quote, which the object consumed
    k.key = f.open;
    k.trie = n.names == kNone ? kNone : schema_->names().child(n.names, '"');
    f.phase = kObjKey;
    s.stack.push_back(k);
    return Step::kTaken;
  };
  auto close = [&] { return may_close && child_done(s) ? Step::kTaken : Step::kReject; };
  switch (f.phase) {
    case kObjOpen:
      if (c == '"' && more_keys) return start_key();
      return c == '}' ? close() : Step::kReject;
    case kObjNext:
      return c == '"' ? start_key() : Step::kReject;
    case kObjColon: {
      if (c != ':') return Step::kReject;
      Frame v;
      v.node = f.key_index >= 0 ? n.properties[size_t(f.key_index)] : n.additional;
      f.phase = kObjValue;
      s.stack.push_back(v);
      return Step::kTaken;
    }
    case kObjAfter:
      if (c == ',' && more_keys) {
        f.phase = kObjNext;
        return Step::kTaken;
      }
      return c == '}' ? close() : Step::kReject;
    default:
      return Step::kReject;
  }
}

JsonMatcher::Step JsonMatcher::feed_array(State& s, uint8_t c) const {
  Frame& f = s.stack.back();
  const size_t at = s.stack.size() - 1;
  const Node& n = schema_->node(f.node);
  if (f.phase != kArrOpen && f.phase != kArrAfter) return Step::kReject;
  if (c == ']' && f.count >= n.min_items) return child_done(s) ? Step::kTaken : Step::kReject;
  const bool more = (n.max_items < 0 || f.count < n.max_items) && fits(schema_->item(n, f.count), at + 1);
  const bool comma = f.phase == kArrAfter;
  if (!more || (comma && c != ',')) return Step::kReject;
  Frame v;
  v.node = schema_->item(n, f.count);
  f.phase = kArrItem;
  s.stack.push_back(v);
  return comma ? Step::kTaken : Step::kPass;  // without a comma, this byte is the first item's
}

// The frame on top becomes function `function`'s arguments: a JSON value, or XML parameters.
void JsonMatcher::start_arguments(State& s, int function) const {
  Frame& f = s.stack.back();
  f.node = schema_->function_root(function);
  if (schema_->call_format() == JsonSchema::CallFormat::kQwenXml) {
    open_xml(f, s.stack.size() - 1);
  } else {
    f.kind = Frame::kValue;
  }
}

// A tool call's function name, followed in the trie of the names as written.
JsonMatcher::Step JsonMatcher::feed_call(State& s, uint8_t c) const {
  Frame& f = s.stack.back();
  const JsonTrie& names = schema_->values();
  const uint32_t next = step(names, f.trie, c);
  if (next == kNone) return Step::kReject;
  f.trie = next;
  if (names.leaf(next)) start_arguments(s, names.tag[next]);  // no name is a prefix of another
  return Step::kTaken;
}

// XML parameters open in the frame at `index`: as open_object, parameters whose value would not fit below
// count as seen.
void JsonMatcher::open_xml(Frame& f, size_t index) const {
  const Node& n = schema_->node(f.node);
  f.kind = Frame::kXmlObject;
  f.phase = kXmlBetween;
  f.trie = n.xml_names;
  f.seen = 0;
  work_ += n.xml_values.size();
  for (size_t p = 0; p < n.xml_values.size(); ++p)
    if (!fits(n.xml_values[p], index + 1)) f.seen |= uint64_t(1) << p;
}

// Each parameter at most once, "</function>" once the required ones are there. Values are JSON, or raw text
// (kXmlText), and end with "\n</parameter>\n".
JsonMatcher::Step JsonMatcher::feed_xml_object(State& s, uint8_t c) const {
  Frame& f = s.stack.back();
  const Node& n = schema_->node(f.node);
  if (f.phase == kXmlEnd) {
    if (uint8_t(kXmlValueEnd[size_t(f.count)]) != c) return Step::kReject;
    if (size_t(++f.count) == kXmlValueEnd.size()) f.phase = kXmlBetween, f.trie = n.xml_names;
    return Step::kTaken;
  }
  if (f.phase != kXmlBetween) return Step::kReject;
  const size_t count = n.xml_values.size();  // the tag of "</function>"
  const uint64_t params = (uint64_t(1) << count) - 1;
  const bool may_close = (f.seen & n.required) == n.required;
  const uint64_t allowed = (~f.seen & params) | (may_close ? uint64_t(1) << count : 0);
  const JsonTrie& names = schema_->names();
  const uint32_t next = step(names, f.trie, c);
  if (next == kNone || !(names.below[next] & allowed)) return Step::kReject;
  f.trie = next;
  if (!names.leaf(next)) return Step::kTaken;
  const int tag = names.tag[next];
  if (size_t(tag) == count) return child_done(s) ? Step::kTaken : Step::kReject;
  f.seen |= uint64_t(1) << tag;
  f.phase = kXmlValue;
  Frame v;
  v.node = n.xml_values[size_t(tag)];
  if (schema_->node(v.node).raw) {
    v.kind = Frame::kXmlText;
    v.phase = kRawChar;
    v.rx = schema_->string_rule(schema_->node(v.node).string_rule).start();
  }
  s.stack.push_back(v);
  return Step::kTaken;
}

// A parameter's raw text. Its rule admits no '<', so the first "\n<" starts its end; a '\n' waits for the
// next byte to tell whether it is the value's.
JsonMatcher::Step JsonMatcher::feed_xml_text(State& s, uint8_t c) const {
  Frame& f = s.stack.back();
  const StringRule& rule = schema_->string_rule(schema_->node(f.node).string_rule);
  if (f.phase == kRawNewline) {
    if (c == '<') {
      ++work_;
      if (!rule.complete(f.rx, f.length)) return Step::kReject;
      return child_done(s) ? Step::kTaken : Step::kReject;
    }
    if (!rule_takes(f, '\n')) return Step::kReject;
    f.phase = kRawChar;
  }
  if (c == '\n' && !f.utf8_left) {
    ++work_;
    if (!rule.complete(f.rx, f.length) && !rule.viable(rule.next(f.rx, '\n'), int64_t(f.length) + 1))
      return Step::kReject;
    f.phase = kRawNewline;
    return Step::kTaken;
  }
  return raw_char(f, c);
}

bool JsonMatcher::feed(State& s, uint8_t c) const {
  ++work_;
  for (;;) {
    const Frame::Kind kind = s.stack.back().kind;
    // Whitespace between tokens of JSON, at most kMaxWhitespaceRun bytes in a row.
    // (None before an XML parameter's value: the parser would keep it in the text.)
    const bool between = (kind == Frame::kRoot && s.stack.back().count == 0) || kind == Frame::kObject ||
                         kind == Frame::kArray ||
                         (kind == Frame::kValue && s.stack[s.stack.size() - 2].kind != Frame::kXmlObject);
    if (is_ws(c) && between) {
      if (s.whitespace_run >= kMaxWhitespaceRun) return false;
      ++s.whitespace_run;
      return true;
    }
    if (!is_ws(c) || kind == Frame::kString) s.whitespace_run = 0;
    Step r = Step::kReject;
    switch (kind) {
      case Frame::kRoot: {  // the value is complete: whitespace, then the schema's suffix, if any
        Frame& root = s.stack.back();
        const std::string& suffix = schema_->suffix();
        if (size_t(root.count) >= suffix.size() || uint8_t(suffix[size_t(root.count)]) != c) return false;
        ++root.count;
        return true;
      }
      case Frame::kValue:
        r = feed_value(s, c);
        break;
      case Frame::kLiteral:
        r = feed_literal(s, c);
        break;
      case Frame::kName:
        r = feed_name(s, c);
        break;
      case Frame::kNumber:
        r = feed_number(s, c);
        break;
      case Frame::kString:
        r = feed_string(s, c);
        break;
      case Frame::kText:
        r = feed_text(s, c);
        break;
      case Frame::kObject:
        r = feed_object(s, c);
        break;
      case Frame::kArray:
        r = feed_array(s, c);
        break;
      case Frame::kCall:
        r = feed_call(s, c);
        break;
      case Frame::kXmlObject:
        r = feed_xml_object(s, c);
        break;
      case Frame::kXmlText:
        r = feed_xml_text(s, c);
        break;
    }
    if (r != Step::kPass) return r == Step::kTaken;
  }
}

}  // namespace moeserve
