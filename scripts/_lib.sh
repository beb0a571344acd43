# shellcheck shell=bash
# JOBQ_PG_SOURCE / JOBQ_PG_BASE_URL are set here for the calling scripts:
# shellcheck disable=SC2034
#
# Shared set-up for scripts/test and scripts/demo. Source it, don't run it:
#
#     source "$(dirname "${BASH_SOURCE[0]}")/_lib.sh"
#     jobq_venv                    # .venv: the project + its dev group, put on PATH
#     jobq_venv_django 6.1 PY      # .venv-django61 (Django 6.1 on PY), not on PATH
#     jobq_find_postgres test      # exports DATABASE_URL (MODE: test | demo)
#     jobq_chromium                # Debian's chromium for tests/browser, if it can
#     jobq_pgbouncer               # Debian's pgbouncer for tests/test_pgbouncer.py, if it can
#
# Sourcing it cds to the repository root, so callers may be started from any
# directory.
#
# Environment knobs:
#   PYTHON              interpreter used to create .venv (default python3.11,
#                       falling back to python3 when python3.11 is absent).
#   PYTHON312           interpreter used to create .venv-django61 (default
#                       python3.12, else pyenv's newest 3.12).
#   DATABASE_URL        if set, used as is: no discovery, nothing started.
#   JOBQ_LOCAL_PG_PORT  port probed for an already-running local server
#                       (default 5432). Meant for testing these scripts: point
#                       it at a closed port (e.g. 1) to force the throwaway
#                       cluster without stopping the machine's PostgreSQL.

set -euo pipefail

JOBQ_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
JOBQ_VENV="$JOBQ_ROOT/.venv"
cd "$JOBQ_ROOT"

jobq_log() { printf 'jobq: %s\n' "$*" >&2; }
jobq_die() {
    printf 'jobq: error: %s\n' "$*" >&2
    exit 1
}

# --------------------------------------------------------------------------
# Virtualenv
# --------------------------------------------------------------------------

# Create .venv if needed, (re)install the project in editable mode with its
# dev dependency group when pyproject.toml is newer than the stamp, and activate it
# (PATH + VIRTUAL_ENV) for the rest of the calling script.
jobq_venv() {
    local py="${PYTHON:-python3.11}"
    # `command -v` is not enough: a pyenv shim exists even when the version
    # behind it is not installed, so actually run it.
    if ! "$py" -c '' 2>/dev/null && [[ -z "${PYTHON:-}" ]] && python3 -c '' 2>/dev/null; then
        py=python3
    fi
    _jobq_make_venv "$JOBQ_VENV" "$py" '(set PYTHON=...)'

    export VIRTUAL_ENV="$JOBQ_VENV"
    export PATH="$JOBQ_VENV/bin:$PATH"
    hash -r
}

# _jobq_make_venv DIR PYTHON HINT [PIP_ARGS...]
#
# Create the virtualenv DIR with PYTHON if it has no working interpreter, and
# (re)install the project (editable) with its dev dependency group plus PIP_ARGS
# into it when pyproject.toml is newer than its stamp. Dependency groups (PEP
# 735) need pip >= 25.1, so pip is upgraded first. HINT ends the error message when PYTHON cannot be run.
_jobq_make_venv() {
    local dir="$1" py="$2" hint="$3"
    shift 3
    local stamp="$dir/.jobq-install-stamp" name
    name="$(basename "$dir")"

    if ! "$dir/bin/python" -c '' 2>/dev/null; then
        "$py" -c '' 2>/dev/null || jobq_die "no usable Python interpreter '$py' $hint"
        "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
            jobq_die "$py is $("$py" -V 2>&1); django-jobq needs Python >= 3.11 $hint"
        jobq_log "creating $name with $("$py" -V 2>&1)"
        # --clear: replaces a broken venv (e.g. its interpreter was removed).
        "$py" -m venv --clear "$dir"
        rm -f "$stamp"
    fi

    if [[ ! -f "$stamp" || "$JOBQ_ROOT/pyproject.toml" -nt "$stamp" ]]; then
        jobq_log "installing django-jobq with its dev group${*:+ $*} into $name"
        "$dir/bin/python" -m pip install -q --upgrade 'pip>=25.1'
        "$dir/bin/python" -m pip install -q -e . --group dev "$@"
        touch "$stamp"
    fi
}

