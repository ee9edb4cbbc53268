package metadata

import (
	"errors"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/labels"

	gpuscalerv1 "github.com/gpuscaler/gpuscaler/proto/gpuscaler/v1"
)

// triggerView is a Trigger with its selectors written out, so that two triggers compare
// with == and print readably.
type triggerView struct {
	Namespace            string
	Queue                string
	QueueTarget          float64
	ActivationQueueDepth float64
	PodSelector          string
	GPUUtilTarget        float64
	ActivationGPUUtil    float64
	GPUMemoryTarget      float64
	GPUsPerReplica       int
	GPUProfile           string
	CapacityAware        bool
	CapacityHeadroom     int
	MinReplicaCount      int
	NodeSelector         string
	Tolerations          string
	CPUPerReplica        int64
	MemoryPerReplica     int64
	StaleAfter           time.Duration
	Stream               string
	Consumer             string
	TargetWait           time.Duration
	Concurrency          int
	ColdStart            time.Duration
	ScaleUpTolerance     float64
	PushInterval         time.Duration
}

// noSelector is how triggerView writes a nil selector.
const noSelector = "<nil>"

func selectorString(s labels.Selector) string {
	if s == nil {
		return noSelector
	}
	return s.String()
}

func viewOf(tr *Trigger) triggerView {
	return triggerView{
		Namespace:            tr.Namespace,
		Queue:                tr.Queue,
		QueueTarget:          tr.QueueTarget,
		ActivationQueueDepth: tr.ActivationQueueDepth,
		PodSelector:          selectorString(tr.PodSelector),
		GPUUtilTarget:        tr.GPUUtilTarget,
		ActivationGPUUtil:    tr.ActivationGPUUtil,
		GPUMemoryTarget:      tr.GPUMemoryTarget,
		GPUsPerReplica:       tr.GPUsPerReplica,
		GPUProfile:           tr.GPUProfile,
		CapacityAware:        tr.CapacityAware,
		CapacityHeadroom:     tr.CapacityHeadroom,
		MinReplicaCount:      tr.MinReplicaCount,
		NodeSelector:         selectorString(tr.NodeSelector),
		Tolerations:          FormatTolerations(tr.Tolerations),
		CPUPerReplica:        tr.CPUPerReplica,
		MemoryPerReplica:     tr.MemoryPerReplica,
		StaleAfter:           tr.StaleAfter,
		Stream:               tr.Stream,
		Consumer:             tr.Consumer,
		TargetWait:           tr.TargetWait,
		Concurrency:          tr.Concurrency,
		ColdStart:            tr.ColdStart,
		ScaleUpTolerance:     tr.ScaleUpTolerance,
		PushInterval:         tr.PushInterval,
	}
}

// defaultView is what a trigger in namespace "ml" holds for every key it does not give.
func defaultView() triggerView {
	return triggerView{
		Namespace:            "ml",
		QueueTarget:          DefaultQueueTarget,
		ActivationQueueDepth: DefaultActivationQueueDepth,
		PodSelector:          noSelector,
		ActivationGPUUtil:    DefaultActivationGPUUtil,
		NodeSelector:         noSelector,
		StaleAfter:           DefaultStaleAfter,
		Concurrency:          1,
		ScaleUpTolerance:     0.1,
		PushInterval:         DefaultPushInterval,
	}
}

// md builds metadata from key, value pairs.
func metaOf(kv ...string) map[string]string {
	if len(kv)%2 != 0 {
		panic("md: odd number of arguments")
	}
	m := make(map[string]string, len(kv)/2)
	for i := 0; i < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

// with returns a copy of base with the pairs kv added.
func metaWith(base map[string]string, kv ...string) map[string]string {
	m := metaOf(kv...)
	for k, v := range base {
		if _, ok := m[k]; !ok {
			m[k] = v
		}
	}
	return m
}

// Minimal valid triggers, to which a case adds the key it tests.
var (
	baseQueue    = metaOf(KeyQueue, "jobs")
	baseGPU      = metaOf(KeyPodSelector, "app=llm", KeyGPUUtilTarget, "70")
	baseStream   = metaOf(KeyStream, "WORK", KeyConsumer, "workers")
	baseCapacity = metaOf(KeyQueue, "jobs", KeyCapacityAware, "true", KeyGPUsPerReplica, "1")
)

// parseOK parses metadata that must be valid.
func parseOK(t *testing.T, ns string, metadata map[string]string, defaultStaleAfter time.Duration) *Trigger {
	t.Helper()
	tr, err := ParseTrigger(ns, metadata, defaultStaleAfter)
	if err != nil {
		t.Fatalf("ParseTrigger(%q, %q, %v): got error %v, want none", ns, metadata, defaultStaleAfter, err)
	}
	if tr == nil {
		t.Fatalf("ParseTrigger(%q, %q, %v): got nil trigger and nil error, want a trigger", ns, metadata, defaultStaleAfter)
	}
	return tr
}

// parseErr parses metadata that must be rejected and checks the error names key and
// value, and that its Want holds each of wantContains.
func parseErr(t *testing.T, ns string, metadata map[string]string, key, value string, wantContains ...string) *Error {
	t.Helper()
	tr, err := ParseTrigger(ns, metadata, 0)
	if err == nil {
		if tr == nil {
			t.Fatalf("ParseTrigger(%q, %q): got nil trigger and nil error, want an error naming %s=%q", ns, metadata, key, value)
		}
		t.Fatalf("ParseTrigger(%q, %q): got trigger %+v, want an error naming %s=%q", ns, metadata, viewOf(tr), key, value)
	}
	if tr != nil {
		t.Errorf("ParseTrigger(%q, %q): got trigger %+v with error %v, want nil trigger", ns, metadata, viewOf(tr), err)
	}
	return checkMetadataError(t, err, key, value, wantContains...)
}

// checkMetadataError checks err is a *Error matching ErrInvalid that
// names key and value.
func checkMetadataError(t *testing.T, err error, key, value string, wantContains ...string) *Error {
	t.Helper()
	if !errors.Is(err, ErrInvalid) {
		t.Errorf("errors.Is(%v, ErrInvalid): got false, want true", err)
	}
	var me *Error
	if !errors.As(err, &me) {
		t.Fatalf("errors.As(%v, *Error): got false (%T), want true", err, err)
	}
	if me.Key != key {
		t.Errorf("Error.Key: got %q, want %q (error %v)", me.Key, key, err)
	}
	if me.Value != value {
		t.Errorf("Error.Value: got %q, want %q (error %v)", me.Value, value, err)
	}
	if me.Want == "" {
		t.Errorf("Error.Want: got empty, want what was expected (error %v)", err)
	}
	for _, s := range wantContains {
		if !strings.Contains(me.Want, s) {
			t.Errorf("Error.Want: got %q, want it to contain %q", me.Want, s)
		}
	}
	return me
}

func TestParseTriggerDefaults(t *testing.T) {
	tests := map[string]struct {
		metadata          map[string]string
		defaultStaleAfter time.Duration
		want              func(v *triggerView)
	}{
		"queue only, no default staleAfter": {
			metadata: baseQueue,
			want:     func(v *triggerView) { v.Queue = "jobs" },
		},
		"queue only, server staleAfter 45s": {
			metadata:          baseQueue,
			defaultStaleAfter: 45 * time.Second,
			want:              func(v *triggerView) { v.Queue = "jobs"; v.StaleAfter = 45 * time.Second },
		},
		"queue only, negative server staleAfter": {
			metadata:          baseQueue,
			defaultStaleAfter: -time.Second,
			want:              func(v *triggerView) { v.Queue = "jobs" },
		},
		"trigger staleAfter beats server staleAfter": {
			metadata:          metaWith(baseQueue, KeyStaleAfter, "2m"),
			defaultStaleAfter: 45 * time.Second,
			want:              func(v *triggerView) { v.Queue = "jobs"; v.StaleAfter = 2 * time.Minute },
		},
		"gpu only": {
			metadata: baseGPU,
			want:     func(v *triggerView) { v.PodSelector = "app=llm"; v.GPUUtilTarget = 70 },
		},
		"stream only": {
			metadata: baseStream,
			want:     func(v *triggerView) { v.Stream = "WORK"; v.Consumer = "workers" },
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			want := defaultView()
			tc.want(&want)
			got := viewOf(parseOK(t, "ml", tc.metadata, tc.defaultStaleAfter))
			if got != want {
				t.Errorf("ParseTrigger(%q):\ngot  %+v\nwant %+v", tc.metadata, got, want)
			}
		})
	}
}

