// Package k3s renders k3s's configuration for one machine: the config file
// (/etc/rancher/k3s/config.yaml) and the registries file (registries.yaml), per role, from the
// Cluster and Machine. One renderer serves init (first start) and the agent (restart when the
// bytes change). Keys, paths and roles are k3s's own (k3s pkg/cli/cmds/server.go and
// agent.go; rancher/wharfie pkg/registries/types.go): an agent's file never carries a
// server-only key, because `k3s agent` refuses flags it does not define.
package k3s

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"sigs.k8s.io/yaml"

	"liken.dev/liken/api/v1alpha1"
)

// Paths are where k3s's files live on a machine.
type Paths struct {
	Config     string // k3s --config
	Registries string // k3s --private-registry
	// RegistryFiles holds CA certificates and client keys named by registries.yaml.
	RegistryFiles string
	// TokenFile holds this machine's join token (the server token on servers, the agent
	// token on agents); AgentTokenFile, on servers only, the agent token they accept.
	TokenFile      string
	AgentTokenFile string
	DataDir        string
}

// DefaultPaths are k3s's defaults, with liken's token file on the state partition.
var DefaultPaths = Paths{
	Config:         "/etc/rancher/k3s/config.yaml",
	Registries:     "/etc/rancher/k3s/registries.yaml",
	RegistryFiles:  "/etc/rancher/k3s/registry-files",
	TokenFile:      "/var/lib/liken/token",
	AgentTokenFile: "/var/lib/liken/agent-token",
	DataDir:        "/var/lib/rancher/k3s",
}

// Input is everything the rendering depends on.
type Input struct {
	Role     v1alpha1.Role
	NodeName string
	// NodeIP is node-ip: the Machine's spec.network.nodeIP this boot's network has (empty:
	// k3s's own choice).
	NodeIP  string
	Cluster v1alpha1.ClusterSpec
	// Join is the URL of a server to join (https://host:6443); empty on the server that
	// initialises the cluster.
	Join string
	// Secrets holds the data of the Secrets in liken-system the Cluster's registries name,
	// by Secret name.
	Secrets map[string]map[string][]byte
	// AllowMissingSecrets renders registries whose Secrets are not at hand without their
	// credentials (init at boot, before the API can be read); the file says what it left
	// out, and the agent renders it whole once it reads the Secrets.
	AllowMissingSecrets bool
	Paths               Paths
	// SwapOn says swap is active on this machine: the kubelet must be told to accept it, or
	// it refuses to start ("running with swap on is not supported").
	SwapOn bool
}

// Output is the rendered files: path → content (all written mode 0600: they may carry
// registry credentials).
type Output map[string][]byte

// Render renders k3s's files.
func Render(in Input) (Output, error) {
	if in.NodeName == "" {
		return nil, fmt.Errorf("rendering k3s config: no node name")
	}
	p := in.Paths
	cfg := map[string]any{
		"node-name":        in.NodeName,
		"token-file":       p.TokenFile,
		"data-dir":         p.DataDir,
		"private-registry": p.Registries,
	}
	// k3s's node-ip (pkg/cli/cmds/agent.go, a key of both server and agent): the address the
	// kubelet gives the Node, flannel's interface, and a server's advertised address.
	setIf(cfg, "node-ip", in.NodeIP)
	switch in.Role {
	case v1alpha1.RoleServer:
		if in.Join == "" {
			cfg["cluster-init"] = true
		} else {
			cfg["server"] = in.Join
		}
		if a := in.Cluster.RegistrationAddress; a != "" {
			// Machines join through it and verify the server they reach against it, so
			// every server's certificate must name it: k3s names only the node's own names
			// and default-route address otherwise (tls-san, pkg/cli/cmds/server.go;
			// docs.k3s.io/datastore/ha-embedded sets it on the first server and on the ones
			// that join). docs/k3s.md, "Joining".
			cfg["tls-san"] = []string{a}
		}
		n := in.Cluster.Network
		setIf(cfg, "cluster-cidr", n.ClusterCIDR)
		setIf(cfg, "service-cidr", n.ServiceCIDR)
		setIf(cfg, "cluster-dns", n.ClusterDNS)
		setIf(cfg, "cluster-domain", n.ClusterDomain)
		f := in.Cluster.Features
		if f.FlannelBackend != "" {
			cfg["flannel-backend"] = string(f.FlannelBackend)
		}
		var disable []string
		for _, c := range []struct {
			on   *bool
			name string
		}{{f.CoreDNS, "coredns"}, {f.LocalStorage, "local-storage"}, {f.MetricsServer, "metrics-server"}, {f.ServiceLB, "servicelb"}, {f.Traefik, "traefik"}} {
			if c.on != nil && !*c.on {
				disable = append(disable, c.name)
			}
		}
		if len(disable) > 0 {
			cfg["disable"] = disable
		}
		if f.NetworkPolicy != nil && !*f.NetworkPolicy {
			cfg["disable-network-policy"] = true
		}
		if f.EmbeddedRegistry != nil && *f.EmbeddedRegistry {
			cfg["embedded-registry"] = true
		}
		if f.SecretsEncryption != nil && *f.SecretsEncryption {
			cfg["secrets-encryption"] = true
		}
		// Agents join with their own token ("K10<ca-hash>::node:<password>"), so an agent's
		// credentials never let it join as a server.
		setIf(cfg, "agent-token-file", p.AgentTokenFile)
		// A quoted string: yaml.v2 would read 0600 as an octal number.
		cfg["write-kubeconfig-mode"] = "0600"
	case v1alpha1.RoleAgent:
		if in.Join == "" {
			return nil, fmt.Errorf("rendering k3s config for agent %s: no server to join", in.NodeName)
		}
		cfg["server"] = in.Join
	default:
		return nil, fmt.Errorf("rendering k3s config: unknown role %q", in.Role)
	}
	if in.SwapOn {
		// config.yaml's name for --kubelet-arg (k3s-io/k3s#4509, servers and agents).
		cfg["kubelet-arg"] = []string{"fail-swap-on=false"}
	}
	config, err := yaml.Marshal(cfg)
	if err != nil {
		return nil, fmt.Errorf("rendering k3s config: %w", err)
	}
	out := Output{p.Config: append([]byte("# Written by liken from the Cluster and Machine resources; edit those, not this.\n"), config...)}
	if err := renderRegistries(in, out); err != nil {
		return nil, err
	}
	return out, nil
}

