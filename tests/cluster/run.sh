#!/usr/bin/env bash
# ferry's end-to-end check on a real Kubernetes cluster, with kubectl only (helm for
# --from-chart). It cannot run on ferry's test machines (no API server there); the suite
# runs shellcheck on it and validates every manifest it applies (tests/cluster/manifests).
#
#   tests/cluster/run.sh [--from-chart] [--storage-class CLASS] [--keep]
#
# Needs: a cluster of Kubernetes 1.33+ in the current kubectl context, the ferry image
# loaded into its nodes (docs/KUBERNETES.md, "Try it on kind or k3s"), a StorageClass
# with Filesystem volumes (default: standard, kind's; k3s: local-path).
#
# It installs the operator (from deploy/, or from the chart with --from-chart), imports a
# raw image from an NBD server into a new PVC (verified), checksums the source and the
# PVC with movers of their own and compares them, clones the PVC into three PVCs in one
# pass (each verified), kills a mover mid-copy and checks that its replacement resumed,
# populates a claim on creation from a VolumeImageSource, backs the imported claim up into
# an encrypted repository in a claim, restores it into a new claim (each checksummed
# against the source), and prints a pass/fail table. A BackupSchedule's fire is not run
# (its first fire waits for a cron time); schedules are proven on the scripted API only. The test namespace enforces the restricted Pod Security
# Standard, so every mover is admitted only if it passes it. Exits non-zero if a step
# failed. --keep leaves the namespaces and the operator in place.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
manifests="$here/manifests"
ns=ferry-e2e
storage_class=standard
from_chart=0
keep=0
timeout=600

while [ $# -gt 0 ]; do
    case "$1" in
        --from-chart) from_chart=1 ;;
        --storage-class) storage_class="$2"; shift ;;
        --keep) keep=1 ;;
        *) echo "usage: $0 [--from-chart] [--storage-class CLASS] [--keep]" >&2; exit 2 ;;
    esac
    shift
done

results=()
failed=0

record() {
    local step="$1" outcome="$2" detail="$3"
    results+=("$(printf '| %-34s | %-4s | %s |' "$step" "$outcome" "$detail")")
    if [ "$outcome" != PASS ]; then
        failed=1
    fi
    printf '%s %s: %s\n' "$outcome" "$step" "$detail" >&2
}

# Applies a manifest of tests/cluster/manifests with the chosen storage class.
apply() {
    sed "s/storageClassName: standard/storageClassName: $storage_class/" "$manifests/$1" |
        kubectl apply -f -
}

# The value of a JSONPath of a resource, empty when it has none.
field() {
    kubectl -n "$ns" get "$1" -o "jsonpath=$2" 2>/dev/null || true
}

# Waits until the resource's phase is one of the given ones; prints the phase reached.
wait_phase() {
    local resource="$1" phase=""
    shift
    local deadline=$((SECONDS + timeout))
    while [ $SECONDS -lt $deadline ]; do
        phase="$(field "$resource" '{.status.phase}')"
        for want in "$@"; do
            if [ "$phase" = "$want" ]; then
                echo "$phase"
                return 0
            fi
        done
        sleep 2
    done
    echo "${phase:-none} after ${timeout}s"
    return 1
}

install_operator() {
    if [ "$from_chart" = 1 ]; then
        command -v helm >/dev/null || { echo "--from-chart needs helm" >&2; exit 2; }
        kubectl apply --server-side -f "$repo/charts/ferry/crds/"
        kubectl create namespace ferry-system --dry-run=client -o yaml | kubectl apply -f -
        helm template ferry "$repo/charts/ferry" -n ferry-system | kubectl -n ferry-system apply -f -
    else
        kubectl apply -f "$repo/deploy/crds.yaml" -f "$repo/deploy/operator/"
    fi
    kubectl -n ferry-system rollout status deploy --timeout="${timeout}s"
}

# shellcheck disable=SC2317  # invoked by the EXIT trap
cleanup() {
    if [ "$keep" = 0 ]; then
        kubectl delete namespace "$ns" ferry-e2e-source --ignore-not-found --wait=false || true
    fi
}
trap cleanup EXIT

if install_operator; then
    record "install the operator" PASS "$([ "$from_chart" = 1 ] && echo chart || echo deploy/)"
else
    record "install the operator" FAIL "the operator's Deployment did not become available"
    exit 1
fi

apply 00-namespaces.yaml
apply 10-nbd-source.yaml
kubectl -n ferry-e2e-source wait pod/nbd --for=condition=Ready --timeout="${timeout}s"

# 1. Import, verified.
apply 20-import.yaml
if phase="$(wait_phase transfer/import Succeeded Failed)" && [ "$phase" = Succeeded ]; then
    source_digest="$(field transfer/import '{.status.digests.source}')"
    disk_digest="$(field transfer/import '{.status.digests.targets.disk}')"
    if [ -n "$source_digest" ] && [ "$source_digest" = "$disk_digest" ]; then
        record "import from NBD, verified" PASS "$source_digest"
    else
        record "import from NBD, verified" FAIL "digests '$source_digest' and '$disk_digest'"
    fi