func TestParseTriggerValidValues(t *testing.T) {
	queue := func(v *triggerView) { v.Queue = "jobs" }
	gpu := func(v *triggerView) { v.PodSelector = "app=llm"; v.GPUUtilTarget = 70 }
	capacity := func(v *triggerView) { v.Queue = "jobs"; v.CapacityAware = true; v.GPUsPerReplica = 1 }
	tests := map[string]struct {
		metadata map[string]string
		base     func(v *triggerView)
		want     func(v *triggerView)
	}{
		"queue with dash and underscore": {metaOf(KeyQueue, "llm-jobs_v2"), nil, func(v *triggerView) { v.Queue = "llm-jobs_v2" }},
		"queue with slash and colon":     {metaOf(KeyQueue, "team/a:b"), nil, func(v *triggerView) { v.Queue = "team/a:b" }},
		"queue of 256 bytes": {metaOf(KeyQueue, strings.Repeat("q", gpuscalerv1.MaxQueueNameLen)), nil, func(v *triggerView) {
			v.Queue = strings.Repeat("q", gpuscalerv1.MaxQueueNameLen)
		}},

		"queueTarget integer":           {metaWith(baseQueue, KeyQueueTarget, "5"), queue, func(v *triggerView) { v.QueueTarget = 5 }},
		"queueTarget fraction":          {metaWith(baseQueue, KeyQueueTarget, "0.5"), queue, func(v *triggerView) { v.QueueTarget = 0.5 }},
		"queueTarget exponent":          {metaWith(baseQueue, KeyQueueTarget, "1e3"), queue, func(v *triggerView) { v.QueueTarget = 1000 }},
		"queueTarget with white space":  {metaWith(baseQueue, KeyQueueTarget, " 8 "), queue, func(v *triggerView) { v.QueueTarget = 8 }},
		"activationQueueDepth zero":     {metaWith(baseQueue, KeyActivationQueueDepth, "0"), queue, func(v *triggerView) {}},
		"activationQueueDepth positive": {metaWith(baseQueue, KeyActivationQueueDepth, "10"), queue, func(v *triggerView) { v.ActivationQueueDepth = 10 }},
		"activationQueueDepth fraction": {metaWith(baseQueue, KeyActivationQueueDepth, "2.5"), queue, func(v *triggerView) { v.ActivationQueueDepth = 2.5 }},

		"targetWait":                 {metaWith(baseQueue, KeyTargetWait, "30s"), queue, func(v *triggerView) { v.TargetWait = 30 * time.Second }},
		"targetWait, minutes":        {metaWith(baseQueue, KeyTargetWait, " 2m "), queue, func(v *triggerView) { v.TargetWait = 2 * time.Minute }},
		"targetWait, concurrency":    {metaWith(baseQueue, KeyTargetWait, "10s", KeyConcurrency, "8"), queue, func(v *triggerView) { v.TargetWait = 10 * time.Second; v.Concurrency = 8 }},
		"targetWait, coldStart":      {metaWith(baseQueue, KeyTargetWait, "10s", KeyColdStart, " 45s "), queue, func(v *triggerView) { v.TargetWait = 10 * time.Second; v.ColdStart = 45 * time.Second }},
		"coldStart, the bounds":      {metaWith(baseQueue, KeyTargetWait, "10s", KeyColdStart, "1h"), queue, func(v *triggerView) { v.TargetWait = 10 * time.Second; v.ColdStart = time.Hour }},
		"scaleUpTolerance":           {metaWith(baseQueue, KeyTargetWait, "10s", KeyScaleUpTolerance, " 0.05 "), queue, func(v *triggerView) { v.TargetWait = 10 * time.Second; v.ScaleUpTolerance = 0.05 }},
		"scaleUpTolerance, exponent": {metaWith(baseQueue, KeyTargetWait, "10s", KeyScaleUpTolerance, "1e-1"), queue, func(v *triggerView) { v.TargetWait = 10 * time.Second; v.ScaleUpTolerance = 0.1 }},
		"scaleUpTolerance, milli":    {metaWith(baseQueue, KeyTargetWait, "10s", KeyScaleUpTolerance, "50m"), queue, func(v *triggerView) { v.TargetWait = 10 * time.Second; v.ScaleUpTolerance = 0.05 }},
		"scaleUpTolerance, none":     {metaWith(baseQueue, KeyTargetWait, "10s", KeyScaleUpTolerance, "0"), queue, func(v *triggerView) { v.TargetWait = 10 * time.Second; v.ScaleUpTolerance = 0 }},
		"scaleUpTolerance, the most": {metaWith(baseQueue, KeyTargetWait, "10s", KeyScaleUpTolerance, "1"), queue, func(v *triggerView) {
			v.TargetWait = 10 * time.Second
			v.ScaleUpTolerance = 1
		}},

		"podSelector set-based": {metaOf(KeyPodSelector, "tier in (gpu,cpu)", KeyGPUUtilTarget, "70"), nil, func(v *triggerView) {
			v.PodSelector = "tier in (cpu,gpu)"
			v.GPUUtilTarget = 70
		}},
		"podSelector two requirements": {metaOf(KeyPodSelector, "app=llm,tier!=cpu", KeyGPUUtilTarget, "70"), nil, func(v *triggerView) {
			v.PodSelector = "app=llm,tier!=cpu"
			v.GPUUtilTarget = 70
		}},
		"podSelector exists": {metaOf(KeyPodSelector, "gpu", KeyGPUMemoryTarget, "50"), nil, func(v *triggerView) {
			v.PodSelector = "gpu"
			v.GPUMemoryTarget = 50
		}},

		"gpuUtilTarget 100":      {metaWith(baseGPU, KeyGPUUtilTarget, "100"), gpu, func(v *triggerView) { v.GPUUtilTarget = 100 }},
		"gpuUtilTarget fraction": {metaWith(baseGPU, KeyGPUUtilTarget, "0.5"), gpu, func(v *triggerView) { v.GPUUtilTarget = 0.5 }},
		"activationGpuUtil 0":    {metaWith(baseGPU, KeyQueue, "jobs", KeyActivationGPUUtil, "0"), gpu, func(v *triggerView) { v.Queue = "jobs" }},
		"activationGpuUtil 10":   {metaWith(baseGPU, KeyQueue, "jobs", KeyActivationGPUUtil, "10"), gpu, func(v *triggerView) { v.Queue, v.ActivationGPUUtil = "jobs", 10 }},
		"activationGpuUtil 100":  {metaWith(baseGPU, KeyQueue, "jobs", KeyActivationGPUUtil, "100"), gpu, func(v *triggerView) { v.Queue, v.ActivationGPUUtil = "jobs", 100 }},
		"gpuMemoryTarget 80":     {metaWith(baseGPU, KeyGPUMemoryTarget, "80"), gpu, func(v *triggerView) { v.GPUMemoryTarget = 80 }},
		"gpuMemoryTarget 100":    {metaWith(baseGPU, KeyGPUMemoryTarget, "100"), gpu, func(v *triggerView) { v.GPUMemoryTarget = 100 }},
		"gpuMemoryTarget alone": {metaOf(KeyPodSelector, "app=llm", KeyGPUMemoryTarget, "80"), nil, func(v *triggerView) {
			v.PodSelector = "app=llm"
			v.GPUMemoryTarget = 80
		}},

		"gpusPerReplica 1":             {metaWith(baseGPU, KeyGPUsPerReplica, "1"), gpu, func(v *triggerView) { v.GPUsPerReplica = 1 }},
		"gpusPerReplica 8":             {metaWith(baseGPU, KeyGPUsPerReplica, "8"), gpu, func(v *triggerView) { v.GPUsPerReplica = 8 }},
		"gpusPerReplica 1024":          {metaWith(baseGPU, KeyGPUsPerReplica, "1024"), gpu, func(v *triggerView) { v.GPUsPerReplica = 1024 }},
		"gpusPerReplica white space":   {metaWith(baseGPU, KeyGPUsPerReplica, " 2 "), gpu, func(v *triggerView) { v.GPUsPerReplica = 2 }},
		"gpusPerReplica with capacity": {metaWith(baseCapacity, KeyGPUsPerReplica, "4"), capacity, func(v *triggerView) { v.GPUsPerReplica = 4 }},
		"MIG 1g.10gb": {metaWith(baseGPU, KeyGPUsPerReplica, "1g.10gb"), gpu, func(v *triggerView) {
			v.GPUsPerReplica, v.GPUProfile = 1, "1g.10gb"
		}},
		"MIG 3g.40gb": {metaWith(baseGPU, KeyGPUsPerReplica, "3g.40gb"), gpu, func(v *triggerView) {
			v.GPUsPerReplica, v.GPUProfile = 1, "3g.40gb"
		}},
		"MIG 1g.10gb+me": {metaWith(baseGPU, KeyGPUsPerReplica, "1g.10gb+me"), gpu, func(v *triggerView) {
			v.GPUsPerReplica, v.GPUProfile = 1, "1g.10gb+me"
		}},
		"MIG 1c.3g.40gb": {metaWith(baseGPU, KeyGPUsPerReplica, "1c.3g.40gb"), gpu, func(v *triggerView) {
			v.GPUsPerReplica, v.GPUProfile = 1, "1c.3g.40gb"
		}},
		"MIG with white space": {metaWith(baseGPU, KeyGPUsPerReplica, " 7g.80gb "), gpu, func(v *triggerView) {
			v.GPUsPerReplica, v.GPUProfile = 1, "7g.80gb"
		}},

		"capacityAware true":   {baseCapacity, nil, capacity},
		"capacityAware 1":      {metaWith(baseCapacity, KeyCapacityAware, "1"), nil, capacity},
		"capacityAware TRUE":   {metaWith(baseCapacity, KeyCapacityAware, "TRUE"), nil, capacity},
		"capacityAware false":  {metaWith(baseQueue, KeyCapacityAware, "false"), queue, func(v *triggerView) {}},
		"capacityHeadroom 0":   {metaWith(baseCapacity, KeyCapacityHeadroom, "0"), nil, capacity},
		"capacityHeadroom 3":   {metaWith(baseCapacity, KeyCapacityHeadroom, " 3 "), nil, func(v *triggerView) { capacity(v); v.CapacityHeadroom = 3 }},
		"capacityHeadroom 1e6": {metaWith(baseCapacity, KeyCapacityHeadroom, "1000000"), nil, func(v *triggerView) { capacity(v); v.CapacityHeadroom = 1_000_000 }},
		"minReplicaCount 0":    {metaWith(baseCapacity, KeyMinReplicaCount, "0"), nil, capacity},
		"minReplicaCount 2":    {metaWith(baseCapacity, KeyMinReplicaCount, " 2 "), nil, func(v *triggerView) { capacity(v); v.MinReplicaCount = 2 }},
		"minReplicaCount 1e6":  {metaWith(baseCapacity, KeyMinReplicaCount, "1000000"), nil, func(v *triggerView) { capacity(v); v.MinReplicaCount = 1_000_000 }},
		"capacityAware with podSelector": {metaWith(baseCapacity, KeyPodSelector, "scaledjob.keda.sh/name=trainer"), nil, func(v *triggerView) {
			capacity(v)
			v.PodSelector = "scaledjob.keda.sh/name=trainer"
		}},
		"capacityAware false without queue": {metaWith(baseGPU, KeyCapacityAware, "false"), gpu, func(v *triggerView) {}},
		"capacityAware with stream": {metaWith(baseStream, KeyCapacityAware, "true", KeyGPUsPerReplica, "8"), nil, func(v *triggerView) {
			v.Stream, v.Consumer, v.CapacityAware, v.GPUsPerReplica = "WORK", "workers", true, 8
		}},
		"capacityAware with a MIG profile": {metaWith(baseCapacity, KeyGPUsPerReplica, "1g.10gb"), capacity, func(v *triggerView) {
			v.GPUProfile = "1g.10gb"
		}},
		"nodeSelector": {metaWith(baseCapacity, KeyNodeSelector, "gpu=a100"), capacity, func(v *triggerView) { v.NodeSelector = "gpu=a100" }},
		"nodeSelector set-based": {metaWith(baseCapacity, KeyNodeSelector, "gpu in (a100,h100)"), capacity, func(v *triggerView) {
			v.NodeSelector = "gpu in (a100,h100)"
		}},
		"tolerations": {metaWith(baseCapacity, KeyTolerations, "dedicated=ml:NoSchedule, nvidia.com/gpu:NoSchedule"), capacity, func(v *triggerView) {
			v.Tolerations = "dedicated=ml:NoSchedule,nvidia.com/gpu:NoSchedule"
		}},
		"tolerations of every taint": {metaWith(baseCapacity, KeyTolerations, "*"), capacity, func(v *triggerView) { v.Tolerations = "*" }},
		"cpuPerReplica cores":        {metaWith(baseCapacity, KeyCPUPerReplica, "8"), capacity, func(v *triggerView) { v.CPUPerReplica = 8000 }},
		"cpuPerReplica millicores":   {metaWith(baseCapacity, KeyCPUPerReplica, " 500m "), capacity, func(v *triggerView) { v.CPUPerReplica = 500 }},
		"cpuPerReplica fraction":     {metaWith(baseCapacity, KeyCPUPerReplica, "1.5"), capacity, func(v *triggerView) { v.CPUPerReplica = 1500 }},
		// The scheduler rounds a request up to whole millicores (Quantity.MilliValue).
		"cpuPerReplica below a millicore": {metaWith(baseCapacity, KeyCPUPerReplica, "100u"), capacity, func(v *triggerView) { v.CPUPerReplica = 1 }},
		"memoryPerReplica Gi":             {metaWith(baseCapacity, KeyMemoryPerReplica, "64Gi"), capacity, func(v *triggerView) { v.MemoryPerReplica = 64 << 30 }},
		"memoryPerReplica G":              {metaWith(baseCapacity, KeyMemoryPerReplica, "500M"), capacity, func(v *triggerView) { v.MemoryPerReplica = 500_000_000 }},
		"memoryPerReplica bytes":          {metaWith(baseCapacity, KeyMemoryPerReplica, "1e9"), capacity, func(v *triggerView) { v.MemoryPerReplica = 1_000_000_000 }},
		"cpu and memory per replica": {metaWith(baseCapacity, KeyCPUPerReplica, "16", KeyMemoryPerReplica, "1Ti"), capacity, func(v *triggerView) {
			v.CPUPerReplica, v.MemoryPerReplica = 16_000, 1<<40
		}},

		"staleAfter 1s":          {metaWith(baseQueue, KeyStaleAfter, "1s"), queue, func(v *triggerView) { v.StaleAfter = time.Second }},
		"staleAfter 2m":          {metaWith(baseQueue, KeyStaleAfter, "2m"), queue, func(v *triggerView) { v.StaleAfter = 2 * time.Minute }},
		"staleAfter 1m30s":       {metaWith(baseQueue, KeyStaleAfter, "1m30s"), queue, func(v *triggerView) { v.StaleAfter = 90 * time.Second }},
		"staleAfter 1500ms":      {metaWith(baseQueue, KeyStaleAfter, "1500ms"), queue, func(v *triggerView) { v.StaleAfter = 1500 * time.Millisecond }},
		"staleAfter white space": {metaWith(baseQueue, KeyStaleAfter, " 10s "), queue, func(v *triggerView) { v.StaleAfter = 10 * time.Second }},

		"pushInterval 0s":  {metaWith(baseQueue, KeyPushInterval, "0s"), queue, func(v *triggerView) { v.PushInterval = 0 }},
		"pushInterval 0":   {metaWith(baseQueue, KeyPushInterval, "0"), queue, func(v *triggerView) { v.PushInterval = 0 }},
		"pushInterval 2m":  {metaWith(baseQueue, KeyPushInterval, "2m"), queue, func(v *triggerView) { v.PushInterval = 2 * time.Minute }},
		"pushInterval 24h": {metaWith(baseQueue, KeyPushInterval, "24h"), queue, func(v *triggerView) { v.PushInterval = 24 * time.Hour }},
		"pushInterval with stream": {metaWith(baseStream, KeyPushInterval, "5s"), nil, func(v *triggerView) {
			v.Stream, v.Consumer, v.PushInterval = "WORK", "workers", 5*time.Second
		}},

		"stream and consumer": {metaOf(KeyStream, "ORDERS", KeyConsumer, "worker-1"), nil, func(v *triggerView) {
			v.Stream, v.Consumer = "ORDERS", "worker-1"
		}},
		"stream and consumer with underscore and colon": {metaOf(KeyStream, "my_stream", KeyConsumer, "c:1"), nil, func(v *triggerView) {
			v.Stream, v.Consumer = "my_stream", "c:1"
		}},
		"stream of 255 bytes": {metaOf(KeyStream, strings.Repeat("S", 255), KeyConsumer, "c"), nil, func(v *triggerView) {
			v.Stream, v.Consumer = strings.Repeat("S", 255), "c"
		}},
		"stream with pods": {metaWith(baseStream, KeyPodSelector, "app=llm", KeyGPUUtilTarget, "70"), gpu, func(v *triggerView) {
			v.Stream, v.Consumer = "WORK", "workers"
		}},

		"everything a ScaledObject trigger takes": {
			metaOf(KeyQueue, "jobs", KeyQueueTarget, "4", KeyActivationQueueDepth, "2",
				KeyPodSelector, "app=llm", KeyGPUUtilTarget, "75", KeyActivationGPUUtil, "5", KeyGPUMemoryTarget, "90",
				KeyGPUsPerReplica, "2", KeyStaleAfter, "1m"),
			nil,
			func(v *triggerView) {
				*v = triggerView{
					Namespace: "ml", Queue: "jobs", QueueTarget: 4, ActivationQueueDepth: 2,
					PodSelector: "app=llm", GPUUtilTarget: 75, ActivationGPUUtil: 5, GPUMemoryTarget: 90,
					GPUsPerReplica: 2, NodeSelector: noSelector, StaleAfter: time.Minute, Concurrency: 1, ScaleUpTolerance: 0.1, PushInterval: DefaultPushInterval,
				}
			},
		},
		"everything a capacity-aware ScaledJob trigger takes": {
			metaOf(KeyQueue, "jobs", KeyQueueTarget, "4", KeyGPUsPerReplica, "2",
				KeyCapacityAware, "true", KeyNodeSelector, "pool=gpu", KeyStaleAfter, "1m"),
			nil,
			func(v *triggerView) {
				*v = triggerView{
					Namespace: "ml", Queue: "jobs", QueueTarget: 4, PodSelector: noSelector, GPUsPerReplica: 2,
					CapacityAware: true, NodeSelector: "pool=gpu", StaleAfter: time.Minute, Concurrency: 1, ScaleUpTolerance: 0.1, PushInterval: DefaultPushInterval,
				}
			},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			want := defaultView()
			if tc.base != nil {
				tc.base(&want)
			}
			tc.want(&want)
			got := viewOf(parseOK(t, "ml", tc.metadata, 0))
			if got != want {
				t.Errorf("ParseTrigger(%q):\ngot  %+v\nwant %+v", tc.metadata, got, want)
			}
		})
	}
}

