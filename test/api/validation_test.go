package api

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"

	"liken.dev/liken/api/v1alpha1"
)

// TestExamplesAccepted creates every example through the real API server, and checks the
// offline validator accepts it too.
func TestExamplesAccepted(t *testing.T) {
	c := dyn(t)
	v := validator(t)
	for name, obj := range examples(t) {
		t.Run(name, func(t *testing.T) {
			if errs := v.Create(obj.DeepCopy()); len(errs) > 0 {
				t.Errorf("offline validator refuses %s: %v", name, errs.ToAggregate())
			}
			stored := createFresh(t, c, obj, obj.GetName())
			if stored.GetGeneration() != 1 {
				t.Errorf("stored %s has generation %d, want 1", name, stored.GetGeneration())
			}
		})
	}
}

type invalidCase struct {
	name   string
	base   string // example to start from
	mutate func(t *testing.T, u *unstructured.Unstructured)
	want   string // part of the message a person reads
}

func setTo(path string, value any) func(*testing.T, *unstructured.Unstructured) {
	return func(t *testing.T, u *unstructured.Unstructured) { set(t, u, value, path) }
}

var invalidCases = []invalidCase{
	// Cluster
	{"digest not hex", "cluster", setTo("spec.releases", map[string]any{"2026.07.20-001": "sha256:XYZ"}), "must be a release digest: 'sha256:' followed by 64 lowercase hexadecimal digits"},
	{"digest without algorithm", "cluster", setTo("spec.releases", map[string]any{"2026.07.20-001": strings.Repeat("ab", 32)}), "must be a release digest"},
	{"version not pinned", "cluster", setTo("spec.version", "2026.09.01-001"), "spec.version 2026.09.01-001 is not pinned: add it with its digest to spec.releases first"},
	{"version malformed", "cluster", setTo("spec.version", "latest"), "must be a release version such as 2026.07.20-001"},
	{"a signed root and unsigned too", "cluster", setTo("spec.insecureUnsignedChannel", true), "give one, not both"},
	{"channel root not a digest", "cluster", setTo("spec.channelRoot", "sha256:XYZ"), "must be a release digest"},
	{"release key malformed", "cluster", setTo("spec.releases", map[string]any{"v1.2": "sha256:" + strings.Repeat("ab", 32)}), "release versions (the keys of spec.releases) must look like 2026.07.20-001"},
	{"no releases", "cluster", setTo("spec.releases", map[string]any{}), "spec.releases: Invalid value"},
	{"budget zero", "cluster", setTo("spec.disruptionBudget.maxUnavailable", 0), "maxUnavailable must be a count of at least 1 or a percentage from 1% to 100%"},
	{"budget 150%", "cluster", setTo("spec.disruptionBudget.maxUnavailable", "150%"), "maxUnavailable must be a count of at least 1 or a percentage from 1% to 100%"},
	{"budget 0%", "cluster", setTo("spec.disruptionBudget.maxUnavailable", "0%"), "maxUnavailable must be a count of at least 1"},
	{"budget words", "cluster", setTo("spec.disruptionBudget.maxUnavailable", "two"), "maxUnavailable must be a count of at least 1"},
	{"sysctl key with spaces", "cluster", setTo("spec.sysctls", map[string]any{"net.ipv4.ip forward": "1"}), "sysctl names must be dotted kernel parameter names"},
	{"sysctl empty value", "cluster", setTo("spec.sysctls", map[string]any{"vm.swappiness": ""}), "sysctl values must be non-empty single lines"},
	{"second cluster name", "cluster", func(t *testing.T, u *unstructured.Unstructured) { u.SetName("production") }, "a liken cluster has exactly one Cluster and it must be named 'liken'"},
	{"time server as a URL", "cluster", setTo("spec.timeServers", []string{"ntp://time.example.com"}), "timeServers must be host names or addresses, each with an optional :port"},
	{"time server with a space", "cluster", setTo("spec.timeServers", []string{"time.example.com 123"}), "timeServers must be host names or addresses"},
	{"channel scheme", "cluster", setTo("spec.channel", "ftp://releases.example.com"), "channel must be an http://, https:// or file:// URL"},
	{"channel CA not PEM", "cluster", setTo("spec.channelCA", "MIIBszCCAVmgAwIBAgIU"), "channelCA must hold PEM certificates"},
	{"kernel arg with space", "cluster", setTo("spec.kernelArgs", []string{"console=ttyS0 quiet"}), "must be one kernel argument without spaces or quotes"},
	{"kernel arg of liken's own", "cluster", setTo("spec.kernelArgs", []string{"liken.trial.deadline=99999"}), "liken.* kernel arguments are liken's own"},
	{"kernel arg naming the slot", "server-1", setTo("spec.kernelArgs", []string{"quiet", "liken.slot=B"}), "liken.* kernel arguments are liken's own"},
	{"drain timeout too short", "cluster", setTo("spec.drain.timeout", "1s"), "drain timeout must be a duration from 10s to 24h"},
	{"reboot policy unknown", "cluster", setTo("spec.rebootPolicy", "Sometimes"), `Unsupported value: "Sometimes"`},
	{"flannel backend unknown", "cluster", setTo("spec.features.flannelBackend", "ipsec"), `Unsupported value: "ipsec"`},
	{"cluster DNS outside service CIDR", "cluster", setTo("spec.network.clusterDNS", "10.44.0.10"), "network.clusterDNS must be an address inside network.serviceCIDR"},
	{"overlapping CIDRs", "cluster", setTo("spec.network.serviceCIDR", "10.42.128.0/17"), "network.clusterCIDR and network.serviceCIDR must not overlap"},
	{"CIDR with host bits", "cluster", setTo("spec.network.clusterCIDR", "10.42.0.1/16"), "network.clusterCIDR must be a network in CIDR notation"},
	{"duplicate registry mirror", "cluster", setTo("spec.registries.mirrors", []any{
		map[string]any{"registry": "docker.io", "endpoints": []string{"https://a.example.com"}},
		map[string]any{"registry": "docker.io", "endpoints": []string{"https://b.example.com"}},
	}), `spec.registries.mirrors[1]: Duplicate value: {"registry":"docker.io"}`},
	{"mirror endpoint not a URL", "cluster", setTo("spec.registries.mirrors", []any{
		map[string]any{"registry": "docker.io", "endpoints": []string{"mirror.example.com"}},
	}), "mirror endpoints must be http:// or https:// URLs"},
	{"unknown field", "cluster", setTo("spec.maxSurge", 2), `unknown field "spec.maxSurge"`},

	// Machine
	{"role unknown", "server-1", setTo("spec.role", "worker"), `Unsupported value: "worker"`},
	{"etcd restore on an agent", "agent-1", setTo("spec.etcdRestore", map[string]any{"snapshot": "liken-agent-1-1796700000"}), "spec.etcdRestore is for servers"},
	{"etcd restore of a path", "server-1", setTo("spec.etcdRestore", map[string]any{"snapshot": "../../etc/shadow"}), "snapshot is a file name in k3s's snapshot directory"},
	{"etcd rejoin on an agent", "agent-1", setTo("spec.etcdRejoin", map[string]any{"request": "1"}), "spec.etcdRejoin is for servers"},
	{"etcd rejoin without a request", "server-1", setTo("spec.etcdRejoin", map[string]any{}), "spec.etcdRejoin.request: Required value"},
	{"etcd rejoin and restore at once", "server-1", func(t *testing.T, u *unstructured.Unstructured) {
		setTo("spec.etcdRejoin", map[string]any{"request": "1"})(t, u)
		setTo("spec.etcdRestore", map[string]any{"snapshot": "liken-server-1-1796700000"})(t, u)
	}, "spec.etcdRejoin and spec.etcdRestore exclude each other"},
	{"role missing", "server-1", func(t *testing.T, u *unstructured.Unstructured) { remove(u, "spec.role") }, "spec.role: Required value"},
	{"MAC malformed", "server-1", setTo("spec.match.macs", []string{"52:54:00:00:00"}), "must be a MAC address of six colon-separated hex pairs"},
	{"MAC duplicated", "server-1", setTo("spec.match.macs", []string{"52:54:00:00:00:01", "52:54:00:00:00:01"}), `Duplicate value: "52:54:00:00:00:01"`},
	{"match empty", "server-1", setTo("spec.match", map[string]any{}), "match needs at least one MAC address or a serial number"},
	{"duplicate interface", "server-1", setTo("spec.network.interfaces", []any{
		map[string]any{"name": "eth0", "dhcp": true}, map[string]any{"name": "eth0", "mtu": 9000},
	}), `spec.network.interfaces[1]: Duplicate value: {"name":"eth0"}`},
	{"interface name too long", "server-1", setTo("spec.network.interfaces", []any{map[string]any{"name": "enp0s31f6-uplink0", "dhcp": true}}), "spec.network.interfaces[0].name: Too long: may not be more than 15 bytes"},
	{"interface name with slash", "server-1", setTo("spec.network.interfaces", []any{map[string]any{"name": "eth/0", "dhcp": true}}), "must be a Linux interface name"},
	{"VLAN on unknown link", "server-1", setTo("spec.network.interfaces", []any{map[string]any{"name": "vlan20", "vlan": map[string]any{"id": 20, "link": "eth9"}}}), "a VLAN's link must be one of the interfaces listed in network.interfaces"},
	{"VLAN ID out of range", "server-1", setTo("spec.network.interfaces", []any{
		map[string]any{"name": "eth0"}, map[string]any{"name": "vlan5000", "vlan": map[string]any{"id": 5000, "link": "eth0"}},
	}), "should be less than or equal to 4094"},
	{"bond and VLAN at once", "server-1", setTo("spec.network.interfaces", []any{
		map[string]any{"name": "eth0"},
		map[string]any{"name": "x0", "vlan": map[string]any{"id": 2, "link": "eth0"}, "bond": map[string]any{"mode": "active-backup", "interfaces": []string{"eth0"}}},
	}), "an interface is a bond or a VLAN, not both"},
	{"bond member unknown", "server-1", setTo("spec.network.interfaces", []any{
		map[string]any{"name": "bond0", "bond": map[string]any{"mode": "active-backup", "interfaces": []string{"eth7"}}},
	}), "a bond's member interfaces must be listed in network.interfaces"},
	{"address not CIDR", "server-1", setTo("spec.network.interfaces", []any{map[string]any{"name": "eth0", "addresses": []string{"10.0.0.300/24"}}}), "addresses must be an IP address with a prefix length"},
	{"nodeIP not an address", "server-1", setTo("spec.network.nodeIP", "node-1"), "nodeIP must be an IP address"},
	{"nodeIP not the machine's", "server-1", func(t *testing.T, u *unstructured.Unstructured) {
		setTo("spec.network.interfaces", []any{map[string]any{"name": "eth0", "addresses": []string{"192.168.10.11/24"}}})(t, u)
		setTo("spec.network.nodeIP", "192.168.10.1")(t, u)
	}, "nodeIP must be one of the interfaces' static addresses"},
	{"route gateway not IP", "server-1", setTo("spec.network.routes", []any{map[string]any{"to": "0.0.0.0/0", "via": "gateway"}}), "route gateway must be an IP address"},
	{"install disk not under /dev", "server-1", setTo("spec.install.disk", "sda"), "must be a block device path under /dev/"},
	{"install disk with ..", "server-1", setTo("spec.install.disk", "/dev/../etc/passwd"), "must be a block device path under /dev/"},
	{"install disk also in disks", "server-1", setTo("spec.disks", []any{map[string]any{"device": "/dev/vda", "partitions": []any{map[string]any{"label": "data"}}}}), "spec.disks must not list the install disk"},
	{"mount point outside /var", "server-1", setTo("spec.disks", []any{map[string]any{"device": "/dev/vdb", "partitions": []any{map[string]any{"label": "data", "mountPoint": "/etc"}}}}), "mountPoint must be an absolute path under /var/"},
	{"partition without size not last", "server-1", setTo("spec.disks", []any{map[string]any{"device": "/dev/vdb", "partitions": []any{
		map[string]any{"label": "a"}, map[string]any{"label": "b", "size": "10Gi"},
	}}}), "only the last partition may omit its size"},
	{"swap with mount point", "server-1", setTo("spec.disks", []any{map[string]any{"device": "/dev/vdb", "partitions": []any{map[string]any{"label": "swap", "filesystem": "swap", "mountPoint": "/var/swap"}}}}), "a swap or unformatted partition has no mountPoint"},
	{"label key with space", "server-1", setTo("spec.nodeLabels", map[string]any{"my label": "x"}), "node label keys must be a name of at most 63"},
	{"label value too long", "server-1", setTo("spec.nodeLabels", map[string]any{"rack": strings.Repeat("a", 64)}), "spec.nodeLabels.rack: Too long: may not be more than 63 bytes"},
	{"label value malformed", "server-1", setTo("spec.nodeLabels", map[string]any{"rack": "-a-"}), "node label values must be at most 63 letters"},
	{"taint without effect", "server-1", setTo("spec.nodeTaints", []any{map[string]any{"key": "dedicated", "value": "db"}}), "spec.nodeTaints[0].effect: Required value"},
	{"taint effect unknown", "server-1", setTo("spec.nodeTaints", []any{map[string]any{"key": "dedicated", "effect": "NoRun"}}), `Unsupported value: "NoRun"`},
	{"taint key malformed", "server-1", setTo("spec.nodeTaints", []any{map[string]any{"key": "-bad", "effect": "NoSchedule"}}), "taint keys must be a name of at most 63"},
	{"kernel module name", "server-1", setTo("spec.kernelModules", []any{map[string]any{"name": "bad module"}}), "kernel module names are letters, digits, '_' and '-'"},
	{"machine version malformed", "server-1", setTo("spec.version", "next"), "must be a release version such as 2026.07.20-001"},
	{"retry digest malformed", "server-1", setTo("spec.retryFailedDigest", "sha256:1234"), "must be a release digest"},
	{"approval hash malformed", "server-1", setTo("spec.reboot.approval.pendingHash", "yes"), "approval.pendingHash must be a status.pendingHash"},
	{"machine name not a hostname", "server-1", func(t *testing.T, u *unstructured.Unstructured) { u.SetName("rack1.server-1") }, "a Machine's name becomes its hostname and node name"},
}

