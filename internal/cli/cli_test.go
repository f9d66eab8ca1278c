package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func run(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := Run(t.Context(), args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestHelpListsEveryCommand(t *testing.T) {
	code, out, _ := run(t, "--help")
	if code != exitOK {
		t.Fatalf("--help exited %d", code)
	}
	for _, c := range commands {
		if !strings.Contains(out, c.name) {
			t.Errorf("--help does not list %s", c.name)
		}
		if c.run == nil && !strings.Contains(out, "not yet available: "+c.issue) {
			t.Errorf("--help does not mark %s as not yet available", c.name)
		}
	}
}

func TestPlannedCommandsRefuse(t *testing.T) {
	for _, c := range commands {
		if c.run != nil {
			continue
		}
		code, out, errOut := run(t, c.name, "--anything")
		if code != exitUnavailable || out != "" || !strings.Contains(errOut, "not yet available") {
			t.Errorf("liken %s: exit %d, stdout %q, stderr %q; want exit %d and a refusal", c.name, code, out, errOut, exitUnavailable)
		}
	}
	if code, _, _ := run(t, "frobnicate"); code != exitUsage {
		t.Errorf("unknown command exited %d, want %d", code, exitUsage)
	}
}

func TestValidate(t *testing.T) {
	examples := filepath.Join("..", "..", "docs", "examples")
	code, out, errOut := run(t, "validate", examples)
	if code != exitOK {
		t.Fatalf("validate examples: exit %d\n%s%s", code, out, errOut)
	}
	if !strings.Contains(out, "6 objects valid") {
		t.Errorf("validate output: %s", out)
	}

	dir := t.TempDir()
	b, _ := os.ReadFile(filepath.Join(examples, "server-1.yaml"))
	bad := strings.Replace(string(b), "role: server", "role: worker", 1)
	os.WriteFile(filepath.Join(dir, "bad.yaml"), []byte(bad), 0o644)
	code, out, _ = run(t, "validate", filepath.Join(examples, "cluster.yaml"), dir)
	if code != exitFailed || !strings.Contains(out, `Unsupported value: "worker"`) {
		t.Errorf("validate of an invalid Machine: exit %d\n%s", code, out)
	}
	if code, _, _ := run(t, "validate"); code != exitUsage {
		t.Errorf("validate without arguments exited %d, want %d", code, exitUsage)
	}
}

func TestCRDsPrintsBoth(t *testing.T) {
	code, out, _ := run(t, "crds")
	if code != exitOK || !strings.Contains(out, "name: clusters.liken.dev") || !strings.Contains(out, "name: machines.liken.dev") {
		t.Errorf("crds: exit %d, output lacks a CRD", code)
	}
}

func TestLayer(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out")
	ex := filepath.Join("..", "..", "docs", "examples")
	code, stdout, errOut := run(t, "layer", "--cluster", filepath.Join(ex, "cluster.yaml"), "--machines", ex, "--out", out)
	if code != exitOK {
		t.Fatalf("layer: %d %s", code, errOut)
	}
	for _, want := range []string{"server layer: ", "agent layer: ", "admin kubeconfig: ", "identity"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("layer output lacks %q:\n%s", want, stdout)
		}
	}
	for _, f := range []string{"server.layer", "agent.layer", "admin.kubeconfig", "identity/server-ca.key"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Errorf("%s not written: %v", f, err)
		}
	}
	if code, _, _ := run(t, "layer", "--cluster", filepath.Join(ex, "cluster.yaml")); code != exitUsage {
		t.Errorf("layer without --machines exited %d", code)
	}
}