func TestParseTriggerInvalidValues(t *testing.T) {
	type invalid struct {
		metadata map[string]string
		key      string // the key the error must name; its value is metadata[key]
		want     string // part of Error.Want
	}
	tests := map[string]invalid{}
	add := func(base map[string]string, key, want string, values ...string) {
		for _, v := range values {
			tests[key+"="+caseName(v)] = invalid{metaWith(base, key, v), key, want}
		}
	}
	queueWant := "a queue name"
	add(nil, KeyQueue, queueWant, "", "a.b", ".", "jobs*", "*", "jobs>", ">", "my jobs", " jobs", "jobs\t", "jobs\n",
		"jobs\u00a0x", "jobs\x00", "jobs\x7f", "\xff\xfe", strings.Repeat("q", gpuscalerv1.MaxQueueNameLen+1))

	// Hexadecimal floats are numbers to strconv, not to a person writing metadata. KEDA
	// hands targets to the HPA in milli-units, so below 0.001 a target would become 0.
	numbers := []string{"abc", "", " ", "1,5", "0x", "NaN", "nan", "Inf", "+Inf", "-Inf", "infinity", "1e400", "-1e400", "0x1p-2", "0x10", "1_000"}
	add(baseQueue, KeyQueueTarget, "a number from 0.001 to 1e15", slices.Concat(numbers, []string{"-1", "-0.5", "0", "-0", "0.0", "1e-400", "0.0001", "5e-324", "1e300", "2e15"})...)
	add(baseQueue, KeyActivationQueueDepth, "a number from 0 to 1e15", slices.Concat(numbers, []string{"-1", "-0.001", "1e16"})...)
	add(baseGPU, KeyGPUUtilTarget, "a percentage from 0.001 to 100", slices.Concat(numbers, []string{"-5", "0", "0.0001", "100.5", "101", "1e3"})...)
	add(baseGPU, KeyActivationGPUUtil, "a percentage from 0 to 100", slices.Concat(numbers, []string{"-1", "100.01", "200"})...)
	add(baseGPU, KeyGPUMemoryTarget, "a percentage from 0.001 to 100", slices.Concat(numbers, []string{"-5", "0", "0.0009", "100.5", "101"})...)

	add(metaOf(KeyGPUUtilTarget, "70"), KeyPodSelector, "a non-empty Kubernetes label selector", "", " ", "\t", "\x00", "\x00app=llm", "app=llm\x00", "app=llm\x1b")
	add(metaOf(KeyGPUUtilTarget, "70"), KeyPodSelector, "a Kubernetes label selector", ",", "app in (", "app==(", "!!", "a b", "app=-bad-", "x=y,")
	add(baseCapacity, KeyNodeSelector, "a non-empty Kubernetes label selector", "", "  ")
	add(baseCapacity, KeyNodeSelector, "a Kubernetes label selector", "gpu in (", "=a100", "gpu=a100,")

	add(baseCapacity, KeyTolerations, "comma-separated tolerations", "", " ", "a,", "a:noschedule", "*=x", "a b", "a=b:c:NoSchedule", "-a")

	add(baseGPU, KeyGPUsPerReplica, "a whole number of GPUs from 1 to 1024", "0", "-1", "1025", "99999999999999999999", "abc", "", "1.5", "2e0",
		"1g", "10gb", "1G.10GB", "g.10gb", "1g.gb", "1g.10gb+", "1g.10gb+ME", "1g.10gb.", "mig-1g.10gb", "1c.1c.3g.40gb",
		"0g.0gb", "00g.000gb+x", "1g.0gb", "0c.1g.5gb")

	add(baseQueue, KeyCapacityAware, `"true" or "false"`, "yes", "no", "on", "maybe", "", "2")
	add(baseCapacity, KeyCapacityHeadroom, "a whole number from 0 to 1000000", "-1", "1.5", "abc", "", "1000001", "0x2", "1e3")
	add(baseCapacity, KeyMinReplicaCount, "a whole number from 0 to 1000000", "-1", "1.5", "abc", "", "1000001", "0x2", "1e3")
	add(baseCapacity, KeyCPUPerReplica, "a Kubernetes quantity of CPU from 1m to 1048576", "", " ", "0", "0m", "-1", "-500m", "abc", "8 cores", "1Ki2", "1048577", "2Mi", "1e7", "NaN", "Inf")
	add(baseCapacity, KeyMemoryPerReplica, "a Kubernetes quantity of memory from 1 byte to 1Pi", "", " ", "0", "-1Gi", "64GB", "64 Gi", "abc", "1025Ti", "2Pi", "1e16", "NaN")
	add(baseQueue, KeyTargetWait, "a duration from 10ms to 24h", "0s", "-5s", "9ms", "30", "abc", "", "25h")
	add(metaWith(baseQueue, KeyTargetWait, "30s"), KeyConcurrency, "a whole number from 1 to 1000000", "0", "-1", "1.5", "abc", "", "1000001")
	add(metaWith(baseQueue, KeyTargetWait, "30s"), KeyColdStart, "a duration from 1s to 1h", "0s", "999ms", "-5s", "45", "abc", "", "1h1s", "9999999999h", "NaNs")
	add(metaWith(baseQueue, KeyTargetWait, "30s"), KeyScaleUpTolerance, "a share from 0 to 1", "-0.1", "-50m", "1.01", "1001m", "2", "10%", "0.1 0.2", "abc", "", "NaN", "Inf", "0x1p-3", "1Ki")

	add(baseQueue, KeyPushInterval, "a duration from 0s to 24h", "-1s", "30", "abc", "", "1d", "24h1s", "9999999999h")
	add(baseQueue, KeyStaleAfter, "a duration from 1s to 24h", "999ms", "0s", "0", "-5s", "30", "abc", "", "1d", "1ns", "9999999999h", "24h1s", "2562047h")

	jsNames := []string{"", "a.b", "a/b", `a\b`, "a b", " a", "a\t", "a\n", "a*", "a>", "a\x00", "a\x7f", strings.Repeat("n", 256)}
	for _, v := range jsNames {
		tests["stream="+caseName(v)] = invalid{metaOf(KeyStream, v, KeyConsumer, "workers"), KeyStream, "a JetStream stream name"}
		tests["consumer="+caseName(v)] = invalid{metaOf(KeyStream, "WORK", KeyConsumer, v), KeyConsumer, "a JetStream consumer name"}
	}

	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			parseErr(t, "ml", tc.metadata, tc.key, tc.metadata[tc.key], tc.want)
		})
	}
}

