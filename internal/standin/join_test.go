package standin

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"liken.dev/liken/internal/identity"
)

// TestServersJoinServers: three of the stand-in's control planes from one cluster's CAs form
// one etcd cluster as k3s's servers do: the first starts a cluster, the other two join it
// through its etcd as learners (one at a time: etcd allows one learner) and start their API
// servers once its leader has promoted them. Then every API server reads what another
// wrote; with one server stopped the other two still write and read (a quorum of two);
// started again on its data it is a member already (nothing added) and has what was written
// while it was down. etcd refuses a client without the layer's etcd client certificate.
// Last, the way back from a lost quorum: srv-1 restored from a snapshot, srv-2 rejoins it
// without its etcd data (as spec.etcdRejoin has init set it aside) as a new member, and both
// read what was written before the snapshot and not what was written after.
func TestServersJoinServers(t *testing.T) {
	idDir := t.TempDir()
	id, err := identity.LoadOrCreateIdentity(idDir)
	if err != nil {
		t.Fatal(err)
	}
	var cps []*ControlPlane
	var admins []*kubernetes.Clientset
	var stops []func()
	t0 := time.Now()
	for i := range 3 {
		cp := newControlPlane(t, id, idDir)
		cp.NodeName = fmt.Sprintf("srv-%d", i+1)
		if i > 0 {
			cp.Join, cp.JoinEtcdPort = fmt.Sprintf("https://127.0.0.1:%d", cps[0].Port), cps[0].EtcdPort
		}
		cps = append(cps, cp)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, cp := range cps {
				b, _ := os.ReadFile(filepath.Join(cp.DataDir, "server", "logs", "etcd.log"))
				t.Logf("%s's etcd log ends:\n%s", cp.NodeName, lastLines(string(b), 30))
			}
		}
	})
	// The first alone, then the two others at once.
	admin, stop := startedUntilStopped(t, cps[0])
	admins, stops = append(admins, kubernetes.NewForConfigOrDie(admin)), append(stops, stop)
	type result struct {
		i     int
		admin *kubernetes.Clientset
		stop  func()
	}
	results := make(chan result, 2)
	for i := 1; i < 3; i++ {
		go func() {
			a, stop := startedUntilStopped(t, cps[i])
			results <- result{i, kubernetes.NewForConfigOrDie(a), stop}
		}()
	}
	admins, stops = append(admins, nil, nil), append(stops, nil, nil)
	for range 2 {
		r := <-results
		admins[r.i], stops[r.i] = r.admin, r.stop
	}
	t.Logf("three servers ready in %s", time.Since(t0).Round(time.Millisecond))

	members, err := cps[0].etcd.members(t.Context(), cps[0].etcd.localURL())
	if err != nil {
		t.Fatal(err)
	}
	if len(members) != 3 {
		t.Fatalf("etcd has %d members; want 3: %+v", len(members), members)
	}
	for _, m := range members {
		if m.IsLearner || !strings.HasPrefix(m.Name, "srv-") || nodeOfMember(m.Name) == m.Name {
			t.Errorf("member %+v: want a voter named after its node and a suffix, as k3s names them", m)
		}
	}
	// The leader's check sees three healthy voters.
	var view etcdView
	for _, cp := range cps {
		v, err := cp.etcd.leaderCheck(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if v.leader {
			view = v
		}
	}
	if len(view.members) != 3 {
		t.Errorf("the leader's view: %+v; want three members", view)
	}
	for name, s := range view.members {
		if s.learner || s.health != nil {
			t.Errorf("the leader's view of %s: %+v; want a healthy voter", name, s)
		}
	}

	write := func(a *kubernetes.Clientset, name string) {
		t.Helper()
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}}
		if _, err := a.CoreV1().ConfigMaps("default").Create(t.Context(), cm, metav1.CreateOptions{}); err != nil {
			t.Fatalf("writing %s: %v", name, err)
		}
	}
	read := func(a *kubernetes.Clientset, name string) error {
		_, err := a.CoreV1().ConfigMaps("default").Get(t.Context(), name, metav1.GetOptions{})
		return err
	}
	write(admins[1], "from-srv-2")
	for i, a := range admins {
		if err := read(a, "from-srv-2"); err != nil {
			t.Errorf("srv-%d reads what srv-2 wrote: %v", i+1, err)
		}
	}

	// One server stopped: the two others are a quorum, writing once they have a leader (if
	// the stopped one led, after etcd's election timeout: 5 s, as k3s sets it).
	stops[0]()
	down := time.Now()
	for {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "while-srv-1-down", Namespace: "default"}}
		_, err := admins[2].CoreV1().ConfigMaps("default").Create(t.Context(), cm, metav1.CreateOptions{})
		if err == nil || apierrors.IsAlreadyExists(err) { // a write that timed out may have landed
			break
		}
		if time.Since(down) > time.Minute {
			t.Fatalf("with srv-1 down, srv-3 could not write for a minute: %v", err)
		}
		time.Sleep(time.Second)
	}
	t.Logf("with srv-1 down, the first write through srv-3 succeeded %s after it stopped", time.Since(down).Round(time.Millisecond))
	if err := read(admins[1], "while-srv-1-down"); err != nil {
		t.Errorf("with srv-1 down, srv-2 reads what srv-3 wrote: %v", err)
	}
	// Started again, its own data: a member already.
	name := cps[0].etcd.name
	again := newControlPlaneOn(t, cps[0])
	a, stopAgain := startedUntilStopped(t, again)
	if again.etcd.name != name {
		t.Errorf("srv-1's member is %s after a restart; want %s", again.etcd.name, name)
	}
	if err := read(kubernetes.NewForConfigOrDie(a), "while-srv-1-down"); err != nil {
		t.Errorf("srv-1, back, reads what was written while it was down: %v", err)
	}
	if members, err := again.etcd.members(t.Context(), again.etcd.localURL()); err != nil || len(members) != 3 {
		t.Errorf("after srv-1's restart etcd has members %+v (%v); want the same 3", members, err)
	}

	// etcd's client port takes only clients with the cluster's etcd client certificate.
	if resp, err := http.Get(cps[1].etcd.localURL() + "/health"); err == nil {
		resp.Body.Close()
		t.Errorf("etcd answered a client with no certificate: %s", resp.Status)
	}

	// The way back from a lost quorum (docs/reboots.md): srv-1 restored from its snapshot
	// by a cluster reset, then srv-2 rejoins it without its etcd data, as init sets it
	// aside for spec.etcdRejoin, and joins as a new member of the restored cluster.
	srv1 := again.etcd
	snap, err := SaveSnapshot(t.Context(), SnapshotOptions{EtcdURL: srv1.localURL(), TLSDir: srv1.tls,
		Dir: t.TempDir(), Name: "liken", Node: "srv-1", Now: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	write(admins[1], "after-the-snapshot")
	oldSrv2 := cps[1].etcd.name
	stops[1]()
	stops[2]()
	stopAgain()
	var log strings.Builder
	reset := ResetOptions{DataDir: again.DataDir, Node: "srv-1", PeerURL: srv1.peerURL(), RestorePath: snap.Path,
		Etcd: filepath.Join(again.Bin, "etcd"), Now: time.Now()}
	if err := ClusterReset(t.Context(), reset, &log); err != nil {
		t.Fatalf("restoring srv-1 from %s: %v\n%s", snap.Path, err, log.String())
	}
	restored, _ := startedUntilStopped(t, newControlPlaneOn(t, cps[0]))
	etcd2 := filepath.Join(cps[1].DataDir, "server", "db", "etcd")
	if err := os.Rename(etcd2, etcd2+"-old-rejoin"); err != nil {
		t.Fatal(err)
	}
	rejoinStart := time.Now()
	rejoined := newControlPlaneOn(t, cps[1])
	a2, _ := startedUntilStopped(t, rejoined)
	t.Logf("srv-2 rejoined the restored srv-1 in %s", time.Since(rejoinStart).Round(time.Millisecond))
	if rejoined.etcd.name == oldSrv2 || !strings.HasPrefix(rejoined.etcd.name, "srv-2-") {
		t.Errorf("srv-2 rejoined as member %s; want a new member of srv-2 (it was %s)", rejoined.etcd.name, oldSrv2)
	}
	members, err = rejoined.etcd.members(t.Context(), rejoined.etcd.localURL())
	if err != nil || len(members) != 2 {
		t.Fatalf("after the restore and srv-2's rejoin etcd has members %+v (%v); want srv-1's and srv-2's new one", members, err)
	}
	for _, m := range members {
		if m.IsLearner {
			t.Errorf("member %s is still a learner: srv-2 started its API server before it voted", m.Name)
		}
	}
	for _, c := range []*rest.Config{restored, a2} {
		a := kubernetes.NewForConfigOrDie(c)
		if err := read(a, "from-srv-2"); err != nil {
			t.Errorf("after the restore, %s does not read what was written before the snapshot: %v", c.Host, err)
		}
		if err := read(a, "after-the-snapshot"); !apierrors.IsNotFound(err) {
			t.Errorf("after the restore, %s reads what was written after the snapshot (%v); want it gone", c.Host, err)
		}
	}
}

// newControlPlaneOn is a control plane on cp's data directory and ports, for a restart.
func newControlPlaneOn(t *testing.T, cp *ControlPlane) *ControlPlane {
	c := *cp
	c.etcd = nil
	c.Log = &testLog{t}
	return &c
}

// startedUntilStopped runs cp as started does and returns a stop that returns once every
// component has exited (their ports free for a restart).
func startedUntilStopped(t *testing.T, cp *ControlPlane) (*rest.Config, func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	admin, _, finished, err := startControlPlane(ctx, cp)
	stop := func() { cancel(); <-finished }
	t.Cleanup(stop)
	if err != nil || admin == nil {
		t.Fatalf("%s stopped before it was ready: %v", cp.NodeName, err)
	}
	return admin, stop
}
