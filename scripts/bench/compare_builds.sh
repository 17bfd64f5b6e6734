#!/usr/bin/env bash
# Compares two builds of pstrain end to end so that a slowdown between them is caught (issue 44): each git
# revision is built (release) into a target directory of its own under $WORK, its binaries are kept and the
# target directory is deleted at once (disk is tight; KEEP=1 keeps it); then `trainer demo` of each build trains
# on the same data, the two alternating (old new, new old, ...) for REPEAT rounds. Per round: samples/s, CPU
# microseconds per sample (the demo process and its ps-servers, which it waits for: getrusage of the children,
# so the evaluation and start-up are in it for both builds alike) and test AUC; then the medians of new/old.
#
# Usage: scripts/bench/compare_builds.sh [OLD [NEW]]
#   OLD  a git revision (default HEAD~1)
#   NEW  a git revision (default HEAD); `.` is the checkout's working tree as it is (tracked files, uncommitted
#        changes included, through `git stash create`, which changes nothing)
#   env: REPEAT (rounds, default 3), ARGS (extra `trainer demo` flags, e.g. "--dense-precision bf16"),
#        TRAIN / TEST (Criteo files; default data/demo/train-1000000-s1-t7.tsv and test-100000-s2-t7.tsv: text,
#        which every revision reads, parsing included in the timed pass), WORK (default /var/tmp/compare-builds),
#        KEEP (1: keep the target directories), TOLERANCE (default 0.05), JOBS (cargo -j), TARGET (build both
#        revisions in this existing target directory instead, e.g. your own, which keeps its dependencies:
#        when the disk has no room for two more; nothing in it is deleted. Caution: `git archive` gives the
#        sources their commit's times, so cargo may take a workspace crate built earlier in that directory from
#        another revision as fresh and fail to build, or mix revisions; seen with an old revision built after
#        a newer one. Without TARGET each revision builds in a fresh directory)
# Exit status 1 when the new build's median samples/s ratio is below 1 - TOLERANCE or its median CPU per sample
# ratio above 1 + TOLERANCE: on a shared host, run with REPEAT >= 3 and read the per-round lines.
set -euo pipefail
cd "$(dirname "$0")/../.."
OLD=${1:-HEAD~1}
NEW=${2:-HEAD}
WORK=${WORK:-/var/tmp/compare-builds}
REPEAT=${REPEAT:-3}
TRAIN=${TRAIN:-data/demo/train-1000000-s1-t7.tsv}
TEST=${TEST:-data/demo/test-100000-s2-t7.tsv}
for f in "$TRAIN" "$TEST"; do
    [ -e "$f" ] || { echo "missing $f: run \`trainer demo\` once (it generates data/demo), or set TRAIN/TEST" >&2; exit 2; }
done
TRAIN=$(realpath "$TRAIN")
TEST=$(realpath "$TEST")
mkdir -p "$WORK"

# The commit to build for a revision argument (`.`: the working tree as a commit object nobody references).
resolve() {
    if [ "$1" = . ]; then
        local c
        c=$(git stash create)
        echo "${c:-$(git rev-parse HEAD)}"
    else
        git rev-parse --verify "$1^{commit}"
    fi
}

# Builds commit $1 into $WORK/bin-<short>, unless already there; prints that directory.
build() {
    local commit=$1 short
    short=$(git rev-parse --short=10 "$commit")
    local bin="$WORK/bin-$short"
    if [ -x "$bin/trainer" ] && [ -x "$bin/ps-server" ]; then
        echo "$bin"
        return
    fi
    local src="$WORK/src-$short" target="${TARGET:-$WORK/target-$short}"
    rm -rf "$src"
    mkdir -p "$src" "$bin"
    git archive "$commit" | tar -x -C "$src" || return 1
    echo "== building $short in $target (nice, release)" >&2
    (cd "$src" && CARGO_TARGET_DIR="$target" nice -n 10 cargo build --release --locked ${JOBS:+-j "$JOBS"} \
        -p trainer -p ps-server --bin trainer --bin ps-server >&2) || { echo "building $short failed" >&2; return 1; }
    cp "$target/release/trainer" "$target/release/ps-server" "$bin/" || return 1
    if [ "${KEEP:-0}" != 1 ] && [ -z "${TARGET:-}" ]; then
        rm -rf "$target"
    fi
    rm -rf "$src"
    echo "$bin"
}

