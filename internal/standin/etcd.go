package standin

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"liken.dev/liken/internal/atomicfile"
)

// A server's etcd member, as k3s runs its embedded etcd (pkg/etcd/etcd.go; docs/k3s.md,
// "Servers joining servers"):
//   - TLS on every listener, from k3s's files under server/tls/etcd (server-client.crt on the
//     client port, peer-server-client.crt between peers, client.crt for kube-apiserver and
//     k3s's own calls), client certificates required on both ports;
//   - clients and peers on loopback and the node's address, ports 2379 and 2380;
//   - the member's name in server/db/etcd/name: the node's name and 8 hex digits, made once;
//   - three ways to start: a member already (its data, no other flag: --cluster-init and
//     --server are ignored, as k3s's docs say), the first server (a new cluster of itself), or
//     a server joining through another: added to the cluster as a learner, etcd started with
//     the cluster's members, and ready once the leader has promoted it, which etcd allows
//     when the learner has caught up.
//
// Where it differs from k3s: k3s asks the server it joins for the members over its
// supervisor (/db/info on port 6443, basic auth with the token); the stand-in has no
// supervisor and asks that server's etcd on its client port (2379), with the client
// certificate the layer's etcd CA gives every server, which is where k3s's etcd-less
// servers fall back to as well. The stand-in talks to etcd through etcd's own JSON gateway on
// that port, not a gRPC client.
type etcdMember struct {
	dir, tls       string // server/db/etcd, server/tls/etcd
	node, ip       string // the node's name, the address peers and clients reach it on
	port, peerPort int
	// join is a member's client URL this server joins the cluster through; empty, a new
	// cluster of this member alone.
	join string
	log  io.Writer

	name   string // the member's name, read or made by start
	client *http.Client
}

// etcdPort and etcdPeerPort are k3s's: its servers find each other's etcd there.
const (
	etcdPort     = 2379
	etcdPeerPort = 2380
)

func (m *etcdMember) url(host string, port int) string {
	return "https://" + net.JoinHostPort(host, strconv.Itoa(port))
}

func (m *etcdMember) clientURL() string { return m.url(m.ip, m.port) }
func (m *etcdMember) peerURL() string   { return m.url(m.ip, m.peerPort) }
func (m *etcdMember) localURL() string  { return m.url("127.0.0.1", m.port) }

// etcdClient is an HTTP client that presents k3s's etcd client certificate and trusts
// etcd's server CA, from a server's server/tls/etcd.
func etcdClient(tlsDir string) (*http.Client, error) {
	cert, err := tls.LoadX509KeyPair(filepath.Join(tlsDir, "client.crt"), filepath.Join(tlsDir, "client.key"))
	if err != nil {
		return nil, fmt.Errorf("etcd's client certificate: %w", err)
	}
	ca, err := os.ReadFile(filepath.Join(tlsDir, "server-ca.crt"))
	if err != nil {
		return nil, fmt.Errorf("etcd's server CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("etcd's server CA %s holds no certificate", filepath.Join(tlsDir, "server-ca.crt"))
	}
	return &http.Client{Transport: &http.Transport{
		TLSClientConfig: &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, MinVersion: tls.VersionTLS12},
		DialContext:     (&net.Dialer{Timeout: 2 * time.Second}).DialContext,
		// A handshake under software emulation on a busy machine took more than 5 s.
		TLSHandshakeTimeout: 10 * time.Second,
	}}, nil
}

// callTimeout bounds each call to etcd: a member that accepted the connection and does
// not answer must not hold up the loop that called it.
const callTimeout = 20 * time.Second

// call posts req to one of etcd's gateway methods at base and decodes the answer into resp.
func (m *etcdMember) call(ctx context.Context, base, method string, req, resp any) error {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	r, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(base, "/")+method, bytes.NewReader(body))
	if err != nil {
		return err
	}
	res, err := m.client.Do(r)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	if err != nil {
		return err
	}
	if res.StatusCode != http.StatusOK {
		var e struct {
			Message string `json:"message"`
		}
		if json.Unmarshal(b, &e) == nil && e.Message != "" {
			return fmt.Errorf("etcd at %s: %s", base, e.Message)
		}
		return fmt.Errorf("etcd at %s: %s: %s", base, res.Status, bytes.TrimSpace(b))
	}
	return json.Unmarshal(b, resp)
}

