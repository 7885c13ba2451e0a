#!/usr/bin/env bash
# make docker-smoke: build the image, bring the compose stack up, enqueue and dequeue through
# the published port, restart the stack, check the data survived, tear everything down.
#
# Engine and base image: docker/compose-engine.sh (Docker with the compose plugin when a
# daemon answers, else rootful podman with podman-compose; DQ_BASE_IMAGE when set, else a
# local Debian image made once by docker/base-image.sh and reused afterwards).
# SMOKE_SPARK=1 also builds the Spark image and runs the worked job (profile `spark`).
# Every wait is bounded; an EXIT trap removes the stack and its volume; images stay cached.
set -euo pipefail

cd "$(dirname "$0")/.."
root="$PWD"
project="${SMOKE_PROJECT:-dq-smoke}"
compose_file="$root/docker/docker-compose.yml"
health_timeout_s="${SMOKE_HEALTH_TIMEOUT_S:-120}"
py="$root/.venv/bin/python"
[ -x "$py" ] || py="$(command -v python3)"
t_start=$SECONDS
passed=0

log() { printf 'docker-smoke [%3ds] %s\n' "$((SECONDS - t_start))" "$*"; }
ok() { passed=$((passed + 1)); log "ok: $*"; }
fail() { log "FAILED: $*"; exit 1; }

# ---- engine and base image (docker/compose-engine.sh) --------------------------------------
source "$root/docker/compose-engine.sh"
compose+=(-p "$project" -f "$compose_file")
log "engine: $engine ($("$engine" --version)); compose: ${compose[0]##*/}"

# ---- images -----------------------------------------------------------------------------
export DQ_IMAGE="${DQ_IMAGE:-localhost/deadline-queue:smoke}"
export DQ_SPARK_IMAGE="${DQ_SPARK_IMAGE:-localhost/deadline-queue-spark:smoke}"
export DQ_PUBLISH_ADDR=127.0.0.1
DQ_PUBLISH_PORT="$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
export DQ_PUBLISH_PORT
base_url="http://127.0.0.1:$DQ_PUBLISH_PORT"
state="$(mktemp /tmp/dq-smoke.XXXXXX)"

teardown() {
    local rc=$?
    trap - EXIT
    if [ "$rc" -ne 0 ]; then
        log "logs of the failed run:"
        timeout 60 "${compose[@]}" logs --tail 60 dq 2>&1 | tail -n 60 || true
    fi
    log "tearing down (stack and volume)"
    timeout 180 "${compose[@]}" --profile spark down -v -t 45 >/dev/null 2>&1 || true
    rm -f "$state"
    if [ "$rc" -eq 0 ]; then
        log "done in $((SECONDS - t_start)) s"
        echo "docker-smoke: $passed passed, 0 failed"
    else
        echo "docker-smoke: $passed passed, 1 failed"
    fi
    exit "$rc"
}
trap teardown EXIT
trap 'exit 130' INT TERM

# A previous run that was killed may have left its stack behind.
timeout 180 "${compose[@]}" --profile spark down -v -t 5 >/dev/null 2>&1 || true

log "building $DQ_IMAGE from $DQ_BASE_IMAGE"
timeout 1200 "${compose[@]}" build dq >/tmp/dq-smoke-build.log 2>&1 \
    || { tail -n 40 /tmp/dq-smoke-build.log; fail "image build (log: /tmp/dq-smoke-build.log)"; }
ok "image built"
user="$("$engine" image inspect "$DQ_IMAGE" --format '{{.Config.User}}')"
[ -n "$user" ] && [ "$user" != root ] && [ "$user" != 0 ] || fail "image runs as root ($user)"
ok "image runs as non-root user '$user'"

# Both compose implementations label their containers with project and service.
container_id() {
    "$engine" ps -a -q --filter "label=com.docker.compose.project=$project" \
        --filter label=com.docker.compose.service=dq | head -n 1
}

# Bounded wait for the health check. podman without systemd never runs health checks on its
# own, so on podman we run the image's check ourselves; docker reports its own status.
wait_healthy() {
    local cid deadline=$((SECONDS + health_timeout_s))
    cid="$(container_id)"
    [ -n "$cid" ] || fail "no dq container"
    while [ "$SECONDS" -lt "$deadline" ]; do
        [ "$("$engine" inspect -f '{{.State.Running}}' "$cid")" = true ] \
            || fail "dq container exited ($("$engine" inspect -f '{{.State.ExitCode}}' "$cid"))"
        if [ "$engine" = podman ]; then
            podman healthcheck run "$cid" >/dev/null 2>&1 && return 0
        else
            [ "$(docker inspect -f '{{.State.Health.Status}}' "$cid")" = healthy ] && return 0
        fi
        sleep 1
    done
    fail "dq not healthy after ${health_timeout_s} s"
}

up() {
    timeout 300 "${compose[@]}" up -d dq >/tmp/dq-smoke-up.log 2>&1 \
        || { cat /tmp/dq-smoke-up.log; fail "compose up"; }
    wait_healthy
}

up
ok "stack up and healthy on $base_url"
"$py" "$root/docker/smoke_check.py" before "$base_url" "$state" || fail "checks before restart"
ok "enqueue, dequeue and release through the published port"

cid="$(container_id)"
t_stop=$SECONDS
timeout 120 "${compose[@]}" stop -t 45 dq >/dev/null 2>&1 || fail "compose stop"
code="$("$engine" inspect -f '{{.State.ExitCode}}' "$cid")"
[ "$code" = 0 ] || fail "dq exited $code on SIGTERM (expected 0)"
ok "SIGTERM: dq exited 0 after $((SECONDS - t_stop)) s"

timeout 180 "${compose[@]}" down -t 45 >/dev/null 2>&1 || fail "compose down"
up
[ "$(container_id)" != "$cid" ] || fail "the container was not recreated"
ok "stack recreated (new container, same volume) and healthy"
"$py" "$root/docker/smoke_check.py" after "$base_url" "$state" || fail "checks after restart"
ok "data survived the restart"

if [ "${SMOKE_SPARK:-0}" = 1 ]; then
    log "building $DQ_SPARK_IMAGE (pyspark and a JRE: several minutes the first time)"
    timeout 1800 "${compose[@]}" --profile spark build spark-job >/tmp/dq-smoke-spark-build.log 2>&1 \
        || { tail -n 40 /tmp/dq-smoke-spark-build.log; fail "spark image build"; }
    ok "Spark image built"
    "$py" "$root/docker/smoke_check.py" spark-before "$base_url" "$state" || fail "enqueue events"
    t_job=$SECONDS
    timeout 900 "${compose[@]}" --profile spark run --rm -T spark-job \
        >/tmp/dq-smoke-spark-job.log 2>&1 \
        || { tail -n 40 /tmp/dq-smoke-spark-job.log; fail "the Spark worked job against dq"; }
    ok "Spark worked job ran against dq in $((SECONDS - t_job)) s"
    summary='import collections, json, pyarrow.dataset as ds
t = ds.dataset("/var/lib/dq-spark/out/event-counts", format="parquet", partitioning="hive").to_table()
c = collections.Counter()
for event, n in zip(t.column("event").to_pylist(), t.column("events").to_pylist()):
    c[event] += n
print(json.dumps(dict(c)))'
    timeout 300 "${compose[@]}" --profile spark run --rm -T spark-job python -c "$summary" \
        2>/dev/null | tail -n 1 | "$py" "$root/docker/smoke_check.py" spark-after "$base_url" "$state" \
        || fail "the Spark job's output"
    ok "the job's Parquet counts every event and the queue is acknowledged"
fi
