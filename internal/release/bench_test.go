package release

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	apirelease "liken.dev/liken/api/release"
	"liken.dev/liken/test/report"
)

// The test binary doubles as the two programs the benchmark compares, each in a process of
// its own so its peak memory can be read: LIKEN_TEST_HELPER=copy (a plain HTTP GET written
// to a file and synced) and =fetch (the verified fetch into a FileTarget).
func TestMain(m *testing.M) {
	switch os.Getenv("LIKEN_TEST_HELPER") {
	case "copy":
		os.Exit(helperCopy(os.Args[1], os.Args[2]))
	case "fetch":
		size, _ := strconv.ParseInt(os.Args[4], 10, 64)
		f := &Fetcher{}
		err := f.File(context.Background(), os.Args[1], os.Args[2], apirelease.File{Name: "rootfs.squashfs", Size: size, SHA256: os.Args[5], Role: apirelease.RoleRootfs}, FileTarget{Path: os.Args[3]})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func helperCopy(url, out string) int {
	resp, err := http.Get(url)
	if err != nil {
		return 1
	}
	defer resp.Body.Close()
	f, err := os.Create(out)
	if err != nil {
		return 1
	}
	if _, err := io.CopyBuffer(f, resp.Body, make([]byte, bufferSize)); err != nil {
		return 1
	}
	if err := f.Sync(); err != nil {
		return 1
	}
	return 0
}

// BenchmarkVerifiedDownload compares the verified, streaming fetch of one release file with a
// plain copy of the same bytes from the same local HTTP server, in the same run, and reads
// each process's peak resident memory. Size: LIKEN_BENCH_MIB (default 512).
func BenchmarkVerifiedDownload(b *testing.B) {
	mib := 512
	if v, err := strconv.Atoi(os.Getenv("LIKEN_BENCH_MIB")); err == nil && v > 0 {
		mib = v
	}
	size := int64(mib) << 20
	channel := b.TempDir()
	dir := filepath.Join(channel, version)
	os.MkdirAll(dir, 0o755)
	src := filepath.Join(dir, "rootfs.squashfs")
	f, _ := os.Create(src)
	h := sha256.New()
	rng := rand.NewChaCha8([32]byte{1})
	buf := make([]byte, bufferSize)
	for written := int64(0); written < size; written += int64(len(buf)) {
		rng.Read(buf)
		f.Write(buf)
		h.Write(buf)
	}
	f.Close()
	sum := hex.EncodeToString(h.Sum(nil))
	srv := httptest.NewServer(http.FileServer(http.Dir(channel)))
	defer srv.Close()

	out := b.TempDir()
	run := func(args ...string) (time.Duration, int64) {
		os.Remove(filepath.Join(out, "f"))
		cmd := exec.Command(os.Args[0], args[1:]...)
		cmd.Env = append(os.Environ(), "LIKEN_TEST_HELPER="+args[0])
		cmd.Stderr = os.Stderr
		start := time.Now()
		if err := cmd.Run(); err != nil {
			b.Fatalf("%s: %v", args[0], err)
		}
		return time.Since(start), cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss
	}
	best := func(d, cur time.Duration) time.Duration {
		if cur == 0 || d < cur {
			return d
		}
		return cur
	}
	var copyT, fetchT time.Duration
	var copyRSS, fetchRSS int64
	for i := 0; i < 3; i++ { // alternate, keep the best of each: the machine is shared
		d, rss := run("copy", srv.URL+"/"+version+"/rootfs.squashfs", filepath.Join(out, "f"))
		copyT, copyRSS = best(d, copyT), max(copyRSS, rss)
		d, rss = run("fetch", srv.URL, version, filepath.Join(out, "f"), strconv.FormatInt(size, 10), sum)
		fetchT, fetchRSS = best(d, fetchT), max(fetchRSS, rss)
	}
	ratio := copyT.Seconds() / fetchT.Seconds()
	mbps := func(d time.Duration) float64 { return float64(size) / d.Seconds() / (1 << 20) }
	b.ReportMetric(ratio, "throughput-ratio")
	b.ReportMetric(float64(fetchRSS)/1024, "fetch-peak-MiB")
	b.ReportMetric(0, "ns/op")
	report.Line("verified download of %d MiB from a local HTTP server: %.0f MiB/s vs plain copy %.0f MiB/s (ratio %.2f, both fsynced, best of 3); peak memory: fetch %.1f MiB, copy %.1f MiB",
		mib, mbps(fetchT), mbps(copyT), ratio, float64(fetchRSS)/1024, float64(copyRSS)/1024)
}
