# Sourced by tools/build-*.sh: the one build step they share.
#   go_build_binary NAME MODULE_DIR PACKAGE CACHE [go build flags ...]
# Builds PACKAGE in the wrapper module MODULE_DIR, static (CGO_ENABLED=0), -trimpath, -p $PARALLEL, into
# CACHE/.partial/NAME, with a heartbeat so a first build that takes minutes never looks hung; moves it to CACHE/NAME
# only once complete, so an interrupted build never leaves a binary that the idempotency check would accept.
# Needs the caller's log() and PARALLEL; returns non-zero when go build fails.
go_build_binary() {
    local name="$1" moddir="$2" pkg="$3" cache="$4" start=$SECONDS heartbeat status=0
    shift 4
    mkdir -p "$cache/.partial"
    log "building $name ($pkg) ..."
    ( while sleep 30; do log "... still building $name ($((SECONDS - start)) s so far)"; done ) &
    heartbeat=$!
    (cd "$moddir" && CGO_ENABLED=0 go build -p "$PARALLEL" -trimpath "$@" -o "$cache/.partial/$name" "$pkg") \
        || status=$?
    kill "$heartbeat" 2>/dev/null || true
    wait "$heartbeat" 2>/dev/null || true
    [[ $status -eq 0 ]] || return "$status"
    mv -f "$cache/.partial/$name" "$cache/$name"
    log "built $name in $((SECONDS - start)) s"
}
