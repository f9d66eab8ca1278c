package v1alpha1

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestNewApprovalTime(t *testing.T) {
	now := time.Date(2026, 12, 3, 6, 0, 0, 700e6, time.UTC)
	at := func(d time.Duration) *metav1.Time { t := metav1.NewTime(now.Truncate(time.Second).Add(d)); return &t }
	const h1, h2 = "sha256:1", "sha256:2"
	for _, tt := range []struct {
		name string
		prev *RebootApproval
		hash string
		want time.Time
	}{
		{"no approval before", nil, h1, now.Truncate(time.Second)},
		{"an earlier approval of the set", &RebootApproval{PendingHash: h1, ApprovedAt: at(-time.Second)}, h1, now.Truncate(time.Second)},
		{"the same set in the same second", &RebootApproval{PendingHash: h1, ApprovedAt: at(0)}, h1, now.Truncate(time.Second).Add(time.Second)},
		{"the same set approved ahead of this clock", &RebootApproval{PendingHash: h1, ApprovedAt: at(5 * time.Second)}, h1, now.Truncate(time.Second).Add(6 * time.Second)},
		{"another set in the same second", &RebootApproval{PendingHash: h2, ApprovedAt: at(0)}, h1, now.Truncate(time.Second)},
		{"an approval without a time", &RebootApproval{PendingHash: h1}, h1, now.Truncate(time.Second)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := NewApprovalTime(tt.prev, tt.hash, now); !got.Time.Equal(tt.want) {
				t.Errorf("got %s, want %s", got.Time, tt.want)
			}
		})
	}
}
