package gpuscalerv1

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

func validNodeReport() *NodeReport {
	return &NodeReport{
		Node:        "gpu-node-1",
		ObservedAt:  timestamppb.Now(),
		Sequence:    7,
		CollectorId: "collector-abc",
		Source:      "sim",
		Allocatable: []*Device{
			{Id: "GPU-0", Resource: "nvidia.com/gpu"},
			{Id: "MIG-1", Resource: "nvidia.com/mig-1g.10gb", MigProfile: "1g.10gb"},
		},
		Allocated: []*Device{{Id: "GPU-0", Resource: "nvidia.com/gpu"}},
		Gpus: []*GPUSample{
			{
				Uuid: "GPU-0", Model: "NVIDIA H100 80GB HBM3",
				GpuUtil: proto.Float64(87), SmActive: proto.Float64(60), TensorActive: proto.Float64(40),
				FbUsedBytes: proto.Uint64(40 << 30), FbTotalBytes: proto.Uint64(80 << 30),
				PowerWatts: proto.Float64(612.5), TemperatureCelsius: proto.Float64(61),
				Pod: &PodRef{Namespace: "ml", Name: "llm-0", Container: "server", Labels: map[string]string{"app": "llm"}},
			},
			{Uuid: "GPU-1", Index: 1, DeviceId: "MIG-1", MigProfile: "1g.10gb", MigInstanceId: proto.Uint32(13), GpuUtil: proto.Float64(0)},
		},
	}
}

