package event

import (
	"context"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"liken.dev/liken/test/apiserver"
)

var env *apiserver.Env

func TestMain(m *testing.M) { os.Exit(apiserver.Main(m, "event", apiserver.Options{}, &env)) }

const ns = "default"

func newRecorder(t *testing.T, cfg *rest.Config) *Recorder {
	t.Helper()
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return New(Config{Events: kc.CoreV1().Events(ns), Namespace: ns, Scheme: scheme.Scheme,
		Source: corev1.EventSource{Component: "event-test", Host: "h1"}})
}

// object is a ConfigMap the Events are about (any kind the scheme knows will do).
func object(name string) runtime.Object {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: types.UID("uid-" + name)}}
}

// events lists the Events about name, oldest first.
func events(t *testing.T, name string) []corev1.Event {
	t.Helper()
	kc := kubernetes.NewForConfigOrDie(env.Admin)
	list, err := kc.CoreV1().Events(ns).List(t.Context(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
	if err != nil {
		t.Fatal(err)
	}
	sort.Slice(list.Items, func(i, j int) bool { return list.Items[i].Name < list.Items[j].Name })
	return list.Items
}

func run(t *testing.T, r *Recorder) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

func TestFlushWaitsForEveryEventInOrder(t *testing.T) {
	r := newRecorder(t, env.Admin)
	run(t, r)
	obj := object("ordered")
	r.Event(obj, corev1.EventTypeNormal, "First", "one")
	r.Eventf(obj, corev1.EventTypeWarning, "Second", "two %d", 2)
	r.Event(obj, corev1.EventTypeNormal, "First", "one")
	if unsent := r.Flush(t.Context()); unsent != nil {
		t.Fatalf("Flush with a reachable API server left %+v", unsent)
	}
	// Nothing is listed late: Flush returned only after the API server had them all.
	got := events(t, "ordered")
	if len(got) != 2 {
		t.Fatalf("%d Events; want 2 (the repeat raises the first one's count)", len(got))
	}
	if got[0].Reason != "First" || got[0].Count != 2 || got[1].Reason != "Second" || got[1].Message != "two 2" || got[1].Type != corev1.EventTypeWarning {
		t.Errorf("Events %v %d, %v %q; want First×2 then Second %q", got[0].Reason, got[0].Count, got[1].Reason, got[1].Message, "two 2")
	}
	if got[0].Source.Host != "h1" || got[0].InvolvedObject.UID != "uid-ordered" {
		t.Errorf("source %+v, involved object %+v", got[0].Source, got[0].InvolvedObject)
	}
}

func TestUnreachableAPIServer(t *testing.T) {
	// Nothing listens on port 1: every send fails as when the API server is away.
	dead := rest.CopyConfig(env.Admin)
	dead.Host = "https://127.0.0.1:1"
	r := newRecorder(t, dead)
	run(t, r)
	obj := object("late")
	for _, reason := range []string{"A", "B", "Rebooting"} {
		r.Event(obj, corev1.EventTypeNormal, reason, "said "+reason)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	start := time.Now()
	unsent := r.Flush(ctx)
	cancel()
	if waited := time.Since(start); waited > 5*time.Second {
		t.Errorf("Flush waited %s past its deadline of 500ms", waited)
	}
	var reasons []string
	for _, e := range unsent {
		reasons = append(reasons, e.Reason)
	}
	if strings.Join(reasons, ",") != "A,B,Rebooting" {
		t.Fatalf("unsent %v; want A,B,Rebooting in the order recorded", reasons)
	}

	// The first of them did reach the API server, although its answer was lost: resending
	// must not make a second one.
	kc := kubernetes.NewForConfigOrDie(env.Admin)
	if _, err := kc.CoreV1().Events(ns).Create(t.Context(), &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: unsent[0].Name, Namespace: ns},
		InvolvedObject: unsent[0].Object, Reason: "A", Message: "said A", Type: corev1.EventTypeNormal,
		FirstTimestamp: unsent[0].At, LastTimestamp: unsent[0].At, Count: 1,
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The next start sends them, marked, before anything new.
	r2 := newRecorder(t, env.Admin)
	r2.Event(obj, corev1.EventTypeNormal, "New", "said after the start")
	r2.Resend(unsent, "late")
	run(t, r2)
	if left := r2.Flush(t.Context()); left != nil {
		t.Fatalf("resend left %+v", left)
	}
	got := events(t, "late")
	var said []string
	for _, e := range got {
		said = append(said, e.Reason+": "+e.Message)
	}
	want := "A: said A|B: said B (late)|Rebooting: said Rebooting (late)|New: said after the start"
	if strings.Join(said, "|") != want {
		t.Errorf("Events by name (the order recorded):\n got %s\nwant %s", strings.Join(said, "|"), want)
	}
	if !got[1].FirstTimestamp.Equal(&metav1.Time{Time: unsent[1].At.Truncate(time.Second)}) {
		t.Errorf("a late Event keeps the time it was said: %v, want %v", got[1].FirstTimestamp, unsent[1].At)
	}
}

// TestRefusedEvent: an Event refused as forbidden is tried again for RefusalGrace, because
// the refusal may be passing (an API server just started, RBAC applied after the machine
// started): one whose rights come within it arrives; one whose rights never come is dropped.
func TestRefusedEvent(t *testing.T) {
	defer func(g time.Duration) { RefusalGrace = g }(RefusalGrace)
	RefusalGrace = 4 * time.Second
	admin := kubernetes.NewForConfigOrDie(env.Admin)
	for _, tc := range []struct {
		user      string
		grantLate bool
		want      int
	}{{"nobody", false, 0}, {"late", true, 1}} {
		t.Run(tc.user, func(t *testing.T) {
			cfg, err := env.UserConfig(tc.user, "nogroup")
			if err != nil {
				t.Fatal(err)
			}
			r := newRecorder(t, cfg)
			run(t, r)
			start := time.Now()
			r.Event(object("refused-"+tc.user), corev1.EventTypeNormal, "Forbidden", "no rights yet")
			if tc.grantLate {
				time.Sleep(time.Second)
				role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "late-events", Namespace: ns},
					Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}}}}
				binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "late-events", Namespace: ns},
					RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "late-events"},
					Subjects: []rbacv1.Subject{{Kind: "User", Name: tc.user}}}
				if _, err := admin.RbacV1().Roles(ns).Create(t.Context(), role, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
				if _, err := admin.RbacV1().RoleBindings(ns).Create(t.Context(), binding, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			if unsent := r.Flush(ctx); unsent != nil {
				t.Fatalf("an Event refused past RefusalGrace is still queued: %+v", unsent)
			}
			if got := events(t, "refused-"+tc.user); len(got) != tc.want {
				t.Fatalf("%s recorded %d Events; want %d", tc.user, len(got), tc.want)
			}
			if took := time.Since(start); tc.want == 0 && took < RefusalGrace {
				t.Errorf("the refused Event was dropped after %s, before RefusalGrace (%s)", took, RefusalGrace)
			}
		})
	}
}