// caseName quotes a test value for a subtest name, shortening long ones.
func caseName(s string) string {
	if len(s) > 20 {
		return strconv.Quote(s[:3]) + "…(" + strconv.Itoa(len(s)) + " bytes)"
	}
	return strconv.Quote(s)
}

// TestParseTriggerCoversEveryKey keeps the tables above honest: every known key has valid
// and invalid cases there, and this checks the list of keys is the one they cover.
func TestParseTriggerCoversEveryKey(t *testing.T) {
	covered := []string{
		KeyQueue, KeyQueueTarget, KeyActivationQueueDepth, KeyPodSelector, KeyGPUUtilTarget, KeyActivationGPUUtil,
		KeyGPUMemoryTarget, KeyGPUsPerReplica, KeyCapacityAware, KeyCapacityHeadroom, KeyMinReplicaCount, KeyNodeSelector, KeyTolerations, KeyStaleAfter,
		KeyStream, KeyConsumer, KeyTargetWait, KeyConcurrency, KeyColdStart, KeyScaleUpTolerance, KeyPushInterval, KeyCPUPerReplica, KeyMemoryPerReplica,
	}
	if got := slices.Sorted(slices.Values(knownKeys)); !slices.Equal(got, slices.Sorted(slices.Values(covered))) {
		t.Errorf("knownKeys: got %q, want %q; add tests for new keys", got, covered)
	}
}