// etcdMemberInfo is a member as etcd's gateway gives it (IDs are decimal strings).
type etcdMemberInfo struct {
	ID         string   `json:"ID"`
	Name       string   `json:"name"`
	PeerURLs   []string `json:"peerURLs"`
	ClientURLs []string `json:"clientURLs"`
	IsLearner  bool     `json:"isLearner"`
}

func (m *etcdMember) members(ctx context.Context, base string) ([]etcdMemberInfo, error) {
	var out struct {
		Members []etcdMemberInfo `json:"members"`
	}
	if err := m.call(ctx, base, "/v3/cluster/member/list", map[string]any{}, &out); err != nil {
		return nil, fmt.Errorf("listing etcd's members: %w", err)
	}
	return out.Members, nil
}

// etcdStatus is what a member says of itself.
type etcdStatus struct {
	Header struct {
		MemberID string `json:"member_id"`
	} `json:"header"`
	Leader    string   `json:"leader"`
	IsLearner bool     `json:"isLearner"`
	Errors    []string `json:"errors"`
}

func (m *etcdMember) status(ctx context.Context, base string) (etcdStatus, error) {
	var st etcdStatus
	err := m.call(ctx, base, "/v3/maintenance/status", map[string]any{}, &st)
	return st, err
}

// start decides how etcd starts (see above) and returns its flags. A server joining is
// added to the cluster here, before etcd starts, as k3s adds it.
func (m *etcdMember) start(ctx context.Context) ([]string, error) {
	if err := m.readName(); err != nil {
		return nil, err
	}
	args := []string{
		"--name=" + m.name,
		"--data-dir=" + m.dir,
		"--listen-client-urls=" + joinUnique(m.localURL(), m.clientURL()),
		"--advertise-client-urls=" + m.clientURL(),
		"--listen-peer-urls=" + joinUnique(m.url("127.0.0.1", m.peerPort), m.peerURL()),
		"--initial-advertise-peer-urls=" + m.peerURL(),
		"--cert-file=" + filepath.Join(m.tls, "server-client.crt"),
		"--key-file=" + filepath.Join(m.tls, "server-client.key"),
		"--trusted-ca-file=" + filepath.Join(m.tls, "server-ca.crt"),
		"--client-cert-auth",
		"--peer-cert-file=" + filepath.Join(m.tls, "peer-server-client.crt"),
		"--peer-key-file=" + filepath.Join(m.tls, "peer-server-client.key"),
		"--peer-trusted-ca-file=" + filepath.Join(m.tls, "peer-ca.crt"),
		"--peer-client-cert-auth",
		// k3s's raft timing and snapshot count (pkg/etcd/etcd.go cluster(): HeartbeatInterval
		// 500, ElectionTimeout 5000, SnapshotCount 10000), not etcd's 100 ms and 1 s: a member
		// on a busy machine keeps its leader.
		"--heartbeat-interval=500",
		"--election-timeout=5000",
		"--snapshot-count=10000",
		"--listen-metrics-urls=",
		"--log-level=warn",
	}
	switch {
	case m.initialized():
		fmt.Fprintf(m.log, "k3s-standin: starting etcd for existing cluster member %s\n", m.name)
		return args, nil
	case m.join == "":
		fmt.Fprintf(m.log, "k3s-standin: starting etcd for a new cluster, member %s\n", m.name)
		return append(args, "--initial-cluster="+m.name+"="+m.peerURL(), "--initial-cluster-state=new"), nil
	}
	cluster, err := m.joinCluster(ctx)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(m.log, "k3s-standin: starting etcd to join the cluster through %s as member %s (%s)\n", m.join, m.name, cluster)
	return append(args, "--initial-cluster="+cluster, "--initial-cluster-state=existing"), nil
}

