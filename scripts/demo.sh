#!/usr/bin/env bash
# Set up (or reuse) .venv, then run eomsg end to end on the embedded default:
# create a queue, publish (one, a duplicate, a batch), consume, inspect; then serve the
# data directory and fail over an exclusive queue from a killed consumer to its standby;
# last, replay the orders through Spark into Parquet, twice (the second run does nothing).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
bash scripts/java.sh >/dev/null   # Spark (the replay at the end) needs Java 17+
export EOMSG_DATA="${EOMSG_DATA:-$(mktemp -d)/eomsg-data}"
# Each command is shown as it could be typed again: a word with shell characters quoted.
shown() {
  local a
  for a in "$@"; do
    if [[ $a =~ ^[A-Za-z0-9_./:=@%+,-]+$ ]]; then printf ' %s' "$a"
    else printf " '%s'" "${a//\'/\'\\\'\'}"; fi
  done
}
run() { printf '\n$'; shown "$@"; printf '\n'; "$@"; }
run eomsg --init queue create orders --subscribe 'orders/>' --max-redeliveries 5 --dead-letter orders-dlq
run eomsg publish orders/eu/new '{"order": 1}' --id order-1 --ttl 1h
run eomsg publish orders/eu/new '{"order": 1}' --id order-1
printf '\n$ seq 1000 | eomsg publish orders/us/new --stdin\n'
seq 1000 | eomsg publish orders/us/new --stdin
run eomsg consume orders --max 3 --json
run eomsg consume orders --max 2 --exec 'echo "handled $EOMSG_SEQ: $(cat)"'
run eomsg inspect queues
run eomsg inspect log --topic 'orders/>' --from-seq 10 --limit 5
run eomsg inspect sql "SELECT topic, count(*) AS messages FROM messages GROUP BY 1 ORDER BY 1"

# -- an exclusive queue through a node: one consumer active, one on standby -------------
lines() { { wc -l < "$1"; } 2>/dev/null || echo 0; }
wait_lines() { for _ in $(seq 100); do [ "$(lines "$1")" -ge "$2" ] && return; sleep 0.1; done; }
run eomsg queue create billing --subscribe 'billing/>' --max-active 1
printf '
$ eomsg serve &   # then two `eomsg consume billing --follow --json` in the background
'
eomsg serve --json > "$EOMSG_DATA/../serve.out" &
SERVE=$!
trap 'kill $SERVE 2>/dev/null || true' EXIT
wait_lines "$EOMSG_DATA/../serve.out" 1
eomsg consume billing --follow --json > "$EOMSG_DATA/../first.out" &
FIRST=$!
wait_lines "$EOMSG_DATA/../first.out" 1
eomsg consume billing --follow --json > "$EOMSG_DATA/../second.out" &
SECOND=$!
wait_lines "$EOMSG_DATA/../second.out" 1
run eomsg publish billing/invoice '{"invoice": 1}'
wait_lines "$EOMSG_DATA/../first.out" 2
run eomsg inspect flows billing
printf '
$ kill -9 <the active consumer>
'
kill -9 $FIRST
wait $FIRST 2>/dev/null || true
run eomsg publish billing/invoice '{"invoice": 2}'
wait_lines "$EOMSG_DATA/../second.out" 3
printf '
# what the first consumer printed:
'; cat "$EOMSG_DATA/../first.out"
printf '
# what the standby printed:
'; cat "$EOMSG_DATA/../second.out"
kill $SECOND; wait $SECOND 2>/dev/null || true
kill $SERVE; wait $SERVE 2>/dev/null || true

# -- replay history through Spark, exactly once ----------------------------------------
OUT="$EOMSG_DATA/../replayed"
run eomsg spark-replay --topic 'orders/>' --sink "parquet:$OUT" --job-id demo-1 --dry-run
run eomsg spark-replay --topic 'orders/>' --sink "parquet:$OUT" --job-id demo-1 --json
run eomsg spark-replay --topic 'orders/>' --sink "parquet:$OUT" --job-id demo-1 --json
run eomsg inspect sql "SELECT job_id, status, rows FROM replay_jobs ORDER BY recorded_at"
printf '\ndata directory: %s\n' "$EOMSG_DATA"
