package v1alpha1

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// NewApprovalTime is the approvedAt of a new approval of pending set hash given at now.
// An agent tells an approval it has used from a new one by the hash and approvedAt, and
// approvedAt keeps whole seconds: a second approval of the same set within the second of
// the one before (or with the clock behind it) would look used. So it is dated a second
// after the approval it replaces.
func NewApprovalTime(prev *RebootApproval, hash string, now time.Time) metav1.Time {
	at := now.UTC().Truncate(time.Second)
	if prev != nil && prev.PendingHash == hash && prev.ApprovedAt != nil && !at.After(prev.ApprovedAt.Time) {
		at = prev.ApprovedAt.Add(time.Second).UTC()
	}
	return metav1.NewTime(at)
}
