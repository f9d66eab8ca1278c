package v1alpha1

import (
	"sort"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// ClusterName is the name of the one Cluster object a liken cluster has.
const ClusterName = "liken"

// Cluster describes the whole fleet: the release every machine runs, the network, and the
// settings the machines share. There is exactly one, named "liken".
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,categories=liken,shortName=lc
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Wanted",type=string,JSONPath=`.spec.version`,description="Release every machine is meant to run (spec.version)"
// +kubebuilder:printcolumn:name="Up-to-date",type=integer,JSONPath=`.status.upToDateMachines`,description="Machines running the wanted release"
// +kubebuilder:printcolumn:name="Machines",type=integer,JSONPath=`.status.machines`,description="Machines in the cluster"
// +kubebuilder:printcolumn:name="Policy",type=string,JSONPath=`.spec.rebootPolicy`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="self.metadata.name == 'liken'",message="a liken cluster has exactly one Cluster and it must be named 'liken'"
type Cluster struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec ClusterSpec `json:"spec"`
	// +optional
	Status ClusterStatus `json:"status,omitempty"`
}

// ClusterSpec is what operators declare for the whole fleet.
//
// +kubebuilder:validation:XValidation:rule="self.version in self.releases",messageExpression="'spec.version ' + self.version + ' is not pinned: add it with its digest to spec.releases first'"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.network) || has(self.network)",message="spec.network is immutable: it cannot be removed once set"
// +kubebuilder:validation:XValidation:rule="!(has(self.channelRoot) && has(self.insecureUnsignedChannel) && self.insecureUnsignedChannel)",message="spec.channelRoot names the channel's signed root; spec.insecureUnsignedChannel takes releases unverified: give one, not both"
type ClusterSpec struct {
	// Channel is the URL of the release channel: a directory holding <version>/release.json
	// and the release's files, served over http:// or https://, or read as file://.
	// +required
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="self.matches('^(https?|file)://[^\\\\s]+$')",message="channel must be an http://, https:// or file:// URL without spaces"
	Channel string `json:"channel"`

	// ChannelRoot is the digest of the channel's first signed root (metadata/1.root.json),
	// which `liken release keys init` prints. When set, a machine writes only a release
	// whose release.json the channel's keys signed (checked by The Update Framework's rules
	// from that root, before anything is downloaded), and refuses any other, saying which
	// check failed. Unset, the channel's releases are taken as their pins say, and nothing
	// proves who published them.
	// +optional
	ChannelRoot Digest `json:"channelRoot,omitempty"`

	// InsecureUnsignedChannel lets machines write releases from a channel without signed
	// metadata, taken as their pins say, with nothing proving who published them: an
	// operator's explicit choice for an old channel, said by liken status. Without it or
	// channelRoot, no release is written.
	// +optional
	InsecureUnsignedChannel bool `json:"insecureUnsignedChannel,omitempty"`

	// ChannelCA is PEM certificates machines trust for an https:// channel besides the
	// image's CA bundle (Debian's): the CA of a channel served with a private one. `liken
	// install` trusts it too. It proves the server, not the release: that is the pins' and
	// channelRoot's work, over http:// as well.
	// +optional
	// +kubebuilder:validation:MaxLength=65536
	// +kubebuilder:validation:XValidation:rule="self.contains('-----BEGIN CERTIFICATE-----')",message="channelCA must hold PEM certificates (-----BEGIN CERTIFICATE-----)"
	ChannelCA string `json:"channelCA,omitempty"`

	// Releases pins each release a machine may run: version → digest of its release.json.
	// A machine refuses any release whose document does not match its pin.
	// +required
	// +kubebuilder:validation:MinProperties=1
	// +kubebuilder:validation:MaxProperties=128
	// +kubebuilder:validation:XValidation:rule="self.all(v, v.size() <= 14 && v.matches('^[0-9]{4}[.][0-9]{2}[.][0-9]{2}-[0-9]{3}$'))",message="release versions (the keys of spec.releases) must look like 2026.07.20-001: the date as YYYY.MM.DD, '-', and a three-digit sequence"
	Releases map[string]Digest `json:"releases"`

	// Version is the release every machine runs, unless its Machine overrides it. It must be
	// one of the pinned releases. Changing it upgrades (or rolls back) the fleet, one
	// disruption-budget turn at a time.
	// +required
	Version ReleaseVersion `json:"version"`

	// RebootPolicy: Manual (the default) makes every reboot wait for an operator's approval
	// as well as its turn; Auto takes the reboot when the turn comes.
	// +optional
	// +kubebuilder:default=Manual
	RebootPolicy RebootPolicy `json:"rebootPolicy,omitempty"`

	// DisruptionBudget bounds how many machines may be unavailable at once.
	// +optional
	// +kubebuilder:default={}
	DisruptionBudget DisruptionBudget `json:"disruptionBudget,omitempty"`

	// MaintenanceWindows, when set, are the only times a reboot under rebootPolicy Auto
	// starts (one that started may finish after its window closes). A reboot an operator
	// approved for its exact pending set starts outside them too.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +listType=atomic
	MaintenanceWindows []MaintenanceWindow `json:"maintenanceWindows,omitempty"`
	// Rollout pauses the reboots a change needs across the fleet (liken rollout pause).
	// +optional
	Rollout *Rollout `json:"rollout,omitempty"`
	// Drain says how a machine empties itself before it reboots.
	// +optional
	// +kubebuilder:default={}
	Drain DrainPolicy `json:"drain,omitempty"`

	// Features switches k3s's packaged components and cluster-wide k3s settings.
	// +optional
	// +kubebuilder:default={}
	Features K3sFeatures `json:"features,omitempty"`

	// Registries configures image registry mirrors and credentials for every machine.
	// +optional
	Registries *Registries `json:"registries,omitempty"`

	// Sysctls are kernel parameters set on every machine; a Machine's own sysctls win.
	// +optional
	Sysctls Sysctls `json:"sysctls,omitempty"`

	// KernelArgs are appended to every machine's kernel command line, before the Machine's
	// own. A change boots as a one-shot trial and falls back if the machine does not come
	// back healthy.
	// +optional
	// +kubebuilder:validation:MaxItems=64
	// +listType=atomic
	KernelArgs []KernelArg `json:"kernelArgs,omitempty"`

	// TimeServers are the NTP servers (a host name or address, with :port when not 123)
	// every machine sets its clock from, before those its DHCP server names (option 42).
	// Init sets the clock from them at boot before k3s starts, and never starts k3s while
	// the clock reads earlier than its release was built; the agent keeps the clock with
	// them while the machine runs. A change is live.
	// +optional
	// +kubebuilder:validation:MaxItems=8
	// +listType=atomic
	// +kubebuilder:validation:items:MaxLength=261
	// +kubebuilder:validation:items:XValidation:rule="self.matches('^([a-zA-Z0-9]([-a-zA-Z0-9]*[a-zA-Z0-9])?([.][a-zA-Z0-9]([-a-zA-Z0-9]*[a-zA-Z0-9])?)*|\\\\[[0-9a-fA-F:.]+\\\\])(:[0-9]{1,5})?$')",message="timeServers must be host names or addresses, each with an optional :port (an IPv6 address in brackets), such as time.example.com or 192.0.2.1:123"
	TimeServers []string `json:"timeServers,omitempty"`

	// RegistrationAddress is the address machines join the cluster through: a DNS name or an
	// IP address, without scheme or port, that reaches k3s on port 6443 of the servers (a
	// load balancer, a virtual IP, or a DNS name holding the servers' addresses). Every
	// server names it in its certificate (k3s tls-san). Without it, machines join through the
	// first server's first static address, so a cluster whose first server uses DHCP needs
	// it. A change restarts k3s on servers, which then answer for the new address too;
	// machines that have joined reach the servers directly, and a machine joins through the
	// new address once it boots a layer built with it.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="isIP(self) || self.matches('^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?([.][a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*$')",message="registrationAddress must be a DNS name in lower case or an IP address, without scheme or port, such as k3s.example.com or 192.0.2.10"
	// +kubebuilder:validation:XValidation:rule="self != 'localhost' && !(isIP(self) && (ip(self).isLoopback() || ip(self).isUnspecified()))",message="registrationAddress must be an address the other machines reach: not localhost, a loopback or an unspecified address"
	RegistrationAddress string `json:"registrationAddress,omitempty"`

	// Logs says how much of its own logs each machine keeps on its state partition (init's
	// with the kernel's messages, the agent's and k3s's, under /var/log, which the kubelet's
	// node log query and `liken logs` read). A change is live: it applies at the next boot.
	// +optional
	Logs *LogPolicy `json:"logs,omitempty"`

	// Network holds the cluster's address ranges. They are fixed when the cluster is created.
	// +optional
	// +kubebuilder:default={clusterCIDR:"10.42.0.0/16",serviceCIDR:"10.43.0.0/16",clusterDNS:"10.43.0.10",clusterDomain:"cluster.local"}
	Network ClusterNetwork `json:"network,omitempty"`
}

