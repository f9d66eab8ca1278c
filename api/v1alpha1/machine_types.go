package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Machine describes one machine: its disks, network ports and kernel modules, and how it
// joins the cluster. Its name is the machine's hostname and Kubernetes node name. The
// machine reports what it finds (hardware, running release, pending changes) in status.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,categories=liken,shortName=lm
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Role",type=string,JSONPath=`.spec.role`,description="server or agent"
// +kubebuilder:printcolumn:name="Wanted",type=string,JSONPath=`.status.upgrade.wantedVersion`,description="Release the machine is meant to run: its spec.version, else the Cluster's"
// +kubebuilder:printcolumn:name="Running",type=string,JSONPath=`.status.release.version`,description="Release the machine runs"
// +kubebuilder:printcolumn:name="Slot",type=string,JSONPath=`.status.release.slot`,description="Slot the machine booted"
// +kubebuilder:printcolumn:name="Upgrade",type=string,JSONPath=`.status.upgrade.state`,description="Where the machine is in moving to the wanted release"
// +kubebuilder:printcolumn:name="Pending",type=integer,JSONPath=`.status.pendingCount`,description="Changes staged for a boot or reboot"
// +kubebuilder:printcolumn:name="Reboot",type=string,JSONPath=`.status.reboot.state`,description="Where the machine is in its reboot"
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`,description="k3s healthy, node Ready, agent reconciled"
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="self.metadata.name.size() <= 63 && self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",message="a Machine's name becomes its hostname and node name: at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit"
type Machine struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec MachineSpec `json:"spec"`
	// +optional
	Status MachineStatus `json:"status,omitempty"`
}

// Role is the part a machine plays in k3s.
// +kubebuilder:validation:Enum=server;agent
type Role string

const (
	// RoleServer runs the control plane (k3s server) and workloads.
	RoleServer Role = "server"
	// RoleAgent runs workloads only (k3s agent).
	RoleAgent Role = "agent"
)

// MachineSpec is what operators declare for one machine.
//
// +kubebuilder:validation:XValidation:rule="!has(self.etcdRestore) || self.role == 'server'",message="spec.etcdRestore is for servers: an agent has no etcd"
// +kubebuilder:validation:XValidation:rule="!has(self.etcdRejoin) || self.role == 'server'",message="spec.etcdRejoin is for servers: an agent has no etcd"
// +kubebuilder:validation:XValidation:rule="!has(self.etcdRejoin) || !has(self.etcdRestore)",message="spec.etcdRejoin and spec.etcdRestore exclude each other: a server is either restored (the cluster starts again from it) or rejoins the restored one"
// +kubebuilder:validation:XValidation:rule="has(self.install) == has(oldSelf.install)",message="spec.install is immutable: it records the disk the machine was installed on"
// +kubebuilder:validation:XValidation:rule="!has(self.install) || !has(self.disks) || self.disks.all(d, d.device != self.install.disk)",message="spec.disks must not list the install disk: liken owns its layout"
type MachineSpec struct {
	// Role is server (control plane and workloads) or agent (workloads). Immutable: a
	// machine changes role only by reinstalling it.
	// +required
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.role is immutable: reinstall the machine to change its role"
	Role Role `json:"role"`

	// Match identifies this machine's hardware at boot, so a disk installed without
	// --machine finds its own manifest among the layer's (one machine's layer, or a disk
	// moved between machines). Without it, the name given at install is used. install
	// refuses to leave a disk unbound to a layer of several machines' credentials.
	// +optional
	Match *MachineMatch `json:"match,omitempty"`

	// Install records the disk liken was installed on. Immutable.
	// +optional
	Install *Install `json:"install,omitempty"`

	// Disks partitions, formats and mounts further disks at boot, before k3s. A disk that
	// holds data or another layout is never touched (see its wipe). A change needs a reboot.
	// +optional
	// +listType=map
	// +listMapKey=device
	// +kubebuilder:validation:MaxItems=16
	Disks []Disk `json:"disks,omitempty"`

	// Network configures the machine's interfaces, routes and resolvers. A change needs a
	// reboot, which boots once with the new settings as a trial: unless the machine reaches
	// its API server and is healthy in time, the boot after it runs the last good settings,
	// and those settings are not tried again until this field changes. Without it the first
	// interface with a link uses DHCP.
	// +optional
	Network *MachineNetwork `json:"network,omitempty"`

	// KernelModules are loaded at boot, with their parameters. A change applies at the next
	// boot.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=64
	KernelModules []KernelModule `json:"kernelModules,omitempty"`

	// Sysctls are kernel parameters for this machine; they win over the Cluster's. Applied
	// live; a key removed from the spec gets its original value back.
	// +optional
	Sysctls Sysctls `json:"sysctls,omitempty"`

	// NodeLabels are labels liken keeps on this machine's Node. Labels others set are left
	// alone. Applied live.
	// +optional
	// +kubebuilder:validation:MaxProperties=64
	// +kubebuilder:validation:XValidation:rule="self.all(k, k.size() <= 317 && k.matches('^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$'))",message="node label keys must be a name of at most 63 letters, digits, '-', '_' or '.' (starting and ending with a letter or digit), with an optional DNS-subdomain prefix and '/', such as example.com/rack"
	NodeLabels map[string]LabelValue `json:"nodeLabels,omitempty"`

	// NodeTaints are taints liken keeps on this machine's Node. Taints others set are left
	// alone. Applied live.
	// +optional
	// +listType=map
	// +listMapKey=key
	// +listMapKey=effect
	// +kubebuilder:validation:MaxItems=32
	NodeTaints []Taint `json:"nodeTaints,omitempty"`

	// KernelArgs are appended to the kernel command line after the Cluster's. A change boots
	// as a one-shot trial and falls back if the machine does not come back healthy.
	// +optional
	// +kubebuilder:validation:MaxItems=64
	// +listType=atomic
	KernelArgs []KernelArg `json:"kernelArgs,omitempty"`

	// RebootPolicy overrides the Cluster's rebootPolicy for this machine.
	// +optional
	RebootPolicy *RebootPolicy `json:"rebootPolicy,omitempty"`

	// Version overrides the Cluster's spec.version for this machine: a canary, or a
	// single-machine rollback. It must be pinned in the Cluster's spec.releases; a machine
	// reports an unpinned version in its conditions and keeps what it runs.
	// +optional
	Version ReleaseVersion `json:"version,omitempty"`

	// RetryFailedDigest allows the machine to try once more a release digest whose trial
	// failed here. A failed digest is never retried otherwise. The retry belongs to this
	// setting, not to the Machine's other fields: once it is used (its failure shows
	// retried: true in status.upgrade.failedReleases), no other edit allows another; clear
	// the field, wait until the failure no longer shows retried, then set it again.
	// +optional
	RetryFailedDigest Digest `json:"retryFailedDigest,omitempty"`

	// Reboot holds an operator's reboot approval and reboot request. Only operators write
	// it: a machine's own credentials cannot.
	// +optional
	Reboot *RebootControl `json:"reboot,omitempty"`

	// EtcdRestore restores this server's etcd from one of its snapshots at its next boot,
	// once, as k3s's --cluster-reset --cluster-reset-restore-path does: the way back from a
	// lost quorum or a cluster's bad write. Everything written to the cluster after the
	// snapshot is lost, this field among it: the restored Machine has none. The other servers
	// then rejoin with their etcd data removed (docs/reboots.md, "A way back from a lost
	// quorum"). Servers only.
	// +optional
	EtcdRestore *EtcdRestore `json:"etcdRestore,omitempty"`

	// EtcdRejoin has this server leave its etcd data and join the cluster's etcd again as a
	// new member, at its next boot, once: what k3s's docs ask of the other servers after one
	// was restored from a snapshot (remove server/db on them, start k3s). Init moves
	// server/db/etcd aside (server/db/etcd-old-<time>, as k3s's own reset does) before k3s
	// starts, and k3s joins through the server address in its configuration. The server that
	// initialises the cluster (cluster-init, no server address) refuses it: without its data
	// it would start a new, empty cluster. Servers only.
	// +optional
	EtcdRejoin *EtcdRejoin `json:"etcdRejoin,omitempty"`
}

// EtcdRejoin asks a server to join the cluster's etcd again without its data.
type EtcdRejoin struct {
	// Request tells one rejoin from another: a machine rejoins once per request
	// (status.etcdRejoin says it did), so rejoining again takes a new one.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Request string `json:"request"`
}

// EtcdRestore names the snapshot a server's etcd is restored from.
type EtcdRestore struct {
	// Snapshot is the snapshot's file name in k3s's snapshot directory on this server
	// (server/db/snapshots), as status.etcdSnapshot or liken status name it.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self.matches('^[A-Za-z0-9][A-Za-z0-9._-]*$')",message="snapshot is a file name in k3s's snapshot directory: letters, digits, '.', '_' and '-'"
	Snapshot string `json:"snapshot"`
	// Request tells one restore from another: a machine restores once for a snapshot and
	// request (status.etcdRestore says it did), so restoring the same snapshot again takes
	// a new request.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	Request string `json:"request,omitempty"`
}

// MachineMatch identifies a machine's hardware.
//
// +kubebuilder:validation:XValidation:rule="has(self.macs) || has(self.serial)",message="match needs at least one MAC address or a serial number"
type MachineMatch struct {
	// MACs match if any of the machine's network interfaces has one of them.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=16
	MACs []MACAddress `json:"macs,omitempty"`
	// Serial matches the system serial number (DMI product_serial).
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	Serial string `json:"serial,omitempty"`
}

// Install records where liken was installed.
//
// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.install is immutable: it records the disk the machine was installed on"
type Install struct {
	// Disk liken was installed on; it holds the boot partition, slots A and B, the layer
	// and the state partition. The installer image installs this disk, preferably named by
	// a stable path such as /dev/disk/by-id/...; without spec.install, the one disk that
	// could be it.
	// +required
	Disk DevicePath `json:"disk"`
	// Wipe allows the installer image to erase the install disk once, when it holds data:
	// it must name the disk's serial and the content ID the installer shows when it refuses
	// the disk, as a data disk's wipe does.
	// +optional
	Wipe *DiskWipe `json:"wipe,omitempty"`
}

// Filesystem is a filesystem liken can create.
// +kubebuilder:validation:Enum=ext4;vfat;swap;none
type Filesystem string

// Disk is a disk liken partitions, formats and mounts.
type Disk struct {
	// Device is the disk, preferably by a stable path such as /dev/disk/by-id/....
	// +required
	Device DevicePath `json:"device"`
	// Partitions in order. Only the last may omit its size, to take the rest of the disk.
	// +required
	// +listType=map
	// +listMapKey=label
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:XValidation:rule="self.all(p, has(p.size) || p == self[size(self) - 1])",message="only the last partition may omit its size"
	Partitions []Partition `json:"partitions"`
	// Wipe allows liken to erase this disk once, when it holds data or partitions other
	// than the spec's: it must name the disk's serial and the content ID status.disks shows
	// while the disk is refused. Erasing gives the disk a new content ID, so the wipe never
	// applies twice, and a wipe copied to another Machine names another disk's serial.
	// +optional
	Wipe *DiskWipe `json:"wipe,omitempty"`
}

// DiskWipe names the one disk, and the one content of it, that may be erased.
type DiskWipe struct {
	// Serial is the disk's serial number, as status.disks shows it.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	Serial string `json:"serial"`
	// ContentID is what the disk holds now, as status.disks shows it.
	// +required
	// +kubebuilder:validation:MaxLength=80
	// +kubebuilder:validation:XValidation:rule="self.matches('^(gpt:[0-9A-F]{8}-[0-9A-F]{4}-[0-9A-F]{4}-[0-9A-F]{4}-[0-9A-F]{12}|sha256:[0-9a-f]{64})$')",message="contentID is gpt:<disk GUID> or sha256:<64 hex digits>, as status.disks shows it"
	ContentID string `json:"contentID"`
}

// Partition is one GPT partition and what lives on it.
//
// +kubebuilder:validation:XValidation:rule="!has(self.mountPoint) || (self.filesystem != 'swap' && self.filesystem != 'none')",message="a swap or unformatted partition has no mountPoint"
type Partition struct {
	// Label is the GPT partition name and filesystem label.
	// +required
	// +kubebuilder:validation:MaxLength=36
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9][-a-z0-9]*$')",message="partition labels are lowercase letters, digits and '-', at most 36 characters"
	Label string `json:"label"`
	// Size of the partition, as a quantity such as 20Gi; omitted on the last partition, it
	// takes the rest of the disk.
	// +optional
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="isQuantity(self) && quantity(self).isGreaterThan(quantity('1Mi'))",message="partition size must be a quantity of more than 1Mi, such as 512Mi or 20Gi"
	Size string `json:"size,omitempty"`
	// Filesystem to create.
	// +optional
	// +kubebuilder:default=ext4
	Filesystem Filesystem `json:"filesystem,omitempty"`
	// MountPoint is where the filesystem is mounted: an absolute path under /var/.
	// +optional
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:XValidation:rule="self.matches('^/var/[-A-Za-z0-9_.][-A-Za-z0-9_./]*$') && !self.contains('..') && !self.contains('//')",message="mountPoint must be an absolute path under /var/, such as /var/mnt/data, without '..'"
	MountPoint string `json:"mountPoint,omitempty"`
}

// MachineNetwork is the machine's network configuration.
//
// +kubebuilder:validation:XValidation:rule="!has(self.interfaces) || self.interfaces.all(i, !has(i.vlan) || self.interfaces.exists(j, j.name == i.vlan.link))",message="a VLAN's link must be one of the interfaces listed in network.interfaces"
// +kubebuilder:validation:XValidation:rule="!has(self.interfaces) || self.interfaces.all(i, !has(i.bond) || i.bond.interfaces.all(m, self.interfaces.exists(j, j.name == m)))",message="a bond's member interfaces must be listed in network.interfaces"
// +kubebuilder:validation:XValidation:rule="!has(self.nodeIP) || (has(self.interfaces) && self.interfaces.exists(i, has(i.addresses) && i.addresses.exists(a, a.startsWith(self.nodeIP + '/'))))",message="nodeIP must be one of the interfaces' static addresses"
type MachineNetwork struct {
	// Interfaces: physical ports, bonds and VLANs.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=32
	Interfaces []Interface `json:"interfaces,omitempty"`
	// Routes beyond those DHCP provides.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	Routes []Route `json:"routes,omitempty"`
	// DNS resolvers and search domains, beyond those DHCP provides.
	// +optional
	DNS *DNS `json:"dns,omitempty"`
	// NodeIP is the address k3s gives its Node and reaches other machines from (k3s's
	// node-ip; flannel uses the interface that holds it): one of the interfaces' static
	// addresses, without its prefix length. Empty, k3s takes the address of the interface of
	// the default route, which on a machine with several networks may be the wrong one.
	// +optional
	// +kubebuilder:validation:MaxLength=39
	// +kubebuilder:validation:XValidation:rule="isIP(self)",message="nodeIP must be an IP address, such as 192.168.1.10"
	NodeIP string `json:"nodeIP,omitempty"`
}

// Interface configures one network interface: a physical port, a bond or a VLAN.
//
// +kubebuilder:validation:XValidation:rule="!(has(self.bond) && has(self.vlan))",message="an interface is a bond or a VLAN, not both"
// +kubebuilder:validation:XValidation:rule="!(has(self.mac) && (has(self.bond) || has(self.vlan)))",message="mac names a physical port; bonds and VLANs have none"
type Interface struct {
	// Name of the interface on the machine.
	// +required
	Name InterfaceName `json:"name"`
	// MAC selects the physical port by hardware address and gives it Name.
	// +optional
	MAC MACAddress `json:"mac,omitempty"`
	// DHCP asks for an IPv4 address by DHCP.
	// +optional
	DHCP bool `json:"dhcp,omitempty"`
	// Addresses are static addresses with their prefix length, such as 192.168.1.10/24.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=43
	// +kubebuilder:validation:items:XValidation:rule="isCIDR(self)",message="addresses must be an IP address with a prefix length, such as 192.168.1.10/24"
	Addresses []string `json:"addresses,omitempty"`
	// MTU of the interface.
	// +optional
	// +kubebuilder:validation:Minimum=576
	// +kubebuilder:validation:Maximum=9216
	MTU int32 `json:"mtu,omitempty"`
	// Bond makes this interface a bond of other interfaces.
	// +optional
	Bond *Bond `json:"bond,omitempty"`
	// VLAN makes this interface a VLAN on another interface.
	// +optional
	VLAN *VLAN `json:"vlan,omitempty"`
}

// BondMode is a Linux bonding mode.
// +kubebuilder:validation:Enum=balance-rr;active-backup;balance-xor;broadcast;802.3ad;balance-tlb;balance-alb
type BondMode string

// Bond aggregates interfaces.
type Bond struct {
	// Mode is the bonding mode.
	// +required
	Mode BondMode `json:"mode"`
	// Interfaces are the bond's members, each listed in network.interfaces.
	// +required
	// +listType=set
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=8
	Interfaces []InterfaceName `json:"interfaces"`
}

// VLAN is an 802.1Q VLAN on another interface.
type VLAN struct {
	// ID is the VLAN ID.
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=4094
	ID int32 `json:"id"`
	// Link is the interface the VLAN runs on.
	// +required
	Link InterfaceName `json:"link"`
}

// Route is a static route.
type Route struct {
	// To is the destination network, such as 10.10.0.0/16 or 0.0.0.0/0.
	// +required
	// +kubebuilder:validation:MaxLength=43
	// +kubebuilder:validation:XValidation:rule="isCIDR(self)",message="route destination must be a network in CIDR notation, such as 10.10.0.0/16 or 0.0.0.0/0"
	To string `json:"to"`
	// Via is the gateway address.
	// +optional
	// +kubebuilder:validation:MaxLength=39
	// +kubebuilder:validation:XValidation:rule="isIP(self)",message="route gateway must be an IP address"
	Via string `json:"via,omitempty"`
	// Interface the route leaves by.
	// +optional
	Interface InterfaceName `json:"interface,omitempty"`
	// Metric of the route; lower wins.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Metric int32 `json:"metric,omitempty"`
}

// DNS lists resolvers and search domains.
type DNS struct {
	// Nameservers are resolver addresses.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=3
	// +kubebuilder:validation:items:MaxLength=39
	// +kubebuilder:validation:items:XValidation:rule="isIP(self)",message="nameservers must be IP addresses"
	Nameservers []string `json:"nameservers,omitempty"`
	// Search domains.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=6
	// +kubebuilder:validation:items:MaxLength=253
	Search []string `json:"search,omitempty"`
}

// KernelModule is a kernel module loaded at boot.
type KernelModule struct {
	// Name of the module, as modprobe knows it.
	// +required
	// +kubebuilder:validation:MaxLength=56
	// +kubebuilder:validation:XValidation:rule="self.matches('^[A-Za-z0-9_-]+$')",message="kernel module names are letters, digits, '_' and '-', such as br_netfilter"
	Name string `json:"name"`
	// Parameters passed when the module is loaded.
	// +optional
	// +kubebuilder:validation:MaxProperties=32
	// +kubebuilder:validation:XValidation:rule="self.all(k, k.size() <= 64 && k.matches('^[A-Za-z0-9_]+$'))",message="module parameter names are letters, digits and '_'"
	Parameters map[string]ModuleParameterValue `json:"parameters,omitempty"`
}

// LabelValue is a Kubernetes label value.
// +kubebuilder:validation:MaxLength=63
// +kubebuilder:validation:XValidation:rule="self.matches('^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$')",message="node label values must be at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit, or empty"
type LabelValue string

// ModuleParameterValue is the value of one kernel module parameter.
// +kubebuilder:validation:MaxLength=1024
// +kubebuilder:validation:XValidation:rule="!self.contains(' ')",message="module parameter values must have no spaces"
type ModuleParameterValue string

// TaintEffect is a Kubernetes taint effect.
// +kubebuilder:validation:Enum=NoSchedule;PreferNoSchedule;NoExecute
type TaintEffect string

// Taint is a taint liken keeps on the machine's Node.
type Taint struct {
	// Key of the taint.
	// +required
	// +kubebuilder:validation:MaxLength=317
	// +kubebuilder:validation:XValidation:rule="self.matches('^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$')",message="taint keys must be a name of at most 63 letters, digits, '-', '_' or '.' with an optional DNS-subdomain prefix and '/', such as example.com/dedicated"
	Key string `json:"key"`
	// Value of the taint.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:XValidation:rule="self.matches('^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$')",message="taint values must be at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
	Value string `json:"value,omitempty"`
	// Effect of the taint.
	// +required
	Effect TaintEffect `json:"effect"`
}

// RebootControl is the operator's side of a reboot. Only operators write it.
type RebootControl struct {
	// Approval approves the reboot for exactly one staged change set, named by its hash
	// (status.pendingHash). An approval for any other set is ignored.
	// +optional
	Approval *RebootApproval `json:"approval,omitempty"`
	// Request asks for a reboot when nothing has changed. It is pending (status.pending
	// lists machine.spec.reboot.request) until the machine boots after requestedAt, and it
	// waits for an approval and a turn like any other reboot. A new request time asks again.
	// +optional
	Request *RebootRequest `json:"request,omitempty"`
}

// RebootApproval is an operator's approval of one staged change set.
type RebootApproval struct {
	// PendingHash is the status.pendingHash being approved.
	// +required
	// +kubebuilder:validation:MaxLength=71
	// +kubebuilder:validation:XValidation:rule="self.matches('^sha256:[0-9a-f]{64}$')",message="approval.pendingHash must be a status.pendingHash: 'sha256:' followed by 64 lowercase hexadecimal digits"
	PendingHash string `json:"pendingHash"`
	// ApprovedBy names who approved.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	ApprovedBy string `json:"approvedBy,omitempty"`
	// ApprovedAt is when.
	// +optional
	ApprovedAt *metav1.Time `json:"approvedAt,omitempty"`
	// ServersDown lets this server take its turn while it is unavailable (NotReady or
	// gone) and the servers named here are down too. A NotReady server may still be a
	// healthy etcd voter, so liken never reboots one while another server is down on its
	// own judgement: an operator who knows that the control plane keeps its quorum without
	// both says so here (liken approve-reboot SERVER --servers-down OTHER). It holds for this
	// approval's pending set only, and only while every other server down is named.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=253
	ServersDown []string `json:"serversDown,omitempty"`
}

// RebootRequest asks for a reboot without a change.
type RebootRequest struct {
	// RequestedAt identifies the request; a later time is a new request.
	// +required
	RequestedAt metav1.Time `json:"requestedAt"`
	// RequestedBy names who asked.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	RequestedBy string `json:"requestedBy,omitempty"`
	// Reason is shown in status while the reboot waits.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Reason string `json:"reason,omitempty"`
}

// +kubebuilder:object:root=true

// MachineList is a list of Machines.
type MachineList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Machine `json:"items"`
}