func TestNodeReportValidate(t *testing.T) {
	tests := map[string]struct {
		mutate  func(r *NodeReport)
		wantErr string
	}{
		"valid":                 {mutate: func(*NodeReport) {}},
		"no node":               {mutate: func(r *NodeReport) { r.Node = "" }, wantErr: "node name is empty"},
		"no uuid":               {mutate: func(r *NodeReport) { r.Gpus[0].Uuid = "" }, wantErr: "uuid is required"},
		"util over 100":         {mutate: func(r *NodeReport) { r.Gpus[0].GpuUtil = proto.Float64(140) }, wantErr: "gpu_util 140 is outside 0–100"},
		"util negative":         {mutate: func(r *NodeReport) { r.Gpus[0].SmActive = proto.Float64(-1) }, wantErr: "sm_active -1"},
		"util NaN":              {mutate: func(r *NodeReport) { r.Gpus[0].TensorActive = proto.Float64(math.NaN()) }, wantErr: "tensor_active NaN"},
		"power inf":             {mutate: func(r *NodeReport) { r.Gpus[0].PowerWatts = proto.Float64(math.Inf(1)) }, wantErr: "power_watts +Inf"},
		"fb used over total":    {mutate: func(r *NodeReport) { r.Gpus[0].FbUsedBytes = proto.Uint64(81 << 30) }, wantErr: "exceeds fb_total_bytes"},
		"duplicate device":      {mutate: func(r *NodeReport) { r.Gpus[1].DeviceId = ""; r.Gpus[1].Uuid = "GPU-0" }, wantErr: "device GPU-0 appears twice"},
		"pod without namespace": {mutate: func(r *NodeReport) { r.Gpus[0].Pod.Namespace = "" }, wantErr: "pod: invalid name: namespace is empty"},
		"pod without name":      {mutate: func(r *NodeReport) { r.Gpus[0].Pod.Name = "" }, wantErr: "pod: name is required"},
		"device without id":     {mutate: func(r *NodeReport) { r.Allocatable[0].Id = "" }, wantErr: "allocatable[0]: device id and resource are required"},
		"duplicate allocated":   {mutate: func(r *NodeReport) { r.Allocated = append(r.Allocated, r.Allocated[0]) }, wantErr: "allocated[1]: device GPU-0 appears twice"},
		"too many GPUs": {mutate: func(r *NodeReport) {
			for i := range MaxGPUs {
				r.Gpus = append(r.Gpus, &GPUSample{Uuid: fmt.Sprintf("GPU-x%d", i)})
			}
		}, wantErr: "more than 256"},
		"too many labels": {mutate: func(r *NodeReport) {
			for i := range MaxPodLabels + 1 {
				r.Gpus[0].Pod.Labels[fmt.Sprintf("k%d", i)] = "v"
			}
		}, wantErr: "labels, more than 128"},
		"label value too long": {mutate: func(r *NodeReport) { r.Gpus[0].Pod.Labels["app"] = strings.Repeat("v", 64) }, wantErr: "is not a Kubernetes label"},
		"empty label key":      {mutate: func(r *NodeReport) { r.Gpus[0].Pod.Labels[""] = "v" }, wantErr: "is not a Kubernetes label"},
		"shared device with its pods": {mutate: func(r *NodeReport) {
			r.Gpus[0].Shared = true
			r.Gpus[0].Pod.GpuUtil = proto.Float64(30)
			r.Gpus[0].OtherPods = []*PodRef{{Namespace: "ml", Name: "llm-1", GpuUtil: proto.Float64(50)}, {Namespace: "other", Name: "llm-0", LabelsUnknown: true}}
		}},
		"other pods without pod": {mutate: func(r *NodeReport) {
			r.Gpus[1].OtherPods = []*PodRef{{Namespace: "ml", Name: "llm-1"}}
		}, wantErr: "gpus[1]: other_pods without pod"},
		"pod listed twice": {mutate: func(r *NodeReport) {
			r.Gpus[0].OtherPods = []*PodRef{{Namespace: "ml", Name: "llm-1"}, {Namespace: "ml", Name: "llm-0"}}
		}, wantErr: "pod ml/llm-0 is listed twice"},
		"other pod invalid": {mutate: func(r *NodeReport) {
			r.Gpus[0].OtherPods = []*PodRef{{Namespace: "ml"}}
		}, wantErr: "pod: name is required"},
		"pod util over 100":           {mutate: func(r *NodeReport) { r.Gpus[0].Pod.GpuUtil = proto.Float64(101) }, wantErr: "pod ml/llm-0: gpu_util 101 is outside 0–100"},
		"pod cold start":              {mutate: func(r *NodeReport) { r.Gpus[0].Pod.ColdStartSeconds = proto.Float64(45.5) }},
		"pod cold start over 1h":      {mutate: func(r *NodeReport) { r.Gpus[0].Pod.ColdStartSeconds = proto.Float64(3601) }, wantErr: "pod ml/llm-0: cold_start_seconds 3601 is outside 0–3600"},
		"pod cold start negative":     {mutate: func(r *NodeReport) { r.Gpus[0].Pod.ColdStartSeconds = proto.Float64(-1) }, wantErr: "cold_start_seconds -1 is outside"},
		"pod cold start not a number": {mutate: func(r *NodeReport) { r.Gpus[0].Pod.ColdStartSeconds = proto.Float64(math.NaN()) }, wantErr: "cold_start_seconds NaN is outside"},
		"too many pods on a device": {mutate: func(r *NodeReport) {
			for i := range MaxPodsPerGPU {
				r.Gpus[0].OtherPods = append(r.Gpus[0].OtherPods, &PodRef{Namespace: "ml", Name: fmt.Sprintf("p%d", i)})
			}
		}, wantErr: "257 pods on one device, more than 256"},
		"unattributed device": {mutate: func(r *NodeReport) {
			r.Unattributed = []*UnattributedDevice{{Id: "nvidia9", Resource: "nvidia.com/gpu", Pod: &PodRef{Namespace: "ml", Name: "x"}, Reason: "no GPU with index 9"}}
		}},
		"unattributed without pod": {mutate: func(r *NodeReport) {
			r.Unattributed = []*UnattributedDevice{{Id: "nvidia9", Resource: "nvidia.com/gpu"}}
		}, wantErr: "unattributed[0]: the pod holding device nvidia9 is required"},
		"unattributed without id": {mutate: func(r *NodeReport) {
			r.Unattributed = []*UnattributedDevice{{Resource: "nvidia.com/gpu", Pod: &PodRef{Namespace: "ml", Name: "x"}}}
		}, wantErr: "unattributed[0]: device id and resource are required"},
		"scheduling": {mutate: func(r *NodeReport) {
			r.Scheduling = &NodeScheduling{Unschedulable: true, Taints: []*Taint{
				{Key: "nvidia.com/gpu", Value: "present", Effect: "NoSchedule"},
				{Key: "nvidia.com/gpu", Value: "present", Effect: "NoExecute"},
				{Key: "ToBeDeletedByClusterAutoscaler", Value: "1732700000", Effect: "NoSchedule"},
			}}
		}},
		"scheduling without taints": {mutate: func(r *NodeReport) { r.Scheduling = &NodeScheduling{} }},
		// Kubernetes' own validation of a Node's taints (pkg/apis/core/validation,
		// validateNodeTaints): a qualified-name key, a label-value value, a known effect,
		// each key and effect once. The report carries only the effects that keep pods off.
		"taint without key": {mutate: func(r *NodeReport) {
			r.Scheduling = &NodeScheduling{Taints: []*Taint{{Effect: "NoSchedule"}}}
		}, wantErr: `scheduling.taints[0]: key "" is not a Kubernetes taint key`},
		"taint key too long": {mutate: func(r *NodeReport) {
			r.Scheduling = &NodeScheduling{Taints: []*Taint{{Key: strings.Repeat("k", 318), Effect: "NoSchedule"}}}
		}, wantErr: "scheduling.taints[0]: key"},
		"taint key with space": {mutate: func(r *NodeReport) {
			r.Scheduling = &NodeScheduling{Taints: []*Taint{{Key: "a b", Effect: "NoSchedule"}}}
		}, wantErr: `key "a b" is not a Kubernetes taint key`},
		"taint value too long": {mutate: func(r *NodeReport) {
			r.Scheduling = &NodeScheduling{Taints: []*Taint{{Key: "k", Value: strings.Repeat("v", 64), Effect: "NoSchedule"}}}
		}, wantErr: "scheduling.taints[0]: value"},
		"taint effect PreferNoSchedule": {mutate: func(r *NodeReport) {
			r.Scheduling = &NodeScheduling{Taints: []*Taint{{Key: "k", Effect: "PreferNoSchedule"}}}
		}, wantErr: `scheduling.taints[0]: effect "PreferNoSchedule" of taint k: want NoSchedule or NoExecute`},
		"taint effect empty": {mutate: func(r *NodeReport) {
			r.Scheduling = &NodeScheduling{Taints: []*Taint{{Key: "k"}}}
		}, wantErr: `effect "" of taint k: want NoSchedule or NoExecute`},
		"taint twice": {mutate: func(r *NodeReport) {
			r.Scheduling = &NodeScheduling{Taints: []*Taint{{Key: "k", Value: "a", Effect: "NoSchedule"}, {Key: "k", Value: "b", Effect: "NoSchedule"}}}
		}, wantErr: "scheduling.taints[1]: taint k:NoSchedule appears twice"},
		"too many taints": {mutate: func(r *NodeReport) {
			r.Scheduling = &NodeScheduling{}
			for i := range MaxTaints + 1 {
				r.Scheduling.Taints = append(r.Scheduling.Taints, &Taint{Key: fmt.Sprintf("k%d", i), Effect: "NoSchedule"})
			}
		}, wantErr: "taints, more than"},
		"resources": {mutate: func(r *NodeReport) {
			r.Resources = &NodeResources{CpuAllocatableMillis: 15_890, MemoryAllocatableBytes: 60 << 30}
		}},
		"resources requested over allocatable": {mutate: func(r *NodeReport) {
			// Pods bound before the kubelet's reservations grew, or static pods.
			r.Resources = &NodeResources{CpuAllocatableMillis: 1000, MemoryAllocatableBytes: 1 << 30, CpuRequestedMillis: 1500, MemoryRequestedBytes: 2 << 30}
		}},
		"resources all zero": {mutate: func(r *NodeReport) { r.Resources = &NodeResources{} }},
		"cpu allocatable too large": {mutate: func(r *NodeReport) {
			r.Resources = &NodeResources{CpuAllocatableMillis: MaxNodeCPUMillis + 1}
		}, wantErr: "resources.cpu_allocatable_millis: 1048576001, more than 1048576000"},
		"memory allocatable too large": {mutate: func(r *NodeReport) {
			r.Resources = &NodeResources{MemoryAllocatableBytes: MaxNodeMemoryBytes + 1}
		}, wantErr: "resources.memory_allocatable_bytes: "},
		"cpu requested too large": {mutate: func(r *NodeReport) {
			r.Resources = &NodeResources{CpuRequestedMillis: math.MaxUint64}
		}, wantErr: "resources.cpu_requested_millis: "},
		"memory requested too large": {mutate: func(r *NodeReport) {
			r.Resources = &NodeResources{MemoryRequestedBytes: 1 << 63}
		}, wantErr: "resources.memory_requested_bytes: "},
		"unattributed pod invalid": {mutate: func(r *NodeReport) {
			r.Unattributed = []*UnattributedDevice{{Id: "x", Resource: "nvidia.com/gpu", Pod: &PodRef{Namespace: "Bad_NS", Name: "x"}}}
		}, wantErr: "unattributed[0]: pod: invalid name"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			r := validNodeReport()
			tc.mutate(r)
			err := r.Validate()
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidEvent) || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Validate() = %v, want ErrInvalidEvent containing %q", err, tc.wantErr)
			}
		})
	}
}

