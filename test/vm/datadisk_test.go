package vm

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/disk"
	"liken.dev/liken/test/report"
)

// vmDisks is spec.disks for vm-1's two extra virtio disks (serials data1 and data2): on
// the first, a plain data partition and k3s's own data directory (a mount k3s needs,
// made before it starts); on the second a FAT partition and swap.
const vmDisks = `  disks:
    - device: /dev/disk/by-id/virtio-data1
      partitions:
        - label: data
          size: 64Mi
          mountPoint: /var/mnt/data
        - label: k3s-data
          mountPoint: /var/lib/rancher/k3s/data
    - device: /dev/disk/by-id/virtio-data2
      partitions:
        - label: scratch
          size: 40Mi
          filesystem: vfat
          mountPoint: /var/mnt/scratch
        - label: swap
          filesystem: swap
`

// dataDisk makes an empty disk image of sizeMiB for a test.
func dataDisk(t *testing.T, name string, sizeMiB int64) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name+".img")
	if err := os.WriteFile(p, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(p, sizeMiB<<20); err != nil {
		t.Fatal(err)
	}
	return p
}

// bootUEFIWithDisks is bootUEFI with more virtio disks after the install disk.
func bootUEFIWithDisks(t *testing.T, diskPath string, extra []Disk, allowReboot bool, nics ...string) *VM {
	t.Helper()
	d := Disk{Path: diskPath}
	if parts, err := disk.Read(diskPath); err == nil && parts[disk.ESP].SectorSize > 512 {
		d.SectorSize = int(parts[disk.ESP].SectorSize)
	}
	return bootWith(t, Options{UEFI: true, VarsDir: t.TempDir(), Disks: append([]Disk{d}, extra...), AllowReboot: allowReboot, NICs: nics})
}

// diskState is status.disks as "device phase/reason", in order.
func diskState(m *v1alpha1.Machine) []string {
	var out []string
	for _, d := range m.Status.Disks {
		out = append(out, string(d.Device)+" "+string(d.Phase)+"/"+d.Reason)
	}
	return out
}

func disksAre(m *v1alpha1.Machine, reasons ...string) bool {
	if len(m.Status.Disks) != len(reasons) {
		return false
	}
	for i, d := range m.Status.Disks {
		if d.Phase != v1alpha1.DiskReady || d.Reason != reasons[i] {
			return false
		}
	}
	return true
}

// partitionFiles lists the root directory of partition n of a disk image, read with
// debugfs from a read-only loop device over the partition (the VM is stopped).
func partitionFiles(t *testing.T, img string, n int) string {
	t.Helper()
	parts, err := disk.Read(img)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range parts {
		if e.Index == n {
			return debugfs(t, img, e, "ls -l /")
		}
	}
	t.Fatalf("%s has no partition %d", img, n)
	return ""
}

// debugfs runs one debugfs request ("ls -l /", "cat /log/kernel.log") on the ext4 file
// system in partition e of a disk image, through a read-only loop device (the VM is
// stopped), and returns its output.
func debugfs(t *testing.T, img string, e disk.Extent, request string) string {
	t.Helper()
	out, err := exec.Command("losetup", "--find", "--show", "--read-only", "--offset", strconv.FormatInt(e.Offset, 10),
		"--sizelimit", strconv.FormatInt(e.Size, 10), img).CombinedOutput()
	if err != nil {
		t.Fatalf("losetup: %v: %s", err, out)
	}
	loop := strings.TrimSpace(string(out))
	defer exec.Command("losetup", "-d", loop).Run()
	res, err := exec.Command("debugfs", "-R", request, loop).Output()
	if err != nil {
		t.Fatalf("debugfs -R %q: %v", request, err)
	}
	return string(res)
}

