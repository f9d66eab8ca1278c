package supervisor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"

	"liken.dev/liken/api/v1alpha1"
	"liken.dev/liken/internal/bootloader"
	"liken.dev/liken/internal/state"
)

// DefaultSocket is where init listens for the agent's requests.
const DefaultSocket = "/run/liken/init.sock"

// Server answers on a Unix socket:
//
//	POST /v1/processes/<name>/restart   restart one process; 200 with {"pid": N}
//	GET  /v1/processes                  {"<name>": {"pid": N, "starts": N}}
//	GET  /v1/boot                       BootInfo
//	PUT  /v1/slots/<A|B>                record what a slot holds (bootloader.SlotRecord)
//	POST /v1/reboot                     RebootRequest: arm a trial (or not) and reboot
//	POST /v1/trial/commit               the tried slot is healthy: make it the default
type Server struct {
	Processes map[string]*Process
	// Boot is init's control of the boot loader; nil answers 501.
	Boot Boot
}

// Boot is init's side of the boot loader, which the agent drives over the socket: init
// owns the ESP, so every change to it goes through one process.
type Boot interface {
	Info() (BootInfo, error)
	// SetSlot records what a slot holds; the booted and the default slot are refused.
	SetSlot(slot string, r bootloader.SlotRecord) error
	// Reboot arms the trial the request names, if any, and reboots the machine.
	Reboot(r RebootRequest) error
	// Commit makes the slot this trial booted (and its kernel arguments) the default.
	Commit() error
	// FailTrial ends an uncommitted trial now, as a missed health deadline would: the
	// machine reboots into its last good slot, and the boot log says why (end: a
	// state.End* the agent may give, state.EndGatesFailed or state.EndPeersUnreachable).
	FailTrial(end, message string) error
}

// TrialFailure is why the agent ends a trial before its deadline.
type TrialFailure struct {
	// End is how the trial ends in the boot log: state.EndGatesFailed (also when empty, as
	// an agent from before peers' waits sends) or state.EndPeersUnreachable.
	End     string `json:"end,omitempty"`
	Message string `json:"message"`
}

// BootInfo is what the machine booted.
type BootInfo struct {
	// Slot booted, and whether this boot is a trial (and, if so, whether it was committed).
	Slot      string `json:"slot"`
	Trial     bool   `json:"trial,omitempty"`
	Committed bool   `json:"committed,omitempty"`
	// DefaultSlot is the slot the boot loader falls back to: the last good one.
	DefaultSlot string `json:"defaultSlot"`
	// Version is the release in the booted root image; K3s its k3s version ("stand-in"
	// for liken's node simulator).
	Version string `json:"version,omitempty"`
	K3s     string `json:"k3s,omitempty"`
	// KernelArgs are the Cluster's and Machine's kernelArgs this boot runs with.
	KernelArgs string `json:"kernelArgs"`
	// BootID is the kernel's boot_id; BootTime when the kernel started.
	BootID   string    `json:"bootID"`
	BootTime time.Time `json:"bootTime"`
	// Slots are the slot records from the ESP.
	Slots bootloader.Slots `json:"slots"`
	// Boots is init's log of recent boots, oldest first, this one last.
	Boots []state.BootRecord `json:"boots,omitempty"`
	// LayerDigest is the deployment layer's digest as built (what liken layer printed),
	// recorded on the disk by install; empty when the disk records none.
	LayerDigest string `json:"layerDigest,omitempty"`
	// Role is the role k3s was started with: the layer's Machine manifest's, which the
	// API's Machine may contradict (a reinstall with the other role's layer). Empty until
	// init has picked the machine's manifest.
	Role v1alpha1.Role `json:"role,omitempty"`
	// Report is what init applied at this boot of the boot-time settings; nil when init
	// has not got that far.
	Report *state.BootReport `json:"report,omitempty"`
	// RebootPending: init took a reboot request and the machine is going down.
	RebootPending bool `json:"rebootPending,omitempty"`
}

// RebootRequest asks init to reboot, trying TrialSlot with TrialArgs once when TrialSlot is
// set.
type RebootRequest struct {
	TrialSlot string `json:"trialSlot,omitempty"`
	TrialArgs string `json:"trialArgs,omitempty"`
	// Why is printed on the console.
	Why string `json:"why,omitempty"`
}