// TestInvalidObjectsRejected sends each invalid object to the real API server, expects the
// message a person needs, checks that nothing was stored, and checks that the offline
// validator refuses it with the same message.
func TestInvalidObjectsRejected(t *testing.T) {
	if len(invalidCases) < 25 {
		t.Fatalf("only %d invalid cases; the issue asks for at least 25", len(invalidCases))
	}
	c := dyn(t)
	v := validator(t)
	ex := examples(t)
	for i, tc := range invalidCases {
		t.Run(tc.name, func(t *testing.T) {
			obj := ex[tc.base].DeepCopy()
			if obj.GetKind() == "Machine" {
				obj.SetName(fmt.Sprintf("invalid-%d", i))
			}
			tc.mutate(t, obj)
			res := c.Resource(gvrOf(obj))
			before, _ := res.Get(ctx(t), obj.GetName(), metav1.GetOptions{})

			_, err := res.Create(ctx(t), obj.DeepCopy(), metav1.CreateOptions{FieldValidation: "Strict"})
			if err == nil {
				t.Fatalf("API server accepted the object; want an error containing %q", tc.want)
			}
			if !apierrors.IsInvalid(err) && !apierrors.IsBadRequest(err) {
				t.Errorf("API server error is %v, want Invalid or BadRequest", apierrors.ReasonForError(err))
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("API server said:\n  %v\nwant it to contain:\n  %s", err, tc.want)
			}
			after, getErr := res.Get(ctx(t), obj.GetName(), metav1.GetOptions{})
			switch {
			case before == nil && getErr == nil:
				t.Errorf("the invalid object was stored")
			case before != nil && (after == nil || after.GetResourceVersion() != before.GetResourceVersion()):
				t.Errorf("the stored object changed")
			}

			errs := v.Create(obj.DeepCopy())
			if len(errs) == 0 {
				t.Fatalf("offline validator accepted the object the API server refused")
			}
			if agg := errs.ToAggregate().Error(); !strings.Contains(agg, tc.want) {
				t.Errorf("offline validator said:\n  %s\nwant it to contain:\n  %s", agg, tc.want)
			}
		})
	}
}

