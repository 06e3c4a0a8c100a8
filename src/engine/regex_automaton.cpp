#include "engine/regex_automaton.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <string>

namespace moeserve {

namespace {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;  // sorted, disjoint, inclusive

constexpr size_t kMaxNfaStates = 20000;  // with the DFA cap, bounds a compile: each DFA state is one closure
constexpr int kMaxRepeat = 1000;  // {n,m} bounds, as many engines cap them

Ranges normalized(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  for (auto [lo, hi] : r) {
    if (!out.empty() && lo <= out.back().second + 1)
      out.back().second = std::max(out.back().second, hi);
    else
      out.emplace_back(lo, hi);
  }
  return out;
}

Ranges complement(const Ranges& r) {
  Ranges out;
  uint32_t next = 0;
  for (auto [lo, hi] : normalized(r)) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= RegexDfa::kMaxCodePoint) out.emplace_back(next, RegexDfa::kMaxCodePoint);
  return out;
}

const Ranges kDigit = {{'0', '9'}};
const Ranges kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
// ECMAScript's WhiteSpace and LineTerminator.
const Ranges kSpace = {{0x09, 0x0D},     {0x20, 0x20},     {0xA0, 0xA0},     {0x1680, 0x1680},
                       {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F},
                       {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
// What '.' does not match.
const Ranges kLineTerminators = {{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}};

// The parsed pattern.
struct Ast {
  enum Kind { kSet, kConcat, kAlt, kRepeat, kBol, kEol };
  Kind kind = kConcat;
  Ranges set;
  std::vector<Ast> children;
  int min = 0, max = -1;  // kRepeat; -1: unbounded
};

class Parser {
 public:
  explicit Parser(std::string_view pattern) {
    for (size_t i = 0; i < pattern.size();) cps_.push_back(decode(pattern, i));
  }

  Ast parse() {
    Ast a = alternation();
    if (at_ < cps_.size()) fail("an unmatched ')'");
    return a;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw Error(fmt::format("the regular expression has {} (at character {})", what, at_));
  }

  static uint32_t decode(std::string_view s, size_t& i) {
    const uint8_t c = uint8_t(s[i]);
    const int extra = c < 0x80             ? 0
                      : (c & 0xE0) == 0xC0 ? 1
                      : (c & 0xF0) == 0xE0 ? 2
                      : (c & 0xF8) == 0xF0 ? 3
                                           : -1;
    if (extra < 0 || s.size() - i <= size_t(extra)) throw Error("the regular expression is not valid UTF-8");
    uint32_t cp = extra == 0 ? c : c & (0x3F >> extra);
    for (int k = 1; k <= extra; ++k) {
      const uint8_t b = uint8_t(s[i + size_t(k)]);
      if ((b & 0xC0) != 0x80) throw Error("the regular expression is not valid UTF-8");
      cp = cp << 6 | (b & 0x3F);
    }
    i += size_t(extra) + 1;
    return cp;
  }

  bool more() const { return at_ < cps_.size(); }
  uint32_t peek(size_t ahead = 0) const { return at_ + ahead < cps_.size() ? cps_[at_ + ahead] : 0xFFFFFFFF; }
  bool eat(uint32_t c) {
    if (peek() != c) return false;
    ++at_;
    return true;
  }

  Ast alternation() {
    Ast alt;
    alt.kind = Ast::kAlt;
    alt.children.push_back(sequence());
    while (eat('|')) alt.children.push_back(sequence());
    return alt.children.size() == 1 ? std::move(alt.children[0]) : alt;
  }

  Ast sequence() {
    Ast seq;
    while (more() && peek() != '|' && peek() != ')') {
      Ast atom_ast = atom();
      quantified(atom_ast);
      seq.children.push_back(std::move(atom_ast));
    }
    return seq;
  }

  // A quantifier after an atom; lazy ones (`*?`) match the same texts.
  void quantified(Ast& a) {
    for (;;) {
      int min = 0, max = -1;
      if (eat('*')) {
      } else if (eat('+')) {
        min = 1;
      } else if (eat('?')) {
        max = 1;
      } else if (peek() == '{' && counted(min, max)) {
      } else {
        return;
      }
      eat('?');
      if (a.kind == Ast::kBol || a.kind == Ast::kEol) fail("a quantified anchor");
      Ast r;
      r.kind = Ast::kRepeat;
      r.min = min, r.max = max;
      r.children.push_back(std::move(a));
      a = std::move(r);
    }
  }

  // {n}, {n,} or {n,m}; anything else leaves `{` a literal (as ECMAScript does outside the u flag).
  bool counted(int& min, int& max) {
    size_t i = at_ + 1;
    auto number = [&](int& out) {
      const size_t from = i;
      long v = 0;
      while (i < cps_.size() && cps_[i] >= '0' && cps_[i] <= '9')
        v = std::min<long>(v * 10 + (cps_[i++] - '0'), 1L << 30);
      out = int(v);
      return i > from;
    };
    if (!number(min)) return false;
    max = min;
    if (i < cps_.size() && cps_[i] == ',') {
      ++i;
      if (!number(max)) max = -1;
    }
    if (i >= cps_.size() || cps_[i] != '}') return false;
    at_ = i + 1;
    if (min > kMaxRepeat || max > kMaxRepeat) fail(fmt::format("a repetition count over {}", kMaxRepeat));
    if (max >= 0 && max < min) fail("a repetition {n,m} with m < n");
    return true;
  }

  static Ast set(Ranges r) {
    Ast a;
    a.kind = Ast::kSet;
    a.set = normalized(std::move(r));
    return a;
  }

  Ast atom() {
    const uint32_t c = cps_[at_++];
    switch (c) {
      case '(': {
        if (eat('?')) {
          if (eat(':')) {
          } else if (peek() == '<' && peek(1) != '=' && peek(1) != '!') {
            while (more() && peek() != '>') ++at_;  // a named group: the name does not matter here
            if (!eat('>')) fail("an unterminated group name");
          } else {
            fail("a lookahead or lookbehind (not a regular language)");
          }
        }
        Ast inner = alternation();
        if (!eat(')')) fail("an unterminated group");
        return inner;
      }
      case ')':
        fail("an unmatched ')'");
      case '[':
        return char_class();
      case '.':
        return set(complement(kLineTerminators));
      case '^': {
        Ast a;
        a.kind = Ast::kBol;
        return a;
      }
      case '$': {
        Ast a;
        a.kind = Ast::kEol;
        return a;
      }
      case '*':
      case '+':
      case '?':
        fail("a quantifier with nothing to repeat");
      case '\\':
        return set(escape(false));
      default:
        return set({{c, c}});
    }
  }

  uint32_t hex(int digits) {
    uint32_t v = 0;
    for (int k = 0; k < digits; ++k) {
      const uint32_t d = peek();
      int x = d >= '0' && d <= '9'                     ? int(d - '0')
              : (d | 0x20) >= 'a' && (d | 0x20) <= 'f' ? int((d | 0x20) - 'a' + 10)
                                                       : -1;
      if (x < 0) fail("a malformed hex escape");
      v = v * 16 + uint32_t(x);
      ++at_;
    }
    return v;
  }

  // After a backslash: the characters it stands for.
  Ranges escape(bool in_class) {
    if (!more()) fail("a trailing backslash");
    const uint32_t c = cps_[at_++];
    switch (c) {
      case 'd':
        return kDigit;
      case 'D':
        return complement(kDigit);
      case 'w':
        return kWord;
      case 'W':
        return complement(kWord);
      case 's':
        return kSpace;
      case 'S':
        return complement(kSpace);
      case 'n':
        return {{'\n', '\n'}};
      case 'r':
        return {{'\r', '\r'}};
      case 't':
        return {{'\t', '\t'}};
      case 'f':
        return {{'\f', '\f'}};
      case 'v':
        return {{'\v', '\v'}};
      case '0':
        if (peek() >= '0' && peek() <= '9') fail("an octal escape");
        return {{0, 0}};
      case 'x': {
        const uint32_t v = hex(2);
        return {{v, v}};
      }
      case 'u': {
        uint32_t v = 0;
        if (eat('{')) {
          while (more() && peek() != '}')
            v = std::min<uint32_t>(v * 16 + hex(1), RegexDfa::kMaxCodePoint + 1);
          if (!eat('}') || v > RegexDfa::kMaxCodePoint) fail("a malformed \\u{...} escape");
        } else {
          v = hex(4);
          // A surrogate pair written as two escapes is one character.
          if (v >= 0xD800 && v <= 0xDBFF && peek() == '\\' && peek(1) == 'u') {
            const size_t back = at_;
            at_ += 2;
            const uint32_t low = hex(4);
            if (low >= 0xDC00 && low <= 0xDFFF)
              v = 0x10000 + ((v - 0xD800) << 10) + (low - 0xDC00);
            else
              at_ = back;
          }
        }
        return {{v, v}};
      }
      case 'b':
        if (in_class) return {{8, 8}};
        fail("a word boundary \\b (not supported)");
      case 'B':
        fail("a word boundary \\B (not supported)");
      case 'c': {
        const uint32_t l = peek() | 0x20;
        if (l < 'a' || l > 'z') fail("a malformed \\c escape");
        ++at_;
        return {{l - 'a' + 1, l - 'a' + 1}};
      }
      case 'p':
      case 'P':
        fail("a Unicode property escape (not supported)");
      default:
        if ((c >= '1' && c <= '9') || c == 'k') fail("a backreference (not a regular language)");
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
          fail(fmt::format("an unknown escape \\{}", char(c)));
        return {{c, c}};
    }
  }

  Ast char_class() {
    const bool negated = eat('^');
    Ranges r;
    for (;;) {
      if (!more()) fail("an unterminated character class");
      if (peek() == ']') break;  // [] matches nothing, [^] anything
      auto single = [&](Ranges& out) {
        const uint32_t c = cps_[at_++];
        out = c == '\\' ? escape(true) : Ranges{{c, c}};
        return out.size() == 1 && out[0].first == out[0].second;
      };
      Ranges lo_set;
      const bool lo_single = single(lo_set);
      if (peek() == '-' && peek(1) != ']' && peek(1) != 0xFFFFFFFF) {
        ++at_;
        Ranges hi_set;
        const bool hi_single = single(hi_set);
        if (!lo_single || !hi_single) fail("a class range with a class escape at one end");
        if (hi_set[0].first < lo_set[0].first) fail("a class range out of order");
        r.emplace_back(lo_set[0].first, hi_set[0].first);
      } else {
        r.insert(r.end(), lo_set.begin(), lo_set.end());
      }
    }
    ++at_;  // ']'
    return set(negated ? complement(r) : normalized(r));
  }

  std::vector<uint32_t> cps_;
  size_t at_ = 0;
};

// Thompson NFA: character edges, plain epsilon edges, and epsilon edges that hold only at the start (^) or
// at the end ($) of the text.
struct Nfa {
  struct State {
    Ranges set;
    int target = -1;  // where `set` leads
    std::vector<int> eps, at_start, at_end;
  };
  std::vector<State> states;

  int add() {
    if (states.size() >= kMaxNfaStates)
      throw Error("the regular expression is too large (repetitions expand it)");
    states.emplace_back();
    return int(states.size()) - 1;
  }

  // Builds `a` between new states; returns (entry, exit).
  std::pair<int, int> build(const Ast& a) {
    const int in = add(), out = add();
    switch (a.kind) {
      case Ast::kSet:
        states[size_t(in)].set = a.set;
        states[size_t(in)].target = out;
        break;
      case Ast::kBol:
        states[size_t(in)].at_start.push_back(out);
        break;
      case Ast::kEol:
        states[size_t(in)].at_end.push_back(out);
        break;
      case Ast::kConcat: {
        int at = in;
        for (const Ast& c : a.children) {
          auto [ci, co] = build(c);
          states[size_t(at)].eps.push_back(ci);
          at = co;
        }
        states[size_t(at)].eps.push_back(out);
        break;
      }
      case Ast::kAlt:
        for (const Ast& c : a.children) {
          auto [ci, co] = build(c);
          states[size_t(in)].eps.push_back(ci);
          states[size_t(co)].eps.push_back(out);
        }
        break;
      case Ast::kRepeat: {
        int at = in;
        for (int k = 0; k < a.min; ++k) {
          auto [ci, co] = build(a.children[0]);
          states[size_t(at)].eps.push_back(ci);
          at = co;
        }
        if (a.max < 0) {
          auto [ci, co] = build(a.children[0]);
          states[size_t(at)].eps.push_back(ci);
          states[size_t(co)].eps.push_back(at);
          states[size_t(at)].eps.push_back(out);
        } else {
          for (int k = a.min; k < a.max; ++k) {
            auto [ci, co] = build(a.children[0]);
            states[size_t(at)].eps.push_back(ci);
            states[size_t(at)].eps.push_back(out);
            at = co;
          }
          states[size_t(at)].eps.push_back(out);
        }
        break;
      }
    }
    return {in, out};
  }
};

}  // namespace

class RegexDfaBuilder {
 public:
  RegexDfaBuilder(Nfa& nfa, int final, size_t max_states)
      : nfa_(nfa), final_(final), max_states_(max_states) {}

  std::shared_ptr<const RegexDfa> run(int start) {
    auto dfa = std::make_shared<RegexDfa>();
    std::vector<int> first = closure({start}, true);
    id_of(first, *dfa);
    for (size_t d = 0; d < sets_.size(); ++d) {
      const std::vector<int> members = sets_[d];
      // The code points where some member's set starts or ends cut the alphabet into intervals that every
      // member treats alike.
      std::vector<uint32_t> cuts;
      for (int s : members)
        for (auto [lo, hi] : nfa_.states[size_t(s)].set) cuts.push_back(lo), cuts.push_back(hi + 1);
      std::sort(cuts.begin(), cuts.end());
      cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
      std::vector<RegexDfa::Edge> edges;
      for (size_t k = 0; k + 1 < cuts.size(); ++k) {
        const uint32_t lo = cuts[k], hi = cuts[k + 1] - 1;
        std::vector<int> targets;
        for (int s : members) {
          const Nfa::State& st = nfa_.states[size_t(s)];
          for (auto [a, b] : st.set)
            if (a <= lo && hi <= b) {
              targets.push_back(st.target);
              break;
            }
        }
        if (targets.empty()) continue;
        const uint32_t t = id_of(closure(targets, false), *dfa);
        if (!edges.empty() && edges.back().target == t && edges.back().hi + 1 == lo)
          edges.back().hi = hi;
        else
          edges.push_back({lo, hi, t});
      }
      dfa->states_[d].edges = std::move(edges);
    }
    RegexDfa::mark_live(*dfa);
    return dfa;
  }

 private:
  std::vector<int> closure(std::vector<int> todo, bool at_start) const {
    std::vector<bool> seen(nfa_.states.size());
    std::vector<int> out;
    while (!todo.empty()) {
      const int s = todo.back();
      todo.pop_back();
      if (seen[size_t(s)]) continue;
      seen[size_t(s)] = true;
      out.push_back(s);
      const Nfa::State& st = nfa_.states[size_t(s)];
      todo.insert(todo.end(), st.eps.begin(), st.eps.end());
      if (at_start) todo.insert(todo.end(), st.at_start.begin(), st.at_start.end());
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  // The text may end here: the final state is reached through epsilon and end-of-text edges.
  bool accepts_at_end(const std::vector<int>& members, bool at_start) const {
    std::vector<int> todo = members;
    std::vector<bool> seen(nfa_.states.size());
    while (!todo.empty()) {
      const int s = todo.back();
      todo.pop_back();
      if (s == final_) return true;
      if (seen[size_t(s)]) continue;
      seen[size_t(s)] = true;
      const Nfa::State& st = nfa_.states[size_t(s)];
      todo.insert(todo.end(), st.eps.begin(), st.eps.end());
      todo.insert(todo.end(), st.at_end.begin(), st.at_end.end());
      if (at_start) todo.insert(todo.end(), st.at_start.begin(), st.at_start.end());
    }
    return false;
  }

  uint32_t id_of(std::vector<int> members, RegexDfa& dfa) {
    auto [it, fresh] = ids_.try_emplace(members, uint32_t(sets_.size()));
    if (fresh) {
      if (sets_.size() >= max_states_)
        throw Error(fmt::format("the regular expression needs more than {} automaton states", max_states_));
      dfa.states_.emplace_back();
      dfa.states_.back().accepting = accepts_at_end(members, sets_.empty());
      sets_.push_back(std::move(members));
    }
    return it->second;
  }

  Nfa& nfa_;
  int final_;
  size_t max_states_;
  std::map<std::vector<int>, uint32_t> ids_;
  std::vector<std::vector<int>> sets_;
};

void RegexDfa::mark_live(RegexDfa& dfa) {
  std::vector<std::vector<uint32_t>> into(dfa.states_.size());
  std::vector<uint32_t> todo;
  for (uint32_t s = 0; s < dfa.states_.size(); ++s) {
    for (const auto& e : dfa.states_[s].edges) into[e.target].push_back(s);
    if (dfa.states_[s].accepting) dfa.states_[s].live = true, todo.push_back(s);
  }
  while (!todo.empty()) {
    const uint32_t s = todo.back();
    todo.pop_back();
    for (uint32_t p : into[s])
      if (!dfa.states_[p].live) dfa.states_[p].live = true, todo.push_back(p);
  }
}

namespace {

// The end of the group that starts at `open` ('('), past escapes and classes; npos if it does not close.
size_t group_end(std::string_view p, size_t open) {
  int depth = 0;
  bool in_class = false;
  for (size_t i = open; i < p.size(); ++i) {
    if (p[i] == '\\') {
      ++i;
    } else if (in_class) {
      in_class = p[i] != ']';
    } else if (p[i] == '[') {
      in_class = true;
    } else if (p[i] == '(') {
      ++depth;
    } else if (p[i] == ')' && --depth == 0) {
      return i;
    }
  }
  return std::string_view::npos;
}

}  // namespace

std::shared_ptr<const RegexDfa> RegexDfa::intersect(const RegexDfa& a, const RegexDfa& b, bool without,
                                                    size_t max_states) {
  auto out = std::make_shared<RegexDfa>();
  std::map<std::pair<uint32_t, uint32_t>, uint32_t> ids;
  std::vector<std::pair<uint32_t, uint32_t>> pairs;  // kDead as b's state: b can no longer accept
  auto id = [&](uint32_t qa, uint32_t qb) {
    auto [it, fresh] = ids.try_emplace({qa, qb}, uint32_t(pairs.size()));
    if (fresh) {
      if (pairs.size() >= max_states)
        throw Error(fmt::format("the regular expression needs more than {} automaton states", max_states));
      pairs.emplace_back(qa, qb);
      const bool b_accepts = qb != kDead && b.accepting(qb);
      out->states_.emplace_back();
      out->states_.back().accepting = a.accepting(qa) && (without ? !b_accepts : b_accepts);
    }
    return it->second;
  };
  id(a.start(), b.start());
  static const std::vector<Edge> kNoEdges;
  for (size_t k = 0; k < pairs.size(); ++k) {
    const auto [qa, qb] = pairs[k];
    std::vector<Edge> edges;
    auto add = [&](uint32_t lo, uint32_t hi, uint32_t ta, uint32_t tb) {
      const uint32_t t = id(ta, tb);
      if (!edges.empty() && edges.back().target == t && edges.back().hi + 1 == lo)
        edges.back().hi = hi;
      else
        edges.push_back({lo, hi, t});
    };
    const std::vector<Edge>& eb = qb == kDead ? kNoEdges : b.edges(qb);
    for (const Edge& x : a.edges(qa)) {
      // x's range cut where b's edges start and end: b's target inside them, kDead (only `without`) between.
      uint32_t at = x.lo;
      for (const Edge& y : eb) {
        if (y.hi < at) continue;
        if (y.lo > x.hi) break;
        if (y.lo > at && without) add(at, y.lo - 1, x.target, kDead);
        const uint32_t hi = std::min(x.hi, y.hi);
        add(std::max(at, y.lo), hi, x.target, y.target);
        at = hi + 1;
        if (at > x.hi) break;
      }
      if (without && at <= x.hi) add(at, x.hi, x.target, kDead);
    }
    out->states_[k].edges = std::move(edges);
  }
  mark_live(*out);
  return out;
}

std::shared_ptr<const RegexDfa> RegexDfa::compile(std::string_view pattern, bool search, size_t max_states) {
  if (search && pattern.size() > 3 && pattern.substr(0, 3) == "^(?" &&
      (pattern[3] == '=' || pattern[3] == '!')) {
    // Leading lookaheads: the rest of the pattern, intersected with (or without) the texts each matches a
    // prefix of.
    struct Look {
      std::string_view inner;
      bool negative;
    };
    std::vector<Look> looks;
    size_t at = 1;
    while (pattern.substr(at, 3) == "(?=" || pattern.substr(at, 3) == "(?!") {
      const size_t end = group_end(pattern, at);
      if (end == std::string_view::npos) throw Error("the regular expression has an unterminated lookahead");
      looks.push_back({pattern.substr(at + 3, end - at - 3), pattern[at + 2] == '!'});
      at = end + 1;
    }
    auto dfa = compile("^" + std::string(pattern.substr(at)), true, max_states);
    for (const Look& l : looks) {
      auto prefix = compile("^(?:" + std::string(l.inner) + ")", true, max_states);
      dfa = intersect(*dfa, *prefix, l.negative, max_states);
    }
    return dfa;
  }
  const Ast ast = Parser(pattern).parse();
  Nfa nfa;
  auto [in, out] = nfa.build(ast);
  int start = in, final = out;
  if (search) {  // any text around the match: a loop over every character at each end
    start = nfa.add();
    nfa.states[size_t(start)].set = {{0, kMaxCodePoint}};
    nfa.states[size_t(start)].target = start;
    nfa.states[size_t(start)].eps.push_back(in);
    final = nfa.add();
    nfa.states[size_t(out)].eps.push_back(final);
    const int loop = nfa.add();
    nfa.states[size_t(final)].eps.push_back(loop);
    nfa.states[size_t(loop)].set = {{0, kMaxCodePoint}};
    nfa.states[size_t(loop)].target = final;
  }
  return RegexDfaBuilder(nfa, final, max_states).run(start);
}

uint32_t RegexDfa::next(uint32_t state, uint32_t cp) const {
  const std::vector<Edge>& e = states_[state].edges;
  auto it = std::upper_bound(e.begin(), e.end(), cp, [](uint32_t c, const Edge& x) { return c < x.lo; });
  if (it == e.begin()) return kDead;
  --it;
  return cp <= it->hi ? it->target : kDead;
}

}  // namespace moeserve
