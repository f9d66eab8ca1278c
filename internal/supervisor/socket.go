package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"
)

// DefaultSocket is where init listens for the agent's requests.
const DefaultSocket = "/run/liken/init.sock"

// Server answers on a Unix socket:
//
//	POST /v1/processes/<name>/restart   restart one process; 200 with {"pid": N}
//	GET  /v1/processes                  {"<name>": {"pid": N, "starts": N}}
type Server struct {
	Processes map[string]*Process
	// CommitTrial, when set, answers POST /v1/trial/commit: the agent found the tried slot
	// healthy and init makes it the default.
	CommitTrial func() error
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
	mux.HandleFunc("POST /v1/trial/commit", func(w http.ResponseWriter, r *http.Request) {
		if s.CommitTrial == nil {
			http.Error(w, "this boot is not a trial", http.StatusConflict)
			return
		}
		if err := s.CommitTrial(); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		io.WriteString(w, "committed\n")
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

// Client asks init's supervisor for restarts; it is the agent's Restarter.
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
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://init/v1/trial/commit", nil)
	if err != nil {
		return err
	}
	resp, err := c.http().Do(req)
	if err != nil {
		return fmt.Errorf("asking init to commit the trial: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("asking init to commit the trial: %s: %s", resp.Status, b)
	}
	return nil
}
