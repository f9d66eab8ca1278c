package agent

import (
	"encoding/pem"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/authority"
	"liken.dev/liken/internal/tuf"
)

// TestReleaseMustBeSigned (issue 31): with the Cluster naming its channel's root
// (spec.channelRoot), a machine refuses a release that is pinned but was never signed
// before any byte of it is downloaded (a ReleaseNotSigned Event and the upgrade's message
// name the failed check; the machine keeps running what it has), and writes a release the
// channel signed, against a real API server and a channel served over real HTTP.
func TestReleaseMustBeSigned(t *testing.T) {
	const v1, v2, v3 = "2026.11.01-001", "2026.11.02-001", "2026.11.03-001"
	ch := newTestChannel(t, v1, v2, v3)
	repo := &tuf.Repo{Channel: ch.dir, Expiry: tuf.DefaultExpiry}
	keyDir := t.TempDir()
	root, err := repo.Init(tuf.InitOptions{KeyDir: keyDir})
	if err != nil {
		t.Fatal(err)
	}
	keys, err := tuf.LoadKeys(keyDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{v1, v2} { // v3 is in the channel, never signed
		if err := repo.SignRelease(keys, filepath.Join(ch.dir, v)); err != nil {
			t.Fatal(err)
		}
	}
	f := setup(t, map[string]v1alpha1.Role{"sg1": v1alpha1.RoleServer})
	f.useChannel(t, ch, v1)
	f.editCluster(func(c *v1alpha1.Cluster) {
		c.Spec.ChannelRoot, c.Spec.InsecureUnsignedChannel = v1alpha1.Digest(root), false
	})

	s, boot, _ := installedWith(t, "sg1", ch, v1)
	s.boot(t, f)
	s.start(t)
	defer s.stop()
	f.waitFor(t, "sg1", "v1 running from slot A", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		return m.Status.Release != nil && m.Status.Release.Version == v1 && m.Status.Upgrade.State == v1alpha1.UpgradeIdle
	})

	f.editCluster(func(c *v1alpha1.Cluster) { c.Spec.Version = v3 })
	f.waitFor(t, "sg1", "v3 refused: not signed", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		return strings.Contains(m.Status.Upgrade.Message, "release "+v3+" is not written") &&
			strings.Contains(m.Status.Upgrade.Message, "failed the target check")
	})
	if n := ch.gets[v3].Load(); n != 0 {
		t.Errorf("v3's slot image was fetched %d times; want none", n)
	}
	if rec := boot.get().Slots["B"]; rec.State != "" {
		t.Errorf("slot B was recorded %+v for a release refused before its download", rec)
	}
	if m, _ := f.liken.Machine(t.Context(), "sg1"); m.Status.Release == nil || m.Status.Release.Version != v1 {
		t.Errorf("the machine does not say it still runs v1: %+v", m.Status.Release)
	}
	f.waitFor(t, "sg1", "Degraded with ReleaseNotSigned, saying it keeps running v1", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		c := meta.FindStatusCondition(m.Status.Conditions, v1alpha1.MachineDegraded)
		return c != nil && c.Status == metav1.ConditionTrue && c.Reason == v1alpha1.ReasonReleaseNotSigned &&
			strings.Contains(c.Message, "release "+v3+" is not written") && strings.Contains(c.Message, "keeps running what it runs")
	})
	waitCount(t, "a ReleaseNotSigned Event", func() bool {
		evs, err := f.admin.CoreV1().Events(authority.EventNamespace).List(t.Context(), metav1.ListOptions{FieldSelector: "involvedObject.name=sg1,reason=" + v1alpha1.ReasonReleaseNotSigned})
		return err == nil && len(evs.Items) > 0
	})

	// A release the channel signed is written, as before.
	f.editCluster(func(c *v1alpha1.Cluster) { c.Spec.Version = v2 })
	f.waitFor(t, "sg1", "v2 staged in slot B", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		return m.Status.Upgrade.State == v1alpha1.UpgradeStaged && m.Status.Upgrade.TargetSlot == "B"
	})
	if rec := boot.get().Slots["B"]; !rec.Holds(ch.pins[v2]) {
		t.Fatalf("slot B's record: %+v", rec)
	}
	// v3's refusal is no longer what the machine is asked for: Degraded says nothing of it.
	f.waitFor(t, "sg1", "Degraded no longer ReleaseNotSigned", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		c := meta.FindStatusCondition(m.Status.Conditions, v1alpha1.MachineDegraded)
		return c != nil && c.Reason != v1alpha1.ReasonReleaseNotSigned
	})
}