OLD_C=$(resolve "$OLD")
NEW_C=$(resolve "$NEW")
OLD_BIN=$(build "$OLD_C") || exit 1
NEW_BIN=$(build "$NEW_C") || exit 1
echo "== old: $OLD ($OLD_C) in $OLD_BIN" >&2
echo "== new: $NEW ($NEW_C) in $NEW_BIN" >&2

python3 - "$OLD_BIN" "$NEW_BIN" "$WORK" "$REPEAT" "$TRAIN" "$TEST" "$OLD" "$NEW" "${TOLERANCE:-0.05}" <<'PY'
import json, os, resource, shlex, statistics, subprocess, sys, time
old_bin, new_bin, work, repeat, train, test, old_name, new_name, tol = sys.argv[1:]
repeat, tol = int(repeat), float(tol)
args = shlex.split(os.environ.get("ARGS", ""))
bins = {"old": old_bin, "new": new_bin}
rows = {"old": [], "new": []}

def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime

print(f"old = {old_name}, new = {new_name}; trainer demo {' '.join(args)} on {os.path.basename(train)}; "
      f"{repeat} rounds, alternating")
print("| round | build | samples/s | CPU us/sample | test AUC | wall s |")
print("| --- | --- | --- | --- | --- | --- |")
for r in range(repeat):
    for k in (["old", "new"] if r % 2 == 0 else ["new", "old"]):
        out = os.path.join(work, f"summary-{k}-{r}.json")
        log = os.path.join(work, f"log-{k}-{r}.txt")
        cmd = [os.path.join(bins[k], "trainer"), "demo", "--data-dir", os.path.join(work, f"run-{k}"),
               "--train", train, "--test", test, "--summary-json", out, *args]
        cpu0, t0 = children_cpu(), time.time()
        with open(log, "w") as f:
            p = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
        if p.returncode != 0:
            sys.exit(f"{k} build failed (exit {p.returncode}); log in {log}")
        cpu, wall = children_cpu() - cpu0, time.time() - t0
        s = json.load(open(out))
        rec = (s["samples_per_sec"], cpu / s["samples"] * 1e6, s.get("auc") or float("nan"))
        rows[k].append(rec)
        print(f"| {r + 1} | {k} | {rec[0]:,.0f} | {rec[1]:.2f} | {rec[2]:.5f} | {wall:.1f} |", flush=True)

speed = [n[0] / o[0] for o, n in zip(rows["old"], rows["new"])]
cpu = [n[1] / o[1] for o, n in zip(rows["old"], rows["new"])]
ms, mc = statistics.median(speed), statistics.median(cpu)
print(f"\nnew/old samples/s per round: {', '.join(f'{x:.3f}' for x in speed)}; median {ms:.3f}")
print(f"new/old CPU per sample per round: {', '.join(f'{x:.3f}' for x in cpu)}; median {mc:.3f}")
auc_old = {round(a[2], 6) for a in rows["old"]}
auc_new = {round(a[2], 6) for a in rows["new"]}
print(f"test AUC old {sorted(auc_old)}, new {sorted(auc_new)}")
if ms < 1 - tol or mc > 1 + tol:
    print(f"REGRESSION: median samples/s ratio {ms:.3f} (floor {1 - tol:.2f}), CPU ratio {mc:.3f} (ceiling {1 + tol:.2f})")
    sys.exit(1)
print(f"no regression beyond {tol:.0%}")
PY
