package bootloader

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
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

// installedESP is an ESP directory as install writes it.
func installedESP(t *testing.T) ESP {
	t.Helper()
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, ConfigDir), 0o755)
	a, b, err := EnvCopies(Env{EnvDefaultSlot: SlotA, EnvInstallArgs: "quiet", EnvKernelArgs: "console=ttyS0,115200"})
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, EnvFile), a, 0o644)
	os.WriteFile(filepath.Join(dir, EnvFile2), b, 0o644)
	return ESP{Dir: dir}
}

// TestEnvSurvivesEveryPowerCut cuts power after every byte of each environment update a
// trial makes (arming, then committing, then arming again, so both copies are written
// over) and reads the environment as init does after each cut: it is always exactly the
// environment before the update or after it.
func TestEnvSurvivesEveryPowerCut(t *testing.T) {
	e := installedESP(t)
	updates := []struct {
		name   string
		change func(Env)
	}{
		{"arm a trial of B", func(env Env) { env[EnvTrialSlot], env[EnvTrialArgs] = SlotB, "console=ttyS0,115200 mitigations=off" }},
		{"GRUB consumes it", nil},
		{"commit B", func(env Env) {
			env[EnvDefaultSlot], env[EnvKernelArgs], env[EnvTrialSlot], env[EnvTrialArgs] = SlotB, env[EnvTrialArgs], "", ""
		}},
		{"arm a trial of A with shorter arguments", func(env Env) { env[EnvTrialSlot], env[EnvTrialArgs] = SlotA, "quiet" }},
	}
	cuts := 0
	for _, u := range updates {
		old, err := e.Env()
		if err != nil {
			t.Fatal(err)
		}
		if u.change == nil {
			// GRUB's save_env of trial_slot: one byte of the current copy, B to -.
			consumeTrial(t, e)
			if env, _ := e.Env(); env[EnvTrialSlot] != "" || env[EnvDefaultSlot] != old[EnvDefaultSlot] {
				t.Fatalf("%s: %v", u.name, env)
			}
			continue
		}
		cs, err := PowerCuts(e.Dir, u.change)
		if err != nil {
			t.Fatal(err)
		}
		want, err := e.Env()
		if err != nil {
			t.Fatal(err)
		}
		sawOld, sawNew := false, false
		for _, c := range cs {
			dir := t.TempDir()
			os.MkdirAll(filepath.Join(dir, ConfigDir), 0o755)
			for n, b := range c.Files {
				os.WriteFile(filepath.Join(dir, n), b, 0o644)
			}
			got, err := ESP{Dir: dir}.Env()
			switch {
			case err != nil:
				t.Fatalf("%s, cut after %d bytes: %v", u.name, c.Written, err)
			case reflect.DeepEqual(got, old):
				sawOld = true
			case reflect.DeepEqual(got, want):
				sawNew = true
			default:
				t.Fatalf("%s, cut after %d bytes: read %v; want the old %v or the new %v", u.name, c.Written, got, old, want)
			}
		}
		if !sawOld || !sawNew || !reflect.DeepEqual(cs[len(cs)-1].Files[EnvFile], mustRead(t, e.Dir, EnvFile)) {
			t.Fatalf("%s: the cuts do not run from the old environment to the new", u.name)
		}
		cuts += len(cs)
	}
	t.Logf("%d power cuts, each read back as the old or the new environment", cuts)
}

