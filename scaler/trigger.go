package scaler

import (
	"time"

	"github.com/gpuscaler/gpuscaler/scaler/metadata"
)

// The trigger metadata gpuscaler reads, parsed by package metadata (where the parser and
// its fuzz target live, apart from the scaler's heavy dependencies), under the names the
// scaler has always given them.
type (
	// Trigger is one parsed trigger; see metadata.Trigger.
	Trigger = metadata.Trigger
	// MetricSpec is a metric a trigger gives and its per-replica target.
	MetricSpec = metadata.MetricSpec
	// MetadataError names the key, the value and what was expected.
	MetadataError = metadata.Error
)

// ErrInvalidMetadata reports trigger metadata gpuscaler cannot act on. The gRPC server
// answers it with InvalidArgument.
var ErrInvalidMetadata = metadata.ErrInvalid

// ParseTrigger parses a trigger's metadata for a ScaledObject in namespace; see
// metadata.ParseTrigger.
func ParseTrigger(namespace string, md map[string]string, defaultStaleAfter time.Duration) (*Trigger, error) {
	return metadata.ParseTrigger(namespace, md, defaultStaleAfter)
}

// Trigger-metadata keys; see package metadata.
const (
	KeyQueue                = metadata.KeyQueue
	KeyQueueTarget          = metadata.KeyQueueTarget
	KeyActivationQueueDepth = metadata.KeyActivationQueueDepth
	KeyPodSelector          = metadata.KeyPodSelector
	KeyGPUUtilTarget        = metadata.KeyGPUUtilTarget
	KeyActivationGPUUtil    = metadata.KeyActivationGPUUtil
	KeyGPUMemoryTarget      = metadata.KeyGPUMemoryTarget
	KeyGPUsPerReplica       = metadata.KeyGPUsPerReplica
	KeyTolerations          = metadata.KeyTolerations
	KeyCapacityAware        = metadata.KeyCapacityAware
	KeyCapacityHeadroom     = metadata.KeyCapacityHeadroom
	KeyMinReplicaCount      = metadata.KeyMinReplicaCount
	KeyNodeSelector         = metadata.KeyNodeSelector
	KeyStaleAfter           = metadata.KeyStaleAfter
	KeyStream               = metadata.KeyStream
	KeyConsumer             = metadata.KeyConsumer
	KeyTargetWait           = metadata.KeyTargetWait
	KeyConcurrency          = metadata.KeyConcurrency
	KeyColdStart            = metadata.KeyColdStart
	KeyScaleUpTolerance     = metadata.KeyScaleUpTolerance
	KeyPushInterval         = metadata.KeyPushInterval
	KeyCPUPerReplica        = metadata.KeyCPUPerReplica
	KeyMemoryPerReplica     = metadata.KeyMemoryPerReplica
)

// Defaults of the optional keys.
const (
	DefaultQueueTarget          = metadata.DefaultQueueTarget
	DefaultActivationQueueDepth = metadata.DefaultActivationQueueDepth
	DefaultActivationGPUUtil    = metadata.DefaultActivationGPUUtil
	DefaultStaleAfter           = metadata.DefaultStaleAfter
	DefaultPushInterval         = metadata.DefaultPushInterval
)

// Metric names, as GetMetricSpec returns them.
const (
	MetricQueueBacklog = metadata.MetricQueueBacklog
	MetricGPUUtil      = metadata.MetricGPUUtil
	MetricGPUMemory    = metadata.MetricGPUMemory
	MetricQueueDemand  = metadata.MetricQueueDemand
)