// TestDataDiskAndNetworkTrials: one server machine through the trials of its disks and its
// network (TestNetworkChangeIsATrial was its own machine until December 2026: both need a
// server on the host's API server, release A and the same disk, so one boot serves both).
//
// A disk holding data that spec.disks names is left untouched (not one byte changes) while
// the machine boots and runs k3s; status.disks says what it found, with its serial and
// content ID; the Machine is Degraded/DiskRefused and an Event says so. A wipe naming that
// serial and content, approved, erases it once and prepares it. An approved spec.network
// change that cuts the machine off from its API server (an address and a gateway on another
// subnet) boots once as a trial, misses its health deadline, and the boot after it is back on
// the last good network, with the failure and init's reason in status, and no further reboot
// for those settings; a good change (an MTU) boots as a trial and commits. Then a disk for
// k3s's data that is not there boots as a trial: k3s finds nothing to start on, and the boot
// after runs the last good disks, with the failure and init's reason in status.
func TestDataDiskAndNetworkTrials(t *testing.T) {
	vmTest(t)
	held := dataDisk(t, "held", 96)
	if out, err := exec.Command("mke2fs", "-q", "-F", "-t", "ext4", "-L", "old-data", held).CombinedOutput(); err != nil {
		t.Fatalf("mke2fs: %v: %s", err, out)
	}
	before := fileSum(t, held)
	const spec = `  disks:
    - device: /dev/disk/by-id/virtio-olddata
      partitions:
        - label: data
          mountPoint: /var/mnt/data
`
	// The deadline fails the bad network's trial (nothing else ends it) and must let the good
	// trials (the wipe's, the MTU's) commit beside other tests.
	j := joinAs(t, vmMachine+spec, "liken.trial.deadline=90")
	vm := bootUEFIWithDisks(t, j.disk, []Disk{{Path: held, Serial: "olddata"}}, true, vmMAC)
	start := time.Now()
	m := j.waitMachine(t, "the disk refused, k3s running", firstBoot, func(m *v1alpha1.Machine) bool {
		c := meta.FindStatusCondition(m.Status.Conditions, v1alpha1.MachineDegraded)
		return len(m.Status.Disks) == 1 && m.Status.Disks[0].Reason == v1alpha1.DiskHoldsData &&
			c != nil && c.Reason == v1alpha1.ReasonDiskRefused && meta.IsStatusConditionTrue(m.Status.Conditions, v1alpha1.MachineReady)
	})
	refusedAfter := time.Since(start)
	d := m.Status.Disks[0]
	if d.Phase != v1alpha1.DiskRefused || d.Serial != "olddata" || !strings.HasPrefix(d.Path, "/dev/vd") || !strings.HasPrefix(d.ContentID, "sha256:") ||
		!strings.Contains(d.Message, "found an ext2/3/4 file system") {
		t.Errorf("status.disks: %+v", d)
	}
	j.waitEvents(t, "vm-1", v1alpha1.ReasonDiskRefused, 1)
	if got := fileSum(t, held); got != before {
		t.Errorf("the refused disk changed while the machine ran")
	}

	// The wipe names the disk's serial and what it holds: one approved reboot erases and
	// prepares it.
	mark := vm.Mark()
	j.editMachine(t, func(m *v1alpha1.Machine) {
		m.Spec.Disks[0].Wipe = &v1alpha1.DiskWipe{Serial: d.Serial, ContentID: d.ContentID}
	})
	j.waitMachine(t, "the wipe staged", 2*time.Minute, func(m *v1alpha1.Machine) bool { return hasPending(m, "machine.spec.disks") })
	approved := time.Now()
	j.approve(t)
	expectAfter(t, vm, mark, "liken-init: disk /dev/disk/by-id/virtio-olddata: wiping "+d.Path+" (an ext2/3/4 file system)", 5*time.Minute)
	m = j.waitMachine(t, "the disk wiped and prepared, Ready with nothing pending", 5*time.Minute, func(m *v1alpha1.Machine) bool {
		return disksAre(m, v1alpha1.DiskWiped) && len(m.Status.Pending) == 0 && !meta.IsStatusConditionTrue(m.Status.Conditions, v1alpha1.MachineDegraded) &&
			meta.IsStatusConditionTrue(m.Status.Conditions, v1alpha1.MachineReady)
	})
	if m.Status.Disks[0].ContentID == d.ContentID || !strings.HasPrefix(m.Status.Disks[0].ContentID, "gpt:") {
		t.Errorf("after the wipe the content ID is %s", m.Status.Disks[0].ContentID)
	}
	wiped := time.Since(approved)
	j.waitEvents(t, "vm-1", "DiskWiped", 1)
	j.waitEvents(t, "vm-1", v1alpha1.ReasonDiskRefused, 1) // none more: the wiped boot refused nothing

	networkTrials(t, j, vm)

	// A disk for k3s's data that is not there. Its reboot is a trial: init finds no such disk
	// and puts an empty read-only file system at k3s's data directory, where this server's
	// init cannot prepare k3s (an agent's k3s would not start), so the trial fails; the boot
	// after runs the last good disks.
	mark = vm.Mark()
	j.editMachine(t, func(m *v1alpha1.Machine) {
		m.Spec.Disks = append(m.Spec.Disks, v1alpha1.Disk{Device: "/dev/disk/by-id/virtio-nosuch",
			Partitions: []v1alpha1.Partition{{Label: "k3s", MountPoint: "/var/lib/rancher/k3s"}}})
	})
	j.waitMachine(t, "the disk for k3s's data staged", 2*time.Minute, func(m *v1alpha1.Machine) bool {
		return hasPending(m, "machine.spec.disks") && m.Status.Reboot.State == v1alpha1.RebootWaitingForApproval
	})
	approved = time.Now()
	j.approve(t)
	expectAfter(t, vm, mark, "liken-init: network and disks: this trial boot tries the staged settings", 5*time.Minute)
	expectAfter(t, vm, mark, "data disks not ready: /dev/disk/by-id/virtio-nosuch: NotFound", 5*time.Minute)
	failed := vm.Mark()
	// The failed boot released its file systems before it rebooted.
	expectAfter(t, vm, failed, "liken-init: the state partition was cleanly unmounted", 3*time.Minute)
	expectAfter(t, vm, failed, "liken-init: network and disks: the last good settings", 3*time.Minute)
	m = j.waitMachine(t, "the failed disk trial reported, Ready on the last good disks", 5*time.Minute, func(m *v1alpha1.Machine) bool {
		c := meta.FindStatusCondition(m.Status.Conditions, v1alpha1.MachineUpgradeFailed)
		return c != nil && c.Status == metav1.ConditionTrue && c.Reason == v1alpha1.ReasonInitFailed &&
			strings.Contains(c.Message, "the disks of spec.disks that k3s's data needs failed their trial") &&
			meta.IsStatusConditionTrue(m.Status.Conditions, v1alpha1.MachineReady) && m.Status.Reboot.State == v1alpha1.RebootNone &&
			hasPending(m, "machine.spec.disks") && disksAre(m, v1alpha1.DiskMounted)
	})
	fellBack := time.Since(approved)
	if c := meta.FindStatusCondition(m.Status.Conditions, v1alpha1.MachineUpgradeFailed); !strings.Contains(c.Message, "virtio-nosuch: NotFound") {
		t.Errorf("the failure does not name the disk that was not there: %s", c.Message)
	}
	j.waitEvents(t, "vm-1", "TrialFailed", 2) // the bad network's, and this one
	report.Line("data disk in the VM (TCG): the disk holding data refused, untouched and reported %s after the VM started; approval of the wipe to the disk wiped, prepared and reported %s; a disk for k3s's data that is not there, approved: the trial failed (init could not prepare k3s) and the machine was back on its last good disks, reported %s after the approval",
		refusedAfter.Round(time.Second), wiped.Round(time.Second), fellBack.Round(time.Second))
}

// waitEvents waits up to a minute for n Events of a reason about a Machine (the agent
// records them after the status they go with), then checks there are no more than n.
func (j *joined) waitEvents(t *testing.T, name, reason string, n int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for j.eventsOf(t, name)[reason] < n && time.Now().Before(deadline) {
		time.Sleep(time.Second)
	}
	if got := j.eventsOf(t, name)[reason]; got != n {
		t.Errorf("%d %s Events about %s; want %d", got, reason, name, n)
	}
}

func fileSum(t *testing.T, p string) string {
	t.Helper()
	out, err := exec.Command("sha256sum", p).Output()
	if err != nil {
		t.Fatal(err)
	}
	return strings.Fields(string(out))[0]
}

func ptr[T any](v T) *T { return &v }

// machine reads vm-1.
func (j *joined) machine(t *testing.T) *v1alpha1.Machine {
	t.Helper()
	m, err := j.lc.Machine(t.Context(), "vm-1")
	if err != nil {
		t.Fatal(err)
	}
	return m
}