// DisruptionBudget bounds the machines unavailable at one time, for any reason.
type DisruptionBudget struct {
	// MaxUnavailable is a count (at least 1) or a percentage of all machines (1% to 100%,
	// rounded down but never below one machine). Machines unavailable for other reasons count
	// against it too.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:MaxLength=4
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 1 : self.matches('^([1-9][0-9]?|100)%$')",message="maxUnavailable must be a count of at least 1 or a percentage from 1% to 100%"
	MaxUnavailable *intstr.IntOrString `json:"maxUnavailable,omitempty"`
}

// Rollout controls how the reboots a change needs move through the fleet.
type Rollout struct {
	// Paused stops new reboot turns: while it is true no machine is drained or rebooted
	// for a change, whatever its approval or rebootPolicy. A turn given before finishes (a
	// machine draining or in its trial completes it, or falls back); changes that apply
	// live or by restarting k3s still apply.
	// +optional
	Paused bool `json:"paused,omitempty"`
	// PausedBy names who paused, PausedAt when, and Reason why (liken rollout pause writes
	// them; the Cluster's status and liken status show them).
	// +optional
	// +kubebuilder:validation:MaxLength=253
	PausedBy string `json:"pausedBy,omitempty"`
	// +optional
	PausedAt *metav1.Time `json:"pausedAt,omitempty"`
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Reason string `json:"reason,omitempty"`
	// MaxFailures is how many machines may fail the trial of the same release (the same
	// digest), or of the same kernel arguments, before the coordinator halts the rollout by
	// itself: no new reboot turn, and turns still draining are taken back, as if paused.
	// The Cluster's status.rollout lists the failed trials, and its RolloutPaused condition
	// says Halted. Default 1.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	MaxFailures *int32 `json:"maxFailures,omitempty"`
	// ResumedAt accepts the failed trials recorded up to it: a halt counts only later ones
	// against maxFailures. liken rollout resume sets it to the time it runs.
	// +optional
	ResumedAt *metav1.Time `json:"resumedAt,omitempty"`
	// Gates are checks each machine passes after its reboot, before its turn is given back:
	// named workloads Available, or a Job that succeeds. Besides them, every machine waits
	// until the Deployments, StatefulSets and DaemonSets that had pods on it when its drain
	// began are as available as they were (workloadsTimeout). A gate that fails, or does not
	// pass within its timeout, counts as a failed trial of what the machine rebooted for
	// (maxFailures).
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=16
	Gates []RolloutGate `json:"gates,omitempty"`
	// WorkloadsTimeout bounds the wait for the workloads that had pods on a machine to be
	// back after its reboot (default 10m); past it, the machine fails its gates.
	// +optional
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('10s') && duration(self) <= duration('24h')",message="workloadsTimeout must be a duration from 10s to 24h, such as 10m"
	WorkloadsTimeout *metav1.Duration `json:"workloadsTimeout,omitempty"`
	// CommitAfterGates: a machine's trial boot makes its new slot the default only once its
	// gates (the workloads that had pods on it, and gates above) have passed on that boot;
	// gates that fail end the trial at once, and the machine falls back to its last good
	// slot, which counts as a failed trial (maxFailures). The trial's health deadline (10
	// minutes unless the release says otherwise) bounds the wait: gates slower than it fail
	// the trial too. Default true; false commits a trial on its own health alone, and the
	// gates then only hold the next machine's turn.
	// +optional
	CommitAfterGates *bool `json:"commitAfterGates,omitempty"`
	// Soak is how long the fleet waits after a machine's turn ended well (it rebooted, its
	// trial committed and its gates passed) before any machine's next turn: time for a
	// problem that shows only after a while to show on one machine rather than on many.
	// Unset: no wait.
	// +optional
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('0s') && duration(self) <= duration('168h')",message="soak must be a duration from 0s to 168h, such as 30m"
	Soak *metav1.Duration `json:"soak,omitempty"`
	// SoakTurns limits the soak to the first N turns that end well in a rollout (counted in
	// status.rollout.turnsEnded, from zero at each change of spec.version); unset or 0:
	// after every turn. A canary's turn is always followed by the soak.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=10000
	SoakTurns *int32 `json:"soakTurns,omitempty"`
	// Canaries selects, by their Machine's labels, the machines that go first: no other
	// machine gets a turn while a canary has a reboot ahead of it (it waits for an
	// approval or a turn) or in progress, nor during the soak after a canary's turn.
	// +optional
	Canaries *metav1.LabelSelector `json:"canaries,omitempty"`
}

