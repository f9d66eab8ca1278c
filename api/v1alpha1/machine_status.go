package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// MachineStatus is what a machine reports about itself. Only the machine writes it.
type MachineStatus struct {
	// ObservedGeneration is the Machine generation the agent last read.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// AppliedGeneration is the Machine generation whose spec is fully applied or staged.
	// +optional
	AppliedGeneration int64 `json:"appliedGeneration,omitempty"`
	// AppliedClusterGeneration is the Cluster generation fully applied or staged here.
	// +optional
	AppliedClusterGeneration int64 `json:"appliedClusterGeneration,omitempty"`

	// EtcdRestore is this server's last restore of etcd from a snapshot (spec.etcdRestore).
	// +optional
	EtcdRestore *EtcdRestoreStatus `json:"etcdRestore,omitempty"`
	// EtcdRejoin is this server's last rejoin of the cluster's etcd without its data
	// (spec.etcdRejoin).
	// +optional
	EtcdRejoin *EtcdRejoinStatus `json:"etcdRejoin,omitempty"`
	// Hardware is what the machine found at boot.
	// +optional
	Hardware *Hardware `json:"hardware,omitempty"`

	// Release is the release the machine booted.
	// +optional
	Release *RunningRelease `json:"release,omitempty"`

	// Network is the machine's network links as they are now.
	// +optional
	Network *NetworkStatus `json:"network,omitempty"`

	// Clock is where the machine's time comes from and how far off it was.
	// +optional
	Clock *ClockStatus `json:"clock,omitempty"`

	// Disks is what init did at this boot with each disk spec.disks names: prepared,
	// mounted, or refused (left untouched), with what it found and what the spec wants.
	// +optional
	// +listType=map
	// +listMapKey=device
	// +kubebuilder:validation:MaxItems=16
	Disks []DiskStatus `json:"disks,omitempty"`

	// Pending lists the changes staged for the next boot or for a reboot of their own,
	// each with its field, class, old and new value, and since when it waits.
	// +optional
	// +listType=map
	// +listMapKey=field
	Pending []PendingChange `json:"pending,omitempty"`
	// PendingCount is len(pending), for kubectl's PENDING column.
	// +optional
	PendingCount int32 `json:"pendingCount,omitempty"`
	// PendingHash identifies the pending set: "sha256:" and the hex SHA-256 of its canonical
	// form. An approval binds to it, so an approval never covers a change made after it.
	// +optional
	PendingHash string `json:"pendingHash,omitempty"`

	// Reboot is where the machine is in its reboot.
	// +optional
	Reboot RebootStatus `json:"reboot,omitempty"`

	// Upgrade is where the machine is in moving to another release.
	// +optional
	Upgrade UpgradeStatus `json:"upgrade,omitempty"`

	// EtcdSnapshot is the etcd snapshot a server running an etcd member took for its last
	// disruption-budget turn, before its drain: the coordinator drains such a server only
	// once it names the turn it holds.
	// +optional
	EtcdSnapshot *EtcdSnapshotStatus `json:"etcdSnapshot,omitempty"`

	// Conditions: Ready, ConfigApplied, RebootPending, Degraded, UpgradeFailed (see
	// conditions.go for the reasons).
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// EtcdSnapshotStatus is a server's etcd snapshot for one turn, taken as `k3s etcd-snapshot
// save --name liken` takes one: a file in k3s's snapshot directory
// (${data-dir}/server/db/snapshots), pruned by k3s's etcd-snapshot-retention (5 by
// default) among liken's snapshots.
type EtcdSnapshotStatus struct {
	// Turn is the since of the turn it was taken for (status.turns of the Cluster).
	Turn metav1.Time `json:"turn"`
	// For is what the turn was given for: "release VERSION", or the pending set's hash.
	// +optional
	For string `json:"for,omitempty"`
	// Name is the snapshot's file name: liken-NODE-UNIXSECONDS, as k3s names its snapshots.
	// +optional
	Name string `json:"name,omitempty"`
	// SizeBytes is the file's size.
	// +optional
	SizeBytes int64 `json:"sizeBytes,omitempty"`
	// TakenAt is when it was taken.
	// +optional
	TakenAt *metav1.Time `json:"takenAt,omitempty"`
	// Error is why the last try for this turn failed; it is tried again every minute, and
	// the turn's drain waits (until the drain's timeout, when the drain is blocked).
	// +optional
	Error string `json:"error,omitempty"`
}

// NetworkStatus is the machine's network as the kernel has it.
type NetworkStatus struct {
	// Links are the ports (links backed by a device), bonds and VLANs; not the links
	// Kubernetes makes for pods.
	// +optional
	// +listType=map
	// +listMapKey=name
	Links []LinkInfo `json:"links,omitempty"`
}

// LinkInfo is one network link.
type LinkInfo struct {
	Name string `json:"name"`
	// Kind is port, bond or vlan.
	Kind string `json:"kind"`
	MAC  string `json:"mac,omitempty"`
	// State is the kernel's operational state: up, down, lowerlayerdown, dormant, unknown.
	State string `json:"state,omitempty"`
	// SpeedMbps is the negotiated speed, when the driver reports one.
	// +optional
	SpeedMbps int32 `json:"speedMbps,omitempty"`
	MTU       int32 `json:"mtu,omitempty"`
	// Addresses are its IP addresses with their prefix length.
	// +optional
	// +listType=atomic
	Addresses []string `json:"addresses,omitempty"`
	// Master is the bond it is a member of, if it is one.
	// +optional
	Master string `json:"master,omitempty"`
}

// ClockStatus is the machine's last setting of its clock.
type ClockStatus struct {
	// Source is the NTP server (host:port) the clock was last set from, or "rtc" when none
	// has answered since boot and the clock runs as the hardware clock started it.
	Source string `json:"source"`
	// Offset is how far the clock was from the source when last set, as a duration the
	// clock moved ("+24h3m0.5s": it was behind), rounded to the millisecond.
	// +optional
	Offset string `json:"offset,omitempty"`
	// LastSync is when the clock was last set from Source.
	// +optional
	LastSync *metav1.Time `json:"lastSync,omitempty"`
	// AtBoot is how init set the clock at this boot, before k3s started.
	// +optional
	AtBoot string `json:"atBoot,omitempty"`
	// Error is why the last attempt to reach a time server failed, if it did.
	// +optional
	Error string `json:"error,omitempty"`
}

// Hardware is the inventory a machine reads from /sys and /proc.
type Hardware struct {
	// System is the DMI identity of the machine.
	// +optional
	System SystemInfo `json:"system,omitempty"`
	// CPU model and counts.
	// +optional
	CPU CPUInfo `json:"cpu,omitempty"`
	// MemoryBytes is the usable memory.
	// +optional
	MemoryBytes int64 `json:"memoryBytes,omitempty"`
	// Disks are the block devices (not partitions, loops or RAM disks).
	// +optional
	// +listType=map
	// +listMapKey=name
	Disks []DiskInfo `json:"disks,omitempty"`
	// NICs are the network interfaces backed by a device.
	// +optional
	// +listType=map
	// +listMapKey=name
	NICs []NICInfo `json:"nics,omitempty"`
	// PCIDevices are the PCI functions with the driver bound to each.
	// +optional
	// +listType=map
	// +listMapKey=address
	PCIDevices []PCIDevice `json:"pciDevices,omitempty"`
	// Modules are the loaded kernel modules.
	// +optional
	// +listType=set
	Modules []string `json:"modules,omitempty"`
	// Watchdogs are the watchdog timers, in the kernel's order: the first is /dev/watchdog,
	// the one liken arms. Only "Software Watchdog" (softdog) means the machine has no
	// hardware watchdog liken drives, and a hang of the kernel itself will not reset it.
	// +optional
	// +listType=map
	// +listMapKey=name
	Watchdogs []WatchdogInfo `json:"watchdogs,omitempty"`
}

// EtcdRestoreStatus is the last restore of a server's etcd from a snapshot
// (spec.etcdRestore).
type EtcdRestoreStatus struct {
	// Snapshot and Request are the spec's that asked for it.
	Snapshot string `json:"snapshot"`
	// +optional
	Request string `json:"request,omitempty"`
	// At is when the boot restored it, or failed to.
	At metav1.Time `json:"at"`
	// Error is why it failed; k3s then started on etcd's data as it was.
	// +optional
	Error string `json:"error,omitempty"`
}

// EtcdRejoinStatus is the last rejoin of a server's etcd without its data
// (spec.etcdRejoin).
type EtcdRejoinStatus struct {
	// Request is the spec's that asked for it.
	Request string `json:"request"`
	// At is when the boot set etcd's data aside, or refused to.
	At metav1.Time `json:"at"`
	// MovedTo is where etcd's data went, under k3s's server/db; empty when there was none.
	// +optional
	MovedTo string `json:"movedTo,omitempty"`
	// Error is why it was refused; k3s then started on etcd's data as it was.
	// +optional
	Error string `json:"error,omitempty"`
}

// SoftwareWatchdog is softdog's identity (drivers/watchdog/softdog.c): the kernel's own
// timer, which resets the machine only while the kernel still runs.
const SoftwareWatchdog = "Software Watchdog"

// WatchdogInfo is one watchdog timer (/sys/class/watchdog).
type WatchdogInfo struct {
	// Name is the kernel's name for it, such as watchdog0.
	Name string `json:"name"`
	// Identity is its driver's name for it: "i6300ESB timer", "iTCO_wdt", "Software Watchdog".
	// +optional
	Identity string `json:"identity,omitempty"`
	// Active says it is armed: the machine resets unless it is pinged within its timeout.
	// +optional
	Active bool `json:"active,omitempty"`
	// TimeoutSeconds is its timeout.
	// +optional
	TimeoutSeconds int32 `json:"timeoutSeconds,omitempty"`
}

// SystemInfo is the machine's DMI identity.
type SystemInfo struct {
	Vendor  string `json:"vendor,omitempty"`
	Product string `json:"product,omitempty"`
	Serial  string `json:"serial,omitempty"`
	UUID    string `json:"uuid,omitempty"`
}

// CPUInfo describes the processors.
type CPUInfo struct {
	Model string `json:"model,omitempty"`
	// Sockets, Cores and Threads count physical packages, cores and logical CPUs.
	Sockets int32 `json:"sockets,omitempty"`
	Cores   int32 `json:"cores,omitempty"`
	Threads int32 `json:"threads,omitempty"`
}

// DiskInfo describes one block device.
type DiskInfo struct {
	// Name is the kernel name, such as vda or nvme0n1.
	Name       string `json:"name"`
	Model      string `json:"model,omitempty"`
	Serial     string `json:"serial,omitempty"`
	SizeBytes  int64  `json:"sizeBytes,omitempty"`
	Rotational bool   `json:"rotational,omitempty"`
	// LogicalSectorBytes is the disk's logical sector size, such as 512 or 4096.
	// +optional
	LogicalSectorBytes int32 `json:"logicalSectorBytes,omitempty"`
	// Partitions are the disk's partitions and what is on them.
	// +optional
	// +listType=map
	// +listMapKey=name
	Partitions []PartitionInfo `json:"partitions,omitempty"`
}

// PartitionInfo is one partition of a disk.
type PartitionInfo struct {
	// Name is the kernel name, such as vda5.
	Name string `json:"name"`
	// Label is the GPT partition name, such as liken-state.
	// +optional
	Label     string `json:"label,omitempty"`
	SizeBytes int64  `json:"sizeBytes,omitempty"`
	// Filesystem is the file system on it (ext4, vfat, squashfs...), when one is found.
	// +optional
	Filesystem string `json:"filesystem,omitempty"`
	// MountPoint is where it is mounted, when it is.
	// +optional
	MountPoint string `json:"mountPoint,omitempty"`
	// FreeBytes is the free space of its mounted file system, rounded down to 1% of its size
	// so that status changes only when it does by that much.
	// +optional
	FreeBytes int64 `json:"freeBytes,omitempty"`
}

// NICInfo describes one network interface.
type NICInfo struct {
	Name   string `json:"name"`
	MAC    string `json:"mac,omitempty"`
	Driver string `json:"driver,omitempty"`
	// Link is true when the interface has a carrier.
	Link bool `json:"link,omitempty"`
	// SpeedMbps is the negotiated speed, when the driver reports one.
	SpeedMbps int32 `json:"speedMbps,omitempty"`
}

// PCIDevice is one PCI function.
type PCIDevice struct {
	// Address is the PCI address, such as 0000:00:03.0.
	Address string `json:"address"`
	// Vendor and Device are the hexadecimal IDs, such as 1af4 and 1000.
	Vendor string `json:"vendor,omitempty"`
	Device string `json:"device,omitempty"`
	// Class is the hexadecimal class code, such as 020000 (Ethernet).
	Class string `json:"class,omitempty"`
	// Driver is the bound driver; empty when none is bound.
	Driver string `json:"driver,omitempty"`
}

// Slot is one of the two copies of the operating system on a machine's disk.
// +kubebuilder:validation:Enum=A;B
type Slot string

const (
	SlotA Slot = "A"
	SlotB Slot = "B"
)

// RunningRelease is the release a machine booted.
type RunningRelease struct {
	Version string `json:"version,omitempty"`
	Digest  string `json:"digest,omitempty"`
	// Slot the machine booted.
	Slot Slot `json:"slot,omitempty"`
	// LastGoodSlot is the slot the machine falls back to: the last one that passed its trial.
	LastGoodSlot Slot `json:"lastGoodSlot,omitempty"`
	// Trial is true while this boot is a trial that has not been committed yet.
	// +optional
	Trial bool `json:"trial,omitempty"`
	// BootTime is when the machine booted.
	// +optional
	BootTime *metav1.Time `json:"bootTime,omitempty"`
	// K3s is the k3s version in the release; "stand-in" marks the node simulator used in
	// tests, which a real release never carries.
	// +optional
	K3s string `json:"k3s,omitempty"`
	// LayerDigest is the digest of the deployment layer this machine was installed with,
	// as liken layer printed it (install records it on the disk, and init checks the
	// layer's bytes against it at every boot); empty on a disk that records none.
	// +optional
	LayerDigest string `json:"layerDigest,omitempty"`
}

// ChangeClass says how a change to a spec field reaches a machine.
// +kubebuilder:validation:Enum=Live;RestartK3s;NextBoot;Reboot;Immutable
type ChangeClass string

const (
	// Live changes apply within seconds, with no restart.
	Live ChangeClass = "Live"
	// RestartK3s changes restart k3s in place; containers keep running.
	RestartK3s ChangeClass = "RestartK3s"
	// NextBoot changes are staged and take effect at the next boot, whatever its reason.
	NextBoot ChangeClass = "NextBoot"
	// Reboot changes are staged and the machine asks for a reboot turn of its own.
	Reboot ChangeClass = "Reboot"
	// Immutable fields are refused by the API once set.
	Immutable ChangeClass = "Immutable"
)

// PendingChange is one staged change.
type PendingChange struct {
	// Field is the spec path, such as machine.spec.network or cluster.spec.version;
	// machine.spec.reboot.request for an operator's reboot request not carried out yet.
	Field string `json:"field"`
	// Class is NextBoot or Reboot.
	Class ChangeClass `json:"class"`
	// From is the applied value (JSON), To the staged one.
	// +optional
	From string `json:"from,omitempty"`
	// +optional
	To string `json:"to,omitempty"`
	// Since when the change waits.
	Since metav1.Time `json:"since"`
}

// RebootState is where a machine is in its reboot.
// +kubebuilder:validation:Enum=None;WaitingForApproval;WaitingForTurn;Draining;DrainBlocked;Rebooting;Verifying
type RebootState string

const (
	// RebootNone: nothing asks for a reboot.
	RebootNone RebootState = "None"
	// RebootWaitingForApproval: changes or a request need a reboot; rebootPolicy is Manual
	// and no approval matches pendingHash.
	RebootWaitingForApproval RebootState = "WaitingForApproval"
	// RebootWaitingForTurn: the reboot may go ahead once the disruption budget gives a turn.
	RebootWaitingForTurn RebootState = "WaitingForTurn"
	// RebootDraining: the machine holds a turn; the coordinator cordons its Node and evicts
	// its pods.
	RebootDraining RebootState = "Draining"
	// RebootDrainBlocked: the last drain did not finish within drain.timeout; the machine
	// was uncordoned, gave its turn back and waits to try again (the message names the
	// pods and PodDisruptionBudgets in the way, and when).
	RebootDrainBlocked RebootState = "DrainBlocked"
	// RebootRebooting: the machine is going down.
	RebootRebooting RebootState = "Rebooting"
	// RebootVerifying: the machine is back and waits to be healthy before it gives the turn
	// back.
	RebootVerifying RebootState = "Verifying"
)

// RebootStatus is the machine's side of a reboot.
type RebootStatus struct {
	// State is where the machine is.
	// +optional
	State RebootState `json:"state,omitempty"`
	// Since is when State last changed.
	// +optional
	Since *metav1.Time `json:"since,omitempty"`
	// Message says why, in words: what it waits for, or what blocks it.
	// +optional
	Message string `json:"message,omitempty"`
	// ApprovedHash is the pending hash of the approval the machine acted on.
	// +optional
	ApprovedHash string `json:"approvedHash,omitempty"`
	// LastRequestHandled is the requestedAt of the last reboot request carried out.
	// +optional
	LastRequestHandled *metav1.Time `json:"lastRequestHandled,omitempty"`
	// BlockingPods are the namespace/name of pods that kept the last drain from finishing.
	// +optional
	// +listType=atomic
	BlockingPods []string `json:"blockingPods,omitempty"`
	// LastRebootTime is when the machine last went down for a reboot liken coordinated.
	// +optional
	LastRebootTime *metav1.Time `json:"lastRebootTime,omitempty"`
}

// UpgradeState is where a machine is in moving to another release.
// +kubebuilder:validation:Enum=Idle;Downloading;Staged;Trial;FellBack
type UpgradeState string

const (
	// UpgradeIdle: the machine runs the release it is meant to run.
	UpgradeIdle UpgradeState = "Idle"
	// UpgradeDownloading: the release is being fetched and verified into the inactive slot.
	UpgradeDownloading UpgradeState = "Downloading"
	// UpgradeStaged: the inactive slot holds the verified release; a reboot is pending.
	UpgradeStaged UpgradeState = "Staged"
	// UpgradeTrial: the machine booted the new slot once and waits to pass its health gate.
	UpgradeTrial UpgradeState = "Trial"
	// UpgradeFellBack: the trial failed and the machine booted its last good slot again.
	UpgradeFellBack UpgradeState = "FellBack"
)

// UpgradeStatus is the machine's progress towards a release.
type UpgradeStatus struct {
	// State is where the machine is.
	// +optional
	State UpgradeState `json:"state,omitempty"`
	// WantedVersion is the release this machine is meant to run: its spec.version, else
	// the Cluster's. It differs from release.version while the machine moves to it, or
	// when it cannot (see state and message).
	// +optional
	WantedVersion string `json:"wantedVersion,omitempty"`
	// TargetVersion and TargetDigest are the release the machine moves to.
	// +optional
	TargetVersion string `json:"targetVersion,omitempty"`
	// +optional
	TargetDigest string `json:"targetDigest,omitempty"`
	// TargetSlot is the slot being written or tried.
	// +optional
	TargetSlot Slot `json:"targetSlot,omitempty"`
	// BytesDone and BytesTotal show download progress.
	// +optional
	BytesDone int64 `json:"bytesDone,omitempty"`
	// +optional
	BytesTotal int64 `json:"bytesTotal,omitempty"`
	// Message says what happens or what failed, in words.
	// +optional
	Message string `json:"message,omitempty"`
	// FailedReleases are digests whose trial failed here; none is retried unless
	// spec.retryFailedDigest names it.
	// +optional
	// +listType=map
	// +listMapKey=digest
	FailedReleases []FailedRelease `json:"failedReleases,omitempty"`
	// FailedKernelArgs are the kernel arguments the spec asks for (the Cluster's, then the
	// Machine's) when their trial failed here; they are not tried again until the spec asks
	// for others.
	// +optional
	FailedKernelArgs *FailedArgs `json:"failedKernelArgs,omitempty"`
}

// FailedArgs are kernel arguments whose trial failed on this machine (the state the
// agent keeps on disk has a type of the same name and shape).
type FailedArgs struct {
	// Args is the whole of what liken appends to the command line, as tried.
	Args string `json:"args"`
	// Reason the trial failed: a condition reason such as KernelPanic or HealthDeadline.
	Reason string `json:"reason,omitempty"`
	// +optional
	Message string      `json:"message,omitempty"`
	At      metav1.Time `json:"at"`
}

// FailedRelease is a release whose trial failed on this machine.
type FailedRelease struct {
	Digest  string `json:"digest"`
	Version string `json:"version,omitempty"`
	// Reason the trial failed: a condition reason such as KernelPanic or HealthDeadline.
	Reason string `json:"reason,omitempty"`
	// Message in words.
	// +optional
	Message string      `json:"message,omitempty"`
	At      metav1.Time `json:"at"`
	// Retried: this failure happened while spec.retryFailedDigest named the digest (the one
	// retry that setting allows, or a setting made before the release first failed), so the
	// setting is used; it goes back to false once the setting is cleared.
	// +optional
	Retried bool `json:"retried,omitempty"`
}

// DiskPhase is what became of a disk spec.disks names.
// +kubebuilder:validation:Enum=Ready;Refused;Failed
type DiskPhase string

// Disk phases.
const (
	// DiskReady: partitioned and formatted as the spec says, its file systems mounted.
	DiskReady DiskPhase = "Ready"
	// DiskRefused: the disk was left untouched (its reason says why); the machine runs
	// without it.
	DiskRefused DiskPhase = "Refused"
	// DiskFailed: preparing or mounting it failed part-way; its reason and message say where.
	DiskFailed DiskPhase = "Failed"
)

// Reasons a disk has its phase (DiskStatus.Reason); docs/disks.md says what to do for each.
const (
	// DiskPrepared: found empty and partitioned, formatted and mounted at this boot.
	DiskPrepared = "Prepared"
	// DiskWiped: erased by the spec's one-time wipe, then prepared.
	DiskWiped = "Wiped"
	// DiskMounted: found as the spec says and mounted; nothing was formatted.
	DiskMounted = "Mounted"
	// DiskLayoutDiffers: the disk's partitions or file systems differ from the spec.
	DiskLayoutDiffers = "LayoutDiffers"
	// DiskHoldsData: no partition table, but not empty either (a file system, an MBR, ...).
	DiskHoldsData = "HoldsData"
	// DiskInstallDisk: the disk holds liken's own install.
	DiskInstallDisk = "InstallDisk"
	// DiskNamedTwice: two entries of spec.disks name the same disk.
	DiskNamedTwice = "NamedTwice"
	// DiskNotFound: no such block device, or not a whole disk.
	DiskNotFound = "NotFound"
	// DiskTooSmall: the partitions the spec asks for do not fit on the disk.
	DiskTooSmall = "TooSmall"
	// DiskSetupFailed: writing the table, formatting or mounting failed.
	DiskSetupFailed = "SetupFailed"
)

// DiskStatus is what init did with one disk of spec.disks at this boot.
type DiskStatus struct {
	// Device is the disk as spec.disks names it.
	Device DevicePath `json:"device"`
	// Path is the block device it names, such as /dev/vdb.
	// +optional
	// +kubebuilder:validation:MaxLength=255
	Path string `json:"path,omitempty"`
	// Serial is the disk's serial number; a wipe must name it.
	// +optional
	// +kubebuilder:validation:MaxLength=255
	Serial string `json:"serial,omitempty"`
	// ContentID identifies what the disk holds: gpt:<disk GUID> for a partition table,
	// sha256:<...> of its first and last MiB otherwise, empty for an empty disk. A wipe must
	// name the one shown while the disk is refused.
	// +optional
	// +kubebuilder:validation:MaxLength=80
	ContentID string `json:"contentID,omitempty"`
	// Phase is Ready, Refused or Failed.
	Phase DiskPhase `json:"phase"`
	// Reason is one of the documented reasons, such as Prepared or LayoutDiffers.
	// +kubebuilder:validation:MaxLength=64
	Reason string `json:"reason"`
	// Message says what init found and, when it differs, what the spec wants.
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	Message string `json:"message,omitempty"`
}
