#include "engine/json_string.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <string>

namespace moeserve {

StringRule::StringRule(std::shared_ptr<const RegexDfa> dfa, int64_t min_length, int64_t max_length,
                       size_t max_table)
    : dfa_(std::move(dfa)), min_length_(min_length), max_length_(max_length) {
  if (!dfa_ || (min_length_ == 0 && max_length_ < 0)) return;  // liveness alone decides
  const size_t states = dfa_->size();
  horizon_ = max_length_ >= 0 ? max_length_ : min_length_ + int64_t(states);
  const size_t width = size_t(horizon_) + 2;
  if (width > max_table / states)
    throw Error(
        fmt::format("a pattern or format with minLength/maxLength needs more than {} entries of length "
                    "table ({} automaton states x {} lengths)",
                    max_table, states, width));
  // exact[k][q]: q accepts after exactly k more characters, built from k - 1 backwards over the edges.
  std::vector<uint8_t> exact(width * states);
  for (uint32_t q = 0; q < states; ++q) exact[q] = dfa_->accepting(q);
  for (size_t k = 1; k < width - 1; ++k)
    for (uint32_t q = 0; q < states; ++q)
      for (const RegexDfa::Edge& e : dfa_->edges(q))
        if (exact[(k - 1) * states + e.target]) {
          exact[k * states + q] = 1;
          break;
        }
  next_length_.assign(width * states, kNever);
  for (uint32_t q = 0; q < states; ++q)
    for (size_t k = width - 1; k-- > 0;)
      next_length_[q * width + k] = exact[k * states + q] ? uint32_t(k) : next_length_[q * width + k + 1];
}

bool StringRule::viable(uint32_t state, int64_t length) const {
  if (state == RegexDfa::kDead || (max_length_ >= 0 && length > max_length_)) return false;
  if (!dfa_) return true;  // any text: it can always be made long enough
  if (next_length_.empty()) return dfa_->live(state);
  const int64_t from = std::max<int64_t>(0, min_length_ - length);
  const int64_t to = max_length_ >= 0 ? max_length_ - length : horizon_;
  const uint32_t k = next_length_[size_t(state) * size_t(horizon_ + 2) + size_t(from)];
  return k != kNever && int64_t(k) <= to;
}

bool StringRule::complete(uint32_t state, int64_t length) const {
  if (state == RegexDfa::kDead || length < min_length_ || (max_length_ >= 0 && length > max_length_))
    return false;
  return !dfa_ || dfa_->accepting(state);
}

bool StringRule::any_viable(uint32_t state, int64_t length, uint32_t lo, uint32_t hi) const {
  if (lo > hi) return false;
  if (!dfa_) return viable(0, length + 1);
  for (const RegexDfa::Edge& e : dfa_->edges(state))
    if (e.lo <= hi && lo <= e.hi && viable(e.target, length + 1)) return true;
  return false;
}

namespace {

// The formats as whole-text regular expressions, each written to accept exactly what ajv-formats' full mode
// accepts (case-insensitive where it is), except the leap seconds noted at `time`.
std::string format_pattern(std::string_view format) {
  const std::string hex = "[0-9a-fA-F]";
  const std::string digit = "[0-9]";
  // date: real calendar days, February 29 in leap years only (divisible by 4, centuries by 400).
  const std::string leap_year =
      "(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[048]|[2468][048]|[13579][26])00)";
  const std::string date =
      "(?:[0-9]{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|"
      "02-(?:0[1-9]|1[0-9]|2[0-8]))|" +
      leap_year + "-02-29)";
  // time: a zone is required; a leap second only as 23:59:60 in UTC (ajv-formats also takes it at other
  // local times whose offset lands on 23:59 UTC).
  const std::string zone = "(?:[zZ]|[+-](?:[01][0-9]|2[0-3])(?::?[0-5][0-9])?)";
  const std::string time = "(?:(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]+)?" + zone +
                           "|23:59:60(?:\\.[0-9]+)?(?:[zZ]|[+-]00(?::?00)?))";
  if (format == "date") return date;
  if (format == "time") return time;
  if (format == "date-time") return date + "(?:[tT]|\\s)" + time;
  if (format == "uuid")
    return "(?:[uU][rR][nN]:[uU][uU][iI][dD]:)?" + hex + "{8}-(?:" + hex + "{4}-){3}" + hex + "{12}";
  const std::string alnum = "[a-zA-Z0-9]";
  if (format == "email") {
    const std::string atom = "[a-zA-Z0-9!#$%&'*+/=?^_`{|}~-]+";
    const std::string label = alnum + "(?:[a-zA-Z0-9-]*" + alnum + ")?";
    return atom + "(?:\\." + atom + ")*@(?:" + label + "\\.)+" + label;
  }
  // dec-octet as ajv-formats writes it (leading zeros allowed).
  const std::string octet = "(?:25[0-5]|2[0-4][0-9]|[01]?[0-9][0-9]?)";
  const std::string ipv4 = "(?:" + octet + "\\.){3}" + octet;
  if (format == "ipv4")
    return "(?:(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\\.){3}(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]"
           "?[0-9])";
  if (format == "uri") {
    // RFC 3986: scheme ":" hier-part ["?" query] ["#" fragment]; as ajv-formats, an authority may follow a
    // single slash too, and an empty hier-part is not taken.
    const std::string h16 = hex + "{1,4}";
    const std::string ls32 = "(?:" + h16 + ":" + h16 + "|" + ipv4 + ")";
    std::string ipv6 = "(?:(?:" + h16 + ":){6}" + ls32 + "|::(?:" + h16 + ":){5}" + ls32;
    for (int before = 0; before <= 6; ++before) {
      const std::string head = "(?:(?:" + h16 + ":){0," + std::to_string(before) + "}" + h16 + ")?::";
      const int after = 4 - before;
      if (after > 0)
        ipv6 += "|" + head + "(?:" + h16 + ":){" + std::to_string(after) + "}" + ls32;
      else if (after == 0)
        ipv6 += "|" + head + ls32;
      else if (after == -1)
        ipv6 += "|" + head + h16;
      else
        ipv6 += "|" + head;
    }
    ipv6 += ")";
    const std::string unreserved_sub = "a-zA-Z0-9\\-._~!$&'()*+,;=";
    const std::string pct = "%" + hex + "{2}";
    const std::string pchar = "(?:[" + unreserved_sub + ":@]|" + pct + ")";
    const std::string userinfo = "(?:(?:[" + unreserved_sub + ":]|" + pct + ")*@)?";
    const std::string ipfuture = "[vV]" + hex + "+\\.[" + unreserved_sub + ":]+";
    const std::string host =
        "(?:\\[(?:" + ipv6 + "|" + ipfuture + ")\\]|" + ipv4 + "|(?:[" + unreserved_sub + "]|" + pct + ")*)";
    const std::string segments = "(?:/" + pchar + "*)*";
    const std::string hier = "(?:/?/" + userinfo + host + "(?::[0-9]*)?" + segments + "|/(?:" + pchar + "+" +
                             segments + ")?|" + pchar + "+" + segments + ")";
    return "[a-zA-Z][a-zA-Z0-9+\\-.]*:" + hier + "(?:\\?(?:[" + unreserved_sub + ":@/?]|" + pct +
           ")*)?(?:#(?:[" + unreserved_sub + ":@/?]|" + pct + ")*)?";
  }
  return "";
}

}  // namespace

std::shared_ptr<const RegexDfa> format_automaton(std::string_view format) {
  static std::mutex mutex;
  static std::map<std::string, std::shared_ptr<const RegexDfa>, std::less<>> compiled;
  std::lock_guard lock(mutex);
  if (auto it = compiled.find(format); it != compiled.end()) return it->second;
  const std::string pattern = format_pattern(format);
  if (pattern.empty()) return nullptr;
  auto dfa = RegexDfa::compile(pattern, false, 1 << 16);
  compiled.emplace(std::string(format), dfa);
  return dfa;
}

}  // namespace moeserve