// SoakFor is how long to wait after a turn that ended well, the endedTurns-th of the
// rollout, by a canary or not: spec.rollout.soak where it applies, else 0.
func (r *Rollout) SoakFor(endedTurns int32, canary bool) time.Duration {
	if r == nil || r.Soak == nil || r.Soak.Duration <= 0 {
		return 0
	}
	if canary || r.SoakTurns == nil || *r.SoakTurns == 0 || endedTurns <= *r.SoakTurns {
		return r.Soak.Duration
	}
	return 0
}

// CommitsAfterGates is spec.rollout.commitAfterGates, or its default (true).
func (r *Rollout) CommitsAfterGates() bool {
	return r == nil || r.CommitAfterGates == nil || *r.CommitAfterGates
}

// DefaultGateTimeout is a gate's timeout, and spec.rollout.workloadsTimeout, when unset.
const DefaultGateTimeout = 10 * time.Minute

// WorkloadsWait is spec.rollout.workloadsTimeout, or its default.
func (r *Rollout) WorkloadsWait() time.Duration {
	if r == nil || r.WorkloadsTimeout == nil || r.WorkloadsTimeout.Duration <= 0 {
		return DefaultGateTimeout
	}
	return r.WorkloadsTimeout.Duration
}

// RolloutGate is one check a machine passes after its reboot: exactly one of workloads and
// job.
// +kubebuilder:validation:XValidation:rule="has(self.workloads) != has(self.job)",message="a gate has exactly one of workloads and job"
type RolloutGate struct {
	// Name names the gate in status, Events and liken status.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=40
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`
	// Timeout is how long the gate may take from when the machine is back (default 10m).
	// +optional
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('10s') && duration(self) <= duration('24h')",message="a gate's timeout must be a duration from 10s to 24h, such as 10m"
	Timeout *metav1.Duration `json:"timeout,omitempty"`
	// Workloads passes once every Deployment, StatefulSet and DaemonSet its selector picks
	// is Available: all its desired pods available and up to date with its spec.
	// +optional
	Workloads *WorkloadsGate `json:"workloads,omitempty"`
	// Job passes once a Job made from a CronJob's jobTemplate for this machine's turn
	// succeeds, and fails when that Job fails.
	// +optional
	Job *JobGate `json:"job,omitempty"`
}

// Wait is the gate's timeout, or its default.
func (g RolloutGate) Wait() time.Duration {
	if g.Timeout == nil || g.Timeout.Duration <= 0 {
		return DefaultGateTimeout
	}
	return g.Timeout.Duration
}

// WorkloadsGate selects the workloads a gate waits for.
type WorkloadsGate struct {
	// Namespace the workloads are in; empty means every namespace.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	Namespace string `json:"namespace,omitempty"`
	// Selector picks Deployments, StatefulSets and DaemonSets by their labels. An empty
	// selector picks every one (in the namespace); one that picks none passes.
	// +required
	Selector metav1.LabelSelector `json:"selector"`
}

// JobGate names the template of a Job a gate runs once per turn. The template is a
// CronJob's (usually suspended, so it runs only as a gate): whoever may make that CronJob
// may run its pods, so the gate lets the coordinator run nothing its author could not.
type JobGate struct {
	// Namespace of the CronJob, where the Job runs.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Namespace string `json:"namespace"`
	// CronJob whose spec.jobTemplate the Job is made from.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	CronJob string `json:"cronJob"`
}

// IsPaused reports whether the rollout is paused by spec.rollout.paused.
func (r *Rollout) IsPaused() bool { return r != nil && r.Paused }

// DefaultMaxFailures is spec.rollout.maxFailures when unset.
const DefaultMaxFailures = 1

// FailureLimit is spec.rollout.maxFailures, or its default.
func (r *Rollout) FailureLimit() int {
	if r == nil || r.MaxFailures == nil || *r.MaxFailures < 1 {
		return DefaultMaxFailures
	}
	return int(*r.MaxFailures)
}

// Weekday is a day of the week.
// +kubebuilder:validation:Enum=Monday;Tuesday;Wednesday;Thursday;Friday;Saturday;Sunday
type Weekday string

// MaintenanceWindow is a time, on some days of the week, when Auto reboots may start.
type MaintenanceWindow struct {
	// Days the window opens on; empty means every day.
	// +optional
	// +kubebuilder:validation:MaxItems=7
	// +listType=set
	Days []Weekday `json:"days,omitempty"`
	// Start is the local time the window opens, as HH:MM (24-hour clock).
	// +required
	// +kubebuilder:validation:MaxLength=5
	// +kubebuilder:validation:XValidation:rule="self.matches('^([01][0-9]|2[0-3]):[0-5][0-9]$')",message="start must be a time of day as HH:MM, such as 02:30"
	Start string `json:"start"`
	// Duration is how long the window stays open.
	// +required
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1m') && duration(self) <= duration('168h')",message="duration must be from 1m to 168h, such as 4h"
	Duration metav1.Duration `json:"duration"`
	// TimeZone is the IANA time zone Start is in, such as Europe/Berlin (default UTC).
	// +optional
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:XValidation:rule="self.matches('^[A-Za-z0-9_+-]+(/[A-Za-z0-9_+-]+)*$')",message="timeZone must be an IANA time zone name such as Europe/Berlin or UTC"
	TimeZone string `json:"timeZone,omitempty"`
}

// DrainPolicy says how a machine is drained before a reboot.
type DrainPolicy struct {
	// Timeout bounds the drain. When it passes with pods still in place, the machine
	// uncordons, gives its turn back and names the blocking pods in its status, unless
	// Force is set.
	// +optional
	// +kubebuilder:default="10m"
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('10s') && duration(self) <= duration('24h')",message="drain timeout must be a duration from 10s to 24h, such as 10m"
	Timeout *metav1.Duration `json:"timeout,omitempty"`

	// DeleteEmptyDirData lets the drain evict pods that use emptyDir volumes (their data is
	// lost). Without it such pods block the drain.
	// +optional
	DeleteEmptyDirData bool `json:"deleteEmptyDirData,omitempty"`

	// DeleteUnmanagedPods lets the drain delete pods no controller manages (they are not
	// recreated). Without it such pods block the drain.
	// +optional
	DeleteUnmanagedPods bool `json:"deleteUnmanagedPods,omitempty"`

	// Force deletes the pods still in place when the timeout passes, bypassing
	// PodDisruptionBudgets, and reboots. Off by default: a blocked drain gives the turn back.
	// +optional
	Force bool `json:"force,omitempty"`
}

// FlannelBackend is k3s's flannel backend.
// +kubebuilder:validation:Enum=vxlan;host-gw;wireguard-native;none
type FlannelBackend string

// K3sFeatures are k3s's packaged components and the k3s settings that must match on every
// server. The packaged components restart k3s in place on servers when switched (agents do
// not run them); the settings k3s requires to match across servers cannot change after
// creation.
type K3sFeatures struct {
	// Traefik runs k3s's packaged Traefik ingress controller.
	// +optional
	// +kubebuilder:default=true
	Traefik *bool `json:"traefik,omitempty"`
	// MetricsServer runs k3s's packaged metrics-server.
	// +optional
	// +kubebuilder:default=true
	MetricsServer *bool `json:"metricsServer,omitempty"`
	// LocalStorage runs k3s's packaged local-path provisioner.
	// +optional
	// +kubebuilder:default=true
	LocalStorage *bool `json:"localStorage,omitempty"`
	// CoreDNS runs k3s's packaged CoreDNS.
	// +optional
	// +kubebuilder:default=true
	CoreDNS *bool `json:"coreDNS,omitempty"`

	// ServiceLB runs k3s's packaged service load balancer (klipper-lb). Immutable: k3s
	// requires disable=servicelb to match on every server.
	// +optional
	// +kubebuilder:default=true
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="features.serviceLB is immutable: k3s requires it to match on every server"
	ServiceLB *bool `json:"serviceLB,omitempty"`
	// NetworkPolicy runs k3s's embedded network policy controller. Immutable.
	// +optional
	// +kubebuilder:default=true
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="features.networkPolicy is immutable: k3s requires it to match on every server"
	NetworkPolicy *bool `json:"networkPolicy,omitempty"`
	// EmbeddedRegistry turns on k3s's embedded registry mirror (Spegel). Immutable.
	// +optional
	// +kubebuilder:default=false
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="features.embeddedRegistry is immutable: k3s requires it to match on every server"
	EmbeddedRegistry *bool `json:"embeddedRegistry,omitempty"`
	// SecretsEncryption encrypts Secrets at rest in the datastore. Immutable.
	// +optional
	// +kubebuilder:default=false
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="features.secretsEncryption is immutable: k3s requires it to match on every server"
	SecretsEncryption *bool `json:"secretsEncryption,omitempty"`
	// FlannelBackend is the pod network's flannel backend. Immutable.
	// +optional
	// +kubebuilder:default=vxlan
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="features.flannelBackend is immutable: k3s requires it to match on every server"
	FlannelBackend FlannelBackend `json:"flannelBackend,omitempty"`
	// Swap activates the swap partitions of Machines' spec.disks at boot. k3s's kubelet is
	// then told to accept swap (kubelet-arg fail-swap-on=false); pods get none of it (the
	// kubelet's default swap behaviour, NoSwap). A change applies at the next boot.
	// +optional
	Swap *bool `json:"swap,omitempty"`
}

// SecretNames are the Secrets in liken-system the registry configs name (credentials, TLS),
// sorted and without repeats: all a machine may read.
func (r *Registries) SecretNames() []string {
	if r == nil {
		return nil
	}
	seen := map[string]bool{}
	var out []string
	for _, rc := range r.Configs {
		for _, ref := range []*SecretReference{rc.AuthSecret, tlsSecret(rc.TLS)} {
			if ref != nil && ref.Name != "" && !seen[ref.Name] {
				seen[ref.Name] = true
				out = append(out, ref.Name)
			}
		}
	}
	sort.Strings(out)
	return out
}

func tlsSecret(t *RegistryTLS) *SecretReference {
	if t == nil {
		return nil
	}
	return t.Secret
}

// Registries configures containerd's registry mirrors and per-registry settings on every
// machine (k3s's registries.yaml). A change restarts k3s in place; pods keep running.
type Registries struct {
	// Mirrors redirect pulls from a registry to other endpoints.
	// +optional
	// +listType=map
	// +listMapKey=registry
	// +kubebuilder:validation:MaxItems=16
	Mirrors []RegistryMirror `json:"mirrors,omitempty"`
	// Configs hold credentials and TLS settings per registry host.
	// +optional
	// +listType=map
	// +listMapKey=host
	// +kubebuilder:validation:MaxItems=16
	Configs []RegistryConfig `json:"configs,omitempty"`
}

// RegistryMirror lists the endpoints to try for one registry.
type RegistryMirror struct {
	// Registry is the registry host whose pulls are redirected, e.g. docker.io, or "*" for
	// every registry.
	// +required
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self == '*' || self.matches('^[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?(:[0-9]{1,5})?$')",message="registry must be a host name with an optional :port, such as docker.io or registry.local:5000, or '*'"
	Registry string `json:"registry"`
	// Endpoints are the mirror URLs, tried in order before the registry itself.
	// +required
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=8
	// +kubebuilder:validation:items:MaxLength=512
	// +kubebuilder:validation:items:XValidation:rule="self.matches('^https?://[^\\\\s]+$')",message="mirror endpoints must be http:// or https:// URLs"
	// +listType=set
	Endpoints []string `json:"endpoints"`
	// Rewrites rewrite image names (regular expression → replacement) for this mirror.
	// +optional
	// +kubebuilder:validation:MaxProperties=16
	Rewrites map[string]string `json:"rewrites,omitempty"`
}

// RegistryConfig holds credentials and TLS settings for one registry host.
type RegistryConfig struct {
	// Host is the registry or mirror host, with an optional :port.
	// +required
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self.matches('^[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?(:[0-9]{1,5})?$')",message="host must be a host name with an optional :port, such as registry.local:5000"
	Host string `json:"host"`
	// AuthSecret names a Secret in liken-system with keys username and password, or
	// identityToken. Credentials are never written in the Cluster itself.
	// +optional
	AuthSecret *SecretReference `json:"authSecret,omitempty"`
	// TLS configures the connection to this host.
	// +optional
	TLS *RegistryTLS `json:"tls,omitempty"`
}

// RegistryTLS configures TLS towards a registry host.
type RegistryTLS struct {
	// Secret names a Secret in liken-system holding ca.crt (a CA bundle to trust) and,
	// for client authentication, tls.crt and tls.key.
	// +optional
	Secret *SecretReference `json:"secret,omitempty"`
	// InsecureSkipVerify turns off verification of the registry's certificate.
	// +optional
	InsecureSkipVerify bool `json:"insecureSkipVerify,omitempty"`
}

// ClusterNetwork is the cluster's address plan. It is immutable: k3s requires these to match
// on every server and cannot move a running cluster to new ranges.
//
// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.network is immutable: the cluster's address ranges are fixed when it is created"
// +kubebuilder:validation:XValidation:rule="!isCIDR(self.serviceCIDR) || !isIP(self.clusterDNS) || cidr(self.serviceCIDR).containsIP(self.clusterDNS)",message="network.clusterDNS must be an address inside network.serviceCIDR"
// +kubebuilder:validation:XValidation:rule="!isCIDR(self.clusterCIDR) || !isCIDR(self.serviceCIDR) || (!cidr(self.clusterCIDR).containsCIDR(cidr(self.serviceCIDR)) && !cidr(self.serviceCIDR).containsCIDR(cidr(self.clusterCIDR)))",message="network.clusterCIDR and network.serviceCIDR must not overlap"
type ClusterNetwork struct {
	// ClusterCIDR is the range pod addresses come from.
	// +optional
	// +kubebuilder:default="10.42.0.0/16"
	// +kubebuilder:validation:MaxLength=43
	// +kubebuilder:validation:XValidation:rule="isCIDR(self) && cidr(self) == cidr(self).masked()",message="network.clusterCIDR must be a network in CIDR notation, such as 10.42.0.0/16"
	ClusterCIDR string `json:"clusterCIDR,omitempty"`
	// ServiceCIDR is the range Service cluster IPs come from.
	// +optional
	// +kubebuilder:default="10.43.0.0/16"
	// +kubebuilder:validation:MaxLength=43
	// +kubebuilder:validation:XValidation:rule="isCIDR(self) && cidr(self) == cidr(self).masked()",message="network.serviceCIDR must be a network in CIDR notation, such as 10.43.0.0/16"
	ServiceCIDR string `json:"serviceCIDR,omitempty"`
	// ClusterDNS is the Service address of the cluster DNS, inside ServiceCIDR.
	// +optional
	// +kubebuilder:default="10.43.0.10"
	// +kubebuilder:validation:MaxLength=39
	// +kubebuilder:validation:XValidation:rule="isIP(self)",message="network.clusterDNS must be an IP address, such as 10.43.0.10"
	ClusterDNS string `json:"clusterDNS,omitempty"`
	// ClusterDomain is the cluster's DNS domain.
	// +optional
	// +kubebuilder:default="cluster.local"
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')",message="network.clusterDomain must be a DNS domain such as cluster.local"
	ClusterDomain string `json:"clusterDomain,omitempty"`
}

// ClusterStatus is the fleet as the coordinator sees it.
type ClusterStatus struct {
	// ObservedGeneration is the Cluster generation this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Machines is the number of Machines.
	// +optional
	Machines int32 `json:"machines"`
	// UpToDateMachines is the number of machines running the release they are meant to run.
	// +optional
	UpToDateMachines int32 `json:"upToDateMachines"`
	// Versions counts the machines running each release.
	// +optional
	// +listType=map
	// +listMapKey=version
	// +kubebuilder:validation:MaxItems=128
	Versions []VersionCount `json:"versions,omitempty"`
	// Rollout is the progress towards spec.version.
	// +optional
	Rollout *RolloutStatus `json:"rollout,omitempty"`
	// Turns are the machines that currently hold a disruption-budget turn. The coordinator
	// writes them with optimistic concurrency, so two coordinators never grant more than
	// the budget.
	// +optional
	// +listType=map
	// +listMapKey=machine
	// +kubebuilder:validation:MaxItems=1024
	Turns []Turn `json:"turns,omitempty"`
	// Waiting are the machines waiting for a turn, in the order they get one, each with
	// what it waits for.
	// +optional
	// +listType=map
	// +listMapKey=machine
	// +kubebuilder:validation:MaxItems=4096
	Waiting []WaitingMachine `json:"waiting,omitempty"`
	// DrainBlocked are the machines whose last drain did not finish in time: they gave
	// their turn back and wait until RetryAt.
	// +optional
	// +listType=map
	// +listMapKey=machine
	// +kubebuilder:validation:MaxItems=4096
	DrainBlocked []DrainBlock `json:"drainBlocked,omitempty"`
	// Coordinator is the machine whose agent leads reboot coordination.
	// +optional
	Coordinator string `json:"coordinator,omitempty"`
	// Conditions: Available, Progressing, Degraded (see conditions.go for reasons).
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// VersionCount is how many machines run one release.
type VersionCount struct {
	// +required
	Version string `json:"version"`
	// +optional
	Digest string `json:"digest,omitempty"`
	// +required
	Machines int32 `json:"machines"`
}

// RolloutStatus is the fleet's progress towards a release.
type RolloutStatus struct {
	// TargetVersion is the spec.version being rolled out.
	TargetVersion string `json:"targetVersion"`
	// Updated machines run the target and have committed it.
	Updated int32 `json:"updated"`
	// Waiting machines have it staged and wait for a turn or an approval.
	Waiting int32 `json:"waiting"`
	// Failed machines tried it and fell back; they do not retry without an operator.
	Failed int32 `json:"failed"`
	// StartedAt is when spec.version last changed.
	// +optional
	StartedAt *metav1.Time `json:"startedAt,omitempty"`
	// Failures are the failed trials of what the machines are meant to run now: the
	// release each machine wants, and its kernel arguments. Those at or before
	// spec.rollout.resumedAt are accepted and count no more against maxFailures.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=4096
	Failures []TrialFailure `json:"failures,omitempty"`
	// GateFailures are the machines whose gates failed after their reboot (spec.rollout.gates
	// and the workloads that ran on them), as the coordinator recorded them; they count
	// against maxFailures with the failed trials.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=256
	GateFailures []TrialFailure `json:"gateFailures,omitempty"`
	// Halted is set while the coordinator holds the rollout because maxFailures machines
	// failed the trial of the same release or kernel arguments.
	// +optional
	Halted *RolloutHalt `json:"halted,omitempty"`
	// TurnsEnded counts the turns that ended well in this rollout (spec.rollout.soakTurns).
	// +optional
	TurnsEnded int32 `json:"turnsEnded,omitempty"`
	// LastTurnEnded is the last turn that ended well: the soak counts from it.
	// +optional
	LastTurnEnded *EndedTurn `json:"lastTurnEnded,omitempty"`
	// SoakUntil is set while the fleet soaks: no new turn before it.
	// +optional
	SoakUntil *metav1.Time `json:"soakUntil,omitempty"`
}

// EndedTurn is a turn that ended well: the machine rebooted, its trial committed and its
// gates passed.
type EndedTurn struct {
	// Machine whose turn it was.
	Machine string `json:"machine"`
	// At is when the coordinator took the turn back.
	At metav1.Time `json:"at"`
	// Canary: the machine is one of spec.rollout.canaries.
	// +optional
	Canary bool `json:"canary,omitempty"`
}

// TrialFailure is one machine's failed trial of what the fleet rolls out.
type TrialFailure struct {
	Machine string `json:"machine"`
	// What failed, in words: a release and its digest, or kernel arguments.
	What string `json:"what"`
	// Key is what failures are counted by: the release's digest, or "kernelArgs:" and the
	// arguments.
	Key string `json:"key"`
	// Reason is why the trial failed (a condition reason such as HealthDeadline), Message
	// in words.
	// +optional
	Reason string `json:"reason,omitempty"`
	// +optional
	Message string      `json:"message,omitempty"`
	At      metav1.Time `json:"at"`
	// Accepted: an operator resumed the rollout after it (spec.rollout.resumedAt).
	// +optional
	Accepted bool `json:"accepted,omitempty"`
}

// RolloutHalt is why the coordinator holds the rollout.
type RolloutHalt struct {
	// What failed, as in the failures, and Key, what they are counted by.
	What string `json:"what"`
	Key  string `json:"key"`
	// Machines are those whose trial of it failed and was not accepted.
	// +listType=atomic
	Machines []string `json:"machines"`
	// MaxFailures is the limit reached.
	MaxFailures int32 `json:"maxFailures"`
}

// TurnPhase is where a turn is.
// +kubebuilder:validation:Enum=Draining;Drained
type TurnPhase string

const (
	// TurnDraining: the coordinator cordons the machine's Node and evicts its pods.
	TurnDraining TurnPhase = "Draining"
	// TurnDrained: the Node is empty; the machine reboots, comes back and passes its health
	// gate, and then the coordinator uncordons it and takes the turn back.
	TurnDrained TurnPhase = "Drained"
)

// Turn is one machine's right to be unavailable.
type Turn struct {
	// Machine holding the turn.
	Machine string `json:"machine"`
	// Since when it holds it.
	Since metav1.Time `json:"since"`
	// PendingHash is the machine's pending set the turn was given for; a machine reboots
	// only for exactly that set.
	// +optional
	PendingHash string `json:"pendingHash,omitempty"`
	// Phase is Draining, then Drained.
	// +optional
	Phase TurnPhase `json:"phase,omitempty"`
	// CordonedBefore: the Node was already cordoned (by an operator) when the turn was
	// given, so liken leaves it cordoned afterwards.
	// +optional
	CordonedBefore bool `json:"cordonedBefore,omitempty"`
	// ReleasedBy names the operator who gave the turn back with liken release-turn (a
	// machine that never returned); the coordinator then takes it back as if the machine
	// had finished, uncordoning the Node unless it was cordoned before.
	// +optional
	ReleasedBy string `json:"releasedBy,omitempty"`
	// GrantedUnavailable says why the machine was unavailable when it was given the turn
	// (NotReady, no Node, ...): such a turn takes nothing from the budget. Should the
	// machine be available again before its drain ends, the turn uses the budget as any
	// other, and is taken back if the budget has no room for it.
	// +optional
	GrantedUnavailable string `json:"grantedUnavailable,omitempty"`
	// BootID is the Node's boot ID when the turn was given: the gates judge a later boot.
	// +optional
	BootID string `json:"bootID,omitempty"`
	// Workloads are the Deployments, StatefulSets and DaemonSets that had pods on the
	// machine when its drain began, with how many of their pods were available then.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	Workloads []TurnWorkload `json:"workloads,omitempty"`
	// Gates is where the machine is in its gates once back from its reboot.
	// +optional
	Gates *TurnGates `json:"gates,omitempty"`
}

// TurnWorkload is a workload that had pods on a machine when its drain began.
type TurnWorkload struct {
	// Kind is Deployment, StatefulSet or DaemonSet.
	Kind string `json:"kind"`
	// +optional
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name"`
	// Available is how many of its pods were available when the drain began: the gate waits
	// until as many are again (or all it wants now, if fewer).
	Available int32 `json:"available"`
}

