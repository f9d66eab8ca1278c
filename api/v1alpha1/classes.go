package v1alpha1

import "strings"

// FieldClass gives one spec field (and everything below it, unless a deeper entry says
// otherwise) its change class.
type FieldClass struct {
	// Path is the field's path from the kind, such as "machine.spec.network".
	Path string
	// Class says how a change reaches a machine.
	Class ChangeClass
	// ServersOnly marks fields that change only servers' k3s configuration; agents render
	// the same files either way and so never restart for them.
	ServersOnly bool
	// Why is the one-line reason shown in the API reference.
	Why string
}

// FieldClasses is the change-class table: every field of Cluster.spec and Machine.spec has
// exactly one class, that of its nearest entry here (tests fail when a field has none, and
// when an Immutable entry has no API rule refusing its change). The agent classifies every
// difference with it and the reference documentation is generated from it.
var FieldClasses = []FieldClass{
	{Path: "cluster.spec.channel", Class: Live, Why: "read only when a release is fetched"},
	{Path: "cluster.spec.channelRoot", Class: Live, Why: "the channel's signatures are checked when a release is fetched"},
	{Path: "cluster.spec.insecureUnsignedChannel", Class: Live, Why: "read when a release is fetched"},
	{Path: "cluster.spec.channelCA", Class: Live, Why: "the channel's server is checked against it when a release is fetched"},
	{Path: "cluster.spec.releases", Class: Live, Why: "pins are checked when a release is fetched"},
	{Path: "cluster.spec.version", Class: Reboot, Why: "a new release is written to the inactive slot and booted as a trial"},
	{Path: "cluster.spec.rebootPolicy", Class: Live, Why: "policy read when a reboot is due"},
	{Path: "cluster.spec.disruptionBudget", Class: Live, Why: "policy read when a turn is granted"},
	{Path: "cluster.spec.drain", Class: Live, Why: "policy read when a drain starts"},
	{Path: "cluster.spec.maintenanceWindows", Class: Live, Why: "policy read when a turn is granted"},
	{Path: "cluster.spec.rollout", Class: Live, Why: "policy read when a turn is granted"},
	{Path: "cluster.spec.features.traefik", Class: RestartK3s, ServersOnly: true, Why: "k3s disable=traefik, read at k3s start"},
	{Path: "cluster.spec.features.metricsServer", Class: RestartK3s, ServersOnly: true, Why: "k3s disable=metrics-server, read at k3s start"},
	{Path: "cluster.spec.features.localStorage", Class: RestartK3s, ServersOnly: true, Why: "k3s disable=local-storage, read at k3s start"},
	{Path: "cluster.spec.features.coreDNS", Class: RestartK3s, ServersOnly: true, Why: "k3s disable=coredns, read at k3s start"},
	{Path: "cluster.spec.features.serviceLB", Class: Immutable, Why: "k3s requires disable=servicelb to match on every server"},
	{Path: "cluster.spec.features.networkPolicy", Class: Immutable, Why: "k3s requires disable-network-policy to match on every server"},
	{Path: "cluster.spec.features.embeddedRegistry", Class: Immutable, Why: "k3s requires embedded-registry to match on every server"},
	{Path: "cluster.spec.features.secretsEncryption", Class: Immutable, Why: "k3s requires secrets-encryption to match on every server"},
	{Path: "cluster.spec.features.flannelBackend", Class: Immutable, Why: "k3s requires the flannel flags to match on every server"},
	{Path: "cluster.spec.registries", Class: RestartK3s, Why: "containerd reads registries.yaml only when k3s starts; pods keep running"},
	{Path: "cluster.spec.sysctls", Class: Live, Why: "written to /proc/sys"},
	{Path: "cluster.spec.features.swap", Class: NextBoot, Why: "swap partitions are activated at boot, before k3s, which accepts swap whenever swap is on"},
	{Path: "cluster.spec.kernelArgs", Class: NextBoot, Why: "the kernel command line is read at boot; boots as a trial"},
	{Path: "cluster.spec.registrationAddress", Class: RestartK3s, ServersOnly: true, Why: "servers name it in their certificate (k3s tls-san), read at k3s start; machines that have joined reach the servers directly, and a machine joins through the address its layer carries"},
	{Path: "cluster.spec.timeServers", Class: Live, Why: "the agent keeps the clock with them; init reads the applied ones at boot"},
	{Path: "cluster.spec.logs", Class: Live, Why: "read at boot, when the logs of the boot before are kept and the oldest removed"},
	{Path: "cluster.spec.network", Class: Immutable, Why: "k3s cannot move a running cluster to new address ranges"},

	{Path: "machine.spec.role", Class: Immutable, Why: "a server's datastore and an agent's state are not interchangeable: reinstall"},
	{Path: "machine.spec.match", Class: NextBoot, Why: "read at boot to find this machine's manifest"},
	{Path: "machine.spec.install", Class: Immutable, Why: "records the disk liken was installed on"},
	{Path: "machine.spec.disks", Class: Reboot, Why: "disks are prepared and mounted before k3s starts, and a disk holding data is never touched (docs/disks.md)"},
	{Path: "machine.spec.network", Class: Reboot, Why: "interfaces, bonds and addresses are set up before k3s starts; the reboot tries them once as a trial and falls back to the last good ones"},
	{Path: "machine.spec.kernelModules", Class: NextBoot, Why: "modules and their parameters are loaded at boot"},
	{Path: "machine.spec.sysctls", Class: Live, Why: "written to /proc/sys"},
	{Path: "machine.spec.nodeLabels", Class: Live, Why: "patched on the Node (k3s reads node-label only at registration)"},
	{Path: "machine.spec.nodeTaints", Class: Live, Why: "patched on the Node (k3s reads node-taint only at registration)"},
	{Path: "machine.spec.kernelArgs", Class: NextBoot, Why: "the kernel command line is read at boot; boots as a trial"},
	{Path: "machine.spec.rebootPolicy", Class: Live, Why: "policy read when a reboot is due"},
	{Path: "machine.spec.version", Class: Reboot, Why: "a new release is written to the inactive slot and booted as a trial"},
	{Path: "machine.spec.retryFailedDigest", Class: Live, Why: "lets the upgrade logic try a failed digest once more"},
	{Path: "machine.spec.reboot", Class: Live, Why: "an operator's approval or request, acted on by the reboot logic"},
	{Path: "machine.spec.etcdRestore", Class: Reboot, Why: "etcd is restored before k3s starts, at the next boot (k3s --cluster-reset)"},
	{Path: "machine.spec.etcdRejoin", Class: Reboot, Why: "etcd's data is set aside before k3s starts, at the next boot, and k3s joins the cluster again"},
}

// ClassOf returns the class of the field at path ("machine.spec.network.interfaces", say):
// that of the deepest FieldClasses entry at or above it.
func ClassOf(path string) (FieldClass, bool) {
	best, found := FieldClass{}, false
	for _, fc := range FieldClasses {
		if (path == fc.Path || strings.HasPrefix(path, fc.Path+".")) && len(fc.Path) > len(best.Path) {
			best, found = fc, true
		}
	}
	return best, found
}
