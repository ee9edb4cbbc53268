package scaler

import (
	"fmt"
	"strings"

	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

// A node's report says which pods hold its GPUs. A compromised node could name any pod
// of any namespace: hold namespace b's pods at 100% and scale b to its maximum, or mark
// every pod's labels unknown and make every podSelector trigger Unavailable. With a
// PodDirectory, the scaler believes a node as the API server's NodeRestriction believes a
// kubelet: only of the pods the Kubernetes API places on that node. Every pod a report
// names is looked up; one the API does not place there (or whose uid differs) is dropped
// from the report and counted, and the labels podSelectors match are the API's, not the
// node's. A node's CPU and memory, which capacity weighs, are the API's too where it
// knows them. Without one (development, the demo, a scaler given no API access),
// reports are believed as they come.

// PodDirectory is what the Kubernetes API says of pods, kept up to date by a watch
// (scaler/kube). Its methods are called for every pod of every node report, and must
// not wait on the network; they are safe for concurrent use.
type PodDirectory interface {
	// Synced reports whether every pod has been listed once: until then Pod knows
	// nothing, and the triggers that read pods are Unavailable.
	Synced() bool
	// Pod returns what the API holds of pod namespace/name, and false when it holds no
	// such pod.
	Pod(namespace, name string) (APIPod, bool)
	// NodeResources returns node's allocatable CPU and memory and the requests of its
	// pods that have not finished, as the scheduler counts them; false while unknown,
	// and then the node's own report counts.
	NodeResources(node string) (*gpuscalerv1.NodeResources, bool)
}

// APIPod is what the scaler takes from the Kubernetes API of a pod.
type APIPod struct {
	UID string
	// Node is the node the pod is bound to (spec.nodeName); empty while unscheduled.
	Node string
	// Labels are the pod's labels, which podSelectors match. The caller must not
	// change them.
	Labels map[string]string
}

// Reasons a pod a node claims is dropped from its report, the values of the metric's
// reason label.
const (
	// ClaimUnknownPod: the API has no pod of that namespace and name (made up, deleted,
	// or created a moment ago and not yet seen by the scaler's watch).
	ClaimUnknownPod = "unknown_pod"
	// ClaimOtherNode: the API places the pod on another node, or on none.
	ClaimOtherNode = "other_node"
	// ClaimOtherUID: the report gives the pod a uid other than the API's: another pod
	// of the same name, deleted since.
	ClaimOtherUID = "other_uid"
)

// DroppedClaim is a pod a node's report named that the Kubernetes API does not place
// on that node.
type DroppedClaim struct {
	Node, Namespace, Pod string
	// Reason is one of ClaimUnknownPod, ClaimOtherNode, ClaimOtherUID.
	Reason string
	// APINode is the node the API places the pod on, for ClaimOtherNode.
	APINode string
}

// SetPodDirectory makes the state believe a node's reports only of the pods dir places
// on that node, with dir's labels, and tell onDropped (nil: no one) of every pod it
// drops, on the goroutine that applied the report, without the state's lock. Set it
// before the first report is applied; nil believes reports as they come (the default).
func (s *State) SetPodDirectory(dir PodDirectory, onDropped func(DroppedClaim)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pods, s.onDropped = dir, onDropped
}

// ChecksPodClaims reports whether the state checks the pods nodes claim against the
// Kubernetes API, and whether its view of the API is synced.
func (s *State) ChecksPodClaims() (checks, synced bool) {
	s.mu.RLock()
	dir := s.pods
	s.mu.RUnlock()
	if dir == nil {
		return false, false
	}
	return true, dir.Synced()
}

// podsKnown fails with ErrUnavailable while the pods' directory has not listed every
// pod once: which pods run where is unknown, and a trigger that reads pods must not
// answer from what the nodes alone say. s.mu must be held.
func (s *State) podsKnown(what string) error {
	if s.pods == nil || s.pods.Synced() {
		return nil
	}
	return fmt.Errorf("%w: %sthe scaler has not yet listed the cluster's pods from the Kubernetes API, which says what pods each node may report; is the API server reachable, and may the scaler's service account list and watch pods?",
		ErrUnavailable, what)
}

// claimCheck judges the pods one node's report claims. Its zero value, and a check
// without a directory, believes every claim.
type claimCheck struct {
	node   string
	pods   PodDirectory
	synced bool
	// dropped collects the claims dropped, told to onDropped once the report is applied.
	dropped []DroppedClaim
}

// check returns whether the pod claim p is believed, and with what labels. Before the
// directory has synced every claim stands, its labels unknown: the namespaces it names
// are Unavailable until the node's first report after the sync replaces it.
func (c *claimCheck) check(p *gpuscalerv1.PodRef) (labels map[string]string, unknown, ok bool) {
	if c.pods == nil {
		return p.GetLabels(), p.GetLabelsUnknown(), true
	}
	if !c.synced {
		return nil, true, true
	}
	api, found := c.pods.Pod(p.GetNamespace(), p.GetName())
	d := DroppedClaim{Node: c.node, Namespace: p.GetNamespace(), Pod: p.GetName()}
	switch {
	case !found:
		d.Reason = ClaimUnknownPod
	case api.Node != c.node:
		d.Reason, d.APINode = ClaimOtherNode, api.Node
	case p.GetUid() != "" && p.GetUid() != api.UID:
		d.Reason = ClaimOtherUID
	default:
		return api.Labels, false, true
	}
	// Copied: the report's strings point into a message the decoder reuses.
	d.Node, d.Namespace, d.Pod = strings.Clone(d.Node), strings.Clone(d.Namespace), strings.Clone(d.Pod)
	c.dropped = append(c.dropped, d)
	return nil, false, false
}
