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
$GO test -count=1 -timeout 60m -json ./test/vm/ ./... | bin/ledger
rc=$?
wait
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
