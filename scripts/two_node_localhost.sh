#!/usr/bin/env bash
# Two "nodes" on this machine for `gspo train --hostfile`: a private sshd on 127.0.0.1 (a free
# port, its own host key, one authorized key, login by key only) and the ssh host names node-a
# and node-b for it. Nothing outside DIR changes: no ~/.ssh, no system sshd (only /run/sshd,
# sshd's empty privilege-separation folder, is created when missing).
#
#   scripts/two_node_localhost.sh start DIR   # sshd up; writes DIR/hostfile and DIR/bin/ssh
#   PATH=DIR/bin:$PATH gspo train RECIPE --hostfile DIR/hostfile     # world size 2
#   scripts/two_node_localhost.sh stop DIR    # ends that sshd (by its pid file)
#   scripts/two_node_localhost.sh demo DIR [ARGS]   # all three, on recipes/deepspeed/tiny-cpu-zero2.yaml
#                                                   # (ARGS: more gspo train options)
#
# DIR/bin/ssh runs ssh with DIR/ssh_config: the ssh that DeepSpeed's launcher (pdsh) and gspo's
# host check start finds node-a and node-b there. Needs /usr/sbin/sshd, ssh-keygen and pdsh
# (apt install openssh-server pdsh). Exit 3 when one is missing or sshd does not start.
set -euo pipefail
usage() { echo "usage: $0 start|stop DIR, or $0 demo DIR [gspo train options]" >&2; exit 2; }
[ $# -ge 2 ] || usage
ACTION=$1
DIR=$(mkdir -p "$2" && cd "$2" && pwd)
shift 2
[ $# -eq 0 ] || [ "$ACTION" = demo ] || usage
REPO=$(cd "$(dirname "$0")/.." && pwd)

start() {
    local tool
    for tool in /usr/sbin/sshd ssh-keygen pdsh; do
        command -v "$tool" >/dev/null || { echo "missing: $tool (apt install openssh-server pdsh)" >&2; exit 3; }
    done
    rm -f "$DIR/host_key" "$DIR/id" "$DIR/host_key.pub" "$DIR/id.pub"
    ssh-keygen -q -t ed25519 -N '' -f "$DIR/host_key"
    ssh-keygen -q -t ed25519 -N '' -f "$DIR/id"
    cp "$DIR/id.pub" "$DIR/authorized_keys"
    chmod 600 "$DIR/authorized_keys"
    local port
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    cat >"$DIR/sshd_config" <<EOF
ListenAddress 127.0.0.1
Port $port
HostKey $DIR/host_key
AuthorizedKeysFile $DIR/authorized_keys
PidFile $DIR/sshd.pid
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
EOF
    cat >"$DIR/ssh_config" <<EOF
Host node-a node-b
    HostName 127.0.0.1
    Port $port
    User $(id -un)
    IdentityFile $DIR/id
    IdentitiesOnly yes
    StrictHostKeyChecking no
    UserKnownHostsFile /dev/null
    LogLevel ERROR
    ConnectTimeout 10
EOF
    mkdir -p "$DIR/bin"
    printf '#!/bin/sh\nexec %s -F %s "$@"\n' "$(command -v ssh)" "$DIR/ssh_config" >"$DIR/bin/ssh"
    chmod +x "$DIR/bin/ssh"
    printf 'node-a slots=1\nnode-b slots=1\n' >"$DIR/hostfile"
    [ "$(id -u)" != 0 ] || [ -d /run/sshd ] || mkdir -p /run/sshd
    rm -f "$DIR/sshd.pid"
    /usr/sbin/sshd -f "$DIR/sshd_config" -E "$DIR/sshd.log" || { cat "$DIR/sshd.log" >&2; exit 3; }
    local tries
    for tries in $(seq 50); do
        if PATH=$DIR/bin:$PATH ssh -o BatchMode=yes node-b true 2>/dev/null; then
            echo "sshd pid $(cat "$DIR/sshd.pid") on 127.0.0.1:$port; hosts node-a node-b"
            echo "run: PATH=$DIR/bin:\$PATH gspo train RECIPE --hostfile $DIR/hostfile"
            return 0
        fi
        sleep 0.1
    done
    echo "sshd did not accept a login on 127.0.0.1:$port:" >&2
    cat "$DIR/sshd.log" >&2
    stop
    exit 3
}

stop() {
    if [ -f "$DIR/sshd.pid" ]; then
        kill "$(cat "$DIR/sshd.pid")" 2>/dev/null || true
        rm -f "$DIR/sshd.pid"
    fi
}

case $ACTION in
start) start ;;
stop) stop ;;
demo)
    start
    trap stop EXIT
    cd "$REPO"
    PATH=$DIR/bin:$PATH .venv/bin/gspo train recipes/deepspeed/tiny-cpu-zero2.yaml \
        --hostfile "$DIR/hostfile" --out "$DIR/run" "$@"
    ;;
*) usage ;;
esac