func TestParseTriggerCombinations(t *testing.T) {
	tests := map[string]struct {
		metadata   map[string]string
		key, value string
		want       string
		valid      bool
	}{
		"nothing": {
			metadata: nil, key: KeyQueue, value: "", want: "one of queue, stream with consumer, or podSelector",
		},
		"empty map": {
			metadata: metaOf(), key: KeyQueue, value: "", want: "one of queue, stream with consumer, or podSelector",
		},
		"only optional keys": {
			metadata: metaOf(KeyQueueTarget, "5", KeyStaleAfter, "1m"), key: KeyQueue, value: "", want: "one of queue",
		},
		// With capacityAware, podSelector selects the Jobs' pods to count those holding
		// GPUs; a GPU metric beside the backlog would be a second metric, which a
		// ScaledJob divides wrongly, and GPU activity would create Jobs for Jobs.
		"capacityAware with podSelector and gpuUtilTarget": {
			metadata: metaWith(baseCapacity, KeyPodSelector, "app=llm", KeyGPUUtilTarget, "70"),
			key:      KeyGPUUtilTarget, value: "70", want: "no capacityAware too: a ScaledJob trigger must give exactly one metric",
		},
		"capacityAware with podSelector and gpuMemoryTarget": {
			metadata: metaWith(baseCapacity, KeyPodSelector, "app=llm", KeyGPUMemoryTarget, "70"),
			key:      KeyGPUMemoryTarget, value: "70", want: "no capacityAware too",
		},
		"capacityAware with podSelector and activationGpuUtil": {
			metadata: metaWith(baseCapacity, KeyPodSelector, "app=llm", KeyActivationGPUUtil, "5"),
			key:      KeyActivationGPUUtil, value: "5", want: "no capacityAware too",
		},
		"stream without consumer": {
			metadata: metaOf(KeyStream, "WORK"), key: KeyConsumer, value: "", want: "stream and consumer given together",
		},
		"consumer without stream, with pods": {
			metadata: metaWith(baseGPU, KeyConsumer, "workers"), key: KeyStream, value: "", want: "stream and consumer given together",
		},
		// The pairing is the mistake to name, even with nothing else to measure.
		"consumer alone": {
			metadata: metaOf(KeyConsumer, "workers"), key: KeyStream, value: "", want: "stream and consumer given together",
		},
		"consumer without stream, with queue": {
			metadata: metaOf(KeyQueue, "jobs", KeyConsumer, "workers"), key: KeyStream, value: "", want: "stream and consumer given together",
		},
		"stream without consumer, with queue": {
			metadata: metaOf(KeyQueue, "jobs", KeyStream, "WORK"), key: KeyConsumer, value: "", want: "stream and consumer given together",
		},
		"queue with stream": {
			metadata: metaOf(KeyQueue, "jobs", KeyStream, "WORK", KeyConsumer, "workers"), key: KeyStream, value: "WORK",
			want: "either queue or stream with consumer, not both",
		},
		"gpuUtilTarget without podSelector": {
			metadata: metaWith(baseQueue, KeyGPUUtilTarget, "70"), key: KeyGPUUtilTarget, value: "70", want: "podSelector set too",
		},
		"activationGpuUtil without podSelector": {
			metadata: metaWith(baseQueue, KeyActivationGPUUtil, "5"), key: KeyActivationGPUUtil, value: "5", want: "podSelector set too",
		},
		"gpuMemoryTarget without podSelector": {
			metadata: metaWith(baseQueue, KeyGPUMemoryTarget, "80"), key: KeyGPUMemoryTarget, value: "80", want: "podSelector set too",
		},
		"gpuUtilTarget without podSelector, with stream": {
			metadata: metaWith(baseStream, KeyGPUUtilTarget, "70"), key: KeyGPUUtilTarget, value: "70", want: "podSelector set too",
		},
		"podSelector alone": {
			metadata: metaOf(KeyPodSelector, "app=llm"), key: KeyPodSelector, value: "app=llm", want: "gpuUtilTarget or gpuMemoryTarget set too",
		},
		"podSelector with only activationGpuUtil": {
			metadata: metaOf(KeyPodSelector, "app=llm", KeyActivationGPUUtil, "5"), key: KeyPodSelector, value: "app=llm",
			want: "gpuUtilTarget or gpuMemoryTarget set too",
		},
		"podSelector with queue but no GPU target": {
			metadata: metaWith(baseQueue, KeyPodSelector, "app=llm"), key: KeyPodSelector, value: "app=llm",
			want: "gpuUtilTarget or gpuMemoryTarget set too",
		},
		// A trigger with only podSelector is always active (Trigger.GPUOnly).
		"activationGpuUtil with only podSelector": {
			metadata: metaWith(baseGPU, KeyActivationGPUUtil, "5"), key: KeyActivationGPUUtil, value: "5", want: "a trigger with only podSelector is always active",
		},
		"activationGpuUtil with podSelector and stream": {metadata: metaWith(baseGPU, KeyStream, "WORK", KeyConsumer, "workers", KeyActivationGPUUtil, "5"), valid: true},
		"pushInterval with only podSelector": {
			metadata: metaWith(baseGPU, KeyPushInterval, "10s"), key: KeyPushInterval, value: "10s", want: "queue, or stream with consumer, set too",
		},
		"pushInterval on a capacityAware trigger": {
			metadata: metaWith(baseCapacity, KeyPushInterval, "10s"), key: KeyPushInterval, value: "10s", want: "KEDA pushes nothing for a ScaledJob",
		},
		"capacityAware without queue or stream": {
			metadata: metaWith(baseGPU, KeyCapacityAware, "true"), key: KeyCapacityAware, value: "true", want: "a queue or stream",
		},
		"nodeSelector without capacityAware": {
			metadata: metaWith(baseQueue, KeyNodeSelector, "gpu=a100"), key: KeyNodeSelector, value: "gpu=a100", want: `capacityAware "true" too`,
		},
		"capacityHeadroom without capacityAware": {
			metadata: metaWith(baseQueue, KeyCapacityHeadroom, "2"), key: KeyCapacityHeadroom, value: "2", want: `capacityAware "true" too`,
		},
		// minReplicaCount mirrors the ScaledJob's for the capacity cap alone.
		"minReplicaCount without capacityAware": {
			metadata: metaWith(baseQueue, KeyMinReplicaCount, "2"), key: KeyMinReplicaCount, value: "2", want: `capacityAware "true" too`,
		},
		"nodeSelector with capacityAware false": {
			metadata: metaWith(baseQueue, KeyCapacityAware, "false", KeyNodeSelector, "gpu=a100"), key: KeyNodeSelector, value: "gpu=a100",
			want: `capacityAware "true" too`,
		},
		"tolerations without capacityAware": {
			metadata: metaWith(baseQueue, KeyTolerations, "dedicated:NoSchedule"), key: KeyTolerations, value: "dedicated:NoSchedule", want: `capacityAware "true" too`,
		},
		"cpuPerReplica without capacityAware": {
			metadata: metaWith(baseQueue, KeyCPUPerReplica, "8"), key: KeyCPUPerReplica, value: "8", want: `capacityAware "true" too`,
		},
		"memoryPerReplica with capacityAware false": {
			metadata: metaWith(baseQueue, KeyCapacityAware, "false", KeyMemoryPerReplica, "64Gi"), key: KeyMemoryPerReplica, value: "64Gi", want: `capacityAware "true" too`,
		},
		"nodeSelector with pods only": {
			metadata: metaWith(baseGPU, KeyNodeSelector, "gpu=a100"), key: KeyNodeSelector, value: "gpu=a100", want: `capacityAware "true" too`,
		},
		// capacityAware counts the Jobs free GPUs can take: with gpusPerReplica defaulting
		// to 1, an 8-GPU Job would be created 8 times too often, every extra one Pending.
		"capacityAware without gpusPerReplica": {
			metadata: metaOf(KeyQueue, "jobs", KeyCapacityAware, "true"), key: KeyCapacityAware, value: "true",
			want: "gpusPerReplica set too: the cap counts the Jobs free GPUs can take",
		},
		"capacityAware without gpusPerReplica, with stream": {
			metadata: metaWith(baseStream, KeyCapacityAware, "1", KeyNodeSelector, "gpu=a100"), key: KeyCapacityAware, value: "1",
			want: "gpusPerReplica set too",
		},
		// Keys a trigger would accept and then ignore.
		"queueTarget with pods only": {
			metadata: metaWith(baseGPU, KeyQueueTarget, "4"), key: KeyQueueTarget, value: "4",
			want: "queue, or stream with consumer, set too: queueTarget applies to a backlog",
		},
		"activationQueueDepth with pods only": {
			metadata: metaWith(baseGPU, KeyActivationQueueDepth, "0"), key: KeyActivationQueueDepth, value: "0",
			want: "queue, or stream with consumer, set too: activationQueueDepth applies to a backlog",
		},
		"gpusPerReplica with queue only": {
			metadata: metaWith(baseQueue, KeyGPUsPerReplica, "2"), key: KeyGPUsPerReplica, value: "2",
			want: `podSelector or capacityAware "true" set too`,
		},
		"gpusPerReplica with stream only": {
			metadata: metaWith(baseStream, KeyGPUsPerReplica, "1g.10gb"), key: KeyGPUsPerReplica, value: "1g.10gb",
			want: `podSelector or capacityAware "true" set too`,
		},
		"gpusPerReplica with capacityAware false": {
			metadata: metaWith(baseQueue, KeyCapacityAware, "false", KeyGPUsPerReplica, "8"), key: KeyGPUsPerReplica, value: "8",
			want: `podSelector or capacityAware "true" set too`,
		},

		"concurrency without targetWait": {
			metadata: metaWith(baseQueue, KeyConcurrency, "8"), key: KeyConcurrency, value: "8", want: "targetWait set too",
		},
		"coldStart without targetWait": {
			metadata: metaWith(baseQueue, KeyColdStart, "45s"), key: KeyColdStart, value: "45s", want: "targetWait set too",
		},
		"coldStart with only pods": {
			metadata: metaWith(baseGPU, KeyColdStart, "45s"), key: KeyColdStart, value: "45s", want: "targetWait set too",
		},
		"scaleUpTolerance without targetWait": {
			metadata: metaWith(baseQueue, KeyScaleUpTolerance, "0.05"), key: KeyScaleUpTolerance, value: "0.05", want: "targetWait set too",
		},
		"targetWait with queueTarget": {
			metadata: metaWith(baseQueue, KeyTargetWait, "30s", KeyQueueTarget, "4"), key: KeyQueueTarget, value: "4", want: "no targetWait too",
		},
		"targetWait without a queue": {
			metadata: metaWith(baseGPU, KeyTargetWait, "30s"), key: KeyTargetWait, value: "30s", want: "queue set too",
		},
		"targetWait on a stream": {
			metadata: metaWith(baseStream, KeyTargetWait, "30s"), key: KeyTargetWait, value: "30s", want: "queue set too",
		},
		"targetWait with capacityAware": {
			metadata: metaWith(baseCapacity, KeyTargetWait, "30s"), key: KeyTargetWait, value: "30s", want: `no capacityAware "true" too`,
		},
		"queue demand and pods":            {metadata: metaWith(baseQueue, KeyTargetWait, "30s", KeyConcurrency, "4", KeyPodSelector, "app=llm", KeyGPUUtilTarget, "80"), valid: true},
		"queue and pods":                   {metadata: metaWith(baseQueue, KeyPodSelector, "app=llm", KeyGPUMemoryTarget, "80"), valid: true},
		"stream, capacity and nodes":       {metadata: metaWith(baseStream, KeyCapacityAware, "true", KeyGPUsPerReplica, "8", KeyNodeSelector, "gpu=a100"), valid: true},
		"capacity with a MIG profile":      {metadata: metaWith(baseQueue, KeyCapacityAware, "true", KeyGPUsPerReplica, "1g.10gb"), valid: true},
		"pods with capacityAware false":    {metadata: metaWith(baseGPU, KeyCapacityAware, "false"), valid: true},
		"queue with capacityAware false":   {metadata: metaWith(baseQueue, KeyCapacityAware, "false"), valid: true},
		"queue and pods, gpusPerReplica":   {metadata: metaWith(baseQueue, KeyPodSelector, "app=llm", KeyGPUUtilTarget, "70", KeyGPUsPerReplica, "2"), valid: true},
		"queue and pods, queueTarget":      {metadata: metaWith(baseGPU, KeyQueue, "jobs", KeyQueueTarget, "4", KeyActivationQueueDepth, "1"), valid: true},
		"stream and pods, queueTarget":     {metadata: metaWith(baseGPU, KeyStream, "WORK", KeyConsumer, "workers", KeyQueueTarget, "4"), valid: true},
		"pods with gpusPerReplica (a MIG)": {metadata: metaWith(baseGPU, KeyGPUsPerReplica, "1g.10gb"), valid: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if tc.valid {
				parseOK(t, "ml", tc.metadata, 0)
				return
			}
			parseErr(t, "ml", tc.metadata, tc.key, tc.value, tc.want)
		})
	}
}

