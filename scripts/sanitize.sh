#!/usr/bin/env bash
# Builds the CPU tree with sanitizers and runs the suite there (ctest), for what the normal build cannot see.
#
#   scripts/sanitize.sh [CTEST ARGS...]                   ASan + UBSan into build-asan/, e.g. -R Jinja
#   SANITIZE=thread scripts/sanitize.sh [CTEST ARGS...]   TSan into build-tsan/, e.g. -L "server|router"
#
# ASan + UBSan: memory errors and undefined behaviour that happen to work. It also compiles with
# -funsigned-char, as char is on aarch64 (the DGX Spark's host), so code that only works where char is signed
# fails here too. TSan: data races between the threads of the server, the router, the load generator and the
# thread pool (the dist suites are left out: Open MPI is not instrumented).
#
# Not part of scripts/test.sh: another full build (~35 min on 2 cores), and the suite runs 2-5x slower. Run
# it after changes to parsing, memory ownership or threading. -O1: enough for the sanitizers to see real code,
# and the reports keep their lines. UBSan halts on its first report and TSan exits non-zero after reporting, so
# a report fails its test.
set -euo pipefail
cd "$(dirname "$0")/.."

case ${SANITIZE:-address} in
  address)
    dir=build-asan
    flags="-fsanitize=address,undefined -fno-omit-frame-pointer -funsigned-char"
    ;;
  thread)
    dir=build-tsan
    flags="-fsanitize=thread -fno-omit-frame-pointer"
    ;;
  *)
    echo "SANITIZE is address or thread, not '$SANITIZE'" >&2
    exit 2
    ;;
esac
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOESERVE_BUILD_BENCH=OFF \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1" \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_C_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" \
  -DCMAKE_SHARED_LINKER_FLAGS="$flags" >/dev/null
cmake --build "$dir" -j "$(nproc)"

export ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export TSAN_OPTIONS="second_deadlock_stack=1 suppressions=$PWD/scripts/tsan.supp"
# Tests without a TIMEOUT of their own get an hour: the slowest (ServeDemo.RandomWeightsAnswersValidateWithAjv,
# ~6 min in the normal build) takes ~3x that here. The multi-process suites also time out under load at this
# speed (the hostile suite's router ejects nodes that answer its health checks late), so what fails is run
# once more on its own: what fails then is a finding, and the first run's output is above it either way.
run() {
  ctest --test-dir "$dir" --output-on-failure -j "$(nproc)" --timeout 3600 "$@" ||
    ctest --test-dir "$dir" --output-on-failure --timeout 3600 --rerun-failed
}
# Open MPI's plugins (the dist suites' mpirun processes) leak at exit, in frames LeakSanitizer cannot name to
# suppress: those suites run with leak detection off, everything else with it on.
status=0
run -LE dist "$@" || status=$?
if [ "$dir" = build-asan ]; then ASAN_OPTIONS=detect_leaks=0 run -L dist "$@" || status=$?; fi
exit $status
