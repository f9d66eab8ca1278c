package v1alpha1

// ReleaseVersion names a release: its build date and a three-digit sequence, e.g.
// 2026.07.20-001. Versions sort in release order as plain strings.
// +kubebuilder:validation:MaxLength=14
// +kubebuilder:validation:XValidation:rule="self.matches('^[0-9]{4}[.][0-9]{2}[.][0-9]{2}-[0-9]{3}$')",message="must be a release version such as 2026.07.20-001: the date as YYYY.MM.DD, '-', and a three-digit sequence"
type ReleaseVersion string

// Digest is the digest of a release document: "sha256:" and the hex SHA-256 of the exact
// bytes of its release.json.
// +kubebuilder:validation:MaxLength=71
// +kubebuilder:validation:XValidation:rule="self.matches('^sha256:[0-9a-f]{64}$')",message="must be a release digest: 'sha256:' followed by 64 lowercase hexadecimal digits"
type Digest string

// RebootPolicy says whether a machine that holds a reboot turn also waits for an operator.
// +kubebuilder:validation:Enum=Manual;Auto
type RebootPolicy string

const (
	// RebootManual: a staged reboot waits for its turn and for `liken approve-reboot`.
	RebootManual RebootPolicy = "Manual"
	// RebootAuto: a staged reboot is taken as soon as the disruption budget gives a turn.
	RebootAuto RebootPolicy = "Auto"
)

// Sysctls maps kernel parameter names (dotted, as in sysctl(8)) to the values to write.
// +kubebuilder:validation:MaxProperties=128
// +kubebuilder:validation:XValidation:rule="self.all(k, k.size() <= 253 && k.matches('^[a-z0-9]([-_a-z0-9]*[a-z0-9])?([./][a-z0-9]([-_a-z0-9]*[a-z0-9])?)+$'))",message="sysctl names must be dotted kernel parameter names such as net.ipv4.ip_forward: lowercase letters, digits, '-' and '_' between '.' or '/' separators, no spaces"
type Sysctls map[string]SysctlValue

// SysctlValue is the value written to a sysctl: one non-empty line.
// +kubebuilder:validation:MaxLength=1024
// +kubebuilder:validation:XValidation:rule="self.size() > 0 && !self.contains('\\n')",message="sysctl values must be non-empty single lines of at most 1024 characters"
type SysctlValue string

// KernelArg is one kernel command-line argument, e.g. console=ttyS0,115200 or quiet.
// liken.* arguments are liken's own and refused (liken sets them, last, at every boot), but
// for liken.test.* switches, which act only in releases built for tests.
// +kubebuilder:validation:MinLength=1
// +kubebuilder:validation:MaxLength=256
// +kubebuilder:validation:XValidation:rule="self.matches('^[^\\\\s\"]+$')",message="must be one kernel argument without spaces or quotes, such as console=ttyS0,115200 or quiet"
// +kubebuilder:validation:XValidation:rule="!self.startsWith('liken.') || self.matches('^liken[.]test([.=].*)?$')",message="liken.* kernel arguments are liken's own: it sets them at every boot, after the Cluster's and Machine's, so they cannot be given here (only liken.test.* switches, which act only in releases built for tests)"
type KernelArg string

// DevicePath is a block device path under /dev, preferably a stable one such as
// /dev/disk/by-id/....
// +kubebuilder:validation:MaxLength=255
// +kubebuilder:validation:XValidation:rule="self.matches('^/dev/[A-Za-z0-9][-A-Za-z0-9_.:+@/]*$') && !self.contains('..') && !self.contains('//')",message="must be a block device path under /dev/ such as /dev/vda or /dev/disk/by-id/nvme-eui.0025385b71b07e2f, without '..'"
type DevicePath string

// InterfaceName is a Linux network interface name.
// +kubebuilder:validation:XValidation:rule="self.matches('^[A-Za-z0-9_][-A-Za-z0-9_.]{0,14}$')",message="must be a Linux interface name: 1 to 15 letters, digits, '_', '-' or '.', not starting with '-' or '.'"
// +kubebuilder:validation:MaxLength=15
type InterfaceName string

// MACAddress is a 48-bit hardware address written as six colon-separated hex pairs.
// +kubebuilder:validation:MaxLength=17
// +kubebuilder:validation:XValidation:rule="self.matches('^[0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){5}$')",message="must be a MAC address of six colon-separated hex pairs, such as 52:54:00:12:34:56"
type MACAddress string

// SecretReference names a Secret in the liken-system namespace, the one namespace whose
// Secrets machines may read.
type SecretReference struct {
	// Name of the Secret in namespace liken-system.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')",message="must be a Secret name: lowercase letters, digits, '-' and '.'"
	Name string `json:"name"`
}

// SecretNamespace is the namespace of every Secret a Cluster or Machine refers to.
const SecretNamespace = "liken-system"
