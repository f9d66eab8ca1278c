package supervisor

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"liken.dev/liken/internal/bootloader"
	"liken.dev/liken/internal/state"
)

// recordingBoot stands in for init's boot control on the host side.
type recordingBoot struct {
	slots   map[string]bootloader.SlotRecord
	reboots []RebootRequest
	commits int
	fails   []string
}

func (b *recordingBoot) Info() (BootInfo, error) {
	return BootInfo{Slot: "A", DefaultSlot: "A", Slots: b.slots, KernelArgs: "quiet"}, nil
}

func (b *recordingBoot) SetSlot(slot string, r bootloader.SlotRecord) error {
	if slot == "A" {
		return errors.New("slot A is running")
	}
	b.slots[slot] = r
	return nil
}

func (b *recordingBoot) Reboot(r RebootRequest) error { b.reboots = append(b.reboots, r); return nil }
func (b *recordingBoot) Commit() error                { b.commits++; return errors.New("this boot is not a trial") }
func (b *recordingBoot) FailTrial(end, msg string) error {
	b.fails = append(b.fails, end+": "+msg)
	if len(b.fails) > 1 {
		return errors.New("a reboot is already under way")
	}
	return nil
}

func serve(t *testing.T, s *Server) Client {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "init.sock")
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go s.Serve(ctx, sock)
	c := Client{Socket: sock}
	for i := 0; i < 100; i++ {
		if _, err := c.BootInfo(ctx); err == nil || !strings.Contains(err.Error(), "no such file") {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	return c
}

func TestBootEndpoints(t *testing.T) {
	b := &recordingBoot{slots: bootloader.Slots{}}
	c := serve(t, &Server{Boot: b})
	ctx := t.Context()
	info, err := c.BootInfo(ctx)
	if err != nil || info.Slot != "A" || info.KernelArgs != "quiet" {
		t.Fatalf("BootInfo: %+v %v", info, err)
	}
	rec := bootloader.SlotRecord{State: bootloader.SlotWriting, Version: "2026.11.29-002"}
	if err := c.SetSlot(ctx, "B", rec); err != nil || b.slots["B"] != rec {
		t.Fatalf("SetSlot B: %v %+v", err, b.slots)
	}
	if err := c.SetSlot(ctx, "A", rec); err == nil || !strings.Contains(err.Error(), "slot A is running") {
		t.Errorf("SetSlot of the running slot: %v", err)
	}
	if err := c.Reboot(ctx, RebootRequest{TrialSlot: "B", TrialArgs: "quiet x=1", Why: "test"}); err != nil || len(b.reboots) != 1 || b.reboots[0].TrialArgs != "quiet x=1" {
		t.Errorf("Reboot: %v %+v", err, b.reboots)
	}
	if err := c.CommitTrial(ctx); err == nil || !strings.Contains(err.Error(), "not a trial") {
		t.Errorf("CommitTrial outside a trial: %v", err)
	}
	// An end init does not know is refused before it reaches the boot control.
	if err := c.FailTrial(ctx, "poweroff", "x"); err == nil || !strings.Contains(err.Error(), "cannot end") || len(b.fails) != 0 {
		t.Errorf("FailTrial with an unknown end: %v %q", err, b.fails)
	}
	// No end (an agent from before peers' waits) is the gates' end.
	if err := c.FailTrial(ctx, "", "gate smoke: Job failed"); err != nil || len(b.fails) != 1 || b.fails[0] != state.EndGatesFailed+": gate smoke: Job failed" {
		t.Errorf("FailTrial: %v %q", err, b.fails)
	}
	if err := c.FailTrial(ctx, state.EndPeersUnreachable, "again"); err == nil || !strings.Contains(err.Error(), "already under way") || b.fails[1] != state.EndPeersUnreachable+": again" {
		t.Errorf("FailTrial refused by init: %v", err)
	}
}

func TestBootEndpointsWithoutBootControl(t *testing.T) {
	c := serve(t, &Server{})
	if _, err := c.BootInfo(t.Context()); !errors.Is(err, ErrNoBootControl) {
		t.Errorf("BootInfo without boot control: %v", err)
	}
}
