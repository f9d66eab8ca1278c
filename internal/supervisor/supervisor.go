// Package supervisor runs and restarts long-lived processes for liken's init, k3s first
// among them, and answers restart requests from the agent on a local socket.
//
// What "restart k3s in place, pods keep running" requires (k3s's own systemd unit uses
// KillMode=process): signal only the k3s process, never its process group or cgroup, so the
// containerd shims, which k3s starts in sessions of their own, survive and k3s reattaches to
// them when it comes back.
package supervisor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// Spec describes one supervised process.
type Spec struct {
	Name string
	Path string
	Args []string
	Env  []string
	// Stdout and Stderr receive the process's output (nil: discarded).
	Stdout, Stderr *os.File
	// RestartDelay is the pause before restarting a process that exited (k3s's unit: 5s).
	RestartDelay time.Duration
	// StopTimeout is how long a stop waits after SIGTERM before SIGKILL.
	StopTimeout time.Duration
}

// Process is a supervised process.
type Process struct {
	spec Spec
	log  *slog.Logger

	mu       sync.Mutex
	cmd      *exec.Cmd
	exited   chan struct{} // closed when cmd ends
	starts   int
	stopping bool // an intended stop: do not restart on exit
	wake     chan struct{}
}

// New makes a Process; Run starts it.
func New(spec Spec, log *slog.Logger) *Process {
	if spec.RestartDelay == 0 {
		spec.RestartDelay = 5 * time.Second
	}
	if spec.StopTimeout == 0 {
		spec.StopTimeout = 30 * time.Second
	}
	if log == nil {
		log = slog.Default()
	}
	return &Process{spec: spec, log: log.With("process", spec.Name), wake: make(chan struct{}, 1)}
}

// Run keeps the process running until ctx ends, restarting it RestartDelay after each exit
// it did not ask for, then stops it.
func (p *Process) Run(ctx context.Context) error {
	if err := p.start(); err != nil {
		p.log.Error("starting failed", "err", err)
	}
	for {
		p.mu.Lock()
		exited := p.exited
		p.mu.Unlock()
		select {
		case <-ctx.Done():
			return p.Stop()
		case <-exited:
		}
		p.mu.Lock()
		replaced := p.exited != exited // Restart already started the next one
		intended := p.stopping
		p.mu.Unlock()
		switch {
		case replaced:
			continue
		case intended:
			// Stopped on purpose: wait for Restart to start it again.
			select {
			case <-ctx.Done():
				return nil
			case <-p.wake:
			}
			continue
		}
		p.log.Warn("exited; restarting", "after", p.spec.RestartDelay)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(p.spec.RestartDelay):
		}
		if err := p.start(); err != nil {
			p.log.Error("starting failed", "err", err)
		}
	}
}

func (p *Process) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	cmd := exec.Command(p.spec.Path, p.spec.Args...)
	cmd.Env = p.spec.Env
	cmd.Stdout, cmd.Stderr = p.spec.Stdout, p.spec.Stderr
	exited := make(chan struct{})
	p.exited = exited
	if err := cmd.Start(); err != nil {
		close(exited)
		return fmt.Errorf("starting %s: %w", p.spec.Name, err)
	}
	p.cmd = cmd
	p.starts++
	p.stopping = false
	p.log.Info("started", "pid", cmd.Process.Pid)
	go func() {
		err := cmd.Wait()
		p.log.Info("exited", "pid", cmd.Process.Pid, "status", err)
		close(exited)
	}()
	return nil
}

// PID returns the running process's PID, or 0.
func (p *Process) PID() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	select {
	case <-p.exited:
		return 0
	default:
		return p.cmd.Process.Pid
	}
}

// Starts counts how often the process was started.
func (p *Process) Starts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.starts
}

// Stop ends the process: SIGTERM to its PID only, SIGKILL to its PID after StopTimeout.
func (p *Process) Stop() error {
	p.mu.Lock()
	p.stopping = true
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return nil
	}
	select {
	case <-exited:
		return nil
	default:
	}
	// The PID only: k3s's children in their own sessions (containerd shims) live on.
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("stopping %s: %w", p.spec.Name, err)
	}
	select {
	case <-exited:
		return nil
	case <-time.After(p.spec.StopTimeout):
		p.log.Warn("did not stop in time; killing", "timeout", p.spec.StopTimeout)
		_ = cmd.Process.Kill()
		<-exited
		return nil
	}
}

// Restart stops the process and starts it again at once, returning the new PID.
func (p *Process) Restart(ctx context.Context) (int, error) {
	if err := p.Stop(); err != nil {
		return 0, err
	}
	if err := p.start(); err != nil {
		return 0, err
	}
	select {
	case p.wake <- struct{}{}:
	default:
	}
	return p.PID(), nil
}
