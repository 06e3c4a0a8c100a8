#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/, clang with ASan + UBSan) into build-fuzz/ and runs them one at a
# time, at nice 19 (never in parallel: the machine is shared).
#
#   scripts/fuzz.sh --runs N [TARGET...]     N executions per target from a fixed seed, in a fresh scratch
#                                            corpus, stopping at the first finding: the same run every time
#                                            (CI, scripts/test.sh)
#   scripts/fuzz.sh --seconds S [TARGET...]  S seconds per target (default 300) that go on past findings (in a
#                                            child process, -fork=1), keeping new inputs in
#                                            build-fuzz/corpus/TARGET for the next run
#
# Targets: the *_fuzz.cpp of tests/fuzz/ (all by default). Each starts from tests/fuzz/corpus/TARGET and its
# dictionary tests/fuzz/TARGET.dict. A finding (crash, sanitizer report, broken FUZZ_CHECK, out-of-memory,
# timeout) is written to build-fuzz/findings/TARGET/, listed by kind, and makes the script fail. To keep one
# as a regression input (the replay test in the normal build then fails until it is fixed):
#   build-fuzz/TARGET_fuzz -minimize_crash=1 -runs=20000 -exact_artifact_path=build-fuzz/minimized \
#     build-fuzz/findings/TARGET/crash-...
#   cp build-fuzz/minimized tests/fuzz/corpus/TARGET/<what-it-shows>
# The committed corpus stays small (seeds, the attack classes, reproducers); what a long run covers beyond it
# (hundreds of inputs) is listed by -merge=1 into an empty folder, to pick from:
#   build-fuzz/TARGET_fuzz -merge=1 EMPTY_DIR tests/fuzz/corpus/TARGET build-fuzz/corpus/TARGET
set -euo pipefail
cd "$(dirname "$0")/.."

mode=seconds
amount=300
case "${1:-}" in
  --runs) mode=runs amount=${2:?--runs needs a count}; shift 2 ;;
  --seconds) mode=seconds amount=${2:?--seconds needs a duration}; shift 2 ;;
esac
targets=("$@")
if ((${#targets[@]} == 0)); then
  for source in tests/fuzz/*_fuzz.cpp; do targets+=("$(basename "$source" _fuzz.cpp)"); done
fi

CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOESERVE_FUZZ=ON \
  -DMOESERVE_BUILD_TESTS=OFF -DMOESERVE_BUILD_BENCH=OFF >/dev/null
cmake --build build-fuzz --target "${targets[@]/%/_fuzz}"

export UBSAN_OPTIONS=print_stacktrace=1
shopt -s nullglob
# A finding is an input that took more than a minute or 2 GB, besides a crash.
limits=(-timeout=60 -rss_limit_mb=2048)
failed=()
summary=()
for target in "${targets[@]}"; do
  # Request-sized inputs where nesting and width matter; less for the binary formats and where the cost
  # grows with the length (the tokenizer, the output parsers; the matcher copies its stack per byte it tries).
  case $target in
    safetensors | tokenizer | json_schema | output_parser) max_len=4096 ;;
    *) max_len=65536 ;;
  esac
  findings=build-fuzz/findings/$target
  rm -rf "$findings"
  mkdir -p "$findings"
  options=("${limits[@]}" -max_len="$max_len" -print_final_stats=1 -artifact_prefix="$findings/")
  if [[ -f tests/fuzz/$target.dict ]]; then options+=(-dict="tests/fuzz/$target.dict"); fi
  if [[ $mode == runs ]]; then
    scratch=build-fuzz/corpus-runs/$target
    rm -rf "$scratch"
    options+=(-runs="$amount" -seed=1)
  else
    scratch=build-fuzz/corpus/$target
    options+=(-max_total_time="$amount" -fork=1 -ignore_crashes=1 -ignore_ooms=1 -ignore_timeouts=1)
  fi
  mkdir -p "$scratch"
  log=$findings/fuzz.log
  echo "fuzz: $target ($mode $amount)"
  started=$SECONDS
  # New inputs go to the first folder (the scratch one); the committed corpus is only read.
  fuzzer=build-fuzz/${target}_fuzz
  nice -n 19 "$fuzzer" "${options[@]}" "$scratch" "tests/fuzz/corpus/$target" >"$log" 2>&1 || true
  # Executions: the final stats of a plain run, the last status line of a forked one.
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  [[ -n $runs ]] || runs=$(grep -o '^#[0-9]*' "$log" | tail -1 | tr -d '#')
  found=("$findings"/{crash,leak,oom,timeout,slow-unit}-*)
  result=ok
  if ((${#found[@]})); then
    result="${#found[@]} FINDINGS"
    failed+=("$target")
    # One line per kind of finding (the broken promise or the sanitizer's summary, told apart by their words
    # rather than the numbers and quoted values in them), with one input that shows it.
    for input in "${found[@]}"; do
      what=$(nice -n 19 "$fuzzer" "${limits[@]}" -exact_artifact_path=/dev/null "$input" 2>&1 |
        grep -E -m 1 'what\(\):|SUMMARY:|ERROR: libFuzzer' | cut -c 1-200 || true)
      what=${what:-no longer reproduces}
      echo "$(sed -E "s/'[^']*'?/''/g; s/[0-9][-+.0-9a-zA-Z]*/N/g" <<<"$what")|$what|$input"
    done | sort -t '|' -k 1,1 -u | cut -d '|' -f 2- | sed 's/|/\n    /'
  fi
  summary+=("$(printf '%-16s %10s runs %6ss  +%s inputs  %s' "$target" "${runs:-?}" $((SECONDS - started)) \
    "$(find "$scratch" -type f | wc -l)" "$result")")
done
printf 'fuzz: %s\n' "${summary[@]}"
if ((${#failed[@]})); then
  echo "fuzz: findings in ${failed[*]}: build-fuzz/findings/TARGET/ has the inputs and the log" >&2
  exit 1
fi
