# Sourced by tools/install-*.sh: install Debian packages that are missing, judged by a file each one installs.
#   apt_install_missing LOG_NAME "package|/a/file/it/installs" ...
# Packages whose file exists are left alone (idempotent, and no apt-get update when nothing is missing);
# --no-install-recommends: the callers name everything they use. Exits non-zero, saying so, when apt fails.
apt_install_missing() {
    local name="$1" entry
    shift
    local missing=()
    for entry in "$@"; do
        [[ -e "${entry#*|}" ]] || missing+=("${entry%%|*}")
    done
    if [[ ${#missing[@]} -eq 0 ]]; then
        echo "[$name $(date +%H:%M:%S)] apt packages present"
        return 0
    fi
    echo "[$name $(date +%H:%M:%S)] apt-get install ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # `make test` builds its parts in parallel, and two apt runs at once would fail on dpkg's lock: wait for ours.
    local lock_fd
    exec {lock_fd}>/var/lock/fracgpu-apt.lock
    flock "$lock_fd"
    apt-get update -q >/dev/null || echo "[$name] apt-get update failed; trying the install with the lists we have"
    if ! apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null; then
        echo "$name: apt-get install ${missing[*]} failed; run it by hand to see why (Debian's package lists must" \
             "be reachable)" >&2
        return 1
    fi
    for entry in "$@"; do
        [[ -e "${entry#*|}" ]] || { echo "$name: ${entry%%|*} installed but ${entry#*|} is missing" >&2; return 1; }
    done
    exec {lock_fd}>&-
}