// Serve listens on path (replacing a stale socket) until ctx ends. Only root may connect.
func (s *Server) Serve(ctx context.Context, path string) error {
	_ = os.Remove(path)
	l, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return fmt.Errorf("securing %s: %w", path, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/processes/{name}/restart", func(w http.ResponseWriter, r *http.Request) {
		p, ok := s.Processes[r.PathValue("name")]
		if !ok {
			http.Error(w, "no such process", http.StatusNotFound)
			return
		}
		pid, err := p.Restart(r.Context())
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		json.NewEncoder(w).Encode(map[string]int{"pid": pid})
	})
	mux.HandleFunc("GET /v1/processes", func(w http.ResponseWriter, r *http.Request) {
		out := map[string]map[string]int{}
		for n, p := range s.Processes {
			out[n] = map[string]int{"pid": p.PID(), "starts": p.Starts()}
		}
		json.NewEncoder(w).Encode(out)
	})
	boot := func(w http.ResponseWriter) bool {
		if s.Boot == nil {
			http.Error(w, "this init has no boot loader control", http.StatusNotImplemented)
			return false
		}
		return true
	}
	mux.HandleFunc("GET /v1/boot", func(w http.ResponseWriter, r *http.Request) {
		if !boot(w) {
			return
		}
		info, err := s.Boot.Info()
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		json.NewEncoder(w).Encode(info)
	})
	mux.HandleFunc("PUT /v1/slots/{slot}", func(w http.ResponseWriter, r *http.Request) {
		var rec bootloader.SlotRecord
		if !boot(w) || !decode(w, r, &rec) {
			return
		}
		if err := s.Boot.SetSlot(r.PathValue("slot"), rec); err != nil {
			http.Error(w, err.Error(), http.StatusConflict)
			return
		}
		io.WriteString(w, "recorded\n")
	})
	mux.HandleFunc("POST /v1/reboot", func(w http.ResponseWriter, r *http.Request) {
		var req RebootRequest
		if !boot(w) || !decode(w, r, &req) {
			return
		}
		if err := s.Boot.Reboot(req); err != nil {
			http.Error(w, err.Error(), http.StatusConflict)
			return
		}
		w.WriteHeader(http.StatusAccepted)
		io.WriteString(w, "rebooting\n")
	})
	mux.HandleFunc("POST /v1/trial/commit", func(w http.ResponseWriter, r *http.Request) {
		if !boot(w) {
			return
		}
		if err := s.Boot.Commit(); err != nil {
			http.Error(w, err.Error(), http.StatusConflict)
			return
		}
		io.WriteString(w, "committed\n")
	})
	mux.HandleFunc("POST /v1/trial/fail", func(w http.ResponseWriter, r *http.Request) {
		var f TrialFailure
		if !boot(w) || !decode(w, r, &f) {
			return
		}
		if f.End == "" {
			f.End = state.EndGatesFailed // an agent from before peers' waits
		}
		if _, ok := state.AgentEnds[f.End]; !ok {
			http.Error(w, fmt.Sprintf("a trial cannot end %q: the agent may end it %q or %q", f.End, state.EndGatesFailed, state.EndPeersUnreachable), http.StatusBadRequest)
			return
		}
		if err := s.Boot.FailTrial(f.End, f.Message); err != nil {
			http.Error(w, err.Error(), http.StatusConflict)
			return
		}
		w.WriteHeader(http.StatusAccepted)
		io.WriteString(w, "the trial ends: rebooting into the last good slot\n")
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// ErrNoBootControl: the supervisor answering has no boot loader to control (it is not
// liken's init, as in tests of the agent on a host).
var ErrNoBootControl = errors.New("this supervisor has no boot loader control")

func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	if err := json.NewDecoder(io.LimitReader(r.Body, 64<<10)).Decode(v); err != nil {
		http.Error(w, "reading the request: "+err.Error(), http.StatusBadRequest)
		return false
	}
	return true
}

// Client asks init's supervisor for restarts and drives the boot loader through init; it
// is the agent's Restarter and Boot.
type Client struct {
	Socket string
}

func (c Client) http() *http.Client {
	return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", c.Socket)
	}}}
}

// Restart restarts the named process and returns its new PID.
func (c Client) Restart(ctx context.Context, name string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://init/v1/processes/"+name+"/restart", nil)
	if err != nil {
		return 0, err
	}
	resp, err := c.http().Do(req)
	if err != nil {
		return 0, fmt.Errorf("asking init to restart %s: %w", name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return 0, fmt.Errorf("asking init to restart %s: %s: %s", name, resp.Status, b)
	}
	var out struct{ PID int }
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return 0, fmt.Errorf("asking init to restart %s: %w", name, err)
	}
	return out.PID, nil
}

// RestartK3s restarts k3s in place.
func (c Client) RestartK3s(ctx context.Context) error {
	_, err := c.Restart(ctx, "k3s")
	return err
}

// CommitTrial asks init to make the slot this trial booted the default.
func (c Client) CommitTrial(ctx context.Context) error {
	return c.call(ctx, http.MethodPost, "/v1/trial/commit", nil, nil, "asking init to commit the trial")
}

// FailTrial asks init to end this uncommitted trial now, the machine falling back to its
// last good slot, with end and message in the boot log.
func (c Client) FailTrial(ctx context.Context, end, message string) error {
	return c.call(ctx, http.MethodPost, "/v1/trial/fail", TrialFailure{End: end, Message: message}, nil, "asking init to end the trial")
}

// BootInfo asks init what the machine booted.
func (c Client) BootInfo(ctx context.Context) (*BootInfo, error) {
	var info BootInfo
	if err := c.call(ctx, http.MethodGet, "/v1/boot", nil, &info, "asking init what this machine booted"); err != nil {
		return nil, err
	}
	return &info, nil
}

// SetSlot asks init to record what a slot holds.
func (c Client) SetSlot(ctx context.Context, slot string, r bootloader.SlotRecord) error {
	return c.call(ctx, http.MethodPut, "/v1/slots/"+slot, r, nil, "asking init to record slot "+slot)
}

// Reboot asks init to arm the request's trial and reboot.
func (c Client) Reboot(ctx context.Context, r RebootRequest) error {
	return c.call(ctx, http.MethodPost, "/v1/reboot", r, nil, "asking init to reboot")
}

func (c Client) call(ctx context.Context, method, path string, in, out any, doing string) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("%s: %w", doing, err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://init"+path, body)
	if err != nil {
		return fmt.Errorf("%s: %w", doing, err)
	}
	resp, err := c.http().Do(req)
	if err != nil {
		return fmt.Errorf("%s: %w", doing, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotImplemented {
		return fmt.Errorf("%s: %w", doing, ErrNoBootControl)
	}
	if resp.StatusCode/100 != 2 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("%s: %s: %s", doing, resp.Status, bytes.TrimSpace(b))
	}
	if out != nil {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			return fmt.Errorf("%s: %w", doing, err)
		}
	}
	return nil
}
