package manifest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func write(t *testing.T, dir, name, body string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

const cluster = `apiVersion: liken.dev/v1alpha1
kind: Cluster
metadata: {name: liken}
spec:
  channel: file:///srv/channel
  releases: {"2026.07.20-001": "sha256:0000000000000000000000000000000000000000000000000000000000000000"}
  version: "2026.07.20-001"
`

func machine(name, mac, version string) string {
	s := "apiVersion: liken.dev/v1alpha1\nkind: Machine\nmetadata: {name: " + name + "}\nspec:\n  role: agent\n  match: {macs: [\"" + mac + "\"]}\n"
	if version != "" {
		s += "  version: \"" + version + "\"\n"
	}
	return s
}

func TestLoad(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		docs    int
		wantErr string
	}{
		{"one document", cluster, 1, ""},
		{"several documents and comments", "# fleet\n---\n" + cluster + "---\n# nothing\n---\n" + machine("a", "52:54:00:00:00:01", ""), 2, ""},
		{"integers stay integers", cluster + "  disruptionBudget: {maxUnavailable: 2}\n", 1, ""},
		{"duplicate key", cluster + "  version: \"2026.07.20-001\"\n", 0, "already set in map"},
		{"not YAML", "kind: [", 0, "parsing"},
		{"no kind", "apiVersion: v1\nmetadata: {name: x}\n", 0, "Object 'Kind' is missing"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := write(t, t.TempDir(), "m.yaml", tt.body)
			docs, err := Load(p)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Load error = %v, want it to contain %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(docs) != tt.docs {
				t.Fatalf("Load returned %d documents, want %d", len(docs), tt.docs)
			}
		})
	}
	if _, err := Load(t.TempDir()); err == nil || !strings.Contains(err.Error(), "no .yaml") {
		t.Errorf("Load of an empty directory: %v", err)
	}
}

func TestLoadKeepsIntegers(t *testing.T) {
	p := write(t, t.TempDir(), "c.yaml", cluster+"  disruptionBudget: {maxUnavailable: 2}\n")
	docs, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	v, _ := docs[0].Object.Object["spec"].(map[string]any)["disruptionBudget"].(map[string]any)["maxUnavailable"].(int64)
	if v != 2 {
		t.Errorf("maxUnavailable decoded as %#v, want int64 2", docs[0].Object.Object["spec"].(map[string]any)["disruptionBudget"])
	}
}

