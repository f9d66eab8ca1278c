#!/usr/bin/env bash
# The body of `make test`: every tier in one `go test -json` run read by the time ledger,
# with `go vet` and the benchmarks running beside it rather than before and after it. Alone,
# the benchmarks left the host half idle for about four minutes at the end of the run (their
# idle figures are 30-second windows of an idle process); beside the tests they fill the gaps
# the VM tier leaves. Their figures are ratios and counts, which the load leaves alone, or
# latencies, which `make bench` measures on a quiet host when wanted.
set -uo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
start=$(date +%s)
$GO build -o bin/ledger ./hack/ledger || exit 1
side=$(mktemp -d)
trap 'rm -rf "$side"' EXIT
beside() { # beside NAME COMMAND...: runs COMMAND in the background, its output and exit status kept
	local name=$1
	shift
	(
		s=$(date +%s)
		"$@" >"$side/$name.out" 2>&1
		echo $? >"$side/$name.rc"
		echo $(($(date +%s) - s)) >"$side/$name.took"
	) &
}
beside vet $GO vet ./...
beside bench make --no-print-directory bench
# The VM tests whose machines keep both cores busy (the lab) start once the other packages'
# tests, the race run and vet are done: this file says so (test/vm afterOthers).
export LIKEN_VM_AFTER="$side/others.done"
# The packages with init's and the agent's concurrent paths (init's one ESP owner, the
# supervisor, the agent's reconcile, slot job and last words, its metrics endpoint's review
# cache, the log writer) run under the race detector
# instead of in the main run: beside it, with their results joining the ledger's stream.
race=(./internal/initd ./internal/supervisor ./internal/agent ./internal/metrics ./internal/logfile)
(
	$GO test -race -count=1 -timeout 30m -json "${race[@]}" >"$side/race.json" 2>"$side/race.err"
	echo $? >"$side/race.rc"
) &
# go test's -timeout ends a hung test: from what is left of the budget (CI's 90-minute limit
# less 4 minutes for the ledger, vet's and the benchmarks' ends and CI's own start), counted
# from make's start so a first build of the tools (about 25 minutes) is paid from it too. The
# VM tier is named first: go test starts packages in the order given, and the VM tier is the
# longest, so the others run beside it rather than before it.
budget=${LIKEN_TEST_BUDGET:-$((86 * 60))}
left=$((budget - ($(date +%s) - ${LIKEN_TEST_START:-$start})))
if [ "$left" -lt 600 ]; then
	echo "only ${left}s are left of the test budget of ${budget}s (LIKEN_TEST_BUDGET) after the tools' build; giving the tests 10 minutes" >&2
	left=600
fi
echo "the tests' bound: ${left}s (what is left of LIKEN_TEST_BUDGET=${budget}s since make started)"
rest=$($GO list ./... | grep -v -x -e liken.dev/liken/test/vm -e liken.dev/liken/internal/initd -e liken.dev/liken/internal/supervisor -e liken.dev/liken/internal/agent -e liken.dev/liken/internal/metrics -e liken.dev/liken/internal/logfile)
# The other packages run in a go test of their own, beside the VM tier's, into a file that
# joins the ledger's stream after the VM tier's (two writers on one pipe could interleave
# long lines).
(
	$GO test -count=1 -timeout ${left}s -json $rest >"$side/others.json" 2>"$side/others.err"
	echo $? >"$side/others.rc"
	while [ ! -e "$side/race.rc" ] || [ ! -e "$side/vet.rc" ]; do sleep 1; done
	touch "$LIKEN_VM_AFTER"
) &
{
	$GO test -count=1 -timeout ${left}s -json ./test/vm/
	echo $? >"$side/main.rc"
	# The race run and the others are the outer shell's children, not this pipeline's:
	# wait for their status files.
	while [ ! -e "$side/race.rc" ] || [ ! -e "$side/others.rc" ]; do sleep 1; done
	cat "$side/others.json" "$side/race.json"
} | tee "${LIKEN_TEST_JSON:-/dev/null}" | bin/ledger
rc=$?
wait
for run in main others race; do
	if [ "$(cat "$side/$run.rc" 2>/dev/null)" != 0 ]; then
		echo "go test ($run) failed"
		cat "$side/$run.err" 2>/dev/null
		rc=1
	fi
done
for name in vet bench; do
	echo
	echo "== $name (beside the tests, $(cat "$side/$name.took")s) =="
	cat "$side/$name.out"
	if [ "$(cat "$side/$name.rc")" != 0 ]; then
		echo "$name failed"
		rc=1
	fi
done
echo
echo "== figures =="
cat "${LIKEN_TEST_REPORT:-/dev/null}" 2>/dev/null
echo "make test total: $(($(date +%s) - start))s"
exit $rc