// initialized: etcd's write-ahead log exists, as k3s tells a member (IsInitialized).
func (m *etcdMember) initialized() bool {
	_, err := os.Stat(filepath.Join(m.dir, "member", "wal"))
	return err == nil
}

// readName reads the member's name, or makes one as k3s does (setName): the node's name and
// 8 hex digits. Data from before the name file (a stand-in of 2026.12.07 or older) is the
// member named after the node alone.
func (m *etcdMember) readName() error {
	file := filepath.Join(m.dir, "name")
	if b, err := os.ReadFile(file); err == nil && len(bytes.TrimSpace(b)) > 0 {
		m.name = string(bytes.TrimSpace(b))
		return nil
	}
	if m.initialized() {
		m.name = m.node
	} else {
		m.name = newMemberName(m.node)
	}
	if err := os.MkdirAll(m.dir, 0o700); err != nil {
		return err
	}
	return atomicfile.Write(file, []byte(m.name+"\n"), 0o600)
}

// newMemberName is a new member's name for node, as k3s makes it.
func newMemberName(node string) string {
	r := make([]byte, 4)
	rand.Read(r)
	return node + "-" + hex.EncodeToString(r)
}

// joinCluster adds this server to the cluster m.join reaches, as a learner (k3s's join):
// unless a member with this server's peer URL is there already (added by an earlier start
// that ended before etcd ran), and returns etcd's --initial-cluster. It tries every second
// until ctx ends: the server joined through may still be starting, or have a learner
// already (etcd allows one at a time).
func (m *etcdMember) joinCluster(ctx context.Context) (string, error) {
	said := ""
	for {
		cluster, err := m.tryJoin(ctx)
		if err == nil {
			return cluster, nil
		}
		var fatal fatalJoin
		if errors.As(err, &fatal) {
			return "", err
		}
		if err.Error() != said {
			said = err.Error()
			fmt.Fprintf(m.log, "k3s-standin: joining etcd through %s: %v (trying again every second)\n", m.join, err)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// fatalJoin is a join that trying again will not mend.
type fatalJoin struct{ error }

func (m *etcdMember) tryJoin(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	members, err := m.members(ctx, m.join)
	if err != nil {
		return "", err
	}
	add := true
	var cluster []string
	for _, mm := range members {
		ours := len(mm.PeerURLs) > 0 && mm.PeerURLs[0] == m.peerURL()
		switch {
		case ours && (mm.Name == "" || mm.Name == m.name):
			add = false
			continue
		case ours:
			return "", fatalJoin{fmt.Errorf("etcd member %s already has this server's peer URL %s: remove it from the cluster (delete its Node) before this server joins", mm.Name, m.peerURL())}
		case mm.Name != m.name && nodeOfMember(mm.Name) == m.node:
			// k3s refuses the same: a node name two members would share.
			return "", fatalJoin{fmt.Errorf("duplicate node name found: etcd member %s is node %s's, as this server would be; please use a unique name for this node, or remove the old member (delete its Node)", mm.Name, m.node)}
		case mm.Name == "" || len(mm.PeerURLs) == 0:
			continue // another learner added and not started: not in --initial-cluster
		}
		cluster = append(cluster, mm.Name+"="+mm.PeerURLs[0])
	}
	if add {
		var out struct {
			Member etcdMemberInfo `json:"member"`
		}
		if err := m.call(ctx, m.join, "/v3/cluster/member/add", map[string]any{"peerURLs": []string{m.peerURL()}, "isLearner": true}, &out); err != nil {
			return "", fmt.Errorf("adding this server to etcd as a learner: %w", err)
		}
		fmt.Fprintf(m.log, "k3s-standin: added to etcd through %s as learner %s (%s)\n", m.join, out.Member.ID, m.peerURL())
	}
	return strings.Join(append(cluster, m.name+"="+m.peerURL()), ","), nil
}

// nodeOfMember is the node a member's name is for: the name without its last "-suffix".
func nodeOfMember(name string) string {
	if i := strings.LastIndex(name, "-"); i > 0 {
		return name[:i]
	}
	return name
}

// voter says whether this member votes: a learner waits for the leader to promote it, as
// k3s's servers wait before their API server starts (ETCD.Test).
func (m *etcdMember) voter(ctx context.Context) error {
	st, err := m.status(ctx, m.localURL())
	if err != nil {
		return err
	}
	if st.IsLearner {
		return fmt.Errorf("etcd member %s is a learner: the leader promotes it once etcd finds it caught up (every 15 s)", m.name)
	}
	return nil
}

// leaderMembers is the cluster's members when this member leads it (k3s's leader-only
// loops ask the same first); leader false, and no members, elsewhere.
func (m *etcdMember) leaderMembers(ctx context.Context) ([]etcdMemberInfo, bool, error) {
	st, err := m.status(ctx, m.localURL())
	if err != nil {
		return nil, false, fmt.Errorf("etcd's status: %w", err)
	}
	if st.Header.MemberID != st.Leader {
		return nil, false, nil
	}
	members, err := m.members(ctx, m.localURL())
	return members, err == nil, err
}

// manageLearners is the leader's part k3s runs every 15 s (manageLearners): on the leader
// only, it asks etcd to promote each learner; etcd refuses one that has not caught up,
// which is asked again next time. It returns when ctx ends.
func (m *etcdMember) manageLearners(ctx context.Context, every time.Duration) {
	said := ""
	say := func(err error) {
		if err != nil && err.Error() != said && ctx.Err() == nil { // asked again next time; said once
			said = err.Error()
			fmt.Fprintf(m.log, "k3s-standin: etcd's learners: %v\n", err)
		}
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
		members, leader, err := m.leaderMembers(ctx)
		if err != nil || !leader {
			say(err)
			continue
		}
		for _, mm := range members {
			if !mm.IsLearner {
				continue
			}
			var out struct{}
			if err := m.call(ctx, m.localURL(), "/v3/cluster/member/promote", map[string]any{"ID": mm.ID}, &out); err != nil {
				say(fmt.Errorf("learner %s %s not promoted yet: %w", mm.ID, mm.Name, err))
				continue
			}
			fmt.Fprintf(m.log, "k3s-standin: promoted learner %s to a voting member\n", mm.Name)
		}
	}
}

// leaderCheck is the check k3s's etcd leader makes of its members every 15 s for their
// Nodes: on the leader only, each member's status, asked within 2 s. Elsewhere it returns a
// view that is not the leader's.
func (m *etcdMember) leaderCheck(ctx context.Context) (etcdView, error) {
	members, leader, err := m.leaderMembers(ctx)
	if err != nil || !leader {
		return etcdView{}, err
	}
	v := etcdView{leader: true, members: map[string]memberState{}}
	for _, mm := range members {
		if mm.Name == "" {
			continue // added, never started
		}
		s := memberState{learner: mm.IsLearner}
		if len(mm.ClientURLs) == 0 {
			s.health = errors.New("the member advertises no client URL")
		} else {
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			st, err := m.status(cctx, mm.ClientURLs[0])
			cancel()
			switch {
			case err != nil:
				s.health = err
			case len(st.Errors) > 0:
				s.health = errors.New(strings.Join(st.Errors, "; "))
			}
		}
		v.members[mm.Name] = s
	}
	return v, nil
}

// etcdView is what the leader's check found: each member by name.
type etcdView struct {
	leader  bool
	members map[string]memberState
}

type memberState struct {
	learner bool
	health  error
}

// joinUnique joins URLs with commas, each once (a node whose address is loopback).
func joinUnique(urls ...string) string {
	var out []string
	for _, u := range urls {
		if !slices.Contains(out, u) {
			out = append(out, u)
		}
	}
	return strings.Join(out, ",")
}

// joinEtcdURL is the client URL of the etcd of the server a joining server's --server
// names: its host, etcd's client port.
func joinEtcdURL(server string, port int) (string, error) {
	u, err := url.Parse(server)
	if err != nil || u.Hostname() == "" {
		return "", fmt.Errorf("server %q is not a URL with a host", server)
	}
	return "https://" + net.JoinHostPort(u.Hostname(), strconv.Itoa(port)), nil
}
