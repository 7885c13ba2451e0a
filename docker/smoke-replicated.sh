#!/usr/bin/env bash
# make docker-smoke-replicated: build the dq and etcd images, bring up
# docker/compose.replicated.yml (three etcd members, three dq members), enqueue through the
# leader, kill the leader's container, check another member accepts writes and still has
# every acknowledged item, start the old leader again and check it rejoins as a follower,
# tear everything down.
#
# Engine and base image: docker/compose-engine.sh (as docker/smoke.sh). The HTTP half is
# docker/replicated_check.py. Every wait is bounded; an EXIT trap removes the stack and its
# volumes; images stay cached.
set -euo pipefail

cd "$(dirname "$0")/.."
root="$PWD"
project="${SMOKE_PROJECT:-dq-smoke-replicated}"
compose_file="$root/docker/compose.replicated.yml"
health_timeout_s="${SMOKE_HEALTH_TIMEOUT_S:-180}"
py="$root/.venv/bin/python"
[ -x "$py" ] || py="$(command -v python3)"
t_start=$SECONDS
passed=0

log() { printf 'docker-smoke-replicated [%3ds] %s\n' "$((SECONDS - t_start))" "$*"; }
ok() { passed=$((passed + 1)); log "ok: $*"; }
fail() { log "FAILED: $*"; exit 1; }

source "$root/docker/compose-engine.sh"
compose+=(-p "$project" -f "$compose_file")
log "engine: $engine ($("$engine" --version)); compose: ${compose[0]##*/}"

export DQ_IMAGE="${DQ_IMAGE:-localhost/deadline-queue:smoke}"
export DQ_ETCD_IMAGE="${DQ_ETCD_IMAGE:-localhost/deadline-queue-etcd:smoke}"
export DQ_PUBLISH_ADDR=127.0.0.1
free_port() { "$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
DQ_PUBLISH_PORT_1="$(free_port)"
DQ_PUBLISH_PORT_2="$(free_port)"
DQ_PUBLISH_PORT_3="$(free_port)"
export DQ_PUBLISH_PORT_1 DQ_PUBLISH_PORT_2 DQ_PUBLISH_PORT_3
urls="http://127.0.0.1:$DQ_PUBLISH_PORT_1,http://127.0.0.1:$DQ_PUBLISH_PORT_2,http://127.0.0.1:$DQ_PUBLISH_PORT_3"
services=(etcd1 etcd2 etcd3 dq1 dq2 dq3)
state="$(mktemp /tmp/dq-smoke-replicated.XXXXXX)"

teardown() {
    local rc=$?
    trap - EXIT
    if [ "$rc" -ne 0 ]; then
        log "logs of the failed run:"
        for s in "${services[@]}"; do
            echo "---- $s"
            timeout 60 "${compose[@]}" logs --tail 30 "$s" 2>&1 | tail -n 30 || true
        done
    fi
    log "tearing down (stack and volumes)"
    timeout 240 "${compose[@]}" down -v -t 10 >/dev/null 2>&1 || true
    rm -f "$state"
    if [ "$rc" -eq 0 ]; then
        log "done in $((SECONDS - t_start)) s"
        echo "docker-smoke-replicated: $passed passed, 0 failed"
    else
        echo "docker-smoke-replicated: $passed passed, 1 failed"
    fi
    exit "$rc"
}
trap teardown EXIT
trap 'exit 130' INT TERM

# A previous run that was killed may have left its stack behind.
timeout 240 "${compose[@]}" down -v -t 5 >/dev/null 2>&1 || true

log "building $DQ_IMAGE and $DQ_ETCD_IMAGE from $DQ_BASE_IMAGE"
build_log=/tmp/dq-smoke-replicated-build.log
# One service of each image: the others share its tag.
timeout 1200 "${compose[@]}" build etcd1 dq1 >"$build_log" 2>&1 \
    || { tail -n 40 "$build_log"; fail "image build (log: $build_log)"; }
ok "images built"
# The whole output, then its first line (a pipe into `head` may cut the engine's write).
etcd_version="$("$engine" run --rm --entrypoint etcd "$DQ_ETCD_IMAGE" --version)" \
    || fail "etcd --version in $DQ_ETCD_IMAGE"
etcd_version="${etcd_version%%$'\n'*}"
ok "etcd image: $etcd_version"

# Both compose implementations label their containers with project and service.
container_id() {
    "$engine" ps -a -q --filter "label=com.docker.compose.project=$project" \
        --filter "label=com.docker.compose.service=$1" | head -n 1
}

# Bounded wait for a service's health check. podman without systemd never runs health
# checks on its own, so on podman we run the image's check ourselves.
wait_healthy() {
    local service=$1 cid deadline=$((SECONDS + health_timeout_s))
    cid="$(container_id "$service")"
    [ -n "$cid" ] || fail "no $service container"
    while [ "$SECONDS" -lt "$deadline" ]; do
        [ "$("$engine" inspect -f '{{.State.Running}}' "$cid")" = true ] \
            || fail "$service exited ($("$engine" inspect -f '{{.State.ExitCode}}' "$cid"))"
        if [ "$engine" = podman ]; then
            podman healthcheck run "$cid" >/dev/null 2>&1 && return 0
        else
            [ "$(docker inspect -f '{{.State.Health.Status}}' "$cid")" = healthy ] && return 0
        fi
        sleep 1
    done
    fail "$service not healthy after ${health_timeout_s} s"
}

# The etcd members first (they need each other to form a quorum), then the dq members.
timeout 300 "${compose[@]}" up -d etcd1 etcd2 etcd3 >/tmp/dq-smoke-replicated-up.log 2>&1 \
    || { cat /tmp/dq-smoke-replicated-up.log; fail "compose up (etcd)"; }
for s in etcd1 etcd2 etcd3; do wait_healthy "$s"; done
ok "etcd members up and healthy"
timeout 300 "${compose[@]}" up -d dq1 dq2 dq3 >>/tmp/dq-smoke-replicated-up.log 2>&1 \
    || { cat /tmp/dq-smoke-replicated-up.log; fail "compose up (dq)"; }
for s in dq1 dq2 dq3; do wait_healthy "$s"; done
ok "dq members up and healthy on $urls"

"$py" "$root/docker/replicated_check.py" before "$urls" "$state" >/tmp/dq-smoke-replicated-before.log \
    || { cat /tmp/dq-smoke-replicated-before.log; fail "checks before the failover"; }
head -n -1 /tmp/dq-smoke-replicated-before.log
leader="$(tail -n 1 /tmp/dq-smoke-replicated-before.log)"
case "$leader" in dq1 | dq2 | dq3) ;; *) fail "the leader is not a compose service: '$leader'" ;; esac
ok "a leader elected, a follower redirects with 421, ${leader} acknowledged writes replicated"

leader_cid="$(container_id "$leader")"
"$engine" kill --signal KILL "$leader_cid" >/dev/null || fail "kill $leader"
ok "killed the leader's container ($leader, SIGKILL)"
"$py" "$root/docker/replicated_check.py" failover "$urls" "$state" \
    || fail "checks after killing the leader"
ok "another member took over with every acknowledged item"

timeout 120 "${compose[@]}" up -d "$leader" >>/tmp/dq-smoke-replicated-up.log 2>&1 \
    || { cat /tmp/dq-smoke-replicated-up.log; fail "compose up $leader"; }
wait_healthy "$leader"
"$py" "$root/docker/replicated_check.py" rejoin "$urls" "$state" \
    || fail "checks after restarting the old leader"
ok "the old leader rejoined as a follower"
