#!/usr/bin/env bash
# Set up (or reuse) .venv, then run eomsg end to end on the embedded default:
# create a queue, publish (one, a duplicate, a batch), consume, inspect.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
export EOMSG_DATA="${EOMSG_DATA:-$(mktemp -d)/eomsg-data}"
run() { printf '\n$ %s\n' "$*"; "$@"; }
run eomsg queue create orders --subscribe 'orders/>' --max-redeliveries 5 --dead-letter orders-dlq
run eomsg publish orders/eu/new '{"order": 1}' --id order-1 --ttl 1h
run eomsg publish orders/eu/new '{"order": 1}' --id order-1
printf '\n$ seq 1000 | eomsg publish orders/us/new --stdin\n'
seq 1000 | eomsg publish orders/us/new --stdin
run eomsg consume orders --max 3 --json
run eomsg consume orders --max 2 --exec 'echo "handled $EOMSG_SEQ: $(cat)"'
run eomsg inspect queues
run eomsg inspect log --topic 'orders/>' --from-seq 10 --limit 5
run eomsg inspect sql "SELECT topic, count(*) AS messages FROM messages GROUP BY 1 ORDER BY 1"
printf '\ndata directory: %s\n' "$EOMSG_DATA"
