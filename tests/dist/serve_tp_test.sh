#!/usr/bin/env bash
# moeserve serve --tp 2 under mpirun (docs/tp.md): rank 0 answers with the tokens one rank generates alone,
# and a follower killed with SIGKILL takes the group down with a non-zero exit instead of a hang.
# Usage: serve_tp_test.sh MOESERVE_BINARY MPIRUN (run from the source root).
set -euo pipefail
moeserve=$1
mpirun=$2
model=tests/fixtures/models/tiny-moe
command -v curl >/dev/null || { echo "FAIL: curl is missing (scripts/install-deps.sh installs it)"; exit 1; }
work=$(mktemp -d)
cleanup() {
  [[ -n ${pid:-} ]] && kill -9 "$pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# generate logs to stdout too; the ids are its last line.
expected=$("$moeserve" generate --model "$model" --prompt-ids 1,2,3,4 --max-tokens 8 --ignore-eos 2>/dev/null | tail -1)

"$mpirun" --allow-run-as-root --oversubscribe -np 2 "$moeserve" serve --tp 2 --model "$model" --host 127.0.0.1 \
  --port 0 --cache-memory-gb 0.01 >"$work/log" 2>&1 &
pid=$!
for _ in $(seq 600); do
  grep -q "moeserve ready" "$work/log" && break
  kill -0 "$pid" 2>/dev/null || { cat "$work/log"; echo "FAIL: the group exited before it was ready"; exit 1; }
  sleep 0.1
done
url=$(grep -o "url=http://[0-9.:]*" "$work/log" | head -1 | cut -d= -f2)
[[ -n $url ]] || { cat "$work/log"; echo "FAIL: no 'moeserve ready ... url=' line"; exit 1; }

body=$(printf '{"model":"%s","prompt":[1,2,3,4],"max_tokens":8,"temperature":0,"ignore_eos":true,"return_token_ids":true}' "$model")
reply=$(curl -sS -H 'Content-Type: application/json' -d "$body" "$url/v1/completions")
got=$(grep -o '"token_ids":\[[0-9,]*\]' <<<"$reply" | head -1 | sed 's/.*\[\(.*\)\]/\1/')
if [[ $got != "$expected" ]]; then
  cat "$work/log"
  echo "FAIL: TP=2 served tokens [$got], one rank generates [$expected]; reply: $reply"
  exit 1
fi
echo "TP=2 served the single-rank tokens: $got"

# Kill rank 1 (found by the rank Open MPI put in its environment); the whole group must end, non-zero.
killed=0
for child in $(pgrep -P "$pid"); do
  if tr '\0' '\n' <"/proc/$child/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=1"; then
    kill -9 "$child"
    killed=1
  fi
done
[[ $killed == 1 ]] || { echo "FAIL: no rank 1 process under mpirun ($pid)"; exit 1; }
for _ in $(seq 600); do
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
if kill -0 "$pid" 2>/dev/null; then
  cat "$work/log"
  echo "FAIL: the group still runs 60 s after rank 1 died"
  exit 1
fi
set +e
wait "$pid"
rc=$?
set -e
pid=
[[ $rc != 0 ]] || { cat "$work/log"; echo "FAIL: mpirun exited 0 after rank 1 was killed"; exit 1; }
echo "rank 1 killed: the group ended with exit status $rc"
