package k3s

import corev1 "k8s.io/api/core/v1"

// What k3s puts on a server's Node about its embedded etcd member (pkg/etcd/etcd.go): the
// etcd leader sets the EtcdIsVoter condition on every Node labelled with the etcd role
// every 15 s (manageTickerTime), matching a member to its Node by the node-name annotation;
// True for a voting member whose status check passed, False for a learner, an unhealthy
// member (the check failed within 2 s) or a server that is no member. An unchanged
// condition's heartbeat is refreshed every 5 minutes (heartbeatInterval).
const (
	EtcdIsVoter corev1.NodeConditionType = "EtcdIsVoter"

	EtcdReasonVoter      = "MemberNotLearner"
	EtcdReasonLearner    = "MemberIsLearner"
	EtcdReasonUnhealthy  = "Unhealthy"
	EtcdReasonNotAMember = "NotAMember"

	EtcdMessageVoter = "Node is a voting member of the etcd cluster"

	// EtcdRoleLabel marks a server that runs an etcd member (util.ETCDRoleLabelKey).
	EtcdRoleLabel = "node-role.kubernetes.io/etcd"
	// EtcdNodeNameAnnotation and EtcdNodeAddressAnnotation name the Node's member and its
	// address (NodeNameAnnotation, NodeAddressAnnotation).
	EtcdNodeNameAnnotation    = "etcd.k3s.cattle.io/node-name"
	EtcdNodeAddressAnnotation = "etcd.k3s.cattle.io/node-address"
)