func TestDecode(t *testing.T) {
	node := validNodeReport()
	nodeData, _ := proto.Marshal(node)
	queue := &QueueReport{Namespace: "ml", Queue: "jobs", ProducerId: "gw-0", Waiting: 3, InFlight: 2}
	queueData, _ := proto.Marshal(queue)

	t.Run("node", func(t *testing.T) {
		ev, err := Decode("gpuscaler.v1.node.gpu-node-1", nodeData)
		if err != nil || ev.Node == nil || !proto.Equal(ev.Node, node) || ev.Subject.Kind != KindNode {
			t.Fatalf("Decode = %+v, %v; want the node report", ev, err)
		}
	})
	t.Run("queue", func(t *testing.T) {
		ev, err := Decode("gpuscaler.v1.queue.ml.jobs.gw-0", queueData)
		if err != nil || ev.Queue == nil || ev.Queue.Backlog() != 5 {
			t.Fatalf("Decode = %+v, %v; want the queue report with backlog 5", ev, err)
		}
	})
	for name, tc := range map[string]struct {
		subject string
		data    []byte
		want    error
	}{
		"bad subject":                   {subject: "gpuscaler.v1.gpu.x", data: nodeData, want: ErrInvalidSubject},
		"garbage payload":               {subject: "gpuscaler.v1.node.gpu-node-1", data: []byte{0xff, 0xff, 0xff}, want: ErrUndecodable},
		"other node's subject":          {subject: "gpuscaler.v1.node.gpu-node-2", data: nodeData, want: ErrSubjectMismatch},
		"other namespace":               {subject: "gpuscaler.v1.queue.prod.jobs.gw-0", data: queueData, want: ErrSubjectMismatch},
		"other queue":                   {subject: "gpuscaler.v1.queue.ml.other.gw-0", data: queueData, want: ErrSubjectMismatch},
		"other producer":                {subject: "gpuscaler.v1.queue.ml.jobs.gw-1", data: queueData, want: ErrSubjectMismatch},
		"queue payload on node subject": {subject: "gpuscaler.v1.node.gpu-node-1", data: queueData, want: ErrUndecodable},
		"empty queue payload":           {subject: "gpuscaler.v1.queue.ml.jobs.gw-0", data: nil, want: ErrInvalidEvent},
	} {
		t.Run(name, func(t *testing.T) {
			ev, err := Decode(tc.subject, tc.data)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Decode = %+v, %v; want %v", ev, err, tc.want)
			}
			if errors.Is(tc.want, ErrSubjectMismatch) && !errors.Is(err, ErrInvalidEvent) {
				t.Fatalf("Decode = %v; want a subject mismatch to be an ErrInvalidEvent too", err)
			}
			if !errors.Is(tc.want, ErrSubjectMismatch) && errors.Is(err, ErrSubjectMismatch) {
				t.Fatalf("Decode = %v; want no subject mismatch", err)
			}
		})
	}
}