func TestParseTriggerFromEnv(t *testing.T) {
	// Two triggers that together give every known key, so each can be renamed <key>FromEnv.
	full := map[string]map[string]string{
		"queue": metaOf(KeyQueue, "jobs", KeyQueueTarget, "4", KeyActivationQueueDepth, "2",
			KeyPodSelector, "app=llm", KeyGPUUtilTarget, "75", KeyActivationGPUUtil, "5", KeyGPUMemoryTarget, "90",
			KeyGPUsPerReplica, "2", KeyStaleAfter, "1m"),
		"capacity": metaOf(KeyQueue, "jobs", KeyQueueTarget, "4", KeyGPUsPerReplica, "2",
			KeyCapacityAware, "true", KeyCapacityHeadroom, "2", KeyNodeSelector, "pool=gpu", KeyTolerations, "dedicated=ml:NoSchedule", KeyMinReplicaCount, "2",
			KeyCPUPerReplica, "7500m", KeyMemoryPerReplica, "60Gi"),
		"stream": metaOf(KeyStream, "WORK", KeyConsumer, "workers", KeyCapacityAware, "true", KeyGPUsPerReplica, "1g.10gb"),
		"demand": metaOf(KeyQueue, "requests", KeyTargetWait, "30s", KeyConcurrency, "8", KeyColdStart, "90s", KeyScaleUpTolerance, "0.05", KeyPushInterval, "10s"),
	}
	seen := map[string]bool{}
	for fullName, metadata := range full {
		want := viewOf(parseOK(t, "ml", metadata, 0))
		for key, value := range metadata {
			seen[key] = true
			t.Run(fullName+"/"+key, func(t *testing.T) {
				renamed := maps.Clone(metadata)
				delete(renamed, key)
				renamed[key+"FromEnv"] = value
				if got := viewOf(parseOK(t, "ml", renamed, 0)); got != want {
					t.Errorf("ParseTrigger(%q):\ngot  %+v\nwant %+v", renamed, got, want)
				}
			})
		}
	}
	for _, key := range knownKeys {
		if !seen[key] {
			t.Errorf("key %q: got no FromEnv case, want one", key)
		}
	}

	t.Run("every key FromEnv at once", func(t *testing.T) {
		metadata := full["queue"]
		renamed := map[string]string{}
		for k, v := range metadata {
			renamed[k+"FromEnv"] = v
		}
		if got, want := viewOf(parseOK(t, "ml", renamed, 0)), viewOf(parseOK(t, "ml", metadata, 0)); got != want {
			t.Errorf("ParseTrigger(%q):\ngot  %+v\nwant %+v", renamed, got, want)
		}
	})

	both := map[string]struct {
		metadata map[string]string
		key      string
	}{
		"queue":       {metaOf(KeyQueue, "jobs", "queueFromEnv", "other"), "queueFromEnv"},
		"queueTarget": {metaWith(baseQueue, KeyQueueTarget, "2", "queueTargetFromEnv", "3"), "queueTargetFromEnv"},
		"podSelector": {metaWith(baseGPU, "podSelectorFromEnv", "app=llm"), "podSelectorFromEnv"},
		"staleAfter":  {metaWith(baseQueue, KeyStaleAfter, "1m", "staleAfterFromEnv", "1m"), "staleAfterFromEnv"},
		"consumer":    {metaWith(baseStream, "consumerFromEnv", "workers"), "consumerFromEnv"},
	}
	for name, tc := range both {
		t.Run("both "+name, func(t *testing.T) {
			base := strings.TrimSuffix(tc.key, "FromEnv")
			parseErr(t, "ml", tc.metadata, tc.key, tc.metadata[tc.key], "either "+base+" or "+tc.key+", not both")
		})
	}

	// A bad value read from the environment is reported under the key the trigger wrote.
	t.Run("invalid value", func(t *testing.T) {
		parseErr(t, "ml", metaWith(baseQueue, "queueTargetFromEnv", "-1"), "queueTargetFromEnv", "-1", "a number from 0.001 to 1e15")
	})
	t.Run("FromEnv of an unknown key", func(t *testing.T) {
		parseErr(t, "ml", metaWith(baseQueue, "fooFromEnv", "x"), "fooFromEnv", "x", "one of queue")
	})
	t.Run("FromEnv twice", func(t *testing.T) {
		parseErr(t, "ml", metaOf("queueFromEnvFromEnv", "jobs"), "queueFromEnvFromEnv", "jobs")
	})
	t.Run("combination rules see FromEnv keys", func(t *testing.T) {
		parseErr(t, "ml", metaWith(baseQueue, "gpuUtilTargetFromEnv", "70"), "gpuUtilTargetFromEnv", "70", "podSelector set too")
		parseErr(t, "ml", metaWith(baseGPU, "queueTargetFromEnv", "4"), "queueTargetFromEnv", "4", "queue, or stream with consumer, set too")
		parseErr(t, "ml", metaWith(baseGPU, "activationQueueDepthFromEnv", "2"), "activationQueueDepthFromEnv", "2", "queue, or stream with consumer, set too")
		parseErr(t, "ml", metaWith(baseQueue, "gpusPerReplicaFromEnv", "2"), "gpusPerReplicaFromEnv", "2", `podSelector or capacityAware "true" set too`)
		parseErr(t, "ml", metaWith(baseQueue, "capacityAwareFromEnv", "true"), "capacityAwareFromEnv", "true", "gpusPerReplica set too")
		// The key comes from the environment, so the trigger gives it as gpusPerReplicaFromEnv.
		parseOK(t, "ml", metaWith(baseQueue, "capacityAwareFromEnv", "true", "gpusPerReplicaFromEnv", "8"), 0)
	})
}

func TestParseTriggerIgnoresKEDAKeys(t *testing.T) {
	for _, base := range []map[string]string{baseQueue, baseGPU, baseStream} {
		want := viewOf(parseOK(t, "ml", base, 0))
		metadata := metaWith(base,
			"scalerAddress", "gpuscaler.gpuscaler.svc:9090", "enableTLS", "true", "unsafeSsl", "not-a-bool",
			"caCert", "-----BEGIN CERTIFICATE-----\n...", "tlsClientCert", "junk", "tlsClientKey", "")
		if got := viewOf(parseOK(t, "ml", metadata, 0)); got != want {
			t.Errorf("ParseTrigger(%q):\ngot  %+v\nwant %+v", metadata, got, want)
		}
	}
	// KEDA's keys do not make a trigger: something to measure is still required.
	parseErr(t, "ml", metaOf("scalerAddress", "gpuscaler:9090"), KeyQueue, "", "one of queue")
}

func TestParseTriggerUnknownKeys(t *testing.T) {
	tests := map[string]struct {
		key   string
		guess string // "" when no guess is wanted
	}{
		"typo queueTaget":            {"queueTaget", KeyQueueTarget},
		"case QueueTarget":           {"QueueTarget", KeyQueueTarget},
		"case podselector":           {"podselector", KeyPodSelector},
		"case Queue":                 {"Queue", KeyQueue},
		"case activationGPUUtil":     {"activationGPUUtil", KeyActivationGPUUtil},
		"typo gpuPerReplica":         {"gpuPerReplica", KeyGPUsPerReplica},
		"typo nodeSelectr":           {"nodeSelectr", KeyNodeSelector},
		"typo stale_after":           {"stale_after", KeyStaleAfter},
		"typo capacityAwre":          {"capacityAwre", KeyCapacityAware},
		"typo gpuMemTarget":          {"gpuMemTarget", KeyGPUMemoryTarget},
		"typo consumers":             {"consumers", KeyConsumer},
		"unrelated":                  {"completelyUnrelated", ""},
		"KEDA key of another scaler": {"serverAddress", ""},
		"metricType is not passed":   {"metricName", ""},
		"KEDA key in the wrong case": {"ScalerAddress", ""},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			me := parseErr(t, "ml", metaWith(baseQueue, tc.key, "5"), tc.key, "5", "queue, queueTarget, activationQueueDepth")
			gotGuess := strings.Contains(me.Want, "did you mean")
			switch {
			case tc.guess != "" && !strings.Contains(me.Want, `did you mean "`+tc.guess+`"`):
				t.Errorf("Error.Want: got %q, want it to ask: did you mean %q", me.Want, tc.guess)
			case tc.guess == "" && gotGuess:
				t.Errorf("Error.Want: got %q, want no guess", me.Want)
			}
		})
	}
}

// TestParseTriggerEmptyKey: a metadata key "" is unknown, and the error must still say
// which key is wrong, as every Error names its key.
func TestParseTriggerEmptyKey(t *testing.T) {
	_, err := ParseTrigger("ml", metaWith(baseQueue, "", "5"), 0)
	if err == nil {
		t.Fatal("ParseTrigger with key \"\": got no error, want one")
	}
	var me *Error
	if !errors.As(err, &me) {
		t.Fatalf("errors.As(%v, *Error): got false, want true", err)
	}
	if me.Key == "" {
		t.Errorf("Error.Key: got empty (%v), want a non-empty name for the empty key", err)
	}
}

// TestParseTriggerSelectorWithNUL: labels.Parse stops at a NUL byte, so a selector that
// starts with one parses as the empty selector, which selects every pod (or node) in the
// namespace, and one with a NUL later is cut short.
func TestParseTriggerSelectorWithNUL(t *testing.T) {
	for _, v := range []string{"\x00", "\x00app=llm", " \x00 ", "app=llm\x00"} {
		t.Run(caseName(v), func(t *testing.T) {
			parseErr(t, "ml", metaWith(baseGPU, KeyPodSelector, v), KeyPodSelector, v)
			parseErr(t, "ml", metaWith(baseCapacity, KeyNodeSelector, v), KeyNodeSelector, v)
		})
	}
}

func TestParseTriggerNamespace(t *testing.T) {
	invalid := map[string]string{
		"empty":           "",
		"upper case":      "Bad",
		"dot":             "a.b",
		"leading dash":    "-ml",
		"trailing dash":   "ml-",
		"underscore":      "a_b",
		"space":           "m l",
		"slash":           "a/b",
		"64 characters":   strings.Repeat("n", 64),
		"wildcard":        "*",
		"subject escaper": ">",
	}
	for name, ns := range invalid {
		t.Run(name, func(t *testing.T) {
			parseErr(t, ns, baseQueue, "namespace", ns, "DNS-1123 label")
		})
	}
	valid := []string{"ml", "a", "team-a", "0", strings.Repeat("n", 63)}
	for _, ns := range valid {
		t.Run("valid "+caseName(ns), func(t *testing.T) {
			if got := parseOK(t, ns, baseQueue, 0).Namespace; got != ns {
				t.Errorf("Namespace: got %q, want %q", got, ns)
			}
		})
	}
	// The namespace is checked before the metadata.
	t.Run("bad namespace and bad metadata", func(t *testing.T) {
		parseErr(t, "Bad", metaOf("foo", "bar"), "namespace", "Bad")
	})
}