func setIf(m map[string]any, k, v string) {
	if v != "" {
		m[k] = v
	}
}

func renderRegistries(in Input, out Output) error {
	var omitted []string
	missing := func(what, name, host string) error {
		if in.AllowMissingSecrets {
			omitted = append(omitted, fmt.Sprintf("# %s for %s omitted: Secret %s/%s not read yet\n", what, host, v1alpha1.SecretNamespace, name))
			return nil
		}
		return fmt.Errorf("rendering registries.yaml: Secret %s/%s (%s for %s) not found", v1alpha1.SecretNamespace, name, what, host)
	}
	mirrors := map[string]any{}
	configs := map[string]any{}
	if r := in.Cluster.Registries; r != nil {
		for _, m := range r.Mirrors {
			e := map[string]any{"endpoint": m.Endpoints}
			if len(m.Rewrites) > 0 {
				e["rewrite"] = m.Rewrites
			}
			mirrors[m.Registry] = e
		}
		for _, c := range r.Configs {
			entry := map[string]any{}
			if c.AuthSecret != nil {
				data, ok := in.Secrets[c.AuthSecret.Name]
				if !ok {
					if err := missing("auth", c.AuthSecret.Name, c.Host); err != nil {
						return err
					}
				}
				auth := map[string]any{}
				for key, yamlKey := range map[string]string{"username": "username", "password": "password", "auth": "auth", "identityToken": "identity_token"} {
					if v, ok := data[key]; ok {
						auth[yamlKey] = string(v)
					}
				}
				if len(auth) == 0 && ok {
					return fmt.Errorf("rendering registries.yaml: Secret %s/%s has none of username, password, auth, identityToken", v1alpha1.SecretNamespace, c.AuthSecret.Name)
				}
				if len(auth) > 0 {
					entry["auth"] = auth
				}
			}
			if c.TLS != nil {
				tls := map[string]any{}
				if c.TLS.InsecureSkipVerify {
					tls["insecure_skip_verify"] = true
				}
				if c.TLS.Secret != nil {
					data, ok := in.Secrets[c.TLS.Secret.Name]
					if !ok {
						if err := missing("TLS", c.TLS.Secret.Name, c.Host); err != nil {
							return err
						}
					}
					dir := filepath.Join(in.Paths.RegistryFiles, c.Host)
					for key, yamlKey := range map[string]string{"ca.crt": "ca_file", "tls.crt": "cert_file", "tls.key": "key_file"} {
						if v, ok := data[key]; ok {
							path := filepath.Join(dir, key)
							out[path] = v
							tls[yamlKey] = path
						}
					}
				}
				if len(tls) > 0 {
					entry["tls"] = tls
				}
			}
			configs[c.Host] = entry
		}
	}
	doc := map[string]any{}
	if len(mirrors) > 0 {
		doc["mirrors"] = mirrors
	}
	if len(configs) > 0 {
		doc["configs"] = configs
	}
	b, err := yaml.Marshal(doc)
	if err != nil {
		return fmt.Errorf("rendering registries.yaml: %w", err)
	}
	head := "# Written by liken from the Cluster's spec.registries; edit that, not this.\n" + strings.Join(omitted, "")
	out[in.Paths.Registries] = append([]byte(head), b...)
	return nil
}

// Paths returns the output's file names, sorted.
func (o Output) Paths() []string {
	var out []string
	for p := range o {
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}

// SwapOn reads whether swap is active on this host (a device or file in /proc/swaps).
func SwapOn() bool {
	b, err := os.ReadFile("/proc/swaps")
	if err != nil {
		return false
	}
	return len(strings.Split(strings.TrimSpace(string(b)), "\n")) > 1 // a header, then one line each
}
