package manifest

import (
	"strings"
	"testing"
)

// TestRegistrationAddress: the Cluster's spec.registrationAddress takes what k3s's server URL
// and tls-san take, a DNS name or an IP address, and refuses a scheme, a port, and
// addresses no other machine reaches, with the field's own message.
func TestRegistrationAddress(t *testing.T) {
	v, err := NewValidator()
	if err != nil {
		t.Fatal(err)
	}
	const form = "registrationAddress must be a DNS name in lower case or an IP address, without scheme or port"
	const reach = "registrationAddress must be an address the other machines reach"
	for _, tt := range []struct {
		value, want string // want "" = accepted
	}{
		{"k3s.example.com", ""},
		{"k3s", ""},
		{"192.0.2.10", ""},
		{"2001:db8::10", ""},
		{"https://k3s.example.com", form},
		{"k3s.example.com:6443", form},
		{"192.0.2.10:6443", form},
		{"[2001:db8::10]", form},
		{"K3S.example.com", form},
		{"-k3s.example.com", form},
		{"k3s..example.com", form},
		{strings.Repeat("a", 64) + ".example.com", form},
		{"localhost", reach},
		{"127.0.0.1", reach},
		{"::1", reach},
		{"0.0.0.0", reach},
		{"::", reach},
	} {
		t.Run(tt.value, func(t *testing.T) {
			docs, err := Load(write(t, t.TempDir(), "c.yaml", cluster+"  registrationAddress: \""+tt.value+"\"\n"))
			if err != nil {
				t.Fatal(err)
			}
			errs := v.Create(docs[0].Object)
			got := Describe(docs[0].Object, errs)
			if tt.want == "" && len(errs) > 0 {
				t.Errorf("refused: %s", got)
			}
			if tt.want != "" && (len(errs) == 0 || !strings.Contains(got, tt.want)) {
				t.Errorf("got %q, want an error containing %q", got, tt.want)
			}
		})
	}
}