// TestDecodeQueueTraffic: a report's traffic figures must be finite, not negative, and
// within their bounds; a report that breaks that is invalid, and dropped as one.
func TestDecodeQueueTraffic(t *testing.T) {
	valid := func() *QueueTraffic {
		return &QueueTraffic{ArrivalsTotal: 10, CompletionsTotal: 8, DroppedTotal: 1, BusySecondsTotal: 40,
			ArrivalRate: 2, CompletionRate: 1.5, DropRate: 0.5, ServiceSeconds: 5}
	}
	for name, tc := range map[string]struct {
		edit func(*QueueTraffic)
		want string // in the error; empty: valid
	}{
		"valid": {edit: func(*QueueTraffic) {}},
		"zero":  {edit: func(q *QueueTraffic) { *q = QueueTraffic{} }},
		"at the bounds": {edit: func(q *QueueTraffic) {
			q.ArrivalRate, q.ServiceSeconds, q.ArrivalDispersion, q.ArrivalTrend = MaxTrafficRate, MaxServiceSeconds, MaxDispersion, MaxTrafficRate
			q.ArrivalLevel, q.LevelWindowSeconds, q.OldestWaitSeconds = MaxTrafficRate, MaxWindowSeconds, MaxWindowSeconds
		}},
		"negative oldest wait":        {edit: func(q *QueueTraffic) { q.OldestWaitSeconds = -1 }, want: "oldest_wait_seconds -1"},
		"NaN oldest wait":             {edit: func(q *QueueTraffic) { q.OldestWaitSeconds = math.NaN() }, want: "oldest_wait_seconds NaN"},
		"oldest wait above the bound": {edit: func(q *QueueTraffic) { q.OldestWaitSeconds = 2 * MaxWindowSeconds }, want: "oldest_wait_seconds 2e+09"},
		"NaN level":                   {edit: func(q *QueueTraffic) { q.ArrivalLevel = math.NaN() }, want: "arrival_level NaN"},
		"negative level":              {edit: func(q *QueueTraffic) { q.ArrivalLevel = -1 }, want: "arrival_level -1"},
		"level above the bound":       {edit: func(q *QueueTraffic) { q.ArrivalLevel = 2 * MaxTrafficRate }, want: "arrival_level 2e+09"},
		"negative level window":       {edit: func(q *QueueTraffic) { q.LevelWindowSeconds = -60 }, want: "level_window_seconds -60"},
		"infinite level window":       {edit: func(q *QueueTraffic) { q.LevelWindowSeconds = math.Inf(1) }, want: "level_window_seconds +Inf"},
		"NaN arrival rate":            {edit: func(q *QueueTraffic) { q.ArrivalRate = math.NaN() }, want: "arrival_rate NaN"},
		"negative completion rate":    {edit: func(q *QueueTraffic) { q.CompletionRate = -1 }, want: "completion_rate -1"},
		"infinite drop rate":          {edit: func(q *QueueTraffic) { q.DropRate = math.Inf(1) }, want: "drop_rate +Inf"},
		"rate above the bound":        {edit: func(q *QueueTraffic) { q.ArrivalRate = 2 * MaxTrafficRate }, want: "arrival_rate 2e+09"},
		"NaN service":                 {edit: func(q *QueueTraffic) { q.ServiceSeconds = math.NaN() }, want: "service_seconds NaN"},
		"service above the bound":     {edit: func(q *QueueTraffic) { q.ServiceSeconds = 2 * MaxServiceSeconds }, want: "service_seconds"},
		"NaN dispersion":              {edit: func(q *QueueTraffic) { q.ArrivalDispersion = math.NaN() }, want: "arrival_dispersion NaN"},
		"negative dispersion":         {edit: func(q *QueueTraffic) { q.ArrivalDispersion = -1 }, want: "arrival_dispersion -1"},
		"dispersion above the bound":  {edit: func(q *QueueTraffic) { q.ArrivalDispersion = 2 * MaxDispersion }, want: "arrival_dispersion 2e+09"},
		"a falling trend":             {edit: func(q *QueueTraffic) { q.ArrivalTrend = -MaxTrafficRate }},
		"NaN trend":                   {edit: func(q *QueueTraffic) { q.ArrivalTrend = math.NaN() }, want: "arrival_trend NaN"},
		"trend above the bound":       {edit: func(q *QueueTraffic) { q.ArrivalTrend = math.Inf(1) }, want: "arrival_trend +Inf"},
		"trend below minus the bound": {edit: func(q *QueueTraffic) { q.ArrivalTrend = -2 * MaxTrafficRate }, want: "arrival_trend -2e+09"},
		"negative busy seconds":       {edit: func(q *QueueTraffic) { q.BusySecondsTotal = -0.5 }, want: "busy_seconds_total -0.5"},
		"infinite busy seconds":       {edit: func(q *QueueTraffic) { q.BusySecondsTotal = math.Inf(1) }, want: "busy_seconds_total +Inf"},
		"negative zero is not below":  {edit: func(q *QueueTraffic) { q.ServiceSeconds = math.Copysign(0, -1) }},
	} {
		t.Run(name, func(t *testing.T) {
			tr := valid()
			tc.edit(tr)
			data, _ := proto.Marshal(&QueueReport{Namespace: "ml", Queue: "jobs", ProducerId: "gw-0", Waiting: 3, Traffic: tr})
			ev, err := Decode("gpuscaler.v1.queue.ml.jobs.gw-0", data)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Decode = %v, want it taken", err)
			case tc.want == "" && !proto.Equal(ev.Queue.GetTraffic(), tr):
				t.Fatalf("Decode gave traffic %v, want %v", ev.Queue.GetTraffic(), tr)
			case tc.want != "" && (!errors.Is(err, ErrInvalidEvent) || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Decode = %v; want an ErrInvalidEvent saying %q", err, tc.want)
			}
		})
	}
}

