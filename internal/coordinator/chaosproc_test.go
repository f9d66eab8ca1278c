package coordinator

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/retry"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/atomicfile"
	"liken.dev/liken/internal/kube"
)

// The chaos test's coordinators and agents are this test binary run again in a helper
// mode, so that a kill is a real SIGKILL: no deferred call, no Lease released, a state file
// half-written if it was written in place. The mode is chosen here, in init, because
// TestMain would start a control plane of its own first.
const (
	chaosHelperEnv     = "LIKEN_CHAOS_HELPER" // "coordinator" or "agent"
	chaosKubeconfigEnv = "LIKEN_CHAOS_KUBECONFIG"
	chaosNameEnv       = "LIKEN_CHAOS_NAME"
	chaosStateEnv      = "LIKEN_CHAOS_STATE"   // the agent's state directory
	chaosDownForEnv    = "LIKEN_CHAOS_DOWN_MS" // how long the agent's machine stays down
)

// Reasons on the Node's Ready condition, so the test's watch tells a reboot from an
// outage it made itself.
const (
	reasonReboot    = "ChaosReboot"
	reasonUnrelated = "ChaosUnrelated"
	reasonBack      = "ChaosBack"
)

func init() {
	mode := os.Getenv(chaosHelperEnv)
	if mode == "" {
		return
	}
	var err error
	switch mode {
	case "coordinator":
		err = chaosCoordinatorMain()
	case "agent":
		err = chaosAgentMain()
	default:
		err = fmt.Errorf("unknown helper mode %q", mode)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "chaos %s %s: %v\n", mode, os.Getenv(chaosNameEnv), err)
		os.Exit(1)
	}
	os.Exit(0)
}

func chaosCoordinatorMain() error {
	cfg, err := clientcmd.BuildConfigFromFlags("", os.Getenv(chaosKubeconfigEnv))
	if err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = -1, -1
	// A one-second Lease: a killed leader's Lease expires soon, as it would after a crash,
	// and the runs stay short.
	c, err := New(Config{Machine: os.Getenv(chaosNameEnv), REST: cfg, LeaseDuration: time.Second, RenewDeadline: 700 * time.Millisecond,
		RetryPeriod: 100 * time.Millisecond, Resync: 100 * time.Millisecond, EvictRetry: 100 * time.Millisecond})
	if err != nil {
		return err
	}
	c.Run(context.Background()) // until killed
	return nil
}

// procAgent is a chaos agent in its own process: what it must remember across a kill
// (the sets it rebooted for) is in a state file, written before it acts on it.
type procAgent struct {
	name    string
	admin   kubernetes.Interface
	liken   *kube.Client
	state   string
	downFor time.Duration
	done    map[string]string
}