func mustRead(t *testing.T, dir, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// consumeTrial does what GRUB's "set trial_slot=-; save_env trial_slot" does to the current
// copy: its one byte, in place.
func consumeTrial(t *testing.T, e ESP) {
	t.Helper()
	_, cur, _, err := e.envCopies()
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(e.Dir, []string{EnvFile, EnvFile2}[cur])
	b := mustRead(t, e.Dir, []string{EnvFile, EnvFile2}[cur])
	i := bytes.Index(b, []byte("\n"+EnvTrialSlot+"="))
	if i < 0 {
		t.Fatal("no trial_slot in the current copy")
	}
	b[i+len(EnvTrialSlot)+2] = '-'
	os.WriteFile(p, b, 0o644)
}

// TestSlotRecordsSurviveATornWrite: a slot record write cut short at any length (or its file
// emptied, as FAT can leave a file whose clusters were not written) reads back as the
// records before the write or after it.
func TestSlotRecordsSurviveATornWrite(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, ConfigDir), 0o755)
	recA := SlotRecord{State: SlotReady, Version: "2026.11.29-001", Digest: "sha256:a", At: time.Unix(1785000000, 0).UTC()}
	a, b, err := SlotsCopies(Slots{SlotA: recA})
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, SlotsFile), a, 0o644)
	os.WriteFile(filepath.Join(dir, SlotsFile2), b, 0o644)
	e := ESP{Dir: dir}
	old, _ := e.Slots()
	// Which file the next write goes to, and what it holds before.
	before := map[string][]byte{SlotsFile: mustRead(t, dir, SlotsFile), SlotsFile2: mustRead(t, dir, SlotsFile2)}
	if err := e.SetSlot(SlotB, SlotRecord{State: SlotWriting, Version: "2026.11.30-001", Digest: "sha256:b"}); err != nil {
		t.Fatal(err)
	}
	want, _ := e.Slots()
	if reflect.DeepEqual(old, want) || len(want) != 2 {
		t.Fatalf("the write changed nothing: %v", want)
	}
	var target string
	for n, b := range before {
		if !bytes.Equal(b, mustRead(t, dir, n)) {
			target = n
		}
	}
	if target != SlotsFile2 {
		t.Fatalf("the write went to %q; want the older copy %s", target, SlotsFile2)
	}
	full := mustRead(t, dir, target)
	for n := 0; n <= len(full); n++ {
		os.WriteFile(filepath.Join(dir, target), full[:n], 0o644)
		got, err := e.Slots()
		if err != nil || (!reflect.DeepEqual(got, old) && !reflect.DeepEqual(got, want)) {
			t.Fatalf("torn after %d of %d bytes: %v %v", n, len(full), got, err)
		}
	}
}

// TestLegacyEnvironment: a disk installed with one environment copy and no generation is
// read and updated in place, as its grub.cfg expects.
func TestLegacyEnvironment(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, ConfigDir), 0o755)
	b, _ := Env{EnvDefaultSlot: SlotA, EnvTrialSlot: ""}.Encode()
	os.WriteFile(filepath.Join(dir, EnvFile), b, 0o644)
	e := ESP{Dir: dir}
	if err := e.UpdateEnv(func(env Env) { env[EnvTrialSlot] = SlotB }); err != nil {
		t.Fatal(err)
	}
	if env, err := e.Env(); err != nil || env[EnvTrialSlot] != SlotB {
		t.Fatalf("%v %v", env, err)
	}
	if _, err := os.Stat(filepath.Join(dir, EnvFile2)); err == nil {
		t.Error("a second copy appeared on a disk whose grub.cfg reads one")
	}
	// Its slot records are one file, the records alone: read, and written on as two copies.
	rec := SlotRecord{State: SlotReady, Version: "2026.11.01-001", Digest: "sha256:old", At: time.Unix(1785000000, 0).UTC()}
	b, _ = json.Marshal(Slots{SlotA: rec})
	os.WriteFile(filepath.Join(dir, SlotsFile), b, 0o644)
	if got, err := e.Slots(); err != nil || got[SlotA] != rec {
		t.Fatalf("legacy slot records: %v %v", got, err)
	}
	if err := e.SetSlot(SlotB, SlotRecord{State: SlotWriting, Version: "2026.12.01-001"}); err != nil {
		t.Fatal(err)
	}
	if got, err := e.Slots(); err != nil || got[SlotA] != rec || got[SlotB].State != SlotWriting {
		t.Fatalf("after a write on legacy records: %v %v", got, err)
	}
}
