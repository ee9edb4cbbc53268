// Package collectortest holds the test helpers that the collector's packages share: a
// kubelet serving the pod-resources API with fixed answers, the devices and pods it
// answers with, and a fake host /proc. It imports none of the collector's packages, so
// that each of them can use it in its own tests. Waiting for something is
// test/testkit's.
package collectortest

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// Kubelet serves the kubelet's pod-resources API (v1) with fixed answers.
type Kubelet struct {
	podresourcesv1.UnimplementedPodResourcesListerServer

	Allocatable    *podresourcesv1.AllocatableResourcesResponse
	AllocatableErr error                                    // answered instead of Allocatable when set
	Pods           *podresourcesv1.ListPodResourcesResponse // what List answers
	// Block makes every call wait until its context ends, and then count in Cancelled.
	Block     bool
	Cancelled atomic.Int32

	AllocatableCalls, ListCalls atomic.Int32
}

func (k *Kubelet) GetAllocatableResources(ctx context.Context, _ *podresourcesv1.AllocatableResourcesRequest) (*podresourcesv1.AllocatableResourcesResponse, error) {
	k.AllocatableCalls.Add(1)
	if k.Block {
		<-ctx.Done()
		k.Cancelled.Add(1)
		return nil, ctx.Err()
	}
	if k.AllocatableErr != nil {
		return nil, k.AllocatableErr
	}
	return k.Allocatable, nil
}

func (k *Kubelet) List(ctx context.Context, _ *podresourcesv1.ListPodResourcesRequest) (*podresourcesv1.ListPodResourcesResponse, error) {
	k.ListCalls.Add(1)
	if k.Block {
		<-ctx.Done()
		k.Cancelled.Add(1)
		return nil, ctx.Err()
	}
	return k.Pods, nil
}

// SocketPath returns a path for a unix socket in a new directory removed when the test
// ends. t.TempDir() holds the test's name and can pass the ~108 bytes a socket path may
// have, so the directory is made directly under the system's temporary directory.
func SocketPath(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "pr")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, "kubelet.sock")
}

// ServeKubelet serves srv on a unix socket at path until the test ends.
func ServeKubelet(t *testing.T, path string, srv podresourcesv1.PodResourcesListerServer) {
	t.Helper()
	lis, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	podresourcesv1.RegisterPodResourcesListerServer(s, srv)
	go s.Serve(lis)
	t.Cleanup(s.Stop)
}

// Devices is the devices of one resource, as the kubelet lists them.
func Devices(resource string, ids ...string) *podresourcesv1.ContainerDevices {
	return &podresourcesv1.ContainerDevices{ResourceName: resource, DeviceIds: ids}
}

// Container is a container holding devs, and CPUs 2 and 3.
func Container(name string, devs ...*podresourcesv1.ContainerDevices) *podresourcesv1.ContainerResources {
	return &podresourcesv1.ContainerResources{Name: name, Devices: devs, CpuIds: []int64{2, 3}}
}

// PodHolding is a pod whose one container, main, holds devs.
func PodHolding(ns, name string, devs ...*podresourcesv1.ContainerDevices) *podresourcesv1.PodResources {
	return &podresourcesv1.PodResources{Namespace: ns, Name: name, Containers: []*podresourcesv1.ContainerResources{Container("main", devs...)}}
}

// Replicas is the n device ids a device plugin's time-slicing gives device id:
// "<id>::0" to "<id>::<n-1>".
func Replicas(id string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s::%d", id, i)
	}
	return out
}