func chaosAgentMain() error {
	cfg, err := clientcmd.BuildConfigFromFlags("", os.Getenv(chaosKubeconfigEnv))
	if err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = -1, -1
	ms, err := strconv.Atoi(os.Getenv(chaosDownForEnv))
	if err != nil {
		return err
	}
	a := &procAgent{name: os.Getenv(chaosNameEnv), admin: kubernetes.NewForConfigOrDie(cfg), state: os.Getenv(chaosStateEnv),
		downFor: time.Duration(ms) * time.Millisecond, done: map[string]string{}}
	if a.liken, err = kube.NewClient(cfg); err != nil {
		return err
	}
	b, err := os.ReadFile(filepath.Join(a.state, "done.json"))
	if err == nil {
		if err := json.Unmarshal(b, &a.done); err != nil {
			return fmt.Errorf("the state file is damaged: %w", err)
		}
	} else if !os.IsNotExist(err) {
		return err
	}
	for {
		if err := a.step(context.Background()); err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", a.name, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// acting marks a step in progress in a file the test reads when it kills the agent, to
// count the kills that fell mid-step; a kill leaves the marker, which the test removes.
func (a *procAgent) acting(on bool) {
	p := filepath.Join(a.state, "acting")
	if on {
		_ = os.WriteFile(p, nil, 0o644)
	} else {
		_ = os.Remove(p)
	}
}

// save writes the state file as a real agent does (atomicfile.Write: a temporary file,
// synced, renamed over the old one, the directory synced): a kill at any point leaves the
// old or the new.
func (a *procAgent) save() error {
	b, err := json.Marshal(a.done)
	if err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(a.state, "done.json"), b, 0o644)
}

// step is one look at the API and at most one action, as an agent's reconcile pass. The
// state file says, for each pending set, "intent" (it will reboot for it: written before
// the status says Rebooting) or "down" (it went down for it: as a real agent learns from a
// new boot ID), so a kill between any two writes neither skips the reboot nor repeats it.
func (a *procAgent) step(ctx context.Context) error {
	m, err := a.liken.Machine(ctx, a.name)
	if err != nil {
		return nil
	}
	cl, err := a.liken.Cluster(ctx)
	if err != nil {
		return nil
	}
	n, err := a.admin.CoreV1().Nodes().Get(ctx, a.name, metav1.GetOptions{})
	if err != nil {
		return nil
	}
	ready, reason := nodeReady(n)
	var turn *v1alpha1.Turn
	for i := range cl.Status.Turns {
		if cl.Status.Turns[i].Machine == a.name {
			turn = &cl.Status.Turns[i]
		}
	}
	st, hash := m.Status.Reboot.State, m.Status.PendingHash
	rec := a.done[hash]
	defer a.acting(false)
	switch {
	case st == v1alpha1.RebootRebooting && !ready && reason == reasonReboot:
		// Down for the reboot (killed while down, or not): it comes back, then the status
		// says the set is done.
		a.acting(true)
		if rec != "down" {
			if err := a.record(hash, "down"); err != nil {
				return err
			}
		}
		time.Sleep(a.downFor)
		return a.setReady(true, reasonBack)
	case st == v1alpha1.RebootRebooting && !ready:
		// Cut off by the test's unrelated outage: it goes down only once that ends.
	case st == v1alpha1.RebootRebooting && rec == "down":
		a.acting(true)
		return a.writeStatus(ctx, func(s *v1alpha1.MachineStatus) {
			s.Reboot.State, s.PendingHash, s.PendingCount = v1alpha1.RebootNone, "", 0
		})
	case st == v1alpha1.RebootRebooting && rec == "intent":
		// Said Rebooting, killed before going down: the intent was kept, go down now.
		a.acting(true)
		return a.goDown(hash)
	case st == v1alpha1.RebootRebooting:
		// The intent is written before the status: going down without it could reboot twice.
		return fmt.Errorf("rebooting for %s with no record of it", hash)
	case (turn == nil || turn.PendingHash != hash) && st == v1alpha1.RebootDraining && hash != "":
		// Its turn was taken back before it went down (it was given while the machine was
		// down, and the budget had no room for it once back): it waits again, as a real
		// agent's next pass says.
		a.acting(true)
		return a.writeStatus(ctx, func(s *v1alpha1.MachineStatus) { s.Reboot.State = v1alpha1.RebootWaitingForTurn })
	case turn == nil || turn.PendingHash != hash || hash == "":
	case turn.Phase == v1alpha1.TurnDraining && st == v1alpha1.RebootWaitingForTurn:
		a.acting(true)
		return a.writeStatus(ctx, func(s *v1alpha1.MachineStatus) { s.Reboot.State = v1alpha1.RebootDraining })
	case turn.Phase == v1alpha1.TurnDrained && (st == v1alpha1.RebootWaitingForTurn || st == v1alpha1.RebootDraining):
		a.acting(true)
		if rec == "" {
			if err := a.record(hash, "intent"); err != nil {
				return err
			}
		}
		if err := a.writeStatus(ctx, func(s *v1alpha1.MachineStatus) { s.Reboot.State = v1alpha1.RebootRebooting }); err != nil {
			return err
		}
		return a.goDown(hash)
	}
	return nil
}

func (a *procAgent) goDown(hash string) error {
	if err := a.setReady(false, reasonReboot); err != nil {
		return err
	}
	return a.record(hash, "down")
}

func (a *procAgent) record(hash, what string) error {
	a.done[hash] = what
	return a.save()
}

func (a *procAgent) writeStatus(ctx context.Context, change func(*v1alpha1.MachineStatus)) error {
	return retry.OnError(apiAway, func(error) bool { return true }, func() error {
		m, err := a.liken.Machine(ctx, a.name)
		if err != nil {
			return err
		}
		change(&m.Status)
		_, err = a.liken.UpdateMachineStatus(ctx, m)
		return err
	})
}

// setReady goes down for the reboot (NotReady, reason ChaosReboot) or comes back; coming
// back never ends an outage the test made (reason ChaosUnrelated), as a machine back from
// a reboot may still be cut off.
func (a *procAgent) setReady(ready bool, reason string) error {
	return setNodeReady(a.admin, a.name, ready, reason, func(_ bool, cur string) bool { return !ready || cur != reasonUnrelated })
}

// setNodeReady writes the Node's Ready condition with reason if ok accepts the current
// reason, in a write conditional on the Node's version.
func setNodeReady(c kubernetes.Interface, node string, ready bool, reason string, ok func(curReady bool, curReason string) bool) error {
	return retry.OnError(apiAway, func(error) bool { return true }, func() error {
		n, err := c.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if r, cur := nodeReady(n); !ok(r, cur) {
			return nil
		}
		st := corev1.ConditionTrue
		if !ready {
			st = corev1.ConditionFalse
		}
		cond := corev1.NodeCondition{Type: corev1.NodeReady, Status: st, Reason: reason, LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}
		if reason == reasonBack {
			// The kubelet of the boot after a reboot reports that boot's ID.
			n.Status.NodeInfo.BootID = newBootID()
		}
		i := slices.IndexFunc(n.Status.Conditions, func(c corev1.NodeCondition) bool { return c.Type == corev1.NodeReady })
		if i < 0 {
			n.Status.Conditions = append(n.Status.Conditions, cond)
		} else {
			n.Status.Conditions[i] = cond
		}
		_, err = c.CoreV1().Nodes().UpdateStatus(context.Background(), n, metav1.UpdateOptions{})
		return err
	})
}

func nodeReady(n *corev1.Node) (bool, string) {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue, c.Reason
		}
	}
	return false, ""
}

// helperProc is one helper process of the chaos test.
type helperProc struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// startHelper runs this test binary in a helper mode with env added; its output goes to
// log. It dies with the test process (Pdeathsig), so a failed run leaves none behind.
func startHelper(env []string, log *os.File) (*helperProc, error) {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &helperProc{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	return p, nil
}

// kill is a crash: SIGKILL, then the wait for it to be gone.
func (p *helperProc) kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

// exited says whether the process ended by itself (it must run until killed).
func (p *helperProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}
