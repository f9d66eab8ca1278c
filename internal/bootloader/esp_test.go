package bootloader

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestESPEnvAndSlots(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, ConfigDir), 0o755)
	b, _ := Env{EnvDefaultSlot: SlotA, EnvTrialSlot: ""}.Encode()
	os.WriteFile(filepath.Join(dir, EnvFile), b, 0o644)
	e := ESP{Dir: dir}

	if err := e.UpdateEnv(func(env Env) { env[EnvTrialSlot], env[EnvTrialArgs] = SlotB, "quiet console=ttyS0" }); err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(filepath.Join(dir, EnvFile))
	env, err := e.Env()
	if err != nil || st.Size() != EnvSize || env[EnvTrialSlot] != SlotB || env[EnvTrialArgs] != "quiet console=ttyS0" || env[EnvDefaultSlot] != SlotA {
		t.Fatalf("after the update: %v (%d bytes, %v)", env, st.Size(), err)
	}

	if s, err := e.Slots(); err != nil || len(s) != 0 {
		t.Fatalf("no slot file: %v %v", s, err)
	}
	rec := SlotRecord{State: SlotReady, Version: "2026.11.29-001", Digest: "sha256:x", SHA256: "y", Size: 42, At: time.Unix(1785000000, 0).UTC()}
	if err := e.SetSlot(SlotA, rec); err != nil {
		t.Fatal(err)
	}
	if err := e.SetSlot(SlotB, SlotRecord{State: SlotWriting, Version: "2026.11.29-002", Digest: "sha256:z"}); err != nil {
		t.Fatal(err)
	}
	if err := e.SetSlot("C", rec); err == nil {
		t.Error("a slot C was recorded")
	}
	s, err := e.Slots()
	if err != nil || s[SlotA] != rec || s[SlotB].State != SlotWriting {
		t.Fatalf("slots %+v %v", s, err)
	}
	if !s[SlotA].Holds("sha256:x") || s[SlotB].Holds("sha256:z") {
		t.Error("Holds: only a Ready slot holds its release")
	}
	if Other(SlotA) != SlotB || Other(SlotB) != SlotA {
		t.Error("Other")
	}
	if got := JoinArgs([]string{"a", "b"}, nil, []string{"c"}); got != "a b c" {
		t.Errorf("JoinArgs = %q", got)
	}
}