func TestMetricSpecs(t *testing.T) {
	tests := map[string]struct {
		metadata map[string]string
		want     []MetricSpec
	}{
		"queue": {baseQueue, []MetricSpec{{MetricQueueBacklog, 1}}},
		"queue with target": {
			metaWith(baseQueue, KeyQueueTarget, "5", KeyActivationQueueDepth, "3"),
			[]MetricSpec{{MetricQueueBacklog, 5}},
		},
		"stream": {metaWith(baseStream, KeyQueueTarget, "2.5"), []MetricSpec{{MetricQueueBacklog, 2.5}}},
		"gpu util": {
			baseGPU,
			[]MetricSpec{{MetricGPUUtil, 70}},
		},
		"gpu memory": {
			metaOf(KeyPodSelector, "app=llm", KeyGPUMemoryTarget, "80"),
			[]MetricSpec{{MetricGPUMemory, 80}},
		},
		"gpu util and memory": {
			metaWith(baseGPU, KeyGPUMemoryTarget, "85"),
			[]MetricSpec{{MetricGPUUtil, 70}, {MetricGPUMemory, 85}},
		},
		"queue and gpu memory": {
			metaWith(baseQueue, KeyPodSelector, "app=llm", KeyGPUMemoryTarget, "60"),
			[]MetricSpec{{MetricQueueBacklog, 1}, {MetricGPUMemory, 60}},
		},
		"everything": {
			metaOf(KeyGPUMemoryTarget, "90", KeyGPUUtilTarget, "75", KeyPodSelector, "app=llm", KeyQueueTarget, "4", KeyQueue, "jobs"),
			[]MetricSpec{{MetricQueueBacklog, 4}, {MetricGPUUtil, 75}, {MetricGPUMemory, 90}},
		},
		"stream and gpus": {
			metaWith(baseStream, KeyQueueTarget, "3", KeyPodSelector, "app=llm", KeyGPUUtilTarget, "50", KeyGPUMemoryTarget, "40"),
			[]MetricSpec{{MetricQueueBacklog, 3}, {MetricGPUUtil, 50}, {MetricGPUMemory, 40}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			tr := parseOK(t, "ml", tc.metadata, 0)
			// Map order must not matter: parse a few times.
			for range 5 {
				if got := tr.MetricSpecs(); !slices.Equal(got, tc.want) {
					t.Fatalf("MetricSpecs of %q: got %v, want %v", tc.metadata, got, tc.want)
				}
				tr = parseOK(t, "ml", maps.Clone(tc.metadata), 0)
			}
		})
	}
}

func TestMetadataErrorMessage(t *testing.T) {
	_, err := ParseTrigger("ml", metaWith(baseQueue, KeyQueueTarget, "-3"), 0)
	me := checkMetadataError(t, err, KeyQueueTarget, "-3", "a number from 0.001 to 1e15")
	if got, want := err.Error(), `trigger metadata queueTarget="-3": want a number from 0.001 to 1e15`; got != want {
		t.Errorf("Error(): got %q, want %q", got, want)
	}
	if !errors.Is(me, ErrInvalid) {
		t.Errorf("errors.Is(%v, ErrInvalid): got false, want true", me)
	}
	if errors.Is(me, errors.New("invalid trigger metadata")) {
		t.Errorf("errors.Is(%v, another error with the same text): got true, want false", me)
	}
}

// FuzzParseTrigger feeds ParseTrigger arbitrary namespaces, keys and values, and checks it
// never panics, rejects with a *Error naming a key, and accepts only triggers that
// keep the Trigger invariants.
func FuzzParseTrigger(f *testing.F) {
	type seed struct {
		ns, k1, v1, k2, v2 string
		addQueue           bool
		stale              uint8
	}
	seeds := []seed{
		{"ml", KeyQueue, "jobs", KeyQueueTarget, "5", false, 0},
		{"ml", KeyQueueTarget, "0", "", "", true, 1},
		{"ml", KeyQueueTarget, "NaN", "", "", true, 0},
		{"ml", KeyActivationQueueDepth, "-1", "", "", true, 0},
		{"ml", KeyPodSelector, "app=llm", KeyGPUUtilTarget, "70", false, 2},
		{"ml", KeyPodSelector, "app=llm", KeyGPUUtilTarget, "70", true, 0},
		{"ml", KeyPodSelector, "tier in (gpu)", KeyGPUMemoryTarget, "101", false, 0},
		{"ml", KeyPodSelector, "", KeyGPUMemoryTarget, "80", false, 0},
		{"ml", KeyPodSelector, "app in (", KeyGPUUtilTarget, "70", false, 0},
		{"ml", KeyPodSelector, "app=llm", KeyActivationGPUUtil, "5", false, 0},
		{"ml", KeyGPUUtilTarget, "70", "", "", true, 0},
		{"ml", KeyGPUsPerReplica, "1g.10gb", "", "", true, 0},
		{"ml", KeyGPUsPerReplica, "1c.3g.40gb", "", "", true, 0},
		{"ml", KeyGPUsPerReplica, "1025", "", "", true, 0},
		{"ml", KeyCapacityAware, "true", KeyNodeSelector, "gpu=a100", true, 0},
		{"ml", KeyCapacityAware, "true", KeyNodeSelector, "gpu=a100", false, 0},
		{"ml", KeyCapacityAware, "true", KeyGPUsPerReplica, "8", true, 0},
		{"ml", KeyCapacityAware, "true", KeyGPUsPerReplica, "1g.10gb", true, 0},
		{"ml", "capacityAwareFromEnv", "true", "gpusPerReplicaFromEnv", "2", true, 0},
		{"ml", KeyPodSelector, "app=llm", KeyQueueTarget, "4", false, 0},
		{"ml", KeyPodSelector, "app=llm", "activationQueueDepthFromEnv", "1", false, 0},
		{"ml", KeyNodeSelector, "gpu=a100", "", "", true, 0},
		{"ml", KeyCapacityAware, "true", KeyTolerations, "dedicated=ml:NoSchedule,nvidia.com/gpu", true, 0},
		{"ml", KeyCapacityAware, "true", KeyTolerations, "*=x", true, 0},
		{"ml", KeyCPUPerReplica, "500m", KeyCapacityAware, "true", true, 0},
		{"ml", KeyCPUPerReplica, "1.5e3", "", "", true, 0},
		{"ml", KeyCPUPerReplica, "-0.0001m", KeyCapacityAware, "true", true, 0},
		{"ml", KeyMemoryPerReplica, "64Gi", KeyCapacityAware, "true", true, 0},
		{"ml", KeyMemoryPerReplica, "0.5", KeyCapacityAware, "true", true, 0},
		{"ml", KeyMemoryPerReplica, "9Ei", KeyCapacityAware, "true", true, 0},
		{"ml", "cpuPerReplicaFromEnv", "8", "memoryPerReplicaFromEnv", "1Gi", true, 0},
		{"ml", KeyStaleAfter, "999ms", "", "", true, 0},
		{"ml", KeyStaleAfter, "2m", "", "", true, 3},
		{"ml", KeyStream, "WORK", KeyConsumer, "workers", false, 0},
		{"ml", KeyTargetWait, "10s", KeyColdStart, "45s", true, 0},
		{"ml", KeyTargetWait, "10s", "coldStartFromEnv", "1h0m0.000000001s", true, 0},
		{"ml", KeyColdStart, "45s", "", "", true, 0},
		{"ml", KeyTargetWait, "10s", KeyScaleUpTolerance, "0.05", true, 0},
		{"ml", KeyScaleUpTolerance, "1e-1", "", "", true, 0},
		{"ml", KeyTargetWait, "10s", KeyScaleUpTolerance, "1e-1", true, 0},
		{"ml", KeyPushInterval, "0s", "", "", true, 0},
		{"ml", KeyPushInterval, "-1s", "", "", true, 0},
		{"ml", KeyPodSelector, "app=llm", KeyPushInterval, "10s", false, 0},
		{"ml", KeyStream, "WORK", KeyConsumer, "workers", true, 0},
		{"ml", KeyStream, "a.b", KeyConsumer, "c", false, 0},
		{"ml", KeyStream, "WORK", "", "", false, 0},
		{"ml", "queueFromEnv", "jobs", KeyQueue, "jobs", false, 0},
		{"ml", "queueTargetFromEnv", "3", "", "", true, 0},
		{"ml", "queueTaget", "3", "", "", true, 0},
		{"ml", "podselector", "app=llm", "", "", true, 0},
		{"ml", "scalerAddress", "gpuscaler:9090", "enableTLS", "true", true, 0},
		{"ml", KeyQueue, "a b", "", "", false, 0},
		{"Bad", KeyQueue, "jobs", "", "", false, 0},
		{"", KeyQueue, "jobs", "", "", false, 0},
		{"a.b", KeyQueue, "jobs", "", "", false, 0},
	}
	for _, s := range seeds {
		f.Add(s.ns, s.k1, s.v1, s.k2, s.v2, s.addQueue, s.stale)
	}
	f.Fuzz(func(t *testing.T, ns, k1, v1, k2, v2 string, addQueue bool, stale uint8) {
		metadata := map[string]string{k1: v1}
		if k2 != "" {
			metadata[k2] = v2
		}
		if _, ok := metadata[KeyQueue]; addQueue && !ok {
			metadata[KeyQueue] = "jobs"
		}
		defaultStaleAfter := []time.Duration{0, time.Second, 45 * time.Second, time.Hour}[stale%4]

		tr, err := ParseTrigger(ns, maps.Clone(metadata), defaultStaleAfter)
		if err != nil {
			checkFuzzError(t, err, tr, metadata)
			return
		}
		checkFuzzTrigger(t, tr, ns, metadata, defaultStaleAfter)
	})
}

func checkFuzzError(t *testing.T, err error, tr *Trigger, metadata map[string]string) {
	t.Helper()
	if tr != nil {
		t.Errorf("got trigger %+v with error %v, want nil trigger", viewOf(tr), err)
	}
	if !errors.Is(err, ErrInvalid) {
		t.Errorf("errors.Is(%v, ErrInvalid): got false, want true", err)
	}
	var me *Error
	if !errors.As(err, &me) {
		t.Fatalf("errors.As(%v, *Error): got false (%T), want true", err, err)
	}
	if me.Key == "" {
		t.Errorf("Error.Key: got empty, want a key (error %v, metadata %q)", err, metadata)
	}
	if me.Want == "" {
		t.Errorf("Error.Want: got empty, want what was expected (error %v)", err)
	}
	_, given := metadata[me.Key]
	if me.Key == emptyKeyTag {
		_, given = metadata[""]
	}
	if me.Key != "namespace" && !given && !slices.Contains(knownKeys, me.Key) {
		t.Errorf("Error.Key: got %q, want namespace, a given key or a known key (metadata %q)", me.Key, metadata)
	}
	if v, ok := metadata[me.Key]; ok && me.Key != "namespace" && me.Value != v {
		t.Errorf("Error.Value for %s: got %q, want the given %q", me.Key, me.Value, v)
	}
	if msg := err.Error(); !strings.Contains(msg, me.Key) {
		t.Errorf("Error(): got %q, want it to name key %q", msg, me.Key)
	}
}