// immutableChanges has, for every Immutable field in the class table, a change the API must
// refuse; a new Immutable field without an entry here fails the test.
var immutableChanges = map[string][]invalidCase{
	"machine.spec.role": {{"server to agent", "server-1", setTo("spec.role", "agent"), "spec.role is immutable: reinstall the machine to change its role"}},
	"machine.spec.install": {
		{"other disk", "server-1", setTo("spec.install.disk", "/dev/vdb"), "spec.install is immutable"},
		{"removed", "server-1", func(t *testing.T, u *unstructured.Unstructured) { remove(u, "spec.install") }, "spec.install is immutable"},
	},
	"cluster.spec.network": {
		{"service CIDR", "cluster", setTo("spec.network.serviceCIDR", "10.96.0.0/16"), "spec.network is immutable"},
		{"cluster DNS", "cluster", setTo("spec.network.clusterDNS", "10.43.0.53"), "spec.network is immutable"},
	},
	"cluster.spec.features.serviceLB":         {{"off", "cluster", setTo("spec.features.serviceLB", false), "features.serviceLB is immutable"}},
	"cluster.spec.features.networkPolicy":     {{"off", "cluster", setTo("spec.features.networkPolicy", false), "features.networkPolicy is immutable"}},
	"cluster.spec.features.embeddedRegistry":  {{"on", "cluster", setTo("spec.features.embeddedRegistry", true), "features.embeddedRegistry is immutable"}},
	"cluster.spec.features.secretsEncryption": {{"on", "cluster", setTo("spec.features.secretsEncryption", true), "features.secretsEncryption is immutable"}},
	"cluster.spec.features.flannelBackend":    {{"host-gw", "cluster", setTo("spec.features.flannelBackend", "host-gw"), "features.flannelBackend is immutable"}},
}