func TestBacklogSaturates(t *testing.T) {
	r := &QueueReport{Waiting: math.MaxUint64 - 1, InFlight: 5}
	if got := r.Backlog(); got != math.MaxUint64 {
		t.Fatalf("Backlog() = %d, want %d", got, uint64(math.MaxUint64))
	}
}

// FuzzDecode feeds arbitrary subjects and payloads: Decode must never panic, must fail
// with one of its three sentinel errors, and whatever it accepts must validate and name
// the node or queue of its subject.
func FuzzDecode(f *testing.F) {
	nodeData, _ := proto.Marshal(validNodeReport())
	queueData, _ := proto.Marshal(&QueueReport{Namespace: "ml", Queue: "jobs", ProducerId: "gw-0", Waiting: 3})
	trafficData, _ := proto.Marshal(&QueueReport{Namespace: "ml", Queue: "jobs", ProducerId: "gw-0", Waiting: 3, ColdStartSeconds: 30,
		Traffic: &QueueTraffic{ArrivalsTotal: 10, CompletionsTotal: 8, DroppedTotal: 1, BusySecondsTotal: 40, ArrivalRate: 2, CompletionRate: 1.5, DropRate: 0.5, ServiceSeconds: 5}})
	f.Add("gpuscaler.v1.node.gpu-node-1", nodeData)
	f.Add("gpuscaler.v1.queue.ml.jobs.gw-0", queueData)
	f.Add("gpuscaler.v1.queue.ml.jobs.gw-0", trafficData)
	f.Add("gpuscaler.v1.queue.ml.jobs.gw-0", nodeData)
	f.Add("gpuscaler.v1.node.gpu-node-1", []byte{0x0a, 0x80})
	withResources := validNodeReport()
	withResources.Resources = &NodeResources{CpuAllocatableMillis: MaxNodeCPUMillis, MemoryAllocatableBytes: 1 << 40, CpuRequestedMillis: 500, MemoryRequestedBytes: MaxNodeMemoryBytes}
	resourcesData, _ := proto.Marshal(withResources)
	f.Add("gpuscaler.v1.node.gpu-node-1", resourcesData)
	f.Fuzz(func(t *testing.T, subject string, data []byte) {
		ev, err := Decode(subject, data)
		if err != nil {
			if !errors.Is(err, ErrInvalidSubject) && !errors.Is(err, ErrUndecodable) && !errors.Is(err, ErrInvalidEvent) {
				t.Fatalf("Decode error %v wraps none of the sentinels", err)
			}
			return
		}
		switch {
		case ev.Node != nil:
			if ev.Node.Validate() != nil || ev.Node.GetNode() != ev.Subject.Node {
				t.Fatalf("accepted node report does not validate or match its subject: %v", ev.Node)
			}
		case ev.Queue != nil:
			if ev.Queue.Validate() != nil || ev.Queue.GetNamespace() != ev.Subject.Namespace || ev.Queue.GetQueue() != ev.Subject.Queue || ev.Queue.GetProducerId() != ev.Subject.Producer {
				t.Fatalf("accepted queue report does not validate or match its subject: %v", ev.Queue)
			}
		default:
			t.Fatal("Decode returned no event and no error")
		}
	})
}

