#pragma once
// Number bounds of structured output (minimum, maximum, exclusiveMinimum, exclusiveMaximum), decided exactly
// on the number's text as the model writes it. A prefix ("-", "1e", "12.") is accepted only while some JSON
// number that starts with it is in bounds, and a number ends only in bounds, so decoding can neither walk
// into a number it cannot finish nor finish one out of range. Values are exact decimals, so a bound holds for
// numbers of any length ("0.30000000000000000001" > 0.3); JSON Schema validators that compare doubles differ
// only past 17 significant digits.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace moeserve {

// sign * 0.digits * 10^exponent; digits has no leading or trailing zeros (empty: the value is zero).
// Exponents saturate at +-kMaxExponent: past that, nothing a schema's bound can tell apart.
struct Decimal {
  static constexpr int64_t kMaxExponent = int64_t{1} << 50;
  bool negative = false;
  std::string digits;
  int64_t exponent = 0;

  bool zero() const { return digits.empty(); }
  // A JSON number's whole text; nullopt if it is not one.
  static std::optional<Decimal> parse(std::string_view text);
};

// -1, 0, 1 as a < b, a == b, a > b.
int compare(const Decimal& a, const Decimal& b);

// An interval of numbers; an absent end is unbounded. For an integer schema the ends are the first and last
// integers inside the bounds (closed), so that every test below is about integers.
struct NumberBounds {
  std::optional<Decimal> lo, hi;
  bool lo_open = false, hi_open = false;
  bool integer = false;
  // multipleOf = multiple * 10^-scale (multiple 0: none), decided exactly on the decimal text: a number is
  // a multiple when it has at most `scale` decimals and its value in units of 10^-scale divides by
  // `multiple` (0.07 is a multiple of 0.01, where 0.07 / 0.01 is 7.000000000000001 in doubles). A whole step
  // (scale 0) goes with integer schemas only (a number schema becomes one); a fractional step's numbers are
  // written without an exponent and with at most `scale` decimals, as JSON.stringify writes them. Magnitudes
  // in units stay below max_units(): for whole steps where a double holds every integer exactly, for
  // fractional ones where a double's quotient v / step is within 1e-3 of the exact one, so a validator that
  // divides with a tolerance (ajv's multipleOfPrecision, pydantic's) agrees with the exact answer.
  int64_t multiple = 0;
  int scale = 0;
  static constexpr int64_t kMaxStepMagnitude = 999'999'999'999'999;
  static constexpr int64_t kMaxFractionUnits = 999'999'999;
  static constexpr int kMaxStepScale = 6;  // JSON.stringify writes 1e-7 with an exponent
  int64_t max_units() const { return scale == 0 ? kMaxStepMagnitude : kMaxFractionUnits; }

  // Throws nothing; for an integer schema the ends are moved to the integers inside (an open 3 is 4).
  static NumberBounds make(std::optional<Decimal> lo, bool lo_open, std::optional<Decimal> hi, bool hi_open,
                           bool integer);
  bool contains(const Decimal& v) const;
  // Some number (an integer, if `integer`) whose JSON text starts with `prefix` is inside. The prefix is one
  // the number grammar allows (integers: an optional '-' and digits).
  bool viable(std::string_view prefix) const;
  // No number (no integer, no multiple) is inside: a schema error.
  bool empty() const;

 private:
  bool multiple_viable(std::string_view prefix) const;
  // An end of the bounds in units of 10^-scale, rounded inwards and clamped to +-max_units().
  int64_t units_end(const std::optional<Decimal>& end, bool open, bool upper) const;
};

}  // namespace moeserve