// TestCheckSet covers the rules that span objects, which no single API request can check.
func TestCheckSet(t *testing.T) {
	v, err := NewValidator()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		files []string
		want  string // "" = valid
	}{
		{"valid", []string{cluster, machine("a", "52:54:00:00:00:01", ""), machine("b", "52:54:00:00:00:02", "2026.07.20-001")}, ""},
		{"no cluster", []string{machine("a", "52:54:00:00:00:01", "")}, "no Cluster"},
		{"two clusters", []string{cluster, cluster}, "a second Cluster"},
		{"same machine twice", []string{cluster, machine("a", "52:54:00:00:00:01", ""), machine("a", "52:54:00:00:00:02", "")}, `Machine "a" is also defined`},
		{"same MAC on two machines", []string{cluster, machine("a", "52:54:00:00:00:01", ""), machine("b", "52:54:00:00:00:01", "")}, "both match MAC 52:54:00:00:00:01"},
		{"MAC case differs", []string{cluster, machine("a", "52:54:00:00:00:AA", ""), machine("b", "52:54:00:00:00:aa", "")}, "both match MAC"},
		{"unpinned machine version", []string{cluster, machine("a", "52:54:00:00:00:01", "2026.08.01-001")}, "2026.08.01-001 is not pinned"},
		{"invalid object", []string{cluster, strings.Replace(machine("a", "52:54:00:00:00:01", ""), "agent", "worker", 1)}, `Unsupported value: "worker"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			for i, f := range tt.files {
				write(t, dir, string(rune('a'+i))+".yaml", f)
			}
			docs, err := Load(dir)
			if err != nil {
				t.Fatal(err)
			}
			res := CheckSet(v, docs)
			var all []string
			all = append(all, res.SetErrors...)
			for _, o := range res.Objects {
				if len(o.Errors) > 0 {
					all = append(all, Describe(o.Doc.Object, o.Errors))
				}
			}
			got := strings.Join(all, "\n")
			if tt.want == "" {
				if !res.OK() {
					t.Fatalf("valid set refused:\n%s", got)
				}
				if res.Cluster == nil || len(res.Machines) != len(tt.files)-1 {
					t.Errorf("typed objects missing: cluster %v, %d machines", res.Cluster != nil, len(res.Machines))
				}
				return
			}
			if res.OK() || !strings.Contains(got, tt.want) {
				t.Errorf("got:\n%s\nwant an error containing %q", got, tt.want)
			}
		})
	}
}

func TestUpdateEnforcesTransitions(t *testing.T) {
	v, _ := NewValidator()
	dir := t.TempDir()
	docs, err := Load(write(t, dir, "m.yaml", machine("a", "52:54:00:00:00:01", "")))
	if err != nil {
		t.Fatal(err)
	}
	old := docs[0].Object
	changed := old.DeepCopy()
	changed.Object["spec"].(map[string]any)["role"] = "server"
	errs := v.Update(changed, old.DeepCopy())
	if errs.ToAggregate() == nil || !strings.Contains(errs.ToAggregate().Error(), "spec.role is immutable") {
		t.Errorf("role change: %v", errs.ToAggregate())
	}
	same := old.DeepCopy()
	if errs := v.Update(same, old.DeepCopy()); len(errs) > 0 {
		t.Errorf("an unchanged object is refused: %v", errs.ToAggregate())
	}
}

func TestSetReleasePin(t *testing.T) {
	v, _ := NewValidator()
	dir := t.TempDir()
	p := write(t, dir, "c.yaml", "# the fleet\n"+cluster+"  # keep me\n  rebootPolicy: Manual\n---\n"+machine("a", "52:54:00:00:00:01", ""))
	d := "sha256:" + strings.Repeat("ab", 32)
	if err := SetReleasePin(v, p, "2026.08.01-001", d); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	for _, want := range []string{"# the fleet", "# keep me", `"2026.08.01-001": ` + d, "kind: Machine"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("after pinning, the file lacks %q:\n%s", want, b)
		}
	}
	docs, err := Load(p)
	if err != nil || len(docs) != 2 {
		t.Fatalf("re-reading: %v, %d docs", err, len(docs))
	}
	if res := CheckSet(v, docs); !res.OK() || string(res.Cluster.Spec.Releases["2026.08.01-001"]) != d || res.Cluster.Spec.Releases["2026.07.20-001"] == "" {
		t.Errorf("pins after writing: %+v %v", res.Cluster.Spec.Releases, res.SetErrors)
	}
	// Re-pinning an existing version replaces its digest.
	d2 := "sha256:" + strings.Repeat("cd", 32)
	if err := SetReleasePin(v, p, "2026.08.01-001", d2); err != nil {
		t.Fatal(err)
	}
	b, _ = os.ReadFile(p)
	if strings.Contains(string(b), d) || !strings.Contains(string(b), d2) {
		t.Errorf("re-pin did not replace the digest:\n%s", b)
	}
	// An invalid result is never written.
	before, _ := os.ReadFile(p)
	if err := SetReleasePin(v, p, "latest", d); err == nil || !strings.Contains(err.Error(), "would be invalid") {
		t.Errorf("pinning an invalid version: %v", err)
	}
	after, _ := os.ReadFile(p)
	if string(before) != string(after) {
		t.Errorf("a refused pin changed the file")
	}
}

// TestCheckSetDiskPaths: a data disk named in a form liken's init never resolves is refused
// offline (the API server takes any path under /dev), with what to write instead.
func TestCheckSetDiskPaths(t *testing.T) {
	v, err := NewValidator()
	if err != nil {
		t.Fatal(err)
	}
	withDisk := func(device string) string {
		return machine("a", "52:54:00:00:00:01", "") + "  disks:\n    - device: " + device + "\n      partitions:\n        - label: data\n          mountPoint: /var/mnt/data\n"
	}
	tests := []struct {
		device string
		want   string // "" = valid
	}{
		{"/dev/disk/by-id/virtio-data1", ""},
		{"/dev/disk/by-id/nvme-eui.0025385b71b07e2f", ""},
		{"/dev/disk/by-id/ata-ST4000NM0035-1V4107_ZC1234AB", ""},
		{"/dev/disk/by-id/scsi-35000c500a1b2c3d4", ""},
		{"/dev/disk/by-id/wwn-0x5000c500a1b2c3d4", ""},
		{"/dev/vdb", ""},
		{"/dev/disk/by-id/scsi-SATA_ST4000NM0035-1V4_ZC1234AB", "spec.disks[0].device: Invalid value: \"/dev/disk/by-id/scsi-SATA_ST4000NM0035-1V4_ZC1234AB\": scsi-SATA_… links are made for SATA disks by sg3_utils' udev rules"},
		{"/dev/disk/by-id/usb-SanDisk_Ultra_4C530001", "liken makes no links for USB disks"},
		{"/dev/disk/by-id/lvm-pv-uuid-abc", "makes no lvm- links"},
		{"/dev/disk/by-path/pci-0000:00:1f.2-ata-1", "makes only /dev/disk/by-id links"},
		{"/dev/disk/by-id/wwn-0x5000C500A1B2C3D4", "lower-case"},
		{"/dev/disk/by-id/ata-ST4000NM0035-1V4107_ZC1234AB-part1", "names a partition"},
		{"/dev/sdb", "a kernel name, given in the order disks are found"},
		{"/dev/nvme0n1", "a kernel name"},
	}
	for _, tt := range tests {
		t.Run(tt.device, func(t *testing.T) {
			dir := t.TempDir()
			write(t, dir, "c.yaml", cluster)
			write(t, dir, "m.yaml", withDisk(tt.device))
			docs, err := Load(dir)
			if err != nil {
				t.Fatal(err)
			}
			res := CheckSet(v, docs)
			var got []string
			for _, o := range res.Objects {
				if len(o.Errors) > 0 {
					got = append(got, Describe(o.Doc.Object, o.Errors))
				}
			}
			got = append(got, res.SetErrors...)
			if tt.want == "" {
				if !res.OK() {
					t.Fatalf("refused:\n%s", strings.Join(got, "\n"))
				}
				return
			}
			if res.OK() || len(res.Machines) != 0 || !strings.Contains(strings.Join(got, "\n"), tt.want) {
				t.Errorf("got:\n%s\nwant a refusal of the Machine containing %q", strings.Join(got, "\n"), tt.want)
			}
		})
	}
}

// TestExamplesValid is `make examples`' check as a test: the example fleet passes CheckSet,
// its disks included.
func TestExamplesValid(t *testing.T) {
	v, err := NewValidator()
	if err != nil {
		t.Fatal(err)
	}
	docs, err := Load(filepath.Join("..", "..", "docs", "examples"))
	if err != nil {
		t.Fatal(err)
	}
	res := CheckSet(v, docs)
	for _, o := range res.Objects {
		if len(o.Errors) > 0 {
			t.Errorf("%s: %s", o.Doc.Source, Describe(o.Doc.Object, o.Errors))
		}
	}
	for _, e := range res.SetErrors {
		t.Error(e)
	}
}
