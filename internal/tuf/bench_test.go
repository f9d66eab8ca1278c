package tuf

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"liken.dev/liken/internal/release"
)

// BenchmarkChannel100 measures a signed channel of 100 releases (each a release.json and a
// slot image as targets, as liken release publish signs them): the metadata's sizes, and
// what verification adds to a pin, a fresh client's whole check (root, timestamp, snapshot,
// targets, signatures) against the plain fetch of release.json that a pin makes anyway, both
// over a file:// channel so the network is out of the ratio.
func BenchmarkChannel100(b *testing.B) {
	dir := b.TempDir()
	r := &Repo{Channel: dir, Expiry: DefaultExpiry}
	keyDir := filepath.Join(b.TempDir(), "keys")
	root, err := r.Init(InitOptions{KeyDir: keyDir})
	if err != nil {
		b.Fatal(err)
	}
	keys, err := LoadKeys(keyDir)
	if err != nil {
		b.Fatal(err)
	}
	var last, lastDigest string
	for i := range 100 {
		v := fmt.Sprintf("2026.%02d.%02d-001", 1+i/28, 1+i%28)
		doc := []byte(fmt.Sprintf(`{"schema":"liken.dev/release/v1","version":%q,"files":[{"name":"slot.img","size":145752064}]}`, v))
		os.MkdirAll(filepath.Join(dir, v), 0o755)
		os.WriteFile(filepath.Join(dir, v, "release.json"), doc, 0o644)
		ds := sha256.Sum256(doc)
		img := sha256.Sum256([]byte(v))
		if err := r.AddTargets(keys, []Target{{Path: v + "/release.json", Size: int64(len(doc)), SHA256: hex.EncodeToString(ds[:])},
			{Path: v + "/slot.img", Size: 145752064, SHA256: hex.EncodeToString(img[:])}}); err != nil {
			b.Fatal(err)
		}
		last, lastDigest = v, "sha256:"+hex.EncodeToString(ds[:])
	}
	size := func(name string) float64 {
		st, err := os.Stat(filepath.Join(dir, MetadataDir, name))
		if err != nil {
			b.Fatal(err)
		}
		return float64(st.Size())
	}
	ctx := context.Background()
	channel := "file://" + dir
	f := &release.Fetcher{}
	// The plain fetch a pin makes anyway.
	plainStart := time.Now()
	const plainRuns = 20
	for range plainRuns {
		if _, err := f.Raw(ctx, channel, last+"/release.json", 1<<20); err != nil {
			b.Fatal(err)
		}
	}
	plain := time.Since(plainStart) / plainRuns
	start := time.Now()
	for b.Loop() {
		if err := VerifyRelease(ctx, f, channel, root, last, lastDigest, ""); err != nil {
			b.Fatal(err)
		}
	}
	verify := time.Since(start) / time.Duration(b.N)
	b.ReportMetric(size("101.targets.json")/1024, "targets-KiB")
	b.ReportMetric(size("1.root.json")/1024, "root-KiB")
	b.ReportMetric(size("101.snapshot.json")+size("timestamp.json"), "snapshot+timestamp-B")
	b.ReportMetric(float64(verify.Microseconds())/1000, "verify-ms")
	b.ReportMetric(float64(plain.Microseconds())/1000, "plain-fetch-ms")
}