func checkFuzzTrigger(t *testing.T, tr *Trigger, ns string, metadata map[string]string, defaultStaleAfter time.Duration) {
	t.Helper()
	if tr == nil {
		t.Fatalf("got nil trigger and nil error for %q %q", ns, metadata)
	}
	v := viewOf(tr)
	if tr.Namespace != ns {
		t.Errorf("Namespace: got %q, want %q", tr.Namespace, ns)
	}
	if err := gpuscalerv1.ValidateNamespace(ns); err != nil {
		t.Errorf("accepted namespace %q, want it rejected: %v", ns, err)
	}
	if tr.ColdStart != 0 && (tr.TargetWait == 0 || tr.ColdStart < MinColdStart || tr.ColdStart > MaxColdStart) {
		t.Errorf("ColdStart %s with targetWait %s: want 0, or %s to %s with a targetWait", tr.ColdStart, tr.TargetWait, MinColdStart, MaxColdStart)
	}
	if !(tr.ScaleUpTolerance >= 0 && tr.ScaleUpTolerance <= 1) || tr.TargetWait == 0 && tr.ScaleUpTolerance != 0.1 {
		t.Errorf("ScaleUpTolerance %v with targetWait %s: want 0 to 1, and 0.1 without a targetWait", tr.ScaleUpTolerance, tr.TargetWait)
	}
	finite := func(f float64) bool { return !math.IsNaN(f) && !math.IsInf(f, 0) }
	if !finite(tr.QueueTarget) || tr.QueueTarget <= 0 {
		t.Errorf("QueueTarget: got %v, want finite and above 0 (%+v)", tr.QueueTarget, v)
	}
	if !finite(tr.ActivationQueueDepth) || tr.ActivationQueueDepth < 0 {
		t.Errorf("ActivationQueueDepth: got %v, want finite and 0 or above (%+v)", tr.ActivationQueueDepth, v)
	}
	for name, p := range map[string]float64{
		"GPUUtilTarget": tr.GPUUtilTarget, "ActivationGPUUtil": tr.ActivationGPUUtil, "GPUMemoryTarget": tr.GPUMemoryTarget,
	} {
		if !(p >= 0 && p <= 100) {
			t.Errorf("%s: got %v, want 0 to 100 (%+v)", name, p, v)
		}
	}
	if tr.PushInterval < 0 || tr.PushInterval > MaxStaleAfter {
		t.Errorf("PushInterval: got %v, want 0 to 24h (%+v)", tr.PushInterval, v)
	}
	if _, given := metadata[KeyPushInterval]; !given && tr.PushInterval != DefaultPushInterval {
		if _, ok := metadata[KeyPushInterval+fromEnvSuffix]; !ok {
			t.Errorf("PushInterval with no pushInterval key: got %v, want %v", tr.PushInterval, DefaultPushInterval)
		}
	}
	if tr.StaleAfter < time.Second {
		t.Errorf("StaleAfter: got %v, want 1s or more (%+v)", tr.StaleAfter, v)
	}
	if _, ok := metadata[KeyStaleAfter]; !ok {
		if _, ok := metadata[KeyStaleAfter+fromEnvSuffix]; !ok {
			want := defaultStaleAfter
			if want == 0 {
				want = DefaultStaleAfter
			}
			if tr.StaleAfter != want {
				t.Errorf("StaleAfter with no staleAfter key: got %v, want %v", tr.StaleAfter, want)
			}
		}
	}
	if tr.CPUPerReplica < 0 || tr.CPUPerReplica > gpuscalerv1.MaxNodeCPUMillis || tr.MemoryPerReplica < 0 || tr.MemoryPerReplica > gpuscalerv1.MaxNodeMemoryBytes {
		t.Errorf("CPUPerReplica %d, MemoryPerReplica %d: want 0 (not given) or within a node's bounds (%+v)", tr.CPUPerReplica, tr.MemoryPerReplica, v)
	}
	if (tr.CPUPerReplica != 0 || tr.MemoryPerReplica != 0) && !tr.CapacityAware {
		t.Errorf("CPUPerReplica or MemoryPerReplica without CapacityAware (%+v)", v)
	}
	if tr.Queue == "" && tr.Stream == "" && tr.PodSelector == nil {
		t.Errorf("got none of Queue, Stream and PodSelector, want at least one (%+v)", v)
	}
	if (tr.Stream == "") != (tr.Consumer == "") {
		t.Errorf("Stream %q, Consumer %q: want both set or both empty", tr.Stream, tr.Consumer)
	}
	if tr.Queue != "" && tr.Stream != "" {
		t.Errorf("Queue %q and Stream %q: want at most one", tr.Queue, tr.Stream)
	}
	if tr.Queue != "" {
		if err := gpuscalerv1.ValidateQueueName(tr.Queue); err != nil {
			t.Errorf("Queue: accepted %q, want it rejected: %v", tr.Queue, err)
		}
	}
	for _, name := range []string{tr.Stream, tr.Consumer} {
		if name != "" {
			if err := validateJetStreamName(name); err != nil {
				t.Errorf("accepted JetStream name %q, want it rejected: %v", name, err)
			}
		}
	}
	// A NUL in a selector is a known bug (TestParseTriggerSelectorWithNUL): skip it here so
	// that fuzzing goes on to find others.
	nul := strings.ContainsRune(strings.Join(slices.Collect(maps.Values(metadata)), ""), 0)
	if tr.PodSelector != nil {
		if tr.PodSelector.Empty() && !nul {
			t.Errorf("PodSelector: got an empty selector (selects every pod) from %q", metadata)
		}
		if tr.GPUUtilTarget == 0 && tr.GPUMemoryTarget == 0 {
			t.Errorf("PodSelector %q with no GPU target, want gpuUtilTarget or gpuMemoryTarget", tr.PodSelector)
		}
	} else if tr.GPUUtilTarget != 0 || tr.GPUMemoryTarget != 0 || tr.ActivationGPUUtil != 0 {
		t.Errorf("GPU targets without PodSelector (%+v)", v)
	}
	if tr.NodeSelector != nil {
		if tr.NodeSelector.Empty() && !nul {
			t.Errorf("NodeSelector: got an empty selector from %q", metadata)
		}
		if !tr.CapacityAware {
			t.Errorf("NodeSelector %q without CapacityAware", tr.NodeSelector)
		}
	}
	if tr.CapacityAware && tr.Queue == "" && tr.Stream == "" {
		t.Errorf("CapacityAware without Queue or Stream (%+v)", v)
	}
	if tr.CapacityHeadroom != 0 && !tr.CapacityAware || tr.CapacityHeadroom < 0 || tr.CapacityHeadroom > 1_000_000 {
		t.Errorf("CapacityHeadroom %d (capacityAware %v)", tr.CapacityHeadroom, tr.CapacityAware)
	}
	if tr.GPUsPerReplica < 0 || tr.GPUsPerReplica > 1024 {
		t.Errorf("GPUsPerReplica: got %d, want 0 to 1024", tr.GPUsPerReplica)
	}
	// No key is accepted and then ignored: capacity needs the GPUs one Job asks for, and
	// gpusPerReplica and the backlog's keys need something they apply to.
	if tr.CapacityAware && tr.GPUsPerReplica == 0 {
		t.Errorf("CapacityAware without GPUsPerReplica (%+v)", v)
	}
	if tr.GPUsPerReplica != 0 && tr.PodSelector == nil && !tr.CapacityAware {
		t.Errorf("GPUsPerReplica %d with neither PodSelector nor CapacityAware (%+v)", tr.GPUsPerReplica, v)
	}
	if tr.Queue == "" && tr.Stream == "" {
		for _, k := range []string{KeyQueueTarget, KeyActivationQueueDepth} {
			for _, name := range []string{k, k + fromEnvSuffix} {
				if _, ok := metadata[name]; ok {
					t.Errorf("accepted %s with neither Queue nor Stream (%+v)", name, v)
				}
			}
		}
	}
	if tr.GPUProfile != "" && (tr.GPUsPerReplica != 1 || !migProfile.MatchString(tr.GPUProfile)) {
		t.Errorf("GPUProfile %q with GPUsPerReplica %d: want a MIG profile and 1", tr.GPUProfile, tr.GPUsPerReplica)
	}

	specs := tr.MetricSpecs()
	var want []string
	switch {
	case tr.TargetWait > 0:
		want = append(want, MetricQueueDemand)
	case tr.Queue != "" || tr.Stream != "":
		want = append(want, MetricQueueBacklog)
	}
	if tr.GPUUtilTarget > 0 {
		want = append(want, MetricGPUUtil)
	}
	if tr.GPUMemoryTarget > 0 {
		want = append(want, MetricGPUMemory)
	}
	if len(specs) == 0 {
		t.Errorf("MetricSpecs: got none, want at least one (%+v)", v)
	}
	var got []string
	for _, s := range specs {
		got = append(got, s.Name)
		if !finite(s.Target) || s.Target <= 0 {
			t.Errorf("MetricSpecs %s: got target %v, want finite and above 0", s.Name, s.Target)
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("MetricSpecs names: got %q, want %q (%+v)", got, want, v)
	}
}

// TestParseTriggerErrorIsDeterministic: with several bad keys, every call names the same
// one, so KEDA's events and the scaler's replicas all say the same thing.
func TestParseTriggerErrorIsDeterministic(t *testing.T) {
	md := map[string]string{"queue": "jobs", "foo": "1", "bar": "2", "baz": "3"}
	_, first := ParseTrigger("ml", md, 0)
	for range 50 {
		if _, err := ParseTrigger("ml", md, 0); err == nil || err.Error() != first.Error() {
			t.Fatalf("ParseTrigger error changed between calls: got %v, then %v", first, err)
		}
	}
	if !strings.Contains(first.Error(), `bar="2"`) {
		t.Fatalf("error %v, want the first bad key in sorted order, bar", first)
	}
}