// TestImmutableFieldsRefused creates a valid object, then tries each change to an Immutable
// field through the real API server and the offline validator.
func TestImmutableFieldsRefused(t *testing.T) {
	c := dyn(t)
	v := validator(t)
	ex := examples(t)
	for _, fc := range v1alpha1.FieldClasses {
		if fc.Class != v1alpha1.Immutable {
			continue
		}
		cases := immutableChanges[fc.Path]
		if len(cases) == 0 {
			t.Errorf("%s is Immutable but the test has no change to try on it: add one to immutableChanges", fc.Path)
		}
		for i, tc := range cases {
			t.Run(fc.Path+"/"+tc.name, func(t *testing.T) {
				stored := createFresh(t, c, ex[tc.base], fmt.Sprintf("immutable-%d-%d", len(fc.Path), i))
				changed := stored.DeepCopy()
				tc.mutate(t, changed)
				_, err := c.Resource(gvrOf(stored)).Update(ctx(t), changed, metav1.UpdateOptions{FieldValidation: "Strict"})
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("API server answered the change with %v; want an error containing %q", err, tc.want)
				}
				errs := v.Update(changed.DeepCopy(), stored.DeepCopy())
				if agg := errs.ToAggregate(); agg == nil || !strings.Contains(agg.Error(), tc.want) {
					t.Errorf("offline validator answered the change with %v; want an error containing %q", agg, tc.want)
				}
				// A change to a mutable field of the same object is accepted, so the refusal
				// above is about the immutable field, not the object.
				ok := stored.DeepCopy()
				if ok.GetKind() == "Cluster" {
					set(t, ok, "Auto", "spec.rebootPolicy")
				} else {
					set(t, ok, map[string]any{"changed": "yes"}, "spec.nodeLabels")
				}
				if _, err := c.Resource(gvrOf(ok)).Update(ctx(t), ok, metav1.UpdateOptions{FieldValidation: "Strict"}); err != nil {
					t.Errorf("a mutable change to the same object was refused: %v", err)
				}
			})
		}
	}
}