// TestMaxQueueReportBytes encodes the largest QueueReport the contract allows: every name
// as long in bytes as validation lets it be, every number at its widest varint, the timestamp's nanos negative (ten bytes). It must
// fit MaxQueueReportBytes with room to spare, and Decode must take it and refuse one byte
// more.
func TestMaxQueueReportBytes(t *testing.T) {
	r := &QueueReport{
		Namespace:  strings.Repeat("n", 63),
		Queue:      strings.Repeat("q", MaxQueueNameLen),
		ProducerId: strings.Repeat("p", MaxProducerIDLen),
		Waiting:    math.MaxUint64, InFlight: math.MaxUint64, Arrivals: math.MaxUint64,
		Sequence: math.MaxUint64, Dropped: math.MaxUint64, Stopped: true,
		ObservedAt: &timestamppb.Timestamp{Seconds: math.MinInt64, Nanos: math.MinInt32},
		Traffic: &QueueTraffic{
			ArrivalsTotal: math.MaxUint64, CompletionsTotal: math.MaxUint64, DroppedTotal: math.MaxUint64,
			BusySecondsTotal: math.MaxFloat64, ArrivalRate: MaxTrafficRate, CompletionRate: MaxTrafficRate, DropRate: MaxTrafficRate,
			ServiceSeconds: MaxServiceSeconds, ArrivalDispersion: MaxDispersion, ArrivalTrend: -MaxTrafficRate,
			ArrivalLevel: MaxTrafficRate, LevelWindowSeconds: MaxWindowSeconds, OldestWaitSeconds: MaxWindowSeconds,
		},
		ColdStartSeconds: 1,
	}
	if err := r.Validate(); err != nil {
		t.Fatalf("the largest report is invalid: %v", err)
	}
	data, err := proto.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	if len(data) != 670 {
		t.Errorf("the largest QueueReport encodes in %d bytes; MaxQueueReportBytes's comment says 670", len(data))
	}
	if room := MaxQueueReportBytes - len(data); room < 256 {
		t.Errorf("the largest QueueReport encodes in %d bytes, leaving %d of MaxQueueReportBytes (%d) for new fields, want at least 256", len(data), room, MaxQueueReportBytes)
	}
	subject, _ := QueueSubject(r.Namespace, r.Queue, r.ProducerId)
	if _, err := Decode(subject, data); err != nil {
		t.Fatalf("Decode(the largest report) = %v", err)
	}
	// Padded with an unknown field (number 15, bytes) to the limit, and one byte past it.
	pad := func(total int) []byte {
		out := append([]byte(nil), data...)
		out = append(out, 15<<3|2, 0, 0) // a two-byte length, filled in below
		n := total - len(out)
		out[len(out)-2], out[len(out)-1] = byte(n)|0x80, byte(n>>7)
		return append(out, make([]byte, n)...)
	}
	if at := pad(MaxQueueReportBytes); len(at) != MaxQueueReportBytes {
		t.Fatalf("padded to %d bytes, want %d", len(at), MaxQueueReportBytes)
	} else if _, err := Decode(subject, at); err != nil {
		t.Fatalf("Decode(%d bytes) = %v, want it taken", len(at), err)
	}
	if _, err := Decode(subject, pad(MaxQueueReportBytes+1)); !errors.Is(err, ErrUndecodable) {
		t.Fatalf("Decode(%d bytes) = %v, want ErrUndecodable", MaxQueueReportBytes+1, err)
	}
	var d NodeDecoder
	if _, err := d.Decode(subject, pad(MaxQueueReportBytes+1)); !errors.Is(err, ErrUndecodable) {
		t.Fatalf("NodeDecoder.Decode(%d bytes) = %v, want ErrUndecodable", MaxQueueReportBytes+1, err)
	}
}
