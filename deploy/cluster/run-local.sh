#!/usr/bin/env bash
# Try a cluster on one machine: one etcd and three Shoal nodes, each with its
# own ports and data directory under $DIR (default /tmp/shoal-cluster). MQTT
# on 1881-1883 and over WebSocket on 15771-15773 (any node: followers pipe to
# the leader, docs/mqtt.md).
#
#   deploy/cluster/run-local.sh            # AMQP on 5681, 5682, 5683
#   shoal ctl --port 5681 cluster_status
#   kill -9 <the leader's pids>            # a follower takes over in ~5 s
#
# Ctrl-C stops the nodes and etcd. Needs etcd (apt-get install etcd-server).
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR=${DIR:-/tmp/shoal-cluster}
SHOAL=${SHOAL:-.venv/bin/shoal}
[ -x "$SHOAL" ] || { make .venv/.installed >/dev/null; SHOAL=.venv/bin/shoal; }
command -v etcd >/dev/null || { echo "etcd is not installed: apt-get install -y etcd-server" >&2; exit 1; }
mkdir -p "$DIR"
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; }
trap cleanup EXIT INT TERM

etcd --name shoal-try --data-dir "$DIR/etcd" \
  --listen-client-urls http://127.0.0.1:2389 --advertise-client-urls http://127.0.0.1:2389 \
  --listen-peer-urls http://127.0.0.1:2390 --initial-advertise-peer-urls http://127.0.0.1:2390 \
  --initial-cluster shoal-try=http://127.0.0.1:2390 >"$DIR/etcd.log" 2>&1 &
pids+=($!)

# A new cluster is created explicitly: without its record in etcd no node
# leads (docs/cluster.md, "Creating a cluster"). Retried while etcd starts.
for _ in $(seq 1 50); do
  "$SHOAL" cluster-init --cluster-etcd http://127.0.0.1:2389 --cluster-name try && break
  sleep 0.2
done

for i in 1 2 3; do
  "$SHOAL" --bind 127.0.0.1 --port 568$i --workers 1 \
    --runtime-dir "$DIR/node$i-run" --data-dir "$DIR/node$i-data" \
    --metrics-port 1569$i --management-port 1567$i --mqtt-port 188$i --mqtt-ws-port 1577$i \
    --cluster-etcd http://127.0.0.1:2389 --cluster-name try \
    --cluster-port 569$i --cluster-advertise 127.0.0.1:569$i >"$DIR/node$i.log" 2>&1 &
  pids+=($!)
done
echo "etcd on 127.0.0.1:2389; nodes on AMQP ports 5681 5682 5683 (logs in $DIR)"
echo "shoal ctl --port 5681 --runtime-dir $DIR/node1-run cluster_status"
wait