// TestChannelTrusted: a release is written from a channel whose root the Cluster names, or,
// by the operator's explicit choice, unverified; from neither, never.
func TestChannelTrusted(t *testing.T) {
	for _, c := range []struct {
		root     string
		unsigned bool
		ok       bool
	}{
		{"sha256:" + strings.Repeat("a", 64), false, true},
		{"", true, true},
		{"", false, false},
	} {
		err := channelTrusted(c.root, c.unsigned)
		if (err == nil) != c.ok || err != nil && !strings.Contains(err.Error(), "names no channel root") {
			t.Errorf("root %q, unsigned %v: %v", c.root, c.unsigned, err)
		}
	}
}

// TestChannelWithAPrivateCA: a channel served over https with a CA of its own. Without the
// Cluster's spec.channelCA a machine writes nothing and says why (the server's certificate
// is signed by an unknown authority); once the CA is there, the release is written at once,
// not after the pause that follows a failure.
func TestChannelWithAPrivateCA(t *testing.T) {
	const v1, v2 = "2026.11.01-001", "2026.11.02-001"
	ch := serveTestChannel(t, httptest.NewTLSServer, v1, v2)
	ca := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ch.Certificate().Raw}))
	f := setup(t, map[string]v1alpha1.Role{"ca1": v1alpha1.RoleAgent})
	f.useChannel(t, ch, v1)
	s, boot, _ := installedWith(t, "ca1", ch, v1)
	s.boot(t, f)
	s.start(t)
	defer s.stop()
	f.waitFor(t, "ca1", "v1 running from slot A", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		return m.Status.Release != nil && m.Status.Release.Version == v1 && m.Status.Upgrade.State == v1alpha1.UpgradeIdle
	})
	f.editCluster(func(c *v1alpha1.Cluster) { c.Spec.Version = v2 })
	var retryAt time.Time
	f.waitFor(t, "ca1", "v2 not written: the channel's CA is unknown", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		msg := m.Status.Upgrade.Message
		_, after, ok := strings.Cut(msg, "retrying at ")
		if !ok || !strings.Contains(msg, "certificate signed by unknown authority") {
			return false
		}
		at, err := time.Parse(time.RFC3339, strings.TrimSuffix(strings.Fields(after)[0], ":"))
		retryAt = at
		return err == nil
	})
	if rec := boot.get().Slots["B"]; rec.Holds(ch.pins[v2]) {
		t.Fatalf("slot B holds v2 fetched from a server no CA vouched for: %+v", rec)
	}
	f.editCluster(func(c *v1alpha1.Cluster) { c.Spec.ChannelCA = ca })
	f.waitFor(t, "ca1", "v2 staged in slot B", func(m *v1alpha1.Machine, _ *corev1.Node) bool {
		return m.Status.Upgrade.State == v1alpha1.UpgradeStaged && m.Status.Upgrade.TargetSlot == "B"
	})
	// Whatever the machine's speed: staged before the retry the failure announced, so the
	// CA's edit, not the pause's end, started the write.
	if now := time.Now(); !now.Before(retryAt) {
		t.Errorf("v2 was staged at %s, not before the failure's retry at %s: the pause was kept", now.Format(time.RFC3339), retryAt.Format(time.RFC3339))
	}
	if rec := boot.get().Slots["B"]; !rec.Holds(ch.pins[v2]) {
		t.Fatalf("slot B's record: %+v", rec)
	}
}
