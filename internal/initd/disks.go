package initd

import (
	"fmt"
	"strings"
	"time"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/disk"
	"liken.dev/liken/internal/host/datadisk"
	"liken.dev/liken/internal/initramfs"
)

// dataDisks prepares the disks spec.disks names (internal/host/datadisk), before k3s, so
// a mount k3s's data needs is there when it starts. A disk left untouched or failed never
// fails the boot: the machine runs without it, and status.disks says why.
func (s *system) dataDisks() error {
	if err := datadisk.LinkByID("/dev", "/sys"); err != nil {
		fmt.Fprintf(s.log, "liken-init: warning: /dev/disk/by-id: %v\n", err)
	}
	disks := s.machine.Spec.Disks
	s.report.Disks, s.report.Swap = disks, s.cluster.Spec.Features.Swap
	if len(disks) == 0 {
		return nil
	}
	sw := s.cluster.Spec.Features.Swap
	env := datadisk.Env{Dev: "/dev", Sys: "/sys", Tools: datadisk.ImageTools(), Wait: 10 * time.Second, Log: s.log, Swap: sw != nil && *sw}
	if dev, err := initramfs.WaitForDevice("PARTLABEL="+disk.State, time.Second); err == nil {
		env.InstallDisk = datadisk.WholeDisk("/sys", "/dev", dev)
	}
	start := time.Now()
	release := holdReaper() // sgdisk, mke2fs and mkswap are waited for here
	s.report.DiskStatus = env.Apply(disks)
	release()
	refused := s.disksNotReady()
	fmt.Fprintf(s.log, "liken-init: data disks done in %s: %d of %d ready\n", time.Since(start).Round(time.Millisecond), len(disks)-len(refused), len(disks))
	if len(refused) > 0 {
		s.notApplied("machine.spec.disks", "not ready: "+strings.Join(refused, ", ")+" (see status.disks)")
	}
	return nil
}

// disksNotReady names each data disk this boot could not make ready, with why.
func (s *system) disksNotReady() []string {
	var out []string
	for _, st := range s.report.DiskStatus {
		if st.Phase != v1alpha1.DiskReady {
			out = append(out, fmt.Sprintf("%s: %s", st.Device, st.Reason))
		}
	}
	return out
}

// withDisks adds to a failed boot's message the data disks that were not ready: a disk k3s's
// data needs that is missing leaves k3s, or init's preparation of it, nothing to work on.
func (s *system) withDisks(msg string) string {
	if refused := s.disksNotReady(); len(refused) > 0 {
		msg += "; data disks not ready: " + strings.Join(refused, ", ")
	}
	return msg
}

// unmountDataDisks unmounts what dataDisks mounted, and whatever was mounted below it, for a
// shutdown.
func (s *system) unmountDataDisks() {
	if _, err := unmountUnder(datadisk.MountPoints(s.report.Disks)); err != nil {
		fmt.Fprintf(s.log, "liken-init: %v\n", err)
	}
}