else
    record "import from NBD, verified" FAIL "$phase: $(field transfer/import '{.status.message}')"
fi

# 2. Checksums of the source and of the claim, by movers of their own.
apply 30-checksums.yaml
wait_phase checksum/source Succeeded Failed >/dev/null || true
wait_phase checksum/disk Succeeded Failed >/dev/null || true
sum_source="$(field checksum/source '{.status.digest}')"
sum_disk="$(field checksum/disk '{.status.digest}')"
if [ -n "$sum_source" ] && [ "$sum_source" = "$sum_disk" ] && [ "$sum_source" = "${source_digest:-}" ]; then
    record "checksums of source and claim" PASS "$sum_source"
else
    record "checksums of source and claim" FAIL "source '$sum_source', claim '$sum_disk'"
fi

# 3. One pass into three new claims.
apply 40-clone.yaml
if phase="$(wait_phase transfer/clone Succeeded Failed)" && [ "$phase" = Succeeded ]; then
    bad=""
    for target in clone-1 clone-2 clone-3; do
        digest="$(field transfer/clone "{.status.digests.targets.$target}")"
        [ "$digest" = "${source_digest:-}" ] || bad="$bad $target=$digest"
    done
    if [ -z "$bad" ]; then
        record "clone into 3 claims, verified" PASS "every target $source_digest"
    else
        record "clone into 3 claims, verified" FAIL "targets differ:$bad"
    fi
else
    record "clone into 3 claims, verified" FAIL "$phase: $(field transfer/clone '{.status.message}')"
fi

# 4. A mover killed mid-copy; the replacement resumes from the checkpoint.
apply 50-slow-import.yaml
deadline=$((SECONDS + timeout))
while [ $SECONDS -lt $deadline ]; do
    committed="$(field transfer/resumed '{.status.progress.committedBytes}')"
    if [ "${committed:-0}" -gt 0 ]; then
        break
    fi
    sleep 1
done
mover="$(field transfer/resumed '{.status.moverPod}')"
if [ -n "$mover" ]; then
    kubectl -n "$ns" delete pod "$mover" --wait=false
fi
if phase="$(wait_phase transfer/resumed Succeeded Failed)" && [ "$phase" = Succeeded ]; then
    attempts="$(field transfer/resumed '{.status.attempts}')"
    resumed="$(field transfer/resumed '{.status.progress.resumedBytes}')"
    digest="$(field transfer/resumed '{.status.digests.targets.resumed}')"
    if [ "${attempts:-0}" -ge 2 ] && [ "${resumed:-0}" -gt 0 ] && [ "$digest" = "${source_digest:-}" ]; then
        record "mover killed mid-copy, resumed" PASS "attempts $attempts, resumed $resumed bytes"
    else
        record "mover killed mid-copy, resumed" FAIL "attempts '$attempts', resumed '$resumed', digest '$digest'"
    fi
else
    record "mover killed mid-copy, resumed" FAIL "$phase: $(field transfer/resumed '{.status.message}')"
fi

# 5. A claim populated on creation from a VolumeImageSource, checksummed.
apply 60-populate.yaml
if phase="$(wait_phase checksum/populated Succeeded Failed)" && [ "$phase" = Succeeded ]; then
    digest="$(field checksum/populated '{.status.digest}')"
    if [ "$digest" = "${source_digest:-}" ]; then
        record "claim populated on creation" PASS "$digest"
    else
        record "claim populated on creation" FAIL "digest '$digest'"
    fi
else
    record "claim populated on creation" FAIL "$phase: $(field pvc/populated '{.status.phase}')"
fi

# 6. A backup of the imported claim into an encrypted repository in a claim.
apply 70-backup.yaml
if phase="$(wait_phase backup/disk-1 Succeeded Failed)" && [ "$phase" = Succeeded ]; then
    snapshot="$(field backup/disk-1 '{.status.snapshotId}')"
    block_hash="$(field backup/disk-1 '{.status.blockHash}')"
    if [ -n "$snapshot" ] && [ "${block_hash#blkhash:}" = "${source_digest#blkhash:}" ]; then
        record "backup into a claim's repository" PASS "snapshot $snapshot"
    else
        record "backup into a claim's repository" FAIL "snapshot '$snapshot', block hash '$block_hash'"
    fi
else
    record "backup into a claim's repository" FAIL "$phase: $(field backup/disk-1 '{.status.message}')"
fi

# 7. A new claim restored from the backup (restore populator), checksummed.
apply 80-restore.yaml
if phase="$(wait_phase checksum/restored Succeeded Failed)" && [ "$phase" = Succeeded ]; then
    digest="$(field checksum/restored '{.status.digest}')"
    if [ "$digest" = "${source_digest:-}" ]; then
        record "claim restored from the backup" PASS "$digest"
    else
        record "claim restored from the backup" FAIL "digest '$digest'"
    fi
else
    record "claim restored from the backup" FAIL "$phase: $(field pvc/restored '{.status.phase}')"
fi

printf '\n| %-34s | %-4s | %s |\n|---|---|---|\n' step "" detail
printf '%s\n' "${results[@]}"
exit "$failed"