// GatePhase is where a machine is in its gates.
// +kubebuilder:validation:Enum=Checking;Passed;Failed
type GatePhase string

const (
	GateChecking GatePhase = "Checking"
	GatePassed   GatePhase = "Passed"
	GateFailed   GatePhase = "Failed"
)

// TurnGates is a machine's progress through its gates after its reboot.
type TurnGates struct {
	Phase GatePhase `json:"phase"`
	// BootID is the boot of the machine's Node the gates judged.
	// +optional
	BootID string `json:"bootID,omitempty"`
	// Since is when the checks began: the machine was back, its Node Ready on a new boot.
	Since metav1.Time `json:"since"`
	// Gate names the gate that failed, or the first still waited for ("workloads" is the
	// built-in one for the workloads that ran on the machine).
	// +optional
	Gate string `json:"gate,omitempty"`
	// Message says what is waited for, or why the gates failed.
	// +optional
	Message string `json:"message,omitempty"`
}

// WaitingMachine is a machine waiting for a turn.
type WaitingMachine struct {
	// Machine waiting.
	Machine string `json:"machine"`
	// Since when it waits.
	Since metav1.Time `json:"since"`
	// Reason is what it waits for.
	// +optional
	Reason string `json:"reason,omitempty"`
}

// DrainBlock is a drain that did not finish within drain.timeout.
type DrainBlock struct {
	// Machine whose drain was blocked.
	Machine string `json:"machine"`
	// PendingHash is the pending set the drain was for.
	// +optional
	PendingHash string `json:"pendingHash,omitempty"`
	// Since is when the blocked drain gave up.
	Since metav1.Time `json:"since"`
	// Attempts is how many drains for this pending set were blocked.
	Attempts int32 `json:"attempts"`
	// RetryAt is when the machine may take a turn again.
	RetryAt metav1.Time `json:"retryAt"`
	// BlockingPods are the namespace/name of the pods still in place.
	// +optional
	// +listType=atomic
	BlockingPods []string `json:"blockingPods,omitempty"`
	// Message says what blocked the drain: the pods and PodDisruptionBudgets in the way.
	// +optional
	Message string `json:"message,omitempty"`
}

// +kubebuilder:object:root=true

// ClusterList is a list of Clusters.
type ClusterList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Cluster `json:"items"`
}

// LogPolicy bounds the logs a machine keeps.
type LogPolicy struct {
	// BootsKept is how many earlier boots' logs a machine keeps besides this boot's
	// (default 5). Each component's file is rotated at 4 MiB with one earlier file kept, so
	// a boot takes at most 32 MiB of the state partition, and usually a few hundred KiB.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=50
	BootsKept int32 `json:"bootsKept,omitempty"`
}

// DefaultLogBootsKept is LogPolicy.BootsKept's default.
const DefaultLogBootsKept = 5

// LogBootsKept is how many earlier boots' logs a machine keeps.
func (s ClusterSpec) LogBootsKept() int {
	if s.Logs == nil || s.Logs.BootsKept < 1 {
		return DefaultLogBootsKept
	}
	return int(s.Logs.BootsKept)
}
