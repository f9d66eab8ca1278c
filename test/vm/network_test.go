package vm

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/test/report"
)

// linkMTU is the MTU status.network shows for a link, 0 if it shows none.
func linkMTU(m *v1alpha1.Machine, name string) int32 {
	if m.Status.Network == nil {
		return 0
	}
	for _, l := range m.Status.Network.Links {
		if l.Name == name {
			return l.MTU
		}
	}
	return 0
}

// networkTrials takes vm-1, Ready with nothing pending and booted with a trial deadline of
// 90 s, through its network's trials (TestDataDiskAndNetworkTrials): an approved spec.network
// change that cuts the machine off from its API server (an address and a gateway on another
// subnet) boots once as a trial, misses its health deadline, and the boot after it is back
// on the last good network, with the failure and init's reason in status, and no further
// reboot for those settings. A good change (an MTU) boots as a trial and commits.
func networkTrials(t *testing.T, j *joined, vm *VM) {
	t.Helper()
	mark := vm.Mark()
	j.editMachine(t, func(m *v1alpha1.Machine) {
		m.Spec.Network.Interfaces[0].Addresses = []string{"10.0.3.15/24"}
		m.Spec.Network.Routes = []v1alpha1.Route{{To: "0.0.0.0/0", Via: "10.0.3.2"}}
	})
	j.waitMachine(t, "the bad network staged", 2*time.Minute, func(m *v1alpha1.Machine) bool {
		return hasPending(m, "machine.spec.network") && m.Status.Reboot.State == v1alpha1.RebootWaitingForApproval
	})
	start := time.Now()
	j.approve(t)
	expectAfter(t, vm, mark, "liken-init: network and disks: this trial boot tries the staged settings", 5*time.Minute)
	expectAfter(t, vm, mark, "missed its health deadline", 5*time.Minute)
	expectAfter(t, vm, mark, "liken-init: network and disks: the last good settings", 3*time.Minute)
	if !inOrder(vm.Console()[mark:], "liken-init: network and disks: this trial boot tries the staged settings", "missed its health deadline",
		"liken-init: network and disks: the last good settings") {
		t.Errorf("the trial, its missed deadline and the fallback to the last good settings are not in that order on the console")
	}
	m := j.waitMachine(t, "the failed trial reported, Ready on the old network", 5*time.Minute, func(m *v1alpha1.Machine) bool {
		c := meta.FindStatusCondition(m.Status.Conditions, v1alpha1.MachineUpgradeFailed)
		return c != nil && c.Status == "True" && c.Reason == v1alpha1.ReasonHealthDeadline && strings.Contains(c.Message, "spec.network failed their trial") &&
			meta.IsStatusConditionTrue(m.Status.Conditions, v1alpha1.MachineReady) && m.Status.Reboot.State == v1alpha1.RebootNone
	})
	fellBack := time.Since(start)
	c := meta.FindStatusCondition(m.Status.Conditions, v1alpha1.MachineUpgradeFailed)
	if !strings.Contains(c.Message, "is unreachable on this boot's network") {
		t.Errorf("the failure does not say the API server was unreachable: %s", c.Message)
	}
	// Once its turn is given back, the machine says why it does not reboot for what is pending.
	j.waitMachine(t, "no reboot for the failed settings", 2*time.Minute, func(m *v1alpha1.Machine) bool {
		return hasPending(m, "machine.spec.network") && m.Status.Reboot.State == v1alpha1.RebootNone &&
			strings.Contains(m.Status.Reboot.Message, "machine.spec.network failed a trial here")
	})
	j.waitEvents(t, "vm-1", "TrialFailed", 1)
	// Not tried again: no reboot while the spec asks for the same settings.
	quiet := vm.Mark()
	time.Sleep(20 * time.Second)
	if c := vm.Console()[quiet:]; strings.Contains(c, "liken-init: shutting down") {
		t.Fatalf("the machine rebooted again for settings that failed their trial:\n%s", c)
	}

	// A good change: the old address, an MTU of 1400.
	mark = vm.Mark()
	j.editMachine(t, func(m *v1alpha1.Machine) {
		m.Spec.Network.Interfaces[0].Addresses = []string{"10.0.2.15/24"}
		m.Spec.Network.Interfaces[0].MTU = 1400
		m.Spec.Network.Routes = []v1alpha1.Route{{To: "0.0.0.0/0", Via: "10.0.2.2"}}
	})
	j.waitMachine(t, "the good network staged", 2*time.Minute, func(m *v1alpha1.Machine) bool {
		return hasPending(m, "machine.spec.network") && m.Status.Reboot.State == v1alpha1.RebootWaitingForApproval &&
			!meta.IsStatusConditionTrue(m.Status.Conditions, v1alpha1.MachineUpgradeFailed)
	})
	start = time.Now()
	j.approve(t)
	expectAfter(t, vm, mark, "liken-init: network and disks: this trial boot tries the staged settings", 5*time.Minute)
	expectAfter(t, vm, mark, "liken-init: trial of slot A committed", 5*time.Minute)
	j.waitMachine(t, "the network committed, MTU 1400", 3*time.Minute, func(m *v1alpha1.Machine) bool {
		return len(m.Status.Pending) == 0 && meta.IsStatusConditionTrue(m.Status.Conditions, v1alpha1.MachineReady) &&
			!meta.IsStatusConditionTrue(m.Status.Conditions, v1alpha1.MachineUpgradeFailed) && linkMTU(m, "eth0") == 1400
	})
	committed := time.Since(start)
	report.Line("network change as a trial in the VM (TCG, trial deadline 90 s): approval of an unreachable address to the fallback reported %s; approval of a good change (MTU) to its commit %s",
		fellBack.Round(time.Second), committed.Round(time.Second))
}