// createFresh stores a copy of obj (Machines under name; the Cluster is always "liken"),
// replacing any earlier one, and returns what the server stored.
func createFresh(t *testing.T, c interface {
	Resource(schema.GroupVersionResource) dynamic.NamespaceableResourceInterface
}, obj *unstructured.Unstructured, name string) *unstructured.Unstructured {
	t.Helper()
	o := obj.DeepCopy()
	if o.GetKind() == "Machine" {
		o.SetName(name)
	}
	res := c.Resource(gvrOf(o))
	_ = res.Delete(ctx(t), o.GetName(), metav1.DeleteOptions{})
	var stored *unstructured.Unstructured
	err := wait.PollUntilContextTimeout(ctx(t), 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		s, err := res.Create(ctx(t), o.DeepCopy(), metav1.CreateOptions{FieldValidation: "Strict"})
		if apierrors.IsAlreadyExists(err) {
			return false, nil // the delete above is still in flight
		}
		stored = s
		return err == nil, err
	})
	if err != nil {
		t.Fatalf("creating %s: %v", o.GetName(), err)
	}
	return stored
}

// TestTimeServersAccepted: the forms of an NTP server the field documents are accepted, by
// the API server and the offline validator.
func TestTimeServersAccepted(t *testing.T) {
	c := dyn(t)
	v := validator(t)
	obj := examples(t)["cluster"].DeepCopy()
	set(t, obj, []string{"time.example.com", "192.0.2.1", "10.0.2.2:12345", "[2001:db8::1]:123", "ntp1"}, "spec.timeServers")
	if errs := v.Create(obj.DeepCopy()); len(errs) > 0 {
		t.Errorf("offline validator refuses: %v", errs.ToAggregate())
	}
	createFresh(t, c, obj, obj.GetName())
}