# A Python 3.12 interpreter (Django 6 needs >= 3.12): `python3.12` if it runs,
# else pyenv's newest 3.12. Prints its path; fails when there is none.
jobq_python312() {
    local py
    for py in "${PYTHON312:-python3.12}" \
        $(printf '%s\n' "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3.12 | sort -rV); do
        if "$py" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then
            command -v "$py"
            return
        fi
    done
    return 1
}

# jobq_venv_django SERIES PY: .venv-djangoXY for Django SERIES (e.g. 6.0 ->
# .venv-django60) on the interpreter PY (Django 6 needs Python >= 3.12), with
# django-jobq and its dev group, created and kept up to date like .venv, not
# activated. Prints the virtual environment's directory.
jobq_venv_django() {
    local series="$1" py="$2" dir
    dir="$JOBQ_ROOT/.venv-django${series//./}"
    _jobq_make_venv "$dir" "$py" '(set PYTHON312=...)' "Django~=$series.0" >&2
    echo "$dir"
}

# --------------------------------------------------------------------------
# Debian packages the tests use when present: chromium, pgbouncer
# --------------------------------------------------------------------------

# _jobq_apt_install PACKAGE COMMAND WHAT
#
# When COMMAND is missing and this runs as root with apt-get, install Debian's
# PACKAGE quietly (apt-get update only if the install fails without it).
# Otherwise, or when the install fails, say so: WHAT (the tests that need it)
# will be skipped. Services the package would start are not started: while
# apt-get runs, a policy-rc.d that refuses every start is in place (unless the
# machine has one already, which is then left as it is).
_jobq_apt_install() {
    local package="$1" command="$2" what="$3"
    command -v "$command" >/dev/null 2>&1 && return
    if [[ "$(id -u)" -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
        jobq_log "$command is not installed (installing it needs root and apt-get):" \
            "$what will be skipped"
        return
    fi
    jobq_log "installing $package with apt-get (for $what)"
    local log policy=/usr/sbin/policy-rc.d own_policy=0
    log="$(mktemp)"
    if [[ ! -e "$policy" ]]; then
        printf '#!/bin/sh\n# scripts/_lib.sh: no service starts while it installs %s\nexit 101\n' \
            "$package" >"$policy"
        chmod 755 "$policy"
        own_policy=1
    fi
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$package" >"$log" 2>&1 &&
        ! { apt-get update -q >>"$log" 2>&1 &&
            DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$package" >>"$log" 2>&1; }; then
        tail -n 5 "$log" >&2
        jobq_log "could not install $package: $what will be skipped"
    fi
    if [[ $own_policy -eq 1 ]]; then
        rm -f "$policy"
    fi
    rm -f "$log"
}

# The browser tests drive Debian's /usr/bin/chromium through Playwright.
jobq_chromium() {
    _jobq_apt_install chromium chromium "the browser tests"
}

# tests/test_pgbouncer.py starts PgBouncer processes of its own (as the
# `postgres` user, on free ports). Debian's package also brings a system
# service on port 6432: it is not started by the install (see above), and it is
# disabled so that it does not start at the next boot either.
jobq_pgbouncer() {
    command -v pgbouncer >/dev/null 2>&1 && return
    _jobq_apt_install pgbouncer pgbouncer "the PgBouncer tests"
    if command -v pgbouncer >/dev/null 2>&1 && command -v systemctl >/dev/null 2>&1 &&
        [[ -d /run/systemd/system ]]; then
        systemctl disable --now pgbouncer.service >/dev/null 2>&1 || true
    fi
}

# --------------------------------------------------------------------------
# PostgreSQL discovery
# --------------------------------------------------------------------------

# Print DATABASE_URL-style URLs with the password replaced by ****.
jobq_mask_url() {
    sed -E 's#^([a-zA-Z0-9+.-]+://[^:/@]*:)[^/]*@#\1****@#' <<<"$1"
}

# Succeeds (and prints the server version) if URL accepts a connection.
# Uses psycopg from .venv, so jobq_venv must have run.
_jobq_pg_probe() {
    python - "$1" <<'EOF'
import sys

import psycopg

try:
    with psycopg.connect(sys.argv[1], connect_timeout=3) as conn:
        row = conn.execute("select current_setting('server_version')").fetchone()
except Exception:
    sys.exit(1)
print(row[0] if row else "?")
EOF
}

# Directory with initdb/pg_ctl: `pg_config --bindir`, else the newest
# /usr/lib/postgresql/*/bin, else wherever initdb is on PATH.
_jobq_pg_bindir() {
    local d
    if command -v pg_config >/dev/null 2>&1; then
        d="$(pg_config --bindir 2>/dev/null || true)"
        if [[ -n "$d" && -x "$d/initdb" && -x "$d/pg_ctl" ]]; then
            echo "$d"
            return
        fi
    fi
    d="$(printf '%s\n' /usr/lib/postgresql/*/bin | sort -V | tail -n 1)"
    if [[ -n "$d" && -x "$d/initdb" && -x "$d/pg_ctl" ]]; then
        echo "$d"
        return
    fi
    if command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; then
        dirname "$(command -v initdb)"
        return
    fi
    return 1
}

# Outputs of jobq_find_postgres, read by the calling scripts.
JOBQ_PG_SOURCE=""
JOBQ_PG_BASE_URL=""

# State of the throwaway cluster, read by the cleanup trap.
_JOBQ_PG_TMP=""
_JOBQ_PG_BIN=""

# Run a PostgreSQL server binary. initdb/pg_ctl refuse to run as root, so as
# root they run as the `postgres` OS user. The subshell cds into the cluster
# dir so that the postgres user never needs access to the caller's cwd.
_jobq_pg_as_owner() {
    if [[ "$(id -u)" -eq 0 ]]; then
        (cd "$_JOBQ_PG_TMP" && runuser -u postgres -- "$@")
    else
        (cd "$_JOBQ_PG_TMP" && "$@")
    fi
}

# Stop the throwaway cluster (if any) and delete its directory. Installed as
# the EXIT trap; INT/TERM exit through it too. Never fails, keeps $?.
_jobq_pg_cleanup() {
    local rc=$?
    if [[ -n "$_JOBQ_PG_TMP" && -d "$_JOBQ_PG_TMP" ]]; then
        if [[ -f "$_JOBQ_PG_TMP/data/postmaster.pid" ]]; then
            _jobq_pg_as_owner "$_JOBQ_PG_BIN/pg_ctl" -D "$_JOBQ_PG_TMP/data" \
                stop -m fast -w -t 30 >/dev/null 2>&1 ||
                _jobq_pg_as_owner "$_JOBQ_PG_BIN/pg_ctl" -D "$_JOBQ_PG_TMP/data" \
                    stop -m immediate -w -t 30 >/dev/null 2>&1 || true
        fi
        rm -rf "$_JOBQ_PG_TMP" || true
        _JOBQ_PG_TMP=""
    fi
    return "$rc"
}

# Start a throwaway cluster in a fresh /tmp/jobq-pg.XXXXXX and export
# DATABASE_URL for it. MODE test turns durability off (the data is thrown
# away anyway); MODE demo keeps PostgreSQL's defaults.
_jobq_pg_start_throwaway() {
    local mode="$1" port opts

    _JOBQ_PG_BIN="$(_jobq_pg_bindir)" ||
        jobq_die "no PostgreSQL server binaries found (initdb/pg_ctl; tried pg_config --bindir," \
            "/usr/lib/postgresql/*/bin and PATH). Install PostgreSQL, or set DATABASE_URL."
    if [[ "$(id -u)" -eq 0 ]]; then
        id -u postgres >/dev/null 2>&1 ||
            jobq_die "running as root, but there is no 'postgres' OS user to run initdb/pg_ctl as." \
                "Create one, run as a non-root user, or set DATABASE_URL."
        command -v runuser >/dev/null 2>&1 ||
            jobq_die "running as root and 'runuser' is missing (util-linux); cannot start PostgreSQL."
    fi

    # From here on the trap cleans up whatever part of the cluster exists.
    trap _jobq_pg_cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    _JOBQ_PG_TMP="$(mktemp -d /tmp/jobq-pg.XXXXXX)"
    if [[ "$(id -u)" -eq 0 ]]; then
        chown postgres: "$_JOBQ_PG_TMP"
    fi

    if ! _jobq_pg_as_owner "$_JOBQ_PG_BIN/initdb" -D "$_JOBQ_PG_TMP/data" \
        -A trust -U postgres --no-sync -E UTF8 --locale=C \
        >"$_JOBQ_PG_TMP/initdb.log" 2>&1; then
        cat "$_JOBQ_PG_TMP/initdb.log" >&2
        jobq_die "initdb failed"
    fi

    # A free port: bind to port 0 and let the kernel pick.
    port="$(python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
    opts="-p $port -k $_JOBQ_PG_TMP -c listen_addresses=127.0.0.1 -c max_connections=200"
    if [[ "$mode" == test ]]; then
        opts+=" -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
    fi
    if ! _jobq_pg_as_owner "$_JOBQ_PG_BIN/pg_ctl" -D "$_JOBQ_PG_TMP/data" \
        -l "$_JOBQ_PG_TMP/server.log" -w -t 60 -o "$opts" start \
        >"$_JOBQ_PG_TMP/pg_ctl.log" 2>&1; then
        cat "$_JOBQ_PG_TMP/pg_ctl.log" "$_JOBQ_PG_TMP/server.log" >&2 2>/dev/null || true
        jobq_die "could not start a throwaway PostgreSQL cluster"
    fi

    JOBQ_PG_BASE_URL="postgresql://postgres@127.0.0.1:$port"
    export DATABASE_URL="$JOBQ_PG_BASE_URL/postgres"
    local version
    version="$(_jobq_pg_probe "$DATABASE_URL")" ||
        jobq_die "throwaway cluster started but does not accept connections (log: $_JOBQ_PG_TMP/server.log)"
    JOBQ_PG_SOURCE="throwaway"
    jobq_log "PostgreSQL: throwaway cluster $version from $_JOBQ_PG_BIN in $_JOBQ_PG_TMP," \
        "port $port ($mode mode): $DATABASE_URL"
}

# jobq_find_postgres MODE   (MODE: test | demo)
#
# Exports DATABASE_URL, choosing, in order:
#   (a) DATABASE_URL from the environment, unchanged;
#   (b) a server on 127.0.0.1:${JOBQ_LOCAL_PG_PORT:-5432} that lets user
#       `postgres` in without a password;
#   (c) a throwaway cluster started from the machine's PostgreSQL binaries,
#       stopped and deleted when the calling script exits.
# Also sets JOBQ_PG_SOURCE (env | local | throwaway) and, for (b) and (c),
# JOBQ_PG_BASE_URL (the URL without a database name). Prints one line saying
# which server was chosen. Needs jobq_venv first (probes use psycopg).
jobq_find_postgres() {
    local mode="${1:?usage: jobq_find_postgres test|demo}"
    [[ "$mode" == test || "$mode" == demo ]] || jobq_die "jobq_find_postgres: unknown mode '$mode'"
    JOBQ_PG_SOURCE=""
    JOBQ_PG_BASE_URL=""

    # (a) explicit
    if [[ -n "${DATABASE_URL:-}" ]]; then
        export DATABASE_URL
        JOBQ_PG_SOURCE="env"
        jobq_log "PostgreSQL: DATABASE_URL from the environment: $(jobq_mask_url "$DATABASE_URL")"
        return
    fi

    # (b) local server, trust auth for user postgres. pg_isready is only a
    # quick pre-check (it may be missing); the real test is a login.
    local port="${JOBQ_LOCAL_PG_PORT:-5432}" url version
    url="postgresql://postgres@127.0.0.1:$port"
    if { ! command -v pg_isready >/dev/null 2>&1 ||
        pg_isready -q -h 127.0.0.1 -p "$port" -t 3 >/dev/null 2>&1; } &&
        version="$(_jobq_pg_probe "$url/postgres")"; then
        JOBQ_PG_BASE_URL="$url"
        export DATABASE_URL="$url/postgres"
        JOBQ_PG_SOURCE="local"
        jobq_log "PostgreSQL: local server $version on 127.0.0.1:$port: $DATABASE_URL"
        return
    fi

    # (c) throwaway cluster
    _jobq_pg_start_throwaway "$mode"
}

# Create database NAME on the server at JOBQ_PG_BASE_URL if it is missing.
jobq_ensure_database() {
    python - "$JOBQ_PG_BASE_URL/postgres" "$1" <<'EOF'
import sys

import psycopg
from psycopg import errors, sql

url, name = sys.argv[1], sys.argv[2]
with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
    exists = conn.execute("select 1 from pg_database where datname = %s", [name]).fetchone()
    if not exists:
        try:
            conn.execute(sql.SQL("create database {}").format(sql.Identifier(name)))
            print(f"jobq: created database {name}", file=sys.stderr)
        except errors.DuplicateDatabase:
            pass  # created concurrently by someone else: fine
EOF
}
